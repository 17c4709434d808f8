"""Gym spaces for text agents: prompt token ids in, generated token ids out.

A text agent in an RLlib environment observes the token ids of its prompt and acts with the
token ids it generated. Both are fixed-length, right-padded integer arrays, because RLlib
batches observations and actions as arrays of one shape per module.

**Why ``MultiDiscrete`` and not ``Box``.** RLlib's module-to-env pipeline
(``NormalizeAndClipActions``) rewrites ``Box`` actions: with ``normalize_actions=True`` (the
default) a float ``Box`` action is "unsquashed" from ``[-1, 1]`` into the space's bounds and an
integer ``Box`` action is shifted by ``low``; with ``clip_actions`` it is clipped. A float
``Box`` of token ids would reach the environment as different ids. ``MultiDiscrete`` actions
pass through unchanged, and ``MultiDiscrete`` observations are batched as integer arrays
without flattening or one-hot encoding (no default env-to-module piece touches them). So both
spaces are ``MultiDiscrete([vocab_size + 1] * length)``, dtype ``int64``
(``tests/test_llm_rllib.py`` checks RLlib's functions on both kinds of space).

**Padding.** The padding value is :attr:`TextSpaces.pad_id` ``= vocab_size``: one id past
the model's vocabulary, so it can never be confused with a real token (not even the
tokenizer's own pad token, which a model may legitimately sample). Arrays are right-padded:
the ids are the prefix before the first ``pad_id``. A prompt longer than
``max_prompt_tokens`` keeps its *last* ``max_prompt_tokens`` ids (the end of a chat prompt,
with the generation header, is what matters) unless ``truncate=False``, which raises.

Example:
    >>> spaces = TextSpaces(vocab_size=384, max_prompt_tokens=8, max_new_tokens=4)
    >>> obs = spaces.encode_prompt([5, 6, 7])
    >>> obs.tolist()
    [5, 6, 7, 384, 384, 384, 384, 384]
    >>> spaces.decode_prompt(obs)
    [5, 6, 7]
    >>> spaces.observation_space.contains(obs)
    True
    >>> spaces.decode_action(spaces.encode_action([9, 2]))
    [9, 2]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces as gym_spaces

#: dtype of encoded prompt and action arrays.
ID_DTYPE = np.int64


@dataclasses.dataclass(frozen=True)
class TextSpaces:
    """Observation and action spaces of one text agent, with encode/decode helpers.

    Attributes:
        vocab_size: number of token ids the model can emit (``len(tokenizer)``, or the
            model's ``config.vocab_size`` if larger). Ids are in ``[0, vocab_size)``.
        max_prompt_tokens: length of the observation array (prompt ids, padded).
        max_new_tokens: length of the action array (generated ids, padded); also the
            generation budget of the policy.
    """

    vocab_size: int
    max_prompt_tokens: int
    max_new_tokens: int

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_prompt_tokens", "max_new_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"TextSpaces.{name} must be a positive int, got {value!r}")

    @classmethod
    def for_tokenizer(
        cls, tokenizer: Any, max_prompt_tokens: int, max_new_tokens: int, model: Any = None
    ) -> TextSpaces:
        """Spaces sized for ``tokenizer`` (and ``model``'s embedding size if it is larger).

        Args:
            tokenizer: a Hugging Face tokenizer.
            max_prompt_tokens: observation length.
            max_new_tokens: action length.
            model: optional HF model; its ``config.vocab_size`` is used if larger than the
                tokenizer's vocabulary (models often pad their embedding matrix).
        """
        vocab = len(tokenizer)
        if model is not None:
            vocab = max(vocab, int(model.config.vocab_size))
        return cls(int(vocab), int(max_prompt_tokens), int(max_new_tokens))

    @property
    def pad_id(self) -> int:
        """The padding value: ``vocab_size``, never a real token id."""
        return self.vocab_size

    @property
    def observation_space(self) -> gym_spaces.MultiDiscrete:
        """``MultiDiscrete([vocab_size + 1] * max_prompt_tokens)``: prompt ids, right-padded."""
        return gym_spaces.MultiDiscrete(
            np.full(self.max_prompt_tokens, self.vocab_size + 1, dtype=ID_DTYPE), dtype=ID_DTYPE
        )

    @property
    def action_space(self) -> gym_spaces.MultiDiscrete:
        """``MultiDiscrete([vocab_size + 1] * max_new_tokens)``: generated ids, right-padded."""
        return gym_spaces.MultiDiscrete(
            np.full(self.max_new_tokens, self.vocab_size + 1, dtype=ID_DTYPE), dtype=ID_DTYPE
        )

    # ------------------------------------------------------------------ encode / decode
    def encode_prompt(self, ids: Sequence[int], truncate: bool = True) -> np.ndarray:
        """Prompt ids → observation array (keeps the last ``max_prompt_tokens`` ids).

        Raises:
            ValueError: an id outside ``[0, vocab_size)``, an empty prompt, or a prompt too
                long with ``truncate=False``.
        """
        ids = self._check_ids(ids, "prompt")
        if not ids:
            raise ValueError("empty prompt: a text agent needs at least one prompt token")
        if len(ids) > self.max_prompt_tokens:
            if not truncate:
                raise ValueError(
                    f"prompt has {len(ids)} tokens > max_prompt_tokens={self.max_prompt_tokens}: "
                    "raise max_prompt_tokens or shorten the prompt"
                )
            ids = ids[-self.max_prompt_tokens :]
        return _pad(ids, self.max_prompt_tokens, self.pad_id)

    def decode_prompt(self, obs: np.ndarray | Sequence[int]) -> list[int]:
        """Observation array → prompt ids (the prefix before the first padding value)."""
        return _unpad(obs, self.pad_id)

    def encode_action(self, ids: Sequence[int]) -> np.ndarray:
        """Generated ids → action array.

        Raises:
            ValueError: more than ``max_new_tokens`` ids, or an id outside the vocabulary.
        """
        ids = self._check_ids(ids, "action")
        if len(ids) > self.max_new_tokens:
            raise ValueError(
                f"{len(ids)} generated tokens > max_new_tokens={self.max_new_tokens}: "
                "generate with max_new_tokens <= the action length"
            )
        return _pad(ids, self.max_new_tokens, self.pad_id)

    def decode_action(self, action: np.ndarray | Sequence[int]) -> list[int]:
        """Action array → generated ids (the prefix before the first padding value)."""
        return _unpad(action, self.pad_id)

    def prompt_text(self, obs: np.ndarray | Sequence[int], tokenizer: Any) -> str:
        """The prompt text of an observation (special tokens kept)."""
        return tokenizer.decode(self.decode_prompt(obs), skip_special_tokens=False)

    def action_text(self, action: np.ndarray | Sequence[int], tokenizer: Any) -> str:
        """The text of an action (special tokens such as EOS skipped)."""
        return tokenizer.decode(self.decode_action(action), skip_special_tokens=True)

    def _check_ids(self, ids: Sequence[int], what: str) -> list[int]:
        out = [int(i) for i in np.asarray(ids, dtype=ID_DTYPE).reshape(-1)]
        bad = [i for i in out if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(
                f"{what} ids {bad[:5]} outside [0, {self.vocab_size}): the spaces were sized "
                "for another tokenizer (use TextSpaces.for_tokenizer)"
            )
        return out


def _pad(ids: list[int], length: int, pad_id: int) -> np.ndarray:
    out = np.full(length, pad_id, dtype=ID_DTYPE)
    out[: len(ids)] = ids
    return out


def _unpad(arr: np.ndarray | Sequence[int], pad_id: int) -> list[int]:
    flat = np.asarray(arr).reshape(-1).astype(ID_DTYPE)
    stop = np.flatnonzero(flat == pad_id)
    end = int(stop[0]) if stop.size else flat.size
    return [int(i) for i in flat[:end]]


def lengths(batch: np.ndarray, pad_id: int) -> np.ndarray:
    """Per-row count of ids before the first ``pad_id`` in a ``(B, L)`` array (numpy or torch).

    Works for torch tensors too (returns a tensor): rows are right-padded, so the length is
    the index of the first padding value, or ``L`` if there is none.
    """
    is_pad = batch == pad_id
    width = batch.shape[-1]
    if hasattr(is_pad, "int") and not isinstance(is_pad, np.ndarray):  # torch
        import torch

        idx = torch.arange(width, device=batch.device).expand_as(batch)
        first = torch.where(is_pad, idx, torch.full_like(idx, width))
        return first.min(dim=-1).values
    idx = np.broadcast_to(np.arange(width), batch.shape)
    return np.where(is_pad, idx, width).min(axis=-1)
