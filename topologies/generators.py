"""Named topologies (``single``, ``chain:N``, ``star:N``, ``tree:BxD``, ``mesh:N``) and the
runnable LangGraph skeleton every topology can produce.

Routing convention of the skeleton: a node with conditional out-edges writes
``{"route": {node: [targets]}}``; its router sends the run to those targets in parallel
(``Send`` targets get the state as payload) and to END when the list is empty.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langgraph.graph import END as LG_END
from langgraph.graph import START as LG_START
from langgraph.graph import StateGraph
from langgraph.types import Send

from topologies.topology import END, START, Topology, TopologyError


def merge_routes(left: dict[str, list[str]], right: dict[str, list[str]]) -> dict[str, list[str]]:
    """Reducer for ``route``: a node's newest decision replaces its previous one."""
    return {**(left or {}), **(right or {})}


class TeamState(TypedDict, total=False):
    """Default state of a topology skeleton."""

    task: Any
    messages: Annotated[list[dict[str, Any]], operator.add]
    route: Annotated[dict[str, list[str]], merge_routes]
    answer: Any


def single() -> Topology:
    t = Topology.empty("single", spec="single")
    t.add_agent("agent", "agent")
    t.add_channel(START, "agent")
    t.add_channel("agent", END)
    return t


def chain(n: int) -> Topology:
    """A pipeline ``agent_0 → … → agent_{n-1}``; the last agent answers."""
    t = Topology.empty(f"chain:{n}", spec=f"chain:{n}")
    names = [f"agent_{i}" for i in range(n)]
    for i, name in enumerate(names):
        t.add_agent(name, "aggregator" if i == n - 1 and n > 1 else ("agent" if n == 1 else "worker"))
    t.add_channel(START, names[0])
    for a, b in zip(names, names[1:]):
        t.add_channel(a, b)
    t.add_channel(names[-1], END)
    return t


def star(n: int) -> Topology:
    """An orchestrator that fans out to ``n`` workers in parallel; workers report back."""
    t = Topology.empty(f"star:{n}", spec=f"star:{n}")
    t.add_agent("orchestrator", "orchestrator")
    t.add_channel(START, "orchestrator")
    for i in range(n):
        w = f"worker_{i}"
        t.add_agent(w, "worker")
        t.add_channel("orchestrator", w, "conditional", label=w)
        t.add_channel(w, "orchestrator")
    t.add_channel("orchestrator", END, "conditional", label="answer")
    return t


def tree(branching: int, depth: int) -> Topology:
    """An orchestrator over ``depth`` levels of ``branching`` children; leaves are workers.

    Inner nodes (``lead_<path>``) delegate to their children or report to their parent; leaves
    (``worker_<path>``) report to their parent.
    """
    spec = f"tree:{branching}x{depth}"
    t = Topology.empty(spec, spec=spec)
    t.add_agent("orchestrator", "orchestrator")
    t.add_channel(START, "orchestrator")
    t.add_channel("orchestrator", END, "conditional", label="answer")

    def grow(parent: str, path: str, level: int) -> None:
        for b in range(branching):
            p = f"{path}_{b}" if path else str(b)
            leaf = level == depth
            name = f"{'worker' if leaf else 'lead'}_{p}"
            t.add_agent(name, "worker" if leaf else "orchestrator")
            t.add_channel(parent, name, "conditional", label=name)
            if leaf:
                t.add_channel(name, parent)
            else:
                t.add_channel(name, parent, "conditional", label="report")
                grow(name, p, level + 1)

    grow("orchestrator", "", 1)
    return t


def mesh(n: int) -> Topology:
    """``n`` peers in all-to-all rounds (debate): each round every peer sees the others'
    messages; any peer may end the run."""
    t = Topology.empty(f"mesh:{n}", spec=f"mesh:{n}")
    names = [f"agent_{i}" for i in range(n)]
    for name in names:
        t.add_agent(name, "agent")
        t.add_channel(START, name)
    for a in names:
        for b in names:
            t.add_channel(a, b, "conditional", label=b)
        t.add_channel(a, END, "conditional", label="answer")
    return t


