"""What a :class:`~trainers.configs.credit.CreditConfig` means for a team: its checks and its
estimator.

``CreditConfig.check`` holds every field-level rule. :func:`check_credit_for` holds the rules
that need the scenario and its agents (called once, from ``trainers.plan.resolve``, before
Ray starts). :func:`shapley_credit` is the one estimator call for one episode's players, used
by the credit connector and by transcripts/evaluation, so both report the same credit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from scenarios.base import ReplayUnavailable
from topologies.errors import MarlError
from trainers.configs.credit import EXACT_MAX_AGENTS
from trainers.configs.typed import ConfigError
from trainers.credit.values import ValueFn, min_budget, shapley

if TYPE_CHECKING:
    from trainers.configs.credit import CreditConfig

__all__ = ["CounterfactualCreditError", "CreditError", "check_credit_for", "shapley_credit"]

#: mixed into the episode seed: the sampled estimators' draws are a function of the episode
SHAPLEY_SEED_SALT = 0x5A4E


class CreditError(MarlError, ValueError):
    """A credit method cannot be applied to an episode or scenario; the message names the fix."""


class CounterfactualCreditError(ConfigError, ReplayUnavailable):
    """Credit ``loo`` / ``shapley`` on a scenario that cannot replay episodes exactly
    (``exact_replay`` False, e.g. a wrapped PettingZoo env): a config error (exit code 2 on
    the CLI) that is also the scenario's :class:`~scenarios.base.ReplayUnavailable`."""


def check_credit_for(
    credit: CreditConfig, scenario: Any, agents: Sequence[str], algorithm: str
) -> None:
    """The credit rules that need the team: ``algorithm`` for ``normalize``, ``Outcome.local``
    for ``local``, the agent count against the exact limit and the sampled budget minimum.

    Raises:
        CounterfactualCreditError: ``loo`` / ``shapley`` on a scenario without exact replays.
        ConfigError: naming the field, the value and the fix.
    """
    if credit.method == "team":
        return
    if credit.method in ("loo", "shapley") and not type(scenario).exact_replay:
        raise CounterfactualCreditError(
            f"credit {credit.method!r} replays episodes with agents left out, but scenario "
            f"{scenario.id()} cannot replay an episode exactly (a wrapped environment: "
            "exact_replay=False): use credit 'team' or 'local'"
        )
    if credit.normalize and algorithm != "PPO":
        raise ConfigError(
            "credit.normalize needs the PPO credit learner: use algorithm PPO or normalize=false"
        )
    n = len(agents)
    if credit.method == "local":
        if not type(scenario).has_local_rewards:  # a capability the scenario class declares
            raise ConfigError(
                f"credit 'local' needs Outcome.local for every agent, but scenario "
                f"{scenario.id()} does not declare has_local_rewards: use credit 'loo' or "
                "'shapley' (counterfactual replays), or 'team'"
            )
    elif credit.method == "shapley" and credit.estimator == "exact" and n > EXACT_MAX_AGENTS:
        raise ConfigError(
            f"credit.estimator 'exact' needs 2^{n} replays per episode for {n} agents "
            f"(limit {EXACT_MAX_AGENTS} agents): use 'kernel' or 'antithetic' with a budget"
        )
    elif credit.method == "shapley" and credit.estimator not in ("auto", "exact"):
        need = min_budget(credit.estimator, n)
        if credit.budget is not None and credit.budget < need:
            raise ConfigError(
                f"credit.budget={credit.budget} is below the {credit.estimator} estimator's "
                f"minimum for {n} agents: set credit.budget ≥ {need}"
            )


def shapley_credit(
    credit: CreditConfig, players: Sequence[str], v: ValueFn, seed: int
) -> dict[str, float]:
    """Shapley credit of one episode's ``players`` under ``credit``'s estimator.

    Exact for ``estimator="exact"`` or a named sampled estimator on at most ``exact_max``
    players; ``"auto"`` decides in :func:`trainers.credit.values.shapley`. A budget below the
    estimator's minimum for this episode's players is raised to it (players vary per episode;
    ``resolve`` checked it against the whole team). Sampling is seeded by the episode ``seed``.
    """
    n = len(players)
    method = credit.estimator
    if method == "exact" or (method != "auto" and n <= credit.exact_max):
        return shapley(players, v, "exact")
    budget = credit.budget
    if budget is not None:
        budget = max(budget, n + 1 if method == "auto" else min_budget(method, n))
    rng = np.random.default_rng([seed, SHAPLEY_SEED_SALT])
    return shapley(players, v, method, budget=budget, rng=rng, exact_max=credit.exact_max)
