"""A request's prompt bounded in characters before it is tokenised.

Tokenising a prompt costs time in proportion to its length (a 3.5 MB prompt: seconds), and
a served run renders one request at a time. But a token covers at most
:func:`max_token_chars` characters of the tokenizer (its longest vocabulary entry, in
characters; byte-level entries count one character a byte, so a decoded token is never longer),
so a prompt of more than ``max_prompt_tokens × max_token_chars`` characters cannot fit the
agent's context. :func:`bound_prompt` uses twice that as its bound, :func:`char_bound` (the
factor 2 covers normalisers that merge characters), and checks it before anything is
tokenised:

* refusing a long prompt (the default of app episodes, as OpenAI does): a prompt over the bound
  is a 400 ``context_length_exceeded`` at once; one under it is tokenised and checked exactly;
* truncating (``truncate_prompts``, ``marl serve``'s default, as training truncates): the
  messages are cut to the bound first — the first system message (and the tools' descriptions,
  which go into it) whole, then the newest characters of the other messages, older ones cut
  from their front or emptied. Training keeps the system message's tokens and then the newest
  tokens, or the newest tokens only (:mod:`marl_agents.llm.prompt_fit`); at least twice the
  context's tokens remain after the system message, so the tokens kept are the same as from
  the whole prompt (unless the tokenizer merges across the cut, twice the context away).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

from marl_agents.gateway.protocol import ChatRequest, GatewayError

_LONGEST: dict[int, tuple[Any, int]] = {}  # id(tokenizer) → (tokenizer, max_token_chars)
_LOCK = threading.Lock()


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for (its longest vocabulary
    entry, added tokens included; computed once per tokenizer)."""
    with _LOCK:
        hit = _LONGEST.get(id(tokenizer))
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    longest = max((len(k) for k in tokenizer.get_vocab()), default=1)
    with _LOCK:
        _LONGEST[id(tokenizer)] = (tokenizer, longest)
    return longest


def char_bound(tokenizer: Any, max_prompt_tokens: int) -> int:
    """The characters beyond which a prompt cannot fit ``max_prompt_tokens`` tokens, twice over."""
    return 2 * int(max_prompt_tokens) * max_token_chars(tokenizer)


def _chars(message: Any) -> int:
    content = message.content
    return len(content) if isinstance(content, str) else len(message.text)


def bound_prompt(model: Any, request: ChatRequest, truncate: bool) -> ChatRequest:
    """``request`` with its messages within :func:`char_bound` of ``model`` (an agent's chat
    model: ``tokenizer``, ``spaces.max_prompt_tokens``): itself when they are, cut to it when
    ``truncate`` (module docstring), else a 400 ``context_length_exceeded`` before tokenising.
    """
    limit = int(model.spaces.max_prompt_tokens)
    bound = char_bound(model.tokenizer, limit)
    tools = len(json.dumps(request.tools)) if request.tools else 0
    total = tools + sum(_chars(m) for m in request.messages)
    if total <= bound:
        return request
    if not truncate:
        raise GatewayError(
            f"this model's context is {limit} tokens; the messages hold {total} characters, "
            f"more than {limit} tokens can (one token is at most "
            f"{max_token_chars(model.tokenizer)} characters): shorten them, or truncate "
            "prompts as training does (marl serve's default, --truncate-prompts; "
            "AppScenario(truncate_prompts=True))",
            400,
            "invalid_request_error",
            "messages",
            "context_length_exceeded",
        )
    messages = list(request.messages)
    first = 1 if messages and messages[0].type == "system" else 0
    head = tools + (_chars(messages[0]) if first else 0)
    if head > bound:
        raise GatewayError(
            f"this model's context is {limit} tokens; the system message and the tools' "
            f"descriptions alone hold {head} characters, far more than it can: shorten them",
            400,
            "invalid_request_error",
            "messages",
            "context_length_exceeded",
        )
    budget = bound
    for i in range(len(messages) - 1, first - 1, -1):
        n = _chars(messages[i])
        if n <= budget:
            budget -= n
            continue
        text = messages[i].content if isinstance(messages[i].content, str) else messages[i].text
        kept = text[len(text) - budget :] if budget else ""
        messages[i] = messages[i].model_copy(update={"content": kept})
        budget = 0
    return dataclasses.replace(request, messages=messages)


__all__ = ["bound_prompt", "char_bound", "max_token_chars"]
