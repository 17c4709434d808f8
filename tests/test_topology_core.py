"""The Topology IR: generators, views, validation, critical path."""

from __future__ import annotations

import doctest
import importlib
from typing import Any

import pytest

from topologies import END, MAX_AGENTS, MAX_CHANNELS, START, Topology, TopologyError, validate
from topologies.generators import spec_size
from topologies.paths import can_finish, critical_path, reachable

SPECS = ["single", "chain:1", "chain:4", "star:1", "star:4", "tree:2x1", "tree:2x3", "mesh:1",
         "mesh:4"]  # fmt: skip


def agent_dict(*nodes: str | dict[str, Any], edges: list[tuple[Any, ...]]) -> dict[str, Any]:
    """A hand-written topology dict: nodes by id (or full dicts), edges as tuples."""
    return {
        "name": "t",
        "nodes": [{"id": n} if isinstance(n, str) else n for n in nodes],
        "edges": [dict(zip(("source", "target", "kind", "label"), e, strict=False)) for e in edges],
    }


# ----- generators ------------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS)
def test_generators_validate(spec: str) -> None:
    t = Topology.from_spec(spec)
    validate(t)
    assert t.validate() is t
    assert t.spec == spec
    assert t.kind == spec.split(":")[0]
    assert set(t.agents) == set(t.nodes)
    assert reachable(t) >= set(t.nodes)
    assert can_finish(t) >= set(t.nodes)


def test_generated_names_and_roles() -> None:
    assert Topology.from_spec("star:2").agent_ids == ["orchestrator", "worker_0", "worker_1"]
    assert Topology.from_spec("chain:3").roles == {
        "agent_0": "worker", "agent_1": "worker", "agent_2": "aggregator",
    }  # fmt: skip
    assert Topology.from_spec("chain:1").roles == {"agent_0": "agent"}
    tree = Topology.from_spec("tree:2x2")
    assert tree.agent_ids == [
        "orchestrator", "lead_0", "worker_0_0", "worker_0_1", "lead_1", "worker_1_0",
        "worker_1_1",
    ]  # fmt: skip
    assert tree.orchestrators == ["orchestrator", "lead_0", "lead_1"]
    assert tree.children("lead_1") == ["orchestrator", "worker_1_0", "worker_1_1"]
    assert tree.parents("worker_1_0") == ["lead_1"]
    assert Topology.from_spec("mesh:3").agent_ids == ["agent_0", "agent_1", "agent_2"]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("ring:3", r"unknown topology spec 'ring:3': use one of single, chain:N"),
        ("star", r"bad topology spec 'star': write star:N with positive integers"),
        ("star:0", r"write star:N"),
        ("tree:2", r"write tree:BxD"),
        ("single:2", r"write single"),
        ("star:2x2", r"write star:N"),
    ],
)
def test_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        Topology.from_spec(spec)


def test_from_spec_passes_a_topology_through() -> None:
    t = Topology.from_spec("star:2")
    assert Topology.from_spec(t) is t


# ----- single is a one-node graph -----------------------------------------------------------
def test_single_is_a_one_node_graph() -> None:
    t = Topology.from_spec("single")
    assert t.nodes == t.agents == t.agent_ids == ["agent"]
    assert len(t) == 1
    assert t.roles == {"agent": "agent"} and t.pools == {"agent": "agent"}
    assert t.trainable == ["agent"] and t.frozen == []
    assert t.orchestrators == [] and t.parents("agent") == [] and t.children("agent") == []
    assert [(u, v) for u, v, _ in t.edges()] == [(START, "agent"), ("agent", END)]
    assert t.critical_path_length() == 1
    calls: list[str] = []
    graph = t.to_langgraph(lambda n: lambda s: calls.append(n) or {"answer": 42}).compile()
    assert graph.invoke({"task": 0})["answer"] == 42
    assert calls == ["agent"]


