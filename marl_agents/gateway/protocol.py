"""The OpenAI wire format ↔ LangChain: requests in, responses, stream chunks and errors out.

Pure functions, no I/O: :mod:`marl_agents.gateway.server` reads the HTTP request, these
functions turn its JSON body into a :class:`ChatRequest` (LangChain messages, OpenAI tool
dicts, ``tool_choice``, ``response_format``) and the agent's ``AIMessage`` back into a
``chat.completion`` (tool calls in OpenAI form, ``finish_reason``, ``usage``), the
``chat.completion.chunk`` events of a streamed reply, or a ``text_completion``. Anything the
gateway cannot honour is a :class:`GatewayError` carrying the HTTP status and the OpenAI error
body (``{"error": {"message", "type", "param", "code"}}``).

Supported request fields: ``model``, ``messages`` (``system``/``developer``, ``user``,
``assistant`` with ``tool_calls``, ``tool``; text content or text parts), ``tools``
(function tools), ``tool_choice``, ``response_format`` (``text``, ``json_object``,
``json_schema``), ``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``,
``stream`` (+ ``stream_options.include_usage``), ``n`` (only 1), ``seed``,
``return_token_ids`` (vLLM's extension: the prompt's and the sampled ids), ``stop`` (a string
or up to 4: a free reply ends before the first one, ``finish_reason: "stop"``, its ids end
with the token completing it, as vLLM's do: :mod:`marl_agents.llm.stop_strings`); unknown
fields are ignored, as OpenAI-compatible servers do. Bodies are parsed with bounds: JSON
nested deeper than :data:`MAX_JSON_DEPTH` is a 400 before it is decoded (the server also
bounds the body's bytes, and the prompt's length before it is tokenised).
``/v1/completions`` takes ``prompt``: one string, given to the
agent as one user message (rendered with the chat template), or one list of token ids (as
OpenAI's API allows), given to the policy as they are — no chat template, no re-tokenisation;
the ids must be in the agent's vocabulary and fit its ``max_prompt_tokens`` (a 400 naming the
fix otherwise; at most :data:`MAX_PROMPT_IDS` ids are read); the reply's text is the sampled
ids decoded. Batches (several prompts) are refused.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from topologies.errors import MarlError

#: sampling fields a request may set; the policy samples with its pool's own settings
SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "seed")
#: the most token ids a ``/v1/completions`` prompt may hold (the agent's ``max_prompt_tokens``
#: is checked when the request is answered; this bounds what is parsed before that)
MAX_PROMPT_IDS = 1 << 16
#: the deepest nesting of arrays and objects a request body may have (a deeper one is a 400
#: found by a linear scan before decoding: Python's decoder recurses once per level)
MAX_JSON_DEPTH = 64


class GatewayError(MarlError):
    """A request the gateway refuses, or an app episode that failed; the message names the fix.

    Attributes:
        status: the HTTP status (400 bad request, 401 key, 404 model or path, 413 too large).
        type: the OpenAI error type (``invalid_request_error``, ``authentication_error``...).
        param: the request field at fault, if any.
        code: a short machine-readable code (``model_not_found``, ``invalid_api_key``...).
    """

    def __init__(
        self,
        message: str,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = int(status)
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return {
            "error": {
                "message": str(self),
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(message, 400, "invalid_request_error", param, code)


@dataclasses.dataclass
class ChatRequest:
    """One parsed ``/v1/chat/completions`` (or ``/v1/completions``) request.

    Attributes:
        model: the model name (one of the episode's agents' names).
        messages: LangChain messages.
        tools: OpenAI function-tool dicts (``None``: no tools).
        tool_choice: ``"none"``/``"auto"``/``"required"``/a tool's name (``None``: unset).
        response_format: a ``json_object`` / ``json_schema`` dict (``None``: free text).
        sampling: the sampling fields the request set (checked, not used: the policy samples).
        stream: answer as server-sent events.
        include_usage: with ``stream``, a last chunk carrying ``usage``.
        kind: ``"chat"`` or ``"completion"``.
        prompt_ids: a ``/v1/completions`` prompt given as token ids (``messages`` is then
            empty): the policy's prompt as given, no chat template (``None``: render
            ``messages``).
        stop: the stop strings (``None``: none): a free reply ends before the first.
    """

    model: str
    messages: list[Any]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None
    response_format: dict[str, Any] | None = None
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    kind: str = "chat"
    prompt_ids: list[int] | None = None
    stop: list[str] | None = None


@dataclasses.dataclass
class Reply:
    """One decision's answer to a request.

    Attributes:
        message: the agent's ``AIMessage``.
        prompt_ids: the prompt ids the policy saw (its observation: prefill included, a
            truncated prompt's last tokens).
        token_ids: the ids it sampled (up to and with the end-of-turn id).
    """

    message: Any
    prompt_ids: list[int]
    token_ids: list[int]


# ----- requests -------------------------------------------------------------------------------
def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (a 400 otherwise, also for nesting deeper than
    :data:`MAX_JSON_DEPTH`, found before decoding)."""
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise bad_request(
            f"the request body nests arrays/objects more than {MAX_JSON_DEPTH} levels deep "
            f"(the gateway reads at most {MAX_JSON_DEPTH}): flatten it",
            None,
            "json_too_deep",
        )
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request(
            f"the request body is not valid JSON ({exc}): send a JSON object"
        ) from exc
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


_BRACKETS = re.compile(rb'[\[\]{}]|"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``raw`` (brackets inside
    strings not counted), in one linear scan (a regular expression, no recursion), read only
    until it passes :data:`MAX_JSON_DEPTH`. Malformed text gives some number: the decoder
    reports what is wrong with it."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return 1  # too few brackets to nest deeper than allowed: no scan
    depth = deepest = 0
    for m in _BRACKETS.finditer(raw):
        c = m.group()
        if c in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                return deepest  # too deep already: no need to read on
        elif c in (b"]", b"}"):
            depth -= 1
    return deepest


def parse_chat(body: Mapping[str, Any]) -> ChatRequest:
    """A ``/v1/chat/completions`` body → :class:`ChatRequest` (a 400 naming the field if not)."""
    model = _model(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty list of messages", "messages")
    messages = [_message(m, i) for i, m in enumerate(raw)]
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), tools)
    return ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=choice,
        response_format=_response_format(body.get("response_format")),
        sampling=_sampling(body),
        stream=_stream(body),
        include_usage=bool((body.get("stream_options") or {}).get("include_usage", False)),
        return_token_ids=bool(body.get("return_token_ids", False)),
        kind="chat",
        stop=_stop(body),
    )


