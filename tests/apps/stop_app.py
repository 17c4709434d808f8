"""An app whose agent ends its replies with ``stop`` strings (issue #42 item 3, in training).

``writer`` is asked a task and answers through ``llm.invoke(messages, stop=STOP)``; the
random tiny model writes an ``a`` or a newline within its 16-token budget most of the time,
so most replies end at a stop string, often inside a token (``ar``). Every reply the app
receives is logged in :data:`RECEIVED` (text, finish reason, number of tokens), which the
tests compare with the learner's rows. The reward is 1 for a reply shorter than 4
characters (some variance for GRPO).
"""

from __future__ import annotations

from typing import Annotated, Any

from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from marl_agents.llm.chat_app import ChatAppScenario

TASKS = ["say something", "say more"]
#: the writer's stop strings
STOP = ["a", "\n"]
#: per call, what the app received: (text, finish_reason, num_tokens)
RECEIVED: list[tuple[str, str, int]] = []


class State(TypedDict):
    messages: Annotated[list, add_messages]


def short(state: dict[str, Any]) -> bool:
    """Whether the writer's reply is shorter than 4 characters."""
    return len(str(state["messages"][-1].content)) < 4


def app(**kwargs: Any) -> ChatAppScenario:
    """The one-agent app as a scenario (``kwargs`` override its settings)."""

    def build(models: Any) -> Any:
        llm = models["writer"]

        def writer(state: State) -> dict[str, Any]:
            reply = llm.invoke(state["messages"][:1], stop=STOP)
            meta = reply.response_metadata
            RECEIVED.append((str(reply.content), meta["finish_reason"], meta["num_tokens"]))
            return {"messages": [reply]}

        graph = StateGraph(State)
        graph.add_node("writer", writer)
        graph.add_edge(START, "writer")
        graph.add_edge("writer", END)
        return graph

    settings: dict[str, Any] = dict(
        tasks=TASKS, verifier=short, default_reply="-", max_prompt_tokens=32, max_new_tokens=16
    )
    return ChatAppScenario(build, **{**settings, **kwargs})


scenario = app()
