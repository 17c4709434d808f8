"""CPU seconds per 1,000 env steps of ``RLlibGraphEnv`` (the view the trainer steps), and a
digest of every observation, reward, flag and info, for this checkout against another one.

Each case plays fixed seeds with a fixed stream of random actions (int64 arrays, as the
batched sampler hands them over) in the main thread, the wall-clock limit on, as the trainer's
local env runner does. ``time.process_time()`` is measured (the machine is shared: wall time is
noisy). With ``--against DIR`` the same measurement runs in subprocesses alternately on this
checkout and on ``DIR`` (``PYTHONPATH`` set to each), several rounds, and the medians and their
ratio are printed, with whether the digests agree (the episodes must be bit-identical).

Usage (from the checkout's root): ``python bench/env_step_cpu.py [--steps 3000] [--rounds 5]
[--cases delegate:star:3,...] [--against /path/to/main]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

CASES = [("delegate", "star:3"), ("delegate", "star:8"), ("relay", "chain:4"), ("spread", "mesh:3")]


def _digest(h: Any, value: Any) -> None:
    """Feed ``value`` to ``h`` exactly (arrays by dtype, shape and bytes)."""
    if isinstance(value, np.ndarray):
        h.update(f"{value.dtype}{value.shape}".encode())
        h.update(value.tobytes())
    elif isinstance(value, dict):
        for k in value:
            h.update(repr(k).encode())
            _digest(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for v in value:
            _digest(h, v)
        h.update(b"]")
    else:
        h.update(pickle.dumps(value))


def _action(rng: np.random.Generator, space: Any) -> np.ndarray:
    """A random action as the sampler hands it over (a numpy array)."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.MultiDiscrete):
        return rng.integers(space.nvec)
    if isinstance(space, gym.spaces.Discrete):
        return np.asarray(rng.integers(space.n) + space.start)
    return rng.uniform(space.low, space.high).astype(space.dtype)


def measure(name: str, topology: str, steps: int) -> tuple[float, str]:
    """CPU seconds per 1,000 env steps over ``steps`` steps, and the digest of the run."""
    from scenarios.rllib_env import RLlibGraphEnv

    env = RLlibGraphEnv({"scenario": name, "topology": topology, "seed_once": True})
    env.env.engine = "fast"
    rng = np.random.default_rng(0)
    spaces = env.action_spaces
    h = hashlib.sha256()
    obs, infos = env.reset(seed=0)
    cpu = 0.0  # in reset/step only (not the actions, not the digest)
    for _ in range(steps):
        actions = {a: _action(rng, spaces[a]) for a in obs}
        start = time.process_time()
        out = env.step(actions)
        cpu += time.process_time() - start
        for part in out:
            _digest(h, part)
        obs = out[0]
        if out[2]["__all__"] or out[3]["__all__"]:
            start = time.process_time()
            obs, infos = env.reset()
            cpu += time.process_time() - start
            _digest(h, (obs, infos))
    env.close()
    return 1000 * cpu / steps, h.hexdigest()[:16]


def worker(steps: int, cases: list[tuple[str, str]]) -> None:
    out = {f"{n} {t}": measure(n, t, steps) for n, t in cases}
    print(json.dumps(out))


def against(other: str, steps: int, rounds: int, cases: str) -> None:
    here = os.getcwd()
    runs: dict[str, dict[str, list[float]]] = {"this": {}, "other": {}}
    digests: dict[str, dict[str, set[str]]] = {"this": {}, "other": {}}
    for r in range(rounds):
        order = [("this", here), ("other", other)]
        for label, path in order if r % 2 == 0 else order[::-1]:
            env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--steps", str(steps)]
            cmd += ["--cases", cases]
            res = subprocess.run(cmd, env=env, cwd=path, capture_output=True, text=True, check=True)
            for case, (cpu, dig) in json.loads(res.stdout.strip().splitlines()[-1]).items():
                runs[label].setdefault(case, []).append(cpu)
                digests[label].setdefault(case, set()).add(dig)
    head = ("case", "other s/1k", "this s/1k", "saved s/1k", "this/other")
    print(f"{head[0]:<18} " + " ".join(f"{h:>10}" for h in head[1:]) + "  same")
    for case in runs["this"]:
        a, b = statistics.median(runs["other"][case]), statistics.median(runs["this"][case])
        same = digests["this"][case] == digests["other"][case] and len(digests["this"][case]) == 1
        print(f"{case:<18} {a:>10.4f} {b:>10.4f} {a - b:>10.4f} {b / a:>9.2f}x  {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", help="another checkout to compare with")
    parser.add_argument(
        "--cases", default=",".join(f"{n}:{t}" for n, t in CASES), help="scenario:topology,..."
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker or not args.against:
        worker(args.steps, [tuple(c.split(":", 1)) for c in args.cases.split(",")])  # type: ignore[misc]
    else:
        against(os.path.abspath(args.against), args.steps, args.rounds, args.cases)


if __name__ == "__main__":
    main()
