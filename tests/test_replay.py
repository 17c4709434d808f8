"""Fast replays (scenarios.replay.FastGraph) against LangGraph runs of the same graphs."""

from __future__ import annotations

import itertools
import operator
import warnings
from typing import Annotated, Any, TypedDict

import numpy as np
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy, Send
from toys import ToyStar, handoff_graph, join_graph, map_reduce_graph, obs, user_scenario

from scenarios import build, decide, emit_reward
from scenarios.bridge import GraphRun
from scenarios.counterfactual import Counterfactual
from scenarios.graph_env import GraphEnv
from scenarios.replay import DecisionLimit, RecursionLimit, Unsupported, compile_fast


def policy(n_actions: int, salt: int) -> Any:
    """A deterministic policy of (agent, its decision count): the same in every run."""
    counts: dict[str, int] = {}
    log: list[tuple[str, Any]] = []

    def act(agent: str, observation: Any) -> int:
        k = counts[agent] = counts.get(agent, 0) + 1
        log.append((agent, np.asarray(observation).tolist()))
        return (hash((agent, k, salt)) & 0xFFFF) % n_actions

    act.log = log  # type: ignore[attr-defined]
    return act


def langgraph_run(builder: StateGraph, inputs: dict, agents: dict, act: Any) -> Any:
    run = GraphRun(builder.compile(), inputs, agents, {"recursion_limit": 50})
    pending = run.start()
    while not run.finished:
        pending = run.resume({a: act(a, r.observation) for a, r in pending.items()})
    return run


class FreshState(TypedDict, total=False):
    x: int
    log: Annotated[list, operator.add]


def fresh_read_graph() -> StateGraph:
    """A router that reads its node's own (reduced) writes and an extra output key."""

    def node(state: FreshState) -> dict[str, Any]:
        a = int(decide("agent", obs(state.get("x", 0))))
        return {"x": state.get("x", 0) + a, "log": [a], "hint": a}

    def route(state: dict) -> Any:
        if len(state["log"]) >= 4 or state["x"] > 6:
            return "done"
        return ["again", "side"] if state.get("hint") == 2 else "again"

    def side(state: FreshState) -> dict[str, Any]:
        emit_reward(0.5)
        return {"log": ["side"]}

    b = StateGraph(FreshState)
    b.add_node("agent", node)
    b.add_node("side", side, metadata={"agent": False})
    b.add_edge(START, "agent")
    b.add_conditional_edges("agent", route, {"again": "agent", "side": "side", "done": END})
    b.add_edge("side", END)
    return b


GRAPHS = {
    "star": (lambda: ToyStar("star:3").build_graph(), {"task": 3, "rounds": 0}, 3),
    "send": (map_reduce_graph, {"results": []}, 4),
    "join": (join_graph, {"results": []}, 3),
    "command": (handoff_graph, {"results": []}, 2),
    "fresh": (fresh_read_graph, {"x": 0}, 3),
}


def agents_of(builder: StateGraph) -> dict[str, int]:
    from topologies import Topology

    topo = Topology.from_langgraph(builder)
    return {n: topo.attr(n, "max_instances") for n in topo.agents}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_fast_run_equals_langgraph_run(name):
    make, inputs, n_actions = GRAPHS[name]
    agents = agents_of(make())
    fast = compile_fast(make(), agents)
    assert fast is not None
    for salt in range(12):
        slow_act, fast_act = policy(n_actions, salt), policy(n_actions, salt)
        run = langgraph_run(make(), dict(inputs), agents, slow_act)
        assert run.error is None
        state, team = fast.run(
            dict(inputs), fast_act, skip_agents=False, max_decisions=50, recursion_limit=50
        )
        # same decisions in the same order, same observations, same final state (list order
        # of parallel reducer writes included), same emitted reward
        assert fast_act.log == slow_act.log
        assert state == run.result
        assert team == run.team_reward


def test_instances_of_a_send_fanout_are_named_as_the_env_names_them():
    agents = agents_of(map_reduce_graph())
    fast = compile_fast(map_reduce_graph(), agents)
    asked = []
    fast.run(
        {"results": []},
        lambda a, o: asked.append(a) or 3,
        skip_agents=False,
        max_decisions=9,
        recursion_limit=25,
    )
    assert asked == ["planner", "worker_0", "worker_1", "worker_2"]


