"""The simple_spread MAPPO/IPPO experiment's harness (issue #27): ``--set`` overrides reach the
experiment, the rows' training statistics, the team-reward env (PettingZoo-conformant, every
agent gets the agents' mean reward) and the plain-torch reference's pieces. No training."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from mpe2 import simple_spread_v3
from pettingzoo.test import parallel_api_test

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `experiments` is a folder of the checkout
    sys.path.insert(0, str(ROOT))

from experiments import spread_mappo, spread_reference  # noqa: E402
from experiments.epymarl import team_return  # noqa: E402


def lockstep(env, ref, steps: int = 25):
    """``env`` and ``ref`` reset on seed 7 and stepped with the same random actions: yields
    ``(obs, ref_obs, rewards, ref_rewards)`` after the reset (rewards ``None``) and after each
    of ``steps`` steps."""
    obs, _ = env.reset(seed=7)
    ref_obs, _ = ref.reset(seed=7)
    yield obs, ref_obs, None, None
    rng = np.random.default_rng(0)
    for _ in range(steps):
        actions = {a: int(rng.integers(5)) for a in ref.agents}
        obs, rewards, *_ = env.step(actions)
        ref_obs, ref_rewards, *_ = ref.step(actions)
        yield obs, ref_obs, rewards, ref_rewards


def test_set_overrides_reach_the_experiment() -> None:
    sets = spread_mappo.parse_sets(
        ["algorithm.num_epochs=15", "algorithm.extra.use_kl_loss=false", "algorithm.lr=5e-4"]
    )
    assert sets == {
        "algorithm.num_epochs": 15,
        "algorithm.extra.use_kl_loss": False,
        "algorithm.lr": 5e-4,
    }
    cfg = spread_mappo.config("MAPPO", 3, 1000, sets)
    algo = cfg.algorithm
    assert (algo.num_epochs, algo.lr, algo.extra) == (15, 5e-4, {"use_kl_loss": False})
    assert algo.minibatch_size == 3200 and cfg.seed == 3  # the rest is the experiment's
    plain = spread_mappo.config("IPPO", 0, 1000)
    assert plain.algorithm.num_epochs == 10 and plain.algorithm.critic == "local"
    ref = "experiments.spread_mappo:team_parallel_env"
    assert spread_mappo.config("MAPPO", 0, 1, {"scenario": ref}).scenario == ref
    with pytest.raises(SystemExit, match="path=value"):
        spread_mappo.parse_sets(["algorithm.lr"])


def test_training_stats_from_a_result() -> None:
    assert spread_mappo.training_stats(None) == {}
    result = {
        "env_runners": {"episode_return_mean": -80.0},
        "learners": {
            "__all_modules__": {"entropy": 99.0},
            "team": {"entropy": 1.2, "mean_kl_loss": 0.01, "vf_explained_var": 0.5},
        },
    }
    stats = spread_mappo.training_stats(result)
    assert stats == {
        "train_team_return": team_return(-80.0),
        "entropy": 1.2,
        "mean_kl_loss": 0.01,
        "vf_explained_var": 0.5,
    }


def test_team_reward_env_is_conformant_and_shares_the_mean() -> None:
    parallel_api_test(spread_mappo.team_parallel_env(**spread_mappo.KW), num_cycles=30)
    team = spread_mappo.team_parallel_env(**spread_mappo.KW)
    own = simple_spread_v3.parallel_env(**spread_mappo.KW)
    for _, _, mine, theirs in list(lockstep(team, own))[1:]:
        mean = float(np.mean(list(theirs.values())))
        assert mine == pytest.approx(dict.fromkeys(theirs, mean))
    assert team.state().shape == own.state().shape  # MAPPO's critic still reads it


def test_report_groups_arms_by_tag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "curves.jsonl"
    rows = [
        {"algo": "MAPPO", "seed": 0, "env_steps": 25_600, "team_return": -200.0},
        {"algo": "MAPPO", "tag": "nokl", "seed": 0, "env_steps": 25_600, "team_return": -190.0},
        {"algo": "MAPPO", "tag": "nokl", "seed": 1, "env_steps": 24_800, "team_return": -210.0},
    ]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spread_mappo.report(out)
    lines = capsys.readouterr().out.splitlines()
    assert any(ln.split()[:3] == ["MAPPO", "25000", "-200.0"] for ln in lines)
    nokl = next(ln for ln in lines if ln.startswith("MAPPO[nokl]"))
    assert nokl.split()[1:3] == ["25000", "-200.0"] and nokl.split()[-1] == "2"


def test_reference_pieces() -> None:
    import torch

    actor = spread_reference.net(18, 5, 0.01)
    assert torch.count_nonzero(actor[-1].bias) == 0
    assert float(actor[-1].weight.detach().abs().max()) < 0.05  # near-uniform first policy
    running = spread_reference.RunningStd()
    running.update(np.array([1.0, 3.0, 5.0]))
    assert running.mean == pytest.approx(3.0) and running.std == pytest.approx(np.std([1, 3, 5]))


def test_agent_id_env_is_conformant_and_appends_each_agents_one_hot() -> None:
    parallel_api_test(spread_mappo.id_parallel_env(**spread_mappo.KW), num_cycles=30)
    ided = spread_mappo.id_parallel_env(**spread_mappo.KW)
    own = simple_spread_v3.parallel_env(**spread_mappo.KW)
    for obs, plain, mine, theirs in lockstep(ided, own):
        for i, agent in enumerate(own.possible_agents):
            assert np.array_equal(obs[agent][:-3], plain[agent])
            assert np.array_equal(obs[agent][-3:], np.eye(3)[i])
            assert ided.observation_space(agent).contains(obs[agent])
        assert mine == theirs
    assert np.array_equal(ided.state(), own.state())  # MAPPO's critic reads mpe2's state


def test_input_norm_env_is_conformant_and_standardises_observations_and_state() -> None:
    parallel_api_test(spread_mappo.normed_parallel_env(**spread_mappo.KW), num_cycles=30)
    normed = spread_mappo.normed_parallel_env(**spread_mappo.KW)
    team = spread_mappo.team_parallel_env(**spread_mappo.KW)
    for obs, raw, mine, theirs in lockstep(normed, team):
        for agent, o in obs.items():
            x = raw[agent]
            assert np.allclose(o, (x - x.mean()) / np.sqrt(x.var() + 1e-5), atol=1e-5)
        state = normed.state()
        assert abs(state.mean()) < 1e-5 and state.std() == pytest.approx(1.0, abs=1e-3)
        assert mine == theirs  # the team's reward, unchanged
