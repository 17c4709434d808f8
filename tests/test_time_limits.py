"""Time limits are truncations on the learner (issue #27): RLlib marks an all-truncated
multi-agent episode terminated and hands the flag to every agent's episode; our PPO learners
clear it, so GAE bootstraps the time limit from ``V(s_T)`` (mpe2 simple_spread, real Ray)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trainers.learners.time_limits import bootstrap_time_limits

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `experiments` is a folder of the checkout
    sys.path.insert(0, str(ROOT))


def _episode(terms: dict[str, bool], truncs: dict[str, bool]) -> Any:
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a": 0, "b": 0}, infos={"a": {}, "b": {}})
    ep.add_env_step(
        observations={"a": 1, "b": 1},
        actions={"a": 0, "b": 0},
        rewards={"a": 1.0, "b": 1.0},
        terminateds={**terms, "__all__": all(terms.values())},
        truncateds={**truncs, "__all__": all(truncs.values())},
    )
    return ep


def test_rllib_marks_an_all_truncated_episode_terminated_and_we_clear_it() -> None:
    ep = _episode({"a": False, "b": False}, {"a": True, "b": True})
    agents = ep.agent_episodes.values()
    # RLlib's behaviour this module exists for (if it changes, the fix is a no-op)
    assert all(sa.is_terminated and sa.is_truncated for sa in agents)
    assert bootstrap_time_limits([ep]) == 2
    assert all(sa.is_truncated and not sa.is_terminated for sa in agents)
    assert bootstrap_time_limits([ep]) == 0


def test_a_terminated_agent_stays_terminated() -> None:
    ep = _episode({"a": True, "b": True}, {"a": False, "b": False})
    assert bootstrap_time_limits([ep]) == 0
    assert all(sa.is_terminated and not sa.is_truncated for sa in ep.agent_episodes.values())


@pytest.mark.parametrize(
    "algo",
    [
        pytest.param({}, id="lean-value-norm"),
        pytest.param({"learner": "rllib", "value_norm": False, "critic": "local"}, id="rllib"),
    ],
)
def test_spread_time_limit_bootstraps_from_the_last_value(
    tmp_path: Path, algo: dict[str, Any]
) -> None:
    """mpe2 episodes end by ``max_cycles`` (a truncation): the learner batch has no terminated
    row, and the last step's value target is ``r + γ·V(s_T)`` (GAE's recursion stops there)."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.learner.training_data import TrainingData

    from experiments.spread_mappo import config
    from trainers.algo import to_algorithm_config
    from trainers.plan import resolve

    sets: dict[str, Any] = {
        "scenario_kwargs": {"N": 3, "max_cycles": 5, "local_ratio": 0.5},
        "algorithm.train_batch_size": 20,
        "algorithm.minibatch_size": 20,
        "resources.num_envs_per_env_runner": 1,
        **{f"algorithm.{k}": v for k, v in algo.items()},
    }
    cfg = config("MAPPO", 0, 20, sets)
    plan = resolve(cfg)
    built = to_algorithm_config(cfg, plan).build_algo()
    try:
        learner = built.learner_group._learner
        episodes = built.env_runner_group.local_env_runner.sample(num_timesteps=20)
        assert episodes and all(e.is_done for e in episodes)
        batch = learner._make_batch_if_necessary(TrainingData(episodes=episodes))
        (mid,) = plan.pools
        cols = {k: v.numpy() for k, v in batch.policy_batches[mid].items() if k != "infos"}
        module = learner.module[mid].unwrapped()
        norms = getattr(learner, "value_norms", {})
        with torch.no_grad():
            values = module.compute_values({k: torch.as_tensor(v) for k, v in cols.items()}).numpy()
        # the first batch: GAE de-normalised the values with identity statistics; the
        # targets come back normalised with the statistics after this batch
        targets = cols["value_targets"]
        if mid in norms:
            targets = norms[mid].denormalize(targets)
        assert not cols[Columns.TERMINATEDS].any()
        last = np.nonzero(cols[Columns.TRUNCATEDS])[0]
        assert len(last) == 3 * len(episodes)  # one per agent episode
        want = cols[Columns.REWARDS][last] + 0.99 * values[last + 1]  # the bootstrap row
        np.testing.assert_allclose(targets[last], want, rtol=1e-4, atol=1e-4)
    finally:
        built.stop()


@pytest.mark.parametrize("name", ["APPO", "IMPALA"])
def test_vtrace_learners_see_time_limits_as_truncations(name: str) -> None:
    """APPO's and IMPALA's V-trace gates its bootstrap with ``terminateds``: their learners
    clear the flag RLlib sets on an all-truncated episode, as the PPO learners do."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.learner.training_data import TrainingData

    from trainers.algo import to_algorithm_config
    from trainers.configs.experiment import ExperimentConfig
    from trainers.learners.time_limits import BootstrapTimeLimits

    cfg = ExperimentConfig.from_dict(
        {
            "scenario": "mpe2.simple_spread_v3:parallel_env",
            "scenario_kwargs": {"N": 3, "max_cycles": 5, "continuous_actions": False},
            "algorithm": {"name": name, "train_batch_size": 20},
            "resources": {"num_envs_per_env_runner": 1},
            "logging": {"wandb": "disabled", "progress": False},
        }
    )
    built = to_algorithm_config(cfg).build_algo()
    try:
        learner = built.learner_group._learner
        assert isinstance(learner, BootstrapTimeLimits)
        episodes = built.env_runner_group.local_env_runner.sample(num_timesteps=20)
        assert episodes and all(e.is_truncated for e in episodes if e.is_done)
        batch = learner._make_batch_if_necessary(TrainingData(episodes=episodes))
        for cols in batch.policy_batches.values():
            assert cols[Columns.TRUNCATEDS].numpy().any()
            assert not cols[Columns.TERMINATEDS].numpy().any()
    finally:
        built.stop()
