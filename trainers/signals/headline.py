"""The numbers a user compares, per scenario: what a run and ``marl eval`` report beside the
team return.

* **Success** only where the scenario defines it: a wrapped PettingZoo env has no notion of a
  solved task (its ``Outcome.success`` is always false), so its rows and tables carry no
  success rate (it read "success 0.0%" before, and flattened the curve's axis). A scenario
  class says so with ``has_success = False``; PettingZoo scenarios without the attribute count
  as not defining it.
* **EPyMARL's team return** for MPE ``simple_spread`` with mpe2's ``local_ratio`` 0.5 (the
  default): ``R_team = 2·Σ_i R_i − N·T`` (``experiments/epymarl.py`` derives it; docs/results.md
  and the EPyMARL and MAPPO papers report it), next to the team return marl reports (the
  agents' mean return, ``Σ_i R_i / N``). Training rows get ``charts/epymarl_return`` (of the
  stochastic training episodes), ``marl eval`` the greedy one (``epymarl_return``).

Example:
    >>> epymarl_return({"sum_return": -100.0, "steps": 25.0}, n_agents=3)
    -275.0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the scenario references that run mpe2's simple_spread with its rewards summed as mpe2's
#: (the team-reward wrappers of experiments.spread_mappo keep Σ_i R_i)
SPREAD_REFS = (
    "mpe2.simple_spread_v3:parallel_env",
    "experiments.spread_mappo:team_parallel_env",
    "experiments.spread_mappo:normed_parallel_env",
    "experiments.spread_mappo:id_parallel_env",
)
#: row key of the training episodes' EPyMARL return
EPYMARL_KEY = "charts/epymarl_return"


def has_success(scenario: Any) -> bool:
    """Whether ``scenario`` defines success (``has_success``; PettingZoo envs do not)."""
    declared = getattr(type(scenario), "has_success", None)
    if declared is not None:
        return bool(declared)
    from scenarios.pettingzoo_env import PettingZooScenario

    return not isinstance(scenario, PettingZooScenario)


def reports_epymarl(cfg: Any) -> bool:
    """Whether ``cfg``'s scenario is simple_spread with ``local_ratio`` 0.5 (EPyMARL's
    convention applies exactly there)."""
    kwargs = cfg.scenario_kwargs or {}
    continuous = bool(kwargs.get("continuous_actions", False))
    return cfg.scenario in SPREAD_REFS and kwargs.get("local_ratio", 0.5) == 0.5 and not continuous


def epymarl_return(metrics: Mapping[str, Any], n_agents: int) -> float:
    """``2·Σ_i R_i − N·T`` from a PettingZoo scenario's ``sum_return`` and ``steps``."""
    return 2.0 * float(metrics["sum_return"]) - n_agents * float(metrics["steps"])


def finish_row(row: dict[str, Any], cfg: Any, plan: Any) -> None:
    """A training row's per-scenario headline: ``charts/success`` dropped where the scenario
    defines none, ``charts/epymarl_return`` added for simple_spread."""
    if not plan.has_success:
        row.pop("charts/success", None)
    if reports_epymarl(cfg) and "charts/sum_return" in row and "charts/steps" in row:
        sums = {"sum_return": row["charts/sum_return"], "steps": row["charts/steps"]}
        row[EPYMARL_KEY] = epymarl_return(sums, len(plan.agents))


__all__ = [
    "EPYMARL_KEY",
    "SPREAD_REFS",
    "epymarl_return",
    "finish_row",
    "has_success",
    "reports_epymarl",
]
