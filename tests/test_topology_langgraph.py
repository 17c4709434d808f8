"""Topology.from_langgraph on real LangGraph graphs of each pattern, and the skeleton back."""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send

from topologies import Topology, TopologyError
from topologies.generators import GENERATORS

SPECS = ["single", "chain:1", "chain:3", "star:1", "star:3", "tree:2x1", "tree:2x2", "mesh:3"]


class State(TypedDict, total=False):
    topics: list[str]
    notes: Annotated[list[str], operator.add]
    next: str


def noop(state: State) -> dict[str, Any]:
    return {}


def edges(t: Topology) -> list[tuple[str, str, str, str | None]]:
    return sorted((u, v, d["kind"], d["label"]) for u, v, d in t.edges())


# ----- graphs of each pattern --------------------------------------------------------------
def supervisor() -> StateGraph:
    """Supervisor routing to workers through a path map; workers report back."""
    b = StateGraph(State)
    b.add_node("supervisor", noop, metadata={"role": "orchestrator"})
    b.add_node("research", noop, metadata={"role": "worker", "pool": "small"})
    b.add_node("math", noop, metadata={"role": "worker", "pool": "small", "trainable": False})
    b.add_edge(START, "supervisor")
    b.add_conditional_edges(
        "supervisor",
        lambda s: s.get("next", "done"),
        {"to_research": "research", "to_math": "math", "done": END},
    )
    b.add_edge("research", "supervisor")
    b.add_edge("math", "supervisor")
    return b


def fan_out(state: State) -> list[Send]:
    return [Send("worker", {"topics": [t]}) for t in state["topics"]]


def map_reduce() -> StateGraph:
    """Plan → ``Send`` to parallel workers → reduce."""
    b = StateGraph(State)
    b.add_node("plan", noop, metadata={"role": "orchestrator"})
    b.add_node("worker", noop, metadata={"role": "worker", "max_instances": 3})
    b.add_node("reduce", noop, metadata={"role": "aggregator"})
    b.add_edge(START, "plan")
    b.add_conditional_edges("plan", fan_out, ["worker"])
    b.add_edge("worker", "reduce")
    b.add_edge("reduce", END)
    return b


def handoff_alice(state: State) -> Command[Literal["bob", "__end__"]]:
    return Command(goto="bob")


def handoff_bob(state: State) -> Command[Literal["alice"]]:
    return Command(goto="alice")


def swarm() -> StateGraph:
    """Command handoffs: an annotated ``Command[Literal[...]]`` and ``destinations=``."""
    b = StateGraph(State)
    b.add_node("alice", handoff_alice)
    b.add_node("bob", handoff_bob)
    b.add_node("carol", noop, destinations={"alice": "handoff", END: "done"})
    b.add_edge(START, "alice")
    b.add_edge(START, "carol")
    return b


def joins() -> StateGraph:
    b = StateGraph(State)
    for n in ("left", "right", "merge"):
        b.add_node(n, noop)
    b.add_node("lookup", noop, metadata={"role": "tool"})
    b.add_edge(START, "left")
    b.add_edge(START, "right")
    b.add_edge("left", "lookup")
    b.add_edge("lookup", "left")
    b.add_edge(["left", "right"], "merge")
    b.add_edge("merge", END)
    return b


def team_subgraph() -> Any:
    inner = StateGraph(State)
    inner.add_node("draft", noop)
    inner.add_node("edit", noop, metadata={"role": "aggregator"})
    inner.add_edge(START, "draft")
    inner.add_edge("draft", "edit")
    return inner.compile()


def with_subgraph() -> StateGraph:
    """A compiled subgraph as a node, re-entered by a conditional review loop."""
    b = StateGraph(State)
    b.add_node("team", team_subgraph(), metadata={"role": "worker", "pool": "writers"})
    b.add_node("review", noop, metadata={"role": "orchestrator"})
    b.add_edge(START, "team")
    b.add_edge("team", "review")
    b.add_conditional_edges("review", lambda s: "ok", {"redo": "team", "ok": END})
    return b


