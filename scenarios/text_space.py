"""Text agents' interface: tokenizers, chat prompts → token ids, and the gym spaces of ids.

A text agent in an RLlib environment observes the token ids of its prompt and acts with the
token ids it generated. Both are fixed-length, right-padded integer arrays, because RLlib
batches observations and actions as arrays of one shape per module.

This module belongs to ``scenarios`` (the environments render prompts and parse replies);
``marl_agents.llm`` re-exports its names (``TextSpaces``, ``encode_prompt``,
``make_tiny_tokenizer``) for the policies. It needs the ``llm`` extra (``tokenizers``,
``transformers``) only when a tokenizer is built.

* :class:`TextSpaces` — the observation and action spaces, with encode / decode helpers.
* :func:`encode_prompt` — token ids of a prompt: ids as given, text, or chat messages
  (rendered with the tokenizer's chat template and the assistant generation prompt).
* :func:`make_tiny_tokenizer` — the byte-level BPE tokenizer trained in code (no download)
  with a ChatML template; :func:`load_tokenizer` — ``"tiny"`` or a saved / hub tokenizer.

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
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from gymnasium import spaces as gym_spaces

#: dtype of encoded prompt and action arrays.
ID_DTYPE = np.int64

#: A prompt: raw token ids, raw text (tokenised without a template), or chat messages
#: (``{"role": ..., "content": ...}`` dicts, rendered with the tokenizer's chat template and
#: the assistant generation prompt).
Prompt = Sequence[int] | str | Sequence[Mapping[str, Any]]

#: Special tokens of the tiny tokenizer; ``<|endoftext|>`` pads, ``<|im_end|>`` ends an
#: assistant turn (EOS).
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

#: ChatML, as Qwen2 uses it; ``tools`` are not rendered here (chat models put their
#: descriptions into the system message in the format of :mod:`scenarios.toolcalls`).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_CORPUS = [
    "system user assistant tool You are a helpful agent. Answer the question.",
    "The orchestrator delegates the task to a worker; the worker returns a result.",
    '<tool>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool>',
    '<tool>{"name": "lookup", "arguments": {"key": "capital"}}</tool>',
    '{"name": "search", "arguments": {"query": "weather in Paris"}} result: 3 answer: 42',
    "def f(x):\n    return x + 1\n",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 + - * / = ( ) [ ] { } , . : ; ! ? ' \"",
    "the quick brown fox jumps over the lazy dog THE QUICK BROWN FOX JUMPS",
    "plan delegate aggregate answer final result sum product count parts",
]


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

    @classmethod
    def of(cls, observation_space: Any, action_space: Any) -> TextSpaces | None:
        """The text spaces a text agent's gym spaces are, else None: both ``MultiDiscrete``,
        one-dimensional, every entry the same ``vocab_size + 1`` (≥ 2)."""
        spaces = (observation_space, action_space)
        if not all(isinstance(s, gym_spaces.MultiDiscrete) and s.nvec.ndim == 1 for s in spaces):
            return None
        values = set(observation_space.nvec.tolist()) | set(action_space.nvec.tolist())
        if len(values) != 1 or (n := int(values.pop())) < 2:
            return None
        return cls(n - 1, int(observation_space.shape[0]), int(action_space.shape[0]))

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


# ----- tokenizers and prompts ---------------------------------------------------------------
def make_tiny_tokenizer(vocab_size: int = 384) -> Any:
    """Train the byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``.

    The tokenizer is trained in memory on a fixed built-in corpus with the 256-symbol byte
    alphabet as its initial alphabet, so every string encodes (no unknown token) and decodes
    back exactly. It carries a ChatML-style chat template (``<|im_start|>role\\n...<|im_end|>``).

    Args:
        vocab_size: target vocabulary size (≥ 259: 256 bytes + 3 special tokens); the
            built-in corpus supports up to about 600 merges.

    Returns:
        A ``PreTrainedTokenizerFast`` with ``pad_token``/``eos_token`` set and the ChatML
        ``chat_template``. Training is deterministic: the same ``vocab_size`` gives the
        same vocabulary.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


@lru_cache(maxsize=8)
def load_tokenizer(name: str) -> Any:
    """The tiny tokenizer for ``"tiny"``, else ``AutoTokenizer.from_pretrained(name)``.

    Cached per process (a tokenizer is immutable in use). ``name`` is a directory saved with
    ``save_pretrained``, a named pretrained model or ``.gguf`` file
    (:mod:`scenarios.pretrained`) or a hub name; a family's chat template is supplied when the
    tokenizer has none (:func:`scenarios.pretrained.complete_tokenizer`).
    """
    if name == "tiny":
        return make_tiny_tokenizer()
    from transformers import AutoTokenizer

    from scenarios.pretrained import complete_tokenizer, model_type, resolve

    path = resolve(name)  # a named model or a .gguf file: its converted directory
    return complete_tokenizer(AutoTokenizer.from_pretrained(path), model_type(path))


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids of ``prompt``: ids as given, text without special tokens, chat via template.

    Raises:
        TypeError: ``prompt`` is none of the three forms.
    """
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    items = list(prompt)
    if not items:
        raise ValueError("empty prompt: give at least one token id, character or message")
    if all(isinstance(x, int) for x in items):
        return [int(x) for x in items]
    if all(isinstance(x, Mapping) for x in items):
        text = chat_text(tokenizer, items)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    raise TypeError(
        "a prompt is a list of token ids, a string, or a list of chat message dicts; "
        f"got a list of {sorted({type(x).__name__ for x in items})}"
    )


def chat_text(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> str:
    """``messages`` as prompt text ending with the assistant's turn opened.

    The tokenizer's own chat template when it has one (``apply_chat_template`` with the
    generation prompt); otherwise plain ``role: content`` lines and ``assistant:`` (a base
    model's checkpoint often has no template).
    """
    if getattr(tokenizer, "chat_template", None):
        return str(
            tokenizer.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
            )
        )
    lines = [f"{m['role']}: {m.get('content') or ''}" for m in messages]
    return "\n".join([*lines, "assistant:"])