# ----- views -----------------------------------------------------------------------------
def test_views_for_a_trainer() -> None:
    t = Topology.from_dict(
        agent_dict(
            {"id": "boss", "role": "orchestrator", "pool": "big"},
            {"id": "w", "role": "worker", "max_instances": 3, "trainable": False},
            {"id": "search", "role": "tool", "kind": "node"},
            {"id": "sum", "role": "aggregator", "pool": "big"},
            edges=[
                (START, "boss"),
                ("boss", "search", "conditional", "look"),
                ("search", "w", "send"),
                ("w", "sum"),
                ("sum", "boss"),
                ("boss", END, "conditional", "answer"),
            ],
        )
    )
    assert t.agents == ["boss", "w", "sum"]
    assert t.nodes == ["boss", "w", "search", "sum"]
    assert t.instances("w") == ["w_0", "w_1", "w_2"]
    assert t.agent_ids == ["boss", "w_0", "w_1", "w_2", "sum"]
    assert t.node_of("w_2") == "w" and t.node_of("boss") == "boss"
    assert t.pools == {"boss": "big", "w_0": "worker", "w_1": "worker", "w_2": "worker",
                       "sum": "big"}  # fmt: skip
    assert t.pool_ids == ["big", "worker"]
    assert t.agents_in_pool("big") == ["boss", "sum"]
    assert t.trainable == ["boss", "sum"] and t.frozen == ["w_0", "w_1", "w_2"]
    assert t.workers == ["w"] and t.agents_with_role("aggregator") == ["sum"]
    assert t.subagents("boss") == ["w"]  # through the tool node
    assert t.edge_counts() == {"static": 3, "conditional": 2, "send": 1, "join": 0, "command": 0}
    assert t.out_kinds("boss") == {"conditional"}
    assert len(t) == 5
    assert repr(t) == "Topology('t', agents=5, edges=6)"
    with pytest.raises(TopologyError, match=r"unknown agent id 'w_3': known agents are"):
        t.node_of("w_3")
    with pytest.raises(TopologyError, match=r"unknown agent id 'search'"):
        t.node_of("search")


# ----- critical path ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "length"),
    [
        ("single", 1), ("chain:1", 1), ("chain:5", 5), ("star:1", 3), ("star:7", 3),
        ("tree:2x1", 3), ("tree:2x2", 5), ("tree:3x3", 7), ("mesh:1", 2), ("mesh:5", 2),
    ],
)  # fmt: skip
def test_critical_path_lengths(spec: str, length: int) -> None:
    assert Topology.from_spec(spec).critical_path_length() == length


def test_critical_path_of_star_is_one_delegation_round() -> None:
    path = critical_path(Topology.from_spec("star:4"))
    assert path == [START, "orchestrator", "worker_0", "orchestrator", END]


def test_critical_path_review_loop_goes_round_once() -> None:
    t = Topology.from_dict(
        agent_dict(
            "plan",
            "work",
            "review",
            "publish",
            edges=[
                (START, "plan"),
                ("plan", "work"),
                ("work", "review"),
                ("review", "work", "conditional", "redo"),
                ("review", "publish", "conditional", "ok"),
                ("publish", END),
            ],
        )
    )
    assert critical_path(t) == [START, "plan", "work", "review", "work", "review", "publish", END]
    assert t.critical_path_length() == 6


def test_critical_path_counts_parallel_branches_once() -> None:
    t = Topology.from_dict(
        agent_dict(
            "a",
            "b",
            "c",
            "d",
            edges=[
                (START, "a"),
                ("a", "b"),
                ("a", "c"),
                ("b", "d", "join", "b+c"),
                ("c", "d", "join", "b+c"),
                ("d", END),
            ],
        )
    )
    assert t.critical_path_length() == 3


def test_critical_path_of_command_handoffs_without_end() -> None:
    t = Topology.from_dict(
        agent_dict(
            "alice",
            "bob",
            edges=[(START, "alice"), ("alice", "bob", "command"), ("bob", "alice", "command")],
        )
    )
    assert t.critical_path_length() == 4  # falls back to nodes that may finish by routing


