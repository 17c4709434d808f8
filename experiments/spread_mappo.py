"""simple_spread (mpe2, 3 agents, 25 steps, discrete, local ratio 0.5): IPPO and MAPPO learning
curves with greedy evaluation, in EPyMARL's team-return convention, next to published points.

Each run trains the experiment :func:`config` builds (the PettingZoo reference
``mpe2.simple_spread_v3:parallel_env``, one policy shared by the three agents, MAPPO's
published MPE hyperparameters where ours has the knob: lr 7e-4, 10 epochs on one minibatch of
3,200 env steps, entropy 0.01, γ 0.99, λ 0.95, a [64, 64] MLP, value normalisation) with the
algorithm that :func:`trainers.algo.to_algorithm_config` builds (the same as ``train()``'s, in
this process: no run directory, so the greedy evaluations need no checkpoints), and every
``--eval-every`` env steps plays ``--eval-episodes`` greedy episodes (argmax actions) on fixed
seeds (10,000 onwards). The greedy team return is ``2·Σ_i R_i − 75`` per episode
(:func:`experiments.epymarl.team_return`).

Run: ``python -m experiments.spread_mappo --algos IPPO MAPPO --seeds 0 1 2 3 4
--steps 500000`` (one JSON line per evaluation to ``--out``, default
``experiments/results/spread_mappo/curves.jsonl``); ``--report`` prints the table of the rows there.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

SPREAD = "mpe2.simple_spread_v3:parallel_env"
KW = {"N": 3, "max_cycles": 25, "local_ratio": 0.5, "continuous_actions": False}
OUT = Path(__file__).resolve().parent / "results" / "spread_mappo" / "curves.jsonl"
EVAL_SEED = 10_000
#: published points, EPyMARL's convention (see docs/results.md for the sources)
PUBLISHED = {
    "random": -230.0,
    "MAPPO-MLP 250k (figure)": -160.0,
    "MAPPO-MLP 500k (figure)": -145.0,
    "MAPPO-MLP 1M (figure)": -122.0,
    "EPyMARL MAPPO 20M": -133.5,
}


def config(algo: str, seed: int, steps: int) -> Any:
    """The experiment of one run (checked here, before anything trains)."""
    from trainers.configs.experiment import ExperimentConfig

    return ExperimentConfig.from_dict(
        {
            "scenario": SPREAD,
            "scenario_kwargs": KW,
            "sharing": "team",
            "seed": seed,
            "pools": {"team": {"model": {"type": "mlp", "hidden": [64, 64]}}},
            "algorithm": {
                "name": algo,
                "lr": 7e-4,
                "num_epochs": 10,
                "train_batch_size": 3200,
                "minibatch_size": 3200,
                "entropy_coeff": 0.01,
                "gamma": 0.99,
                "gae_lambda": 0.95,
            },
            "resources": {"num_envs_per_env_runner": 8},
            "budget": {"iterations": None, "env_steps": steps},
            "logging": {"wandb": "disabled", "progress": False},
            "output": {"checkpoint_every": 0, "plot": False, "transcripts": 0},
        }
    )


def greedy_returns(algo: Any, plan: Any, episodes: int) -> list[float]:
    """Σ_i R_i of ``episodes`` greedy episodes on seeds ``EVAL_SEED…``."""
    import torch
    from ray.rllib.core.columns import Columns

    env = plan.env.replace(global_state=False).make_env()
    modules = {pid: algo.get_module(pid) for pid in plan.pools}
    sums = []
    for k in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED + k)
        total = 0.0
        while env.agents:
            actions = {}
            for agent, ob in obs.items():
                module = modules[plan.agent_to_pool[agent]]
                with torch.no_grad():
                    batch = {Columns.OBS: torch.as_tensor(np.asarray(ob, np.float32))[None]}
                    logits = module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS]
                actions[agent] = int(logits.argmax(-1)[0])
            obs, rewards, *_ = env.step(actions)
            total += float(sum(rewards.values()))
        sums.append(total)
    env.close()
    return sums


def run(algo_name: str, seed: int, steps: int, every: int, episodes: int, out: Path) -> None:
    """Train one run to ``steps`` env steps, evaluating greedily every ``every``."""
    from experiments.epymarl import team_return
    from trainers.algo import to_algorithm_config
    from trainers.plan import resolve

    cfg = config(algo_name, seed, steps)
    plan = resolve(cfg)
    algo = to_algorithm_config(cfg, plan).build_algo()
    done, next_eval, start = 0, 0, time.perf_counter()
    try:
        while True:
            if done >= next_eval:
                sums = greedy_returns(algo, plan, episodes)
                row = {
                    "algo": algo_name,
                    "seed": seed,
                    "env_steps": done,
                    "team_return": float(np.mean([team_return(s) for s in sums])),
                    "wall_s": time.perf_counter() - start,
                }
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(row, flush=True)
                next_eval += every
            if done >= steps:
                return
            result = algo.train()
            done = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
    finally:
        algo.stop()


def report(out: Path) -> None:
    """Mean (min, max over seeds) greedy team return at each evaluation point, per algorithm."""
    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    by: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        point = int(round(r["env_steps"] / 25_000) * 25_000)
        by.setdefault((r["algo"], point), []).append(r["team_return"])
    print(f"{'algo':<6} {'env steps':>9}  {'mean':>7}  {'min':>7}  {'max':>7}  seeds")
    for (algo, point), vals in sorted(by.items()):
        print(
            f"{algo:<6} {point:>9}  {np.mean(vals):7.1f}  {min(vals):7.1f}  {max(vals):7.1f}"
            f"  {len(vals)}"
        )
    print("published:", ", ".join(f"{k} {v}" for k, v in PUBLISHED.items()))


def plot(out: Path, png: Path) -> Path:
    """Greedy team return against env steps, one line per algorithm (mean over seeds), with the
    published points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for algo in sorted({r["algo"] for r in rows}):
        by: dict[int, list[float]] = {}
        for r in rows:
            if r["algo"] == algo:
                by.setdefault(int(round(r["env_steps"] / 25_000) * 25_000), []).append(
                    r["team_return"]
                )
        xs = sorted(by)
        seeds = len({r["seed"] for r in rows if r["algo"] == algo})
        label = f"ours {algo} ({seeds} seed{'s' if seeds > 1 else ''})"
        ax.plot(xs, [np.mean(by[x]) for x in xs], marker=".", label=label)
    points = [(250_000, -160.0), (500_000, -145.0)]
    ax.scatter(*zip(*points, strict=True), color="k", zorder=3, label="MAPPO-MLP (figure)")
    ax.axhline(-230.0, color="grey", ls=":", label="random")
    ax.set_xlabel("env steps")
    ax.set_ylabel("greedy team return (EPyMARL)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    return png


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algos", nargs="+", default=["IPPO", "MAPPO"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=500_000)
    p.add_argument("--eval-every", type=int, default=25_000)
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--report", action="store_true", help="print the table of --out and exit")
    p.add_argument("--plot", type=Path, help="with --report: also write the curve PNG here")
    args = p.parse_args()
    if args.report:
        report(args.out)
        if args.plot:
            print("wrote", plot(args.out, args.plot))
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import ray

    for algo in args.algos:  # config errors before anything trains
        config(algo, args.seeds[0], args.steps).check()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for seed in args.seeds:
        for algo in args.algos:
            run(algo, seed, args.steps, args.eval_every, args.eval_episodes, args.out)
    report(args.out)


if __name__ == "__main__":
    main()
