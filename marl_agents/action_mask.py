"""Action masks in the pools' torch modules, and observations as module batches.

An agent whose observation space is the masked ``Dict`` of :mod:`scenarios.pz_spaces`
(``{OBS_KEY: flat Box, MASK_KEY: 0/1 Box}``, :func:`~scenarios.pz_spaces.has_action_mask`)
is served by a module that reads :data:`~scenarios.pz_spaces.OBS_KEY` alone (actor and critic)
and, with the pool's ``model.action_mask`` (default on), replaces the logits of the actions the
mask forbids by the dtype's most negative finite value (:func:`masked_logits`) in its
``_forward``: exploration, inference and training alike, so a sampler never draws a masked
action (its probability is exactly 0), greedy evaluation never picks one, and the learner's
log-probabilities and entropy are those of the same masked distribution the sampler drew from
(the PPO ratio stays exact). A finite value, not ``-inf``: entropy's ``p·log p`` is then
``0·finite = 0`` rather than NaN (RLlib's ``ActionMaskingTorchRLModule`` example does the same).

:func:`stack_observations` and :func:`to_tensors` turn a list of observations (flat arrays, or
masked dicts) into a module batch's ``obs`` column, for the samplers and evaluation.

Example:
    >>> import torch
    >>> masked_logits(torch.zeros(1, 3), torch.tensor([[1.0, 0.0, 1.0]])).softmax(-1)
    tensor([[0.5000, 0.0000, 0.5000]])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from scenarios.pz_spaces import MASK_KEY, OBS_KEY, has_action_mask

__all__ = [
    "mask_of",
    "masked_logits",
    "own_observation",
    "own_part",
    "own_space",
    "stack_observations",
    "to_tensors",
]


def own_space(space: gym.Space) -> gym.Space:
    """The part of an observation space a module's networks read: :data:`OBS_KEY`'s ``Box``
    for a masked ``Dict``, else the space itself."""
    return space[OBS_KEY] if has_action_mask(space) else space


def own_part(obs: Any) -> Any:
    """The part of an observation (or a batch of them: tensors, arrays) the networks read:
    :data:`OBS_KEY` of a masked dict, else ``obs`` itself."""
    return obs[OBS_KEY] if isinstance(obs, Mapping) else obs


def own_observation(obs: Any) -> torch.Tensor:
    """A batch's observation tensor the networks read (:func:`own_part`), as float."""
    return own_part(obs).float()


def mask_of(obs: Any) -> torch.Tensor | None:
    """A batch's action mask (``None`` for an observation without one)."""
    return obs[MASK_KEY] if isinstance(obs, Mapping) and MASK_KEY in obs else None


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logits`` with every entry ``mask`` zeroes set to the dtype's most negative finite
    value (``mask``: one 0/1 entry per logit, for ``MultiDiscrete`` the components' masks
    concatenated, as the logits are)."""
    floor = torch.tensor(torch.finfo(logits.dtype).min, dtype=logits.dtype, device=logits.device)
    return torch.where(mask.to(logits.device) > 0.5, logits, floor)


def stack_observations(rows: Sequence[Any]) -> np.ndarray | dict[str, np.ndarray]:
    """``rows`` stacked on a new first axis as ``float32`` (a dict per key)."""
    first = rows[0]
    if isinstance(first, Mapping):
        return {k: np.stack([r[k] for r in rows]).astype(np.float32, copy=False) for k in first}
    return np.stack(rows).astype(np.float32, copy=False)


def to_tensors(
    obs: np.ndarray | Mapping[str, np.ndarray], device: Any = "cpu", *, time_axis: bool = False
) -> Any:
    """:func:`stack_observations`' result as torch tensors on ``device`` (a dict per key);
    with ``time_axis`` each ``[B, ...]`` becomes ``[B, 1, ...]`` (a recurrent module's step)."""
    if isinstance(obs, Mapping):
        return {k: to_tensors(v, device, time_axis=time_axis) for k, v in obs.items()}
    x = torch.from_numpy(obs).to(device)
    return x[:, None] if time_axis else x
