"""A one-token routing app for the LLM learning canaries (``tests/test_canaries.py``).

``router`` (the trained agent) reads a task and replies; its **first character** routes: a
lowercase letter is right for :data:`TASKS` ``[0]``, anything else for ``[1]``. A right reply
hands over to ``worker`` (a frozen agent, one more decision); a wrong one ends the episode.
The reward is 1 for a right route, else 0. So, as in the supervisor example, the episodes
that succeed are the longer ones: a sampler that cuts GRPO groups by finishing time sorts a
group's rollouts by outcome and starves the learner (issue #25). A random tiny model starts
a reply with a lowercase letter about 40% of the time, so a router that ignores the task
scores about 0.5; one that reads the task scores 1.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from marl_agents.llm.chat_app import ChatAppScenario

TASKS = ["write in small letters", "WRITE IN CAPITALS!"]


class State(TypedDict):
    messages: Annotated[list, add_messages]


def right_reply(task: str, reply: str) -> bool:
    """Whether ``reply`` starts the way ``task`` asks (a lowercase letter for ``TASKS[0]``)."""
    lower = reply[:1].islower()
    return lower if task == TASKS[0] else not lower


def routed_right(state: dict[str, Any]) -> bool:
    """Whether the router's reply starts the way its task asks."""
    messages = state["messages"]
    if len(messages) < 2:
        return False
    return right_reply(str(messages[0].content), str(messages[1].content))


def app(**kwargs: Any) -> ChatAppScenario:
    """The router → worker app as a scenario (``kwargs`` override its settings)."""

    def build(models: Any) -> Any:
        router_llm, worker_llm = models["router"], models["worker"]

        def router(state: State) -> dict[str, Any]:
            return {"messages": [router_llm.invoke(state["messages"][:1])]}

        def worker(state: State) -> dict[str, Any]:
            return {"messages": [worker_llm.invoke(state["messages"][:2])]}

        def route(state: State) -> Literal["worker", "__end__"]:
            return "worker" if routed_right(state) else END

        graph = StateGraph(State)
        graph.add_node("router", router)
        graph.add_node("worker", worker)
        graph.add_edge(START, "router")
        graph.add_conditional_edges("router", route)
        graph.add_edge("worker", END)
        return graph

    settings: dict[str, Any] = dict(
        tasks=TASKS,
        verifier=routed_right,
        default_reply="-",
        max_prompt_tokens=32,
        max_new_tokens=2,
    )
    return ChatAppScenario(build, **{**settings, **kwargs})
