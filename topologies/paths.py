"""Path measures on a topology: reachability, finishing, and the critical path.

The critical path counts *supersteps*, LangGraph's unit of latency: every node triggered in a
step runs in that step, so parallel branches (fan-out to ``k`` workers) cost one superstep
however many run.

Definition (one delegation round): number every node by its BFS depth from START (the earliest
superstep it can run in). An edge is *forward* when it goes one level deeper, *back* when it
goes to a shallower node (a worker reporting to its orchestrator) and *sideways* between nodes
of equal depth (a peer answering a peer, a self-loop). The critical path is the longest walk
from START to a finishing node (one with an edge to END, or none out) that goes forward, then
may take one back or sideways edge, climb further back edges (a leaf reporting up a tree), and
go forward again. Each node on the walk costs one superstep, so a node may count twice (once
before and once after the round trip). This gives ``single`` = 1, ``chain:N`` = N, ``star:N`` = 3,
``tree:BxD`` = 2·D + 1 and ``mesh:N`` = 2. A graph in which no finishing node is reachable this
way (``Command`` handoffs only) falls back to nodes that may finish by routing, then to any node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx

from topologies.topology import END, START

if TYPE_CHECKING:
    from topologies.topology import Topology

ROUTED = ("conditional", "send", "command")


def reachable(topology: Topology) -> set[str]:
    """Nodes a run can reach from START, following channels of every kind."""
    return set(nx.descendants(topology.graph, START)) | {START}


def may_finish(topology: Topology, node: str) -> bool:
    """Whether a run may end right after ``node``.

    A node ends the run when it has an edge to END or no outgoing edge at all; a node routed by
    a condition, a ``Send`` router or a ``Command`` may end it too (routing to nothing ends the
    branch).
    """
    g = topology.graph
    if node == END:
        return True
    out = list(g.out_edges(node, data="kind"))
    return not out or any(v == END or k in ROUTED for _, v, k in out)


def can_finish(topology: Topology) -> set[str]:
    """Nodes from which some run can finish (they reach a node that :func:`may_finish`)."""
    g = topology.graph
    done = {n for n in g if may_finish(topology, n)}
    out = set(done)
    for n in done:
        out |= nx.ancestors(g, n)
    return out


def critical_path(topology: Topology) -> list[str]:
    """The nodes on the critical path, START first (see the module docstring).

    Returns:
        Node ids in run order; a node visited twice appears twice. Ends with END when the path
        finishes through an edge to END.
    """
    g = topology.graph
    depth = nx.single_source_shortest_path_length(g, START)
    unrolled = nx.DiGraph()
    unrolled.add_node((START, 0))
    for u, v in g.edges:
        if u not in depth:
            continue
        if depth[v] > depth[u]:
            unrolled.add_edges_from([((u, 0), (v, 0)), ((u, 1), (v, 2)), ((u, 2), (v, 2))])
        elif depth[v] < depth[u]:
            unrolled.add_edges_from([((u, 0), (v, 1)), ((u, 1), (v, 1))])
        else:
            unrolled.add_edge((u, 0), (v, 1))
    # longest path (in counted nodes) from (START, 0) to every unrolled node
    best: dict[tuple[str, int], int] = {(START, 0): 0}
    prev: dict[tuple[str, int], tuple[str, int]] = {}
    for x in nx.topological_sort(unrolled):
        if x not in best:
            continue
        for y in unrolled.successors(x):
            score = best[x] + (y[0] not in (START, END))
            if score > best.get(y, -1):
                best[y], prev[y] = score, x
    ends = [x for x in best if x[0] == END or g.out_degree(x[0]) == 0]
    if not ends:
        ends = [x for x in best if may_finish(topology, x[0])] or list(best)
    last = max(ends, key=lambda x: best[x])  # first maximum: deterministic
    path = [last]
    while path[-1] in prev:
        path.append(prev[path[-1]])
    return [n for n, _ in reversed(path)]
