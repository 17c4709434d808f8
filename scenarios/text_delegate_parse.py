"""Reading ``text-delegate``'s orchestrator messages: ``assign`` tool calls to assignments.

:func:`parse_assignment` turns a message into ``part → worker`` and format errors: a call that
does not parse, names another tool, or has a bad part (unknown or already solved) or worker is
an error and is ignored. In prefill mode the message continues an opened call; when that is not
a valid call, a leading integer is read as the worker and the call is closed after it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection
from typing import Any

from scenarios.toolcalls import ToolCall, parse_tool_calls

ASSIGN = "assign"


@dataclasses.dataclass(frozen=True)
class Assignment:
    """What the environment made of one orchestrator message."""

    assignment: dict[int, int]
    errors: list[str]
    text: str


def parse_assignment(
    text: str, unsolved: Collection[int], n_workers: int, opened: str | None = None
) -> Assignment:
    """``text``'s assignments of ``unsolved`` parts to workers ``0..n_workers-1``.

    ``opened``: the call the prompt ends with (prefill mode); ``text`` continues it and only
    the first call counts.
    """
    if opened is None:
        parsed = parse_tool_calls(text, tool_names={ASSIGN})
        calls, errors, full = parsed.tool_calls, list(parsed.errors), text
    else:
        full = opened + text
        parsed = parse_tool_calls(full, tool_names={ASSIGN})
        if not parsed.tool_calls:
            m = re.match(r"\s*(\d+)", text)
            if m is None:
                return Assignment({}, ["expected a worker number"], full)
            full = opened + m.group(1) + "}}</tool>"
            parsed = parse_tool_calls(full, tool_names={ASSIGN})
        calls = parsed.tool_calls[:1]
        errors = [] if calls else list(parsed.errors)  # the first call counts; the rest is ignored
    assignment = _checked(calls, unsolved, n_workers, errors)
    return Assignment(assignment, errors, full)


def _checked(
    calls: list[ToolCall], unsolved: Collection[int], n_workers: int, errors: list[str]
) -> dict[int, int]:
    """The valid ``part → worker`` of ``calls``; each invalid call adds to ``errors``."""
    assignment: dict[int, int] = {}
    for call in calls:
        part, worker = call.arguments.get("part"), call.arguments.get("worker")
        if not _is_int(part) or part not in unsolved:
            errors.append(f"part must be an unsolved part number, got {part!r}")
        elif not _is_int(worker) or not 0 <= worker < n_workers:
            errors.append(f"worker must be 0..{n_workers - 1}, got {worker!r}")
        elif part in assignment:
            errors.append(f"part {part} assigned twice")
        else:
            assignment[part] = worker
    return assignment


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
