"""Env steps/s of ``trainers.run.loop.train()`` against the fastest hand-written plain RLlib PPO
config.

Same environment (``RLlibGraphEnv`` on ``delegate``, ``star:3``), same pools (orchestrator,
shared worker), same network sizes and PPO hyperparameters. The plain config is written here
directly against RLlib, with no code from ``trainers`` or ``marl_agents``; its
``num_envs_per_env_runner`` is searched first (the knob that matters on a small CPU box), then
the best plain config and ``train()`` with *our defaults* (per-episode outcome metrics, JSONL,
wandb offline, a periodic checkpoint) alternate for a few rounds so machine load hits both
alike. Throughput is measured between the end of the first iteration and the end of the last
one (build and warm-up excluded; everything ``train()`` does between iterations included).

Each side runs on both env engines (``episodes.engine``): ``langgraph`` (GraphEnv through
LangGraph's runtime, the baseline) and ``fast`` (the stepped fast path, the default ``auto``
here), so the gain of the fast env path shows for plain RLlib and for ``train()`` alike; and
``train()`` on the fast env runs once more with RLlib's sampler (``episodes.sampler: rllib``),
so the batched sampler's own gain shows too. Every row is reported against the best plain
RLlib configuration on LangGraph (the issue's baseline).

Run: ``python bench/trainer_overhead.py [--iterations 12] [--rounds 3] [--envs 1,4,8,16,32]``.
Goals: ``train()`` ≥ 3× the best plain RLlib PPO configuration.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

ENV_CONFIG = {"scenario": "delegate", "topology": "star:3", "kwargs": {}}
POOLS = {"orchestrator": ["orchestrator"], "worker": ["worker_0", "worker_1", "worker_2"]}


ROWS = {
    "plain": "plain RLlib, LangGraph env (baseline)",
    "plain_same": "plain RLlib at our num_envs, LangGraph env",
    "ours": "train(), LangGraph env, RLlib sampler",
    "plain_fast": "plain RLlib, fast env",
    "ours_fast_rllib": "train(), fast env, RLlib sampler",
    "ours_fast": "train() defaults (fast env, batched sampler)",
}


def plain_config(num_envs: int, engine: str = "langgraph") -> Any:
    """The hand-written RLlib PPO config (new API stack) for the same experiment."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from marl_agents.pools import MLPModel
    from scenarios.rllib_env import RLlibGraphEnv
    from trainers.configs.algorithms import PPOAlgo

    a, m = PPOAlgo(), MLPModel()  # the same numbers as our defaults
    model = DefaultModelConfig(
        fcnet_hiddens=m.hidden,
        fcnet_activation=m.activation,
        head_fcnet_hiddens=[],
        vf_share_layers=False,
    )
    return (
        PPOConfig()
        .environment(RLlibGraphEnv, env_config={**ENV_CONFIG, "engine": engine})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs)
        .multi_agent(
            policies=set(POOLS),
            policy_mapping_fn=lambda aid, ep, **kw: (
                "orchestrator" if aid == "orchestrator" else "worker"
            ),
            policies_to_train=list(POOLS),
        )
        .rl_module(
            rl_module_spec=MultiRLModuleSpec(
                rl_module_specs={p: RLModuleSpec(model_config=model) for p in POOLS}
            )
        )
        .training(
            lr=a.lr,
            gamma=a.gamma,
            lambda_=a.gae_lambda,
            train_batch_size_per_learner=a.train_batch_size,
            minibatch_size=a.minibatch_size,
            num_epochs=a.num_epochs,
            entropy_coeff=a.entropy_coeff,
            clip_param=a.clip_param,
            vf_loss_coeff=a.vf_loss_coeff,
            vf_clip_param=10.0,
        )
        .debugging(seed=0, log_level="ERROR")
    )


def steps_per_s(marks: list[tuple[float, int]]) -> float:
    """Throughput between the first and the last ``(time, lifetime env steps)`` mark."""
    (t0, s0), (t1, s1) = marks[0], marks[-1]
    return (s1 - s0) / (t1 - t0)


def run_plain(num_envs: int, iterations: int, engine: str = "langgraph") -> float:
    algo = plain_config(num_envs, engine).build_algo()
    marks = []
    try:
        for _ in range(iterations):
            result = algo.train()
            marks.append((time.perf_counter(), int(result["num_env_steps_sampled_lifetime"])))
    finally:
        algo.stop()
    return steps_per_s(marks)


