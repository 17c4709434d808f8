"""A peer on the same machine: BenchMARL's MAPPO and our ``train()`` on mpe2 simple_spread.

Both sides train on ``simple_spread_v3`` (3 agents, ``max_cycles=25``, ``local_ratio=0.5``,
discrete actions) for the same env-step budget and seeds, one after the other in this one
invocation, then play ``--episodes`` greedy episodes; printed for each: the greedy team return
in EPyMARL's convention (``experiments.epymarl.team_return``: ``2·Σ_i R_i − 75``), env steps
trained and env steps/s (training wall clock, environment plus learning, startup excluded where
the library reports it). mpe2 stepped alone with random actions is printed as the ceiling.

* **BenchMARL** (PyPI ``benchmarl==1.5.2``, never a project dependency) runs in its own venv
  ``.venv-benchmarl`` (gitignored), created on first use: the CPU ``torch==2.13.0`` first, then
  BenchMARL pinned next to it (else its torchvision pulls a CUDA torch) and
  ``pettingzoo[mpe]==1.24.3`` (torchrl 0.11 imports MPE from ``pettingzoo.mpe``, which later
  PettingZoo releases moved into mpe2, forked from it). Its ``PettingZooTask.SIMPLE_SPREAD``
  is set to ``max_cycles=25`` (its default is
  100); its MAPPO, MLP actor and critic and experiment defaults are kept, except the frames per
  batch (``--batch``, default 6,000 as BenchMARL's) and CPU devices; evaluation is ours:
  deterministic actions, summed over agents and steps per episode.
* **Ours**: ``train()`` on the scenario reference ``mpe2.simple_spread_v3:parallel_env``
  (:mod:`scenarios.pettingzoo_env`), IPPO (``--algo ippo``) or MAPPO (``--algo mappo``: the
  centralised critic reads mpe2's ``state()``) with one shared policy, then
  :func:`trainers.evaluate.evaluate` (greedy).

Measured on the shared 2-core box (2026-11-27, seed 0, ``--algo mappo``): at 100k env steps
in one invocation (both niced, other jobs running) BenchMARL −212.8 greedy at 106 env steps/s,
ours −180.1 at 444 env steps/s (×4.2; mpe2 alone 1,277); at 500k (``--skip-ours``) BenchMARL
−193.5 at 200 env steps/s, where our 5-seed experiment (``experiments.spread_mappo``) gives
−200.1 (−233.5…−180.9) at 640–1,340 env steps/s (docs/results.md). Seeds 1 and 2 (2026-11-28,
``--skip-ours``, niced beside other jobs): −192.5 and −199.9 at 504k.

Run: ``python bench/benchmarl_spread.py --steps 20000 --seeds 0`` (from the repo root, with the
project's venv). ``--skip-peer`` / ``--skip-ours`` run one side. Each seed's row is printed as
soon as it ends (``--out FILE`` also appends it as JSON), so a stopped bench keeps its finished
seeds; the summary per side follows the last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-benchmarl"
#: torchrl 0.11 reads MPE from pettingzoo.mpe, which pettingzoo 1.25+ moved to mpe2: 1.24.3 has it
PEER_PINS = ["torch==2.13.0", "benchmarl==1.5.2", "pettingzoo[mpe]==1.24.3"]
KW = {"N": 3, "max_cycles": 25, "local_ratio": 0.5, "continuous_actions": False}
SPREAD = "mpe2.simple_spread_v3:parallel_env"


def ensure_venv() -> Path:
    """The peer venv's python, created and installed on first use."""
    py = VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU build, before anything
        subprocess.run([*pip, *PEER_PINS], check=True)
    return py


# ----- the peer (runs inside .venv-benchmarl) ------------------------------------------------
def peer(steps: int, seed: int, episodes: int, batch: int) -> dict[str, float]:
    """BenchMARL MAPPO on simple_spread: train ``steps`` frames, then greedy episodes."""
    import torch
    from benchmarl.algorithms import MappoConfig
    from benchmarl.environments import PettingZooTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    torch.set_num_threads(1)
    task = PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
    task.config.update({k: v for k, v in KW.items() if k != "continuous_actions"})
    cfg = ExperimentConfig.get_from_yaml()
    cfg.max_n_frames = steps
    cfg.on_policy_collected_frames_per_batch = batch
    cfg.loggers, cfg.create_json, cfg.evaluation, cfg.render = [], False, False, False
    cfg.checkpoint_interval, cfg.checkpoint_at_end = 0, False
    cfg.train_device = cfg.sampling_device = cfg.buffer_device = "cpu"
    cfg.prefer_continuous_actions = False
    cfg.save_folder = str(Path("/tmp") / f"benchmarl_{os.getpid()}")
    Path(cfg.save_folder).mkdir(exist_ok=True)
    exp = Experiment(
        task=task,
        algorithm_config=MappoConfig.get_from_yaml(),
        model_config=MlpConfig.get_from_yaml(),
        critic_model_config=MlpConfig.get_from_yaml(),
        seed=seed,
        config=cfg,
    )
    start = time.perf_counter()
    exp.run()
    seconds = time.perf_counter() - start
    env = exp.test_env
    sums = []
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        while len(sums) < episodes:
            td = env.rollout(
                max_steps=KW["max_cycles"],
                policy=exp.policy,
                auto_cast_to_device=True,
                break_when_any_done=False,
            )
            reward = td.get(("next", "agent", "reward"))  # [envs, steps, agents, 1]
            sums.extend(reward.sum(dim=(-3, -2, -1)).reshape(-1).tolist())
    frames = int(exp.total_frames)
    return {"sum_returns": sums[:episodes], "env_steps": frames, "train_s": seconds}


