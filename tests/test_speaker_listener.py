"""mpe2 simple_speaker_listener through ``train()`` (issue #27 item 5): two heterogeneous agents
(speaker obs 3 / 3 actions, listener obs 11 / 5 actions) with a pool each, MAPPO's critic on
mpe2's ``state()`` + own observation + id, IPPO; EPyMARL's return convention for the task
checked against the world; the experiment's baselines and report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from configs import tiny_config
from mpe2 import simple_speaker_listener_v4

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `experiments` is a folder of the checkout
    sys.path.insert(0, str(ROOT))

from experiments import speaker_listener  # noqa: E402
from experiments.epymarl import (  # noqa: E402
    speaker_listener_return,
    speaker_listener_return_from_world,
)
from scenarios.pettingzoo_env import env_seed  # noqa: E402
from scenarios.registry import make  # noqa: E402
from trainers.plan import resolve  # noqa: E402

SL = speaker_listener.SPEAKER_LISTENER
KW = speaker_listener.KW


def dist2(raw: Any) -> float:
    """The listener's squared distance to the goal landmark (by hand from the world)."""
    speaker = raw.world.agents[0]
    return float(np.sum(np.square(speaker.goal_a.state.p_pos - speaker.goal_b.state.p_pos)))


def test_epymarl_return_is_the_sum_over_agents_and_matches_the_world() -> None:
    """Both agents receive −d² each step; EPyMARL's return (Σ_t 2·(−d²_t)) is Σ_i R_i of mpe2's
    returns, and our scenario's ``sum_return`` is that sum for the same seed and actions."""
    seed, rng = 3, np.random.default_rng(0)
    ours = make(SL, **KW)
    ours.reset(seed=seed)
    raw = simple_speaker_listener_v4.parallel_env(**KW)
    raw.reset(seed=env_seed(np.random.default_rng(seed)))
    total, d2 = 0.0, 0.0
    for _ in range(25):
        acts = {"speaker_0": int(rng.integers(3)), "listener_0": int(rng.integers(5))}
        _, rewards, *_ = raw.step(acts)
        ours.step(acts)
        step_d2 = dist2(raw.unwrapped)
        assert rewards == pytest.approx({"speaker_0": -step_d2, "listener_0": -step_d2})
        total, d2 = total + sum(rewards.values()), d2 + step_d2
    assert not raw.agents and d2 > 0
    assert speaker_listener_return(total) == pytest.approx(
        speaker_listener_return_from_world(d2), abs=1e-9
    )
    assert ours.outcome.metrics["sum_return"] == pytest.approx(total, abs=1e-9)


def test_pools_by_agent_name_and_critic_widths() -> None:
    """A pool per agent (speaker, listener); MAPPO's critic columns are state (14) + own obs +
    a 2-way id; IPPO has none."""
    mappo = resolve(speaker_listener.config("MAPPO", 0, 1000), ray_workers=False)
    assert mappo.agent_to_pool == {"speaker_0": "speaker", "listener_0": "listener"}
    spaces = {pid: (p.observation_space.shape, p.action_space.n) for pid, p in mappo.pools.items()}
    assert spaces == {"speaker": ((3,), 3), "listener": ((11,), 5)}
    assert mappo.critic_dims == {"speaker": 14 + 3 + 2, "listener": 14 + 11 + 2}
    ippo = resolve(speaker_listener.config("IPPO", 0, 1000), ray_workers=False)
    assert ippo.critic_dims == {} and set(ippo.pools) == {"speaker", "listener"}


def test_the_word_reaches_the_listener_in_the_env_the_trainer_sees() -> None:
    """The speaker's discrete action is the one-hot message in the listener's next observation
    (its last 3 entries); the speaker's own observation is the goal's colour."""
    from scenarios.rllib_env import RLlibGraphEnv

    env = RLlibGraphEnv({"scenario": SL, "kwargs": KW})
    obs, _ = env.reset(seed=3)
    assert obs["speaker_0"].shape == (3,) and not obs["listener_0"][-3:].any()
    for word in (0, 2, 1):
        obs, *_ = env.step({"speaker_0": word, "listener_0": 0})
        np.testing.assert_array_equal(obs["listener_0"][-3:], np.eye(3)[word])


@pytest.mark.parametrize("algo", ["MAPPO", "IPPO"])
def test_trains_two_iterations(ray_session: Any, tmp_path: Path, algo: str) -> None:
    from trainers.run.loop import train

    cfg = tiny_config(
        tmp_path,
        batch=100,
        checkpoint_every=0,
        scenario=SL,
        scenario_kwargs=KW,
        algorithm={"name": algo, "train_batch_size": 100, "minibatch_size": 50, "num_epochs": 1},
    )
    result = train(cfg)
    assert result.status == "completed" and result.iterations == 2
    assert result.final["charts/env_steps"] >= 200
    for pool in ("speaker", "listener"):
        assert np.isfinite(result.final[f"losses/{pool}/vf_loss"]), sorted(result.final)


def test_baselines_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The baselines play the evaluation seeds (same seed, same return) in EPyMARL's convention:
    the scripted listener told the goal beats the one that goes to the centroid, which beats
    random; the report lists them beside the trained arms."""
    rows = {r["algo"]: r for r in speaker_listener.baseline_rows(8, [1])}
    assert rows["random"] == speaker_listener.random_row(8, seed=1)
    assert all(r["env_steps"] == 0 and r["team_return"] < 0 for r in rows.values())
    goal, centroid = rows["scripted-goal"]["team_return"], rows["scripted-centroid"]["team_return"]
    assert goal > centroid > rows["random"]["team_return"]
    with pytest.raises(ValueError, match="use one of goal, centroid"):
        speaker_listener.scripted_returns(1, "landmark")
    out = tmp_path / "curves.jsonl"
    mappo = {"algo": "MAPPO", "seed": 0, "env_steps": 25_600, "team_return": -20.0}
    out.write_text("".join(json.dumps(r) + "\n" for r in [*rows.values(), mappo]))
    speaker_listener.spread_mappo.report(out, speaker_listener.PUBLISHED)
    lines = capsys.readouterr().out.splitlines()
    assert any(ln.split()[:2] == ["random", "0"] for ln in lines)
    assert any(ln.split()[:2] == ["scripted-goal", "0"] for ln in lines)
    assert any(ln.split()[:3] == ["MAPPO", "25000", "-20.0"] for ln in lines)
