"""Persistence as LangGraph's docs write it, the chat models from ``models[...]``: a chatbot
graph compiled with ``checkpointer=MemorySaver()`` and invoked inside a node with its own
``{"configurable": {"thread_id": "1"}}`` (twice: it remembers the first turn), after a planner
with a checkpointer of the app's own.
"""

from __future__ import annotations

from typing import Annotated, Any

from langgraph.checkpoint.memory import MemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from marl_agents.llm.chat_app import ChatAppScenario


class State(TypedDict):
    messages: Annotated[list, add_messages]


def build(models: Any, saver: Any = None) -> Any:
    planner, helper = models["planner"], models["helper"]

    def chatbot(state: State) -> dict[str, Any]:
        return {"messages": [helper.invoke(state["messages"])]}

    memory = StateGraph(State)
    memory.add_node("chatbot", chatbot)
    memory.add_edge(START, "chatbot")
    chat = memory.compile(checkpointer=MemorySaver())

    def plan(state: State) -> dict[str, Any]:
        return {"messages": [planner.invoke(state["messages"])]}

    def ask_twice(state: State) -> dict[str, Any]:
        config = {"configurable": {"thread_id": "1"}}
        chat.invoke({"messages": [{"role": "user", "content": "Hi, I am Bob."}]}, config)
        out = chat.invoke({"messages": [{"role": "user", "content": "Who am I?"}]}, config)
        return {"messages": [out["messages"][-1]], "turns": len(out["messages"])}

    class Outer(State):
        turns: int

    g = StateGraph(Outer)
    g.add_node("plan", plan)
    g.add_node("ask_twice", ask_twice)
    g.add_edge(START, "plan")
    g.add_edge("plan", "ask_twice")
    return g.compile(checkpointer=saver)


def remembered(state: dict[str, Any]) -> float:
    """1 when the nested thread kept the first turn (4 messages), minus a little per character."""
    return float(state["turns"] == 4) - 0.001 * len(str(state["messages"][-1].content))


def chat(saver: bool = True, **kwargs: Any) -> ChatAppScenario:
    kept = MemorySaver() if saver else None
    return ChatAppScenario(
        lambda models: build(models, kept),
        tasks=["Plan a greeting."],
        verifier=remembered,
        **kwargs,
    )
