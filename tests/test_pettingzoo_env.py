"""Any PettingZoo env as a scenario: conformance of the env the trainer sees, seeds, roles,
the global state, refused counterfactual credit, EPyMARL's return convention and ``marl run``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpe2 import simple_spread_v3
from pettingzoo.test import parallel_api_test

from experiments.epymarl import team_return, team_return_from_world
from scenarios.base import ReplayUnavailable
from scenarios.global_state import STATE_INFO
from scenarios.pettingzoo_env import env_seed, role_of
from scenarios.registry import build, make
from scenarios.rllib_env import RLlibGraphEnv
from scenarios.testing import check_pettingzoo, check_rllib
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError
from trainers.credit.settings import CounterfactualCreditError
from trainers.plan import resolve

ROOT = Path(__file__).resolve().parents[1]
SPREAD = "mpe2.simple_spread_v3:parallel_env"
KW = {"N": 3, "max_cycles": 25, "local_ratio": 0.5}


@pytest.mark.parametrize(
    "ref",
    [SPREAD, "mpe2.simple_spread_v3:env", "mpe2.simple_speaker_listener_v4:parallel_env"],
)
def test_env_the_trainer_sees_passes_pettingzoo_and_rllib_checks(ref: str) -> None:
    """ParallelEnv and AEC factories (converted) pass parallel_api_test / parallel_seed_test
    wrapped as the trainer runs them, and RLlib's checker on the RLlib view."""
    check_pettingzoo(lambda: build(ref, max_cycles=10), cycles=60)
    check_rllib(make(ref, max_cycles=10))
    parallel_api_test(RLlibGraphEnv({"scenario": ref, "kwargs": {"max_cycles": 10}}).env)


def test_roles_and_pools_by_agent_name() -> None:
    s = build("mpe2.simple_tag_v3:parallel_env")
    assert s.topology.roles == {
        "adversary_0": "adversary",
        "adversary_1": "adversary",
        "adversary_2": "adversary",
        "agent_0": "agent",
    }
    assert s.topology.pools == s.topology.roles
    assert (role_of("speaker_0"), role_of("a_b_12"), role_of("solo")) == ("speaker", "a_b", "solo")


def first_steps(seed: int, steps: int = 3) -> tuple[list[np.ndarray], list[dict[str, float]]]:
    env = make(SPREAD, **KW)
    obs, _ = env.reset(seed=seed)
    seen, rewards = [np.concatenate([obs[a] for a in env.possible_agents])], []
    for t in range(steps):
        obs, r, *_ = env.step({a: (t + i) % 5 for i, a in enumerate(env.agents)})
        seen.append(np.concatenate([obs[a] for a in env.possible_agents]))
        rewards.append(r)
    return seen, rewards


def test_seeds_are_honoured() -> None:
    a, b, c = first_steps(7), first_steps(7), first_steps(8)
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0], strict=True))
    assert a[1] == b[1]
    assert not np.array_equal(a[0][0], c[0][0])


def test_global_state_is_the_env_state_and_reaches_infos() -> None:
    env = make(SPREAD, **KW)
    obs, _ = env.reset(seed=1)
    assert env.state_space.shape == (54,)
    for _ in range(3):  # mpe2's state is the agents' observations concatenated
        np.testing.assert_array_equal(
            env.state(), np.concatenate([obs[a] for a in env.possible_agents])
        )
        obs, *_ = env.step(dict.fromkeys(env.agents, 2))
    view = RLlibGraphEnv({"scenario": SPREAD, "kwargs": KW})
    obs, infos = view.reset(seed=2)
    np.testing.assert_array_equal(infos["agent_1"][STATE_INFO], view.state())
    obs, _, _, _, infos = view.step(dict.fromkeys(obs, 1))
    joined = np.concatenate([obs[a] for a in view.possible_agents])
    np.testing.assert_array_equal(infos["agent_0"][STATE_INFO], joined)
    quiet = RLlibGraphEnv({"scenario": SPREAD, "kwargs": KW, "global_state": False})
    _, infos = quiet.reset(seed=2)
    assert STATE_INFO not in infos["agent_0"]


