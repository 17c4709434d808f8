"""Wall time of one PPO iteration with ``credit=shapley`` against ``credit=team`` (part 2).

Part 1 (``experiments/credit_cost.py``) counts coalition evaluations per episode on synthetic games.
This part measures what they cost inside training: for ``delegate`` on ``star:1 … star:5``
(``n = 2 … 6`` agents), it builds the experiment exactly as ``marl run`` does
(:func:`trainers.algo.to_algorithm_config`; credit ``shapley`` with the ``exact`` estimator, so
``2**n`` coalition values per episode, shared between identical replays by the connector's
trie) and the same experiment with ``credit=team``, then times ``algo.train()``.

Both algorithms of a team size are built up front and their iterations alternate, so load from
other processes hits both alike. Two ratios: ``early``, of the medians of the first iterations
(random policies: long episodes, many workers touched, the costly end), and ``run``, of the
total times of the whole run (a learning orchestrator delegates in fewer rounds and touches
fewer workers); the last two columns are both runs' final returns. Besides, the table
shows the episodes per iteration, the players per episode, the replays the credit connector ran
per episode, and the seconds it spent per iteration (``credit_cost/seconds``).

A second table times the connector alone on sampled episodes (no RLlib), for random policies
and for the delegate oracle standing in for a trained team.

Measured on this 2-core machine (quiet; ``trainers.algo`` defaults: 1000 env steps per
iteration, 8 envs, one local env runner; fast replays, ``credit.workers`` auto = 2, i.e. the
learner plus one Ray actor on the core the trainer leaves idle; 20 alternating iterations):

====  =========  =========  =====  ===========  ==========  ====================
 n    team s/it  cred s/it  early  replays/ep   credit s/it run (whole 20 its)
====  =========  =========  =====  ===========  ==========  ====================
 2    1.87       2.09       1.12x  1.9          0.08        0.87x
 3    1.86       1.72       0.93x  3.7          0.21        1.01x
 4    2.63       3.30       1.25x  7.0          0.46        1.01x
 5    2.65       2.77       1.05x  13.2         0.77        1.12x
 6    2.33       3.23       1.39x  21.5         1.15        1.27x
====  =========  =========  =====  ===========  ==========  ====================

Over a whole (20-iteration) run exact Shapley credit costs at most 1.27x the wall time of team
credit at n ≤ 6 (goal ≤ 1.3x); the first iterations, with random policies (long episodes, every
worker touched, 21 replays per episode at n = 6), cost up to 1.39x. Noise between runs is about
±15%. History: through LangGraph a replay cost 4–17 ms and the same measurement gave 1.46x (n=2)
… 8.64x (n=6); :mod:`scenarios.replay` (0.4–1 ms per replay) brought n = 6 to 1.49x, the second
process to 1.27x: in one process (before ``credit.workers``) the whole-run ratios were 0.91,
0.98, 1.12, 1.23 and 1.49x.

Run: ``python bench/credit_walltime.py`` (about 10 minutes on 2 cores); ``--help`` lists the
knobs (``--sizes 2 3``, ``--iterations``, ``--workers 1``, ``--method loo``,
``--estimator kernel``).
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
    returns: list[float] = field(default_factory=list)

    def median(self, name: str, first: int | None = None) -> float:
        values = getattr(self, name)[:first]
        return statistics.median(values) if values else float("nan")


def build(n: int, method: str, estimator: str, seed: int, workers: int | None = None) -> Any:
    """The PPO algorithm ``marl run delegate --topology star:{n-1} --credit METHOD`` trains."""
    from trainers.algo import to_algorithm_config
    from trainers.configs.credit import CreditConfig
    from trainers.configs.experiment import ExperimentConfig

    cfg = ExperimentConfig(
        scenario="delegate",
        topology=f"star:{n - 1}",
        credit=CreditConfig(method=method, estimator=estimator, workers=workers),
        seed=seed,
    )
    return to_algorithm_config(cfg).build_algo()


def record(algo: Any, timing: Timing) -> None:
    """One timed ``train()`` call."""
    start = time.perf_counter()
    result = algo.train()
    timing.seconds.append(time.perf_counter() - start)
    runners = result.get("env_runners", {})
    timing.returns.append(float(runners.get("episode_return_mean", float("nan"))))
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
    n: int, iterations: int, method: str, estimator: str, seed: int, workers: int | None = None
) -> tuple[Timing, Timing]:
    """Alternate ``team`` and ``method`` iterations on ``n`` agents; one warm-up each."""
    algos = {m: build(n, m, estimator, seed, workers) for m in ("team", method)}
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


def connector_probe(sizes: list[int], episodes: int, method: str, estimator: str) -> None:
    """Credit cost per episode outside RLlib: random policies against the delegate oracle.

    Episodes are sampled by stepping ``RLlibGraphEnv`` (the oracle orchestrator plus scripted
    workers stands in for a trained team) and credited by the connector directly, past its
    verification window (``v(N)`` from the episode, as for most episodes in training).
    """
    import numpy as np

    from scenarios.rllib_env import RLlibGraphEnv
    from tests.rllib_episodes import record_episode
    from trainers.configs.credit import CreditConfig
    from trainers.credit.connector import VERIFY_FIRST, make_credit_connector

    print(f"\ncredit connector alone ({episodes} episodes per row, no RLlib): cost per episode")
    header = (
        f"{'n':>2} {'policy':>7} {'players':>7} {'replays/ep':>10} {'ms/replay':>9} {'ms/ep':>7}"
    )
    print(header)
    print("-" * len(header))
    for n in sizes:
        env_config = {"scenario": "delegate", "topology": f"star:{n - 1}"}
        env = RLlibGraphEnv(env_config)
        rng = np.random.default_rng(0)
        policies = {
            "random": lambda a, o, rng=rng, env=env: rng.integers(env.action_spaces[a].nvec),
            "oracle": env.env.scenario.oracle_policy,
        }
        for name, policy in policies.items():
            eps = [record_episode(env, seed, policy) for seed in range(episodes)]
            credit = CreditConfig(method=method, estimator=estimator)
            conn = make_credit_connector(credit, env_config)(None, None)
            conn.totals["episodes"] = VERIFY_FIRST + 1  # past the verification window
            start = time.perf_counter()
            records = [conn.assign(ep) for ep in eps]
            seconds = time.perf_counter() - start
            replays = sum(r.replays for r in records)
            print(
                f"{n:>2} {name:>7} {np.mean([len(r.credits) for r in records]):>7.2f} "
                f"{replays / episodes:>10.1f} {seconds / max(replays, 1) * 1e3:>9.1f} "
                f"{seconds / episodes * 1e3:>7.1f}",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4, 5, 6])
    parser.add_argument(
        "--iterations", type=int, default=20, help="timed training iterations per method"
    )
    parser.add_argument(
        "--early", type=int, default=4, help="iterations that make the early (random-policy) ratio"
    )
    parser.add_argument(
        "--method", default="shapley", choices=["shapley", "loo", "local"], help="credit method"
    )
    parser.add_argument("--estimator", default="exact", help="Shapley estimator (default exact)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workers", type=int, default=None, help="credit.workers (default: the idle cores)"
    )
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument(
        "--probe-only", action="store_true", help="only the connector-alone table (no Ray)"
    )
    parser.add_argument("--probe-episodes", type=int, default=40)
    args = parser.parse_args(argv)
    if args.probe_only:
        connector_probe(args.sizes, args.probe_episodes, args.method, args.estimator)
        return 0

    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    print(
        f"delegate, PPO (trainers.algo defaults), credit={args.method}"
        f"{'/' + args.estimator if args.method == 'shapley' else ''} vs team; "
        f"credit.workers={args.workers or 'auto'}; "
        f"{args.iterations} alternating iterations after one warm-up each; 'early': ratio of "
        f"the medians of the first {args.early} (random policies), 'run': ratio of total times"
    )
    header = (
        f"{'n':>2} {'topology':>8} {'team s/it':>9} {'cred s/it':>9} {'early':>6} "
        f"{'eps/it':>6} {'players':>7} {'replays/ep':>10} {'coal/ep':>7} {'credit s/it':>11} "
        f"{'run':>6} {'team ret':>8} {'cred ret':>8}"
    )
    print(header)
    print("-" * len(header))
    try:
        for n in args.sizes:
            team, shap = measure(
                n, args.iterations, args.method, args.estimator, args.seed, args.workers
            )
            k = args.early
            early = shap.median("seconds", k) / team.median("seconds", k)
            run = sum(shap.seconds) / sum(team.seconds)
            print(
                f"{n:>2} {f'star:{n - 1}':>8} {team.median('seconds', k):>9.2f} "
                f"{shap.median('seconds', k):>9.2f} {early:>5.2f}x "
                f"{shap.median('episodes', k):>6.0f} {shap.median('players', k):>7.2f} "
                f"{shap.median('replays', k):>10.1f} {shap.median('coalitions', k):>7.1f} "
                f"{shap.median('credit_seconds', k):>11.2f} {run:>5.2f}x "
                f"{team.returns[-1]:>8.2f} {shap.returns[-1]:>8.2f}",
                flush=True,
            )
    finally:
        ray.shutdown()
    connector_probe(args.sizes, args.probe_episodes, args.method, args.estimator)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
