"""A triage agent handing customers to a billing or a tech specialist, written with the OpenAI
Agents SDK (``openai-agents``) as its docs write handoffs, and trained through the gateway
(``tests.apps.agents_sdk_handoff:scenario``).

Each agent's model is an ``OpenAIChatCompletionsModel`` on an ``AsyncOpenAI`` client pointed at
the episode's base URL and key; the model names come from ``llm.models``. Tracing is disabled
(nothing leaves the machine). The triage agent must hand off (``tool_choice="required"``, a
documented ``ModelSettings`` field): its reply is a ``transfer_to_billing`` or
``transfer_to_tech`` call, decoded under that constraint, and the specialist it picks answers
the customer. The reward is 1 when the task's right specialist handled it
(``result.last_agent.name``).
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from marl_agents.gateway.app_scenario import AppScenario

set_tracing_disabled(True)  # no trace export: no network

#: task → the specialist that should handle it
RIGHT = {
    "I was charged twice for my plan this month.": "billing",
    "Please send me last month's invoice again.": "billing",
    "The app crashes when I open the settings page.": "tech",
    "I get error 500 when I try to log in.": "tech",
}
TASKS = list(RIGHT)

SETTINGS: dict[str, Any] = dict(
    tasks=TASKS,
    agents=["triage", "billing", "tech"],
    default_reply="I cannot help with that.",
    max_prompt_tokens=512,
    max_new_tokens=48,
    truncate_prompts=True,  # a tiny model's rambling specialist turns may not fit
)


async def run(task: str, llm: Any) -> dict[str, Any]:
    """The app: triage → billing | tech, with the Agents SDK."""
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)

    def model(agent: str) -> OpenAIChatCompletionsModel:
        return OpenAIChatCompletionsModel(model=llm.models[agent], openai_client=client)

    billing = Agent(
        name="billing",
        instructions="You handle billing questions: charges, refunds, invoices. Be brief.",
        model=model("billing"),
    )
    tech = Agent(
        name="tech",
        instructions="You handle technical problems: crashes, errors, logins. Be brief.",
        model=model("tech"),
    )
    triage = Agent(
        name="triage",
        instructions="Hand the customer to the specialist for their problem.",
        handoffs=[billing, tech],
        model=model("triage"),
        model_settings=ModelSettings(tool_choice="required"),
    )
    try:
        result = await Runner.run(triage, task, run_config=RunConfig(tracing_disabled=True))
    finally:
        await client.close()
    return {"last_agent": result.last_agent.name, "output": str(result.final_output)}


def handled_right(state: dict[str, Any]) -> bool:
    """The task's right specialist handled it."""
    return (state.get("result") or {}).get("last_agent") == RIGHT[state["task"]]


def scenario(**kwargs: Any) -> AppScenario:
    """The app as a scenario (``kwargs`` override its settings)."""
    return AppScenario(run, **{**SETTINGS, "verifier": handled_right, **kwargs})