def parse_completion(body: Mapping[str, Any]) -> ChatRequest:
    """A ``/v1/completions`` body → :class:`ChatRequest`: a text prompt is one user message, a
    prompt of token ids is kept as ids (:attr:`ChatRequest.prompt_ids`)."""
    from langchain_core.messages import HumanMessage

    model = _model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if body.get("echo") or body.get("suffix") or (body.get("best_of") or 1) != 1:
        raise bad_request("'echo', 'suffix' and 'best_of' are not supported: leave them unset")
    ids = None
    if isinstance(prompt, list) and prompt and not any(isinstance(x, str) for x in prompt):
        ids = _token_ids(prompt)
    elif not isinstance(prompt, str) or not prompt:
        raise bad_request(
            "'prompt' must be one non-empty string or one list of token ids (batches are "
            "not served)",
            "prompt",
        )
    return ChatRequest(
        model=model,
        messages=[HumanMessage(prompt)] if ids is None else [],
        sampling=_sampling(body),
        stream=_stream(body),
        include_usage=bool((body.get("stream_options") or {}).get("include_usage", False)),
        return_token_ids=bool(body.get("return_token_ids", False)),
        kind="completion",
        prompt_ids=ids,
        stop=_stop(body),
    )


def _token_ids(prompt: list[Any]) -> list[int]:
    """A prompt's token ids, checked: integers ≥ 0, at most :data:`MAX_PROMPT_IDS` (the
    vocabulary and ``max_prompt_tokens`` are the agent's, checked when it answers)."""
    if len(prompt) > MAX_PROMPT_IDS:
        raise bad_request(
            f"'prompt' holds {len(prompt)} token ids; at most {MAX_PROMPT_IDS} are read: "
            "shorten it",
            "prompt",
            "context_length_exceeded",
        )
    bad = [x for x in prompt if isinstance(x, bool) or not isinstance(x, int) or x < 0]
    if bad:
        raise bad_request(
            f"'prompt' as token ids must be integers >= 0, got {bad[0]!r} (a batch of "
            "several prompts is not served)",
            "prompt",
        )
    return [int(x) for x in prompt]


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must name one of the episode's agents (GET /v1/models)", "model")
    n = body.get("n", 1)
    if n not in (1, None):
        raise bad_request(
            f"'n' must be 1: each request is one decision of one agent, got {n!r}", "n"
        )
    if body.get("logprobs"):
        raise bad_request(
            "'logprobs' is not served: the learner keeps the policy's logprobs", "logprobs"
        )
    return model


