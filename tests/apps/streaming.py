"""A chat app that streams as LangGraph's streaming docs show, the models from ``models[...]``.

The writer's node streams its model's reply and adds up the chunks
(``for chunk in llm.stream(messages): full = full + chunk``); the reviewer's node runs a graph
of its own with ``stream_mode="messages"`` and keeps the text of the ``AIMessageChunk``s it
sees (``if isinstance(msg, AIMessageChunk): text += msg.content``). Each stream is one decision
of its agent; nothing else about the app changes for training.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk
from langgraph.graph import START, MessagesState, StateGraph

from marl_agents.llm.chat_app import ChatAppScenario


class State(MessagesState):
    review: str


def build(models: Any) -> Any:
    """writer (streams its reply) → reviewer (a graph streamed with ``stream_mode="messages"``)."""
    writer, reviewer = models["writer"], models["reviewer"]

    def write(state: State) -> dict[str, Any]:
        full = None
        for chunk in writer.stream(state["messages"]):
            full = chunk if full is None else full + chunk
        return {"messages": [full]}

    def call_reviewer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [reviewer.invoke(state["messages"])]}

    inner = StateGraph(MessagesState)
    inner.add_node("call_reviewer", call_reviewer)
    inner.add_edge(START, "call_reviewer")
    review_graph = inner.compile()

    def review(state: State) -> dict[str, Any]:
        text = ""
        for msg, _metadata in review_graph.stream(
            {"messages": state["messages"]}, stream_mode="messages"
        ):
            if isinstance(msg, AIMessageChunk):
                text += msg.content
        return {"messages": [AIMessage(text, name="reviewer")], "review": text}

    builder = StateGraph(State)
    builder.add_node("write", write)
    builder.add_node("review", review)
    builder.add_edge(START, "write")
    builder.add_edge("write", "review")
    return builder


def brief(state: dict[str, Any]) -> float:
    """Reward a short draft (so GRPO groups differ)."""
    draft = state["messages"][1].content
    return 1.0 - 0.01 * len(draft)


def app(**kwargs: Any) -> ChatAppScenario:
    """The streaming app as a scenario (``kwargs`` override its settings)."""
    settings: dict[str, Any] = dict(
        tasks=["Write a haiku about rivers."],
        verifier=brief,
        max_prompt_tokens=256,
        max_new_tokens=8,
        name="streaming",
    )
    return ChatAppScenario(build, **{**settings, **kwargs})
