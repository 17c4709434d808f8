"""Chat-model apps for training tests, named by import reference (``tests.apps.chat_team:…``).

Each verifier adds a small conciseness term to its task reward (as real ones often do), so
the rewards of a GRPO group differ even while a random tiny model never solves the task, and
a 2-iteration run always updates the trained pool.
"""

from __future__ import annotations

import asyncio
import operator
import warnings
from typing import Annotated, Any

from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send
from typing_extensions import TypedDict

from examples import supervisor_app
from marl_agents.llm.chat_app import ChatAppScenario


class OverallState(TypedDict):
    topic: str
    subjects: list
    jokes: Annotated[list, operator.add]
    best_selected_joke: str


class JokeState(TypedDict):
    subject: str


class State(TypedDict):
    messages: Annotated[list, add_messages]


def concise(reward: float, state: dict[str, Any]) -> float:
    return float(reward) - 0.001 * len(str(state["messages"][-1].content))


def supervisor(**kwargs: Any) -> ChatAppScenario:
    """The example's ``create_supervisor`` team, its routing reward plus conciseness."""
    kwargs.setdefault("verifier", lambda s: concise(supervisor_app.routed_right(s), s))
    return supervisor_app.scenario(**kwargs)


def react(**kwargs: Any) -> ChatAppScenario:
    """``create_react_agent`` alone: the degenerate one-agent team."""
    from langchain_core.tools import tool

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    def build(models: Any) -> Any:
        from langgraph.prebuilt import create_react_agent

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "moved to langchain.agents"
            return create_react_agent(models["assistant"], [multiply])

    settings: dict[str, Any] = {
        "tasks": ["What is 6 times 7?", "What is 3 times 9?"],
        "verifier": lambda s: concise("42" in str(s["messages"][-1].content), s),
        "max_prompt_tokens": 512,
        "max_new_tokens": 4,
    }
    return ChatAppScenario(build, **{**settings, **kwargs})


def swarm(**kwargs: Any) -> ChatAppScenario:
    """``create_swarm`` with two peers handing off to each other."""
    from langchain.agents import create_agent
    from langgraph_swarm import create_handoff_tool, create_swarm

    def build(models: Any) -> Any:
        alice = create_agent(
            models["Alice"],
            tools=[create_handoff_tool(agent_name="Bob", description="Transfer to Bob")],
            system_prompt="You are Alice, an addition expert.",
            name="Alice",
        )
        bob = create_agent(
            models["Bob"],
            tools=[create_handoff_tool(agent_name="Alice", description="Transfer to Alice")],
            system_prompt="You are Bob, you speak like a pirate.",
            name="Bob",
        )
        return create_swarm([alice, bob], default_active_agent="Alice").compile()

    settings: dict[str, Any] = {
        "tasks": ["Say hi like a pirate."],
        "verifier": lambda s: concise("arr" in str(s["messages"][-1].content).lower(), s),
        "max_prompt_tokens": 512,
        "max_new_tokens": 4,
    }
    return ChatAppScenario(build, **{**settings, **kwargs})


def map_reduce(**kwargs: Any) -> ChatAppScenario:
    """LangGraph's map-reduce how-to: an *unannotated* ``Send`` router fans a joke out per
    subject (three ``joker`` instances in one superstep), then a ``judge`` picks the best."""

    def build(models: Any) -> Any:
        joker, judge = models["joker"], models["judge"]

        def generate_topics(state: OverallState):
            return {"subjects": ["lions", "tigers", "bears"]}

        def continue_to_jokes(state: OverallState):
            return [Send("generate_joke", {"subject": s}) for s in state["subjects"]]

        def generate_joke(state: JokeState):
            response = joker.invoke(f"Generate a joke about {state['subject']}")
            return {"jokes": [response.content]}

        def best_joke(state: OverallState):
            jokes = "\n\n".join(state["jokes"])
            prompt = f"Return the ID of the best joke, starting with 0. Jokes:\n\n{jokes}"
            return {"best_selected_joke": judge.invoke(prompt).content}

        graph = StateGraph(OverallState)
        graph.add_node("generate_topics", generate_topics)
        graph.add_node("generate_joke", generate_joke)
        graph.add_node("best_joke", best_joke)
        graph.add_edge(START, "generate_topics")
        graph.add_conditional_edges("generate_topics", continue_to_jokes, ["generate_joke"])
        graph.add_edge("generate_joke", "best_joke")
        graph.add_edge("best_joke", END)
        return graph.compile()

    def picked(state: dict[str, Any]) -> float:
        best = str(state.get("best_selected_joke", "")).strip()
        return float(best in {"0", "1", "2"}) - 0.001 * len(best)

    settings: dict[str, Any] = {
        "tasks": [{"topic": "animals"}],
        "verifier": picked,
        "instances": {"joker": 3},
        "max_prompt_tokens": 256,
        "max_new_tokens": 12,
    }
    return ChatAppScenario(build, **{**settings, **kwargs})


def async_app(**kwargs: Any) -> ChatAppScenario:
    """A server-style app: ``async def`` nodes awaiting their models (normally ``ainvoke``d)."""

    def build(models: Any) -> Any:
        researcher_llm, writer_llm = models["researcher"], models["writer"]

        async def researcher(state: State):
            return {"messages": [await researcher_llm.ainvoke(state["messages"])]}

        async def writer(state: State):
            await asyncio.sleep(0.001)  # real async I/O between the calls
            return {"messages": [await writer_llm.ainvoke(state["messages"])]}

        g = StateGraph(State).add_sequence([researcher, writer])
        g.add_edge(START, "researcher")
        return g.compile()

    settings: dict[str, Any] = {
        "tasks": ["Write one line about lions."],
        "verifier": lambda s: concise("lion" in str(s["messages"][-1].content).lower(), s),
        "max_prompt_tokens": 256,
        "max_new_tokens": 12,
    }
    return ChatAppScenario(build, **{**settings, **kwargs})


def nested(**kwargs: Any) -> ChatAppScenario:
    """An agent inside a nested subgraph: a compiled ``analysis`` graph is a node of the app."""

    def build(models: Any) -> Any:
        analyst_llm, editor_llm = models["analyst"], models["editor"]

        def analyst(state: State):
            return {"messages": [analyst_llm.invoke(state["messages"])]}

        inner = StateGraph(State)
        inner.add_node("analyst", analyst)
        inner.add_edge(START, "analyst")
        inner.add_edge("analyst", END)

        def editor(state: State):
            return {"messages": [editor_llm.invoke(state["messages"])]}

        outer = StateGraph(State)
        outer.add_node("analysis", inner.compile())
        outer.add_node("editor", editor)
        outer.add_edge(START, "analysis")
        outer.add_edge("analysis", "editor")
        outer.add_edge("editor", END)
        return outer.compile()

    settings: dict[str, Any] = {
        "tasks": ["Summarise: lions sleep a lot."],
        "verifier": lambda s: concise("sleep" in str(s["messages"][-1].content).lower(), s),
        "max_prompt_tokens": 256,
        "max_new_tokens": 12,
    }
    return ChatAppScenario(build, **{**settings, **kwargs})
