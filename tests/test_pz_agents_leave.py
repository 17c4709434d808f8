"""Agents that leave a PettingZoo episode (issue #43): each agent is paid its own reward, an
agent that terminated ends in the step it leaves (terminated, not truncated) and is never paid
or asked again; the episode ends when every agent left; agents that differ between episodes.
Time limits stay truncations for every learner (trainers.learners.time_limits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from scenarios.pettingzoo_env import env_seed
from scenarios.registry import build
from scenarios.rllib_env import RLlibGraphEnv
from scenarios.testing import check_pettingzoo
from tests.configs import tiny_config
from tests.pz_toys import QuitterEnv
from trainers.learners.time_limits import bootstrap_time_limits
from trainers.sampling.episode_build import add_env_reset, add_env_step

QUITTER = "tests.pz_toys:quitter_env"


def side_by_side(
    seed: int, quit_at: int = 3, max_cycles: int = 8, engine: str = "auto"
) -> list[tuple]:
    """Step the RLlib view of the wrapped env and the raw env with the same actions; returns
    per step (raw rewards, view rewards, view terminateds, view truncateds, view obs keys)."""
    kwargs = {"quit_at": quit_at, "max_cycles": max_cycles}
    view = RLlibGraphEnv({"scenario": QUITTER, "kwargs": kwargs, "engine": engine})
    raw = QuitterEnv(quit_at, max_cycles)
    obs, _ = view.reset(seed=seed)
    raw_obs, _ = raw.reset(seed=env_seed(np.random.default_rng(seed)))
    assert set(obs) == set(raw_obs)
    steps = []
    rng = np.random.default_rng(seed)
    ended: set[str] = set()
    for _ in range(max_cycles + 2):
        actions = {a: int(rng.integers(2)) for a in obs if a not in ended}
        assert set(actions) == set(raw.agents)
        _, raw_r, *_ = raw.step(actions)
        obs, r, terms, truncs, _ = view.step(actions)
        steps.append((raw_r, r, terms, truncs, set(obs)))
        ended |= {a for a in obs if terms.get(a) or truncs.get(a)}
        if terms["__all__"] or truncs["__all__"]:
            break
    assert not raw.agents
    return steps


@pytest.mark.parametrize("engine", ["auto", "check"])  # check: fast path and LangGraph agree
def test_each_agent_is_paid_its_own_reward_step_by_step_and_the_quitter_ends_terminated(
    engine: str,
) -> None:
    steps = side_by_side(seed=3, quit_at=3, max_cycles=8, engine=engine)
    assert len(steps) == 8
    for t, (raw_r, r, terms, truncs, seen) in enumerate(steps, start=1):
        assert r == pytest.approx(raw_r, abs=1e-12), t  # own rewards, no one else's
        if t < 3:
            assert seen == {"quitter", "stayer"} and not terms.get("quitter")
        elif t == 3:  # the quitter leaves: its last observation, reward and own flag
            assert terms["quitter"] is True and truncs["quitter"] is False
            assert not terms["__all__"] and not truncs["__all__"]
        else:  # never paid or asked again
            assert "quitter" not in r and "quitter" not in seen
    raw_r, r, terms, truncs, seen = steps[-1]
    assert seen == {"stayer"}
    assert truncs["stayer"] is True and terms["stayer"] is False  # the time limit
    assert truncs["__all__"] is True and terms["__all__"] is False


def test_returns_and_metrics_are_the_envs_own() -> None:
    """The PettingZoo view pays each agent the env's reward each step; ``<agent>/return`` is
    the env's own sum; ``return`` the sum over steps of the mean over live agents."""
    env = RLlibGraphEnv({"scenario": QUITTER, "kwargs": {}}).env
    raw = QuitterEnv()
    env.reset(seed=5)
    raw.reset(seed=env_seed(np.random.default_rng(5)))
    totals = {"quitter": 0.0, "stayer": 0.0}
    team = 0.0
    while env.agents:
        actions = dict.fromkeys(env.agents, 1)
        _, raw_r, *_ = raw.step({a: 1 for a in raw.agents})
        _, r, terms, truncs, _ = env.step(actions)
        assert {a: v for a, v in r.items() if a in raw_r} == pytest.approx(raw_r)
        for a, v in raw_r.items():
            totals[a] += v
        team += sum(raw_r.values()) / len(raw_r)
    metrics = env.outcome.metrics
    assert metrics["quitter/return"] == pytest.approx(totals["quitter"])
    assert metrics["stayer/return"] == pytest.approx(totals["stayer"])
    assert metrics["return"] == pytest.approx(team)
    assert env.outcome.truncated is True  # the last agent was truncated


