"""The batched sampler's own cost, this tree against a git ref, side by side in one process.

The sampler's modules (:data:`MODULES`: the runner, episode recording, the per-episode metrics
callback and the monitors' per-episode terms) are loaded a second time as they are at
``--base`` (default ``main``), under other names; one ``BatchedEnvRunner`` of each is built on
the default experiment (delegate, ``star:3``, 16 envs, same seed, same weights) and their
``sample()`` + ``get_metrics()`` calls alternate (who goes first alternates too). Both sample
the same episodes (checked on every call: observations, actions, rewards, infos and extra model
outputs of every agent, and the metrics but wall-clock ones), so the env's own cost is the same
on both sides and the difference is the sampler's (``timers/sample_overhead_s`` plus the
forward's wrapper).

Prints process CPU seconds per 1,000 env steps (medians), the median of the paired
differences (machine load hits both alike) and the phase timers (wall seconds).

Run: ``python bench/sampler_overhead.py [--base main] [--calls 20] [--steps 1000]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Mapping
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

#: the modules loaded from ``--base`` (in import order); each is renamed in the others' imports
MODULES = (
    "trainers.sampling.episode_build",
    "trainers.signals.monitors",
    "trainers.signals.episode_metrics",
    "trainers.sampling.batched_runner",
)
#: metrics that are wall-clock readings (not compared)
WALL_CLOCK = re.compile(r"duration|throughput|timers|_s$|time|^/sample$")


def load_base(ref: str) -> dict[str, types.ModuleType]:
    """:data:`MODULES` as they are at git ``ref``, as fresh modules (``_base_…``)."""
    names = {m: "_base_" + m.replace(".", "_") for m in MODULES}
    out = {}
    for mod in MODULES:
        path = mod.replace(".", "/") + ".py"
        src = subprocess.run(
            ["git", "show", f"{ref}:{path}"], capture_output=True, text=True, check=True
        ).stdout
        for old, new in names.items():
            src = re.sub(rf"\b{re.escape(old)}\b", new, src)
        module = types.ModuleType(names[mod])
        module.__file__ = f"{ref}:{path}"
        sys.modules[names[mod]] = module
        exec(compile(src, module.__file__, "exec"), module.__dict__)
        out[mod] = module
    return out


def build(runner_mod: types.ModuleType, metrics_mod: types.ModuleType, algo_cfg: Any) -> Any:
    config = algo_cfg.copy(copy_frozen=False)
    config.callbacks(metrics_mod.EpisodeMetrics)
    return runner_mod.BatchedEnvRunner(config=config, worker_index=0)


def episode_data(episodes: list[Any]) -> list[Any]:
    """Everything of the episodes but ids and wall-clock stamps, for ``==`` after ``repr``."""
    import numpy as np

    out = []
    for e in episodes:
        for aid in sorted(e.agent_episodes):
            sa = e.agent_episodes[aid]
            row = [aid, sa.t_started, sa.t, sa.is_terminated, sa.is_truncated]
            for buf in (sa.observations, sa.actions, sa.rewards):
                data = np.asarray(buf.data)
                row.append((data.dtype.str, data.shape, data.tobytes()))
            row.append(repr(sa.infos.data))
            for k in sorted(sa.extra_model_outputs):
                data = np.asarray(sa.extra_model_outputs[k].data)
                row.append((k, data.dtype.str, data.shape, data.tobytes()))
            out.append(row)
    return out


def flat(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in metrics.items():
        key = f"{prefix}/{k}"
        if isinstance(v, Mapping):
            out.update(flat(v, key))
        elif not WALL_CLOCK.search(key):
            out[key] = repr(v)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="git ref of the baseline")
    parser.add_argument("--calls", type=int, default=20, help="sample() calls per side")
    parser.add_argument("--steps", type=int, default=1000, help="env steps per sample() call")
    parser.add_argument("--envs", type=int, default=16, help="envs per runner")
    args = parser.parse_args()

    import torch

    from scenarios.clocks import ENV_CLOCK
    from trainers.algo import to_algorithm_config
    from trainers.configs.experiment import ExperimentConfig
    from trainers.sampling import batched_runner
    from trainers.signals import episode_metrics
    from trainers.signals.phase_timers import FORWARD_CLOCK

    torch.set_num_threads(1)
    base = load_base(args.base)
    cfg = ExperimentConfig.from_dict(
        {"topology": "star:3", "resources": {"num_envs_per_env_runner": args.envs}}
    )
    algo_cfg = to_algorithm_config(cfg)
    runners = {
        "base": build(
            base["trainers.sampling.batched_runner"],
            base["trainers.signals.episode_metrics"],
            algo_cfg,
        ),
        "new": build(batched_runner, episode_metrics, algo_cfg),
    }
    runners["new"].module.set_state(runners["base"].module.get_state())
    cpu: dict[str, list[float]] = {name: [] for name in runners}
    wall: dict[str, dict[str, list[float]]] = {n: {"env": [], "forward": []} for n in runners}
    same = True
    for call in range(args.calls + 1):  # the first call warms up
        data = {}
        order = list(runners) if call % 2 else list(runners)[::-1]  # who goes first alternates
        for name in order:
            runner = runners[name]
            env0, fwd0 = ENV_CLOCK.seconds, FORWARD_CLOCK.seconds
            start = time.process_time()
            episodes = runner.sample(num_timesteps=args.steps, explore=True)
            metrics = runner.get_metrics()
            elapsed = time.process_time() - start
            steps = sum(e.env_steps() for e in episodes)
            data[name] = (episode_data(episodes), flat(metrics))
            if call:
                cpu[name].append(1000 * elapsed / steps)
                wall[name]["env"].append(1000 * (ENV_CLOCK.seconds - env0) / steps)
                wall[name]["forward"].append(1000 * (FORWARD_CLOCK.seconds - fwd0) / steps)
        if data["base"] != data["new"]:
            same = False
            print(f"call {call}: the two samplers' episodes or metrics differ")
    for runner in runners.values():
        runner.stop()
    med = {name: statistics.median(v) for name, v in cpu.items()}
    print(f"{args.calls} sample({args.steps}) calls each, {args.envs} envs; base = {args.base}")
    print("process CPU seconds of sample() + get_metrics() per 1,000 env steps (median):")
    for name, v in med.items():
        env, fwd = (statistics.median(wall[name][k]) for k in ("env", "forward"))
        ratio = med["base"] / v
        print(f"  {name:<5} {v:.4f}  ×{ratio:.3f}   (wall: env {env:.4f}, forward {fwd:.4f})")
    paired = statistics.median(a - b for a, b in zip(cpu["base"], cpu["new"], strict=True))
    print(f"paired difference (base − new): {paired:.4f} s per 1,000 env steps")
    print(f"identical episodes and metrics on every call: {same}")


if __name__ == "__main__":
    main()