# ----- ours --------------------------------------------------------------------------------
def our_config(steps: int, seed: int, algo: str = "ippo") -> Any:
    """Our experiment: IPPO or MAPPO with one shared policy on the PettingZoo reference
    (checked)."""
    from trainers.configs.experiment import ExperimentConfig
    from trainers.plan import resolve

    cfg = ExperimentConfig.from_dict(
        {
            "scenario": SPREAD,
            "scenario_kwargs": KW,
            "sharing": "team",
            "algorithm": {"name": algo.upper()},
            "seed": seed,
            "budget": {"iterations": None, "env_steps": steps},
            "output": {"dir": "/tmp/benchmarl_spread_runs", "checkpoint_every": 0, "plot": False},
            "logging": {"wandb": "disabled", "progress": False},
        }
    )
    resolve(cfg, ray_workers=False)  # config errors now, before the peer's minutes
    return cfg


def ours(steps: int, seed: int, episodes: int, algo: str) -> dict[str, float]:
    """``train()`` on the PettingZoo reference (IPPO or MAPPO, shared policy), then greedy
    episodes."""
    from trainers.evaluate import evaluate
    from trainers.run.loop import train

    cfg = our_config(steps, seed, algo)
    result = train(cfg)
    if result.status != "completed":
        raise SystemExit(f"our run failed: {result.status}")
    final = result.history[-1]
    ev = evaluate(result.run_dir, episodes=episodes, show=False)
    sums = [e["metrics"]["sum_return"] for e in ev.episodes]
    return {
        "sum_returns": sums,
        "env_steps": int(final["charts/env_steps"]),
        "train_s": float(final["charts/time_s"]),
    }


def mpe2_ceiling(steps: int = 20_000) -> float:
    """Env steps/s of mpe2 simple_spread alone, random actions (resets included)."""
    import numpy as np
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(**KW)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        if not env.agents:
            env.reset()
        env.step({a: int(rng.integers(5)) for a in env.agents})
    return steps / (time.perf_counter() - start)


def line(name: str, rows: list[dict[str, float]]) -> str:
    import numpy as np

    from experiments.epymarl import team_return

    team = [team_return(s) for r in rows for s in r["sum_returns"]]
    per_seed = [float(np.mean([team_return(s) for s in r["sum_returns"]])) for r in rows]
    sps = [r["env_steps"] / r["train_s"] for r in rows]
    return (
        f"{name:<22} greedy R_team {np.mean(team):8.1f}"
        f" (per seed {', '.join(f'{x:.1f}' for x in per_seed)})"
        f"   env steps {int(np.mean([r['env_steps'] for r in rows])):>8}"
        f"   env steps/s {np.mean(sps):8.0f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20_000, help="env steps per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--episodes", type=int, default=20, help="greedy episodes per run")
    p.add_argument("--batch", type=int, default=6000, help="BenchMARL frames per batch")
    p.add_argument("--algo", default="ippo", choices=["ippo", "mappo"], help="our algorithm")
    p.add_argument("--out", help="append each finished seed's row (JSON) to this file")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--skip-ours", action="store_true")
    p.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)  # inside the venv
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.peer:
        print(json.dumps(peer(args.steps, args.seeds[0], args.episodes, args.batch)))
        return
    if not args.skip_ours:
        our_config(args.steps, args.seeds[0], args.algo)
    print(f"mpe2 simple_spread alone, random actions: {mpe2_ceiling():.0f} env steps/s", flush=True)
    results: dict[str, list[dict[str, float]]] = {}

    def done(name: str, seed: int, row: dict[str, float]) -> None:
        """Print (and with ``--out`` append) a seed's row as soon as it ends: stopping the
        bench later loses no finished seed."""
        results.setdefault(name, []).append(row)
        print(f"seed {seed}: {line(name, [row])}", flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps({"side": name, "seed": seed, "steps": args.steps, **row}) + "\n")

    if not args.skip_peer:
        py = ensure_venv()
        for seed in args.seeds:
            cmd = [str(py), __file__, "--peer", "--steps", str(args.steps), "--seeds", str(seed)]
            cmd += ["--episodes", str(args.episodes), "--batch", str(args.batch)]
            # the peer's stderr (progress, errors) goes straight to ours; its last stdout line
            # is its row
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            done("BenchMARL MAPPO", seed, json.loads(out.strip().splitlines()[-1]))
    if not args.skip_ours:
        for seed in args.seeds:
            row = ours(args.steps, seed, args.episodes, args.algo)
            done(f"ours {args.algo.upper()}", seed, row)
    print(f"simple_spread (N=3, 25 steps, local_ratio 0.5), budget {args.steps} env steps:")
    for name, rows in results.items():
        print(line(name, rows))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's packages, not another editable install's
    main()
