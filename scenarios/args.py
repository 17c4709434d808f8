"""Argument and action checks shared by the scenarios and the engine; errors name the fix.

:func:`normalize_action` is the one action normaliser: ``GraphEnv.step``, counterfactual
replays (:mod:`scenarios.counterfactual`) and the scenarios' own nodes (:func:`checked_action`)
all read actions through it, so an action means the same thing wherever it is executed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from scenarios.base import ScenarioError

if TYPE_CHECKING:
    from scenarios.base import Scenario


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


def zero_action(space: gym.Space) -> Any:
    """The all-zeros element of a Discrete / MultiDiscrete / MultiBinary / Box space."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start)
    return np.zeros(space.shape, dtype=space.dtype)


def normalize_action(space: gym.Space, action: Any) -> tuple[Any, bool]:
    """``action`` in the form the env executes it, and whether it lies in ``space``.

    ``Discrete``: a one-element array becomes its item. ``MultiDiscrete`` / ``MultiBinary``: an
    int64 array of the space's shape whose entries are whole numbers (ints, bools or integral
    floats), else invalid. Other spaces: the action as given, checked by ``space.contains``.
    An invalid action is returned as given.
    """
    if isinstance(space, gym.spaces.MultiDiscrete):
        ints = _whole_numbers(action, space.shape)
        if ints is None:
            return action, False
        low = space.start
        if ints.size > _PY_CHECK:
            return ints, bool(((ints >= low) & (ints < low + space.nvec)).all())
        return ints, _in_ranges(
            ints.ravel().tolist(), low.ravel().tolist(), space.nvec.ravel().tolist()
        )
    if isinstance(space, gym.spaces.MultiBinary):
        ints = _whole_numbers(action, space.shape)
        if ints is None:
            return action, False
        if ints.size > _PY_CHECK:
            return ints, bool(((ints == 0) | (ints == 1)).all())
        return ints, all(x == 0 or x == 1 for x in ints.ravel().tolist())
    if isinstance(space, gym.spaces.Discrete):
        if isinstance(action, np.ndarray):
            action = action.item() if action.size == 1 else action
        if type(action) is int and _INT64_MIN <= action <= _INT64_MAX:  # what contains() does,
            low = int(space.start)  # in exact integers instead of numpy scalars (~3x faster)
            return action, low <= action < low + int(space.n)
    try:
        return action, bool(space.contains(action))
    except (TypeError, ValueError):
        return action, False


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1  # ints Discrete.contains takes as np.int64
#: up to this many entries an integer action is range-checked in Python (a few numpy ufuncs on
#: a small array cost ~3 µs; the loop ~1 µs: every decision is checked twice, by ``GraphEnv.step``
#: and by the node's :func:`checked_action`), beyond it with numpy
_PY_CHECK = 32


def _in_ranges(values: list[int], low: list[int], n: list[int]) -> bool:
    """Every ``values[i]`` lies in ``[low[i], low[i] + n[i])`` (exact Python integers)."""
    for x, lo, k in zip(values, low, n, strict=True):  # noqa: SIM110 (~0.5 µs less than all())
        if not 0 <= x - lo < k:
            return False
    return True


def _whole_numbers(action: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """``action`` as an int64 array of ``shape`` when its entries are whole numbers."""
    raw = action if isinstance(action, np.ndarray) else np.asarray(action)
    if raw.shape != shape:
        return None
    kind = raw.dtype.kind
    if kind in "iub":
        return raw.astype(np.int64, copy=False)
    if kind == "f" and np.isfinite(raw).all() and (raw == np.trunc(raw)).all():
        return raw.astype(np.int64)
    return None


def executed_action(scenario: Scenario, agent: str, action: Any) -> tuple[Any, bool]:
    """The action a ``GraphEnv`` executes for ``agent``'s ``action``, and whether it was valid.

    An invalid action becomes the scenario's default action when the scenario sets
    ``invalid_action_penalty`` (the env charges the penalty); without one it is returned as
    given (``GraphEnv.step`` refuses it).
    """
    executed, ok = normalize_action(scenario.action_space(agent), action)
    if not ok and scenario.invalid_action_penalty is not None:
        return scenario.default_action(agent), False
    return executed, ok


def checked_action(space: gym.Space, action: Any, agent: str) -> np.ndarray:
    """:func:`normalize_action`'s action as an int64 array (0-d for ``Discrete``) for the
    integer spaces, else a ``ValueError`` naming ``agent``, its choice and its space."""
    executed, ok = normalize_action(space, action)
    if not ok:
        raise ValueError(
            f"agent {agent!r} chose {action!r}: not a valid {agent} action in its space {space}"
        )
    return np.asarray(executed, dtype=np.int64)
