"""The one replay rule (scenarios.counterfactual) and the one action normaliser (scenarios.args)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from scenarios.args import checked_action, executed_action, normalize_action
from scenarios.bridge import SkipNode
from scenarios.counterfactual import Counterfactual
from scenarios.delegate import Delegate
from scenarios.graph_env import GraphEnv


# ----- the action normaliser ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("space", "action", "executed", "ok"),
    [
        (gym.spaces.Discrete(3), np.array([2]), 2, True),
        (gym.spaces.Discrete(3), np.int64(1), 1, True),
        (gym.spaces.Discrete(3), 3, 3, False),
        (gym.spaces.Discrete(3), 1.0, 1.0, False),
        (gym.spaces.MultiDiscrete([3, 3]), [1, 2], [1, 2], True),
        (gym.spaces.MultiDiscrete([3, 3]), np.array([1.0, 2.0]), [1, 2], True),
        (gym.spaces.MultiDiscrete([3, 3]), np.array([1.5, 2.0]), [1.5, 2.0], False),
        (gym.spaces.MultiDiscrete([3, 3]), [1, 3], [1, 3], False),
        (gym.spaces.MultiDiscrete([3, 3]), [[1, 2]], [[1, 2]], False),
        (gym.spaces.MultiDiscrete([3, 3]), ["a", "b"], ["a", "b"], False),
        (gym.spaces.MultiBinary(2), [True, False], [1, 0], True),
        (gym.spaces.MultiBinary(2), [2, 0], [2, 0], False),
    ],
)
def test_normalize_action(space: gym.Space, action, executed, ok: bool) -> None:
    got, valid = normalize_action(space, action)
    assert valid is ok
    assert np.asarray(got).tolist() == executed
    if ok and not isinstance(space, gym.spaces.Discrete):
        assert got.dtype == np.int64


def test_fast_range_checks_agree_with_the_spaces_contains() -> None:
    """Discrete ints and small integer arrays are range-checked in Python (faster): the verdict
    is ``space.contains``'s for every kind of value, below and above the numpy threshold."""
    rng = np.random.default_rng(0)
    for space in (gym.spaces.Discrete(4), gym.spaces.Discrete(3, start=-1)):
        values = [-3, -1, 0, 2, 3, 4, 2**62, -(2**63), True, 1.0, np.int64(2), np.asarray([3])]
        for value in values:
            item = value.item() if isinstance(value, np.ndarray) else value
            assert normalize_action(space, value) == (item, bool(space.contains(item)))
    for n in (3, 40):  # 40 entries: numpy's check
        spaces = [
            gym.spaces.MultiDiscrete(rng.integers(1, 5, n), start=rng.integers(-2, 2, n)),
            gym.spaces.MultiBinary(n),
        ]
        for space in spaces:
            for _ in range(200):
                action = rng.integers(-3, 6, n)
                got, ok = normalize_action(space, action)
                assert got is action and ok == space.contains(action)


def test_checked_action_names_agent_choice_and_space() -> None:
    space = gym.spaces.MultiDiscrete([3, 3])
    assert checked_action(space, (1, 2), "w").tolist() == [1, 2]
    assert checked_action(gym.spaces.Discrete(3), 2, "w").shape == ()
    with pytest.raises(ValueError, match=r"agent 'w' chose \[1, 9\]: not a valid w action"):
        checked_action(space, [1, 9], "w")


def test_executed_action_applies_the_invalid_action_rule() -> None:
    class Lenient(Delegate):
        invalid_action_penalty = -1.0

    strict, lenient = Delegate("star:2"), Lenient("star:2")
    bad = np.array([9, 9, 9])
    assert executed_action(strict, "orchestrator", bad)[1] is False
    assert executed_action(strict, "orchestrator", bad)[0] is bad  # GraphEnv.step refuses it
    action, ok = executed_action(lenient, "orchestrator", bad)
    assert not ok and action.tolist() == [0, 0, 0]  # the default action, as the env ran it


# ----- the replay rule ---------------------------------------------------------------------------
def test_kth_decision_replays_kth_action_else_the_absent_policy() -> None:
    s = Delegate("star:2")
    recorded = {"orchestrator": [[1, 2, 0]], "worker_0": [np.array([1, 1, 1])]}
    for absent, expect in (("skip", SkipNode), ("default", [0, 0, 0])):
        cf = Counterfactual(s, recorded, absent)
        assert cf.action("orchestrator", 0, True).tolist() == [1, 2, 0]  # as executed: int64
        assert cf.action("orchestrator", 1, True).tolist() == [0, 0, 0]  # past the recorded
        absent_action = cf.action("worker_0", 0, False)
        assert absent_action is SkipNode if expect is SkipNode else absent_action.tolist() == expect
    policy = Counterfactual(s, recorded).coalition(["orchestrator"])
    assert policy.absent == "default"  # the scenario's
    policy("orchestrator", None)
    policy("worker_0", None)
    policy("orchestrator", None)
    assert policy.decisions == [("orchestrator", 0), ("worker_0", 0), ("orchestrator", 1)]


def test_a_policy_answers_for_present_agents_only() -> None:
    asked = []
    cf = Counterfactual(Delegate("star:2"), lambda a, o: asked.append((a, o)) or [1, 1, 1])
    policy = cf.coalition(["worker_0"])
    assert policy("worker_0", "obs") == [1, 1, 1]
    assert policy("orchestrator", "obs").tolist() == [0, 0, 0]
    assert asked == [("worker_0", "obs")]


def test_graphenv_value_is_the_replay_of_the_coalition_policy() -> None:
    env = GraphEnv(Delegate("star:2"))
    env.reset(seed=3)
    while env.agents:
        env.step({a: np.array([1, 2, 3]) % 3 for a in env.agents})
    actions = env.episode_actions()
    full = env.possible_agents
    policy = Counterfactual(env.scenario, actions).coalition(full)
    assert env.replay(3, policy).reward == env.value(3, full, actions) == env.outcome.reward
    assert [a for a, _ in policy.decisions] == [t.agent for t in env.trace]
