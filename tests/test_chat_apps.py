"""Chat-model apps as scenarios (``ChatAppScenario``): real apps written as their packages'
docs write them (langgraph-supervisor, langgraph-swarm, LangGraph's prebuilt ReAct agent), built
from a mapping agent → chat model; agents, roles, scripted episodes with the expected reward,
PettingZoo conformance (warnings not silenced), counterfactual values with default replies,
and the errors a user can hit.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("langgraph_supervisor")

from langchain_core.tools import tool
from pettingzoo.test import parallel_api_test

from examples import supervisor_app
from marl_agents.llm.chat_app import ChatAppScenario
from marl_agents.llm.env_chat_model import tokens_action
from scenarios.base import ScenarioError
from scenarios.graph_env import GraphEnv
from scenarios.toolcalls import complete_call, render_tool_call

MATH, RESEARCH = supervisor_app.TASKS


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def react_app(models):
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "moved to langchain.agents"
        return create_react_agent(models["assistant"], [multiply])


def product_right(state) -> bool:
    return "42" in str(state["messages"][-1].content)


def swarm_app(models):
    from langchain.agents import create_agent
    from langgraph_swarm import create_handoff_tool, create_swarm

    alice = create_agent(
        models["Alice"],
        tools=[multiply, create_handoff_tool(agent_name="Bob", description="Transfer to Bob")],
        system_prompt="You are Alice, a multiplication expert.",
        name="Alice",
    )
    bob = create_agent(
        models["Bob"],
        tools=[
            create_handoff_tool(
                agent_name="Alice", description="Transfer to Alice, she can help with math"
            )
        ],
        system_prompt="You are Bob, you speak like a pirate.",
        name="Bob",
    )  # fmt: skip
    return create_swarm([alice, bob], default_active_agent="Alice").compile()


def say(scenario: ChatAppScenario, text: str) -> np.ndarray:
    return tokens_action(scenario.spaces, scenario.tokenizer, text)


def play(env: GraphEnv, script: dict[str, list[str]], seed: int) -> tuple[list[str], float]:
    """One episode in which each agent says its scripted lines in turn (then its default)."""
    sc = env.scenario
    said = {a: 0 for a in env.possible_agents}
    order: list[str] = []
    obs, infos = env.reset(seed=seed)
    total = 0.0
    while env.agents:
        actions = {}
        for a in env.agents:
            lines = script.get(sc.topology.node_of(a), [])
            if infos[a]["acting"]:
                order.append(a)
                k = said[a]
                said[a] += 1
                actions[a] = say(sc, lines[k]) if k < len(lines) else sc.default_action(a)
            else:
                actions[a] = sc.default_action(a)
        obs, rewards, terms, truncs, infos = env.step(actions)
        total = max(total, *rewards.values()) if rewards else total
    return order, total


@pytest.fixture(scope="module")
def supervisor() -> ChatAppScenario:
    return supervisor_app.scenario()


# ----- agents and roles ----------------------------------------------------------------------
def test_supervisor_app_agents_are_the_models_it_reads_with_roles_from_its_routing(supervisor):
    assert supervisor.possible_agents == ["supervisor", "math_expert", "research_expert"]
    assert supervisor.text_agents == tuple(supervisor.possible_agents)
    assert supervisor.topology.roles == {
        "supervisor": "orchestrator",
        "math_expert": "worker",
        "research_expert": "worker",
    }
    assert supervisor.topology.pool_ids == ["orchestrator", "worker"]


def test_roles_override_and_single_react_agent_is_one_agent():
    sc = ChatAppScenario(react_app, tasks=["What is 6 times 7?"], verifier=product_right)
    assert sc.possible_agents == ["assistant"] and sc.topology.roles == {"assistant": "agent"}
    sc = ChatAppScenario(
        react_app,
        tasks=["What is 6 times 7?"],
        verifier=product_right,
        roles={"assistant": "worker"},
    )
    assert sc.topology.roles == {"assistant": "worker"}


# ----- scripted episodes ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("letter", "task", "reward"),
    [("m", MATH, 1.0), ("r", RESEARCH, 1.0), ("r", MATH, 0.0), ("xyz", MATH, 0.0)],
)
def test_supervisor_routes_by_its_reply_and_the_verifier_pays_the_right_route(
    supervisor, letter, task, reward
):
    # the scripted replies are longer than the example's 2 learning tokens
    sc = supervisor_app.scenario(tasks=[task], max_new_tokens=8)
    env = GraphEnv(sc)
    order, total = play(env, {"supervisor": [letter], "math_expert": ["done"]}, seed=0)
    assert total == reward and env.outcome.success is bool(reward)
    worker = {"m": "math_expert", "r": "research_expert"}.get(letter)
    assert order == (["supervisor", worker, "supervisor"] if worker else ["supervisor"])
    first = env.final_state["messages"][1]
    assert [c["name"] for c in first.tool_calls] == ([f"transfer_to_{worker}"] if worker else [])


def test_react_agent_alone_calls_its_tool_and_answers():
    sc = ChatAppScenario(react_app, tasks=["What is 6 times 7?"], verifier=product_right)
    env = GraphEnv(sc)
    script = {"assistant": [render_tool_call("multiply", {"a": 6, "b": 7}), "It is 42."]}
    order, total = play(env, script, seed=0)
    assert order == ["assistant", "assistant"] and total == 1.0
    assert env.final_state["messages"][2].content == "42"  # the tool's answer


def test_swarm_hands_off_between_peers():
    sc = ChatAppScenario(
        swarm_app, tasks=["Ask Bob to say hi, then 6 times 7."], verifier=product_right
    )
    assert sorted(sc.possible_agents) == ["Alice", "Bob"]
    env = GraphEnv(sc)
    script = {
        "Alice": [render_tool_call("transfer_to_bob", {}), "It is 42."],
        "Bob": [render_tool_call("transfer_to_alice", {})],
    }
    order, total = play(env, script, seed=0)
    assert order == ["Alice", "Bob", "Alice"] and total == 1.0


# ----- conformance and credit ----------------------------------------------------------------
def test_supervisor_app_passes_pettingzoo_parallel_api_test(supervisor):
    parallel_api_test(GraphEnv(supervisor), num_cycles=40)


def test_absent_supervisor_gives_its_default_reply_in_counterfactual_replays():
    sc = supervisor_app.scenario(tasks=[MATH])
    env = GraphEnv(sc)
    play(env, {"supervisor": ["m"]}, seed=3)
    actions = env.episode_actions()
    team = set(env.possible_agents)
    assert env.value(3, team, actions) == 1.0
    assert env.value(3, team - {"supervisor"}, actions) == 0.0  # "I cannot help with that."
    assert env.value(3, {"supervisor"}, actions) == 1.0  # routing alone earns it


# ----- helpers and errors --------------------------------------------------------------------
def test_complete_call_picks_the_one_tool_a_prefix_names():
    names = ["transfer_to_math_expert", "transfer_to_research_expert"]
    head = '<tool>{"name": "transfer_to_'
    assert complete_call(head + "m!!", names) == render_tool_call(names[0], {})
    assert complete_call(head + "q", names) == head + "q"  # no tool: unchanged
    assert complete_call(head, names) == head  # both match: unchanged
    done = render_tool_call(names[1], {"x": 1})
    assert complete_call(done, names) == done


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"build_app": "app.py"}, "build_app must be a function"),
        ({"build_app": lambda models: 3}, "return the app's StateGraph"),
        ({"tasks": []}, "non-empty list"),
        ({"verifier": "yes"}, "verifier must be"),
        ({"roles": {"nobody": "worker"}}, r"roles names \['nobody'\]"),
        ({"roles": {"assistant": "boss"}}, "are not roles: use one of"),
        ({"agents": ["helper"]}, "not in agents="),
        ({"prefill": "<tool>"}, r"prefill must map agent ids to the text"),
    ],
)
def test_bad_chat_app_arguments_name_the_fix(kwargs, match):
    args = {"build_app": react_app, "tasks": ["What is 6 times 7?"], "verifier": product_right}
    with pytest.raises((ScenarioError, KeyError), match=match):
        ChatAppScenario(**{**args, **kwargs})


def test_an_app_that_reads_no_model_is_rejected():
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    class S(TypedDict):
        x: int

    def build(models):
        g = StateGraph(S)
        g.add_node("n", lambda s: {"x": 1})
        g.add_edge(START, "n")
        return g

    with pytest.raises(ScenarioError, match="read no chat model"):
        ChatAppScenario(build, tasks=[{"x": 0}], verifier=lambda s: 1.0)


# ----- map-reduce, async, nested (tests/apps/chat_team.py) -----------------------------------
def steps_of(env: GraphEnv, script: dict[str, list[str]], seed: int = 0) -> list[list[str]]:
    """Who acted in each env step of a scripted episode."""
    sc = env.scenario
    said = dict.fromkeys(env.possible_agents, 0)
    steps = []
    obs, infos = env.reset(seed=seed)
    while env.agents:
        acting = [a for a in env.agents if infos[a]["acting"]]
        steps.append(acting)
        actions = {}
        for a in env.agents:
            lines = script.get(sc.topology.node_of(a), [])
            k = said[a] if a in acting else len(lines)
            said[a] += a in acting
            actions[a] = say(sc, lines[k]) if k < len(lines) else sc.default_action(a)
        obs, rewards, terms, truncs, infos = env.step(actions)
    return steps


def test_map_reduce_with_an_unannotated_send_gives_each_instance_its_id():
    from tests.apps.chat_team import map_reduce

    sc = map_reduce()
    assert sc.possible_agents == ["joker_0", "joker_1", "joker_2", "judge"]
    env = GraphEnv(sc)
    steps = steps_of(env, {"joker": ["ha"] * 3, "judge": ["1"]})
    assert steps == [["joker_0", "joker_1", "joker_2"], ["judge"]]  # the fan-out is one step
    assert env.final_state["jokes"] == ["ha", "ha", "ha"]
    assert env.final_state["best_selected_joke"] == "1" and env.outcome.success


def test_map_reduce_without_declared_instances_fails_at_once_naming_the_fix():
    from scenarios.bridge import BridgeError
    from tests.apps.chat_team import map_reduce

    env = GraphEnv(map_reduce(instances=None))
    with pytest.raises((BridgeError, ScenarioError), match="joker"):
        steps_of(env, {})


def test_async_app_runs_like_a_sync_one():
    from tests.apps.chat_team import async_app

    env = GraphEnv(async_app())
    steps = steps_of(env, {"researcher": ["Roar."], "writer": ["A lion."]})
    assert steps == [["researcher"], ["writer"]] and env.outcome.success
    parallel_api_test(GraphEnv(async_app()), num_cycles=20)


def test_agent_inside_a_nested_subgraph_decides_by_its_id():
    from tests.apps.chat_team import nested

    env = GraphEnv(nested())
    steps = steps_of(env, {"analyst": ["Naps."], "editor": ["They sleep."]})
    assert steps == [["analyst"], ["editor"]] and env.outcome.success
