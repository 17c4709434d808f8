"""How a prompt longer than ``max_prompt_tokens`` is cut: the system prompt is kept.

The rule (:func:`fit_prompt`), the same in training (:class:`~marl_agents.llm.env_chat_model.
EnvChatModel`) and wherever a served prompt must fit the same budget:

1. a prompt of at most ``limit`` tokens is kept whole;
2. else, when the chat starts with a system message of at most :data:`SYSTEM_SHARE` (3/4) of
   ``limit`` tokens, the prompt keeps the system message's tokens and then its newest tokens:
   the oldest turns after the system message go first, the oldest kept turn may be cut
   (LangChain's ``trim_messages(strategy="last", include_system=True, allow_partial=True)``,
   on tokens), and the end (the last turn, the generation header, a prefill) is always kept;
3. else (no system message, or one longer than that), the newest ``limit`` tokens, as before
   this rule; a system prompt cut so is recorded in :data:`CUTS` for
   :func:`system_cut_warnings`, and the first such cut of each agent in a process is logged as
   a warning.

Why: an app's system message holds its instructions and, for a model with bound tools, the
tools' descriptions (:func:`marl_agents.llm.chat_model.to_chat_dicts` puts them there); a
front cut removes them first and keeps turns that matter less. LangGraph's supervisor tutorial
on the tiny tokenizer: its system message (instructions and the ``Router`` schema) is 384 of
the first prompt's 415 tokens; with LLM workers its prompts reached 594 tokens by the third
turn (a worker's reply re-tokenised), which at 512 cut the instructions and the schema's head.
At most 3/4 of the budget for the system prompt leaves the conversation at least a quarter.

Example:
    >>> fit_prompt(list(range(10)), 6, head=2)
    [0, 1, 6, 7, 8, 9]
    >>> fit_prompt(list(range(10)), 6, head=5)  # over 3/4 of the budget: the newest tokens
    [4, 5, 6, 7, 8, 9]
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

#: the largest share of ``max_prompt_tokens`` a system message may take and still be kept
SYSTEM_SHARE = 0.75
#: agent id → (system-prompt tokens, prompt tokens, limit) of the longest prompt whose system
#: message a front cut removed (rule 3), in this process
CUTS: dict[str, tuple[int, int, int]] = {}
_WARNED: set[str] = set()
_LOCK = threading.Lock()
log = logging.getLogger(__name__)


def keeps_system(head: int, limit: int) -> bool:
    """Whether a system message of ``head`` tokens is kept in a cut to ``limit`` (rule 2)."""
    return 0 < head <= limit * SYSTEM_SHARE


def fit_prompt(ids: Sequence[int], limit: int, *, head: int) -> list[int]:
    """``ids`` cut to ``limit`` tokens by the module's rule.

    Args:
        ids: the rendered prompt's token ids.
        limit: ``max_prompt_tokens``.
        head: how many leading ids are the system message (0: none).
    """
    ids = list(ids)
    if len(ids) <= limit:
        return ids
    if keeps_system(head, limit):
        return ids[:head] + ids[len(ids) - (limit - head) :]
    return ids[len(ids) - limit :]


def system_tokens(tokenizer: Any, chat: Sequence[Mapping[str, Any]], ids: Sequence[int]) -> int:
    """How many leading ``ids`` (``chat`` rendered) are its system message (0: none)."""
    if not chat or chat[0].get("role") != "system":
        return 0
    return _common_prefix(ids, _render(tokenizer, chat[:1]))


def fit_chat_prompt(
    tokenizer: Any, chat: Sequence[Mapping[str, Any]], ids: Sequence[int], limit: int, agent: str
) -> list[int]:
    """:func:`fit_prompt` for the rendered ``chat`` (its ids ``ids``, any prefill's ids at
    their end): the system message's span is read off the template (rendered again only when
    the prompt is too long). A front cut of the system prompt is recorded in :data:`CUTS`
    under ``agent``."""
    ids = list(ids)
    if len(ids) <= limit:
        return ids
    head = system_tokens(tokenizer, chat, ids)
    if head and not keeps_system(head, limit):
        with _LOCK:
            old = CUTS.get(agent)
            if old is None or len(ids) > old[1]:
                CUTS[agent] = (head, len(ids), limit)
            if agent not in _WARNED:  # once per agent and process, as it first happens
                _WARNED.add(agent)
                log.warning("%s", system_cut_warnings({agent: CUTS[agent]})[0])
    return fit_prompt(ids, limit, head=head)


def system_cut_warnings(cuts: Mapping[str, tuple[int, int, int]] | None = None) -> list[str]:
    """One line per agent whose system prompt a front cut removed (:data:`CUTS`), naming the
    lengths and the knob."""
    lines = []
    for agent, (head, total, limit) in sorted((CUTS if cuts is None else cuts).items()):
        # either the whole prompt fits, or the system prompt is kept (rule 2)
        need = min(total, math.ceil(head / SYSTEM_SHARE))
        lines.append(
            f"agent {agent!r}: its system prompt is {head} tokens, more than "
            f"{SYSTEM_SHARE:.0%} of max_prompt_tokens={limit}, and a prompt {total} tokens: "
            f"the prompt is cut from the front, system prompt (instructions, tool "
            f"descriptions) included; raise max_prompt_tokens to ≥ {need} "
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


__all__ = [
    "CUTS",
    "SYSTEM_SHARE",
    "fit_chat_prompt",
    "fit_prompt",
    "keeps_system",
    "system_cut_warnings",
    "system_tokens",
]
