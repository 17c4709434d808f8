"""Experiment configuration: small dataclasses per axis, with an exact YAML round trip."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CreditMethod = Literal["team", "local", "loo", "shapley"]
CreditEstimator = Literal["auto", "exact", "permutation", "antithetic", "kernel"]

CREDIT_METHODS: tuple[str, ...] = ("team", "local", "loo", "shapley")
CREDIT_ESTIMATORS: tuple[str, ...] = ("auto", "exact", "permutation", "antithetic", "kernel")


@dataclass
class CreditConfig:
    """How the team's reward is split between agents before advantages are computed.

    Attributes:
        method: ``"team"`` (every agent gets the team reward), ``"local"`` (each agent's own
            ``Outcome.local`` reward), ``"loo"`` (leave-one-out difference rewards) or
            ``"shapley"`` (Shapley values from counterfactual replays).
        estimator: Shapley estimator: ``"auto"`` picks ``"exact"`` for at most ``exact_max``
            agents and a sampled one beyond.
        budget: Coalition evaluations per episode for sampled estimators (``None``: the
            estimator's default).
        repeats: Replays per coalition (averaged; reduces verifier noise).
        exact_max: Largest team for which ``"auto"`` computes exact Shapley values.
        normalize: Rescale credits so they sum to the team return.
    """

    method: CreditMethod = "team"
    estimator: CreditEstimator = "auto"
    budget: int | None = None
    repeats: int = 1
    exact_max: int = 8
    normalize: bool = False