_SPEC = re.compile(r"^(?P<kind>[a-z]+)(?::(?P<args>[0-9x]+))?$")
GENERATORS: dict[str, tuple[Callable[..., Topology], str]] = {
    "single": (single, "single"),
    "chain": (chain, "chain:N"),
    "star": (star, "star:N"),
    "tree": (tree, "tree:BxD"),
    "mesh": (mesh, "mesh:N"),
}


def from_spec(spec: str) -> Topology:
    """Parse a spec string (``single``, ``chain:3``, ``star:4``, ``tree:2x2``, ``mesh:3``)."""
    m = _SPEC.match(spec.strip())
    usage = ", ".join(form for _, form in GENERATORS.values())
    if not m or m["kind"] not in GENERATORS:
        raise TopologyError(f"unknown topology spec {spec!r}: use one of {usage}")
    kind, args = m["kind"], m["args"]
    fn, form = GENERATORS[kind]
    try:
        if kind == "single":
            if args:
                raise ValueError
            return fn()
        nums = [int(a) for a in (args or "").split("x")]
        if len(nums) != form.count(":") + form.count("x") or min(nums) < 1:
            raise ValueError
    except ValueError:
        raise TopologyError(
            f"bad topology spec {spec!r}: write {form} with positive integers"
        ) from None
    return fn(*nums)


def to_langgraph(
    topology: Topology,
    node_fn: Callable[[str], Callable[..., Any]],
    state_schema: type = TeamState,
) -> StateGraph:
    """Build a runnable ``StateGraph`` skeleton of ``topology``.

    Args:
        node_fn: ``node_fn(node_id)`` returns the LangGraph node callable for that node.
        state_schema: the state ``TypedDict``; it needs a ``route`` key reduced by
            :func:`merge_routes` when the topology has conditional or ``Send`` edges.
    """
    builder = StateGraph(state_schema)
    lg = {START: LG_START, END: LG_END}
    for node in topology.nodes:
        d = topology.graph.nodes[node]
        builder.add_node(
            node,
            node_fn(node),
            metadata={"role": d["role"], "pool": d["pool"], "trainable": d["trainable"],
                      "max_instances": d["max_instances"]},
        )
    joins: dict[str, list[str]] = {}
    for u, v, d in topology.edges():
        if d["kind"] == "static":
            builder.add_edge(lg.get(u, u), lg.get(v, v))
        elif d["kind"] == "join":
            joins.setdefault(v, []).append(u)
    for v, sources in joins.items():
        builder.add_edge(sources, lg.get(v, v))
    for node in [START, *topology.nodes]:
        routed = [(v, d["kind"]) for _, v, d in topology.graph.out_edges(node, data=True)
                  if d["kind"] in ("conditional", "send")]
        if routed:
            builder.add_conditional_edges(
                lg.get(node, node), _router(node, routed), [lg.get(v, v) for v, _ in routed]
            )
    return builder


def _router(node: str, routed: list[tuple[str, str]]) -> Callable[[dict[str, Any]], Any]:
    kinds = dict(routed)
    allowed = set(kinds)

    def route(state: dict[str, Any]) -> Any:
        targets = (state.get("route") or {}).get(node) or []
        bad = [t for t in targets if t not in allowed]
        if bad:
            raise TopologyError(f"node {node!r} routed to {bad}: its channels go to {sorted(allowed)}")
        if not targets:
            if END not in allowed:
                raise TopologyError(f"node {node!r} chose no target and has no channel to END")
            return LG_END
        return [Send(t, state) if kinds[t] == "send" else (LG_END if t == END else t) for t in targets]

    route.__name__ = f"route_{node}"
    return route
