"""An LLM chat app whose tool runs on every turn, for envs-in-flight tests and benches of LLM
pools (``tests/test_batched_llm.py``, ``bench/llm_in_flight.py``).

A random tiny model never writes a well-formed tool call, so an app that waits for one never
reaches its tools. Here the graph calls its ``lookup`` tool itself after each of the
assistant's replies (a retrieval step, as RAG apps do), so ``episodes.tool_latency`` slows
every episode the same way whatever the model writes: START → assistant → fetch (``lookup``)
→ critic → assistant … → END after ``turns`` assistant replies. ``critic`` is a second agent
(an LLM pool or a scripted one: a mixed team).
"""

from __future__ import annotations

from typing import Annotated, Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from marl_agents.llm.chat_app import ChatAppScenario

VALUES = {"k1": "amber", "k2": "cobalt", "k3": "olive", "k4": "umber"}


class State(TypedDict):
    messages: Annotated[list, add_messages]


@tool
def lookup(key: str) -> str:
    """Look up the value stored under a key."""
    return f"{key}={VALUES.get(key, 'unknown')}"


def _task(rng: Any) -> str:
    key = sorted(VALUES)[int(rng.integers(len(VALUES)))]
    return f"What is stored under {key}?"


def _found(state: dict[str, Any]) -> float:
    """1 when the last assistant reply names a stored value, minus a small length cost (so a
    GRPO group's rewards differ even when the model never answers right)."""
    replies = [m for m in state["messages"] if isinstance(m, AIMessage)]
    answer = str(replies[-1].content) if replies else ""
    return float(any(v in answer for v in VALUES.values())) - 0.001 * len(answer)


def app(turns: int = 2, **kwargs: Any) -> ChatAppScenario:
    """The app (``kwargs``: :class:`ChatAppScenario`'s, e.g. ``max_new_tokens``)."""

    def build(models: Any) -> Any:
        assistant, critic = models["assistant"], models["critic"]

        def answer(state: State) -> dict:
            return {"messages": [assistant.invoke(state["messages"])]}

        def fetch(state: State) -> dict:
            key = sorted(VALUES)[len(state["messages"]) % len(VALUES)]
            return {"messages": [HumanMessage(lookup.invoke({"key": key}))]}

        def review(state: State) -> dict:
            reply = critic.invoke(state["messages"])
            return {"messages": [HumanMessage(f"Critic: {reply.content}")]}

        def route(state: State) -> str:
            done = sum(isinstance(m, AIMessage) for m in state["messages"]) >= turns
            return END if done else "fetch"

        graph = StateGraph(State)
        graph.add_node("assistant", answer)
        graph.add_node("fetch", fetch)
        graph.add_node("critic", review)
        graph.add_edge(START, "assistant")
        graph.add_conditional_edges("assistant", route, ["fetch", END])
        graph.add_edge("fetch", "critic")
        graph.add_edge("critic", "assistant")
        return graph.compile()

    settings = {
        "tasks": _task,
        "verifier": _found,
        "agents": ["assistant", "critic"],
        "max_prompt_tokens": 96,
        "max_new_tokens": 6,
    }
    return ChatAppScenario(build, **{**settings, **kwargs})
