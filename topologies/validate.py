"""Structural checks: every :class:`TopologyError` a topology or a LangGraph builder can raise.

:func:`validate` checks the IR (run by ``from_langgraph``, ``from_dict`` and the named
generators); :func:`check_builder` checks what only the LangGraph builder shows (branches
``get_graph()`` cannot see) before it is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import networkx as nx

from topologies.paths import can_finish, reachable
from topologies.topology import (
    EDGE_KINDS,
    END,
    NODE_KINDS,
    ROLES,
    START,
    TopologyError,
    check_size,
)

if TYPE_CHECKING:
    from topologies.topology import Topology

NODE_KEYS = ("kind", "role", "pool", "trainable", "max_instances", "subgraph")


def validate(topology: Topology) -> None:
    """Raise :class:`TopologyError` if ``topology`` cannot run.

    Checks, in order: node attributes (kind, role, pool, trainable, max_instances, subgraph),
    channels (kind, label, endpoints), unique agent ids, at least one agent, every agent
    reachable from START, and every agent able to finish the run (no cycle of static edges
    without an exit).
    """
    g = topology.graph
    for special, kind in ((START, "start"), (END, "end")):
        if special not in g or g.nodes[special].get("kind") != kind:
            raise TopologyError(
                f"topology {topology.name!r} lacks its {special} node: build it with "
                "Topology.empty() so START and END exist"
            )
    for node, data in g.nodes(data=True):
        if node not in (START, END):
            check_node(node, data)
    for u, v, data in g.edges(data=True):
        check_edge(u, v, data)
    agents = sum(g.nodes[n]["max_instances"] for n in topology.agents)
    check_size(topology.name, agents)  # before the agent ids are listed
    check_agent_ids(topology)
    if not topology.agents:
        raise TopologyError(
            f"topology {topology.name!r} has no agent node: mark at least one node as an agent "
            "(LangGraph: drop metadata {'agent': False} from it; dict: kind: agent)"
        )
    seen = reachable(topology)
    for agent in topology.agents:
        if agent not in seen:
            raise TopologyError(
                f"agent {agent!r} is unreachable from START: add an edge to it "
                f"(builder.add_edge(START, {agent!r}) or from a node that runs) or remove it"
            )
    finishing = can_finish(topology)
    for agent in topology.agents:
        if agent not in finishing:
            stuck = g.subgraph(n for n in g if n not in finishing)
            cycle = [u for u, _ in nx.find_cycle(stuck, source=agent)]
            loop = " → ".join([*cycle, cycle[0]])
            raise TopologyError(
                f"agent {agent!r} can never finish the run: static edges {loop} form a cycle "
                f"with no exit; add an edge to END or a conditional edge out of the cycle"
            )


def check_node(node: str, data: dict[str, Any]) -> None:
    """Raise :class:`TopologyError` for a missing or bad node attribute."""
    missing = [k for k in NODE_KEYS if k not in data]
    if missing:
        raise TopologyError(f"node {node!r} lacks {missing}: add it with Topology.add_agent")
    kind, role = data["kind"], data["role"]
    if kind not in ("agent", "node"):
        raise TopologyError(
            f"node {node!r} has kind {kind!r}: use 'agent' or 'node' "
            f"({NODE_KINDS[2:]} are START and END only)"
        )
    if role not in ROLES and not (kind == "node" and role is None):
        raise TopologyError(f"node {node!r} has unknown role {role!r}: use one of {list(ROLES)}")
    if not isinstance(data["trainable"], bool):
        raise TopologyError(f"node {node!r} has trainable={data['trainable']!r}: use True or False")
    k = data["max_instances"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise TopologyError(
            f"node {node!r} has max_instances={k!r}: use an integer ≥ 1 "
            "(the most parallel Send instances it runs)"
        )
    for key in ("pool", "subgraph"):
        if data[key] is not None and (not isinstance(data[key], str) or not data[key]):
            raise TopologyError(f"node {node!r} has {key}={data[key]!r}: use a non-empty string")


def check_edge(u: str, v: str, data: dict[str, Any]) -> None:
    """Raise :class:`TopologyError` for a bad channel."""
    if v == START or u == END:
        raise TopologyError(
            f"channel {u!r} → {v!r} runs backwards through START/END: START only starts "
            "channels and END only ends them"
        )
    kind = data.get("kind")
    if kind not in EDGE_KINDS:
        raise TopologyError(
            f"channel {u!r} → {v!r} has kind {kind!r}: use one of {list(EDGE_KINDS)}"
        )
    if kind == "send" and v == END:
        raise TopologyError(
            f"channel {u!r} → END is a Send: Send cannot target END; use 'conditional'"
        )
    label = data.get("label")
    if label is not None and not isinstance(label, str):
        raise TopologyError(f"channel {u!r} → {v!r} has label {label!r}: use a string or None")


def check_agent_ids(topology: Topology) -> None:
    """Raise :class:`TopologyError` when two agents would share an id after fan-out expansion."""
    owner: dict[str, str] = {}
    for node in topology.agents:
        for agent_id in topology.instances(node):
            if agent_id in owner:
                raise TopologyError(
                    f"agent id {agent_id!r} is used twice (by node {owner[agent_id]!r} and by "
                    f"node {node!r}): rename one of the nodes"
                )
            owner[agent_id] = node
    for node in topology.nodes:
        if node in owner and owner[node] != node:
            raise TopologyError(
                f"agent id {node!r} of node {owner[node]!r} clashes with node {node!r}: "
                "rename one of the nodes"
            )


def check_builder(builder: Any, prefix: str = "") -> None:
    """Raise :class:`TopologyError` for routing a LangGraph builder hides from ``get_graph()``.

    * a conditional edge or ``Send`` router with no path map and no ``Literal`` return
      annotation (``builder.branches[src][name].ends is None``);
    * a node annotated to return ``Command`` that declares no destinations and has no other
      outgoing edge (its handoffs are invisible). A node that returns ``Command`` only to update
      state and has a static or conditional edge onward is fine.

    Args:
        builder: a ``StateGraph`` (one level; the importer calls this for every subgraph).
        prefix: the flattened id prefix of this level (``"parent/"``) for messages.
    """
    from langgraph.types import Command

    from topologies.langgraph_import import mentions, return_hint

    for src, branches in builder.branches.items():
        for name, spec in branches.items():
            if spec.ends is None:
                where = "START" if src == START else repr(prefix + src)
                func = getattr(spec.path, "func", None) or getattr(spec.path, "afunc", None)
                shown = getattr(func, "__name__", name)
                ref = shown if shown.isidentifier() else "router"
                raise TopologyError(
                    f"node {where}: its conditional edge / Send router {shown!r} declares no "
                    "targets, so LangGraph cannot see where it goes; pass them as a path map, "
                    f"builder.add_conditional_edges({src!r}, {ref}, ['target', ...]), or "
                    f"annotate the router's return type with Literal['target', ...]"
                )
    routed = {u for u, _ in builder.edges} | set(builder.branches)
    routed |= {s for sources, _ in builder.waiting_edges for s in sources}
    for name, spec in builder.nodes.items():
        if spec.ends or name in routed or spec.is_error_handler:
            continue
        if mentions(return_hint(spec.runnable), Command):
            raise TopologyError(
                f"node {prefix + name!r} returns Command but declares no destinations, so "
                "LangGraph cannot see its handoffs; annotate it -> Command[Literal['a', 'b']] "
                f"or pass builder.add_node({name!r}, ..., destinations=('a', 'b'))"
            )
