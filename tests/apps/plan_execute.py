"""LangGraph's plan-and-execute tutorial, written as the tutorial writes it.

A planner (``planner_prompt | llm.with_structured_output(Plan)``, ``Plan.steps: list[str]``)
makes a plan; an executor (``create_react_agent`` with a search tool) does its first step; a
replanner (``replanner_prompt | llm.with_structured_output(Act)``, ``Act.action:
Union[Response, Plan]``) answers or plans again. Changes for training, and why:

* the models come from ``models[...]`` (``planner``, ``executor``, ``replanner``);
* the search tool is a local function (the tutorial's Tavily search needs the network);
* the schema's strings and lists have length bounds (``max_length``): constrained decoding
  keeps every reply inside the schema, but an unbounded string can outrun the token budget
  before it closes (and then does not parse); with the bounds every reply of a random tiny
  model fits its ``max_new_tokens`` and parses.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any

from langchain_core.prompts import ChatPromptTemplate
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import create_react_agent
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from marl_agents.llm.chat_app import ChatAppScenario
from scenarios.base import Outcome

Step = Annotated[str, Field(max_length=12)]
OBJECTIVES = ["Who won the 2020 Tour de France?", "What is the capital of Peru?"]


class PlanExecute(TypedDict):
    input: str
    plan: list[str]
    past_steps: Annotated[list[tuple], operator.add]
    response: str


class Plan(BaseModel):
    """Plan to follow in future"""

    steps: list[Step] = Field(
        description="different steps to follow, should be in sorted order",
        min_length=1,
        max_length=2,
    )


class Response(BaseModel):
    """Response to user."""

    response: str = Field(max_length=12)


class Act(BaseModel):
    """Action to perform."""

    action: Response | Plan = Field(
        description="Action to perform. If you want to respond to user, use Response. "
        "If you need to further use tools to get the answer, use Plan."
    )


def search(query: str) -> str:
    """Search the web for a query."""
    return f"Results for {query[:20]}: nothing found."


PLANNER_PROMPT = ChatPromptTemplate.from_messages(
    [
        (
            "system",
            "For the given objective, come up with a simple step by step plan. This plan "
            "should involve individual tasks, that if executed correctly will yield the "
            "correct answer. Do not add any superfluous steps. The result of the final step "
            "should be the final answer. Make sure that each step has all the information "
            "needed - do not skip steps.",
        ),
        ("placeholder", "{messages}"),
    ]
)
REPLANNER_PROMPT = ChatPromptTemplate.from_template(
    "For the given objective, come up with a simple step by step plan. Your objective was "
    "this:\n{input}\n\nYour original plan was this:\n{plan}\n\nYou have currently done the "
    "follow steps:\n{past_steps}\n\nUpdate your plan accordingly. If no more steps are needed "
    "and you can return to the user, then respond with that. Otherwise, fill out the plan. "
    "Only add steps to the plan that still NEED to be done."
)


def build(models: Any) -> Any:
    """The tutorial's graph, its models from ``models``."""
    planner = PLANNER_PROMPT | models["planner"].with_structured_output(Plan)
    replanner = REPLANNER_PROMPT | models["replanner"].with_structured_output(Act)
    agent_executor = create_react_agent(
        models["executor"], [search], prompt="You are a helpful assistant."
    )

    def execute_step(state: PlanExecute) -> dict[str, Any]:
        plan = state["plan"]
        plan_str = "\n".join(f"{i + 1}. {step}" for i, step in enumerate(plan))
        task = plan[0]
        task_formatted = (
            f"For the following plan:\n{plan_str}\n\nYou are tasked with executing step "
            f"{1}, {task}."
        )
        agent_response = agent_executor.invoke({"messages": [("user", task_formatted)]})
        return {"past_steps": [(task, agent_response["messages"][-1].content)]}

    def plan_step(state: PlanExecute) -> dict[str, Any]:
        plan = planner.invoke({"messages": [("user", state["input"])]})
        return {"plan": plan.steps}

    def replan_step(state: PlanExecute) -> dict[str, Any]:
        output = replanner.invoke(state)
        if isinstance(output.action, Response):
            return {"response": output.action.response}
        return {"plan": output.action.steps}

    def should_end(state: PlanExecute) -> Any:
        if "response" in state and state["response"]:  # noqa: RUF019 (the tutorial's line)
            return END
        return "agent"

    workflow = StateGraph(PlanExecute)
    workflow.add_node("planner", plan_step)
    workflow.add_node("agent", execute_step)
    workflow.add_node("replan", replan_step)
    workflow.add_edge(START, "planner")
    workflow.add_edge("planner", "agent")
    workflow.add_edge("agent", "replan")
    workflow.add_conditional_edges("replan", should_end, ["agent", END])
    return workflow


def unreadable(text: str) -> int:
    """Characters of ``text`` that are neither letters nor spaces."""
    return sum(not (c.isalpha() or c == " ") for c in text)


def answered_briefly(state: dict[str, Any]) -> Outcome:
    """Reward an answer (success), more for fewer executed steps and a readable answer (a small
    cost per character that is not a letter or a space: the rewards of a GRPO group differ even
    when every rollout of a random tiny model answers after one step, with replies closed at
    the same length)."""
    if not state.get("response"):
        return Outcome(reward=0.0, success=False)
    brief = 1.0 / len(state["past_steps"]) - 1e-3 * unreadable(str(state["response"]))
    return Outcome(reward=brief, success=True)


def scenario(**kwargs: Any) -> ChatAppScenario:
    """The tutorial app as a scenario (``kwargs`` override its settings)."""
    settings: dict[str, Any] = dict(
        tasks=lambda rng: {"input": OBJECTIVES[int(rng.integers(len(OBJECTIVES)))]},
        verifier=answered_briefly,
        default_reply={
            "planner": '<tool>{"name": "Plan", "arguments": {"steps": ["search"]}}</tool>',
            "executor": "Done.",
            "replanner": '<tool>{"name": "Act", "arguments": {"action": {"response": "ok"}}}'
            "</tool>",
        },
        max_prompt_tokens=384,
        max_new_tokens=96,
        max_supersteps=80,
        name="plan-execute",
    )
    return ChatAppScenario(build, **{**settings, **kwargs})
