"""Per-source reward normalisation for GRPO (``rewards.normalize: per_source``).

:func:`per_source_rewards` is the pure function the GRPO advantage connector applies: each
source z-scored within its group, then summed with the sources' absolute weights. The
``rewards:`` settings are :mod:`trainers.configs.rewards`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def per_source_rewards(
    parts: Sequence[Mapping[str, float]],
    totals: Sequence[float],
    weights: Mapping[str, float],
    groups: Sequence[int],
    eps: float = 1e-6,
) -> np.ndarray:
    """Per-source normalisation: ``Σ_s |w_s| · z_g(r_s)`` per sample.

    ``parts[i]`` is what sample ``i`` was paid by each source (weighted); ``totals[i]`` its
    whole return (the remainder ``totals − Σ parts`` — penalties, per-agent emitted rewards —
    is one more component, weight 1, when it exceeds float32 rounding); ``z_g`` standardises
    within the sample's group (mean 0, divided by std + ``eps``; 0 where the group is
    constant). Normalising ``w·r`` equals
    ``sign(w)`` times normalising ``r``, hence ``|w|``.

    Example:
        >>> per_source_rewards([{"a": 10.0}, {"a": 0.0}], [10.0, 0.0], {"a": 2.0}, [0, 0]).round(3)
        array([ 2., -2.])
    """
    n = len(totals)
    names = sorted({k for p in parts for k in p} | set(weights))
    cols = {s: np.array([float(p.get(s, 0.0)) for p in parts]) for s in names}
    rest = np.asarray(totals, dtype=np.float64) - sum(cols.values(), np.zeros(n))
    comps = [(abs(float(weights.get(s, 1.0))), cols[s]) for s in names]
    if np.abs(rest).max(initial=0.0) > 1e-5:  # more than float32 rounding of the returns
        comps.append((1.0, rest))
    groups = np.asarray(groups)
    out = np.zeros(n)
    for w, values in comps:
        for g in np.unique(groups):
            m = groups == g
            v = values[m]
            std = v.std()
            out[m] += w * ((v - v.mean()) / (std + eps) if std > 0 else 0.0)
    return out


def per_source_from_episodes(
    sa_episodes: Sequence[Any], rewards: np.ndarray, groups: np.ndarray
) -> np.ndarray:
    """``rewards`` (one return per agent episode) with :func:`per_source_rewards` applied where
    the episodes' final infos ask for it (``reward_normalize: per_source``, written by
    :mod:`scenarios.reward_sources`); otherwise ``rewards`` unchanged. Episodes are RLlib
    ``SingleAgentEpisode``s (``get_infos()``)."""
    last = []
    for e in sa_episodes:
        infos = e.get_infos()
        last.append(infos[-1] if len(infos) and isinstance(infos[-1], Mapping) else {})
    if not last or any(x.get("reward_normalize") != "per_source" for x in last):
        return rewards
    parts = [x.get("reward_parts", {}) for x in last]
    out = per_source_rewards(parts, rewards, last[0].get("reward_weights", {}), groups)
    return out.astype(np.float32)
