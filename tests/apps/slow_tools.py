"""Tool-using chat apps for slow-tool tests and ``bench/slow_tools.py``.

Written the way LangGraph's docs write a tool-using agent: an ``agent`` node calling a chat
model with ``bind_tools``, a ``ToolNode``, ``tools_condition`` routing to it, and an edge back.
:func:`sync_app` has sync nodes and tools; :func:`async_app` is its twin with ``async def``
nodes and tools (``ainvoke``), so the same actions give the same episodes.

The ``lookup`` tool hangs on the key :data:`HANG` until :data:`RELEASE` is set (tests set it
when they are done, so no thread stays blocked).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Annotated, Any

from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from typing_extensions import TypedDict

from marl_agents.llm.chat_app import ChatAppScenario

#: the store ``lookup`` reads
VALUES = {"k1": "amber", "k2": "cobalt", "k3": "olive", "k4": "umber"}
#: ``lookup(key=HANG)`` blocks until :data:`RELEASE` is set (a hung tool)
HANG = "hang"
RELEASE = threading.Event()


class State(TypedDict):
    messages: Annotated[list, add_messages]


@tool
def lookup(key: str) -> str:
    """Look up the value stored under a key."""
    if key == HANG:
        RELEASE.wait()
    return f"{key}={VALUES.get(key, 'unknown')}"


@tool("lookup")
async def alookup(key: str) -> str:
    """Look up the value stored under a key."""
    if key == HANG:
        while not RELEASE.is_set():
            await asyncio.sleep(0.005)
    return f"{key}={VALUES.get(key, 'unknown')}"


def _task(rng: Any) -> str:
    key = sorted(VALUES)[int(rng.integers(len(VALUES)))]
    return f"What is stored under {key}? Use the lookup tool, then answer."


def _found(state: dict[str, Any]) -> float:
    """1 when the final answer names a stored value, minus a small length cost."""
    answer = str(state["messages"][-1].content)
    return float(any(v in answer for v in VALUES.values())) - 0.001 * len(answer)


SETTINGS: dict[str, Any] = {
    "tasks": _task,
    "verifier": _found,
    "max_prompt_tokens": 384,
    "max_new_tokens": 48,
}


def _agent_with_tools(agent: Any, tools: ToolNode) -> Any:
    """The docs' loop: START → agent → (tools_condition) → tools → agent … → END."""
    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def sync_app(handle_tool_errors: bool = False, **kwargs: Any) -> ChatAppScenario:
    """One assistant with a ``lookup`` tool; sync nodes and tools. ``handle_tool_errors``:
    the ``ToolNode`` turns a tool's error (a ``ToolTimeout`` too) into a message to the agent."""

    def build(models: Any) -> Any:
        llm = models["assistant"].bind_tools([lookup])

        def agent(state: State):
            return {"messages": [llm.invoke(state["messages"])]}

        return _agent_with_tools(agent, ToolNode([lookup], handle_tool_errors=handle_tool_errors))

    return ChatAppScenario(build, **{**SETTINGS, **kwargs})


def async_app(handle_tool_errors: bool = False, **kwargs: Any) -> ChatAppScenario:
    """:func:`sync_app`'s twin: ``async def`` agent node and tool (a server-style app)."""

    def build(models: Any) -> Any:
        llm = models["assistant"].bind_tools([alookup])

        async def agent(state: State):
            return {"messages": [await llm.ainvoke(state["messages"])]}

        return _agent_with_tools(agent, ToolNode([alookup], handle_tool_errors=handle_tool_errors))

    return ChatAppScenario(build, **{**SETTINGS, **kwargs})
