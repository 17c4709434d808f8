"""Argument validation of the ``delegate`` scenario: each error names the argument and the fix."""

from __future__ import annotations

from typing import Any

import numpy as np

from scenarios.base import ScenarioError

VALID_KWARGS = (
    "parts",
    "types",
    "skills_seed",
    "skills",
    "parallel",
    "max_rounds",
    "latency_cost",
    "call_cost",
    "difficulty",
)


def check_unknown(unknown: dict[str, Any]) -> None:
    """Reject keyword arguments ``delegate`` does not know."""
    if unknown:
        raise ScenarioError(
            f"delegate got unknown argument(s) {sorted(unknown)}: "
            f"valid are {', '.join(VALID_KWARGS)}"
        )


def check_parallel(value: Any) -> bool:
    """``parallel`` must be a bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise ScenarioError(f"parallel must be True or False, got {value!r}")
    return bool(value)


def check_skills(skills: Any, rows: int, types: int, any_rows: bool) -> np.ndarray:
    """An explicit ``(rows, types)`` matrix of probabilities (any row count when ``any_rows``)."""
    want = f"(N, {types}) with N ≥ 1" if any_rows else f"({rows}, {types}) = (workers, types)"
    try:
        arr = np.array(skills, dtype=float)
    except (TypeError, ValueError):
        raise ScenarioError(f"skills must be a numeric matrix of shape {want}") from None
    bad_shape = arr.ndim != 2 or arr.shape[1] != types or arr.shape[0] < 1
    if bad_shape or (not any_rows and arr.shape[0] != rows):
        raise ScenarioError(f"skills must have shape {want}, got {arr.shape}")
    if not np.isfinite(arr).all() or (arr < 0).any() or (arr > 1).any():
        raise ScenarioError("skills must be success probabilities in [0, 1]")
    return arr
