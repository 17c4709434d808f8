"""Sampling one action per row, each row from its own random stream (the batched sampler's).

Contract: row ``r`` of a batch consumes draws from ``rngs[r]`` only, a fixed number per row
(:func:`draws_per_row`), so a sub-env's actions depend on its own generator alone.
Categorical parts are drawn by inverse CDF on one uniform each (part ``j`` from the ``j``-th
uniform of the row), diagonal Gaussians from standard normals. :func:`categorical_rows` is the
fast path for RLlib's (multi-)categoricals: the ops of :class:`~trainers.learners.lean.
Categoricals` (and so of ``torch.distributions``) on all parts at once, and the same numbers
bit for bit (``tests/test_batched_runner.py`` compares them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from ray.rllib.core.distribution.torch.torch_distribution import (
    TorchCategorical,
    TorchDiagGaussian,
    TorchMultiCategorical,
)

from trainers.learners.categorical import StackedCategoricals
from trainers.rllib_compat.distributions import categorical_parts, torch_dist


def draws_per_row(dist: Any) -> int:
    """How many random numbers one row of ``dist`` consumes (0: sampled by torch)."""
    if isinstance(dist, TorchCategorical):
        return 1
    if isinstance(dist, TorchMultiCategorical):
        return len(categorical_parts(dist))
    if isinstance(dist, TorchDiagGaussian):
        return int(torch_dist(dist).loc.shape[-1])
    return 0


def sample_rows(dist: Any, rngs: Sequence[np.random.Generator]) -> torch.Tensor:
    """A sample of every row of ``dist``, row ``r`` driven by ``rngs[r]`` alone.

    Categorical parts by inverse CDF on one uniform each, diagonal Gaussians from standard
    normals; other distributions fall back to ``dist.sample()`` (torch's global RNG).
    """
    k = draws_per_row(dist)
    if k == 0:
        return dist.sample()
    if isinstance(dist, TorchDiagGaussian):
        normal = torch_dist(dist)
        z = torch.from_numpy(np.stack([rng.standard_normal(k) for rng in rngs])).to(
            normal.loc.dtype
        )
        return normal.loc + normal.scale * z
    cats = [dist] if isinstance(dist, TorchCategorical) else categorical_parts(dist)
    act = inverse_cdf([torch_dist(c).probs for c in cats], rngs)
    return act[:, 0] if isinstance(dist, TorchCategorical) else act


def inverse_cdf(probs: Sequence[torch.Tensor], rngs: Sequence[np.random.Generator]) -> torch.Tensor:
    """``[B, len(probs)]`` category indices: part ``j`` of row ``r`` from the ``j``-th of
    ``len(probs)`` uniforms drawn from ``rngs[r]``."""
    u = torch.from_numpy(np.stack([rng.random(len(probs)) for rng in rngs]))
    parts = []
    for j, p in enumerate(probs):
        cdf = p.double().cumsum(-1)
        pick = (cdf < u[:, j : j + 1]).sum(-1).clamp_max(p.shape[-1] - 1)
        act = pick.numpy()[:, None].copy()
        _off_support(p.detach().cpu().numpy()[:, None], act)
        parts.append(torch.from_numpy(act[:, 0]))
    return torch.stack(parts, dim=-1)


def categorical_rows(
    logits: torch.Tensor,
    lens: Sequence[int],
    multi: bool,
    rngs: Sequence[np.random.Generator] | None,
) -> tuple[np.ndarray, torch.Tensor]:
    """Actions (int64, ``[B, len(lens)]``, or ``[B]`` for a single categorical) and their
    log-probabilities (``[B]``) of independent categoricals over ``logits`` split by ``lens``:
    sampled by inverse CDF with ``rngs[r]``'s uniforms, or the modes for ``rngs=None``.

    The same numbers as ``Categoricals(logits, lens, multi)`` with :func:`inverse_cdf` on its
    ``probs`` (or ``argmax`` of its logits) and its ``logp``; parts of one size are
    normalised in one op over a ``[B, parts, size]`` view
    (:class:`~trainers.learners.categorical.StackedCategoricals`: each row's reduction is the same).
    """
    b = logits.shape[0]
    logits = logits.detach().cpu()  # numpy below (a no-op for the runners' CPU modules)
    if len(set(lens)) == 1:
        groups = [StackedCategoricals(logits, len(lens))]
    else:
        groups = [StackedCategoricals(p, 1) for p in torch.split(logits, list(lens), dim=-1)]
    u = None if rngs is None else np.array([rng.random(len(lens)) for rng in rngs])
    acts, picked, j = [], [], 0
    for cats in groups:
        norm = cats.logits  # [B, k, n]: log-probabilities
        k, n = norm.shape[1], norm.shape[2]
        if u is None:
            act = norm.argmax(-1).numpy()
        else:
            probs = cats.probs.numpy()
            cdf = probs.astype(np.float64).cumsum(-1)
            act = (cdf < u[:, j : j + k, None]).sum(-1)
            np.minimum(act, n - 1, out=act)
            _off_support(probs, act)
        acts.append(act)
        rows = np.arange(0, b * k * n, n).reshape(b, k)  # flat offsets of each [r, part]
        picked.append(norm.numpy().reshape(-1)[rows + act])
        j += k
    act = acts[0] if len(acts) == 1 else np.concatenate(acts, axis=1)
    parts = picked[0] if len(picked) == 1 else np.concatenate(picked, axis=1)
    if not multi:
        return act[:, 0], torch.from_numpy(parts[:, 0].copy())
    # summed as Categoricals sums its stacked [parts, B] log-probabilities
    return act, torch.sum(torch.from_numpy(np.ascontiguousarray(parts.T)), dim=0)


def _off_support(probs: np.ndarray, act: np.ndarray) -> None:
    """Move, in place, each pick of probability 0 (``act``: ``[B, k]`` picks of ``probs``'
    ``[B, k, n]``) to the nearest action of positive probability below it, else above it.

    Inverse CDF picks one only where the uniform lands past the float sum of the probabilities
    (the last actions masked) or on 0 exactly (the first ones masked): a masked action
    (:mod:`marl_agents.action_mask`) is then never drawn, and the draw keeps its meaning.
    """
    picked = np.take_along_axis(probs, act[..., None], axis=-1)[..., 0]
    for r, part in zip(*np.nonzero(picked == 0), strict=True):
        allowed = np.flatnonzero(probs[r, part] > 0)
        if allowed.size:
            below = allowed[allowed <= act[r, part]]
            act[r, part] = below[-1] if below.size else allowed[0]
