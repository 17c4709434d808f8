"""Difficulty knobs: how a scenario lets a curriculum move a task along its difficulty.

A scenario that has a knob declares it as class attributes (``difficulty_knob``: the knob's
name; instances list their levels, easy → hard, in ``difficulty_levels``) and takes a
``difficulty`` argument: ``None`` (default) plays its hardest level, i.e. the scenario as
configured; an ``int`` fixes a level index; ``"seed"`` reads the level from the episode seed,
``seed = (level + 1) * LEVEL_STRIDE + base`` (:func:`level_seed`), and plays the hardest level
for any other seed (those below ``LEVEL_STRIDE``, e.g. evaluation seeds, included). So a task
is still one seed: replays (credit, resume) and GRPO's grouping by seed see the level without
being told.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scenarios.base import ScenarioError

#: seeds per difficulty level when the level is read from the seed (``difficulty="seed"``).
LEVEL_STRIDE = 2**24


def level_seed(level: int, base: int) -> int:
    """The episode seed of task ``base`` (``0 <= base < LEVEL_STRIDE``) at level ``level``."""
    return (int(level) + 1) * LEVEL_STRIDE + int(base) % LEVEL_STRIDE


def check_difficulty(value: Any, levels: tuple[Any, ...], scenario: str) -> int | str | None:
    """``difficulty`` as given, checked: ``None``, ``"seed"`` or a level index."""
    if value is None or value == "seed":
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(levels):
        return value
    raise ScenarioError(
        f"{scenario}: difficulty={value!r} is not a level: give None (hardest), 'seed' (level "
        f"from the episode seed) or an index 0..{len(levels) - 1} of {list(levels)}"
    )


def level_index(difficulty: int | str | None, n_levels: int, rng: np.random.Generator) -> int:
    """The level an episode plays: fixed, the hardest, or read from the seed of ``rng`` (a
    ``default_rng(seed)``, as ``GraphEnv`` passes to ``initial_state``; a seed that
    :func:`level_seed` did not make plays the hardest)."""
    if difficulty is None:
        return n_levels - 1
    if difficulty != "seed":
        return int(difficulty)
    entropy = rng.bit_generator.seed_seq.entropy  # type: ignore[attr-defined]
    seed = int(entropy) if isinstance(entropy, int) else 0
    offset = seed // LEVEL_STRIDE
    return offset - 1 if 1 <= offset <= n_levels else n_levels - 1


def knob_level(scenario: Any, rng: np.random.Generator) -> Any:
    """The knob's value for the episode seeded like ``rng``, from ``scenario.difficulty`` and
    ``scenario.difficulty_levels``."""
    levels = scenario.difficulty_levels
    return levels[level_index(scenario.difficulty, len(levels), rng)]
