"""Import a LangGraph graph into a :class:`Topology`.

What is captured from a ``StateGraph`` builder (or a compiled graph's ``.builder``):

* **Nodes** with their ``add_node(..., metadata={...})``. Keys read: ``role`` (one of
  ``ROLES``, default ``"agent"``), ``pool`` (default: the role), ``trainable`` (default
  ``True``), ``max_instances`` (default 1; > 1 for a ``Send`` target whose parallel instances
  are separate agents ``<node>_<i>``), ``agent`` (bool), ``fanout`` (list of targets this
  node's routers reach with ``Send``), ``subgraph`` (a group label), and on a subgraph node
  ``flatten`` (bool) and ``inner`` (inner node → metadata). Other keys are ignored.
* **Agent detection**: every node is an agent, except a node with metadata ``agent: False`` or
  with role ``"tool"`` (and no ``agent: True``), and a prebuilt ``ToolNode`` (role ``"tool"``
  unless its metadata says otherwise); those become plain nodes (``kind="node"``: tools,
  routers, reducers), never trainable and without a pool. LangGraph's generated error
  handler nodes are skipped.
* **Inferred roles** (:func:`infer_roles`): where the structure says so, agents without a
  declared role get one: the single entry agent that routes (conditional edges, ``Command``,
  ``Send``) to other agents is the ``orchestrator`` and those agents are workers, so
  their pools (the role, by default) do not share weights.
* **Channels**: static edges (``static``); ``add_edge([a, b], c)`` joins (``join``, labelled
  ``"a+b"``); conditional edges with their path maps (``conditional``, label = the path-map
  key); ``Send`` fan-out (``send``), recognised when the router's return annotation mentions
  ``Send`` (``-> list[Send]``) or the source node lists the target in ``metadata["fanout"]``
  (the router still needs a path map naming its targets); ``Command`` destinations from a
  ``Command[Literal[...]]`` return annotation or ``add_node(..., destinations=...)``
  (``command``, labelled by a ``destinations`` dict's values). A node with no outgoing channel
  gets a static edge to END, as ``get_graph()`` draws it. When several channels join the same
  two nodes, the strongest kind is kept (static > join > send > conditional > command) and the
  labels of that kind are joined with ``","``.
* **Subgraphs** (a node whose runnable LangGraph reports as a compiled subgraph) are
  **flattened**, like ``get_graph(xray=True)``: inner nodes get prefixed ids
  ``parent/child`` (nested: ``outer/inner/child``) and ``subgraph="parent"``; channels into the
  parent node go to the subgraph's entry nodes and channels out of it leave from its exit
  nodes, keeping the outer channel's kind unless it is static. Inner nodes inherit the parent
  node's ``role``, ``pool``, ``trainable``, ``max_instances`` and ``agent`` metadata (their own
  keys win); metadata ``inner: {"tools": {"agent": False}}`` on the parent sets metadata of
  inner nodes you cannot annotate (a prebuilt agent's ``tools`` node). ``Command``
  destinations declared on the parent node (how handoffs with ``Command(graph=Command.PARENT)``
  are made visible, e.g. by ``langgraph-swarm``) leave from the subgraph's exit nodes.
  Metadata ``flatten: False`` on the parent keeps the subgraph as one opaque node.

Every branch must be visible: a conditional edge or ``Send`` router with neither a path map nor
a ``Literal`` return annotation is rejected (see :func:`topologies.validate.check_builder`).
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from functools import cached_property
from typing import Any

from langgraph.graph import StateGraph
from langgraph.types import Send

from topologies.topology import END, START, Topology, TopologyError

INHERITED = ("role", "pool", "trainable", "max_instances", "agent")
_PRIORITY = {"static": 0, "join": 1, "send": 2, "conditional": 3, "command": 4}
_IN, _OUT = "<start>", "<end>"  # markers for a scope's own START and END

Endpoint = tuple[str, str | None, str | None]  # (node id, kind, label) of an inner channel


def from_langgraph(graph: Any, name: str | None = None) -> Topology:
    """Build a validated :class:`Topology` from a LangGraph graph.

    Args:
        graph: a ``StateGraph`` builder or a compiled graph (anything with a ``.builder``).
        name: the topology's name; defaults to the compiled graph's name or ``"graph"``.

    Raises:
        TopologyError: a branch LangGraph cannot see, bad metadata, or a structure that cannot
            run; the message names the node and the fix.

    Example:
        >>> from langgraph.graph import StateGraph, START, END
        >>> from typing import TypedDict
        >>> class S(TypedDict):
        ...     x: int
        >>> b = StateGraph(S)
        >>> _ = b.add_node("solo", lambda s: s).add_edge(START, "solo").add_edge("solo", END)
        >>> Topology.from_langgraph(b).agent_ids
        ['solo']
    """
    from topologies.validate import validate

    builder = builder_of(graph)
    topology = Topology.empty(name or _graph_name(graph))
    root = _Scope(topology, builder, prefix="", parent=None, inherited={})
    merged: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for scope in root.walk():
        for src, dst, kind, label in scope.resolved:
            if scope is not root and (src == _IN or dst == _OUT):
                continue  # the enclosing scope connects these through entries/exits
            src, dst = (START if src == _IN else src), (END if dst == _OUT else dst)
            _merge(merged, src, dst, kind, label)
    rank = {n: i for i, n in enumerate(topology.graph)}
    rank[START], rank[END] = -1, len(rank)
    for (src, dst), (kind, labels) in sorted(
        merged.items(), key=lambda e: (rank[e[0][0]], rank[e[0][1]])
    ):
        topology.add_channel(src, dst, kind, ",".join(labels) or None)
    infer_roles(topology, root.explicit_roles)
    validate(topology)
    return topology


def infer_roles(topology: Topology, keep: set[str]) -> None:
    """Roles where the structure says so: the entry agent that routes to other agents is the
    ``orchestrator``, the agents it routes to are workers (nodes in ``keep`` declared
    their role and keep it; pools that followed the role follow it)."""
    g = topology.graph
    entries = [n for n in g.successors(START) if g.nodes[n]["kind"] == "agent"]
    if len(entries) != 1:
        return
    boss = entries[0]
    routed = [
        n
        for n in g.successors(boss)
        if n != boss
        and g.nodes[n]["kind"] == "agent"
        and g.edges[boss, n]["kind"] in ("conditional", "command", "send")
    ]
    if not routed:
        return
    for node, role in ((boss, "orchestrator"), *((n, "worker") for n in routed)):
        data = g.nodes[node]
        if node in keep:
            continue
        if data["pool"] == data["role"]:
            data["pool"] = role
        data["role"] = role


def builder_of(graph: Any) -> StateGraph:
    """The ``StateGraph`` builder of ``graph`` (itself, or a compiled graph's ``.builder``)."""
    if isinstance(graph, StateGraph):
        return graph
    builder = getattr(graph, "builder", None)
    if isinstance(builder, StateGraph):
        return builder
    raise TopologyError(
        f"cannot import {type(graph).__name__!r} as a LangGraph graph: pass a StateGraph "
        "builder or the graph returned by builder.compile()"
    )


def return_hint(runnable: Any) -> Any:
    """The return annotation of the function behind a LangGraph node or router, or ``None``."""
    func = getattr(runnable, "func", None) or getattr(runnable, "afunc", None) or runnable
    if not callable(func):
        return None
    for target in (func, getattr(func, "__call__", None)):  # noqa: B004 - a callable object
        try:
            hint = typing.get_type_hints(target).get("return")
        except Exception:  # unresolvable annotations: treat as unannotated
            continue
        if hint is not None:
            return hint
    return None


def mentions(hint: Any, cls: type) -> bool:
    """Whether a type annotation mentions ``cls`` anywhere (``list[Send]``, ``Command[...]``)."""
    if hint is cls or typing.get_origin(hint) is cls:
        return True
    return any(mentions(arg, cls) for arg in typing.get_args(hint))


def subgraph_of(runnable: Any) -> Any:
    """The compiled ``StateGraph`` a node runs, as LangGraph itself detects it, or ``None``."""
    from topologies.langgraph_compat import subgraph_pregel

    found = subgraph_pregel(runnable)
    return found if isinstance(getattr(found, "builder", None), StateGraph) else None


def _graph_name(graph: Any) -> str:
    name = getattr(graph, "name", None)
    return name if isinstance(name, str) and name else "graph"


def _merge(
    merged: dict[tuple[str, str], tuple[str, list[str]]],
    src: str,
    dst: str,
    kind: str,
    label: str | None,
) -> None:
    old = merged.get((src, dst))
    if old is None or _PRIORITY[kind] < _PRIORITY[old[0]]:
        merged[(src, dst)] = (kind, [label] if label is not None else [])
    elif old[0] == kind and label is not None and label not in old[1]:
        old[1].append(label)


def _pick(*channels: tuple[str | None, str | None]) -> tuple[str, str | None]:
    """The kind and label of a flattened channel: the first non-static one, outermost first."""
    for kind, label in channels:
        if kind is not None and kind != "static":
            return kind, label
    return "static", None


class _Scope:
    """One (sub)graph level being imported: its nodes are added on construction."""

    def __init__(
        self,
        topology: Topology,
        builder: StateGraph,
        prefix: str,
        parent: _Scope | None,
        inherited: dict[str, Any],
        overrides: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        from topologies.validate import check_builder

        check_builder(builder, prefix)
        self.builder, self.prefix, self.parent = builder, prefix, parent
        #: node ids whose role was declared in metadata (shared by all scopes of one import)
        self.explicit_roles: set[str] = parent.explicit_roles if parent else set()
        self.names = [n for n, spec in builder.nodes.items() if not spec.is_error_handler]
        self.subs: dict[str, _Scope] = {}
        self.fanout: dict[str, set[str]] = {}
        overrides = overrides or {}
        unknown = sorted(set(overrides) - set(self.names))
        if unknown:
            raise TopologyError(
                f"metadata 'inner' of node {prefix[:-1]!r} names {unknown}, which its subgraph "
                f"lacks: use its nodes {self.names}"
            )
        for name in self.names:
            spec = builder.nodes[name]
            meta = {**inherited, **(spec.metadata or {}), **overrides.get(name, {})}
            node_id = prefix + name
            _check_keys(node_id, meta)
            self.fanout[name] = set(meta.get("fanout") or ())
            sub = subgraph_of(spec.runnable)
            if sub is not None and meta.get("flatten", True):
                inner = {k: meta[k] for k in INHERITED if k in meta}
                scope = _Scope(topology, sub.builder, f"{node_id}/", self, inner, meta.get("inner"))
                self.subs[name] = scope
            else:
                if "role" in meta:
                    self.explicit_roles.add(node_id)
                elif _is_tool_node(spec.runnable):
                    meta["role"] = "tool"  # a ToolNode runs tools: not an agent by default
                _add_node(topology, node_id, meta, prefix[:-1] or None)
        self._check_fanout()

    def walk(self) -> Iterator[_Scope]:
        yield self
        for sub in self.subs.values():
            yield from sub.walk()

    # ----- channels in local names -----------------------------------------------------------
    @cached_property
    def raw(self) -> list[tuple[str, str, str, str | None]]:
        """This level's channels as ``(src, dst, kind, label)`` in local node names."""
        b = self.builder
        out: list[tuple[str, str, str, str | None]] = [(u, v, "static", None) for u, v in b.edges]
        for sources, dst in b.waiting_edges:
            out += [(s, dst, "join", "+".join(sources)) for s in sources]
        for src, branches in b.branches.items():
            for spec in branches.values():
                sends = mentions(return_hint(spec.path), Send)
                fan = self.fanout.get(src, set())
                for key, dst in (spec.ends or {}).items():
                    kind = "send" if dst != END and (sends or dst in fan) else "conditional"
                    out.append((src, dst, kind, str(key)))
        for name in self.names:
            ends = b.nodes[name].ends or ()
            labels = ends if isinstance(ends, dict) else dict.fromkeys(ends)
            out += [
                (name, dst, "command", None if lb is None else str(lb))
                for dst, lb in labels.items()
            ]
        has_out = {u for u, *_ in out}
        out += [(n, END, "static", None) for n in self.names if n not in has_out]
        return sorted(out, key=lambda e: (e[0], e[1], _PRIORITY[e[2]], e[3] or ""))

    # ----- resolution to flattened ids -------------------------------------------------------
    def sources(self, u: str) -> list[Endpoint]:
        if u == START:
            return [(_IN, None, None)]
        if u in self.subs:
            return self.subs[u].exits
        return [(self.prefix + u, None, None)]

    def targets(self, v: str, src: str) -> list[Endpoint]:
        if v == END:
            return [(_OUT, None, None)]
        if v in self.subs:
            return self.subs[v].entries
        if v in self.builder.nodes:
            return [(self.prefix + v, None, None)]
        raise TopologyError(
            f"node {self.prefix + src!r} routes to unknown node {v!r}: add_node({v!r}, ...) "
            "or fix the destination name"
        )

    def _resolve(self, only_start: bool) -> list[tuple[str, str, str, str | None]]:
        out = []
        for u, v, kind, label in self.raw:
            if only_start and u != START:
                continue
            for s, sk, sl in self.sources(u):
                for d, dk, dl in self.targets(v, u):
                    if s == _IN and d == _OUT and self.parent is not None:
                        continue  # a subgraph that may pass straight through: nothing to add
                    out.append((s, d, *_pick((kind, label), (sk, sl), (dk, dl))))
        return out

    @cached_property
    def resolved(self) -> list[tuple[str, str, str, str | None]]:
        """Every channel of this level with flattened ids (``_IN``/``_OUT`` for START/END)."""
        return self._resolve(only_start=False)

    @cached_property
    def entries(self) -> list[Endpoint]:
        """Where a run entering this subgraph starts (resolved START channels)."""
        return [(d, k, lb) for s, d, k, lb in self._resolve(only_start=True) if d != _OUT]

    @cached_property
    def exits(self) -> list[Endpoint]:
        """Where a run leaves this subgraph (resolved channels to END)."""
        return [(s, k, lb) for s, d, k, lb in self.resolved if d == _OUT and s != _IN]

    def _check_fanout(self) -> None:
        reached: dict[str, set[str]] = {}
        for src, branches in self.builder.branches.items():
            for spec in branches.values():
                reached.setdefault(src, set()).update((spec.ends or {}).values())
        for name, fan in self.fanout.items():
            missing = sorted(fan - reached.get(name, set()))
            if missing:
                raise TopologyError(
                    f"node {self.prefix + name!r} lists {missing} in metadata 'fanout' but none "
                    f"of its conditional edges reaches them: add them to the router's path map"
                )


def _is_tool_node(runnable: Any) -> bool:
    try:
        from langgraph.prebuilt import ToolNode
    except ImportError:  # pragma: no cover - langgraph-prebuilt not installed
        return False
    return isinstance(runnable, ToolNode)


def _check_keys(node: str, meta: dict[str, Any]) -> None:
    for key in ("agent", "flatten"):
        if key in meta and not isinstance(meta[key], bool):
            raise TopologyError(
                f"node {node!r} has metadata {key}={meta[key]!r}: use True or False"
            )
    fan = meta.get("fanout")
    if fan is not None and (
        isinstance(fan, str) or not isinstance(fan, list | tuple | set)
        or not all(isinstance(x, str) for x in fan)
    ):  # fmt: skip
        raise TopologyError(
            f"node {node!r} has metadata fanout={fan!r}: use a list of the node names it "
            "reaches with Send"
        )
    inner = meta.get("inner")
    if inner is not None and (
        not isinstance(inner, dict) or not all(isinstance(v, dict) for v in inner.values())
    ):
        raise TopologyError(
            f"node {node!r} has metadata inner={inner!r}: map inner node names to metadata "
            "dicts, e.g. {'tools': {'agent': False}}"
        )
    if "subgraph" in meta and not isinstance(meta["subgraph"], str | None):
        raise TopologyError(
            f"node {node!r} has metadata subgraph={meta['subgraph']!r}: use a string"
        )


def _add_node(topology: Topology, node: str, meta: dict[str, Any], group: str | None) -> None:
    role = meta.get("role", "agent")
    agent = meta.get("agent", role != "tool")
    topology.add_agent(
        node,
        role,
        pool=meta.get("pool"),
        trainable=meta.get("trainable", True),
        max_instances=meta.get("max_instances", 1),
        kind="agent" if agent else "node",
        subgraph=group if group is not None else meta.get("subgraph"),
    )
