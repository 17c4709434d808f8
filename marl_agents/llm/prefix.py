"""Shared prompts: one forward pass per distinct prompt, its KV cache fanned out to the rows.

A GRPO group is ``G`` completions of one prompt, so a batch of ``B`` groups holds ``B``
distinct prompts in ``G·B`` rows. The sampler (:class:`~marl_agents.llm.hf_backend.HFBackend`)
and the learner's teacher-forced scoring
(:func:`~marl_agents.llm.hf_backend.teacher_forced_logprobs`) run the prompt part once per
distinct prompt and copy its KV cache to every row that shares it (transformers'
``Cache.reorder_cache``, the beam-search re-indexing along the batch), then run each row's own
tokens on top. The result is the same computation as one forward per row, up to float rounding
between batch shapes; with gradients, each shared activation receives the sum of its rows'
gradients, exactly what ``G`` separate forwards would add up to. With 128-token prompts and
16-token completions this cuts the learner's forward/backward work ~4× and the sampler's
prefill ``G``×.

Example:
    >>> distinct([[1, 2], [3], [1, 2]])
    ([0, 1], [0, 1, 0])
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch


def distinct(rows: Sequence[Sequence[Hashable]]) -> tuple[list[int], list[int]]:
    """``(firsts, index)``: the first row of each distinct row, in first-seen order, and per
    row the number of its distinct row (so ``rows[firsts[index[r]]] == rows[r]``)."""
    seen: dict[tuple[Hashable, ...], int] = {}
    firsts: list[int] = []
    index = []
    for r, row in enumerate(rows):
        j = seen.setdefault(tuple(row), len(seen))
        if j == len(firsts):
            firsts.append(r)
        index.append(j)
    return firsts, index


def padded(
    rows: Sequence[Sequence[int]], pad_id: int, device: torch.device, *, left: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, position_ids)`` ``[n, width]``, each row's positions
    counting from 0 at its first token. ``left``: every row's last token sits at column
    ``-1`` (a prefill); else every row starts at column 0 (teacher forcing)."""
    n, width = len(rows), max(len(r) for r in rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((n, width), dtype=torch.long, device=device)
    for r, row in enumerate(rows):
        cols = slice(width - len(row), width) if left else slice(0, len(row))
        ids[r, cols] = torch.tensor(list(row), dtype=torch.long)
        mask[r, cols] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def cache_of(out: Any) -> tuple[str, Any]:
    """The name under which a transformers model output (and the next call's keyword) carries
    its KV cache, and the cache (``cache`` from transformers 5.24 on, else
    ``past_key_values``)."""
    key = "cache" if "cache" in out else "past_key_values"
    return key, out[key]


def fan_out(cache: Any, index: Sequence[int] | torch.Tensor, device: torch.device) -> Any:
    """``cache`` re-indexed along the batch: row ``r`` of the result is row ``index[r]``.

    Raises:
        TypeError: a legacy (tuple) cache, which cannot be re-indexed in place.
    """
    if not hasattr(cache, "reorder_cache"):
        raise TypeError(f"cannot share prompts with a {type(cache).__name__} KV cache")
    cache.reorder_cache(torch.as_tensor(index, dtype=torch.long, device=device))
    return cache


def suffix_logits(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    token_ids: Sequence[Sequence[int]],
    *,
    pad_id: int,
) -> torch.Tensor | None:
    """Logits predicting each row's ``token_ids`` after its ``prompt_ids``, the prompts run
    once per distinct prefix, or ``None`` when no two rows share one (or a prompt is shorter
    than 2 tokens): use one forward over ``prompt + tokens`` per row then.

    The shared prefix is each prompt but its last token (left-padded, cached once, fanned
    out); each row then runs ``[last prompt token] + tokens`` (right-padded) on its copy, so
    ``logits[r, k]`` predicts ``token_ids[r][k]``.

    Returns:
        ``[n, 1 + max_tokens, vocab]`` logits in the model's dtype, or ``None``.
    """
    n = len(prompt_ids)
    if n < 2 or min(len(p) for p in prompt_ids) < 2:
        return None
    firsts, index = distinct([p[:-1] for p in prompt_ids])
    if len(firsts) == n:
        return None
    dev = next(model.parameters()).device
    ids, mask, positions = padded([prompt_ids[r][:-1] for r in firsts], pad_id, dev, left=True)
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    key, cache = cache_of(out)
    rows = torch.as_tensor(index, dtype=torch.long, device=dev)
    cache = fan_out(cache, rows, dev)
    suffixes = [[p[-1], *t] for p, t in zip(prompt_ids, token_ids, strict=True)]
    sids, smask, _ = padded(suffixes, pad_id, dev, left=False)
    start = torch.tensor([len(p) - 1 for p in prompt_ids], dtype=torch.long, device=dev)
    spos = start[:, None] + torch.arange(sids.shape[1], device=dev)[None, :]
    return model(
        input_ids=sids,
        attention_mask=torch.cat([mask[rows], smask], dim=1),
        position_ids=spos,
        use_cache=True,
        **{key: cache},
    ).logits