@pytest.mark.parametrize("method", ["loo", "shapley"])
def test_counterfactual_credit_is_refused(method: str) -> None:
    cfg = ExperimentConfig(scenario=SPREAD, scenario_kwargs=KW, credit=method)
    with pytest.raises(CounterfactualCreditError, match="cannot replay an episode exactly"):
        resolve(cfg, ray_workers=False)
    with pytest.raises(ConfigError):  # the CLI turns it into exit code 2
        resolve(cfg, ray_workers=False)
    env = make(SPREAD, **KW)
    env.reset(seed=0)
    while env.agents:
        env.step(dict.fromkeys(env.agents, 0))
    with pytest.raises(ReplayUnavailable, match="credit 'team' or 'local'"):
        env.value(0, ["agent_0"], env.episode_actions())


@pytest.mark.parametrize("method", ["team", "local"])
def test_team_and_local_credit_resolve(method: str) -> None:
    plan = resolve(
        ExperimentConfig(scenario=SPREAD, scenario_kwargs=KW, credit=method), ray_workers=False
    )
    assert plan.agent_to_pool == dict.fromkeys(["agent_0", "agent_1", "agent_2"], "agent")


def world(raw: Any) -> tuple[float, int]:
    """Σ over landmarks of the nearest agent's distance, colliding agent pairs (by hand)."""
    agents, marks = raw.world.agents, raw.world.landmarks
    dist = sum(min(np.linalg.norm(a.state.p_pos - m.state.p_pos) for a in agents) for m in marks)
    pairs = sum(
        np.linalg.norm(a.state.p_pos - b.state.p_pos) < a.size + b.size
        for i, a in enumerate(agents)
        for b in agents[i + 1 :]
    )
    return float(dist), int(pairs)


def test_epymarl_team_return_matches_distances_and_collisions() -> None:
    """R_team = 2·Σ_i R_i − 75 equals −3ΣD − 2P − 75 from the world state, and our scenario's
    ``sum_return`` is mpe2's Σ_i R_i for the same seed and actions."""
    seed, rng = 5, np.random.default_rng(0)
    actions = [rng.integers(0, 5, size=3) for _ in range(25)]
    ours = make(SPREAD, **KW)
    ours.reset(seed=seed)
    raw = simple_spread_v3.parallel_env(**KW, continuous_actions=False)
    raw.reset(seed=env_seed(np.random.default_rng(seed)))
    total, dist, pairs = 0.0, 0.0, 0
    for joint in actions:
        acts = {f"agent_{i}": int(a) for i, a in enumerate(joint)}
        _, rewards, *_ = raw.step(acts)
        ours.step(acts)
        total += sum(rewards.values())
        d, p = world(raw.unwrapped)
        dist, pairs = dist + d, pairs + p
    assert pairs > 0 or dist > 0
    assert team_return(total) == pytest.approx(team_return_from_world(dist, pairs), abs=1e-6)
    assert ours.outcome.metrics["sum_return"] == pytest.approx(total, abs=1e-6)


TINY = """
scenario_kwargs: {N: 3, max_cycles: 25, local_ratio: 0.5}
algorithm: {train_batch_size: 150, minibatch_size: 75, num_epochs: 1}
resources: {num_envs_per_env_runner: 2}
output: {checkpoint_every: 0}
"""


def test_marl_run_trains_a_pettingzoo_reference(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(textwrap.dedent(TINY))
    out = tmp_path / "runs"
    args = [sys.executable, "-P", "-m", "trainers.cli", "run", SPREAD, "--config", str(config)]
    args += ["--iterations", "2", "--seed", "1", "--output", str(out), "--wandb", "disabled"]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1 and "simple_spread_v3" in runs[0].name, runs
