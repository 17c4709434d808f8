"""Env steps/s of ``trainers.train()`` against the fastest hand-written plain RLlib PPO config.

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
here), so the gain of the fast env path shows for plain RLlib and for ``train()`` alike.

Run: ``python bench/trainer_overhead.py [--iterations 12] [--rounds 3] [--envs 1,4,8,16,32]``.
Goals: ratio ≥ 0.9; ``train()`` fast/langgraph as large as the env share of the wall time allows.
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


def plain_config(num_envs: int, engine: str = "langgraph") -> Any:
    """The hand-written RLlib PPO config (new API stack) for the same experiment."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from marl_agents.pools import MLPModel
    from scenarios.rllib_env import RLlibGraphEnv
    from trainers.config import PPOAlgo

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


def run_ours(iterations: int, out: str, engine: str = "langgraph") -> float:
    from trainers.config import ExperimentConfig
    from trainers.run import train

    cfg = ExperimentConfig.from_dict(
        {
            "topology": ENV_CONFIG["topology"],
            "budget": {"iterations": iterations},
            "logging": {"progress": False},  # our default wandb=offline stays on
            "output": {"dir": out},
            "episodes": {"engine": engine},
        }
    )
    marks: list[tuple[float, int]] = []
    train(cfg, report=lambda row: marks.append((time.perf_counter(), row["charts/env_steps"])))
    return steps_per_s(marks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=12, help="iterations per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--envs", default="1,4,8,16,32", help="plain num_envs_per_env_runner grid")
    args = parser.parse_args()

    import logging

    import ray
    import torch

    from trainers.config import ResourcesConfig
    from trainers.run import quiet_ray_logs

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
    plain, same, ours, plain_fast, ours_fast = [], [], [], [], []
    with tempfile.TemporaryDirectory() as out:
        for r in range(args.rounds):
            plain.append(run_plain(best, args.iterations))
            line = f"  round {r + 1}: plain(num_envs={best}) {plain[-1]:7.1f}"
            if best != ours_envs:  # the same settings as ours: isolates train()'s overhead
                same.append(run_plain(ours_envs, args.iterations))
                line += f"  plain(num_envs={ours_envs}) {same[-1]:7.1f}"
            ours.append(run_ours(args.iterations, out))
            plain_fast.append(run_plain(best, args.iterations, "fast"))
            ours_fast.append(run_ours(args.iterations, out, "fast"))
            print(
                f"{line}  train() {ours[-1]:7.1f}  | fast env: plain {plain_fast[-1]:7.1f}  "
                f"train() {ours_fast[-1]:7.1f} env steps/s",
                flush=True,
            )
    p, o = statistics.median(plain), statistics.median(ours)
    pf, of = statistics.median(plain_fast), statistics.median(ours_fast)
    print(f"median (langgraph env): best plain {p:.1f}, train() {o:.1f} env steps/s")
    print(f"median (fast env):      best plain {pf:.1f}, train() {of:.1f} env steps/s")
    print(f"ratio train()/best plain = {o / p:.3f} (goal ≥ 0.9)")
    if same:
        q = statistics.median(same)
        print(f"ratio train()/plain at our settings = {o / q:.3f} (train()'s own overhead)")
    print(f"ratio train() fast/langgraph env = {of / o:.3f}; plain RLlib: {pf / p:.3f}")
    print(f"ratio train() on the fast env / best plain RLlib (langgraph env) = {of / p:.3f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
