"""Episodes cut off by the step limit: counted as truncated always, scored by the verifier on the
state they reached only when the scenario asks (``ChatAppScenario(score_limit=True)``), the
same in live episodes and in counterfactual replays."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scenarios.graph_env import GraphEnv
from tests.apps import supervisor_tutorial


def _reply(scenario: Any, text: str) -> np.ndarray:
    tok = scenario.tokenizer
    ids = [*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    return scenario.spaces.encode_action(ids[: scenario.spaces.max_new_tokens])


def _route(scenario: Any, goto: str) -> np.ndarray:
    call = f'<tool>{{"name": "Router", "arguments": {{"next": "{goto}"}}}}</tool>'
    return _reply(scenario, call)


def _play(env: GraphEnv, seed: int, goto: str) -> Any:
    """One episode whose supervisor always routes to ``goto`` (it never says FINISH)."""
    env.reset(seed=seed)
    scenario = env.scenario
    while env.agents:
        acts = {
            a: _route(scenario, goto) if a == "supervisor" else _reply(scenario, "Done.")
            for a in env.agents
        }
        env.step(acts)
    return env


def _first_task_seed(scenario: Any) -> int:
    """A seed whose task names the researcher (the tutorial's first task)."""
    for seed in range(64):
        state = scenario.initial_state(np.random.default_rng(seed))
        if str(state["messages"][0].content) == supervisor_tutorial.TASKS[0]:
            return seed
    raise AssertionError("no seed draws the researcher's task")


@pytest.mark.parametrize("engine", ["langgraph", "auto"])
@pytest.mark.parametrize("score_limit", [False, True])
def test_a_looping_supervisor_is_cut_off_counted_and_scored_as_asked(
    score_limit: bool, engine: str
) -> None:
    scenario = supervisor_tutorial.scenario(max_supersteps=5, score_limit=score_limit)
    env = GraphEnv(scenario, engine=engine)
    seed = _first_task_seed(scenario)
    _play(env, seed, "researcher")
    assert env.truncated and env.failure == "limit"
    # the first route was right: the verifier pays it only when asked to score cut-offs
    assert env.outcome.reward == (1.0 if score_limit else 0.0)
    assert env.outcome.success is score_limit
    _play(env, seed, "coder")  # wrong first route: nothing either way
    assert env.failure == "limit" and env.outcome.reward == 0.0


@pytest.mark.parametrize("max_supersteps", [5, 6])  # the decision cap, or LangGraph's limit
def test_replays_score_cut_off_episodes_as_the_live_episode(max_supersteps: int) -> None:
    """loo/Shapley replays (fast and LangGraph) of a cut-off episode reach the outcome the
    episode reached."""
    from scenarios.testing import check_fast_replay

    scenario = supervisor_tutorial.scenario(max_supersteps=max_supersteps, score_limit=True)
    env = GraphEnv(scenario)
    seed = _first_task_seed(scenario)
    _play(env, seed, "researcher")
    live = env.outcome.reward
    replayed = env.value(env.seed_used, env.possible_agents, env.episode_actions())
    assert live == 1.0 and replayed == live
    check_fast_replay(env, seed)


def test_a_verifier_that_cannot_read_a_partial_state_is_named() -> None:
    from scenarios.base import ScenarioError

    def strict(state: dict[str, Any]) -> bool:
        return state["answer"] == 42  # only a finished episode has it

    scenario = supervisor_tutorial.scenario(max_supersteps=5, score_limit=True, verifier=strict)
    env = GraphEnv(scenario)
    with pytest.raises(ScenarioError, match="score_limit=False"):
        _play(env, 0, "researcher")


def test_the_whole_job_verifier_pays_finishing_over_looping() -> None:
    """The tutorial's ``whole_job`` verifier: a right first route then FINISH earns 1, the same
    route in an episode that never finishes 0.5 (scored at the cut-off), a wrong one 0."""
    scenario = supervisor_tutorial.scenario(whole_job=True, max_supersteps=5)
    env = GraphEnv(scenario)
    seed = _first_task_seed(scenario)
    _play(env, seed, "researcher")
    assert env.failure == "limit" and (env.outcome.reward, env.outcome.success) == (0.5, False)
    env.reset(seed=seed)
    while env.agents:  # the supervisor's first route is the researcher, its next FINISH
        routed = any(t.agent == "supervisor" for t in env.trace)
        goto = "FINISH" if routed else "researcher"
        env.step(
            {
                a: _route(scenario, goto) if a == "supervisor" else _reply(scenario, "ok")
                for a in env.agents
            }
        )
    assert env.failure is None and (env.outcome.reward, env.outcome.success) == (1.0, True)
    _play(env, seed, "coder")
    assert env.outcome.reward == 0.0
