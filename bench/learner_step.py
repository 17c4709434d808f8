"""Learner update time per iteration and per minibatch: ``algorithm.learner`` rllib vs lean.

The default experiment (``delegate`` star:3, PPO, MLP pools: orchestrator + shared worker,
1,000 env steps an iteration, minibatches of 250, 6 epochs). Each round samples one
iteration's episodes, then updates three learners (three algorithms in this process, started
from the RLlib one's state) on copies of the same episodes, rotating which goes first, so
machine load hits all alike: ``rllib`` (RLlib's PPO learner), ``pieces`` (the lean learner on
RLlib's learner connector pieces, ``LeanPPOLearner.array_batch = False``) and ``lean`` (the
default: the batch from episode arrays, ``trainers/learners/batch.py``). Reported per learner
(medians over rounds): the whole ``learner_group.update`` call, its learner connector pipeline
(episodes → batch, GAE, credit), the minibatch steps (``_update``: forward, loss, backward,
optimiser) and the time per minibatch; then the rllib/lean and pieces/lean ratios, also of the
update's CPU time (``process_time``: less sensitive than wall time to other processes on a
shared machine).

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

LEARNERS = ("rllib", "pieces", "lean")


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
    from trainers.configs.experiment import ExperimentConfig
    from trainers.learners.lean import LeanPPOLearner

    class PiecesLearner(LeanPPOLearner):  # the lean learner on RLlib's connector pieces
        array_batch = False

    kind = "lean" if learner == "pieces" else learner
    cfg = ExperimentConfig.from_dict(
        {"algorithm": {"learner": kind}, "logging": {"progress": False, "wandb": "disabled"}}
    )
    config = to_algorithm_config(cfg)
    if learner == "pieces":
        config.learners(learner_class=PiecesLearner)
    return cfg, config.build_algo()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="measured rounds")
    parser.add_argument("--warmup", type=int, default=2, help="rounds left out of the medians")
    args = parser.parse_args()

    import logging

    import ray
    import torch
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    from trainers.run.process import quiet_ray_logs

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
    for kind in LEARNERS[1:]:
        algos[kind].learner_group.set_state(ref.learner_group.get_state())
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
        k = r % len(LEARNERS)
        order = LEARNERS[k:] + LEARNERS[:k]
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
            times = "  ".join(
                f"{kind} {rows[kind][-1][0] * 1e3:6.1f} ms ({cpus[kind][-1] * 1e3:6.1f} ms CPU)"
                for kind in LEARNERS
            )
            print(f"  round {r - args.warmup + 1}: {times}")
    med: dict[str, dict[str, float]] = {}
    for kind in LEARNERS:
        total, pipeline, loop, n = (statistics.median(col) for col in zip(*rows[kind], strict=True))
        med[kind] = {"update": total, "minibatch": loop / n, "pipeline": pipeline}
        print(
            f"{kind:>6}: update {total * 1e3:6.1f} ms (pipeline {pipeline * 1e3:5.1f} ms, "
            f"minibatch steps {loop * 1e3:6.1f} ms = {n:.0f} × {loop / n * 1e3:5.2f} ms, "
            f"other {(total - pipeline - loop) * 1e3:5.1f} ms)"
        )
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    lean = med["lean"]
    for kind in LEARNERS[:-1]:
        print(
            f"ratio {kind}/lean: update {med[kind]['update'] / lean['update']:.2f}×, "
            f"pipeline {med[kind]['pipeline'] / lean['pipeline']:.2f}×, "
            f"per minibatch {med[kind]['minibatch'] / lean['minibatch']:.2f}×, "
            f"update CPU time {cpu[kind] / cpu['lean']:.2f}× "
            f"({cpu[kind] * 1e3:.1f} vs {cpu['lean'] * 1e3:.1f} ms)"
        )
    for algo in algos.values():
        algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