def test_the_env_the_trainer_sees_passes_parallel_api_test() -> None:
    check_pettingzoo(lambda: build(QUITTER), cycles=40)
    parallel_api_test(RLlibGraphEnv({"scenario": QUITTER, "kwargs": {}}).env)


def test_an_episode_where_every_agent_left_ends() -> None:
    """The quitter terminates in the stayer's last (truncated) step: the episode ends there,
    each agent with its own flag (RLlib's ``__all__`` says terminated, as not all truncated)."""
    steps = side_by_side(seed=1, quit_at=4, max_cycles=4)
    raw_r, r, terms, truncs, seen = steps[-1]
    assert len(steps) == 4 and seen == {"quitter", "stayer"}
    assert terms["quitter"] and not truncs["quitter"]
    assert truncs["stayer"] and not terms["stayer"]
    assert terms["__all__"] and not truncs["__all__"]  # not every agent was truncated


def test_agents_that_differ_between_episodes_and_a_state_attribute() -> None:
    """possible_agents is the universe; an agent absent this episode is never asked; a
    ``state`` that is a dict (rps_v2's) means no global state; no max_cycles: the default."""
    from scenarios.pettingzoo_env import DEFAULT_MAX_CYCLES

    s = build("tests.pz_toys:ChurnEnv")
    assert s.state_space is None
    assert s.max_supersteps == 2 * DEFAULT_MAX_CYCLES + 4
    view = RLlibGraphEnv({"scenario": "tests.pz_toys:ChurnEnv", "kwargs": {}})
    seen_sets = set()
    for seed in range(6):
        obs, _ = view.reset(seed=seed)
        assert len(obs) == 2
        agents = frozenset(obs)
        seen_sets.add(agents)
        while True:
            obs, r, terms, truncs, _ = view.step(dict.fromkeys(obs, 1))
            assert set(r) <= agents  # the absent agent is never asked nor paid
            if terms["__all__"]:
                break
        metrics = view.env.outcome.metrics
        assert metrics["steps"] == 4.0
        assert {k for k in metrics if k.endswith("/return")} == {f"{a}/return" for a in agents}
        assert all(metrics[f"{a}/return"] == 4.0 for a in agents)
    assert len(seen_sets) > 1  # different agents in different episodes
    check_pettingzoo(lambda: build("tests.pz_toys:ChurnEnv"), cycles=40)


def test_a_state_method_that_raises_is_no_global_state_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="state\\(\\) raised KeyError"):
        s = build("tests.pz_toys:broken_state_env")
    assert s.state_space is None


# ----- episodes as RLlib records them: terminated vs truncated, for every learner ---------------
def record(build_with: str) -> MultiAgentEpisode:
    """The quitter env's episode as RLlib's own ``add_env_step`` (``"rllib"``) or the batched
    sampler's copy (``"ours"``) records it."""
    view = RLlibGraphEnv({"scenario": QUITTER, "kwargs": {"quit_at": 2, "max_cycles": 4}})
    ep = MultiAgentEpisode()
    obs, infos = view.reset(seed=0)
    if build_with == "rllib":
        ep.add_env_reset(observations=obs, infos=infos)
    else:
        add_env_reset(ep, obs, infos)
    while not ep.is_done:
        actions = dict.fromkeys(ep.get_agents_to_act(), 0)
        obs, r, terms, truncs, infos = view.step(actions)
        kw = {"terminateds": terms, "truncateds": truncs}
        if build_with == "rllib":
            ep.add_env_step(observations=obs, actions=actions, rewards=r, infos=infos, **kw)
        else:
            add_env_step(ep, obs, actions, r, infos, **kw)
    return ep


