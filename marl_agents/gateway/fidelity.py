"""Token fidelity: an assistant turn the app sends back is its sampled ids, not re-tokenised text.

An app keeps its conversation as text and sends earlier replies back with the next request.
Tokenising that text again need not give the ids the policy sampled (a model may sample
``"h" "ello"`` where the tokenizer writes ``"hello"``), and a prompt with other ids than the
ones sampled trains the policy on a context it never produced — the bug other gateways keep
hitting (rLLM #352, verl #3960). :class:`TurnIds` remembers, per episode, the ids each reply
was sampled as, keyed by the text the app gets back; :meth:`TurnIds.prompt` renders a request
with the chat template, finds each assistant turn that is one of the episode's replies
(character offsets of the rendered text), and puts the sampled ids in place of the
re-tokenised ones wherever they differ, counting those turns (``retokenized_turns``: the
drift that re-tokenising would have caused). Turns the app changed, or that are not this
episode's, are tokenised as any other message.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any


class TurnIds:
    """The sampled ids of an episode's replies, and the prompts that reuse them.

    Attributes:
        retokenized_turns: assistant turns sent back whose re-tokenised ids differed from
            the sampled ones (each replaced by the sampled ids), over the episode.
        reused_turns: assistant turns sent back that were this episode's replies.
    """

    def __init__(self) -> None:
        self._turns: dict[str, list[int]] = {}
        self.retokenized_turns = 0
        self.reused_turns = 0

    def remember(self, content: str, ids: Sequence[int]) -> None:
        """``content`` (an assistant turn as the app will send it back) was sampled as
        ``ids`` (without the end-of-turn id)."""
        if content and ids:
            self._turns[content] = [int(t) for t in ids]

    def prompt(self, tokenizer: Any, chat: Sequence[Mapping[str, Any]]) -> list[int]:
        """The prompt ids of ``chat``: the chat template's rendering, tokenised, with each
        remembered assistant turn's sampled ids in place of its re-tokenised ones."""
        text, rendered, offsets = _render(tokenizer, chat)
        ids = list(rendered)
        if not self._turns:
            return ids
        splices: list[tuple[int, int, list[int]]] = []
        pos = 0
        for message in chat:
            content = str(message.get("content") or "")
            start = text.find(content, pos) if content else -1
            if start < 0:
                continue
            end = pos = start + len(content)
            sampled = self._turns.get(content) if message.get("role") == "assistant" else None
            if sampled is None:
                continue
            self.reused_turns += 1
            span = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
            if not span:
                continue
            first, last = span[0], span[-1]
            if (
                [ids[i] for i in span] == sampled
                and offsets[first][0] == start
                and (offsets[last][1] == end)
            ):
                continue  # re-tokenising gives the sampled ids back
            self.retokenized_turns += 1
            # a token straddling the turn's edge keeps its outside characters, re-tokenised
            head = _ids(tokenizer, text[offsets[first][0] : start])
            tail = _ids(tokenizer, text[end : offsets[last][1]])
            splices.append((first, last + 1, head + sampled + tail))
        for first, stop, new in reversed(splices):
            ids[first:stop] = new
        return ids


#: prompts rendered lately: (id(tokenizer), the chat as JSON) → (tokenizer, text, ids, offsets)
_RENDERED: OrderedDict[tuple[int, str], tuple[Any, str, tuple[int, ...], tuple[Any, ...]]] = (
    OrderedDict()
)
_RENDERED_MAX = 256
_RENDERED_LOCK = threading.Lock()


def _render(
    tokenizer: Any, chat: Sequence[Mapping[str, Any]]
) -> tuple[str, tuple[int, ...], tuple[tuple[int, int], ...]]:
    """``chat`` rendered with the chat template, its ids and their character offsets; the
    last :data:`_RENDERED_MAX` renderings are kept (the episodes of a GRPO group send the same
    first prompt: one rendering serves the group)."""
    from scenarios.text_space import chat_text

    try:
        key: tuple[int, str] | None = (id(tokenizer), json.dumps(chat, sort_keys=True))
    except (TypeError, ValueError):
        key = None  # not JSON (rendered every time)
    if key is not None:
        with _RENDERED_LOCK:
            hit = _RENDERED.get(key)
            if hit is not None and hit[0] is tokenizer:
                _RENDERED.move_to_end(key)
                return hit[1], hit[2], hit[3]
    text = chat_text(tokenizer, chat)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = tuple(int(i) for i in enc["input_ids"])
    offsets = tuple((int(a), int(b)) for a, b in enc["offset_mapping"])
    if key is not None:
        with _RENDERED_LOCK:
            _RENDERED[key] = (tokenizer, text, ids, offsets)
            while len(_RENDERED) > _RENDERED_MAX:
                _RENDERED.popitem(last=False)
    return text, ids, offsets


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


__all__ = ["TurnIds"]
