"""A Functional-API app (``@entrypoint`` / ``@task``) as LangGraph's docs write it, trained as a
chat app: the only change is that the chat models come from ``models[...]``.

    marl run examples.functional_app:scenario --train writer

Every call of an agent's model is one decision of that agent; the critic stays frozen. The
entrypoint's own checkpointer is kept (each episode runs on a fresh thread, deleted at its end).
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task

from marl_agents.llm.chat_app import ChatAppScenario

TOPICS = ["cats", "the sea", "rain"]


def build(models: Any) -> Any:
    writer, critic = models["writer"], models["critic"]

    @task
    def write_essay(topic: str) -> str:
        return writer.invoke([{"role": "user", "content": f"Write an essay about {topic}"}]).content

    @task
    def grade(topic: str, essay: str) -> str:
        prompt = f"Is this an essay about {topic}? Answer yes or no.\n{essay}"
        return critic.invoke([{"role": "user", "content": prompt}]).content

    @entrypoint(checkpointer=InMemorySaver())
    def workflow(inputs: dict[str, Any]) -> dict[str, Any]:
        essay = write_essay(inputs["topic"]).result()
        return {
            "topic": inputs["topic"],
            "essay": essay,
            "grade": grade(inputs["topic"], essay).result(),
        }

    return workflow


def on_topic(state: dict[str, Any]) -> float:
    """The topic's words in the essay (a verifier in code; the critic's grade is not trusted)."""
    words = state["topic"].split()
    return sum(w in state["essay"] for w in words) / len(words)


def scenario(**kwargs: Any) -> ChatAppScenario:
    return ChatAppScenario(
        build,
        tasks=lambda rng: {"topic": TOPICS[int(rng.integers(len(TOPICS)))]},
        verifier=on_topic,
        name="functional-essay",
        **kwargs,
    )
