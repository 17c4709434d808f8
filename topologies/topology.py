"""The topology IR: a directed graph of agents and the channels between them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import networkx as nx

START = "__start__"
END = "__end__"

ROLES = ("orchestrator", "worker", "aggregator", "tool", "agent")
NODE_KINDS = ("agent", "node", "start", "end")
EDGE_KINDS = ("static", "conditional", "send", "join", "command")


class TopologyError(ValueError):
    """A topology that cannot run; the message names the node and the fix."""


class Topology:
    """A team's communication structure: agent nodes and typed channels.

    Node attributes: ``kind`` (``agent`` | ``node`` | ``start`` | ``end``), ``role``, ``pool``,
    ``trainable``, ``max_instances`` and ``subgraph``. Edge attributes: ``kind`` (``static`` |
    ``conditional`` | ``send`` | ``join`` | ``command``) and ``label``.

    Example:
        >>> t = Topology.from_spec("star:3")
        >>> t.agent_ids
        ['orchestrator', 'worker_0', 'worker_1', 'worker_2']
    """

    def __init__(self, graph: nx.DiGraph, name: str = "graph", spec: str | None = None) -> None:
        self.graph = graph
        self.name = name
        #: the spec string this topology was generated from (``"star:3"``), if any.
        self.spec = spec

    # ----- construction --------------------------------------------------------------------
    @classmethod
    def empty(cls, name: str = "graph", spec: str | None = None) -> Topology:
        graph = nx.DiGraph()
        graph.add_node(START, kind="start", role=None, pool=None, trainable=False, max_instances=1)
        graph.add_node(END, kind="end", role=None, pool=None, trainable=False, max_instances=1)
        return cls(graph, name=name, spec=spec)

    def add_agent(
        self,
        node: str,
        role: str = "agent",
        *,
        pool: str | None = None,
        trainable: bool = True,
        max_instances: int = 1,
        kind: str = "agent",
        subgraph: str | None = None,
    ) -> None:
        if node in self.graph:
            raise TopologyError(f"duplicate node id {node!r}: give every node a unique name")
        self.graph.add_node(
            node,
            kind=kind,
            role=role,
            pool=pool if pool is not None else (role if kind == "agent" else None),
            trainable=trainable if kind == "agent" else False,
            max_instances=max_instances,
            subgraph=subgraph,
        )

    def add_channel(self, src: str, dst: str, kind: str = "static", label: str | None = None) -> None:
        self.graph.add_edge(src, dst, kind=kind, label=label)

    @classmethod
    def from_spec(cls, spec: str | Topology) -> Topology:
        """Build a named topology from a spec string such as ``"star:4"`` or ``"tree:2x3"``."""
        if isinstance(spec, Topology):
            return spec
        from topologies.generators import from_spec

        return from_spec(spec)

    def to_langgraph(self, node_fn: Any, state_schema: type | None = None) -> Any:
        """A runnable LangGraph ``StateGraph`` skeleton; see :func:`topologies.generators.to_langgraph`."""
        from topologies.generators import TeamState, to_langgraph

        return to_langgraph(self, node_fn, state_schema or TeamState)

    # ----- views ---------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """The generator kind (``star``, ``chain``, ...) or ``graph`` for a user's graph."""
        return self.spec.split(":", 1)[0] if self.spec else "graph"

    @property
    def nodes(self) -> list[str]:
        """Agent and plain nodes (START/END excluded), in insertion order."""
        return [n for n, d in self.graph.nodes(data=True) if d["kind"] in ("agent", "node")]

    @property
    def agents(self) -> list[str]:
        """Agent node names, in insertion order (fan-out instances not expanded)."""
        return [n for n, d in self.graph.nodes(data=True) if d["kind"] == "agent"]

    @property
    def agent_ids(self) -> list[str]:
        """The fixed list of agent ids: fan-out targets expand to ``<node>_<i>``."""
        out: list[str] = []
        for node in self.agents:
            k = self.graph.nodes[node]["max_instances"]
            out.extend([node] if k == 1 else [f"{node}_{i}" for i in range(k)])
        return out

    def node_of(self, agent_id: str) -> str:
        """The node an agent id belongs to (``worker_3`` → ``worker`` for a fan-out node)."""
        if agent_id in self.graph and self.graph.nodes[agent_id]["kind"] == "agent":
            return agent_id
        base, _, idx = agent_id.rpartition("_")
        if base in self.graph and idx.isdigit() and int(idx) < self.graph.nodes[base]["max_instances"]:
            return base
        raise TopologyError(f"unknown agent id {agent_id!r}: known agents are {self.agent_ids}")

    @property
    def roles(self) -> dict[str, str]:
        """Agent id → role."""
        return {a: self.graph.nodes[self.node_of(a)]["role"] for a in self.agent_ids}

    @property
    def pools(self) -> dict[str, str]:
        """Agent id → pool id (the role by default: parameter sharing by role)."""
        return {a: self.graph.nodes[self.node_of(a)]["pool"] for a in self.agent_ids}

    @property
    def orchestrators(self) -> list[str]:
        return [a for a in self.agents if self.graph.nodes[a]["role"] == "orchestrator"]

    def attr(self, node: str, key: str) -> Any:
        return self.graph.nodes[node][key]

    def parents(self, node: str) -> list[str]:
        return [p for p in self.graph.predecessors(node) if p != START]

    def children(self, node: str) -> list[str]:
        return [c for c in self.graph.successors(node) if c != END]

    def edges(self, kind: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        return [(u, v, d) for u, v, d in self.graph.edges(data=True) if kind in (None, d["kind"])]

    def out_kinds(self, node: str) -> set[str]:
        return {d["kind"] for _, _, d in self.graph.out_edges(node, data=True)}

    def critical_path_length(self) -> int:
        """Supersteps on the longest START→END path, each node counted once (cycles cut).

        Parallel fan-out costs one superstep however many branches run; a back edge (a worker
        reporting to its orchestrator) closes a round and is not followed again.
        """
        dag = nx.DiGraph()
        dag.add_nodes_from(self.graph.nodes)
        for u, v in nx.dfs_edges(self.graph, START):
            dag.add_edge(u, v)
        # keep forward edges that do not close a cycle, so re-convergent paths count
        for u, v in self.graph.edges:
            if not dag.has_edge(u, v):
                dag.add_edge(u, v)
                if not nx.is_directed_acyclic_graph(dag):
                    dag.remove_edge(u, v)
        longest = nx.dag_longest_path(dag)
        return sum(1 for n in longest if n not in (START, END))

    def __len__(self) -> int:
        return len(self.agent_ids)

    def __repr__(self) -> str:
        label = self.spec or self.name
        return f"Topology({label!r}, agents={len(self.agent_ids)}, edges={self.graph.number_of_edges()})"

    def subgraph_ids(self) -> Iterable[str]:
        return (n for n, d in self.graph.nodes(data=True) if d.get("subgraph"))
