"""The topology IR: a directed graph of agents and the channels between them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import networkx as nx

from topologies.errors import MarlError

START = "__start__"
END = "__end__"

ROLES = ("orchestrator", "worker", "aggregator", "tool", "agent")
NODE_KINDS = ("agent", "node", "start", "end")
EDGE_KINDS = ("static", "conditional", "send", "join", "command")


#: the most agents (fan-out instances included) a topology may have: checked before a named
#: topology is built and before a graph's agent ids are listed, so a huge spec fails at once.
MAX_AGENTS = 256
#: the most channels a named topology may have (``mesh:256`` has 66,048).
MAX_CHANNELS = 70_000


class TopologyError(MarlError, ValueError):
    """A topology that cannot run; the message names the node and the fix."""


def check_size(name: str, agents: int, channels: int = 0, *, exact: bool = True) -> None:
    """Raise :class:`TopologyError` when ``agents`` or ``channels`` exceed the limits
    (``exact=False``: ``agents`` is a lower bound)."""
    if agents > MAX_AGENTS:
        raise TopologyError(
            f"topology {name!r} has {'' if exact else 'over '}{agents:,} agents, above the limit "
            f"of {MAX_AGENTS} (topologies.MAX_AGENTS): use fewer agents or fan-out instances"
        )
    if channels > MAX_CHANNELS:
        raise TopologyError(
            f"topology {name!r} has {channels:,} channels, above the limit of {MAX_CHANNELS:,} "
            "(topologies.MAX_CHANNELS): use fewer agents"
        )


class Topology:
    """A team's communication structure: agent nodes and typed channels.

    Node attributes: ``kind`` (``agent`` | ``node`` | ``start`` | ``end``), ``role``, ``pool``,
    ``trainable``, ``max_instances`` and ``subgraph``. Edge attributes: ``kind`` (``static`` |
    ``conditional`` | ``send`` | ``join`` | ``command``) and ``label``.

    Example:
        >>> t = Topology.from_spec("star:3")
        >>> t.agent_ids
        ['orchestrator', 'worker_0', 'worker_1', 'worker_2']
        >>> t.critical_path_length()
        3
    """

    def __init__(self, graph: nx.DiGraph, name: str = "graph", spec: str | None = None) -> None:
        self.graph = graph
        self.name = name
        #: the spec string this topology was generated from (``"star:3"``), if any.
        self.spec = spec

    # ----- construction --------------------------------------------------------------------
    @classmethod
    def empty(cls, name: str = "graph", spec: str | None = None) -> Topology:
        """A topology holding only START and END."""
        graph = nx.DiGraph()
        for node, kind in ((START, "start"), (END, "end")):
            graph.add_node(
                node, kind=kind, role=None, pool=None, trainable=False, max_instances=1,
                subgraph=None,
            )  # fmt: skip
        return cls(graph, name=name, spec=spec)

    def add_agent(
        self,
        node: str,
        role: str | None = "agent",
        *,
        pool: str | None = None,
        trainable: bool = True,
        max_instances: int = 1,
        kind: str = "agent",
        subgraph: str | None = None,
    ) -> None:
        """Add an agent (or, with ``kind="node"``, a plain node such as a tool or router).

        The pool defaults to the role for agents (parameter sharing by role); plain nodes have
        no pool and are never trainable.
        """
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

    def add_channel(
        self, src: str, dst: str, kind: str = "static", label: str | None = None
    ) -> None:
        """Add a channel ``src → dst`` of ``kind`` (see ``EDGE_KINDS``)."""
        self.graph.add_edge(src, dst, kind=kind, label=label)

    @classmethod
    def from_spec(cls, spec: str | Topology) -> Topology:
        """Build a named topology from a spec string such as ``"star:4"`` or ``"tree:2x3"``."""
        if isinstance(spec, Topology):
            return spec
        from topologies.generators import from_spec

        return from_spec(spec)

    @classmethod
    def from_langgraph(cls, graph: Any, name: str | None = None) -> Topology:
        """Import a LangGraph ``StateGraph`` builder or compiled graph (validated).

        See :func:`topologies.langgraph_import.from_langgraph` for what is captured.
        """
        from topologies.langgraph_import import from_langgraph

        return from_langgraph(graph, name=name)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Topology:
        """Rebuild a topology from :meth:`to_dict` output (validated)."""
        from topologies.io import from_dict

        return from_dict(data)

    @classmethod
    def from_yaml(cls, source: str | Path) -> Topology:
        """Rebuild a topology from YAML text or a ``.yaml`` file path (validated)."""
        from topologies.io import from_yaml

        return from_yaml(source)

    def to_dict(self) -> dict[str, Any]:
        """A plain, YAML-safe dict; ``Topology.from_dict(t.to_dict())`` rebuilds ``t`` exactly."""
        from topologies.io import to_dict

        return to_dict(self)

    def to_yaml(self, path: str | Path | None = None) -> str:
        """The YAML text of :meth:`to_dict`; also written to ``path`` when given."""
        from topologies.io import to_yaml

        return to_yaml(self, path)

    def to_mermaid(self) -> str:
        """Deterministic mermaid ``flowchart`` text (see :func:`topologies.io.to_mermaid`)."""
        from topologies.io import to_mermaid

        return to_mermaid(self)

    def draw(self, path: str | Path, **kwargs: Any) -> Path:
        """Draw to a PNG file (see :func:`topologies.draw.draw`); returns the path."""
        from topologies.draw import draw

        return draw(self, path, **kwargs)

    def validate(self) -> Topology:
        """Check the topology can run; raise :class:`TopologyError` naming the node and the fix.

        Returns:
            ``self``, so calls chain.
        """
        from topologies.validate import validate

        validate(self)
        return self

    def to_langgraph(self, node_fn: Any, state_schema: type | None = None) -> Any:
        """A runnable LangGraph ``StateGraph`` skeleton.

        See :func:`topologies.generators.to_langgraph`.
        """
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

    def instances(self, node: str) -> list[str]:
        """The agent ids of ``node``: ``[node]``, or ``<node>_<i>`` for a fan-out node."""
        k = self.graph.nodes[node]["max_instances"]
        return [node] if k == 1 else [f"{node}_{i}" for i in range(k)]

    @property
    def agent_ids(self) -> list[str]:
        """The fixed list of agent ids: fan-out targets expand to ``<node>_<i>``."""
        return [a for node in self.agents for a in self.instances(node)]

    def node_of(self, agent_id: str) -> str:
        """The node an agent id belongs to (``worker_3`` → ``worker`` for a fan-out node)."""
        if agent_id in self.graph and self.graph.nodes[agent_id]["kind"] == "agent":
            return agent_id
        base, _, idx = agent_id.rpartition("_")
        if (
            base in self.graph
            and self.graph.nodes[base]["kind"] == "agent"
            and idx.isdigit()
            and int(idx) < self.graph.nodes[base]["max_instances"]
        ):
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
    def pool_ids(self) -> list[str]:
        """Distinct pool ids in order of first use (one RLlib module per pool)."""
        return list(dict.fromkeys(self.pools.values()))

    def agents_in_pool(self, pool: str) -> list[str]:
        """Agent ids mapped to ``pool``."""
        return [a for a, p in self.pools.items() if p == pool]

    @property
    def trainable(self) -> list[str]:
        """Agent ids whose policies learn (``policies_to_train`` comes from their pools)."""
        return [a for a in self.agent_ids if self.graph.nodes[self.node_of(a)]["trainable"]]

    @property
    def frozen(self) -> list[str]:
        """Agent ids whose policies stay fixed."""
        return [a for a in self.agent_ids if not self.graph.nodes[self.node_of(a)]["trainable"]]

    @property
    def orchestrators(self) -> list[str]:
        """Agent nodes with role ``orchestrator``."""
        return self.agents_with_role("orchestrator")

    @property
    def workers(self) -> list[str]:
        """Agent nodes with role ``worker``."""
        return self.agents_with_role("worker")

    def agents_with_role(self, role: str) -> list[str]:
        """Agent nodes with ``role``."""
        return [a for a in self.agents if self.graph.nodes[a]["role"] == role]

    def attr(self, node: str, key: str) -> Any:
        """A node attribute."""
        return self.graph.nodes[node][key]

    def parents(self, node: str) -> list[str]:
        """Nodes with a channel into ``node`` (START excluded)."""
        return [p for p in self.graph.predecessors(node) if p != START]

    def children(self, node: str) -> list[str]:
        """Nodes ``node`` has a channel to (END excluded)."""
        return [c for c in self.graph.successors(node) if c != END]

    def subagents(self, node: str) -> list[str]:
        """Agent nodes ``node`` delegates to: its children that are agents, looking through
        plain nodes (a tool or router between an orchestrator and its workers)."""
        seen, out, stack = {node}, [], list(reversed(self.children(node)))
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            if self.graph.nodes[c]["kind"] == "agent":
                out.append(c)
            else:
                stack.extend(reversed(self.children(c)))
        return out

    def edges(self, kind: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        """Channels as ``(src, dst, attrs)``, optionally only those of ``kind``."""
        return [(u, v, d) for u, v, d in self.graph.edges(data=True) if kind in (None, d["kind"])]

    def edge_counts(self) -> dict[str, int]:
        """Number of channels of each kind (every kind listed, zeros included)."""
        counts = Counter(d["kind"] for _, _, d in self.graph.edges(data=True))
        return {k: counts.get(k, 0) for k in EDGE_KINDS}

    def out_kinds(self, node: str) -> set[str]:
        """Kinds of the channels leaving ``node``."""
        return {d["kind"] for _, _, d in self.graph.out_edges(node, data=True)}

    def subgraph_ids(self) -> Iterable[str]:
        """Nodes that came from a LangGraph subgraph (``subgraph`` attribute set)."""
        return (n for n, d in self.graph.nodes(data=True) if d.get("subgraph"))

    def critical_path_length(self) -> int:
        """Supersteps on the longest run through one delegation round.

        See :func:`topologies.paths.critical_path` for the definition: ``single`` = 1,
        ``chain:N`` = N, ``star:N`` = 3 (orchestrator, the parallel workers, orchestrator
        again), ``tree:BxD`` = 2·D + 1, ``mesh:N`` = 2. Parallel branches cost one superstep
        however many run.
        """
        from topologies.paths import critical_path

        return sum(1 for n in critical_path(self) if n not in (START, END))

    def __len__(self) -> int:
        return len(self.agent_ids)

    def __repr__(self) -> str:
        label = self.spec or self.name
        edges = self.graph.number_of_edges()
        return f"Topology({label!r}, agents={len(self.agent_ids)}, edges={edges})"
