"""The batched sampler's episode recording against RLlib's, side by side in one runner.

One ``BatchedEnvRunner`` on the default experiment (delegate, ``star:3``, 16 envs) alternates
its ``sample()`` calls between RLlib's recording (``MultiAgentEpisode.add_env_reset`` /
``add_env_step``, RLlib's ``get_metrics`` and per-episode ``_log_episode_metrics``) and ours
(:mod:`trainers.sampling.episode_build`, ``BatchedEnvRunner.get_metrics`` and
``_log_episode_metrics``); both give the same episodes and metrics
(``tests/test_episode_build.py``). Process CPU seconds of
``sample()`` + ``get_metrics()`` per 1,000 env steps, medians, and the median of the paired
differences (machine load hits both alike).

Run: ``python bench/episode_recording.py [--calls 24] [--steps 1000]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")


def recorders(runner: Any) -> dict[str, tuple[Any, Any, Any, Any]]:
    """name → (reset, step, per-episode metric logging, ``get_metrics``) for ``runner``."""
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    from trainers.sampling import episode_build
    from trainers.sampling.batched_runner import BatchedEnvRunner

    def rllib_reset(episode: Any, observations: Any, infos: Any = None) -> None:
        episode.add_env_reset(observations=observations, infos=infos)

    def rllib_step(episode: Any, *args: Any, **kwargs: Any) -> None:
        episode.add_env_step(*args, **kwargs)

    return {
        "rllib": (
            rllib_reset,
            rllib_step,
            MultiAgentEnvRunner._log_episode_metrics.__get__(runner),
            MultiAgentEnvRunner.get_metrics.__get__(runner),
        ),
        "ours": (
            episode_build.add_env_reset,
            episode_build.add_env_step,
            BatchedEnvRunner._log_episode_metrics.__get__(runner),
            BatchedEnvRunner.get_metrics.__get__(runner),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=24, help="sample() calls per recording")
    parser.add_argument("--steps", type=int, default=1000, help="env steps per sample() call")
    args = parser.parse_args()

    import torch

    from trainers.algo import to_algorithm_config
    from trainers.configs.experiment import ExperimentConfig
    from trainers.sampling import batched_runner

    torch.set_num_threads(1)
    cfg = ExperimentConfig.from_dict(
        {"topology": "star:3", "resources": {"num_envs_per_env_runner": 16}}
    )
    runner = batched_runner.BatchedEnvRunner(config=to_algorithm_config(cfg), worker_index=0)
    runner.sample(num_timesteps=args.steps, explore=True)  # warm-up
    runner.get_metrics()
    ways = recorders(runner)
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.calls):
        for name, (reset, step, log, get_metrics) in ways.items():
            batched_runner.add_env_reset, batched_runner.add_env_step = reset, step
            runner._log_episode_metrics, runner.get_metrics = log, get_metrics
            start = time.process_time()
            episodes = runner.sample(num_timesteps=args.steps, explore=True)
            runner.get_metrics()
            steps = sum(e.env_steps() for e in episodes)
            cpu[name].append(1000 * (time.process_time() - start) / steps)
    runner.stop()
    med = {name: statistics.median(v) for name, v in cpu.items()}
    print("CPU seconds of sample() + get_metrics() per 1,000 env steps (median):")
    for name, v in med.items():
        print(f"  {name:<6} {v:.4f}  ×{med['rllib'] / v:.3f}")
    paired = statistics.median(a - b for a, b in zip(cpu["rllib"], cpu["ours"], strict=True))
    print(f"paired difference (rllib − ours): {paired:.4f} s per 1,000 env steps")


if __name__ == "__main__":
    main()
