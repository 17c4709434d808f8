"""Turn credit for GRPO (``algorithm.grpo.turn_credit``) and GRPO on small-network pools.

Hand-computed advantages for reward to go and GiGPO step groups (:mod:`trainers.grpo.turn_credit`),
the scenario's anchor key reaching the learner through ``GroupedEnv``'s infos, and real
``train()`` runs: MLP and GRU pools under GRPO, and step groups composed with Shapley credit.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainers.configs.grpo import GRPOLoss
from trainers.configs.typed import ConfigError
from trainers.grpo.turn_credit import (
    episode_anchors,
    observation_key,
    rewards_to_go,
    turn_advantages,
)

EPS = 1e-6


def test_rewards_to_go_by_hand() -> None:
    assert rewards_to_go([0.25, 0.0, 0.25, 1.25]).tolist() == [1.75, 1.5, 1.5, 1.25]
    assert rewards_to_go([]).tolist() == []


def test_episode_mode_repeats_the_episode_advantage_bit_for_bit() -> None:
    adv = np.array([0.3, -0.7], dtype=np.float32)
    out, keep, stats = turn_advantages(
        [[0.0, 1.0], [0.5, 0.0, 0.0]], [0, 0], adv, [True, False], GRPOLoss()
    )
    assert out.tolist() == np.repeat(adv, [2, 3]).tolist()
    assert keep.tolist() == [True, True, False, False, False]
    assert stats == {}


def test_reward_to_go_by_hand() -> None:
    # one group of two episodes: returns 1.0 (0.5 after turn 0, 0.5 at the end) and 0.0
    # mean 0.5, population std 0.5 → episode advantages +1, −1 (eps aside)
    rewards = [[0.5, 0.5], [0.0, 0.0]]
    adv = np.array([0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)])
    out, keep, _ = turn_advantages(
        rewards, [0, 0], adv, [True, True], GRPOLoss(turn_credit="reward_to_go")
    )
    # turn 1 of episode 0 loses the 0.5 paid before it: (0.5 − 0.5) / 0.5 = 0
    expected = [0.5 / (0.5 + EPS), 0.0, -0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)]
    np.testing.assert_allclose(out, expected, atol=1e-6)
    assert keep.all()
    # Dr. GRPO (no std): the term is the raw reward paid before the turn
    dr = GRPOLoss(turn_credit="reward_to_go", scale_std=False)
    out, _, _ = turn_advantages(rewards, [0, 0], [0.5, -0.5], [True, True], dr)
    np.testing.assert_allclose(out, [0.5, 0.0, -0.5, -0.5], atol=1e-7)


def test_reward_to_go_equals_episode_with_terminal_rewards_only() -> None:
    rewards = [[0.0, 0.0, 1.0], [0.0, 0.3], [0.0, 0.0, 0.0, 0.6]]
    adv = np.array([1.2, -0.8, -0.4])
    rtg, _, _ = turn_advantages(
        rewards, [0, 0, 0], adv, [True] * 3, GRPOLoss(turn_credit="reward_to_go")
    )
    episode, _, _ = turn_advantages(rewards, [0, 0, 0], adv, [True] * 3, GRPOLoss())
    np.testing.assert_allclose(rtg, episode, atol=1e-7)


#: The four-turn example: three rollouts of one task (one agent), per-call rewards 0.25 for a
#: right, valid call and 1.0 more for a correct answer. All start at anchor A. E1 and E2 both
#: make the same first call and reach anchor B; there E1 calls with a wrong parameter (reward 0,
#: it recovers later), E2 with the right one. E3 makes another first call (anchor G) and fails.
FOUR_TURNS = {
    "rewards": [[0.25, 0.0, 0.25, 1.25], [0.25, 0.25, 0.25, 1.25], [0.0, 0.25, 0.25, 0.25]],
    "anchors": [["A", "B", "C", "D"], ["A", "B", "E", "F"], ["A", "G", "H", "I"]],
}


def _four_turn_episode_adv() -> np.ndarray:
    returns = np.array([1.75, 2.0, 0.75])  # mean 1.5
    std = math.sqrt((0.25**2 + 0.5**2 + 0.75**2) / 3)  # population std ≈ 0.5401
    return (returns - 1.5) / (std + EPS)


def test_four_turn_example_wrong_parameter_turn_flips_sign_under_step_groups() -> None:
    rewards, anchors = FOUR_TURNS["rewards"], FOUR_TURNS["anchors"]
    adv = _four_turn_episode_adv()
    assert adv[0] == pytest.approx(0.46291, abs=1e-4)
    ep, _, _ = turn_advantages(rewards, [0, 0, 0], adv, [True] * 3, GRPOLoss())
    wrong = 1  # E1's second turn (flat index 1)
    assert ep[wrong] == pytest.approx(0.46291, abs=1e-4) and ep[wrong] > 0

    cfg = GRPOLoss(turn_credit="step_groups")
    out, keep, stats = turn_advantages(rewards, [0, 0, 0], adv, [True] * 3, cfg, anchors=anchors)
    # step group B: E1's reward to go 0 + 0.25 + 1.25 = 1.5, E2's 0.25 + 0.25 + 1.25 = 1.75;
    # mean 1.625, std 0.125 → S = −1 and +1
    s_b = -0.125 / (0.125 + EPS)
    assert out[wrong] == pytest.approx(adv[0] + s_b, abs=1e-5)  # 0.4629 − 1 ≈ −0.537
    assert out[wrong] < 0
    assert out[5] == pytest.approx(adv[1] - s_b, abs=1e-5)  # E2's right parameter at B
    # step group A = the three first turns, whose rewards to go are the returns: S = A_i
    for i, flat in enumerate((0, 4, 8)):
        assert out[flat] == pytest.approx(2 * adv[i], abs=1e-5)
    # every other turn is alone at its anchor: the episode advantage
    for flat, i in ((2, 0), (3, 0), (6, 1), (7, 1), (9, 2), (10, 2), (11, 2)):
        assert out[flat] == pytest.approx(adv[i], abs=1e-6)
    assert keep.all()
    # anchor hit rate: A (3 turns) + B (2 turns) of 12 turns
    assert stats["anchor_hit_rate"] == pytest.approx(5 / 12)
    assert stats["step_groups"] == 2
    assert stats["step_group_size_mean"] == pytest.approx(2.5)
    # step_weight scales the step term
    half, _, _ = turn_advantages(
        rewards,
        [0, 0, 0],
        adv,
        [True] * 3,
        GRPOLoss(turn_credit="step_groups", step_weight=0.5),
        anchors=anchors,
    )
    assert half[wrong] == pytest.approx(adv[0] + 0.5 * s_b, abs=1e-5)


def test_step_groups_stay_inside_a_grpo_group_and_keep_informative_turns() -> None:
    # two GRPO groups with equal returns inside each (dropped by dynamic sampling), same anchor
    # keys across groups: step groups never mix groups; a step group whose rewards to go differ
    # keeps its turns although the episode group was dropped
    rewards = [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    anchors = [["s", "t"], ["s", "u"], ["s", "t"], ["s", "t"]]
    cfg = GRPOLoss(turn_credit="step_groups")
    out, keep, stats = turn_advantages(
        rewards, [0, 0, 1, 1], [0.0] * 4, [False] * 4, cfg, anchors=anchors
    )
    # group 0, anchor s: rewards to go 1 and 1 → no signal; t and u alone → 0
    # group 1: everything 0
    assert keep.tolist() == [False] * 8
    assert out.tolist() == [0.0] * 8
    assert stats["anchor_hit_rate"] == pytest.approx(6 / 8)  # s in both groups, t in group 1
    rewards[1] = [0.5, 0.0]  # now anchor s of group 0 differs: 1.0 vs 0.5
    out, keep, _ = turn_advantages(
        rewards, [0, 0, 1, 1], [0.0] * 4, [False] * 4, cfg, anchors=anchors
    )
    assert keep.tolist() == [True, False, True, False, False, False, False, False]
    np.testing.assert_allclose(out[[0, 2]], [1 / (1 + 4 * EPS), -1 / (1 + 4 * EPS)], atol=1e-5)


def test_turn_credit_knobs_are_checked() -> None:
    with pytest.raises(ConfigError, match="turn_credit"):
        GRPOLoss(turn_credit="per_token")
    with pytest.raises(ConfigError, match="step_weight=-1"):
        GRPOLoss(step_weight=-1.0)
    with pytest.raises(ValueError, match="anchor key per turn"):
        turn_advantages([[1.0]], [0], [0.0], [True], GRPOLoss(turn_credit="step_groups"))


def test_observation_keys_and_the_scenarios_anchor_key_in_episodes() -> None:
    from rllib_episodes import record_episode

    from scenarios.registry import make
    from scenarios.toolchain import Toolchain
    from trainers.sampling.grouped_env import GroupedEnv

    a = np.zeros(3, np.float32)
    assert observation_key(a) == observation_key(a.copy())
    assert observation_key(a) != observation_key(np.zeros(3, np.float64))
    assert observation_key({"x": a}) != observation_key({"y": a})

    def lookup_then_done(agent: str, obs: Any) -> np.ndarray:  # lookup(0) twice, then done
        return np.array([0, 0, 0, 0])

    # default: the observation is the anchor (every call grows the log: no repeats)
    env = GroupedEnv({"env": make("toolchain", topology="single", max_calls=4)})
    sa = next(iter(record_episode(env, 0, lookup_then_done).agent_episodes.values()))
    keys = episode_anchors(sa)
    assert len(keys) == len(sa) == 4 and len(set(keys)) == 4

    class Coarse(Toolchain):  # a scenario's own key: the number of calls so far
        def anchor_key(self, agent: str, observation: Any) -> Any:
            return int(np.asarray(observation)[-self.max_calls * self.slot :].sum() > 0)

    coarse = Coarse("single", max_calls=4)
    from scenarios.graph_env import GraphEnv

    env = GroupedEnv({"env": GraphEnv(coarse)})
    sa = next(iter(record_episode(env, 0, lookup_then_done).agent_episodes.values()))
    assert episode_anchors(sa) == [("key", 0), ("key", 1), ("key", 1), ("key", 1)]


# ----- training through train() ----------------------------------------------------------------
def _grpo(tmp_path: Path, model: dict[str, Any], **sections: Any) -> Any:
    from configs import tiny_config

    grpo = {"group_size": 4, "groups_per_iteration": 2, "turn_credit": "step_groups"}
    grpo.update(sections.pop("grpo", {}))
    sections.setdefault("pools", {"agent": {"model": model}})
    algorithm = {"name": "GRPO", "num_epochs": 1, "grpo": grpo}
    return tiny_config(tmp_path, algorithm=algorithm, **sections)


@pytest.mark.parametrize("model", [{"type": "mlp"}, {"type": "gru", "max_seq_len": 4}])
def test_grpo_trains_small_network_pools(tmp_path: Path, model: dict[str, Any]) -> None:
    from test_train import learner_weights

    from trainers.algo import to_algorithm_config
    from trainers.run.loop import train

    cfg = _grpo(tmp_path, model, scenario="toolchain", topology="single")
    algo = to_algorithm_config(cfg).build_algo()
    try:
        before = learner_weights(algo, "agent")
    finally:
        algo.stop()
    result = train(cfg)
    assert result.status == "completed" and result.iterations == 2
    final = result.final
    assert "losses/agent/grpo/anchor_hit_rate" in final
    assert 0.0 <= final["losses/agent/grpo/anchor_hit_rate"] <= 1.0
    # groups are whole although episode lengths vary: G rollouts per task seed
    assert final["losses/agent/grpo/group_size_mean"] == 4.0
    from ray.rllib.core.rl_module.rl_module import RLModule

    ckpt = result.final_checkpoint / "learner_group" / "learner" / "rl_module" / "agent"
    after = {k: np.array(v) for k, v in RLModule.from_checkpoint(str(ckpt)).get_state().items()}
    assert any(not np.array_equal(before[k], after[k]) for k in before if k in after)


def test_step_groups_compose_with_shapley_credit(tmp_path: Path) -> None:
    from trainers.run.loop import train

    cfg = _grpo(
        tmp_path,
        {},
        scenario="delegate",
        topology="star:2",
        pools={},
        credit={"method": "shapley"},
        grpo={"turn_credit": "step_groups", "groups_per_iteration": 1},
        budget={"iterations": 1},
    )
    result = train(cfg)
    assert result.status == "completed"
    assert any(k.startswith("losses/") and "anchor_hit_rate" in k for k in result.final)
    assert any(k.endswith("/credit") for k in result.final)


def test_kl_coef_with_small_network_pools_is_a_config_error(tmp_path: Path) -> None:
    from trainers.plan import resolve

    cfg = _grpo(tmp_path, {"type": "mlp"}, scenario="toolchain", topology="single")
    cfg.algorithm.grpo.kl_coef = 0.1
    with pytest.raises(ConfigError, match=r"kl_coef=0.1 .*set algorithm.grpo.kl_coef: 0"):
        resolve(cfg)
