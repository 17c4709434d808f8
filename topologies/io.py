"""Topology IO: plain dicts, YAML and mermaid text.

The dict form (``version: 1``) lists nodes (START and END are implicit) and channels in graph
order, so ``from_dict(to_dict(t))`` rebuilds ``t`` exactly and YAML text round-trips byte for
byte::

    version: 1
    name: single
    spec: single
    nodes:
    - id: agent
      kind: agent
      role: agent
      pool: agent
      trainable: true
      max_instances: 1
      subgraph: null
    edges:
    - source: __start__
      target: agent
      kind: static
      label: null
    - source: agent
      target: __end__
      kind: static
      label: null
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from topologies.topology import END, START, Topology, TopologyError

FORMAT_VERSION = 1
NODE_FIELDS = ("kind", "role", "pool", "trainable", "max_instances", "subgraph")
EDGE_FIELDS = ("kind", "label")


def to_dict(topology: Topology) -> dict[str, Any]:
    """A plain, YAML-safe dict of ``topology`` (see the module docstring)."""
    g = topology.graph
    return {
        "version": FORMAT_VERSION,
        "name": topology.name,
        "spec": topology.spec,
        "nodes": [{"id": n, **{k: g.nodes[n].get(k) for k in NODE_FIELDS}} for n in topology.nodes],
        "edges": [
            {"source": u, "target": v, **{k: d.get(k) for k in EDGE_FIELDS}}
            for u, v, d in g.edges(data=True)
        ],
    }


def from_dict(data: dict[str, Any]) -> Topology:
    """Rebuild and validate a topology from :func:`to_dict` output.

    Missing node fields take :meth:`Topology.add_agent`'s defaults and a missing edge kind is
    ``static``, so a hand-written dict may list only ids, roles and edges.

    Raises:
        TopologyError: unknown format version or fields, duplicate node ids or edges, edges to
            unknown nodes, or anything :func:`topologies.validate.validate` rejects.
    """
    if not isinstance(data, dict):
        raise TopologyError(f"a topology dict must be a mapping, got {type(data).__name__}")
    version = data.get("version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise TopologyError(f"topology format version {version!r}: this code reads version 1")
    unknown = set(data) - {"version", "name", "spec", "nodes", "edges"}
    if unknown:
        raise TopologyError(
            f"unknown topology keys {sorted(unknown)}: use name, spec, nodes, edges"
        )
    t = Topology.empty(str(data.get("name") or "graph"), spec=data.get("spec"))
    for node in data.get("nodes") or []:
        _add_node(t, node)
    for edge in data.get("edges") or []:
        _add_edge(t, edge)
    return t.validate()


def _add_node(t: Topology, node: Any) -> None:
    if not isinstance(node, dict) or not isinstance(node.get("id"), str):
        raise TopologyError(f"node entry {node!r} needs a string 'id'")
    node_id = node["id"]
    unknown = set(node) - {"id", *NODE_FIELDS}
    if unknown:
        raise TopologyError(f"node {node_id!r} has unknown fields {sorted(unknown)}: remove them")
    if node_id in (START, END):
        raise TopologyError(f"node id {node_id!r} is reserved: START and END are implicit")
    fields = {k: node[k] for k in NODE_FIELDS if k in node}
    t.add_agent(node_id, fields.pop("role", "agent"), **fields)


def _add_edge(t: Topology, edge: Any) -> None:
    if not isinstance(edge, dict) or not all(
        isinstance(edge.get(k), str) for k in ("source", "target")
    ):
        raise TopologyError(f"edge entry {edge!r} needs string 'source' and 'target'")
    u, v = edge["source"], edge["target"]
    unknown = set(edge) - {"source", "target", *EDGE_FIELDS}
    if unknown:
        raise TopologyError(f"edge {u!r} → {v!r} has unknown fields {sorted(unknown)}: remove them")
    for end in (u, v):
        if end not in t.graph:
            raise TopologyError(f"edge {u!r} → {v!r} names unknown node {end!r}: list it in nodes")
    if t.graph.has_edge(u, v):
        raise TopologyError(f"duplicate edge {u!r} → {v!r}: keep one channel per pair of nodes")
    t.add_channel(u, v, edge.get("kind", "static"), edge.get("label"))


def to_yaml(topology: Topology, path: str | Path | None = None) -> str:
    """YAML text of :func:`to_dict`; also written to ``path`` when given."""
    text = yaml.safe_dump(to_dict(topology), sort_keys=False, allow_unicode=True, width=100)
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


def from_yaml(source: str | Path) -> Topology:
    """Rebuild a topology from YAML text, or from a file given as a ``Path`` or a path string
    ending in ``.yaml``/``.yml``."""
    if isinstance(source, Path) or (
        isinstance(source, str) and "\n" not in source and source.endswith((".yaml", ".yml"))
    ):
        path = Path(source)
        if not path.is_file():
            raise TopologyError(f"topology file {str(path)!r} does not exist: check the path")
        source = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise TopologyError(
            f"topology YAML does not parse ({where}{problem}): fix the syntax"
        ) from None
    return from_dict(data)


# ----- mermaid ---------------------------------------------------------------------------------
ROLE_STYLES = {
    "orchestrator": "fill:#f4a261,stroke:#9c5a1d",
    "worker": "fill:#8ecae6,stroke:#1d6f91",
    "aggregator": "fill:#b5e48c,stroke:#4f772d",
    "agent": "fill:#cdb4db,stroke:#6d4c7d",
    "tool": "fill:#e9ecef,stroke:#6c757d",
    "node": "fill:#ffffff,stroke:#6c757d,stroke-dasharray:3 3",
}
ARROWS = {"static": "-->", "conditional": "-.->", "send": "==>", "join": "--o", "command": "-.-x"}


def to_mermaid(topology: Topology) -> str:
    """Deterministic mermaid ``flowchart TD`` text.

    Nodes are labelled ``id`` and ``role · pool`` (``×k`` for fan-out nodes, ``frozen`` when not
    trainable) and classed by role (plain nodes: ``node``). Arrows by channel kind: static
    ``-->``, conditional ``-.->``, send ``==>`` (labelled ``send`` when unlabelled), join
    ``--o``, command ``-.-x``; labels (``-->|"label"|``) are the channel labels. Nodes from a
    subgraph are grouped in a ``subgraph`` block.

    Example:
        >>> print(Topology.from_spec("single").to_mermaid())  # doctest: +NORMALIZE_WHITESPACE
        flowchart TD
            __start__([START])
            agent["agent<br/>agent · agent"]:::agent
            __end__([END])
            __start__ --> agent
            agent --> __end__
            classDef agent fill:#cdb4db,stroke:#6d4c7d
    """
    g = topology.graph
    ids = _mermaid_ids([START, *topology.nodes, END])
    lines = ["flowchart TD", f"    {ids[START]}([START])"]
    groups: dict[str | None, list[str]] = {}
    for n in topology.nodes:
        groups.setdefault(g.nodes[n].get("subgraph"), []).append(n)
    for group, members in groups.items():
        indent = "    " if group is None else "        "
        if group is not None:
            lines.append(f'    subgraph {_mermaid_id(group)}_group["{_escape(group)}"]')
        lines += [indent + _mermaid_node(topology, n, ids[n]) for n in members]
        if group is not None:
            lines.append("    end")
    lines.append(f"    {ids[END]}([END])")
    for u, v, d in g.edges(data=True):
        label = d["label"] if d["label"] is not None else ("send" if d["kind"] == "send" else None)
        text = "" if label is None else f'|"{_escape(label)}"|'
        lines.append(f"    {ids[u]} {ARROWS[d['kind']]}{text} {ids[v]}")
    used = {_node_class(g.nodes[n]) for n in topology.nodes}
    lines += [f"    classDef {c} {s}" for c, s in ROLE_STYLES.items() if c in used]
    return "\n".join(lines) + "\n"


def _node_class(data: dict[str, Any]) -> str:
    return data["role"] if data["kind"] == "agent" else "node"


def _mermaid_node(topology: Topology, node: str, mid: str) -> str:
    d = topology.graph.nodes[node]
    name = node.rsplit("/", 1)[-1] if d.get("subgraph") else node
    if d["kind"] == "agent":
        info = f"{d['role']} · {d['pool']}"
        info += f" ×{d['max_instances']}" if d["max_instances"] > 1 else ""
        info += "" if d["trainable"] else " · frozen"
        text = f"{_escape(name)}<br/>{_escape(info)}"
        return f'{mid}["{text}"]:::{_node_class(d)}'
    text = _escape(name) + (f"<br/>{_escape(d['role'])}" if d["role"] else "")
    return f'{mid}[/"{text}"/]:::node'


def _mermaid_id(text: str) -> str:
    out = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return out + "_" if out.lower() in ("end", "subgraph", "graph", "flowchart") else out


def _mermaid_ids(nodes: list[str]) -> dict[str, str]:
    ids: dict[str, str] = {}
    taken: set[str] = set()
    for n in nodes:
        mid, i = _mermaid_id(n), 1
        while mid in taken:
            mid, i = f"{_mermaid_id(n)}_{i}", i + 1
        ids[n] = mid
        taken.add(mid)
    return ids


def _escape(text: str) -> str:
    return str(text).replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")
