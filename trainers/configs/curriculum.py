"""``curriculum:``: which tasks episodes play (:class:`CurriculumConfig`); the sampler, the
env-runner schedule and the driver are :mod:`trainers.signals.curriculum`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from trainers.configs.typed import ConfigError, typed

CurriculumMode = Literal["uniform", "learnability"]


@dataclasses.dataclass
class CurriculumConfig:
    """Task sampling (section ``curriculum:``); inactive unless ``tasks`` or ``levels`` is set.

    Attributes:
        mode: ``uniform`` (every task alike: the baseline) or ``learnability`` (tasks whose
            estimated pass rate is near 0.5 more often).
        tasks: the pool of base task seeds: a count ``n`` (seeds ``0 … n−1``) or a list;
            ``None``: an open seed stream as without a curriculum (needs ``levels``).
        levels: difficulty level indices of the scenario's knob to sample over (the scenario
            must run with ``scenario_kwargs.difficulty: seed``); ``None``: as configured.
        epsilon: share of uniform exploration in ``learnability`` mode, in ``[0, 1]``.
        prior: pass rate assumed for a task never seen, in ``(0, 1)``.
        prior_weight: how many episodes the prior counts for (> 0).
        decay: factor applied to past evidence at every iteration, in ``(0, 1]`` (1: keep all).
        pass_threshold: an episode passes when its reward is at least this; ``None``: when the
            scenario's ``Outcome.success`` is true.
        band: ``[low, high]`` pass rates counted as learnable in ``curriculum/learnable_share``.
    """

    mode: CurriculumMode = "uniform"
    tasks: int | list[int] | None = None
    levels: list[int] | None = None
    epsilon: float = 0.1
    prior: float = 0.5
    prior_weight: float = 2.0
    decay: float = 1.0
    pass_threshold: float | None = None
    band: list[float] = dataclasses.field(default_factory=lambda: [0.1, 0.9])

    def __post_init__(self) -> None:
        typed(self, "curriculum")

    @property
    def active(self) -> bool:
        """Whether tasks are sampled from a pool (else the env's own seed stream)."""
        return self.tasks is not None or self.levels is not None

    def check(self) -> None:
        """Each value in its range; a mode that needs a pool has one."""
        if self.mode == "learnability" and not self.active:
            raise ConfigError(
                "curriculum.mode=learnability needs a pool of tasks: set curriculum.tasks "
                "(a count or a list of seeds) and/or curriculum.levels"
            )
        if isinstance(self.tasks, int) and self.tasks < 1:
            raise ConfigError(f"curriculum.tasks must be ≥ 1 (a count of seeds), got {self.tasks}")
        if isinstance(self.tasks, list) and (
            not self.tasks or len(set(self.tasks)) != len(self.tasks) or min(self.tasks) < 0
        ):
            raise ConfigError(f"curriculum.tasks must list distinct seeds ≥ 0, got {self.tasks!r}")
        if self.levels is not None and (not self.levels or min(self.levels) < 0):
            raise ConfigError(f"curriculum.levels must list level indices ≥ 0, got {self.levels!r}")
        self._check_numbers()

    def _check_numbers(self) -> None:
        ranges = (
            ("epsilon", self.epsilon, 0.0 <= self.epsilon <= 1.0, "in [0, 1]"),
            ("prior", self.prior, 0.0 < self.prior < 1.0, "in (0, 1)"),
            ("prior_weight", self.prior_weight, self.prior_weight > 0, "> 0"),
            ("decay", self.decay, 0.0 < self.decay <= 1.0, "in (0, 1] (1: forget nothing)"),
        )
        for name, value, ok, want in ranges:
            if not ok or not math.isfinite(value):
                raise ConfigError(f"curriculum.{name} must be {want}, got {value!r}")
        low, high = [*self.band, math.nan, math.nan][:2]
        if len(self.band) != 2 or not 0.0 <= low < high <= 1.0:
            raise ConfigError(
                f"curriculum.band must be [low, high] with 0 ≤ low < high ≤ 1, got {self.band}"
            )

    def base_seeds(self) -> list[int] | None:
        """The pool's base seeds (``None``: no pool)."""
        if self.tasks is None:
            return None
        return list(range(self.tasks)) if isinstance(self.tasks, int) else list(self.tasks)

    def task_seeds(self) -> list[int]:
        """Every task of the pool as an episode seed (levels outer, base seeds inner)."""
        import numpy as np

        from scenarios.difficulty import LEVEL_STRIDE, level_seed

        bases = self.base_seeds()
        if self.levels is None:
            return list(bases or [])
        if bases is None:  # one open stream per level: a fixed spread of seeds stands for it
            bases = [int(s) for s in np.random.default_rng(0).integers(LEVEL_STRIDE, size=64)]
        return [level_seed(level, b) for level in self.levels for b in bases]
