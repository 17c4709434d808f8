"""Learner update time per iteration and per minibatch: ``algorithm.learner`` rllib vs lean.

The default experiment (``delegate`` star:3, PPO, MLP pools: orchestrator + shared worker,
1,000 env steps an iteration, minibatches of 250, 6 epochs). Each round samples one
iteration's episodes, then updates both learners (two algorithms in this process, the lean one
started from the RLlib one's state) on copies of the same episodes, alternating which goes
first, so machine load hits both alike. Reported per learner (medians over rounds): the whole
``learner_group.update`` call, its learner connector pipeline (episodes → batch, GAE, credit),
the minibatch steps (``_update``: forward, loss, backward, optimiser) and the time per
minibatch; then the rllib/lean ratios, also of the update's CPU time (``process_time``: less
sensitive than wall time to other processes on a shared machine).

Run: ``python bench/learner_step.py [--rounds 8] [--warmup 2]``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

LEARNERS = ("rllib", "lean")


def timed(obj: Any, name: str, sink: list[float]) -> None:
    """Wrap ``obj.name`` so that each call appends its wall time to ``sink``."""
    inner: Callable[..., Any] = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - t)

    setattr(obj, name, wrapper)


def build(learner: str) -> Any:
    from trainers.algo import to_algorithm_config
    from trainers.config import ExperimentConfig

    cfg = ExperimentConfig.from_dict(
        {"algorithm": {"learner": learner}, "logging": {"progress": False, "wandb": "disabled"}}
    )
    return cfg, to_algorithm_config(cfg).build_algo()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="measured rounds")
    parser.add_argument("--warmup", type=int, default=2, help="rounds left out of the medians")
    args = parser.parse_args()

    import logging

    import ray
    import torch
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    from trainers.run import quiet_ray_logs

    torch.set_num_threads(1)
    quiet_ray_logs()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    algos, probes = {}, {}
    for kind in LEARNERS:
        cfg, algos[kind] = build(kind)
        learner = algos[kind].learner_group._learner
        probes[kind] = {"update": [], "pipeline": [], "minibatch": []}
        timed(learner, "_make_batch_if_necessary", probes[kind]["pipeline"])
        timed(learner, "_update", probes[kind]["minibatch"])
    print(f"learners: {', '.join(type(a.learner_group._learner).__name__ for a in algos.values())}")
    a = cfg.algorithm
    print(
        f"batch {a.train_batch_size} env steps, minibatch {a.minibatch_size}, "
        f"{a.num_epochs} epochs; {args.warmup} warm-up + {args.rounds} rounds"
    )
    ref = algos["rllib"]
    algos["lean"].learner_group.set_state(ref.learner_group.get_state())
    rows: dict[str, list[tuple[float, float, float, int]]] = {k: [] for k in LEARNERS}
    cpus: dict[str, list[float]] = {k: [] for k in LEARNERS}
    for r in range(args.warmup + args.rounds):
        episodes = ref.env_runner_group.local_env_runner.sample(
            num_timesteps=a.train_batch_size, explore=True
        )
        blob = pickle.dumps([e.get_state() for e in episodes])
        kwargs = {
            "timesteps": {},
            "num_epochs": a.num_epochs,
            "minibatch_size": a.minibatch_size,
            "shuffle_batch_per_epoch": True,
        }
        order = LEARNERS if r % 2 == 0 else LEARNERS[::-1]
        for kind in order:
            copies = [MultiAgentEpisode.from_state(s) for s in pickle.loads(blob)]
            p = probes[kind]
            for sink in p.values():
                sink.clear()
            t, c = time.perf_counter(), time.process_time()
            algos[kind].learner_group.update(episodes=copies, **kwargs)
            total, cpu = time.perf_counter() - t, time.process_time() - c
            mb = p["minibatch"]
            if r >= args.warmup:
                rows[kind].append((total, sum(p["pipeline"]), sum(mb), len(mb)))
                cpus[kind].append(cpu)
        if r >= args.warmup:
            (rt, *_), (lt, *_) = rows["rllib"][-1], rows["lean"][-1]
            rc, lc = cpus["rllib"][-1], cpus["lean"][-1]
            print(
                f"  round {r - args.warmup + 1}: rllib {rt * 1e3:6.1f} ms ({rc * 1e3:6.1f} ms CPU)"
                f"  lean {lt * 1e3:6.1f} ms ({lc * 1e3:6.1f} ms CPU)"
            )
    med: dict[str, dict[str, float]] = {}
    for kind in LEARNERS:
        total, pipeline, loop, n = (statistics.median(col) for col in zip(*rows[kind], strict=True))
        med[kind] = {"update": total, "minibatch": loop / n}
        print(
            f"{kind:>5}: update {total * 1e3:6.1f} ms (pipeline {pipeline * 1e3:5.1f} ms, "
            f"minibatch steps {loop * 1e3:6.1f} ms = {n:.0f} × {loop / n * 1e3:5.2f} ms, "
            f"other {(total - pipeline - loop) * 1e3:5.1f} ms)"
        )
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    print(
        f"ratio rllib/lean: update {med['rllib']['update'] / med['lean']['update']:.2f}×, "
        f"per minibatch {med['rllib']['minibatch'] / med['lean']['minibatch']:.2f}×, "
        f"update CPU time {cpu['rllib'] / cpu['lean']:.2f}× "
        f"({cpu['rllib'] * 1e3:.1f} vs {cpu['lean'] * 1e3:.1f} ms)"
    )
    for algo in algos.values():
        algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
