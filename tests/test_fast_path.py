"""The stepped fast path (``GraphEnv(engine=...)``, :mod:`scenarios.stepped`): the same episodes
as the LangGraph path, bit for bit, on every built-in scenario and on fan-out, limit, error,
timeout and abort cases; the same training returns."""

from __future__ import annotations

import contextvars
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import failing_toys  # noqa: F401  (registers flaky-tool)
import numpy as np
import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from toys import handoff_graph, join_graph, map_reduce_graph, obs, user_scenario

from scenarios import GraphEnv, ScenarioError, decide, emit_reward
from scenarios.registry import build, list_scenarios
from scenarios.stepped import SteppedRun


def play(env: GraphEnv, seed: int, rng: np.random.Generator, resets: int = 0) -> list[Any]:
    """One episode with random actions drawn from ``rng``; every step's output."""
    for space in (env.action_space(a) for a in env.possible_agents):
        space.seed(int(rng.integers(2**31)))
    out: list[Any] = [env.reset(seed=seed)]
    while env.agents:
        if resets and len(out) == 3:  # abort an episode in the middle
            resets -= 1
            out.append(env.reset(seed=seed + 1))
            continue
        out.append(env.step({a: env.action_space(a).sample() for a in env.agents}))
    return out


def check_episodes(env: GraphEnv, episodes: int, seed: int = 0) -> GraphEnv:
    """Run ``episodes`` under ``engine="check"`` (it raises at the first difference)."""
    env.engine = "check"
    rng = np.random.default_rng(seed)
    for ep in range(episodes):
        play(env, seed * 1000 + ep, rng)
    return env


@pytest.mark.parametrize("name", [c.name for c in list_scenarios() if c.name != "flaky-tool"])
def test_every_builtin_scenario_runs_the_same_episodes_on_the_fast_path(name: str) -> None:
    env = check_episodes(GraphEnv(build(name)), 12)
    assert isinstance(env._run, SteppedRun) and not env._run.fell_back


@pytest.mark.parametrize("graph", [map_reduce_graph, join_graph, handoff_graph])
def test_send_fan_out_joins_and_commands_are_bit_identical(graph: Any) -> None:
    env = check_episodes(GraphEnv(user_scenario(graph())), 40)
    assert isinstance(env._run, SteppedRun) and not env._run.fell_back


def test_chat_app_episodes_run_on_the_fast_path_unless_a_node_names_its_agent() -> None:
    """``ChatAppScenario`` apps as the tutorials write them (its models name their agents):
    the same episodes on the fast path as through LangGraph, with no fallback to LangGraph; a
    node whose metadata names an agent (read off LangGraph's run metadata) runs on LangGraph."""
    pytest.importorskip("transformers")
    from marl_agents.llm.chat_app import ChatAppScenario
    from tests.apps import router, supervisor_tutorial

    for scenario in (router.app(), supervisor_tutorial.scenario()):
        env = GraphEnv(scenario, engine="check")  # replies that parse (random ids would not)
        for seed in range(4):
            env.reset(seed=seed)
            while env.agents:
                env.step({a: scenario.default_action(a) for a in env.agents})
            assert env.failure is None, env.error
            assert isinstance(env._run, SteppedRun) and not env._run.fell_back

    def build(models: Any) -> Any:
        def ask(state: dict[str, Any]) -> dict[str, Any]:
            return {"messages": [models["a"].invoke(state["messages"])]}

        graph = StateGraph(supervisor_tutorial.State)
        graph.add_node("ask", ask, metadata={"agent": "a"})
        graph.add_edge(START, "ask")
        graph.add_edge("ask", END)
        return graph

    app = ChatAppScenario(build, tasks=["hi"], verifier=bool, agents=["a"])
    env = check_episodes(GraphEnv(app), 2)
    assert env.stepped_graph() is None


def outcome(env: GraphEnv, engine: str, actions: list[dict[str, Any]]) -> Any:
    """The steps of one episode under ``engine`` (seed 0, given actions), or its error."""
    env.engine = engine
    try:
        steps: list[Any] = [env.reset(seed=0)]
        for a in actions:
            steps.append(env.step({x: a.get(x, 0) for x in env.agents}))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return steps, env.failure, env.error


def test_a_fan_out_beyond_max_instances_fails_as_langgraph_does() -> None:
    env = GraphEnv(user_scenario(map_reduce_graph(), n_actions=5))
    actions = [{"planner": 4}, dict.fromkeys(["worker_0", "worker_1", "worker_2"], 1)]
    fast = outcome(env, "fast", actions)
    assert isinstance(fast, str) and "max_instances=3" in fast
    assert fast == outcome(env, "langgraph", actions)


