"""Learnability curriculum: which task each episode plays (config section ``curriculum:``).

Contract:

* A **task** is one episode seed: a base seed of ``curriculum.tasks`` at a level of
  ``curriculum.levels`` (``scenarios.difficulty.level_seed``; the scenario then runs with
  ``difficulty: seed``), so credit replays, resumed episodes and GRPO's grouping by seed all see
  the level without being told.
* :class:`LearnabilitySampler` (driver) keeps per task a pass count and a trial count, both
  multiplied by ``decay`` at every update: ``p̂ = (passes + prior·w) / (trials + w)`` with
  ``w = prior_weight``. Mode ``learnability`` samples task ``i`` with probability
  ``(1 − ε)·u_i / Σu + ε / n``, ``u_i = √(p̂_i(1 − p̂_i))``; mode ``uniform`` with ``1 / n``.
* Env side, every env-runner process has one :data:`SCHEDULE`: the task list and the
  distribution the driver pushed last. :class:`~trainers.sampling.grouped_env.GroupedEnv` draws its
  ``k``-th task from it with ``default_rng([*stream, k])`` (memoised per ``(stream, k)``, so the
  ``G`` sub-envs of a GRPO group play the same task even when the distribution changes while
  the group is running) and records each finished episode's ``(stream, k, task, passed)``.
  Its methods hold a lock: with ``episodes.env_threads`` several envs draw and record at once.
  "Passed" is ``Outcome.success``, or ``reward ≥ pass_threshold`` when that is set.
* Every iteration :meth:`Curriculum.step` (driver, from ``trainers.run.loop``) drains the
  outcomes of every env runner (``foreach_env_runner``: remote runners too), updates the
  sampler, pushes the new distribution and returns the ``curriculum/*`` metrics. The sampler
  and every runner's schedule are saved in checkpoints (``trainers.run.resume``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from trainers.configs.curriculum import CurriculumConfig
from trainers.configs.typed import ConfigError

#: metric prefix
PREFIX = "curriculum/"


def env_config(cfg: Any) -> dict[str, Any]:
    """The ``curriculum`` entry of the env config of experiment ``cfg`` (empty: inactive).

    Raises:
        ConfigError: levels set while the scenario does not read its level from the seed.
    """

    cur: CurriculumConfig = cfg.curriculum
    if not cur.active:
        return {}
    if cur.levels is not None and cfg.scenario_kwargs.get("difficulty") != "seed":
        raise ConfigError(
            f"curriculum.levels={cur.levels} needs the scenario to read its level from the "
            f"episode seed: set scenario_kwargs.difficulty: seed (got "
            f"{cfg.scenario_kwargs.get('difficulty')!r})"
        )
    return {"curriculum": {"tasks": cur.task_seeds(), "pass_threshold": cur.pass_threshold}}


# ----- the sampler (driver) ------------------------------------------------------------------
class LearnabilitySampler:
    """Pass-rate estimates per task and the sampling distribution (module doc).

    Args:
        cfg: the knobs.
        n_tasks: the pool size.
    """

    def __init__(self, cfg: CurriculumConfig, n_tasks: int) -> None:
        self.cfg = cfg
        self.passes = np.zeros(n_tasks)
        self.trials = np.zeros(n_tasks)

    def pass_rates(self) -> np.ndarray:
        """``p̂`` per task."""
        w = self.cfg.prior_weight
        return (self.passes + self.cfg.prior * w) / (self.trials + w)

    def utilities(self) -> np.ndarray:
        """``√(p̂(1 − p̂))`` per task: how much gradient a group of the task carries."""
        p = self.pass_rates()
        return np.sqrt(p * (1.0 - p))

    def probabilities(self) -> np.ndarray:
        """The sampling distribution over tasks."""
        n = len(self.passes)
        uniform = np.full(n, 1.0 / n)
        if self.cfg.mode == "uniform":
            return uniform
        u = self.utilities()
        weights = u / u.sum() if u.sum() > 0 else uniform
        return (1.0 - self.cfg.epsilon) * weights + self.cfg.epsilon * uniform

    def update(self, outcomes: Iterable[tuple[int, bool]]) -> None:
        """Decay the evidence once, then count ``(task index, passed)`` outcomes."""
        self.passes *= self.cfg.decay
        self.trials *= self.cfg.decay
        for task, passed in outcomes:
            self.trials[task] += 1.0
            self.passes[task] += float(passed)

    def metrics(self) -> dict[str, float]:
        """``utility_mean`` (expected utility of a drawn task), ``learnable_share`` (tasks with
        ``p̂`` in the band) and ``pass_rate_mean`` (mean ``p̂``)."""
        p, q = self.pass_rates(), self.probabilities()
        low, high = self.cfg.band
        return {
            "utility_mean": float(q @ self.utilities()),
            "learnable_share": float(np.mean((p >= low) & (p <= high))),
            "pass_rate_mean": float(p.mean()),
        }

    def get_state(self) -> dict[str, Any]:
        return {"passes": self.passes.copy(), "trials": self.trials.copy()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if len(state["passes"]) != len(self.passes):
            raise ValueError(
                f"curriculum state has {len(state['passes'])} tasks, the config {len(self.passes)}:"
                " resume with the curriculum section the run was saved with"
            )
        self.passes, self.trials = np.array(state["passes"]), np.array(state["trials"])


# ----- the schedule (env-runner processes) ---------------------------------------------------
class TaskSchedule:
    """One process's view of the curriculum: tasks, distribution, draws, finished outcomes.

    Thread-safe: every method holds the schedule's lock (env threads draw and record at once)."""

    #: memoised draws kept (older ``(stream, k)`` are forgotten)
    MAX_MEMO = 4096

    def __init__(self) -> None:
        self.tasks: list[int] = []
        self.probs = np.zeros(0)
        self.memo: dict[tuple[int, ...], int] = {}
        self.outbox: list[tuple[tuple[int, ...], int, bool]] = []
        self._lock = threading.RLock()

    def ensure(self, tasks: list[int]) -> None:
        """Start with ``tasks`` uniformly unless the driver already pushed them."""
        with self._lock:
            if self.tasks != list(tasks):
                self.tasks, self.probs = list(tasks), np.full(len(tasks), 1.0 / len(tasks))
                self.memo = {}

    def push(self, tasks: list[int], probs: np.ndarray, fresh: bool = False) -> None:
        """The driver's distribution (draws made before keep their task; ``fresh``: a new run
        starts, so draws and outcomes of an earlier run in this process are forgotten)."""
        with self._lock:
            self.ensure(tasks)
            self.probs = np.asarray(probs, dtype=float)
            if fresh:
                self.memo, self.outbox = {}, []

    def draw(self, stream: tuple[int, ...], k: int) -> int:
        """The task index of the ``k``-th task of ``stream``."""
        key = (*stream, k)
        with self._lock:
            if key not in self.memo:
                u = float(np.random.default_rng([*stream, k]).random())
                cdf = np.cumsum(self.probs)
                index = np.searchsorted(cdf, u * cdf[-1], side="right")
                self.memo[key] = int(min(index, len(cdf) - 1))
                if len(self.memo) > self.MAX_MEMO:
                    del self.memo[next(iter(self.memo))]
            return self.memo[key]

    def record(self, stream: tuple[int, ...], k: int, task: int, passed: bool) -> None:
        with self._lock:
            self.outbox.append(((*stream, k), task, passed))

    def drain(self) -> list[tuple[tuple[int, ...], int, bool]]:
        with self._lock:
            out, self.outbox = self.outbox, []
        return out

    def get_state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "tasks": list(self.tasks),
                "probs": self.probs.copy(),
                "memo": dict(self.memo),
                "outbox": list(self.outbox),
            }

    def set_state(self, state: Mapping[str, Any]) -> None:
        with self._lock:
            self.tasks, self.probs = list(state["tasks"]), np.array(state["probs"])
            self.memo, self.outbox = dict(state["memo"]), list(state["outbox"])


