"""Moved to :mod:`scenarios.toolcalls` (environments parse replies); re-exported here.

``from marl_agents.llm.toolcalls import parse_tool_calls`` keeps working.
"""

from __future__ import annotations

from scenarios.toolcalls import (
    CLOSE,
    OPEN,
    ParsedOutput,
    ToolCall,
    parse_tool_calls,
    render_tool_call,
    render_tool_instructions,
)

__all__ = [
    "CLOSE",
    "OPEN",
    "ParsedOutput",
    "ToolCall",
    "parse_tool_calls",
    "render_tool_call",
    "render_tool_instructions",
]