def test_step_limit_is_the_same() -> None:
    env = GraphEnv(user_scenario(handoff_graph()), max_steps=3)
    check_episodes(env, 20)
    env.reset(seed=0)
    for _ in range(3):
        env.step(dict.fromkeys(env.agents, 1))
    assert env.failure == "limit" and "step limit 3" in str(env.error)


class LoopState(TypedDict, total=False):
    n: int
    log: Annotated[list, operator.add]


def loop_graph() -> StateGraph:
    """an agent, then a tool loop that never ends on its own (the recursion limit ends it)."""

    def agent(state: LoopState) -> dict[str, Any]:
        emit_reward(0.5)
        return {"n": int(decide("agent", obs(state.get("n", 0)))), "log": [1]}

    def tool(state: LoopState) -> dict[str, Any]:
        emit_reward(0.25)
        return {"n": state["n"] + 1, "log": [2]}

    b = StateGraph(LoopState)
    b.add_node("agent", agent)
    b.add_node("tool", tool, metadata={"agent": False})
    b.add_edge(START, "agent")
    b.add_edge("agent", "tool")
    b.add_conditional_edges("tool", lambda s: "tool" if s["n"] < 10**6 else END, ["tool", END])
    return b


def test_recursion_limit_ends_the_run_with_langgraphs_error_without_a_fallback() -> None:
    scenario = user_scenario(loop_graph())
    scenario.max_supersteps = 5
    env = check_episodes(GraphEnv(scenario), 5)
    assert not env._run.fell_back and env.failure == "limit"
    assert "GraphRecursionError: Recursion limit of 6 reached" in str(env.error)


def failing_join_graph() -> StateGraph:
    """a and b decide in parallel; b raises after its decision when it chose 0."""

    def a(state: LoopState) -> dict[str, Any]:
        return {"log": [int(decide("a", obs(1)))]}

    def b(state: LoopState) -> dict[str, Any]:
        x = int(decide("b", obs(2)))
        emit_reward(1.0, ["b"])
        if x == 0:
            raise ValueError("b chose 0")
        return {"log": [x]}

    g = StateGraph(LoopState)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge(START, "b")
    g.add_edge("a", END)
    g.add_edge("b", END)
    return g


def test_a_node_error_in_a_parallel_superstep_falls_back_to_the_same_episode() -> None:
    env = GraphEnv(user_scenario(failing_join_graph()))
    check_episodes(env, 30)
    env.engine = "fast"
    env.reset(seed=0)
    _, rewards, _, truncs, infos = env.step({"a": 1, "b": 0})
    assert env._run.fell_back and truncs == {"a": True, "b": True}
    assert infos["b"]["failure"] == "error"
    assert infos["b"]["error"] == "node 'b' raised ValueError: b chose 0"
    assert rewards["b"] == 1.0


def test_node_errors_and_unrunnable_graphs_report_the_same() -> None:
    check_episodes(GraphEnv(build("flaky-tool", fail="sometimes")), 20)
    env = GraphEnv(build("flaky-tool", fail="always", where="first"))
    texts = {e: outcome(env, e, []) for e in ("fast", "langgraph")}
    assert texts["fast"] == texts["langgraph"]
    assert "node 'setup' raised RuntimeError: tool broke" in texts["fast"]


def test_timeouts_report_the_same_node() -> None:
    results = {}
    for engine in ("fast", "langgraph"):
        env = GraphEnv(build("flaky-tool", fail="always", mode="hang"), episode_timeout_s=0.2)
        env.engine = engine
        env.reset(seed=0)
        env.step({"planner": 1})
        results[engine] = (env.failure, env.error, env.outcome)
    assert results["fast"] == results["langgraph"]
    assert results["fast"][0] == "timeout" and "in node 'tool'" in results["fast"][1]


LEAK: contextvars.ContextVar[str | None] = contextvars.ContextVar("marl_test_leak", default=None)


def context_graph() -> StateGraph:
    """a and b decide in parallel, each after reading and setting a context variable."""

    def node(name: str) -> Any:
        def fn(state: LoopState) -> dict[str, Any]:
            seen = LEAK.get()
            LEAK.set(name)
            return {"log": [int(decide(name, obs(1))) + (10 if seen is None else 100)]}

        return fn

    g = StateGraph(LoopState)
    for name in ("a", "b"):
        g.add_node(name, node(name))
        g.add_edge(START, name)
        g.add_edge(name, END)
    return g


