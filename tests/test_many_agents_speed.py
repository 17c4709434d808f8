"""The batched sampler's cheaper paths for many agents (issue 43, item 6) give RLlib's results.

What a user relies on: the continuation of an episode cut at a ``sample()``'s end
(:func:`trainers.sampling.episode_cut.cut`) is the one RLlib's ``MultiAgentEpisode.cut`` gives —
every buffer with its lookback, mappings, hanging caches, flags, agent order, and the same side
effect on the cut episode — so the learner gets the same chunks and the next chunk continues
alike. Compared field by field (``test_episode_build``'s snapshot) on scripted parallel-env
episodes (agents leaving with and without a last observation, rewards of numpy types, every
lookback) and on a real magent2 ``battle_v4`` runner sampling with the one and the other.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from test_episode_build import AGENTS, assert_same, assert_same_samples, ob, pair, play, script

from trainers.algo import to_algorithm_config
from trainers.configs.experiment import ExperimentConfig
from trainers.rllib_compat.episodes import blank_multi_agent_episode
from trainers.sampling import batched_runner, episode_cut
from trainers.sampling.batched_runner import BatchedEnvRunner
from trainers.sampling.episode_cut import cut


def parallel_script(seed: int, steps: int) -> list[dict[str, Any]]:
    """A parallel env's steps: every agent still there observes, acts and is rewarded at every
    step; some leave (terminated, with or without a last observation), one stays to the end."""
    rng = np.random.default_rng(seed)
    alive = list(AGENTS)
    out: list[dict[str, Any]] = [{"reset": {a: ob(rng) for a in alive}}]
    for t in range(steps):
        acts = {a: int(rng.integers(3)) for a in alive}
        extras = {a: {"logp": np.float32(rng.normal()), "k": [t]} for a in acts}
        leave = [a for a in alive[1:] if rng.random() < 0.15]
        silent = {a for a in leave if rng.random() < 0.3}  # leaves without a last observation
        obs = {a: ob(rng) for a in alive if a not in silent}
        kind = (float, np.float32, np.float64)[t % 3]
        rewards = {a: kind(rng.normal()) for a in alive}
        terms = {"__all__": False, **dict.fromkeys(leave, True)}
        out.append(
            {"obs": obs, "actions": acts, "rewards": rewards, "infos": {a: {"t": t} for a in obs},
             "terminateds": terms, "truncateds": {"__all__": False}, "extras": extras}
        )  # fmt: skip
        alive = [a for a in alive if a not in leave]
    return out


def fast_path_taken(episode: Any, lookback: int) -> bool:
    return episode_cut._plan(copy.deepcopy(episode), lookback) is not None


def assert_cut_as_rllib(episode: Any, lookback: int) -> Any:
    """Cut a copy with each; both continuations and both cut episodes equal. Returns ours."""
    ours, theirs = copy.deepcopy(episode), copy.deepcopy(episode)
    ours_next = cut(ours, lookback)
    theirs_next = theirs.cut(len_lookback_buffer=lookback)
    assert type(ours_next) is type(theirs_next)
    assert_same(ours_next, theirs_next)
    assert_same(ours, theirs)  # RLlib's getters touch the cut episode's agent_t_started
    return ours_next


@pytest.mark.parametrize("lookback", [0, 1, 3])
@pytest.mark.parametrize("seed", range(8))
def test_cut_equals_rllibs_on_parallel_episodes(seed: int, lookback: int) -> None:
    """Cut after every step, the continuation recorded on and cut again: each equal to
    RLlib's. The fast path is taken where no agent left inside the window (in every script
    at lookbacks 0 and 1; windows of 4 steps often hold a departure)."""
    steps = parallel_script(seed, 14)
    episode = pair()[0]
    play(episode, steps[:1], True)
    fast = 0
    for t, step in enumerate(steps[1:], start=1):
        play(episode, [step], True)
        if episode.is_done:
            break
        fast += fast_path_taken(episode, lookback)
        assert_cut_as_rllib(episode, lookback)
        if t % 4 == 0:  # go on in the continuation, as the sampler does
            episode = cut(episode, lookback)
    assert fast > 0 or lookback == 3


@pytest.mark.parametrize("seed", range(6))
def test_irregular_episodes_fall_back_to_rllibs_cut(seed: int) -> None:
    """Agents that observe only sometimes, hang actions, join late: RLlib's own cut (and the
    result is RLlib's either way)."""
    steps = script(200 + seed, 9, "terminated", anchored=True)
    episode = pair()[0]
    for step in steps[:-1]:
        play(episode, [step], True)
        if episode.env_t:
            assert_cut_as_rllib(episode, 1 + seed % 2)


def test_blank_multi_agent_episode_has_the_constructors_fields() -> None:
    """The compat primitive the fast cut builds on (RLlib 2.60's private fields)."""
    fn = pair()[0].agent_to_module_mapping_fn
    spaces = ({"a": gym.spaces.Discrete(2)}, {"a": gym.spaces.Discrete(3)})
    modules = {"a": "m_a"}
    theirs = MultiAgentEpisode(
        id_="ep",
        observation_space=spaces[0],
        action_space=spaces[1],
        agent_module_ids=modules,
        agent_to_module_mapping_fn=fn,
        len_lookback_buffer=2,
    )
    ours = blank_multi_agent_episode("ep", fn, modules, 2, *spaces)
    theirs.env_t = 0  # RLlib: len(rewards) - lookback + env_t_started, -2 without data
    assert type(ours) is type(theirs)
    assert_same(ours, theirs)
    assert ours.agent_to_module_mapping_fn is fn and ours.custom_data == {}
    assert ours.id_ == theirs.id_ and ours._agent_to_module_mapping is modules


def test_a_done_episode_cannot_be_cut() -> None:
    episode = pair()[0]
    play(episode, parallel_script(0, 3), True)
    episode.is_terminated = True
    with pytest.raises(RuntimeError, match="already done"):
        cut(episode, 1)


def battle_runner(envs: int) -> Any:
    cfg = ExperimentConfig.from_dict(
        {
            "scenario": "magent2.environments.battle_v4:parallel_env",
            "scenario_kwargs": {"map_size": 15, "max_cycles": 40},
            "resources": {"num_envs_per_env_runner": envs},
            "seed": 1,
        }
    )
    return BatchedEnvRunner(config=to_algorithm_config(cfg), worker_index=0)


def test_battle_runner_samples_as_with_rllibs_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """magent2 battle_v4 (agents leave as they die): three ``sample()`` calls cut every running
    episode; with RLlib's ``cut`` instead, every chunk (cut or done) is the same."""
    pytest.importorskip("magent2")
    calls = [{"num_timesteps": 30}] * 3
    ours, theirs = battle_runner(envs=2), battle_runner(envs=2)
    theirs.module.set_state(ours.module.get_state())
    fast: list[bool] = []
    real = episode_cut._plan

    def spy(episode: Any, lookback: int) -> Any:
        plan = real(episode, lookback)
        fast.append(plan is not None)
        return plan

    got: list[list[list[Any]]] = []
    for runner in (ours, theirs):
        with monkeypatch.context() as m:
            if runner is theirs:
                m.setattr(batched_runner, "cut", lambda e, lb: e.cut(len_lookback_buffer=lb))
            else:
                m.setattr(episode_cut, "_plan", spy)
            got.append([runner.sample(explore=True, **c) for c in calls])
        runner.stop()
    assert_same_samples(got[0], got[1])
    assert any(fast)
    assert any(e.is_done for chunk in got[0] for e in chunk)