# ----- import: patterns --------------------------------------------------------------------
def test_supervisor_conditional_path_map() -> None:
    t = Topology.from_langgraph(supervisor().compile())
    assert t.agents == ["supervisor", "research", "math"]
    assert edges(t) == [
        ("__start__", "supervisor", "static", None),
        ("math", "supervisor", "static", None),
        ("research", "supervisor", "static", None),
        ("supervisor", "__end__", "conditional", "done"),
        ("supervisor", "math", "conditional", "to_math"),
        ("supervisor", "research", "conditional", "to_research"),
    ]
    assert t.roles == {"supervisor": "orchestrator", "research": "worker", "math": "worker"}
    assert t.pools == {"supervisor": "orchestrator", "research": "small", "math": "small"}
    assert t.trainable == ["supervisor", "research"]
    assert t.frozen == ["math"]
    assert t.orchestrators == ["supervisor"]
    assert t.subagents("supervisor") == ["research", "math"]
    assert t.critical_path_length() == 3
    assert t.name == "LangGraph"  # a compiled graph's name


def test_map_reduce_send_fanout() -> None:
    t = Topology.from_langgraph(map_reduce())
    assert ("plan", "worker", "send", "worker") in edges(t)
    assert t.agent_ids == ["plan", "worker_0", "worker_1", "worker_2", "reduce"]
    assert t.node_of("worker_2") == "worker"
    assert t.roles["worker_1"] == "worker"
    assert t.critical_path_length() == 3  # plan, the parallel workers, reduce


def test_send_declared_with_metadata_fanout() -> None:
    def fan(state: State) -> list[Any]:  # no Send in the annotation
        return [Send("worker", {})]

    b = StateGraph(State)
    b.add_node("plan", noop, metadata={"fanout": ["worker"]})
    b.add_node("worker", noop)
    b.add_edge(START, "plan")
    b.add_conditional_edges("plan", fan, ["worker", END])
    t = Topology.from_langgraph(b)
    assert ("plan", "worker", "send", "worker") in edges(t)
    assert ("plan", "__end__", "conditional", "__end__") in edges(t)


def test_literal_router_is_visible() -> None:
    def route(state: State) -> Literal["a", "__end__"]:
        return "a"

    b = StateGraph(State)
    b.add_node("a", noop)
    b.add_edge(START, "a")
    b.add_conditional_edges("a", route)
    assert ("a", "a", "conditional", "a") in edges(Topology.from_langgraph(b))


def test_command_handoffs_literal_and_destinations() -> None:
    t = Topology.from_langgraph(swarm())
    assert edges(t) == [
        ("__start__", "alice", "static", None),
        ("__start__", "carol", "static", None),
        ("alice", "__end__", "command", None),
        ("alice", "bob", "command", None),
        ("bob", "alice", "command", None),
        ("carol", "__end__", "command", "done"),
        ("carol", "alice", "command", "handoff"),
    ]
    assert t.agents == ["alice", "bob", "carol"]


def test_joins_and_tool_node() -> None:
    t = Topology.from_langgraph(joins())
    assert ("left", "merge", "join", "left+right") in edges(t)
    assert ("right", "merge", "join", "left+right") in edges(t)
    assert t.agents == ["left", "right", "merge"]
    assert t.nodes == ["left", "right", "merge", "lookup"]
    assert t.attr("lookup", "kind") == "node"
    assert t.attr("lookup", "trainable") is False
    assert t.attr("lookup", "pool") is None
    assert "lookup" not in t.agent_ids


def test_subgraph_is_flattened_with_prefixed_ids() -> None:
    t = Topology.from_langgraph(with_subgraph())
    assert t.nodes == ["team/draft", "team/edit", "review"]
    assert edges(t) == [
        ("__start__", "team/draft", "static", None),
        ("review", "__end__", "conditional", "ok"),
        ("review", "team/draft", "conditional", "redo"),
        ("team/draft", "team/edit", "static", None),
        ("team/edit", "review", "static", None),
    ]
    assert list(t.subgraph_ids()) == ["team/draft", "team/edit"]
    assert t.attr("team/draft", "subgraph") == "team"
    # the parent's metadata is inherited; the inner node's own keys win
    assert t.roles == {"team/draft": "worker", "team/edit": "aggregator", "review": "orchestrator"}
    assert t.pools["team/edit"] == "writers"
    # one review round: draft, edit, review, draft again, edit, review
    assert t.critical_path_length() == 6