def test_every_task_starts_in_a_fresh_context() -> None:
    """Task greenlets are reused across supersteps and episodes, yet no task sees a context
    variable another task set, as with a fresh greenlet (and as under LangGraph)."""
    env = check_episodes(GraphEnv(user_scenario(context_graph())), 8)
    assert not env._run.fell_back
    env.engine = "fast"
    for seed in range(4):
        env.reset(seed=seed)
        while env.agents:
            env.step(dict.fromkeys(env.agents, 1))
        assert env.final_state is not None and env.final_state["log"] == [11, 11]


def test_resets_in_the_middle_of_episodes_abort_both_runs() -> None:
    env = GraphEnv(build("delegate"), engine="check")
    rng = np.random.default_rng(1)
    for ep in range(5):
        play(env, ep, rng, resets=1)
    env.reset(seed=9)
    env.close()
    assert env._run.finished or env._run.pending  # closed without an error


def test_engine_choice_is_checked() -> None:
    with pytest.raises(ScenarioError, match="engine must be one of"):
        GraphEnv(build("delegate"), engine="turbo")

    class AsyncState(TypedDict, total=False):
        x: int

    async def node(state: AsyncState) -> dict[str, Any]:
        return {"x": int(decide("node", obs(0)))}

    g = StateGraph(AsyncState)
    g.add_node("node", node)
    g.add_edge(START, "node")
    env = GraphEnv(user_scenario(g), engine="fast")
    with pytest.raises(ScenarioError, match="does not compile for the fast path"):
        env.reset(seed=0)
    env.engine = "auto"  # falls back to LangGraph for the whole episode
    env.reset(seed=0)
    assert not isinstance(env._run, SteppedRun)
    env.step({"node": 1})
    assert not env.agents or env.finished


def test_engine_reaches_the_env_from_the_config() -> None:
    from scenarios.rllib_env import RLlibGraphEnv

    env = RLlibGraphEnv({"scenario": "delegate", "engine": "langgraph"}).env
    env.reset(seed=0)
    assert env.engine == "langgraph" and not isinstance(env._run, SteppedRun)


def test_evaluation_envs_use_the_runs_engine_and_episode_limit() -> None:
    from trainers.configs.experiment import ExperimentConfig
    from trainers.plan import resolve

    cfg = ExperimentConfig(scenario="delegate", episodes={"engine": "langgraph", "timeout_s": 7})
    env = resolve(cfg, ray_workers=False).env.make_env()  # what evaluate() builds
    assert (env.engine, env.episode_timeout_s) == ("langgraph", 7)


@pytest.mark.usefixtures("ray_session")
def test_training_returns_are_bit_identical_on_both_engines(tmp_path: Path) -> None:
    from configs import learning_rows, tiny_config

    from trainers.run.loop import train

    rows = {}
    for engine in ("fast", "langgraph"):
        cfg = tiny_config(tmp_path / engine, episodes={"engine": engine})
        cfg.budget.iterations = 3
        rows[engine] = learning_rows(train(cfg).run_dir)
    assert rows["fast"] == rows["langgraph"]
    assert len(rows["fast"]) == 3 and "charts/team_return" in rows["fast"][0]


def test_episodes_engine_is_checked_in_the_config() -> None:
    from trainers.configs.experiment import EpisodesConfig
    from trainers.configs.typed import ConfigError

    EpisodesConfig(engine="check").check()
    with pytest.raises(ConfigError, match=r"episodes\.engine must be one of auto, langgraph"):
        EpisodesConfig(engine="turbo").check()


def test_a_node_that_catches_exceptions_cannot_swallow_a_fallback() -> None:
    def planner(state: LoopState) -> dict[str, Any]:
        return {"n": int(decide("planner", obs(0)))}

    def worker(state: LoopState) -> dict[str, Any]:
        try:
            return {"log": [int(decide("worker", obs(state["n"])))]}
        except Exception:  # swallows what it can
            return {"log": [-1]}

    b = StateGraph(LoopState)
    b.add_node("planner", planner)
    b.add_node("worker", worker, metadata={"max_instances": 2})
    b.add_edge(START, "planner")
    b.add_conditional_edges(
        "planner", lambda s: [Send("worker", {"n": i}) for i in range(s["n"])], ["worker"]
    )
    b.add_edge("worker", END)
    env = GraphEnv(user_scenario(b, n_actions=4))
    actions = [{"planner": 3}, dict.fromkeys(["worker_0", "worker_1"], 1)]
    fast = outcome(env, "fast", actions)
    assert isinstance(fast, str) and "max_instances=2" in fast
    assert fast == outcome(env, "langgraph", actions)