# ----- validation on the IR ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "match"),
    [
        (agent_dict({"id": "a", "kind": "node"}, edges=[(START, "a")]),
         r"topology 't' has no agent node: mark at least one node"),
        (agent_dict("a", "b", edges=[(START, "a"), ("a", END), ("b", END)]),
         r"agent 'b' is unreachable from START: add an edge to it"),
        (agent_dict("a", "b", "c", edges=[(START, "a"), ("a", "b"), ("b", "c"), ("c", "b")]),
         r"agent 'a' can never finish the run: static edges b → c → b form a cycle with no exit"),
        (agent_dict("a", "a", edges=[]), r"duplicate node id 'a': give every node a unique name"),
        (agent_dict({"id": "w", "max_instances": 2}, "w_1", edges=[(START, "w"), (START, "w_1")]),
         r"agent id 'w_1' is used twice \(by node 'w' and by node 'w_1'\): rename"),
        (agent_dict({"id": "w", "max_instances": 2}, {"id": "w_0", "kind": "node"},
                    edges=[(START, "w"), (START, "w_0")]),
         r"agent id 'w_0' of node 'w' clashes with node 'w_0'"),
        (agent_dict({"id": "a", "role": "ceo"}, edges=[(START, "a")]),
         r"node 'a' has unknown role 'ceo': use one of \['orchestrator'"),
        (agent_dict({"id": "a", "trainable": 1}, edges=[(START, "a")]),
         r"node 'a' has trainable=1: use True or False"),
        (agent_dict({"id": "a", "max_instances": -1}, edges=[(START, "a")]),
         r"node 'a' has max_instances=-1: use an integer ≥ 1"),
        (agent_dict({"id": "a", "pool": ""}, edges=[(START, "a")]),
         r"node 'a' has pool='': use a non-empty string"),
        (agent_dict({"id": "a", "kind": "start"}, edges=[(START, "a")]),
         r"node 'a' has kind 'start': use 'agent' or 'node'"),
        (agent_dict("a", edges=[(START, "a", "magic")]),
         r"channel '__start__' → 'a' has kind 'magic': use one of"),
        (agent_dict("a", edges=[(START, "a"), ("a", END, "send")]),
         r"Send cannot target END"),
        (agent_dict("a", edges=[(START, "a"), ("a", START)]),
         r"channel 'a' → '__start__' runs backwards"),
        (agent_dict("a", edges=[(START, "a", "static", 3)]),
         r"has label 3: use a string or None"),
        (agent_dict("a", edges=[(START, "b")]),
         r"edge '__start__' → 'b' names unknown node 'b': list it in nodes"),
        (agent_dict("a", edges=[(START, "a"), (START, "a")]),
         r"duplicate edge '__start__' → 'a'"),
        (agent_dict(START, edges=[]), r"node id '__start__' is reserved"),
        (agent_dict({"id": "a", "colour": "red"}, edges=[]),
         r"node 'a' has unknown fields \['colour'\]"),
        (agent_dict({"name": "a"}, edges=[]), r"needs a string 'id'"),
        ({"nodes": [], "edges": [], "version": 2}, r"format version 2: this code reads version 1"),
        ({"nodes": [], "agents": []}, r"unknown topology keys \['agents'\]"),
        ([], r"must be a mapping"),
    ],
)  # fmt: skip
def test_validation_errors(data: Any, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        Topology.from_dict(data)


def test_validate_catches_a_broken_graph_built_by_hand() -> None:
    t = Topology.empty("hand")
    t.add_agent("a")
    t.add_channel(START, "a")
    t.graph.remove_node(END)
    with pytest.raises(TopologyError, match=r"lacks its __end__ node: build it with"):
        t.validate()
    t2 = Topology.empty("hand")
    t2.add_agent("a")
    t2.add_channel(START, "a")
    del t2.graph.nodes["a"]["pool"]
    with pytest.raises(TopologyError, match=r"node 'a' lacks \['pool'\]"):
        t2.validate()


def test_add_agent_rejects_duplicates() -> None:
    t = Topology.from_spec("single")
    with pytest.raises(TopologyError, match=r"duplicate node id 'agent'"):
        t.add_agent("agent")


# ----- scale ----------------------------------------------------------------------------
def test_star_100_builds_validates_draws(tmp_path: Any) -> None:
    t = Topology.from_spec("star:100")
    assert len(t.agent_ids) == 101
    assert t.critical_path_length() == 3
    out = t.draw(tmp_path / "star100.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Topology.from_yaml(t.to_yaml()).to_dict() == t.to_dict()
    assert t.to_mermaid().count("-.->") == 101


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("star:1000000", r"'star:1000000' has 1,000,001 agents, above the limit of 256"),
        ("mesh:1000000", r"'mesh:1000000' has 1,000,000 agents, above the limit of 256"),
        ("chain:257", r"'chain:257' has 257 agents"),
        ("tree:1000x1000", r"'tree:1000x1000' has over 1,001 agents"),
        ("tree:2x" + "9" * 4000, r"has over 511 agents"),
        ("tree:2x8", r"'tree:2x8' has 511 agents"),
    ],
)
def test_huge_specs_fail_before_building(spec: str, match: str) -> None:
    with pytest.raises(TopologyError, match=match + r".*topologies.MAX_AGENTS.*use fewer"):
        Topology.from_spec(spec)


def test_size_limits_hold_for_every_way_in() -> None:
    from topologies import star

    with pytest.raises(TopologyError, match="above the limit"):
        star(10**9)  # the generator itself checks before building
    fanout = agent_dict(
        {"id": "boss"},
        {"id": "w", "max_instances": 10**9},
        edges=[(START, "boss"), ("boss", "w", "send"), ("w", END)],
    )
    with pytest.raises(TopologyError, match="has 1,000,000,001 agents, above the limit"):
        Topology.from_dict(fanout)  # counted before a billion agent ids are listed


@pytest.mark.parametrize(
    "spec", ["single", "chain:256", "star:255", "tree:2x7", "tree:3x4", "mesh:256"]
)
def test_largest_specs_build_with_the_counted_size(spec: str) -> None:
    t = Topology.from_spec(spec)
    kind, _, args = spec.partition(":")
    agents, channels = spec_size(kind, [int(a) for a in args.split("x")] if args else [])
    assert len(t.agent_ids) == agents <= MAX_AGENTS
    assert t.graph.number_of_edges() == channels <= MAX_CHANNELS


# ----- docstring examples ---------------------------------------------------------------
@pytest.mark.parametrize("module", ["topology", "io", "langgraph_import"])
def test_docstring_examples_run(module: str) -> None:
    mod = importlib.import_module(f"topologies.{module}")
    result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
