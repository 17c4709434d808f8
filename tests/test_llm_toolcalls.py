"""The ``<tool>{...}</tool>`` tool-call format: valid calls, every malformed case, no raising."""

from __future__ import annotations

import random

import pytest

from scenarios.toolcalls import (
    ToolCall,
    parse_tool_calls,
    render_tool_call,
    render_tool_instructions,
)


def test_valid_calls_and_content() -> None:
    text = (
        'I will add. <tool>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool> then '
        '<tool>{"name": "lookup"}</tool>'
    )
    out = parse_tool_calls(text, tool_names={"add", "lookup"})
    assert out.format_ok and out.errors == []
    assert out.tool_calls == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("lookup", {})]
    assert out.content == "I will add.  then"


def test_plain_text_is_no_call_and_ok() -> None:
    out = parse_tool_calls("The answer is 42.")
    assert out.tool_calls == [] and out.format_ok and out.content == "The answer is 42."


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool>{oops</tool>", "not valid JSON"),
        ("<tool>[1, 2]</tool>", "must be a JSON object"),
        ('<tool>{"arguments": {}}</tool>', 'non-empty string "name"'),
        ('<tool>{"name": 3}</tool>', 'non-empty string "name"'),
        ('<tool>{"name": "add", "arguments": [1]}</tool>', "\"arguments\" of 'add'"),
        ('<tool>{"name": "add", "args": {}}</tool>', "unknown keys"),
        ('<tool>{"name": "rm", "arguments": {}}</tool>', "unknown tool 'rm'"),
        ('<tool>{"name": "add", "arguments": {}}', "unclosed <tool>"),
        ('{"name": "add"}</tool>', "</tool> without <tool>"),
        ('<tool><tool>{"name": "add"}</tool>', "nested or unclosed"),
    ],
)
def test_malformed_calls_flag_a_format_penalty(text: str, error: str) -> None:
    out = parse_tool_calls(text, tool_names={"add"})
    assert not out.format_ok
    assert any(error in e for e in out.errors), out.errors
    if "nested" not in error:
        assert out.tool_calls == []


def test_valid_call_survives_a_malformed_neighbour() -> None:
    out = parse_tool_calls('<tool>{bad</tool> <tool>{"name": "add", "arguments": {"a": 1}}</tool>')
    assert out.tool_calls == [ToolCall("add", {"a": 1})]
    assert not out.format_ok and len(out.errors) == 1
    assert out.content == "<tool>{bad</tool>"  # malformed text stays visible


def test_never_raises_on_random_text() -> None:
    rng = random.Random(0)
    alphabet = [
        "<tool>",
        "</tool>",
        "{",
        "}",
        '"name"',
        ":",
        '"add"',
        ",",
        "[",
        "]",
        "x",
        " ",
        "\\",
    ]
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
        out = parse_tool_calls(text, tool_names={"add"})
        assert out.format_ok == (not out.errors)
    deep = "<tool>" + "[" * 100_000 + "</tool>"
    assert not parse_tool_calls(deep).format_ok


def test_render_round_trip_and_instructions() -> None:
    text = render_tool_call("add", {"a": 1, "b": [2, 3]})
    assert parse_tool_calls(text).tool_calls == [ToolCall("add", {"a": 1, "b": [2, 3]})]
    doc = render_tool_instructions(
        [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add two integers.\nMore text.",
                    "parameters": {"properties": {"a": {"type": "integer"}}},
                },
            }
        ]
    )
    assert "<tool>" in doc and "- add: Add two integers. arguments:" in doc