def test_nested_subgraph_and_opaque_subgraph() -> None:
    middle = StateGraph(State)
    middle.add_node("team", team_subgraph())
    middle.add_edge(START, "team")
    outer = StateGraph(State)
    outer.add_node("dept", middle.compile())
    outer.add_node("solo", team_subgraph(), metadata={"flatten": False})
    outer.add_edge(START, "dept")
    outer.add_edge("dept", "solo")
    t = Topology.from_langgraph(outer)
    assert t.nodes == ["dept/team/draft", "dept/team/edit", "solo"]
    assert t.attr("dept/team/edit", "subgraph") == "dept/team"
    assert ("dept/team/edit", "solo", "static", None) in edges(t)
    assert t.attr("solo", "subgraph") is None


def react_agent() -> Any:
    """LangGraph's prebuilt ReAct agent on a fake chat model (no network)."""
    prebuilt = pytest.importorskip("langgraph.prebuilt")
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    class FakeModel(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> FakeModel:
            return self

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    return prebuilt.create_react_agent(FakeModel(messages=iter([AIMessage("hi")])), [add])


def test_prebuilt_react_agent_subgraph() -> None:
    b = StateGraph(State)
    b.add_node("boss", noop, metadata={"role": "orchestrator"})
    b.add_node(
        "researcher",
        react_agent(),
        metadata={"role": "worker", "inner": {"tools": {"role": "tool"}}},
    )
    b.add_edge(START, "boss")
    b.add_conditional_edges("boss", lambda s: END, {"research": "researcher", "done": END})
    b.add_edge("researcher", "boss")
    t = Topology.from_langgraph(b)
    assert t.nodes == ["boss", "researcher/agent", "researcher/tools"]
    assert t.agents == ["boss", "researcher/agent"]  # the tools node is plain
    assert ("researcher/agent", "researcher/tools", "send", "tools") in edges(t)
    assert ("researcher/agent", "boss", "conditional", "__end__") in edges(t)
    assert ("researcher/tools", "researcher/agent", "static", None) in edges(t)
    assert ("boss", "researcher/agent", "conditional", "research") in edges(t)
    assert t.critical_path_length() == 5  # boss, agent, tools, agent, boss


def test_command_destinations_on_a_subgraph_node_leave_from_its_exits() -> None:
    b = StateGraph(State)
    b.add_node("team", team_subgraph(), destinations=("solo", END))
    b.add_node("solo", noop)
    b.add_edge(START, "team")
    t = Topology.from_langgraph(b)
    assert ("team/edit", "solo", "command", None) in edges(t)
    assert ("team/edit", "__end__", "command", None) in edges(t)


@pytest.mark.parametrize(
    ("inner", "match"),
    [
        ({"nope": {"agent": False}}, r"metadata 'inner' of node 'team' names \['nope'\]"),
        ({"draft": False}, r"node 'team' has metadata inner=\{'draft': False\}: map inner"),
    ],
)
def test_bad_inner_metadata(inner: dict[str, Any], match: str) -> None:
    b = StateGraph(State)
    b.add_node("team", team_subgraph(), metadata={"inner": inner})
    b.add_edge(START, "team")
    with pytest.raises(TopologyError, match=match):
        Topology.from_langgraph(b)


def test_subgraph_called_inside_a_function_node_is_flattened() -> None:
    sub = team_subgraph()

    def call(state: State) -> dict[str, Any]:
        return sub.invoke(state)

    b = StateGraph(State)
    b.add_node("wrapper", call)
    b.add_edge(START, "wrapper")
    assert Topology.from_langgraph(b).nodes == ["wrapper/draft", "wrapper/edit"]


def test_error_handler_nodes_are_skipped() -> None:
    b = StateGraph(State)
    b.add_node("a", noop, error_handler=noop)
    b.add_edge(START, "a")
    assert Topology.from_langgraph(b).nodes == ["a"]


def test_agent_false_metadata_and_subgraph_label() -> None:
    b = StateGraph(State)
    b.add_node("router", noop, metadata={"agent": False})
    b.add_node("a", noop, metadata={"subgraph": "crew"})
    b.add_node("helper", noop, metadata={"role": "tool", "agent": True})
    b.add_edge(START, "router")
    b.add_edge("router", "a")
    b.add_edge("a", "helper")
    t = Topology.from_langgraph(b, name="mine")
    assert t.name == "mine"
    assert t.agents == ["a", "helper"]
    assert t.attr("router", "kind") == "node"
    assert t.attr("a", "subgraph") == "crew"
    assert t.subagents("router") == ["a"]


def test_channel_collision_keeps_strongest_kind() -> None:
    b = StateGraph(State)
    b.add_node("a", noop, destinations=("b",))
    b.add_node("b", noop)
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_conditional_edges("a", lambda s: "b", {"x": "b", "y": END})

    def second(state: State) -> str:
        return "z"

    b.add_conditional_edges("a", second, {"z": "b"})
    t = Topology.from_langgraph(b)
    assert ("a", "b", "static", None) in edges(t)
    assert ("a", "__end__", "conditional", "y") in edges(t)


def test_conditional_labels_of_one_kind_are_merged() -> None:
    b = StateGraph(State)
    b.add_node("a", noop)
    b.add_node("b", noop)
    b.add_edge(START, "a")
    b.add_conditional_edges("a", lambda s: "b", {"retry": "b", "go": "b", "stop": END})
    assert ("a", "b", "conditional", "go,retry") in edges(Topology.from_langgraph(b))


def test_single_node_user_graph_matches_single() -> None:
    b = StateGraph(State)
    b.add_node("agent", noop)
    b.add_edge(START, "agent")
    b.add_edge("agent", END)
    t = Topology.from_langgraph(b)
    assert t.to_dict()["nodes"] == Topology.from_spec("single").to_dict()["nodes"]
    assert edges(t) == edges(Topology.from_spec("single"))
    # a lone node with no edge out ends the run, as get_graph() draws it
    b2 = StateGraph(State)
    b2.add_node("agent", noop)
    b2.add_edge(START, "agent")
    assert edges(Topology.from_langgraph(b2)) == edges(t)


# ----- import: errors ----------------------------------------------------------------------
def test_conditional_edge_without_path_map_is_rejected() -> None:
    def pick(state: State) -> str:
        return "a"

    b = supervisor()
    b.add_node("a", noop)
    b.add_conditional_edges("research", pick)
    with pytest.raises(TopologyError, match=r"node 'research'.*'pick' declares no targets.*"
                       r"add_conditional_edges\('research', pick, \['target'"):  # fmt: skip
        Topology.from_langgraph(b)


def test_send_router_without_path_map_is_rejected() -> None:
    b = StateGraph(State)
    b.add_node("plan", noop)
    b.add_node("worker", noop)
    b.add_edge(START, "plan")
    b.add_conditional_edges("plan", fan_out)
    with pytest.raises(TopologyError, match=r"node 'plan'.*Send router 'fan_out'.*path map"):
        Topology.from_langgraph(b.compile())


def test_router_from_start_without_path_map_is_rejected() -> None:
    b = StateGraph(State)
    b.add_node("a", noop)
    b.add_conditional_edges(START, lambda s: "a")
    with pytest.raises(TopologyError, match=r"node START: .*declares no targets"):
        Topology.from_langgraph(b)


def test_hidden_branch_inside_subgraph_names_prefixed_node() -> None:
    inner = StateGraph(State)
    inner.add_node("x", noop)
    inner.add_edge(START, "x")
    inner.add_conditional_edges("x", lambda s: END)
    b = StateGraph(State)
    b.add_node("team", inner.compile())
    b.add_edge(START, "team")
    with pytest.raises(TopologyError, match=r"node 'team/x'"):
        Topology.from_langgraph(b)


def test_command_without_destinations_is_rejected() -> None:
    def hand(state: State) -> Command:
        return Command(goto="b")

    b = StateGraph(State)
    b.add_node("a", hand)
    b.add_node("b", noop)
    b.add_edge(START, "a")
    with pytest.raises(TopologyError, match=r"node 'a' returns Command.*Command\[Literal"
                       r".*destinations=\('a', 'b'\)"):  # fmt: skip
        Topology.from_langgraph(b)
    # a Command used only to update state, with an edge onward, is fine
    b.add_edge("a", "b")
    assert Topology.from_langgraph(b).agents == ["a", "b"]


def test_no_agent_is_rejected() -> None:
    b = StateGraph(State)
    b.add_node("a", noop, metadata={"agent": False})
    b.add_edge(START, "a")
    with pytest.raises(TopologyError, match=r"has no agent node: mark at least one"):
        Topology.from_langgraph(b)


def test_unreachable_agent_is_rejected() -> None:
    b = supervisor()
    b.add_node("orphan", noop)
    with pytest.raises(TopologyError, match=r"agent 'orphan' is unreachable from START: add an"):
        Topology.from_langgraph(b)


def test_static_cycle_without_exit_is_rejected() -> None:
    b = StateGraph(State)
    b.add_node("a", noop)
    b.add_node("b", noop)
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "a")
    with pytest.raises(TopologyError, match=r"agent 'a' can never finish.*a → b → a.*edge to END"):
        Topology.from_langgraph(b)


