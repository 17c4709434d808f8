"""Wall time of one PPO iteration with ``credit=shapley`` against ``credit=team`` (part 2).

Part 1 (``bench/credit_cost.py``) counts coalition evaluations per episode on synthetic games.
This part measures what they cost inside training: for ``delegate`` on ``star:1 … star:5``
(``n = 2 … 6`` agents), it builds the experiment exactly as ``marl run`` does
(:func:`trainers.algo.to_algorithm_config`; credit ``shapley`` with the ``exact`` estimator, so
``2**n`` coalition values per episode, shared between identical replays by the connector's
trie) and the same experiment with ``credit=team``, then times ``algo.train()``.

Both algorithms of a team size are built up front and their iterations alternate, so load from
other processes hits both alike; the table reports medians. Policies start random and train for
only a few iterations, which is the costly end (long episodes, many workers touched); a trained
orchestrator delegates in fewer rounds and touches fewer workers. Besides the ratio, the table
shows the episodes per iteration, the players per episode, the replays the credit connector ran
per episode, and the seconds it spent per iteration (``credit_cost/seconds``).

Run: ``python bench/credit_walltime.py`` (about 10 minutes on 2 cores); ``--help`` lists the
knobs (``--sizes 2 3``, ``--iterations``, ``--method loo``, ``--estimator kernel``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
# this checkout's packages first, also when another one is installed in the environment
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass
class Timing:
    """Per-iteration measurements of one algorithm."""

    seconds: list[float] = field(default_factory=list)
    episodes: list[float] = field(default_factory=list)
    credit_seconds: list[float] = field(default_factory=list)
    replays: list[float] = field(default_factory=list)
    coalitions: list[float] = field(default_factory=list)
    players: list[float] = field(default_factory=list)

    def median(self, name: str) -> float:
        values = getattr(self, name)
        return statistics.median(values) if values else float("nan")


def build(n: int, method: str, estimator: str, seed: int) -> Any:
    """The PPO algorithm ``marl run delegate --topology star:{n-1} --credit METHOD`` trains."""
    from trainers.algo import to_algorithm_config
    from trainers.config import CreditConfig, ExperimentConfig

    cfg = ExperimentConfig(
        scenario="delegate",
        topology=f"star:{n - 1}",
        credit=CreditConfig(method=method, estimator=estimator),
        seed=seed,
    )
    return to_algorithm_config(cfg).build_algo()


def record(algo: Any, timing: Timing) -> None:
    """One timed ``train()`` call."""
    start = time.perf_counter()
    result = algo.train()
    timing.seconds.append(time.perf_counter() - start)
    runners = result.get("env_runners", {})
    timing.episodes.append(float(runners.get("num_episodes", float("nan"))))
    cost = result.get("learners", {}).get("credit_cost")
    if cost:
        episodes = max(float(_peek(cost.get("episodes", 0))), 1.0)
        timing.credit_seconds.append(float(_peek(cost.get("seconds", 0.0))))
        timing.replays.append(float(_peek(cost.get("replays", 0))) / episodes)
        timing.coalitions.append(float(_peek(cost.get("coalitions", 0))) / episodes)
        timing.players.append(float(_peek(cost.get("players", 0))) / episodes)


def _peek(value: Any) -> Any:
    return value.peek() if hasattr(value, "peek") else value


def measure(
    n: int, iterations: int, method: str, estimator: str, seed: int
) -> tuple[Timing, Timing]:
    """Alternate ``team`` and ``method`` iterations on ``n`` agents; one warm-up each."""
    algos = {m: build(n, m, estimator, seed) for m in ("team", method)}
    timings = {m: Timing() for m in algos}
    try:
        for algo in algos.values():
            algo.train()  # warm-up: first-call costs (module build, torch init)
        for _ in range(iterations):
            for method, algo in algos.items():
                record(algo, timings[method])
    finally:
        for algo in algos.values():
            algo.stop()
    return timings["team"], timings[method]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4, 5, 6])
    parser.add_argument("--iterations", type=int, default=4, help="timed iterations per method")
    parser.add_argument(
        "--method", default="shapley", choices=["shapley", "loo", "local"], help="credit method"
    )
    parser.add_argument("--estimator", default="exact", help="Shapley estimator (default exact)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-cpus", type=int, default=2)
    args = parser.parse_args(argv)

    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    print(
        f"delegate, PPO (trainers.algo defaults), credit={args.method}"
        f"{'/' + args.estimator if args.method == 'shapley' else ''} vs team; "
        f"median of {args.iterations} alternating iterations after one warm-up each"
    )
    header = (
        f"{'n':>2} {'topology':>8} {'team s/it':>9} {'cred s/it':>9} {'ratio':>6} "
        f"{'eps/it':>6} {'players':>7} {'replays/ep':>10} {'coal/ep':>7} {'credit s/it':>11}"
    )
    print(header)
    print("-" * len(header))
    try:
        for n in args.sizes:
            team, shap = measure(n, args.iterations, args.method, args.estimator, args.seed)
            ratio = shap.median("seconds") / team.median("seconds")
            print(
                f"{n:>2} {f'star:{n - 1}':>8} {team.median('seconds'):>9.2f} "
                f"{shap.median('seconds'):>9.2f} {ratio:>5.2f}x {shap.median('episodes'):>6.0f} "
                f"{shap.median('players'):>7.2f} "
                f"{shap.median('replays'):>10.1f} {shap.median('coalitions'):>7.1f} "
                f"{shap.median('credit_seconds'):>11.2f}",
                flush=True,
            )
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