def _stop(body: Mapping[str, Any]) -> list[str] | None:
    from marl_agents.llm.stop_strings import stop_list

    try:
        return stop_list(body.get("stop")) or None
    except ValueError as exc:
        raise bad_request(str(exc), "stop") from None


def _stream(body: Mapping[str, Any]) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise bad_request(f"'stream' must be true or false, got {stream!r}", "stream")
    return bool(stream)


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key in SAMPLING_FIELDS:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad_request(f"'{key}' must be a number, got {value!r}", key)
        out[key] = value
    return out


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in ("text", "input_text"):
                parts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise bad_request(
                    f"{where}: content part of type {kind!r} is not served (text only)", where
                )
        return "".join(parts)
    raise bad_request(f"{where}: content must be a string or a list of text parts", where)


def _message(m: Any, i: int) -> Any:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    where = f"messages[{i}]"
    if not isinstance(m, Mapping):
        raise bad_request(f"{where} must be an object with 'role' and 'content'", where)
    role = m.get("role")
    text = _text(m.get("content"), f"{where}.content")
    if role in ("system", "developer"):
        return SystemMessage(text)
    if role == "user":
        return HumanMessage(text)
    if role == "assistant":
        calls = []
        for j, call in enumerate(m.get("tool_calls") or []):
            fn = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise bad_request(f"{where}.tool_calls[{j}] needs function.name", where)
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except json.JSONDecodeError as exc:
                raise bad_request(
                    f"{where}.tool_calls[{j}].function.arguments is not JSON ({exc})", where
                ) from exc
            if not isinstance(args, dict):
                raise bad_request(f"{where}.tool_calls[{j}] arguments must be a JSON object", where)
            calls.append(
                {"name": fn["name"], "args": args, "id": call.get("id"), "type": "tool_call"}
            )
        return AIMessage(text, tool_calls=calls)
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str):
            raise bad_request(f"{where}: a tool message needs 'tool_call_id'", where)
        return ToolMessage(text, tool_call_id=call_id)
    raise bad_request(
        f"{where}: role {role!r} is not served: use system, developer, user, assistant or tool",
        where,
    )


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of function tools", "tools")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(tool, Mapping)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, Mapping)
            or not isinstance(fn.get("name"), str)
        ):
            raise bad_request(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name', "
                "'description', 'parameters'}}}} (only function tools are served)",
                "tools",
            )
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, Mapping):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema", "tools")
        out.append(
            {
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "description": str(fn.get("description") or ""),
                    "parameters": dict(params),
                },
            }
        )
    return out