@pytest.mark.parametrize(
    ("metadata", "match"),
    [
        ({"role": "boss"}, r"node 'a' has unknown role 'boss': use one of"),
        ({"trainable": "yes"}, r"node 'a' has trainable='yes': use True or False"),
        ({"max_instances": 0}, r"node 'a' has max_instances=0: use an integer ≥ 1"),
        ({"max_instances": True}, r"node 'a' has max_instances=True"),
        ({"max_instances": 2.0}, r"node 'a' has max_instances=2.0"),
        ({"pool": 3}, r"node 'a' has pool=3: use a non-empty string"),
        ({"agent": "no"}, r"node 'a' has metadata agent='no': use True or False"),
        ({"flatten": 1}, r"node 'a' has metadata flatten=1"),
        ({"fanout": "b"}, r"node 'a' has metadata fanout='b': use a list"),
        ({"fanout": ["b"]}, r"node 'a' lists \['b'\] in metadata 'fanout'.*path map"),
        ({"subgraph": 5}, r"node 'a' has metadata subgraph=5"),
    ],
)
def test_bad_metadata_is_rejected(metadata: dict[str, Any], match: str) -> None:
    b = StateGraph(State)
    b.add_node("a", noop, metadata=metadata)
    b.add_node("b", noop)
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    with pytest.raises(TopologyError, match=match):
        Topology.from_langgraph(b)