@pytest.mark.parametrize("build_with", ["rllib", "ours"])
def test_a_terminated_agent_stays_terminated_and_the_time_limit_bootstraps(
    build_with: str,
) -> None:
    ep = record(build_with)
    quitter, stayer = ep.agent_episodes["quitter"], ep.agent_episodes["stayer"]
    assert len(quitter) == 2 and len(stayer) == 4
    assert quitter.is_terminated and not quitter.is_truncated
    # RLlib flags the whole episode (and so the stayer) terminated once every agent is done
    assert stayer.is_truncated and stayer.is_terminated
    assert bootstrap_time_limits([ep]) == 1  # every learner does this before its connectors
    assert quitter.is_terminated and not quitter.is_truncated
    assert stayer.is_truncated and not stayer.is_terminated


@pytest.mark.parametrize("algo", ["PPO", "APPO", "IMPALA"])
def test_every_learner_bootstraps_the_time_limit_and_not_the_quitter(
    ray_session: Any, algo: str
) -> None:
    """The learner batch of a real run: the stayer's last row is a truncation (V(s_T) is used),
    the quitter's a termination, for PPO and the V-trace learners alike."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.learner.training_data import TrainingData

    from trainers.algo import to_algorithm_config
    from trainers.configs.experiment import ExperimentConfig
    from trainers.learners.time_limits import BootstrapTimeLimits

    cfg = ExperimentConfig.from_dict(
        {
            "scenario": QUITTER,
            "scenario_kwargs": {"quit_at": 2, "max_cycles": 4},
            "algorithm": {"name": algo, "train_batch_size": 16}
            | ({"minibatch_size": 16} if algo == "PPO" else {}),
            "sharing": "agent",
            "resources": {"num_envs_per_env_runner": 1},
            "logging": {"wandb": "disabled", "progress": False},
        }
    )
    built = to_algorithm_config(cfg).build_algo()
    try:
        learner = built.learner_group._learner
        assert isinstance(learner, BootstrapTimeLimits)
        episodes = built.env_runner_group.local_env_runner.sample(num_timesteps=16)
        done = [e for e in episodes if e.is_done]
        assert done
        batch = learner._make_batch_if_necessary(TrainingData(episodes=episodes))
        cols = {
            m: {k: v.numpy() for k, v in b.items() if k != "infos"}
            for m, b in batch.policy_batches.items()
        }
        quitter, stayer = cols["quitter"], cols["stayer"]
        assert quitter[Columns.TERMINATEDS].sum() >= len(done)
        assert not quitter[Columns.TRUNCATEDS].any()
        assert stayer[Columns.TRUNCATEDS].sum() >= len(done)
        assert not stayer[Columns.TERMINATEDS].any()
    finally:
        built.stop()


def test_train_reports_each_agents_own_return(ray_session: Any, tmp_path: Path) -> None:
    """Two iterations of ``train()``: ``quitter/return`` (what RLlib's episodes hold) equals
    the env's own ``charts/quitter/return`` (issue #43: after it left, it was paid the team's)."""
    from trainers import train

    cfg = tiny_config(tmp_path, batch=64, checkpoint_every=0, scenario=QUITTER)
    result = train(cfg)
    assert result.status == "completed"
    for row in result.history:
        for agent in ("quitter", "stayer"):
            assert row[f"{agent}/return"] == pytest.approx(row[f"charts/{agent}/return"]), row
