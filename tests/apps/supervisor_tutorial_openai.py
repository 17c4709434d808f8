"""LangGraph's multi-agent supervisor tutorial with LangChain's ``ChatOpenAI``, run as a program.

The graph of ``tests/apps/supervisor_tutorial.py`` as the tutorial writes it, with one
change: each agent's ``ChatOpenAI`` takes its model name from ``MARL_MODEL_<AGENT>``
(``ChatOpenAI`` itself reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``). The models are made
at import, as apps make them, so this module is imported only by the program it is
(``python -m tests.apps.supervisor_tutorial_openai``: the task from ``MARL_TASK``, the routes
printed as the last line); ``tests/apps/openai_router.py``'s ``supervisor_tutorial``
scenario runs it per episode through the gateway.
"""

from __future__ import annotations

import json
import os
from typing import Literal

from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command
from typing_extensions import TypedDict

MEMBERS = ["researcher", "coder"]
SYSTEM = (
    "You are a supervisor tasked with managing a conversation between the following workers: "
    f"{MEMBERS}. Given the following user request, respond with the worker to act next. "
    "When finished, respond with FINISH."
)

llm = ChatOpenAI(model=os.environ["MARL_MODEL_SUPERVISOR"], max_retries=0)
researcher_llm = ChatOpenAI(model=os.environ["MARL_MODEL_RESEARCHER"], max_retries=0)
coder_llm = ChatOpenAI(model=os.environ["MARL_MODEL_CODER"], max_retries=0)


class Router(TypedDict):
    """Worker to route to next. If no workers needed, route to FINISH."""

    next: Literal["researcher", "coder", "FINISH"]


class State(MessagesState):
    next: str
    routes: list[str]


def supervisor_node(state: State) -> Command[Literal["researcher", "coder", "__end__"]]:
    messages = [{"role": "system", "content": SYSTEM}, *state["messages"]]
    response = llm.with_structured_output(Router).invoke(messages)
    goto = response["next"]
    routes = [*state.get("routes", []), goto]
    if goto == "FINISH":
        goto = END
    return Command(goto=goto, update={"next": goto, "routes": routes})


def research_node(state: State) -> Command[Literal["supervisor"]]:
    result = researcher_llm.invoke(state["messages"])
    reply = HumanMessage(content=result.content, name="researcher")
    return Command(update={"messages": [reply]}, goto="supervisor")


def code_node(state: State) -> Command[Literal["supervisor"]]:
    result = coder_llm.invoke(state["messages"])
    reply = HumanMessage(content=result.content, name="coder")
    return Command(update={"messages": [reply]}, goto="supervisor")


builder = StateGraph(State)
builder.add_edge(START, "supervisor")
builder.add_node("supervisor", supervisor_node)
builder.add_node("researcher", research_node)
builder.add_node("coder", code_node)
graph = builder.compile()

if __name__ == "__main__":
    task = json.loads(os.environ["MARL_TASK"])
    final = graph.invoke({"messages": [("user", task)]}, {"recursion_limit": 60})
    print(json.dumps({"routes": final.get("routes", [])}))