def test_limits_match_the_environment():
    make, inputs, _ = GRAPHS["command"]
    agents = agents_of(make())
    fast = compile_fast(make(), agents)
    with pytest.raises(DecisionLimit):  # alice/bob keep handing off: 5 decisions needed
        fast.run(
            dict(inputs), lambda a, o: 1, skip_agents=False, max_decisions=3, recursion_limit=50
        )
    with pytest.raises(RecursionLimit):
        fast.run(
            dict(inputs), lambda a, o: 1, skip_agents=False, max_decisions=50, recursion_limit=3
        )


def test_graphs_the_fast_path_does_not_run_are_refused():
    def with_config(state: FreshState, config: RunnableConfig) -> dict[str, Any]:
        return {"x": 1}

    def plain(state: FreshState) -> dict[str, Any]:
        return {"x": 1}

    for add in (
        lambda b: b.add_node("n", with_config),
        lambda b: b.add_node("n", plain, retry_policy=RetryPolicy()),
        lambda b: b.add_node("n", plain, defer=True),
    ):
        b = StateGraph(FreshState)
        add(b)
        b.add_edge(START, "n")
        assert compile_fast(b, {"n": 1}) is None


@pytest.mark.parametrize(("scenario", "topology"), [("delegate", "star:5"), ("relay", "star:4")])
def test_env_values_are_bit_identical_to_langgraph_replays(scenario, topology):
    fast_env = GraphEnv(build(scenario, topology=topology))
    slow_env = GraphEnv(build(scenario, topology=topology), fast_replay=False)
    assert fast_env.fast_graph() is not None
    for seed in range(3):
        for env in (fast_env, slow_env):
            obs_, _ = env.reset(seed=seed)
            for a in env.possible_agents:
                env.action_space(a).seed(seed)
            while env.agents:
                env.step({a: env.action_space(a).sample() for a in env.agents})
        actions = fast_env.episode_actions()
        assert actions.keys() == slow_env.episode_actions().keys()
        players = sorted(actions)
        for r in range(len(players) + 1):
            for coalition in itertools.combinations(players, r):
                assert fast_env.value(seed, coalition, actions) == slow_env.value(
                    seed, coalition, actions
                )
    assert fast_env._fast is not None  # no check failed


def test_a_node_error_falls_back_to_a_langgraph_replay():
    env = GraphEnv(ToyStar("star:2", fail_on=2))
    slow = GraphEnv(ToyStar("star:2", fail_on=2), fast_replay=False)
    env._fast_checks = slow._fast_checks = 0
    for coalition in (["orchestrator"], ["orchestrator", "worker_0"]):
        acts = {"orchestrator": [1, 1], "worker_0": [2], "worker_1": [0]}
        assert env.value(0, coalition, acts) == slow.value(0, coalition, acts)
    with pytest.raises(Unsupported):  # what the fallback caught
        env._fast_replay(
            env.fast_graph(),
            0,
            Counterfactual(env.scenario, {"worker_0": [2]}, "default").coalition(["worker_0"]),
            "default",
        )


def test_a_graph_that_differs_from_its_fast_replay_is_caught():
    calls = itertools.count()

    def agent(state: FreshState) -> dict[str, Any]:  # not a function of the state: a counter
        return {"x": int(decide("agent", obs(next(calls) % 7))), "log": [1]}

    b = StateGraph(FreshState)
    b.add_node("agent", agent)
    b.add_edge(START, "agent")
    b.add_edge("agent", END)
    env = GraphEnv(user_scenario(b))
    env.reset(seed=0)
    env.step({"agent": 1})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env.value(0, ["agent"], env.episode_actions())
    assert any("differ from LangGraph replays" in str(w.message) for w in caught)
    assert env.fast_graph() is None


class SendState(TypedDict, total=False):
    out: Annotated[list, operator.add]


def test_send_from_start_feeds_each_instance_its_packet():
    def fan(state: SendState) -> list[Send]:
        return [Send("w", {"out": [i]}) for i in range(3)]

    def w(state: SendState) -> dict[str, Any]:
        return {"out": [state["out"][0] * 10 + int(decide("w", obs(state["out"][0])))]}

    b = StateGraph(SendState)
    b.add_node("w", w, metadata={"max_instances": 3})
    b.add_conditional_edges(START, fan, ["w"])
    b.add_edge("w", END)
    fast = compile_fast(b, {"w": 3})
    state, _ = fast.run(
        {}, lambda a, o: int(a[-1]), skip_agents=False, max_decisions=5, recursion_limit=25
    )
    assert state == {"out": [0, 11, 22]}
