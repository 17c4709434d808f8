"""Train the triage agent of an app written with the plain ``openai`` SDK, experts frozen.

    marl run examples.openai_app:scenario --train triage --credit shapley
    marl run examples/openai_app.yaml                 # the same as a YAML experiment

``run(task, llm)`` is the app as written for OpenAI's API: a triage agent hands the task to
an expert with a forced tool call (``tools`` + ``tool_choice="required"``), and the expert
answers. The only thing it takes from marl is ``llm``: the base URL, the episode's key and
each agent's model name (an app run as its own program reads them from ``OPENAI_BASE_URL``,
``OPENAI_API_KEY`` and ``MARL_MODEL_<AGENT>``: ``AppScenario.command``). Every request is one
decision of the agent it names, served by that agent's own policy — here tiny in-code models
standing in for real ones on a CPU. The forced call is decoded under its tools' grammar
(constrained decoding), so even an untrained model's reply is a valid handoff: the policy
only learns which expert to call.
"""

from openai import OpenAI

from marl_agents.gateway import AppScenario

TASKS = ["What is 12 plus 30?", "How many people work at FAANG companies?"]
RIGHT = {TASKS[0]: "math", TASKS[1]: "research"}


def transfer(expert):
    return {
        "type": "function",
        "function": {
            "name": f"transfer_to_{expert}",
            "description": f"Hand the task to the {expert} expert.",
            "parameters": {"type": "object", "properties": {}},
        },
    }


def run(task, llm):
    """The app: triage, then the chosen expert. Returns who answered and what."""
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    triage = client.chat.completions.create(
        model=llm.models["triage"],
        messages=[
            {"role": "system", "content": "Route the task to the right expert."},
            {"role": "user", "content": task},
        ],
        tools=[transfer("math"), transfer("research")],
        tool_choice="required",
    )
    calls = triage.choices[0].message.tool_calls or []
    expert = calls[0].function.name.removeprefix("transfer_to_") if calls else None
    if expert not in ("math", "research"):
        return {"expert": None}
    answer = client.chat.completions.create(
        model=llm.models[expert],
        messages=[
            {"role": "system", "content": f"You are the {expert} expert."},
            {"role": "user", "content": task},
        ],
    )
    return {"expert": expert, "answer": answer.choices[0].message.content}


def routed_right(state):
    """Success: the task went to the expert it needs."""
    return state["result"].get("expert") == RIGHT[state["task"]]


def scenario(**kwargs):
    """The app as a scenario (``kwargs``: ``scenario_kwargs`` of an experiment)."""
    settings = dict(
        tasks=TASKS, verifier=routed_right, agents=["triage", "math", "research"],
        default_reply="I cannot help with that.",
        # a tiny model: a reply budget the handoff call fits in (at most one token a
        # character), prompts keep their last 96 tokens
        max_prompt_tokens=96, max_new_tokens=64, truncate_prompts=True,
    )  # fmt: skip
    return AppScenario(run, **{**settings, **kwargs})