def run_ours(iterations: int, out: str, engine: str = "langgraph", sampler: str = "auto") -> float:
    from trainers.configs.experiment import ExperimentConfig
    from trainers.run.loop import train

    cfg = ExperimentConfig.from_dict(
        {
            "topology": ENV_CONFIG["topology"],
            "budget": {"iterations": iterations},
            "logging": {"progress": False},  # our default wandb=offline stays on
            "output": {"dir": out},
            "episodes": {"engine": engine, "sampler": sampler},
        }
    )
    marks: list[tuple[float, int]] = []
    rows: list[dict[str, Any]] = []

    def report(row: dict[str, Any]) -> None:
        marks.append((time.perf_counter(), row["charts/env_steps"]))
        rows.append(row)

    train(cfg, report=report)
    PHASES.setdefault((engine, sampler), []).append(phases_per_1000_steps(rows))
    return steps_per_s(marks)


#: (engine, sampler) of a ``train()`` row → its runs' phase seconds per 1,000 env steps
PHASES: dict[tuple[str, str], list[dict[str, float]]] = {}


def phases_per_1000_steps(rows: list[dict[str, Any]]) -> dict[str, float]:
    """``timers/…`` and the iteration's wall time, summed over the measured iterations (the
    first one excluded, as for the throughput), per 1,000 env steps."""
    from trainers.signals.phase_timers import TIMER_KEYS

    steps = rows[-1]["charts/env_steps"] - rows[0]["charts/env_steps"]
    keys = (*TIMER_KEYS, "charts/iteration_s")
    return {k: 1000 * sum(float(r.get(k, 0.0)) for r in rows[1:]) / steps for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=12, help="iterations per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--envs", default="1,4,8,16,32", help="plain num_envs_per_env_runner grid")
    args = parser.parse_args()

    import logging

    import ray
    import torch

    from trainers.configs.experiment import ResourcesConfig
    from trainers.run.process import quiet_ray_logs

    torch.set_num_threads(1)
    quiet_ray_logs()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    search_iters = max(4, args.iterations // 2)
    grid = [int(x) for x in args.envs.split(",")]
    found = {grid[0]: 0.0}
    if len(grid) > 1:  # one value: no search
        print(f"plain PPO, num_envs_per_env_runner search ({search_iters} iterations each):")
        for n in grid:
            found[n] = run_plain(n, search_iters)
            print(f"  num_envs={n:>2}: {found[n]:7.1f} env steps/s", flush=True)
    best = max(found, key=found.__getitem__)
    ours_envs = ResourcesConfig().num_envs_per_env_runner
    print(f"best plain: num_envs={best}; our default: num_envs={ours_envs}")
    rows: dict[str, list[float]] = {k: [] for k in ROWS}
    with tempfile.TemporaryDirectory() as out:
        for r in range(args.rounds):
            rows["plain"].append(run_plain(best, args.iterations))
            if best != ours_envs:  # the same settings as ours: isolates train()'s overhead
                rows["plain_same"].append(run_plain(ours_envs, args.iterations))
            rows["ours"].append(run_ours(args.iterations, out, "langgraph", "rllib"))
            rows["plain_fast"].append(run_plain(best, args.iterations, "fast"))
            rows["ours_fast_rllib"].append(run_ours(args.iterations, out, "fast", "rllib"))
            rows["ours_fast"].append(run_ours(args.iterations, out, "fast"))
            line = "  ".join(f"{ROWS[k]} {v[-1]:.0f}" for k, v in rows.items() if v)
            print(f"  round {r + 1}: {line} env steps/s", flush=True)
    med = {k: statistics.median(v) for k, v in rows.items() if v}
    base = med["plain"]
    print(f"median env steps/s, and ratio to best plain RLlib (num_envs={best}, langgraph env):")
    for k, v in med.items():
        print(f"  {ROWS[k]:<44} {v:7.1f}  ×{v / base:.2f}")
    if "plain_same" in med:
        own = med["ours"] / med["plain_same"]
        print(f"train()'s own overhead (langgraph env, RLlib sampler, same num_envs): ×{own:.3f}")
    fast_plain, fast_ours = med["plain_fast"] / base, med["ours_fast_rllib"] / med["ours"]
    print(f"gain of the fast env: plain ×{fast_plain:.2f}, train() ×{fast_ours:.2f}")
    print("train()'s phases, seconds per 1,000 env steps (median over rounds; timers/… rows):")
    for (engine, sampler), runs in PHASES.items():
        line = "  ".join(
            f"{k.split('/')[-1]} {statistics.median(r[k] for r in runs):.3f}" for k in runs[0]
        )
        print(f"  {engine}/{sampler}: {line}")
    batched = med["ours_fast"] / med["ours_fast_rllib"]
    print(f"gain of the batched sampler (fast env): ×{batched:.2f}")
    print(f"goal: train() / best plain RLlib = ×{med['ours_fast'] / base:.2f} (≥ 3)")
    ray.shutdown()


if __name__ == "__main__":
    main()