def test_fanout_collision_with_node_id_is_rejected() -> None:
    b = map_reduce()
    b.add_node("worker_1", noop)
    b.add_edge("reduce", "worker_1")
    with pytest.raises(TopologyError, match=r"agent id 'worker_1' is used twice.*rename"):
        Topology.from_langgraph(b)


def test_subgraph_id_clash_is_rejected() -> None:
    b = with_subgraph()
    b.add_node("team/draft", noop)
    b.add_edge("review", "team/draft")
    with pytest.raises(TopologyError, match=r"duplicate node id 'team/draft'"):
        Topology.from_langgraph(b)


def test_not_a_graph_is_rejected() -> None:
    with pytest.raises(TopologyError, match=r"pass a StateGraph builder or the graph returned"):
        Topology.from_langgraph(object())


# ----- the skeleton -----------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS)
def test_skeleton_compiles_and_get_graph_matches(spec: str) -> None:
    t = Topology.from_spec(spec)
    compiled = t.to_langgraph(lambda node: noop).compile()
    drawn = compiled.get_graph()
    assert set(drawn.nodes) == {"__start__", "__end__", *t.nodes}
    seen = {(e.source, e.target): e.conditional for e in drawn.edges}
    expected = {(u, v): d["kind"] not in ("static", "join") for u, v, d in t.edges()}
    assert seen == expected
    for e in drawn.edges:  # path-map keys that differ from the target are the labels
        if e.data is not None:
            assert t.graph.edges[e.source, e.target]["label"] == e.data


@pytest.mark.parametrize("spec", SPECS)
def test_skeleton_imports_back_to_the_same_topology(spec: str) -> None:
    t = Topology.from_spec(spec)
    back = Topology.from_langgraph(t.to_langgraph(lambda node: noop), name=t.name)
    assert back.to_dict()["nodes"] == t.to_dict()["nodes"]
    assert edges(back) == edges(t)


def test_star_skeleton_runs_a_round() -> None:
    t = Topology.from_spec("star:3")
    visits: list[str] = []

    def node_fn(node: str) -> Any:
        def run(state: dict[str, Any]) -> dict[str, Any]:
            visits.append(node)
            if node != "orchestrator":
                return {"messages": [{"from": node}]}
            first = not state.get("messages")
            return {"route": {node: t.children(node) if first else []}, "answer": not first}

        return run

    out = t.to_langgraph(node_fn).compile().invoke({"task": 1, "messages": []})
    assert out["answer"] is True
    assert visits[0] == visits[-1] == "orchestrator"
    assert sorted(visits[1:-1]) == ["worker_0", "worker_1", "worker_2"]


