"""Categorical math on logits without distribution objects: log-probs, entropy and KL with the
ops ``torch.distributions`` uses, for the lean learner and the batched sampler's rows.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.distribution.torch.torch_distribution import (
    TorchCategorical,
    TorchMultiCategorical,
)

from trainers.rllib_compat.distributions import categorical_parts


def categorical_lens(dist_cls: Any, logits: torch.Tensor) -> tuple[list[int], bool] | None:
    """``(category counts, multi)`` of an RLlib categorical (``multi`` False) or
    multi-categorical class, or None for any other distribution (probed on one row of
    ``logits``)."""
    dist = dist_cls.from_logits(logits[:1].detach())
    if type(dist) is TorchCategorical:
        return [int(logits.shape[-1])], False
    ok = isinstance(dist, TorchMultiCategorical) and all(
        getattr(type(dist), m) is getattr(TorchMultiCategorical, m)
        for m in ("logp", "entropy", "kl")
    )
    parts = categorical_parts(dist) if ok else []
    if not ok or not all(type(c) is TorchCategorical for c in parts):
        return None
    return [int(c.logits.shape[-1]) for c in parts], True


class Categoricals:
    """Independent categoricals over split logits, with ``torch.distributions``' own ops
    (``Categorical`` and RLlib's ``TorchMultiCategorical``): bit for bit the same values and
    gradients, without the objects."""

    def __init__(self, logits: torch.Tensor, lens: list[int], multi: bool) -> None:
        self.multi = multi
        parts = torch.split(logits, lens, dim=-1) if self.multi else (logits,)
        self.logits = [p - p.logsumexp(dim=-1, keepdim=True) for p in parts]
        self._probs: list[torch.Tensor] | None = None

    @property
    def probs(self) -> list[torch.Tensor]:
        if self._probs is None:
            self._probs = [torch.softmax(lg, dim=-1) for lg in self.logits]
        return self._probs

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        if not self.multi:
            return _cat_logp(self.logits[0], actions)
        values = torch.unbind(actions, dim=-1)
        logps = torch.stack([_cat_logp(lg, v) for lg, v in zip(self.logits, values, strict=True)])
        return torch.sum(logps, dim=0)

    def entropy(self) -> torch.Tensor:
        ents = [_cat_entropy(lg, p) for lg, p in zip(self.logits, self.probs, strict=True)]
        return ents[0] if not self.multi else torch.sum(torch.stack(ents, dim=-1), dim=-1)

    def kl(self, other: Categoricals) -> torch.Tensor:
        kls = [
            _cat_kl(pl, pp, ql, qp)
            for pl, pp, ql, qp in zip(
                self.logits, self.probs, other.logits, other.probs, strict=True
            )
        ]
        return kls[0] if not self.multi else torch.sum(torch.stack(kls, dim=-1), dim=-1)


class StackedCategoricals:
    """:class:`Categoricals` of ``K`` parts of equal size ``n`` (a ``MultiDiscrete`` with one
    ``nvec`` value) on a ``[..., K, n]`` view of the logits: each op runs once over all parts
    instead of once per part. Per row and part the same reductions in the same order, and the
    sums over parts reduce the same layouts as :class:`Categoricals` (``logp``: over a ``[K,
    ...]`` stack; ``entropy``/``kl``: over a ``[..., K]`` stack), so values and gradients are
    bit for bit :class:`Categoricals`' (tested)."""

    def __init__(self, logits: torch.Tensor, parts: int) -> None:
        view = logits.view(*logits.shape[:-1], parts, logits.shape[-1] // parts)
        self.logits = view - view.logsumexp(dim=-1, keepdim=True)
        self._probs: torch.Tensor | None = None

    @property
    def probs(self) -> torch.Tensor:
        if self._probs is None:
            self._probs = torch.softmax(self.logits, dim=-1)
        return self._probs

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        logps = self.logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        return torch.sum(logps.movedim(-1, 0).contiguous(), dim=0)

    def entropy(self) -> torch.Tensor:
        return torch.sum(_cat_entropy(self.logits, self.probs), dim=-1)

    def kl(self, other: StackedCategoricals) -> torch.Tensor:
        return torch.sum(_cat_kl(self.logits, self.probs, other.logits, other.probs), dim=-1)


def categoricals(
    logits: torch.Tensor, lens: list[int], multi: bool
) -> Categoricals | StackedCategoricals:
    """The distributions of :func:`categorical_lens`'s ``(lens, multi)``: stacked when there
    are several parts of one size on the CPU (where the bit-for-bit equality is tested; other
    devices pick reduction kernels by shape)."""
    if multi and len(lens) > 1 and len(set(lens)) == 1 and logits.device.type == "cpu":
        return StackedCategoricals(logits, len(lens))
    return Categoricals(logits, lens, multi)


def _cat_logp(logits: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    value, log_pmf = torch.broadcast_tensors(value.long().unsqueeze(-1), logits)
    return log_pmf.gather(-1, value[..., :1]).squeeze(-1)


def _cat_entropy(logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    clamped = torch.clamp(logits, min=torch.finfo(logits.dtype).min)
    return -(clamped * probs).sum(-1)


def _cat_kl(
    p_logits: torch.Tensor, p_probs: torch.Tensor, q_logits: torch.Tensor, q_probs: torch.Tensor
) -> torch.Tensor:
    t = p_probs * (p_logits - q_logits)  # masked_fill: index_put's values, no nonzero()
    t = t.masked_fill((q_probs == 0).expand_as(t), float("inf"))
    return t.masked_fill((p_probs == 0).expand_as(t), 0).sum(-1)
