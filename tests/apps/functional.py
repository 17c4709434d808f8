"""Functional-API apps (``@entrypoint`` / ``@task``) as LangGraph's Functional-API docs write
them, the chat model taken from ``models[...]``: an essay writer whose tasks (started together,
as the docs' parallel example) each call the writer's model, then a critic; the same with a
checkpointer of its own.
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task

from marl_agents.llm.chat_app import ChatAppScenario

TOPICS = ["cats", "dogs"]


def build(models: Any, checkpointer: Any = None) -> Any:
    writer, critic = models["writer"], models["critic"]

    @task
    def write_essay(topic: str) -> str:
        """Write an essay about the given topic."""
        return writer.invoke([{"role": "user", "content": f"Write an essay about {topic}"}]).content

    @task
    def grade(essays: list[str]) -> str:
        """Pick the better essay."""
        text = "\n".join(essays)
        return critic.invoke([{"role": "user", "content": f"Which is best?\n{text}"}]).content

    @entrypoint(checkpointer=checkpointer)
    def workflow(inputs: dict[str, Any]) -> dict[str, Any]:
        futures = [write_essay(t) for t in inputs["topics"]]  # run in parallel, like Send
        essays = [f.result() for f in futures]
        return {"essays": essays, "verdict": grade(essays).result()}

    return workflow


def short(state: dict[str, Any]) -> float:
    """Reward short essays, a little (so GRPO groups differ)."""
    return 1.0 - 0.001 * sum(len(e) for e in state["essays"])


def essays(checkpointer: bool = False, **kwargs: Any) -> ChatAppScenario:
    saver = InMemorySaver() if checkpointer else None
    return ChatAppScenario(
        lambda models: build(models, saver),
        tasks=lambda rng: {"topics": TOPICS},
        verifier=short,
        name="functional-essays",
        **kwargs,
    )


def essays_saved(**kwargs: Any) -> ChatAppScenario:
    """The same with ``@entrypoint(checkpointer=InMemorySaver())``."""
    return essays(checkpointer=True, **kwargs)