def test_imported_patterns_round_trip_through_the_skeleton() -> None:
    for make in (supervisor, map_reduce, swarm, joins, with_subgraph):
        t = Topology.from_langgraph(make())
        back = Topology.from_langgraph(t.to_langgraph(lambda node: noop))
        assert back.to_dict()["nodes"] == t.to_dict()["nodes"], make.__name__
        assert edges(back) == edges(t), make.__name__


def test_skeleton_runs_send_command_and_join() -> None:
    t = Topology.from_dict(
        {
            "nodes": [
                {"id": "plan", "role": "orchestrator"},
                {"id": "w", "role": "worker", "max_instances": 2},
                {"id": "a"},
                {"id": "b"},
                {"id": "c", "role": "aggregator"},
            ],
            "edges": [
                {"source": START, "target": "plan"},
                {"source": "plan", "target": "w", "kind": "send"},
                {"source": "w", "target": "a", "kind": "command", "label": "to_a"},
                {"source": "w", "target": "b", "kind": "command", "label": "to_b"},
                {"source": "a", "target": "c", "kind": "join", "label": "a+b"},
                {"source": "b", "target": "c", "kind": "join", "label": "a+b"},
                {"source": "c", "target": END},
            ],
        }
    )
    visits: list[str] = []

    def node_fn(node: str) -> Any:
        def run(state: dict[str, Any]) -> dict[str, Any]:
            visits.append(node)
            return {"route": {node: {"plan": ["w", "w"], "w": ["a", "b"]}.get(node, [])}}

        return run

    builder = t.to_langgraph(node_fn)
    builder.compile().invoke({"messages": []})
    assert visits == ["plan", "w", "w", "a", "b", "c"]
    assert edges(Topology.from_langgraph(builder)) == [
        (u, v, k, v if lb is None and k in ("send", "conditional") else lb)
        for u, v, k, lb in edges(t)
    ]


def test_generators_registry_covers_specs() -> None:
    assert {s.split(":")[0] for s in SPECS} == set(GENERATORS)


# ----- inferred roles, tool nodes --------------------------------------------------------------
def unlabelled_supervisor(**meta: dict[str, Any]) -> StateGraph:
    """A supervisor app without any metadata, as LangGraph's tutorials write one."""
    b = StateGraph(State)
    for name in ("supervisor", "research", "math"):
        b.add_node(name, noop, metadata=meta.get(name))
    b.add_edge(START, "supervisor")
    b.add_conditional_edges(
        "supervisor", lambda s: s["next"], {"research": "research", "math": "math", END: END}
    )
    b.add_edge("research", "supervisor")
    b.add_edge("math", "supervisor")
    return b


def test_entry_agent_that_routes_is_the_orchestrator_and_its_targets_workers() -> None:
    t = Topology.from_langgraph(unlabelled_supervisor())
    assert t.roles == {"supervisor": "orchestrator", "research": "worker", "math": "worker"}
    assert t.pool_ids == ["orchestrator", "worker"]  # no weight sharing across roles


def test_declared_roles_and_pools_win_over_inferred_ones() -> None:
    t = Topology.from_langgraph(
        unlabelled_supervisor(math={"role": "aggregator"}, research={"pool": "mine"})
    )
    assert t.roles == {"supervisor": "orchestrator", "research": "worker", "math": "aggregator"}
    assert t.pools["research"] == "mine"


def test_a_pipeline_infers_no_roles() -> None:
    b = StateGraph(State)
    b.add_node("a", noop).add_node("b", noop)
    b.add_edge(START, "a").add_edge("a", "b").add_edge("b", END)
    assert set(Topology.from_langgraph(b).roles.values()) == {"agent"}


def test_tool_nodes_are_not_agents_unless_marked() -> None:
    from langchain_core.tools import tool
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    def build(meta: dict[str, Any] | None) -> StateGraph:
        b = StateGraph(State)
        b.add_node("assistant", noop)
        b.add_node("tools", ToolNode([lookup]), metadata=meta)
        b.add_edge(START, "assistant")
        b.add_conditional_edges("assistant", tools_condition, {"tools": "tools", END: END})
        b.add_edge("tools", "assistant")
        return b

    t = Topology.from_langgraph(build(None))
    assert t.agent_ids == ["assistant"] and t.graph.nodes["tools"]["kind"] == "node"
    assert Topology.from_langgraph(build({"agent": True})).agent_ids == ["assistant", "tools"]
