"""LangGraph's multi-agent supervisor tutorial, written as the tutorial writes it.

The supervisor routes with ``llm.with_structured_output(Router)``, ``Router`` a TypedDict
whose ``next`` is a ``Literal`` of the workers and ``"FINISH"``; the workers answer in free
text and hand back to the supervisor (``Command``). The only change for training: the models
come from ``models[...]``. With constrained decoding (the pools' default ``constrain: auto``)
every routing reply parses, with no ``prefill``: a random tiny model routes, and the verifier
pays the episode whose first route is the worker the task names.
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command
from typing_extensions import TypedDict

from marl_agents.llm.chat_app import ChatAppScenario
from scenarios.base import Outcome

MEMBERS = ["researcher", "coder"]
TASKS = ["Find who wrote the paper.", "Write a sort function."]
SYSTEM = (
    "You are a supervisor tasked with managing a conversation between the following workers: "
    f"{MEMBERS}. Given the following user request, respond with the worker to act next. "
    "When finished, respond with FINISH."
)


class Router(TypedDict):
    """Worker to route to next. If no workers needed, route to FINISH."""

    next: Literal["researcher", "coder", "FINISH"]


class State(MessagesState):
    next: str
    routes: list[str]


def build(models: Any) -> Any:
    """The tutorial's graph, its models from ``models``."""
    llm = models["supervisor"]

    def supervisor_node(state: State) -> Command[Literal["researcher", "coder", "__end__"]]:
        messages = [{"role": "system", "content": SYSTEM}, *state["messages"]]
        response = llm.with_structured_output(Router).invoke(messages)
        goto = response["next"]
        routes = [*state.get("routes", []), goto]
        if goto == "FINISH":
            goto = END
        return Command(goto=goto, update={"next": goto, "routes": routes})

    def worker(name: str) -> Any:
        model = models[name]

        def node(state: State) -> Command[Literal["supervisor"]]:
            result = model.invoke(state["messages"])
            reply = HumanMessage(content=result.content, name=name)
            return Command(update={"messages": [reply]}, goto="supervisor")

        return node

    builder = StateGraph(State)
    builder.add_edge(START, "supervisor")
    builder.add_node("supervisor", supervisor_node)
    builder.add_node("researcher", worker("researcher"))
    builder.add_node("coder", worker("coder"))
    return builder


def first_route_right(state: dict[str, Any]) -> bool:
    """Whether the supervisor's first route is the worker the task names."""
    routes = state.get("routes") or []
    want = "researcher" if str(state["messages"][0].content) == TASKS[0] else "coder"
    return bool(routes) and routes[0] == want


def routed_then_finished(state: dict[str, Any]) -> Outcome:
    """The whole job: 1 for the right first route then FINISH, 0.5 for the right first route
    in an episode cut off by the step limit (it never said FINISH: ``score_limit=True`` scores
    those), 0 otherwise; success is the whole job."""
    right = first_route_right(state)
    finished = (state.get("routes") or [""])[-1] == "FINISH"
    return Outcome(reward=float(right) * (1.0 if finished else 0.5), success=right and finished)


def scenario(whole_job: bool = False, **kwargs: Any) -> ChatAppScenario:
    """The tutorial app as a scenario (``kwargs`` override its settings); ``whole_job``: the
    verifier is :func:`routed_then_finished` (with cut-off episodes scored), else
    :func:`first_route_right`."""
    settings: dict[str, Any] = dict(
        tasks=TASKS,
        verifier=routed_then_finished if whole_job else first_route_right,
        score_limit=whole_job,
        default_reply='<tool>{"name": "Router", "arguments": {"next": "FINISH"}}</tool>',
        max_prompt_tokens=256,
        max_new_tokens=64,
        max_supersteps=60,
    )
    return ChatAppScenario(build, **{**settings, **kwargs})