def _tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> str | None:
    if choice is None:
        return None
    if isinstance(choice, str) and choice in ("none", "auto", "required"):
        name = choice
    elif isinstance(choice, Mapping) and isinstance(
        (choice.get("function") or {}).get("name"), str
    ):
        name = choice["function"]["name"]
        known = [t["function"]["name"] for t in tools or []]
        if name not in known:
            raise bad_request(
                f"tool_choice names {name!r}, which is not among the tools {known}", "tool_choice"
            )
    else:
        raise bad_request(
            "'tool_choice' must be 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    if name != "none" and name != "auto" and not tools:
        raise bad_request(f"tool_choice={name!r} without 'tools'", "tool_choice")
    return name


def _response_format(rf: Any) -> dict[str, Any] | None:
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        inner = rf.get("json_schema")
        if not isinstance(inner, Mapping) or not isinstance(inner.get("schema"), Mapping):
            raise bad_request(
                "response_format json_schema needs {'json_schema': {'name', 'schema'}}",
                "response_format",
            )
        return {"type": "json_schema", "json_schema": dict(inner)}
    raise bad_request(
        "'response_format' must be {'type': 'text' | 'json_object' | 'json_schema'}",
        "response_format",
    )


# ----- responses -----------------------------------------------------------------------------
def _openai_calls(message: Any) -> list[dict[str, Any]]:
    return [
        {
            "id": c.get("id") or f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
        }
        for c in message.tool_calls
    ]


def finish_reason(message: Any, request: ChatRequest | None = None) -> str:
    """``tool_calls``, ``length`` (the action length was reached before the reply ended) or
    ``stop``. A ``response_format`` reply that is a complete JSON value is ``stop`` even where
    its last token was the budget's last (a constrained reply closed by the budget: nothing was
    cut, and clients such as the ``openai`` SDK's ``parse`` refuse a ``length`` reply)."""
    if message.tool_calls:
        return "tool_calls"
    meta = message.response_metadata or {}
    if meta.get("finish_reason") != "length":
        return "stop"
    if request is not None and request.response_format is not None and meta.get("format_ok"):
        try:
            json.loads(_content(message))
        except ValueError:
            return "length"
        return "stop"
    return "length"


def usage(reply: Reply) -> dict[str, int]:
    prompt, done = len(reply.prompt_ids), len(reply.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def _content(message: Any) -> str:
    return message.content if isinstance(message.content, str) else message.text


def chat_response(request: ChatRequest, reply: Reply) -> dict[str, Any]:
    """The ``chat.completion`` (or, for ``/v1/completions``, ``text_completion``) answering
    ``request`` with the agent's reply; with ``return_token_ids`` (vLLM's extension) also the
    prompt's ids (``prompt_token_ids``) and the sampled ids (the choice's ``token_ids``)."""
    out = _response(request, reply)
    if request.return_token_ids:
        out["prompt_token_ids"] = list(reply.prompt_ids)
        out["choices"][0]["token_ids"] = list(reply.token_ids)
    return out


def _response(request: ChatRequest, reply: Reply) -> dict[str, Any]:
    message = reply.message
    created, rid = int(time.time()), uuid.uuid4().hex
    if request.kind == "completion":
        return {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": created,
            "model": request.model,
            "choices": [
                {
                    "index": 0,
                    "text": _content(message),
                    "logprobs": None,
                    "finish_reason": finish_reason(message, request),
                }
            ],
            "usage": usage(reply),
        }
    calls = _openai_calls(message)
    return {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": created,
        "model": request.model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": _content(message) if not calls or _content(message) else None,
                    **({"tool_calls": calls} if calls else {}),
                    "refusal": None,
                },
                "logprobs": None,
                "finish_reason": finish_reason(message, request),
            }
        ],
        "usage": usage(reply),
    }


def stream_events(request: ChatRequest, reply: Reply) -> bytes:
    """The whole server-sent-event stream of one reply (``data: {chunk}`` lines, then
    ``data: [DONE]``): the role, the text in word pieces, each tool call (name and id, then its
    JSON arguments), the ``finish_reason``, and ``usage`` if asked."""
    message = reply.message
    full = chat_response(request, reply)
    base = {k: full[k] for k in ("id", "created", "model")}
    chunks: list[dict[str, Any]] = []
    reason = finish_reason(message, request)
    text = _content(message)
    pieces = re.findall(r"\s*\S+|\s+", text)
    if request.kind == "completion":
        obj = {**base, "object": "text_completion"}
        for piece in pieces:
            chunks.append({**obj, "choices": [_text_choice(piece, None)]})
        chunks.append({**obj, "choices": [_text_choice("", reason)]})
    else:
        obj = {**base, "object": "chat.completion.chunk"}

        def delta(d: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
            return {
                **obj,
                "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": reason}],
            }

        chunks.append(delta({"role": "assistant", "content": ""}))
        chunks.extend(delta({"content": piece}) for piece in pieces)
        for i, call in enumerate(full["choices"][0]["message"].get("tool_calls", [])):
            args = call["function"]["arguments"]
            half = len(args) // 2
            head = {"index": i, "id": call["id"], "type": "function"}
            chunks.append(
                delta(
                    {
                        "tool_calls": [
                            {
                                **head,
                                "function": {
                                    "name": call["function"]["name"],
                                    "arguments": args[:half],
                                },
                            }
                        ]
                    }
                )
            )
            chunks.append(
                delta({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]})
            )
        chunks.append(delta({}, reason))
    if request.include_usage:
        chunks.append({**chunks[0], "choices": [], "usage": full["usage"]})
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks]
    lines.append("data: [DONE]\n\n")
    return "".join(lines).encode("utf-8")


def _text_choice(text: str, reason: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}


def models_list(names: Sequence[str]) -> dict[str, Any]:
    """The ``/v1/models`` listing of an episode's model names."""
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": 0, "owned_by": "marl"} for n in names],
    }


__all__ = [
    "ChatRequest",
    "GatewayError",
    "Reply",
    "chat_response",
    "models_list",
    "parse_chat",
    "parse_completion",
    "parse_json",
    "stream_events",
]
