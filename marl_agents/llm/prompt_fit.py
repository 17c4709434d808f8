"""How a prompt longer than ``max_prompt_tokens`` is cut: the system prompt is kept.

The rule (:func:`fit_prompt`), the same in training (:class:`~marl_agents.llm.env_chat_model.
EnvChatModel`) and wherever a served prompt must fit the same budget:

1. a prompt of at most ``limit`` tokens is kept whole;
2. else, when the chat starts with a system message and that message's tokens plus the last
   message's (with the generation header and any prefill) fit in ``limit``, the prompt keeps
   the system message's tokens and then its newest tokens: the oldest turns after the system
   message are dropped first (a turn may be cut where the kept tail starts);
3. else (a system prompt too long to keep with the last message), the newest ``limit`` tokens,
   as before this rule: the front is cut, the system prompt with it; :data:`CUTS` records it
   for :func:`system_cut_warnings` and the first such cut of each agent in a process is logged
   as a warning.

Why: an app's system message holds its instructions and, for a model with bound tools, the
tools' descriptions (:func:`marl_agents.llm.chat_model.to_chat_dicts` puts them there); a
front cut removes them first and keeps turns that matter less. LangGraph's supervisor tutorial
on the tiny tokenizer: a 415-token first prompt whose system message (instructions and the
``Router`` schema) is 391 tokens; at ``max_prompt_tokens=256`` the front cut dropped the
instructions and half the schema, leaving only the schema's tail and the task.

Example:
    >>> fit_prompt(list(range(10)), 6, head=2, tail=3)
    [0, 1, 6, 7, 8, 9]
    >>> fit_prompt(list(range(10)), 6, head=4, tail=3)  # system + last turn do not fit
    [4, 5, 6, 7, 8, 9]
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

#: agent id → (system-prompt tokens, prompt tokens, limit) of the longest prompt whose system
#: message a front cut removed (rule 3), in this process
CUTS: dict[str, tuple[int, int, int]] = {}
_WARNED: set[str] = set()
_LOCK = threading.Lock()
log = logging.getLogger(__name__)


def fit_prompt(ids: Sequence[int], limit: int, *, head: int, tail: int) -> list[int]:
    """``ids`` cut to ``limit`` tokens by the module's rule.

    Args:
        ids: the rendered prompt's token ids.
        limit: ``max_prompt_tokens``.
        head: how many leading ids are the system message (0: none).
        tail: how many trailing ids are the last message, its generation header and prefill.
    """
    ids = list(ids)
    if len(ids) <= limit:
        return ids
    if head > 0 and head + tail <= limit:
        return ids[:head] + ids[len(ids) - (limit - head) :]
    return ids[len(ids) - limit :]


def fit_chat_prompt(
    tokenizer: Any, chat: Sequence[Mapping[str, Any]], ids: Sequence[int], limit: int, agent: str
) -> list[int]:
    """:func:`fit_prompt` for the rendered ``chat`` (its ids ``ids``, any prefill's ids at
    their end): the system message's and the last message's token spans are read off the
    template (rendered again only when the prompt is too long). A front cut of the system
    prompt is recorded in :data:`CUTS` under ``agent``."""
    ids = list(ids)
    if len(ids) <= limit:
        return ids
    head = tail = 0
    if chat and chat[0].get("role") == "system":
        head = _common_prefix(ids, _render(tokenizer, chat[:1]))
    if len(chat) > 1:
        tail = len(ids) - _common_prefix(ids, _render(tokenizer, chat[:-1]))
    else:
        tail = len(ids)
    if head and head + tail > limit:
        with _LOCK:
            old = CUTS.get(agent)
            if old is None or len(ids) > old[1]:
                CUTS[agent] = (head, len(ids), limit)
            if agent not in _WARNED:  # once per agent and process, as it first happens
                _WARNED.add(agent)
                log.warning("%s", system_cut_warnings({agent: CUTS[agent]})[0])
    return fit_prompt(ids, limit, head=head, tail=tail)


def system_cut_warnings(cuts: Mapping[str, tuple[int, int, int]] | None = None) -> list[str]:
    """One line per agent whose system prompt a front cut removed (:data:`CUTS`), naming the
    lengths and the knob."""
    lines = []
    for agent, (head, total, limit) in sorted((CUTS if cuts is None else cuts).items()):
        lines.append(
            f"agent {agent!r}: its system prompt is {head} tokens and a prompt {total} tokens, "
            f"over max_prompt_tokens={limit}: the prompt is cut from the front, system prompt "
            f"(instructions, tool descriptions) included; raise max_prompt_tokens to ≥ {total} "
            "(ChatAppScenario(max_prompt_tokens=...) or scenario_kwargs.max_prompt_tokens) or "
            "shorten the system prompt"
        )
    return lines


def _render(tokenizer: Any, chat: Sequence[Mapping[str, Any]]) -> list[int]:
    """The ids of ``chat`` rendered as the start of a longer prompt (no generation header)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [dict(m) for m in chat], tokenize=False, add_generation_prompt=False
        )
    else:  # scenarios.text_space.chat_text's plain lines
        text = "\n".join(f"{m['role']}: {m.get('content') or ''}" for m in chat) + "\n"
    return list(tokenizer(str(text), add_special_tokens=False)["input_ids"])


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


__all__ = ["CUTS", "fit_chat_prompt", "fit_prompt", "system_cut_warnings"]
