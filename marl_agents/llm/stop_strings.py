"""Stop strings: a reply ends where one of them first appears, as vLLM and OpenAI end it.

The rule (:func:`cut_at_stop`), chosen so that what is trained is exactly what was sampled
and the text an app receives is what the next turn's prompt holds:

* **the ids** are the sampled ids up to and including the token at which a stop string
  first completes (vLLM keeps that token too): the stop string plays the part of an
  end-of-turn id, which is also kept in the ids and left out of the text. Tokens sampled
  after it are dropped, ids and logprobs alike; the ids kept are a prefix of the sampled
  ones, so their logprobs are the sampler's and the learner scores exactly them.
* **the text** is the kept ids decoded, cut *before* the stop string (OpenAI and vLLM leave
  the stop string out); ``finish_reason`` is ``"stop"``. Where the stop string ends inside a
  token, that token's characters past it are in the ids but not in the text.
* **the next turn**: an app sends the text back without the stop string, so the turn's ids in
  the next prompt are those of the text (:func:`text_ids`: the kept ids whose characters lie
  wholly inside the text, then the text's remaining characters — a stop string starting
  mid-token leaves a few — tokenised), never the stop string's.

Only the generated text is searched (a prefill is not), and only a free reply is cut: a
reply constrained to a tool call or a JSON schema ends where its grammar ends (cutting it
would break the call; OpenAI does not apply ``stop`` to tool calls either).

**In training** the same rule ends the learner's action: the call's stop strings travel with
its observation next to its constraint (:class:`~marl_agents.llm.constraints.CallSettings`)
to the sampler, and ``CausalLMModule`` cuts each row's generation with :func:`cut_at_stop`
before making its outputs (:meth:`~marl_agents.llm.rl_module.CausalLMModule.stopped`), on
RLlib's env runner and the batched runner alike, whichever engine sampled (transformers or
vLLM). The action, its behaviour logprobs and its token masks are the kept ids, padded past
them as a reply ended by EOS is, so the learner's loss covers exactly the ids the app's reply
was made of. The engines are not asked to stop early: the transformers loop steps a finished
row with the batch anyway (as an EOS-ended one), and one rule applied to the ids on every
engine keeps the recorded step and the learner's action equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from marl_agents.llm.backend import Generation

#: the most stop strings a call may give (OpenAI's limit)
MAX_STOP_STRINGS = 4


def stop_list(stop: Any, where: str = "stop") -> list[str]:
    """``stop`` (a string, a list of strings or ``None``) as a list, checked.

    Raises:
        ValueError: not a string or a list of at most :data:`MAX_STOP_STRINGS` non-empty
            strings (the message names ``where``).
    """
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(items, (list, tuple))
        or len(items) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and s for s in items)
    ):
        raise ValueError(
            f"'{where}' must be a non-empty string or a list of at most {MAX_STOP_STRINGS} "
            f"non-empty strings, got {stop!r}"
        )
    return list(items)


def first_stop(text: str, stop: Sequence[str]) -> tuple[int, int] | None:
    """``(start, end)`` of the stop string that completes first in ``text`` (the smallest
    end; of those, the earliest start), or ``None``."""
    best: tuple[int, int] | None = None
    for s in stop:
        i = text.find(s)
        if i >= 0 and (best is None or (i + len(s), i) < (best[1], best[0])):
            best = (i, i + len(s))
    return best


def cut_at_stop(tokenizer: Any, gen: Generation, stop: Sequence[str]) -> Generation:
    """``gen`` ended at its first stop string (module docstring): the ids up to and with the
    token completing it, the text before it, ``finish_reason="stop"``; ``gen`` itself when no
    stop string is in its text."""
    found = first_stop(gen.text, stop) if stop else None
    if found is None:
        return gen
    start, end = found
    ids = list(gen.token_ids)
    known = len(tokenizer)
    keep = len(ids)
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode([t for t in ids[:k] if t < known], skip_special_tokens=True)
        if len(text) >= end and text[start:end] == gen.text[start:end]:
            keep = k
            break

    def cut(values: Any) -> Any:
        return None if values is None else values[:keep]

    return dataclasses.replace(
        gen,
        token_ids=ids[:keep],
        logprobs=list(gen.logprobs[:keep]),
        sampling_logprobs=cut(gen.sampling_logprobs),
        token_masks=cut(gen.token_masks),
        text=gen.text[:start],
        finish_reason="stop",
    )


def text_ids(tokenizer: Any, text: str, ids: Sequence[int]) -> list[int]:
    """The ids of an assistant turn whose text is ``text``, given the ids it was sampled as
    (``ids``, end-of-turn id removed): ``ids`` when they decode to ``text``; else (a reply cut
    at a stop string) the longest prefix of ``ids`` decoding to a prefix of ``text``, then the
    rest of ``text`` tokenised."""
    known = len(tokenizer)

    def decode(part: Sequence[int]) -> str:
        return str(tokenizer.decode([t for t in part if t < known], skip_special_tokens=True))

    if decode(ids) == text:
        return list(ids)
    keep = 0
    for k in range(1, len(ids) + 1):
        if not text.startswith(decode(ids[:k])):
            break
        keep = k
    head = decode(ids[:keep])
    rest = text[len(head) :]
    tail = list(tokenizer(rest, add_special_tokens=False)["input_ids"]) if rest else []
    return list(ids[:keep]) + tail


__all__ = ["MAX_STOP_STRINGS", "cut_at_stop", "first_stop", "stop_list", "text_ids"]
