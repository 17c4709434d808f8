"""Named topologies (``single``, ``chain:N``, ``star:N``, ``tree:BxD``, ``mesh:N``) and the
runnable LangGraph skeleton every topology can produce.

Routing convention of the skeleton: a node with conditional out-edges writes
``{"route": {node: [targets]}}``; its router sends the run to those targets in parallel
(``Send`` targets get the state as payload) and to END when the list is empty. Targets reached
by a ``Command`` channel are sent with ``Command(goto=...)`` instead.

Every generator checks the size its arguments imply (``MAX_AGENTS``, ``MAX_CHANNELS``) before
building anything, and validates its topology (``Topology.validate``).
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END as LG_END
from langgraph.graph import START as LG_START
from langgraph.graph import StateGraph
from langgraph.types import Command, Send

from topologies.langgraph_compat import runnable_of
from topologies.topology import END, MAX_AGENTS, START, Topology, TopologyError, check_size


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
    _check_size("chain", n)
    t = Topology.empty(f"chain:{n}", spec=f"chain:{n}")
    names = [f"agent_{i}" for i in range(n)]
    for i, name in enumerate(names):
        role = "agent" if n == 1 else ("aggregator" if i == n - 1 else "worker")
        t.add_agent(name, role)
    t.add_channel(START, names[0])
    for a, b in itertools.pairwise(names):
        t.add_channel(a, b)
    t.add_channel(names[-1], END)
    return t


def star(n: int) -> Topology:
    """An orchestrator that fans out to ``n`` workers in parallel; workers report back."""
    _check_size("star", n)
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
    _check_size("tree", branching, depth)
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
    _check_size("mesh", n)
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
        if kind == "single" and args:
            raise ValueError
        nums = [int(a) for a in args.split("x")] if args else []
        if len(nums) != form.count(":") + form.count("x") or min(nums, default=1) < 1:
            raise ValueError
    except ValueError:
        raise TopologyError(
            f"bad topology spec {spec!r}: write {form} with positive integers"
        ) from None
    return fn(*nums).validate()  # each generator checks its size first


def _check_size(kind: str, *nums: int) -> None:
    agents, channels = spec_size(kind, list(nums))
    exact = kind != "tree" or _tree_agents(*nums)[1]
    check_size(f"{kind}:{'x'.join(map(str, nums))}", agents, channels, exact=exact)


def spec_size(kind: str, nums: list[int]) -> tuple[int, int]:
    """``(agents, channels)`` of a named topology, computed without building it. A tree's count
    stops once past :data:`MAX_AGENTS` (then it is a lower bound), so ``tree:1000x1000``
    costs nothing."""
    if kind == "single":
        return 1, 2
    if kind == "chain":
        return nums[0], nums[0] + 1
    if kind == "star":
        return nums[0] + 1, 2 * nums[0] + 2
    if kind == "mesh":
        return nums[0], nums[0] * nums[0] + 2 * nums[0]
    agents, _ = _tree_agents(*nums)
    return agents, 2 * agents  # each agent but the root: down and up; the root: START, END


def _tree_agents(branching: int, depth: int) -> tuple[int, bool]:
    """The agents of ``tree:BxD`` and whether the count is exact (it stops past the limit)."""
    agents, level = 1, 1
    for done in range(1, depth + 1):
        level *= branching
        agents += level
        if agents > MAX_AGENTS:
            return agents, done == depth
    return agents, True


def to_langgraph(
    topology: Topology,
    node_fn: Callable[[str], Callable[..., Any]],
    state_schema: type = TeamState,
) -> StateGraph:
    """Build a runnable ``StateGraph`` skeleton of ``topology``.

    Static channels become ``add_edge``; join channels ``add_edge([sources], target)`` (one join
    per target and label); conditional and ``Send`` channels one router per node, whose path map
    keys are the channel labels (target names when labels are missing or repeat); ``Command``
    channels become the node's ``destinations`` and the node's ``route`` to them is returned as
    ``Command(goto=...)``. Node metadata carries ``role``, ``pool``, ``trainable``,
    ``max_instances`` (plus ``agent: False`` for plain nodes, ``fanout`` for ``Send`` sources and
    ``subgraph`` when set), so ``Topology.from_langgraph`` of the skeleton gives the topology back.

    Args:
        topology: the topology to build.
        node_fn: ``node_fn(node_id)`` returns the LangGraph node callable for that node.
        state_schema: the state ``TypedDict``; it needs a ``route`` key reduced by
            :func:`merge_routes` when the topology has conditional, ``Send`` or ``Command`` edges.

    Returns:
        The uncompiled builder.
    """
    builder = StateGraph(state_schema)
    lg = {START: LG_START, END: LG_END}
    for node in topology.nodes:
        d = topology.graph.nodes[node]
        out = topology.graph.out_edges(node, data=True)
        commands = {v: e["label"] for _, v, e in out if e["kind"] == "command"}
        fanout = [v for _, v, e in out if e["kind"] == "send"]
        meta = {k: d[k] for k in ("role", "pool", "trainable", "max_instances")}
        meta.update({"agent": False} if d["kind"] == "node" else {})
        meta.update({"fanout": fanout} if fanout else {})
        meta.update({"subgraph": d["subgraph"]} if d.get("subgraph") else {})
        fn = node_fn(node)
        if commands:
            fn = _commanding(node, fn, set(commands))
        builder.add_node(node, fn, metadata=meta, destinations=_destinations(commands, lg))
    joins: dict[tuple[str, str | None], list[str]] = {}
    for u, v, d in topology.edges():
        if d["kind"] == "static":
            builder.add_edge(lg.get(u, u), lg.get(v, v))
        elif d["kind"] == "join":
            joins.setdefault((v, d["label"]), []).append(u)
    for (v, _), sources in joins.items():
        builder.add_edge(sources, lg.get(v, v))
    for node in [START, *topology.nodes]:
        out = topology.graph.out_edges(node, data=True)
        routed = [
            (v, d["kind"], d["label"]) for _, v, d in out if d["kind"] in ("conditional", "send")
        ]
        if routed:
            keys = [label if label is not None else v for v, _, label in routed]
            if len(set(keys)) < len(keys):
                keys = [v for v, _, _ in routed]
            commands = {v for _, v, d in out if d["kind"] == "command"}
            builder.add_conditional_edges(
                lg.get(node, node),
                _router(node, routed, keys, commands),
                {k: lg.get(v, v) for k, (v, _, _) in zip(keys, routed, strict=True)},
            )
    return builder


def _destinations(commands: dict[str, str | None], lg: dict[str, str]) -> Any:
    if not commands:
        return None
    if all(label is None for label in commands.values()):
        return tuple(lg.get(v, v) for v in commands)
    return {lg.get(v, v): label if label is not None else v for v, label in commands.items()}


def _router(
    node: str, routed: list[tuple[str, str, str | None]], keys: list[str], commands: set[str]
) -> Callable[[dict[str, Any]], Any]:
    kinds = {v: kind for v, kind, _ in routed}
    key_of = {v: k for (v, _, _), k in zip(routed, keys, strict=True)}
    allowed = set(kinds)

    def route(state: dict[str, Any]) -> Any:
        chosen = (state.get("route") or {}).get(node) or []
        bad = [t for t in chosen if t not in allowed and t not in commands]
        if bad:
            raise TopologyError(
                f"node {node!r} routed to {bad}: its channels go to {sorted(allowed | commands)}"
            )
        targets = [t for t in chosen if t in allowed]
        if not chosen:
            if END not in allowed:
                raise TopologyError(f"node {node!r} chose no target and has no channel to END")
            return key_of[END]
        return [Send(t, state) if kinds[t] == "send" else key_of[t] for t in targets]

    route.__name__ = f"route_{node}"
    return route


def _commanding(node: str, fn: Callable[..., Any], commands: set[str]) -> Callable[..., Any]:
    """Wrap a node so the targets of its ``route`` reached by ``Command`` go into ``goto``."""
    runnable = runnable_of(fn, node)

    def command_node(state: Any, config: RunnableConfig) -> Any:
        update = runnable.invoke(state, config)
        chosen = (
            ((update or {}).get("route") or {}).get(node) or [] if isinstance(update, dict) else []
        )
        goto = [LG_END if t == END else t for t in chosen if t in commands]
        return Command(update=update, goto=goto) if goto else update

    command_node.__name__ = node
    return command_node
