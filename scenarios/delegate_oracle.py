"""Skill matrices and the exact oracle of the ``delegate`` scenario.

The oracle is the best orchestrator that knows the skill matrix, paired with workers that always
pick the matching method. Its value is computed exactly by backward induction (a finite-horizon
Bellman recursion) over ``(round, unsolved parts counted per type)`` with the binomial
distribution of successes enumerated exactly; nothing is sampled.

Why counting parts per type is enough: skill draws are independent across rounds, parts and
workers, so only the set of unsolved parts and the round matter, and parts of the same type are
interchangeable. With ``parallel=True`` each dispatched part should go to the worker with the
highest skill for its type: the cost of a round (``λ`` plus ``μ`` per part) does not depend on
which workers are called, and a higher success probability can only help because the value is
monotone in the set of solved parts. With ``parallel=False`` one worker handles every part
dispatched in a round, so the recursion maximises over that worker too.

Cost: at most ``4^K`` (dispatch, outcome) pairs per round, times ``N`` with ``parallel=False``,
memoised across tasks of one instance. The default (K = T = 3) solves in milliseconds; the
largest allowed size (K = T = N = 8, 16 rounds) takes seconds parallel and ~30 s sequential.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np


def make_skills(n_workers: int, n_types: int, seed: int) -> np.ndarray:
    """Draw a heterogeneous skill matrix: specialists strong on their own types, weak elsewhere.

    The types are shuffled and dealt round-robin to ``min(N, T)`` specialities: worker ``i``
    is strong on every type dealt to speciality ``i mod min(N, T)``. So every type has a strong
    worker, each worker is strong on about ``T/N`` types, and with ``N > T`` several workers
    share a speciality. Strong skills are drawn in ``[0.75, 0.95]``, weak ones in
    ``[0.05, 0.30]``.

    Args:
        n_workers: number of specialists ``N``.
        n_types: number of part types ``T``.
        seed: the ``skills_seed``; the same seed gives the same matrix.

    Returns:
        A ``(N, T)`` float array of success probabilities.

    Example:
        >>> make_skills(3, 3, 0).shape
        (3, 3)
    """
    rng = np.random.default_rng([seed, n_workers, n_types])
    m = min(n_workers, n_types)
    speciality = np.empty(n_types, dtype=int)
    speciality[rng.permutation(n_types)] = np.arange(n_types) % m
    strong = (np.arange(n_workers)[:, None] % m) == speciality[None, :]
    high = rng.uniform(0.75, 0.95, (n_workers, n_types))
    low = rng.uniform(0.05, 0.30, (n_workers, n_types))
    return np.where(strong, high, low)


def _binom(k: int, p: float) -> list[float]:
    return [math.comb(k, s) * p**s * (1.0 - p) ** (k - s) for s in range(k + 1)]


class Planner:
    """Exact optimal dispatch plan for one skill matrix and cost setting.

    Args:
        skills: ``(N, T)`` success probabilities of the workers.
        parts: ``K``, the number of parts of a task (each solved part is worth ``1/K``).
        max_rounds: dispatch rounds available.
        latency_cost: ``λ``, paid once per dispatch round.
        call_cost: ``μ``, paid per part handed to a worker.
        parallel: whether a round may call several workers.
    """

    def __init__(
        self,
        skills: np.ndarray,
        parts: int,
        max_rounds: int,
        latency_cost: float,
        call_cost: float,
        parallel: bool,
    ) -> None:
        self.skills = np.asarray(skills, dtype=float)
        self.parts = parts
        self.max_rounds = max_rounds
        self.latency_cost = latency_cost
        self.call_cost = call_cost
        self.parallel = parallel
        # the "workers" the recursion chooses between: one virtual best-per-type worker when
        # parallel, else each real worker
        self._options = [self.skills.max(axis=0)] if parallel else [row for row in self.skills]
        self._solve = lru_cache(maxsize=None)(self._solve_uncached)

    def value(self, counts: tuple[int, ...], round_: int = 0) -> float:
        """Expected future reward from ``round_`` with ``counts[t]`` unsolved parts of type t."""
        return self._solve(tuple(counts), round_)[0]

    def best(self, counts: tuple[int, ...], round_: int) -> tuple[int, tuple[int, ...]]:
        """The optimal move: ``(option, parts to dispatch per type)``; all zeros means stop.

        ``option`` is the worker index with ``parallel=False`` and 0 otherwise (then each part
        goes to the best worker for its type, see :meth:`best_worker`).
        """
        return self._solve(tuple(counts), round_)[1]

    def best_worker(self, type_: int) -> int:
        """The worker with the highest skill on ``type_`` (lowest index on ties)."""
        return int(np.argmax(self.skills[:, type_]))

    def _solve_uncached(
        self, counts: tuple[int, ...], round_: int
    ) -> tuple[float, tuple[int, tuple[int, ...]]]:
        stop = (0, tuple(0 for _ in counts))
        if round_ >= self.max_rounds or sum(counts) == 0:
            return 0.0, stop
        best_value, best_move = 0.0, stop
        for option, probs in enumerate(self._options):
            for dispatch in itertools.product(*(range(c + 1) for c in counts)):
                n = sum(dispatch)
                if n == 0:
                    continue
                q = -self.latency_cost - self.call_cost * n
                dists = [_binom(k, float(probs[t])) for t, k in enumerate(dispatch)]
                for succ in itertools.product(*(range(k + 1) for k in dispatch)):
                    pr = math.prod(d[s] for d, s in zip(dists, succ, strict=True))
                    if pr == 0.0:
                        continue
                    rest = tuple(c - s for c, s in zip(counts, succ, strict=True))
                    q += pr * (sum(succ) / self.parts + self._solve(rest, round_ + 1)[0])
                if q > best_value + 1e-12:
                    best_value, best_move = q, (option, dispatch)
        return best_value, best_move
