"""Argument and action checks shared by the built-in scenarios; errors name the fix."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from scenarios.base import ScenarioError


def int_arg(name: str, value: Any, low: int, high: int | None) -> int:
    """An integer in ``[low, high]`` (no upper bound when ``high`` is None); bools rejected."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        valid = f"an integer in [{low}, {high}]" if high is not None else f"an integer ≥ {low}"
        raise ScenarioError(f"{name} must be {valid}, got {value!r}")
    return int(value)


def cost_arg(name: str, value: Any) -> float:
    """A finite, non-negative cost coefficient."""
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise ScenarioError(f"{name} must be a finite number ≥ 0, got {value!r}")
    return float(value)


def checked_action(space: gym.Space, action: Any, agent: str) -> np.ndarray:
    """``action`` as an int64 array inside ``space``, else a ``ValueError`` naming ``agent``."""
    raw = np.asarray(action)
    arr = raw.astype(np.int64) if raw.dtype.kind in "iuf" else None
    if arr is None or raw.shape != space.shape or not np.array_equal(arr, raw):
        raise ValueError(f"agent {agent!r} chose {action!r}: its action space is {space}")
    if not space.contains(arr):
        raise ValueError(f"agent {agent!r} chose {action!r}: its action space is {space}")
    return arr
