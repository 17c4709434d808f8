"""Tool calls in generated text: one format, parsed without ever raising.

**The format.** A tool call is a JSON object with a string ``"name"`` and an object
``"arguments"`` between ``<tool>`` and ``</tool>``::

    Let me add them. <tool>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool>

A message may hold several calls; the text outside the tags is the message content.
``"arguments"`` may be omitted (``{}``). Anything else — an unclosed ``<tool>``, a stray
``</tool>``, invalid JSON, a non-object, a missing or non-string name, non-object arguments,
a name that is not among the bound tools — is a **format error**: that block yields no tool
call, the error is listed in :attr:`ParsedOutput.errors` and :attr:`ParsedOutput.format_ok`
is ``False``, so a trainer can apply a format penalty. The parser never raises.

Example:
    >>> out = parse_tool_calls('ok <tool>{"name": "add", "arguments": {"a": 1}}</tool>')
    >>> out.content, out.tool_calls[0].name, out.tool_calls[0].arguments, out.format_ok
    ('ok', 'add', {'a': 1}, True)
    >>> parse_tool_calls("<tool>{oops</tool>").format_ok
    False
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

OPEN, CLOSE = "<tool>", "</tool>"
_TAG = re.compile(r"</?tool>")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ParsedOutput:
    """Generated text split into content and tool calls.

    Attributes:
        content: the text outside well-formed ``<tool>…</tool>`` blocks, stripped
            (malformed blocks stay in the content as they were).
        tool_calls: the valid calls, in order.
        errors: one message per malformed block (empty when the format was respected).
    """

    content: str
    tool_calls: list[ToolCall]
    errors: list[str]

    @property
    def format_ok(self) -> bool:
        """``True`` when no block was malformed (the format-penalty flag is ``not format_ok``)."""
        return not self.errors


def parse_tool_calls(text: str, tool_names: Collection[str] | None = None) -> ParsedOutput:
    """Parse ``<tool>{"name": …, "arguments": {…}}</tool>`` blocks out of ``text``.

    Args:
        text: generated text.
        tool_names: the names that may be called; ``None`` accepts any name.

    Returns:
        The content, the valid calls and the format errors; never raises.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    content: list[str] = []
    pos = 0
    open_at: int | None = None
    for m in _TAG.finditer(text):
        if m.group() == OPEN:
            if open_at is not None:
                errors.append(f"nested or unclosed {OPEN} at character {open_at}")
                content.append(text[open_at : m.start()])
            else:
                content.append(text[pos : m.start()])
            open_at = m.start()
            continue
        if open_at is None:
            errors.append(f"{CLOSE} without {OPEN} at character {m.start()}")
            content.append(text[pos : m.end()])
        else:
            body = text[open_at + len(OPEN) : m.start()]
            call, err = _parse_one(body, tool_names)
            if call is not None:
                calls.append(call)
            else:
                errors.append(err)
                content.append(text[open_at : m.end()])
            open_at = None
        pos = m.end()
    if open_at is not None:
        errors.append(f"unclosed {OPEN} at character {open_at}")
        content.append(text[open_at:])
    else:
        content.append(text[pos:])
    return ParsedOutput("".join(content).strip(), calls, errors)


def _parse_one(body: str, tool_names: Collection[str] | None) -> tuple[ToolCall | None, str]:
    try:
        # control characters inside strings are allowed (``strict=False``): the constrained
        # decoder's JSON grammar (xgrammar) admits them, and a reply it allows must parse
        obj = json.loads(body, strict=False)
    except (ValueError, RecursionError) as exc:
        return None, f"tool call is not valid JSON ({exc.__class__.__name__}): {body[:80]!r}"
    if not isinstance(obj, dict):
        return None, f"tool call must be a JSON object, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, 'tool call needs a non-empty string "name"'
    if tool_names is not None and name not in tool_names:
        return None, f"unknown tool {name!r}; bound tools: {sorted(tool_names)}"
    args = obj.get("arguments", {})
    if not isinstance(args, dict):
        return None, f'"arguments" of {name!r} must be a JSON object, got {type(args).__name__}'
    extra = set(obj) - {"name", "arguments"}
    if extra:
        return None, f"tool call {name!r} has unknown keys {sorted(extra)}"
    return ToolCall(name, args), ""


def render_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The canonical text of one call (what the model should generate)."""
    return OPEN + json.dumps({"name": name, "arguments": dict(arguments)}) + CLOSE


_OPEN_NAME = re.compile(r'<tool>\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_.\-]*)')


def complete_call(text: str, tool_names: Collection[str]) -> str:
    """``text`` with an unfinished call to a bound tool completed, for constrained replies.

    Where ``text`` parses as well-formed calls it is returned unchanged. Otherwise, when it
    opens a call whose name so far (``<tool>{"name": "transfer_to_m``…: the identifier
    characters after the opening quote) is a prefix of exactly one of ``tool_names``, the
    text from ``<tool>`` on becomes that tool's canonical call with no arguments. Anything
    else is returned unchanged (and stays a format error). With a prefill that opens the
    call, a policy then only has to choose the tool: e.g. one letter picks a handoff.

    Example:
        >>> complete_call('<tool>{"name": "to_m#!', ["to_math", "to_web"])
        '<tool>{"name": "to_math", "arguments": {}}</tool>'
    """
    if parse_tool_calls(text, tool_names).format_ok:
        return text
    match = _OPEN_NAME.search(text)
    if match is None or not match.group(1):
        return text
    names = [n for n in tool_names if n.startswith(match.group(1))]
    if len(names) != 1:
        return text
    return text[: match.start()] + render_tool_call(names[0], {})


def render_tool_instructions(tools: Sequence[Mapping[str, Any]]) -> str:
    """A system-prompt section describing ``tools`` (OpenAI function format) and the format.

    Args:
        tools: ``{"type": "function", "function": {"name", "description", "parameters"}}``
            dicts, as ``langchain_core.utils.function_calling.convert_to_openai_tool`` makes.
    """
    lines = [
        "You can call tools. To call one, write exactly",
        OPEN + '{"name": "<tool name>", "arguments": {<JSON arguments>}}' + CLOSE,
        "and stop; the result comes back in a tool message. Tools:",
    ]
    for tool in tools:
        fn = tool.get("function", tool)
        params = json.dumps(fn.get("parameters", {}).get("properties", {}), sort_keys=True)
        desc = (fn.get("description") or "").strip().splitlines()
        lines.append(f"- {fn['name']}: {desc[0] if desc else ''} arguments: {params}")
    return "\n".join(lines)