#: this process's task schedule: process-wide because RLlib builds every sub-env from a
#: pickled config, so no call path can hand them one object (the driver pushes to it)
SCHEDULE = TaskSchedule()


def passed(outcome: Any, threshold: float | None) -> bool:
    """Whether a finished episode's ``Outcome`` counts as a pass (module doc)."""
    if threshold is not None:
        return float(outcome.reward) >= threshold
    return bool(outcome.success)


def drain_outcomes(env_runner: Any = None) -> list[tuple[tuple[int, ...], int, bool]]:
    """``foreach_env_runner`` function: this process's finished outcomes, drained."""
    return SCHEDULE.drain()


def push_distribution(
    env_runner: Any = None, *, tasks: list[int], probs: Any, fresh: bool = False
) -> None:
    """``foreach_env_runner`` function: set this process's distribution (see
    :meth:`TaskSchedule.push`)."""
    SCHEDULE.push(tasks, probs, fresh)


# ----- the driver ------------------------------------------------------------------------------
class Curriculum:
    """The driver's side (module doc): one per training run, updated once per iteration."""

    def __init__(self, cfg: CurriculumConfig) -> None:
        self.cfg = cfg
        self.tasks = cfg.task_seeds()
        self.sampler = LearnabilitySampler(cfg, len(self.tasks))
        self.level_of = self._levels()

    def _levels(self) -> np.ndarray | None:
        if self.cfg.levels is None:
            return None
        per_level = len(self.tasks) // len(self.cfg.levels)
        return np.repeat(np.asarray(self.cfg.levels, dtype=float), per_level)

    @classmethod
    def start(cls, cfg: Any, algo: Any) -> Curriculum | None:
        """The run's curriculum (``None``: inactive), with the state a resumed ``algo`` brought
        (``trainers.run.resume``), attached to ``algo`` for checkpoints and pushed to its
        runners."""
        if not cfg.curriculum.active:
            return None
        cur = cls(cfg.curriculum)
        saved = getattr(algo, "marl_curriculum_state", None)
        if saved is not None:
            cur.sampler.set_state(saved)
        algo.marl_curriculum = cur
        cur.push(algo, fresh=saved is None)  # resumed: the runners' restored draws stay
        return cur

    def push(self, algo: Any, fresh: bool = False) -> None:
        probs = self.sampler.probabilities()
        fn = functools.partial(push_distribution, tasks=self.tasks, probs=probs, fresh=fresh)
        _foreach_runner(algo, fn)

    def step(self, algo: Any) -> dict[str, float]:
        """Drain outcomes, update, push; the iteration's ``curriculum/*`` metrics."""
        outcomes = [o for part in _foreach_runner(algo, drain_outcomes) for o in part]
        self.sampler.update((task, ok) for _, task, ok in outcomes)
        self.push(algo)
        return {PREFIX + k: v for k, v in self.metrics(outcomes).items()}

    def metrics(self, outcomes: list[tuple[tuple[int, ...], int, bool]]) -> dict[str, float]:
        """The sampler's metrics, ``difficulty`` (expected level index of a drawn task, with
        levels),
        and of this iteration's outcomes ``episodes``, ``pass_rate`` and ``informative_share``
        (share of groups, i.e. rollouts of one draw, with both passes and failures)."""
        out = self.sampler.metrics()
        if self.level_of is not None:
            out["difficulty"] = float(self.sampler.probabilities() @ self.level_of)
        out["episodes"] = float(len(outcomes))
        if outcomes:
            out["pass_rate"] = float(np.mean([ok for _, _, ok in outcomes]))
            out["informative_share"] = informative_share(outcomes)
        return out

    def get_state(self) -> dict[str, Any]:
        return self.sampler.get_state()


def informative_share(outcomes: Iterable[tuple[Any, int, bool]]) -> float:
    """Share of groups (outcomes with the same draw key) whose rollouts both pass and fail."""
    groups: dict[Any, set[bool]] = {}
    for key, _, ok in outcomes:
        groups.setdefault(key, set()).add(bool(ok))
    return float(np.mean([len(v) == 2 for v in groups.values()])) if groups else 0.0


def _foreach_runner(algo: Any, fn: Any) -> list[Any]:
    group = getattr(algo, "env_runner_group", None)
    if group is None:
        return [fn(algo.env_runner)]
    return list(group.foreach_env_runner(fn, local_env_runner=True))
