"""Tests of the ``toolchain`` scenario: checklist, final verification, tools, views, errors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from scenarios import ScenarioError
from scenarios.decisions import run_inline
from scenarios.graph_env import GraphEnv
from scenarios.registry import build, get
from scenarios.toolchain import ANSWER, CALC, CRITERIA, DONE, LOOKUP, Toolchain, ToolError

TOPOLOGIES = ["single", "chain:1", "chain:2", "chain:3", "chain:4"]
FULL = 0.1 * 3 + 1.0  # default weights: every criterion met and the answer correct


class Script:
    """Plays a fixed list of actions per agent (``done`` afterwards)."""

    def __init__(self, actions: dict[str, Sequence[Sequence[int]]]) -> None:
        self.actions = {a: list(seq) for a, seq in actions.items()}

    def __call__(self, agent: str, obs: np.ndarray) -> np.ndarray:
        queue = self.actions.get(agent, [])
        return np.array(queue.pop(0) if queue else [DONE, 0, 0, 0])


class Recorder:
    """Wraps a policy and records every (agent, observation)."""

    def __init__(self, policy: Callable[[str, Any], Any]) -> None:
        self.policy = policy
        self.seen: list[tuple[str, np.ndarray]] = []

    def __call__(self, agent: str, obs: np.ndarray) -> Any:
        self.seen.append((agent, np.array(obs)))
        return self.policy(agent, obs)


def task_of(tc: Toolchain, seed: int) -> dict[str, int]:
    return tc.initial_state(np.random.default_rng(seed))["task"]


def random_policy(tc: Toolchain, seed: int = 0) -> Callable[[str, Any], np.ndarray]:
    rng = np.random.default_rng(seed)
    return lambda agent, obs: rng.integers(tc.action_space(agent).nvec)


def outcomes(tc: Toolchain, policy: Callable[[str, Any], Any], seeds: range) -> list[Any]:
    graph = tc.build_graph().compile()
    return [run_inline(tc, policy, seed, graph=graph)[1] for seed in seeds]


@pytest.mark.parametrize("spec", TOPOLOGIES)
@pytest.mark.parametrize("kwargs", [{}, {"n_keys": 16, "n_ops": 1, "max_calls": 4}])
def test_optimal_policy_solves_with_full_checklist(spec: str, kwargs: dict[str, Any]) -> None:
    tc = Toolchain(spec, **kwargs)
    assert tc.oracle_value(np.random.default_rng(0)) == pytest.approx(FULL)
    for outcome in outcomes(tc, tc.optimal_policy(), range(20)):
        assert outcome.success and outcome.metrics["answer_correct"] == 1.0
        assert all(outcome.metrics[f"checklist/{c}"] == 1.0 for c in CRITERIA)
        assert outcome.metrics["calls"] == 4
        assert outcome.reward == pytest.approx(FULL)


def test_chain_splits_the_work() -> None:
    tc = Toolchain("chain:4")
    state, outcome, decisions = run_inline(tc, tc.optimal_policy(), 3)
    assert [c["agent"] for c in state["calls"]] == ["agent_0", "agent_1", "agent_3", "agent_3"]
    assert [c["tool"] for c in state["calls"]] == ["lookup", "lookup", "calc", "answer"]
    assert decisions == 4 + 3  # four calls and a "done" from agents 0, 1 and 2
    assert outcome.local == pytest.approx(
        {"agent_0": FULL, "agent_1": FULL, "agent_2": 1.0, "agent_3": FULL}
    )


@pytest.mark.parametrize("spec", ["single", "chain:3"])
def test_random_policy_scores_lower(spec: str) -> None:
    tc = Toolchain(spec)
    rewards = [o.reward for o in outcomes(tc, random_policy(tc), range(200))]
    assert np.mean(rewards) < 0.3 < FULL


@pytest.mark.parametrize("spec", TOPOLOGIES)
def test_deterministic_given_seed(spec: str) -> None:
    tc = Toolchain(spec)
    (s1, o1, d1), (s2, o2, d2) = (run_inline(tc, random_policy(tc, 5), 9) for _ in range(2))
    assert s1 == s2 and o1 == o2 and d1 == d2
    assert len({str(tc.initial_state(np.random.default_rng(s))) for s in range(10)}) == 10


def test_checklist_criteria_reported_and_weighted() -> None:
    weights = {"right_tool": 0.5, "valid_args": 0.25, "result_used": 2.0}
    tc = Toolchain("single", checklist_weights=weights, final_weight=3.0)
    t = task_of(tc, 2)
    script = Script(
        {
            "agent": [
                [CALC, t["op"], 0, 1],  # no results yet: wrong tool, invalid args, no result
                [LOOKUP, t["k1"], 0, 0],  # register 1
                [LOOKUP, t["k2"], 0, 0],  # register 2
                [LOOKUP, t["k1"], 0, 0],  # right tool is calc now; result never used
                [CALC, t["op"], 1, 2],  # register 4
                [ANSWER, 0, 4, 0],
            ]
        }
    )
    _, outcome, _ = run_inline(tc, script, 2)
    fractions = {"right_tool": 4 / 6, "valid_args": 5 / 6, "result_used": 4 / 6}
    for c, f in fractions.items():
        assert outcome.metrics[f"checklist/{c}"] == pytest.approx(f)
    assert outcome.metrics["answer_correct"] == 1.0 and outcome.metrics["calls"] == 6
    expected = sum(weights[c] * f for c, f in fractions.items()) + 3.0
    assert outcome.reward == pytest.approx(expected)


def test_missing_weights_keep_defaults() -> None:
    tc = Toolchain(checklist_weights={"valid_args": 0.7})
    assert tc.weights == {"right_tool": 0.1, "valid_args": 0.7, "result_used": 0.1}


@pytest.mark.parametrize("spec", ["single", "chain:3"])
def test_final_verification_always_counts(spec: str) -> None:
    """reward = Σ weight · checklist fraction + final_weight · answer_correct, every episode."""
    weights = {"right_tool": 2.0, "valid_args": 0.0, "result_used": 5.0}
    tc = Toolchain(spec, checklist_weights=weights, final_weight=0.5)
    for policy in (random_policy(tc, 1), tc.optimal_policy()):
        for o in outcomes(tc, policy, range(40)):
            checklist = sum(w * o.metrics[f"checklist/{c}"] for c, w in weights.items())
            assert o.reward == pytest.approx(checklist + 0.5 * o.metrics["answer_correct"])
    zero = Toolchain(spec, checklist_weights=dict.fromkeys(CRITERIA, 0.0), final_weight=2.0)
    assert [o.reward for o in outcomes(zero, zero.optimal_policy(), range(5))] == [2.0] * 5


def test_wrong_answer_gets_no_final_reward() -> None:
    tc = Toolchain("single")
    t = task_of(tc, 0)
    wrong = Script({"agent": [[LOOKUP, t["k1"], 0, 0], [ANSWER, 0, 0, 0]]})
    state, outcome, _ = run_inline(tc, wrong, 0)
    assert state["answer"] is not None and outcome.metrics["answer_correct"] == 0.0
    assert not outcome.success
    assert outcome.reward == pytest.approx(0.1 * (1 / 2 + 1 + 1))  # the answer was not due yet
    assert outcome.reward < tc.final_weight


def test_budget_ends_the_episode_without_answer() -> None:
    tc = Toolchain("single", max_calls=5)
    state, outcome, decisions = run_inline(tc, lambda a, o: np.array([LOOKUP, 0, 0, 0]), 0)
    assert decisions == 5 and len(state["calls"]) == 5 and state["answer"] is None
    assert outcome.metrics["answer_correct"] == 0.0 and outcome.metrics["calls"] == 5


@pytest.mark.parametrize("tool", ["lookup", "calc", "answer"])
def test_failing_tool_raises(tool: str) -> None:
    tc = Toolchain("chain:2", fail_tool=tool)
    with pytest.raises(ToolError, match=f"tool '{tool}' failed"):
        run_inline(tc, tc.optimal_policy(), 0)


@pytest.mark.parametrize("spec", ["single", "chain:2", "chain:3", "chain:5"])
def test_observations_in_space_and_private(spec: str) -> None:
    tc = Toolchain(spec)
    for seed in range(10):
        for policy in (tc.optimal_policy(), random_policy(tc, seed)):
            rec = Recorder(policy)
            state, _, _ = run_inline(tc, rec, seed)
            task = state["task"]
            for agent, obs in rec.seen:
                assert tc.observation_space(agent).contains(obs)
                fields, calls = tc.decode(obs)
                assert fields == {f: task[f] for f in tc.visible[agent]}
                assert len(calls) <= len(state["calls"])


def test_views_split_along_the_chain() -> None:
    assert Toolchain("single").visible == {"agent": {"k1", "k2", "op"}}
    assert Toolchain("chain:2").visible == {"agent_0": {"k1", "k2"}, "agent_1": {"op"}}
    assert Toolchain("chain:4").visible == {
        "agent_0": {"k1"},
        "agent_1": {"k2"},
        "agent_2": set(),
        "agent_3": {"op"},
    }


def test_observation_never_shows_tool_results() -> None:
    tc = Toolchain("single")
    state, _, _ = run_inline(tc, tc.optimal_policy(), 4)
    log = state["calls"][:3]
    altered = [{**c, "value": (c["value"] + 1) % 97} for c in log]
    obs = tc.observe("agent", state["task"], log)
    assert np.array_equal(obs, tc.observe("agent", state["task"], altered))
    fields, calls = tc.decode(obs)
    assert fields == state["task"]
    assert calls == [(LOOKUP, state["task"]["k1"], 0, 0, 1), (LOOKUP, state["task"]["k2"], 0, 0, 1),
                     (CALC, state["task"]["op"], 0, 1, 1)]  # fmt: skip


def test_default_action_and_invalid_action() -> None:
    tc = Toolchain("chain:2")
    assert tc.default_action("agent_0").tolist() == [DONE, 0, 0, 0]
    assert tc.action_space("agent_0").contains(tc.default_action("agent_0"))
    with pytest.raises(ValueError, match="agent_0"):
        run_inline(tc, lambda a, o: np.array([LOOKUP, 99, 0, 0]), 0)
    with pytest.raises(ValueError, match="agent_0"):
        run_inline(tc, lambda a, o: 1, 0)
    with pytest.raises(ScenarioError, match="unknown agent"):
        tc.observation_space("nobody")


def test_registry() -> None:
    assert get("toolchain") is Toolchain and get("toolchain-v0") is Toolchain
    tc = build("toolchain", topology="chain:3", n_keys=6)
    assert isinstance(tc, Toolchain) and tc.n_keys == 6
    assert build("toolchain").topology.spec == "single"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_keys": 1}, "n_keys"),
        ({"n_keys": 17}, "n_keys"),
        ({"n_ops": 0}, "n_ops"),
        ({"n_ops": 5}, "n_ops"),
        ({"max_calls": 3}, "max_calls"),
        ({"max_calls": 33}, "max_calls"),
        ({"max_calls": 8.0}, "max_calls"),
        ({"checklist_weights": [0.1]}, "checklist_weights"),
        ({"checklist_weights": {"speed": 1.0}}, "unknown criteria"),
        ({"checklist_weights": {"right_tool": -1}}, "right_tool"),
        ({"checklist_weights": {"valid_args": float("nan")}}, "valid_args"),
        ({"final_weight": 0}, "final_weight"),
        ({"final_weight": -1.0}, "final_weight"),
        ({"final_weight": float("inf")}, "final_weight"),
        ({"final_weight": "1"}, "final_weight"),
        ({"fail_tool": "search"}, "fail_tool"),
        ({"fail_tool": "done"}, "fail_tool"),
        ({"topology": "star:3"}, "single, chain:N"),
        ({"topology": "tree:2x2"}, "single, chain:N"),
        ({"topology": "mesh:2"}, "single, chain:N"),
        ({"topology": "chain:x"}, "toolchain runs on"),
    ],
)
def test_argument_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        Toolchain(**kwargs)


@pytest.mark.parametrize("spec", ["single", "chain:3"])
def test_pettingzoo_parallel_api(spec: str) -> None:
    from pettingzoo.test import parallel_api_test, parallel_seed_test

    parallel_api_test(GraphEnv(Toolchain(spec)), num_cycles=60)
    parallel_seed_test(lambda: GraphEnv(Toolchain(spec)), num_cycles=30)


def test_graph_env_truncates_on_tool_failure() -> None:
    env = GraphEnv(Toolchain("single", fail_tool="calc"))
    policy = env.scenario.optimal_policy()
    obs, _ = env.reset(seed=0)
    truncs: dict[str, bool] = {}
    while env.agents:
        obs, _, _, truncs, infos = env.step({a: policy(a, o) for a, o in obs.items()})
    assert truncs == {"agent": True}
    assert "ToolError" in infos["agent"]["error"] and "calc" in infos["agent"]["error"]


def test_graph_env_counterfactual_values() -> None:
    """An absent agent passes: without the answerer only the two lookups' checklist remains."""
    tc = Toolchain("chain:3")
    env = GraphEnv(tc)
    policy = tc.optimal_policy()
    assert env.value(0, tc.possible_agents, policy) == pytest.approx(FULL)
    assert env.value(0, ["agent_0", "agent_1"], policy) == pytest.approx(0.1 + 0.1)
    assert env.value(0, [], policy) == 0.0
