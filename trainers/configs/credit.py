"""``credit:``: how the team reward is split among agents (:class:`CreditConfig`).

The estimators themselves are :mod:`trainers.credit.values`; checks that need the team are
:func:`trainers.credit.settings.check_credit_for`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from trainers.configs.typed import ConfigError, checks_itself, register_shorthand

#: :func:`trainers.credit.values.shapley_exact` refuses teams larger than this (``2**16``
#: coalitions).
EXACT_MAX_AGENTS = 16
ShapleyMethod = Literal["auto", "exact", "permutation", "antithetic", "kernel"]
CreditMethod = Literal["team", "local", "loo", "shapley"]
CreditEstimator = ShapleyMethod

CREDIT_METHODS: tuple[str, ...] = typing.get_args(CreditMethod)
CREDIT_ESTIMATORS: tuple[str, ...] = typing.get_args(CreditEstimator)


def int_at_least(value: Any, low: int) -> bool:
    """``value`` is an int (not a bool) ``>= low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


@dataclasses.dataclass
class CreditConfig:
    """How the team's reward is split between agents before advantages are computed.

    The credit learner connector takes this object as it is; :meth:`check` holds every
    field-level rule, and the rules that need the team (agent count against the estimator,
    ``Outcome.local``) are :func:`trainers.credit.settings.check_credit_for`, run by ``resolve``.

    Attributes:
        method: ``"team"`` (every agent gets the team reward), ``"local"`` (each agent's own
            ``Outcome.local`` reward), ``"loo"`` (leave-one-out difference rewards) or
            ``"shapley"`` (Shapley values from counterfactual replays).
        estimator: Shapley estimator: ``"auto"`` picks ``"exact"`` for at most ``exact_max``
            agents and a sampled one beyond.
        budget: Coalition evaluations per episode for sampled estimators (``None``: the
            estimator's default, ``8n``); at least 2, and at least the estimator's minimum
            for the team (checked in ``resolve``).
        exact_max: Largest team computed exactly (``2**n`` replays an episode), at most
            :data:`trainers.configs.credit.EXACT_MAX_AGENTS`.
        normalize: Standardise advantages per agent after GAE (matters when agents share a
            module; see ``trainers.learners.credit_ppo.PerAgentAdvantageNormalization``).
        workers: Processes that replay episodes for ``loo``/``shapley``, counting the learner
            itself (extra ones are Ray actors): ``None`` uses the cores the trainer leaves idle
            (CPUs − 1 driver − env runners − CPU learners, at least 1, at most 8). Credits do
            not depend on it.
    """

    method: CreditMethod = "team"
    estimator: CreditEstimator = "auto"
    budget: int | None = None
    exact_max: int = 8
    normalize: bool = False
    workers: int | None = None

    def check(self) -> None:
        """Every field-level rule (what the scenario supports is checked in ``resolve``)."""
        if self.method not in CREDIT_METHODS:
            raise ConfigError(
                f"credit.method={self.method!r} is an unknown credit method: use one of "
                f"{', '.join(CREDIT_METHODS)}"
            )
        if self.estimator not in CREDIT_ESTIMATORS:
            raise ConfigError(
                f"credit.estimator={self.estimator!r} is an unknown Shapley estimator: use one "
                f"of {', '.join(CREDIT_ESTIMATORS)}"
            )
        if self.budget is not None and not int_at_least(self.budget, 2):
            raise ConfigError(
                f"credit.budget={self.budget!r} is too small: use null (8 coalition evaluations "
                "per player) or an integer ≥ 2 (v(N) and v(∅) at least)"
            )
        if not int_at_least(self.exact_max, 0) or self.exact_max > EXACT_MAX_AGENTS:
            raise ConfigError(
                f"credit.exact_max={self.exact_max!r} is out of range: use an integer in "
                f"0…{EXACT_MAX_AGENTS} (exact Shapley values cost 2^n replays an episode)"
            )
        if not isinstance(self.normalize, bool):
            raise ConfigError(f"credit.normalize={self.normalize!r}: use true or false")
        if self.workers is not None and (not int_at_least(self.workers, 1) or self.workers > 64):
            raise ConfigError(
                f"credit.workers={self.workers!r} is out of range: use null (the idle cores) or "
                "an integer in 1…64"
            )


register_shorthand(CreditConfig, lambda s: {"method": s})
checks_itself(CreditConfig)
