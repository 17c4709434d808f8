"""An app that makes its models with ``init_chat_model``, as LangGraph's "Workflows and
agents" guide writes its prompt-chaining workflow, trained as a chat app.

    marl run examples.init_chat_model_app:scenario --train writer

The one change: ``init_chat_model`` comes from the ``models`` mapping
(``models.init_chat_model``, LangChain's signature) instead of ``langchain.chat_models``, and
each call names its agent (``agent=``; without it the id is the model's name, ``"gpt-4o"``).
Every call of a model is one decision of its agent; the editor stays frozen.
"""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from marl_agents.llm.chat_app import ChatAppScenario
from scenarios.base import Outcome

TOPICS = ["cats", "rain", "trains"]


class State(TypedDict, total=False):
    topic: str
    joke: str
    improved_joke: str


def build(models: Any) -> Any:
    init_chat_model = models.init_chat_model  # was: from langchain.chat_models import ...
    llm = init_chat_model("anthropic:claude-sonnet-4-5", temperature=0, agent="writer")
    editor = init_chat_model("openai:gpt-4o-mini", temperature=0, agent="editor")

    def generate_joke(state: State) -> dict[str, Any]:
        """First LLM call to generate the initial joke."""
        msg = llm.invoke(f"Write a short joke about {state['topic']}")
        return {"joke": msg.content}

    def check_punchline(state: State) -> str:
        """Gate function to check if the joke has a punchline."""
        return "Pass" if "?" in state["joke"] or "!" in state["joke"] else "Fail"

    def improve_joke(state: State) -> dict[str, Any]:
        """Second LLM call to improve the joke."""
        msg = editor.invoke(f"Make this joke funnier by adding wordplay: {state['joke']}")
        return {"improved_joke": msg.content}

    workflow = StateGraph(State)
    workflow.add_node("generate_joke", generate_joke)
    workflow.add_node("improve_joke", improve_joke)
    workflow.add_edge(START, "generate_joke")
    workflow.add_conditional_edges(
        "generate_joke", check_punchline, {"Fail": "improve_joke", "Pass": END}
    )
    workflow.add_edge("improve_joke", END)
    return workflow


def has_punchline(state: dict[str, Any]) -> Outcome:
    """Success: the writer's joke passes the gate by itself (a verifier in code); the reward
    adds a little for brevity, so that GRPO groups differ before the first punchline."""
    passed = "?" in state["joke"] or "!" in state["joke"]
    return Outcome(reward=float(passed) - 0.01 * len(state["joke"]), success=passed)


def scenario(**kwargs: Any) -> ChatAppScenario:
    settings: dict[str, Any] = dict(
        tasks=lambda rng: {"topic": TOPICS[int(rng.integers(len(TOPICS)))]},
        verifier=has_punchline,
        max_prompt_tokens=256,
        max_new_tokens=8,
        name="init-chat-model-jokes",
    )
    return ChatAppScenario(build, **{**settings, **kwargs})
