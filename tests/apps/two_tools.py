"""One agent called twice with the same messages, forcing a different tool each time
(issue #42: the second call was refused while the two calls' prompt ids were equal).

``picker`` is asked the task twice with the same messages and the same two bound tools:
first with ``tool_choice`` forcing ``go_left``, then forcing ``go_right``. Each call is its
own decision under its own grammar; the verifier checks that each reply is a call of the
tool its call forced (reward 1), which constrained decoding guarantees.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import BaseModel
from typing_extensions import TypedDict

from marl_agents.llm.chat_app import ChatAppScenario

TASKS = ["step once", "step twice"]


class GoLeft(BaseModel):
    """Step left."""

    steps: Literal[1, 2]


class GoRight(BaseModel):
    """Step right."""

    steps: Literal[1, 2]


class State(TypedDict):
    messages: Annotated[list, add_messages]
    calls: list[str]


def both_forced_calls(state: dict[str, Any]) -> bool:
    """Whether the two replies called ``GoLeft`` then ``GoRight``."""
    return state.get("calls") == ["GoLeft", "GoRight"]


def app(**kwargs: Any) -> ChatAppScenario:
    """The app as a scenario (``kwargs`` override its settings)."""

    def build(models: Any) -> Any:
        llm = models["picker"]

        def picker(state: State) -> dict[str, Any]:
            asked = state["messages"][:1]
            calls = []
            for forced in ("GoLeft", "GoRight"):
                reply = llm.bind_tools([GoLeft, GoRight], tool_choice=forced).invoke(asked)
                calls += [c["name"] for c in reply.tool_calls]
            return {"calls": calls}

        graph = StateGraph(State)
        graph.add_node("picker", picker)
        graph.add_edge(START, "picker")
        graph.add_edge("picker", END)
        return graph

    settings: dict[str, Any] = dict(
        tasks=TASKS,
        verifier=both_forced_calls,
        default_reply="-",
        max_prompt_tokens=48,  # the bound tools' descriptions are cut: the prompts are equal
        max_new_tokens=40,
    )
    return ChatAppScenario(build, **{**settings, **kwargs})


scenario = app()
