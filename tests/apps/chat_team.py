"""Chat-model apps for training tests, named by import reference (``tests.apps.chat_team:…``).

Each verifier adds a small conciseness term to its task reward (as real ones often do), so
the rewards of a GRPO group differ even while a random tiny model never solves the task, and
a 2-iteration run always updates the trained pool.
"""

from __future__ import annotations

import warnings
from typing import Any

from examples import supervisor_app
from marl_agents.llm.chat_app import ChatAppScenario


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
