"""Train the supervisor of a ``create_supervisor`` app against frozen workers, Shapley credit.

    marl run examples.supervisor_app:scenario --train supervisor --credit shapley
    marl run examples/supervisor_app.yaml            # the same as a YAML experiment

The app is written as langgraph-supervisor's README writes it; the only change is that its
chat models come from ``models[...]``. Tiny in-code models stand in for real ones on a CPU.
"""

from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from langgraph_supervisor import create_supervisor

from marl_agents.llm.chat_app import ChatAppScenario


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool
def web_search(query: str) -> str:
    """Search the web for information."""
    return "The FAANG companies had 1.97 million employees in 2024."


def build(models):
    math_agent = create_react_agent(
        models["math_expert"], [add], name="math_expert", prompt="You are a math expert."
    )
    research_agent = create_react_agent(
        models["research_expert"], [web_search], name="research_expert",
        prompt="You are a world class researcher with access to web search. Do not do any math.",
    )  # fmt: skip
    return create_supervisor(
        [research_agent, math_agent],
        model=models["supervisor"],
        prompt="You manage a research expert and a math expert. Assign work to one of them.",
    ).compile()


TASKS = ["What is 12 plus 30?", "How many people work at FAANG companies?"]
RIGHT = {TASKS[0]: "transfer_to_math_expert", TASKS[1]: "transfer_to_research_expert"}


def routed_right(state):
    """Success: the supervisor's first handoff goes to the worker the task needs."""
    calls = [c["name"] for m in state["messages"] for c in getattr(m, "tool_calls", None) or []]
    return bool(calls) and calls[0] == RIGHT[state["messages"][0].content]


def first_turn_handoff(chat):
    """Open a handoff call on the supervisor's first turn (the tiny model then picks a worker)."""
    return '<tool>{"name": "transfer_to_' if chat[-1]["role"] == "user" else ""


def scenario(**kwargs):
    """The app as a scenario (``kwargs``: ``scenario_kwargs`` of an experiment, e.g. tasks)."""
    settings = dict(
        tasks=TASKS, verifier=routed_right, default_reply="I cannot help with that.",
        prefill={"supervisor": first_turn_handoff}, complete_calls=True,
        # a tiny model sees the prompt's last 64 tokens; a reply is 2 tokens (the prefilled
        # handoff needs one letter and an end): with 8, the 6+ tokens after the letter are
        # noise that the token-mean loss pushes with every row's advantage, and 2 of 3 seeds
        # per sampler stayed at the coin-flip plateau for 100 iterations (issue #25)
        max_prompt_tokens=64, max_new_tokens=2,
    )  # fmt: skip
    return ChatAppScenario(build, **{**settings, **kwargs})
