"""A tiny causal LM built in code: byte-level BPE tokenizer + 2-layer Qwen2, no downloads.

The tokenizer (:func:`scenarios.text_space.make_tiny_tokenizer`) is
trained in memory on a fixed built-in corpus with the 256-symbol byte alphabet as its initial
alphabet, so every string encodes (no unknown token) and decodes back exactly. It carries a
ChatML-style chat template (``<|im_start|>role\\n...<|im_end|>``), so chat messages work with
``apply_chat_template`` and with vLLM's chat endpoints. The model is a
``Qwen2ForCausalLM`` with hidden size 128, 2 layers and 2 attention heads of dim 64 (the
head size vLLM's CPU attention kernels accept), randomly initialised from ``seed``.

Example:
    >>> tok, model = make_tiny_model(seed=0)
    >>> tok.decode(tok("hello <tool>")["input_ids"])
    'hello <tool>'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from marl_agents.llm.checkpoints import TINY_FIELDS

# the tokenizer lives with the text spaces in ``scenarios`` (environments render prompts with it)
from scenarios.text_space import (
    make_tiny_tokenizer,
)

__all__ = [
    "make_tiny_model",
    "tiny_config",
]


def tiny_config(tokenizer: Any, **overrides: Any) -> Any:
    """The tiny ``Qwen2Config`` for ``tokenizer``: hidden 128, 2 layers, 2 heads of dim 64.

    Args:
        tokenizer: supplies the vocabulary size and the pad / EOS ids.
        **overrides: any ``Qwen2Config`` field (e.g. ``num_hidden_layers=1``).
    """
    from transformers import Qwen2Config

    fields: dict[str, Any] = {k: v for k, v in TINY_FIELDS.items() if k != "model_type"}
    fields.update(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.pad_token_id,
        # A wider init than the default 0.02 so the random model's next-token distributions
        # are not near-uniform: greedy decoding then has clear winners (no near-ties).
        initializer_range=0.1,
    )
    fields.update(overrides)
    return Qwen2Config(**fields)


def make_tiny_model(
    path: str | os.PathLike[str] | None = None,
    seed: int = 0,
    *,
    vocab_size: int = 384,
    dtype: torch.dtype = torch.float32,
    **config_overrides: Any,
) -> tuple[Any, Any]:
    """Build (or load) the tiny tokenizer and ``Qwen2ForCausalLM``.

    Args:
        path: a directory. If it holds a saved model (``config.json``), load it; otherwise
            build a new model from ``seed`` and save model + tokenizer there as a normal HF
            directory (``from_pretrained(path)`` and vLLM can load it). ``None``: build only.
        seed: seeds the weight initialisation (the tokenizer does not depend on it).
        vocab_size: tokenizer vocabulary size.
        dtype: parameter dtype.
        **config_overrides: passed to :func:`tiny_config`.

    Returns:
        ``(tokenizer, model)``; the model is in eval mode on the CPU.
    """
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    if path is not None and (Path(path) / "config.json").exists():
        tok = AutoTokenizer.from_pretrained(path)
        model = Qwen2ForCausalLM.from_pretrained(path, dtype=dtype)
        return tok, model.eval()
    tok = make_tiny_tokenizer(vocab_size)
    config = tiny_config(tok, **config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model = model.to(dtype).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    if path is not None:
        Path(path).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(path)
        tok.save_pretrained(path)
    return tok, model
