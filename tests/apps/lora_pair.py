"""Two chat agents with opposite skills, for LoRA pools on one base (tests/test_lora.py).

``alice`` then ``bob`` answer the same request; the reward is the share of lowercase letters
in alice's reply plus the share of other characters in bob's, so their pools are pushed in
opposite directions from one base model.
"""

from __future__ import annotations

from typing import Annotated, Any

from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from marl_agents.llm.chat_app import ChatAppScenario

TASK = "Write a few characters."


class State(TypedDict):
    messages: Annotated[list, add_messages]


def lower_share(text: str) -> float:
    """Share of lowercase ASCII letters in ``text`` (0 for an empty reply)."""
    return sum("a" <= c <= "z" for c in text) / len(text) if text else 0.0


def replies(state: dict[str, Any]) -> tuple[str, str]:
    """(alice's reply, bob's reply) in a final state."""
    texts = [str(m.content) for m in state["messages"][1:]]
    alice, bob, *_ = [*texts, "", ""]
    return alice, bob


def reward(state: dict[str, Any]) -> float:
    alice, bob = replies(state)
    return lower_share(alice) + (1.0 - lower_share(bob) if bob else 0.0)


def pair(**kwargs: Any) -> ChatAppScenario:
    """alice → bob, each once, on the same request."""

    def build(models: Any) -> Any:
        alice_llm, bob_llm = models["alice"], models["bob"]

        def alice(state: State):
            return {"messages": [alice_llm.invoke(state["messages"][:1])]}

        def bob(state: State):
            return {"messages": [bob_llm.invoke(state["messages"][:1])]}

        g = StateGraph(State).add_sequence([alice, bob])
        g.add_edge(START, "alice")
        return g.compile()

    settings: dict[str, Any] = {
        "tasks": [TASK],
        "verifier": reward,
        "max_prompt_tokens": 64,
        "max_new_tokens": 6,
    }
    return ChatAppScenario(build, **{**settings, **kwargs})
