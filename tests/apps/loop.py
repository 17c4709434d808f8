"""An app that loops until its agent says a word the tiny model never says: LangGraph's
tool-loop shape (``should_continue`` back to the agent), for step-limit (``max_supersteps``)
episodes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from marl_agents.llm.chat_app import ChatAppScenario


class State(TypedDict):
    messages: Annotated[list, add_messages]


def build(models: Any) -> Any:
    llm = models["agent"]

    def call_model(state: State) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    def should_continue(state: State) -> Literal["call_model", "__end__"]:
        return END if "FINAL ANSWER" in state["messages"][-1].content else "call_model"

    g = StateGraph(State)
    g.add_node("call_model", call_model)
    g.add_edge(START, "call_model")
    g.add_conditional_edges("call_model", should_continue)
    return g.compile()


def forever(**kwargs: Any) -> ChatAppScenario:
    kwargs.setdefault("max_supersteps", 3)
    return ChatAppScenario(build, tasks=["Say FINAL ANSWER."], verifier=lambda s: 1.0, **kwargs)
