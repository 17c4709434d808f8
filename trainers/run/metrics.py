"""Metric rows: RLlib's nested result flattened into one namespaced row per iteration
(``charts/…``, ``losses/<pool>/…``, ``<agent>/…``) and the headline keys.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger(__name__)

#: the headline metric: mean verified team return per episode in an iteration.
RETURN_KEY = "charts/team_return"
ORACLE_FRACTION_KEY = "charts/oracle_fraction"
#: per-scenario headline numbers shown next to the team return (:mod:`trainers.signals.headline`),
#: as (row key, label)
HEADLINE_EXTRA = (("charts/epymarl_return", "EPyMARL return"),)
LOSS_KEYS = (
    "policy_loss",
    "vf_loss",
    "entropy",
    "mean_kl_loss",
    "vf_explained_var",
    "total_loss",
    "vf_loss_unclipped",
)


# ----- metrics ------------------------------------------------------------------------------
def flatten_result(
    result: Mapping[str, Any], agent_to_pool: Mapping[str, str], frozen: set[str]
) -> dict[str, Any]:
    """Namespaced metrics of one ``algo.train()`` result.

    ``charts/…``: iteration, env steps, throughput, team return, success, oracle fraction,
    failed episodes (``error_rate``: a node raised; ``timeout_rate``: the wall-clock limit;
    ``limit_rate``: the step limit; all three also count in ``truncated``),
    ``rows_per_generate`` (LLM pools on the batched sampler: mean rows per ``generate``) and
    the scenario's metrics; ``losses/<pool>/…`` for learning pools (PPO's losses, and GRPO's
    ``grpo/…`` statistics such as ``logprob_gap_fresh``); ``<agent>/return`` and
    ``<agent>/credit`` per agent.
    """
    out: dict[str, Any] = {}
    runners = result.get("env_runners", {}) or {}
    dt = float(result.get("time_this_iter_s", 0.0) or 0.0)
    steps = _num(runners.get("num_env_steps_sampled"))
    out["charts/iteration"] = _count(result.get("training_iteration"))
    out["charts/env_steps"] = _count(result.get("num_env_steps_sampled_lifetime")) or _count(
        runners.get("num_env_steps_sampled_lifetime")
    )
    out["charts/time_s"] = _num(result.get("time_total_s"))
    out["charts/iteration_s"] = dt
    out["charts/env_steps_per_s"] = steps / dt if dt > 0 else 0.0
    out["charts/episode_len"] = _num(runners.get("episode_len_mean"))
    marl = runners.get("marl", {}) or {}
    n = _count(marl.get("episodes"))  # 0 when no runner reported (one died mid-iteration)
    out["charts/episodes"] = n
    if n > 0:
        out[RETURN_KEY] = _num(marl.get("team_return")) / n
        out["charts/success"] = _num(marl.get("success")) / n
        out["charts/truncated"] = _num(marl.get("truncated")) / n
        out["charts/error_rate"] = _num(marl.get("error")) / n
        out["charts/timeout_rate"] = _num(marl.get("timeout")) / n
        out["charts/limit_rate"] = _num(marl.get("limit")) / n
        if "oracle" in marl:
            oracle = _num(marl["oracle"])
            out["charts/oracle"] = oracle / n
            if abs(oracle) > 1e-9:
                out[ORACLE_FRACTION_KEY] = _num(marl.get("team_return")) / oracle
        llm = marl.get("llm") or {}  # the batched sampler's LLM generate calls
        if "rows_per_generate" in llm:
            out["charts/rows_per_generate"] = _num(llm["rows_per_generate"])
        for key, value in marl.items():
            if key.startswith("metric/"):
                out[f"charts/{key.removeprefix('metric/')}"] = _num(value) / n
    for agent, value in (runners.get("agent_episode_returns_mean") or {}).items():
        out[f"{agent}/return"] = _num(value)
    learners = result.get("learners", {}) or {}
    for pool, stats in learners.items():
        if not isinstance(stats, Mapping) or pool in frozen:
            continue
        for key, value in stats.items():
            if key in LOSS_KEYS or (isinstance(key, str) and key.startswith("grpo/")):
                out[f"losses/{pool}/{key}"] = _num(value)
    for key, value in _walk(learners):
        parts = key.split("/")
        if "credit" in parts[:-1] and parts[-1] in agent_to_pool:
            out[f"{parts[-1]}/credit"] = _num(value)
    return {k: v for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}


def _walk(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        path = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            yield from _walk(value, path)
        else:
            yield path, value


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan") if value is not None else 0.0


def _count(value: Any) -> int:
    """A counter from RLlib's results: 0 when missing, NaN or infinite."""
    x = _num(value)
    return int(x) if math.isfinite(x) else 0
