"""Value-target normalisation: a running mean and std of a critic's value targets.

The critic of a PPO pool learns *normalised* targets ``(G − μ) / σ``; wherever its output is
used as a value (GAE's advantages and value targets, the bootstrap value of a cut episode) it is
de-normalised first, ``V = σ·v + μ``. The loss then sees errors of order 1 whatever the scale of
the returns, so one ``lr`` and ``vf_loss_coeff`` fit a scenario whose returns are −50 as well as
one whose returns are 0…1. This is MAPPO's ``ValueNorm`` (PopArt's statistics without its
rescaling of the output layer): when the statistics move, the critic's de-normalised outputs
move with them, and the next updates correct it.

Statistics: exponential moving averages of the batch mean and of the batch mean square, one
update per training batch (over its valid rows), debiased as Adam debiases its moments, so the
first batch sets them exactly. With ``beta = 0.99`` (the default, ``algorithm.value_norm_beta``)
a batch counts for about the last hundred updates; at the first ones the debiased average is
close to the plain mean of the batches' moments. MAPPO's ``ValueNorm`` uses 0.99999: for the
first ~10⁵ updates the plain mean over all batches, so the statistics settle (measured on
simple_spread, issue #27: no better than 0.99 there).
Before any update the normaliser is the identity (``μ = 0``, ``σ = 1``), so a module
whose normaliser never updates (a frozen pool) is read as it would be without one. The variance
is floored at ``MIN_VAR`` (σ ≥ 0.1): a batch of equal returns does not blow the targets up.

Typical use (the learner wires it: :mod:`trainers.learners.value_norm_learner`)::

    norm = ValueNorm()
    values = norm.denormalize(critic_outputs)  # in return units
    targets = gae_targets(values, rewards, ...)  # raw returns
    norm.update(targets[loss_mask])
    batch["value_targets"] = norm.normalize(targets)  # what the critic learns

Pure numpy; float64 statistics; arrays keep their dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["BETA", "MIN_VAR", "VALUE_NORM_BETA_KEY", "VALUE_NORM_KEY", "ValueNorm"]

#: weight of the running statistics at each update (per training batch); MAPPO's is 0.99999
BETA = 0.99
#: floor of the variance: σ ≥ 0.1 (MAPPO's ``ValueNorm`` clamps at the same value)
MIN_VAR = 1e-2
#: ``learner_config_dict`` keys: whether PPO learners normalise value targets, and the beta
VALUE_NORM_KEY = "value_norm"
VALUE_NORM_BETA_KEY = "value_norm_beta"


class ValueNorm:
    """Debiased running mean and variance of value targets (see the module doc).

    Args:
        beta: weight of the running statistics at each :meth:`update`, in ``[0, 1)``.
        min_var: floor of the variance.

    Example:
        >>> norm = ValueNorm(beta=0.5)
        >>> norm.update(np.array([1.0, 3.0]))  # mean 2, mean square 5: var 1
        >>> norm.mean, norm.std
        (2.0, 1.0)
        >>> norm.normalize(np.array([4.0])), norm.denormalize(np.array([2.0]))
        (array([2.]), array([4.]))
    """

    def __init__(self, beta: float = BETA, min_var: float = MIN_VAR) -> None:
        if not 0 <= beta < 1:
            raise ValueError(f"ValueNorm beta must be in [0, 1), got {beta}")
        self.beta = float(beta)
        self.min_var = float(min_var)
        self.running_mean = 0.0
        self.running_mean_sq = 0.0
        self.debias = 0.0  # the running average of 1: the weight the averages hold
        self.updates = 0

    @property
    def mean(self) -> float:
        """μ (0 before any update)."""
        return self.running_mean / self.debias if self.debias > 0 else 0.0

    @property
    def var(self) -> float:
        """σ² (1 before any update), at least ``min_var``."""
        if self.debias <= 0:
            return 1.0
        mean = self.mean
        return max(self.running_mean_sq / self.debias - mean * mean, self.min_var)

    @property
    def std(self) -> float:
        """σ."""
        return math.sqrt(self.var)

    def update(self, targets: Any) -> None:
        """Fold one batch of value targets (the valid rows only) into the statistics; an empty
        batch changes nothing."""
        x = np.asarray(targets, dtype=np.float64).ravel()
        if x.size == 0:
            return
        b = self.beta
        self.running_mean = b * self.running_mean + (1 - b) * float(x.mean())
        self.running_mean_sq = b * self.running_mean_sq + (1 - b) * float(np.mean(x * x))
        self.debias = b * self.debias + (1 - b)
        self.updates += 1

    def normalize(self, values: np.ndarray) -> np.ndarray:
        """``(x − μ) / σ``, in ``values``' dtype."""
        values = np.asarray(values)
        out = (values.astype(np.float64) - self.mean) / self.std
        return out.astype(values.dtype, copy=False)

    def denormalize(self, values: np.ndarray) -> np.ndarray:
        """``σ·x + μ``, in ``values``' dtype."""
        values = np.asarray(values)
        out = values.astype(np.float64) * self.std + self.mean
        return out.astype(values.dtype, copy=False)

    def get_state(self) -> dict[str, float | int]:
        """Plain numbers: the whole state (the learner checkpoints it)."""
        return {
            "beta": self.beta,
            "min_var": self.min_var,
            "running_mean": self.running_mean,
            "running_mean_sq": self.running_mean_sq,
            "debias": self.debias,
            "updates": self.updates,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Put back what :meth:`get_state` returned."""
        self.beta = float(state["beta"])
        self.min_var = float(state["min_var"])
        self.running_mean = float(state["running_mean"])
        self.running_mean_sq = float(state["running_mean_sq"])
        self.debias = float(state["debias"])
        self.updates = int(state["updates"])

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ValueNorm:
        """A normaliser holding ``state``."""
        norm = cls()
        norm.set_state(state)
        return norm

    def __repr__(self) -> str:
        return f"ValueNorm(mean={self.mean:.4g}, std={self.std:.4g}, updates={self.updates})"
