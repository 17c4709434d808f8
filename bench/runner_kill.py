"""Time lost to a killed env runner: ``train()`` with one remote env runner, clean against a run
whose runner is ``SIGKILL``-ed after iteration ``--kill-at``.

Both runs use the same config and seed (delegate ``star:2``, ``num_env_runners: 1``) and run
``--iterations`` iterations; RLlib takes the dead runner out of service, restarts it
(``trainers.algo.FAULT_TOLERANCE``) and the iterations meanwhile sample nothing. Printed:
iterations/s and env steps/s of each run over the iterations after the kill (the clean run
over the same iterations), their ratios, how many iterations sampled nothing and the seconds
from the kill until the first iteration that sampled again.

Run: ``python bench/runner_kill.py [--iterations 12] [--kill-at 3]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")


def config(out: str, iterations: int) -> Any:
    from trainers.configs.experiment import ExperimentConfig

    return ExperimentConfig.from_dict(
        {
            "topology": "star:2",
            "algorithm": {"train_batch_size": 256, "minibatch_size": 128, "num_epochs": 1},
            "budget": {"iterations": iterations},
            "resources": {"num_env_runners": 1, "num_envs_per_env_runner": 4},
            "logging": {"wandb": "disabled", "progress": False},
            "output": {"dir": out, "checkpoint_every": 0, "plot": False, "transcripts": 0},
        }
    )


def runner_pids() -> list[int]:
    from ray._private import state

    return [
        int(a["Pid"])
        for a in state.actors().values()
        if a["State"] == "ALIVE" and "EnvRunner" in a["ActorClassName"]
    ]


def run(iterations: int, kill_at: int | None) -> dict[str, Any]:
    """One run; per-iteration end times (monotonic) and env steps."""
    from trainers.run.loop import train

    ends: list[float] = []
    killed_at: list[float] = []

    def report(row: dict[str, Any]) -> None:
        ends.append(time.monotonic())
        if row["charts/iteration"] == kill_at:
            for pid in runner_pids():
                os.kill(pid, signal.SIGKILL)
            killed_at.append(time.monotonic())

    with tempfile.TemporaryDirectory() as out:
        result = train(config(out, iterations), report=report)
    return {
        "ends": ends,
        "steps": [h["charts/env_steps"] for h in result.history],
        "episodes": [h.get("charts/episodes", 0) for h in result.history],
        "killed_at": killed_at[0] if killed_at else None,
    }


def window(r: dict[str, Any], start: int) -> tuple[float, float]:
    """(iterations/s, env steps/s) from the end of iteration ``start`` to the last."""
    dt = r["ends"][-1] - r["ends"][start - 1]
    its = len(r["ends"]) - start
    return its / dt, (r["steps"][-1] - r["steps"][start - 1]) / dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--kill-at", type=int, default=3)
    args = p.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    clean = run(args.iterations, None)
    killed = run(args.iterations, args.kill_at)
    ray.shutdown()
    (c_its, c_steps), (k_its, k_steps) = (window(r, args.kill_at) for r in (clean, killed))
    after = list(range(args.kill_at, args.iterations))
    empty = [i + 1 for i in after if killed["episodes"][i] == 0]
    back = next((i for i in after if killed["episodes"][i] > 0), None)
    recovery = killed["ends"][back] - killed["killed_at"] if back is not None else float("nan")
    print(f"iterations {args.iterations}, runner killed after iteration {args.kill_at}")
    print(f"clean : {c_its:.2f} it/s, {c_steps:.0f} env steps/s (same iterations)")
    print(f"killed: {k_its:.2f} it/s, {k_steps:.0f} env steps/s")
    print(f"ratio killed/clean: {k_its / c_its:.2f} it/s, {k_steps / c_steps:.2f} env steps/s")
    print(f"iterations that sampled nothing: {empty}")
    print(f"sampling again {recovery:.1f} s after the kill")


if __name__ == "__main__":
    main()
