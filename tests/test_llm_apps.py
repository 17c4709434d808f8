"""Existing LangGraph apps as GraphEnvs: swap in ``EnvChatModel``, the app stays as written.

Two real apps: a supervisor written in plain LangGraph (a chat model bound to
``transfer_to_<worker>`` handoff tools, conditional edges with a path map, workers reporting
back, one worker a frozen LLM on its own backend) and ``langgraph.prebuilt.create_react_agent``
with a deterministic tool. Each runs through ``GraphScenario`` with text spaces and a verifier;
the env is stepped with token-id actions (scripted tool calls, malformed calls, random ids, or
the tiny model's own generations).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send
from pettingzoo.test import parallel_api_test

from marl_agents.llm.backend import Generation, SamplingParams
from marl_agents.llm.chat_model import GenerationRecorder, PolicyChatModel
from marl_agents.llm.env_chat_model import EnvChatModel, backend_policy, in_env_run, tokens_action
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.llm.tiny import make_tiny_model
from scenarios.custom import GraphScenario
from scenarios.graph_env import GraphEnv
from scenarios.testing import check_rllib
from scenarios.text_space import TextSpaces, encode_prompt
from scenarios.toolcalls import render_tool_call

PENALTY = 0.1
MALFORMED = '<tool>{"name": "multiply", "arguments": {"a": 3</tool>'


# ----- the apps ------------------------------------------------------------------------------
@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


class TeamState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


WORKERS = ("calculator", "researcher")
SUPERVISOR_PROMPT = "You manage a calculator and a researcher. Hand work over, then answer."


def handoff(worker: str) -> BaseTool:
    """A ``transfer_to_<worker>`` tool, as langgraph-supervisor makes them."""

    @tool(f"transfer_to_{worker}")
    def transfer() -> str:
        """Hand the task over to this worker."""
        return f"Transferred to {worker}."

    return transfer


def supervisor_app(supervisor_llm: Any, calculator_llm: Any, researcher_llm: Any) -> Any:
    """A supervisor team in plain LangGraph; the three chat models are its only inputs."""
    boss = supervisor_llm.bind_tools([handoff(w) for w in WORKERS])
    calc = calculator_llm.bind_tools([multiply])

    def supervisor(state: TeamState) -> dict:
        reply = boss.invoke([SystemMessage(SUPERVISOR_PROMPT), *state["messages"]])
        acks = [
            ToolMessage(f"Transferred to {c['name'].removeprefix('transfer_to_')}.",
                        tool_call_id=c["id"])
            for c in reply.tool_calls
        ]  # fmt: skip
        return {"messages": [reply, *acks]}

    def route(state: TeamState) -> str:
        last = next(m for m in reversed(state["messages"]) if isinstance(m, AIMessage))
        for call in last.tool_calls:
            return call["name"].removeprefix("transfer_to_")
        return END

    def calculator(state: TeamState) -> dict:
        question = state["messages"][0]
        reply = calc.invoke([SystemMessage("Compute with the multiply tool."), question])
        result = "no result"
        for call in reply.tool_calls:
            try:
                result = str(multiply.invoke(call["args"]))
            except Exception as exc:  # bad arguments: report the failure
                result = f"error: {type(exc).__name__}"
        return {"messages": [AIMessage(f"calculator: {result}", name="calculator")]}

    def researcher(state: TeamState) -> dict:
        reply = researcher_llm.invoke([SystemMessage("Explain briefly."), state["messages"][0]])
        return {"messages": [AIMessage(f"researcher: {reply.content}", name="researcher")]}

    g = StateGraph(TeamState)
    g.add_node("supervisor", supervisor, metadata={"role": "orchestrator"})
    g.add_node("calculator", calculator, metadata={"role": "worker"})
    g.add_node("researcher", researcher, metadata={"role": "worker", "trainable": False})
    g.add_edge(START, "supervisor")
    g.add_conditional_edges(
        "supervisor", route, {"calculator": "calculator", "researcher": "researcher", END: END}
    )
    g.add_edge("calculator", "supervisor")
    g.add_edge("researcher", "supervisor")
    return g.compile()


def react_app(llm: Any) -> Any:
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "moved to langchain.agents": langchain isn't installed
        return create_react_agent(llm, [multiply])


# ----- the tasks and the verifier ----------------------------------------------------------
def question(rng: np.random.Generator) -> dict:
    a, b = (int(x) for x in rng.integers(2, 30, size=2))
    return {"messages": [HumanMessage(f"What is {a} times {b}?")]}


def factors(text: str) -> tuple[int, int]:
    a, b = re.findall(r"What is (\d+) times (\d+)\?", text)[-1]
    return int(a), int(b)


def verifier(state: dict) -> float:
    """1 when the last message is a final answer (no tool call) holding the product."""
    a, b = factors(state["messages"][0].content)
    last = state["messages"][-1]
    final = isinstance(last, AIMessage) and not last.tool_calls and not last.name
    return float(final and str(a * b) in re.findall(r"\d+", str(last.content)))


# ----- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return make_tiny_model(seed=0)


@pytest.fixture(scope="module")
def spaces(tiny: tuple[Any, Any]) -> TextSpaces:
    return TextSpaces.for_tokenizer(tiny[0], max_prompt_tokens=1024, max_new_tokens=40)


@pytest.fixture(scope="module")
def backend(tiny: tuple[Any, Any]) -> HFBackend:
    tok, model = tiny
    return HFBackend(model, tok)


def scenario(app: Any, spaces: TextSpaces) -> GraphScenario:
    return GraphScenario(
        app,
        observation_space=spaces.observation_space,
        action_space=spaces.action_space,
        score=verifier,
        initial_state=question,
    )


class Team:
    """The supervisor app with its models: one EnvChatModel for the two trainable agents."""

    def __init__(self, backend: HFBackend, spaces: TextSpaces) -> None:
        tok = backend.tokenizer
        _, frozen_model = make_tiny_model(seed=1)
        self.frozen = HFBackend(frozen_model, tok)
        self.chat = EnvChatModel(backend=backend, spaces=spaces, format_penalty=PENALTY)
        self.researcher = PolicyChatModel(
            backend=self.frozen, params=SamplingParams(max_new_tokens=12, temperature=0)
        )
        self.app = supervisor_app(self.chat, self.chat, self.researcher)
        self.env = GraphEnv(scenario(self.app, spaces))


def play(env: GraphEnv, policy: Callable[[str, Any], Any], seed: int) -> dict[str, float]:
    """One episode; returns each agent's summed reward."""
    obs, infos = env.reset(seed=seed)
    total: dict[str, float] = {}
    while env.agents:
        acting = {a: policy(a, obs[a]) for a in env.agents if infos[a]["acting"]}
        idle = {a: env.action_space(a).sample() for a in env.agents if a not in acting}
        obs, rewards, terms, truncs, infos = env.step({**acting, **idle})
        for a, r in rewards.items():
            total[a] = total.get(a, 0.0) + r
    return total


def final_state(env: GraphEnv) -> dict:
    assert env._run is not None
    return env._run.result


# ----- ReAct agent -----------------------------------------------------------------------------
def test_react_agent_scripted_token_episode_gets_the_verifier_reward(
    backend: HFBackend, spaces: TextSpaces
) -> None:
    tok = backend.tokenizer
    chat = EnvChatModel(backend=backend, spaces=spaces)
    env = GraphEnv(scenario(react_app(chat), spaces))
    assert env.possible_agents == ["agent"]  # the prebuilt ToolNode is no agent

    def policy(agent: str, obs: np.ndarray) -> np.ndarray:
        prompt = spaces.prompt_text(obs, tok)
        a, b = factors(prompt)
        if "<|im_start|>tool" not in prompt:  # first turn: call the tool
            return tokens_action(spaces, tok, render_tool_call("multiply", {"a": a, "b": b}))
        return tokens_action(spaces, tok, f"It is {a * b}.")

    rewards = play(env, policy, seed=3)
    assert rewards == {"agent": 1.0} and env.outcome is not None and not env.truncated
    assert [t.agent for t in env.trace] == ["agent", "agent"]  # "tools" never decides
    msgs = final_state(env)["messages"]
    assert [type(m).__name__ for m in msgs] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    a, b = factors(msgs[0].content)
    assert msgs[1].tool_calls[0]["args"] == {"a": a, "b": b} and msgs[2].content == str(a * b)
    steps = chat.recorder.steps("agent")
    assert len(steps) == 2 and all(s.format_ok for s in steps)
    for step, t in zip(steps, env.trace, strict=True):  # the record is the observed step
        assert step.generation.prompt_ids == spaces.decode_prompt(t.observation)
        assert step.generation.token_ids == spaces.decode_action(t.action)
        assert step.generation.token_ids[-1] == tok.eos_token_id
    # the tool result reached the second prompt as a tool turn
    assert "<|im_start|>tool\n" + str(a * b) in spaces.prompt_text(env.trace[1].observation, tok)


def test_react_agent_malformed_call_is_flagged_penalised_and_ends_cleanly(
    backend: HFBackend, spaces: TextSpaces
) -> None:
    tok = backend.tokenizer
    chat = EnvChatModel(backend=backend, spaces=spaces, format_penalty=PENALTY)
    env = GraphEnv(scenario(react_app(chat), spaces))
    rewards = play(env, lambda a, o: tokens_action(spaces, tok, MALFORMED), seed=0)
    assert rewards == {"agent": pytest.approx(-PENALTY)}  # verifier 0, penalty paid
    assert env.error is None and not env.truncated
    last = final_state(env)["messages"][-1]
    assert isinstance(last, AIMessage) and last.tool_calls == []
    assert last.response_metadata["format_ok"] is False
    [step] = chat.recorder.steps()
    assert not step.format_ok and "not valid JSON" in step.errors[0]


class ScriptedBackend:
    """Replies with fixed texts in turn (then EOS); logprobs 0."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies = tokenizer, list(replies)

    def generate(self, prompts: Any, params: Any = None) -> list[Generation]:
        out = []
        for p in prompts:
            ids = list(self.tokenizer(self.replies.pop(0), add_special_tokens=False)["input_ids"])
            ids.append(self.tokenizer.eos_token_id)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            out.append(Generation(encode_prompt(self.tokenizer, p), ids, [0.0] * len(ids), text))
        return out


@pytest.mark.parametrize("source", ["tiny-greedy", "scripted"])
def test_react_agent_env_driven_equals_direct_generation(
    source: str, backend: HFBackend, spaces: TextSpaces
) -> None:
    """Stepping the env with a backend's generations as actions reproduces the direct run."""
    tok = backend.tokenizer
    greedy = SamplingParams(temperature=0, max_new_tokens=spaces.max_new_tokens)
    start = question(np.random.default_rng(7))
    a, b = factors(start["messages"][0].content)
    script = [render_tool_call("multiply", {"a": a, "b": b}), f"It is {a * b}."]

    def source_backend() -> Any:
        return backend if source == "tiny-greedy" else ScriptedBackend(tok, script)

    direct = EnvChatModel(backend=source_backend(), spaces=spaces, params=greedy)
    out = react_app(direct).invoke(start)
    assert not in_env_run()

    stepped = EnvChatModel(tokenizer=tok, spaces=spaces)  # env-only: no backend of its own
    env = GraphEnv(scenario(react_app(stepped), spaces))
    rewards = play(env, backend_policy(source_backend(), spaces, greedy), seed=7)
    assert [(type(m), m.content) for m in final_state(env)["messages"]] == [
        (type(m), m.content) for m in out["messages"]
    ]
    d, s = direct.recorder.steps(), stepped.recorder.steps()
    assert len(d) == len(s) == (1 if source == "tiny-greedy" else 2)
    for x, y in zip(d, s, strict=True):
        assert x.generation.prompt_ids == y.generation.prompt_ids  # no truncation here
        assert x.generation.token_ids == y.generation.token_ids
        assert x.tool_calls == y.tool_calls and x.format_ok == y.format_ok
        assert np.isfinite(x.generation.logprobs).all() and np.isnan(y.generation.logprobs).all()
    assert rewards == {"agent": verifier(out)}
    assert source == "tiny-greedy" or rewards == {"agent": 1.0}


# ----- supervisor with handoff tools and a frozen LLM worker ---------------------------------
def supervisor_script(tok: Any, spaces: TextSpaces, calculator: str | None = None) -> Any:
    """Scripted policy: calculator, then researcher, then the answer from the calculator."""

    def policy(agent: str, obs: np.ndarray) -> np.ndarray:
        prompt = spaces.prompt_text(obs, tok)
        a, b = factors(prompt)
        if agent == "calculator":
            text = calculator or render_tool_call("multiply", {"a": a, "b": b})
        elif "\ncalculator: " not in prompt:  # a worker's report opens its turn
            text = render_tool_call("transfer_to_calculator", {})
        elif "\nresearcher: " not in prompt:
            text = render_tool_call("transfer_to_researcher", {})
        else:
            text = "The answer is " + re.findall(r"\ncalculator: (.*?)<", prompt)[-1]
        return tokens_action(spaces, tok, text)

    return policy


def test_supervisor_scripted_episode_with_frozen_researcher(
    backend: HFBackend, spaces: TextSpaces
) -> None:
    team = Team(backend, spaces)
    before = {k: v.clone() for k, v in team.frozen.model.state_dict().items()}
    assert team.env.possible_agents == ["supervisor", "calculator", "researcher"]
    assert team.env.scenario.topology.attr("researcher", "trainable") is False

    rewards = play(team.env, supervisor_script(backend.tokenizer, spaces), seed=11)
    assert rewards == {"supervisor": 1.0, "calculator": 1.0, "researcher": 0.0}  # team reward
    acted = [t.agent for t in team.env.trace]
    assert acted == ["supervisor", "calculator", "supervisor", "supervisor"]  # not researcher
    msgs = final_state(team.env)["messages"]
    a, b = factors(msgs[0].content)
    assert f"calculator: {a * b}" in [m.content for m in msgs]
    # the frozen researcher answered through its backend, not through the env
    [research] = team.researcher.recorder.steps("researcher")
    assert np.isfinite(research.generation.logprobs).all()
    [again] = team.frozen.generate([research.messages], team.researcher.params)
    assert research.generation.token_ids == again.token_ids
    assert f"researcher: {research.generation.text}" in [m.content for m in msgs]
    after = team.frozen.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit-identical
    # the trainable agents' steps are recorded under their node names
    assert [s.agent for s in team.chat.recorder] == acted
    handoffs = [c.name for s in team.chat.recorder for c in s.tool_calls]
    assert handoffs == ["transfer_to_calculator", "multiply", "transfer_to_researcher"]


def test_supervisor_format_error_is_penalised_and_the_episode_goes_on(
    backend: HFBackend, spaces: TextSpaces
) -> None:
    team = Team(backend, spaces)
    policy = supervisor_script(backend.tokenizer, spaces, calculator=MALFORMED)
    rewards = play(team.env, policy, seed=2)
    # the calculator reported no result; the supervisor went on, answered wrongly (reward 0)
    assert rewards == {"supervisor": 0.0, "calculator": pytest.approx(-PENALTY), "researcher": 0.0}
    assert team.env.error is None and not team.env.truncated
    assert "calculator: no result" in [m.content for m in final_state(team.env)["messages"]]
    flags = [(s.agent, s.format_ok) for s in team.chat.recorder]
    assert ("calculator", False) in flags and flags[-1] == ("supervisor", True)
    assert len(team.env.trace) == 4


def test_random_token_actions_never_break_an_episode(
    backend: HFBackend, spaces: TextSpaces
) -> None:
    """Uniform random ids decode to plain text (no ``<tool>`` block: a final reply, no
    penalty); random ids inside ``<tool>…</tool>`` are malformed calls: flagged, penalised,
    and the episode still ends normally."""
    tok = backend.tokenizer
    rng = np.random.default_rng(0)
    open_ids, close_ids = (
        tok(t, add_special_tokens=False)["input_ids"] for t in ("<tool>", "</tool>")
    )

    def tagged(agent: str, obs: np.ndarray) -> np.ndarray:
        body = rng.integers(3, len(tok), size=20).tolist()  # no pad / EOS / <|im_start|>
        return spaces.encode_action([*open_ids, *body, *close_ids, tok.eos_token_id])

    for app in ("supervisor", "react"):
        if app == "supervisor":
            team = Team(backend, spaces)
            env, chat = team.env, team.chat
        else:
            chat = EnvChatModel(backend=backend, spaces=spaces, format_penalty=PENALTY)
            env = GraphEnv(scenario(react_app(chat), spaces))
        for a in env.possible_agents:
            env.action_space(a).seed(0)
        for seed in range(3):
            rewards = play(env, lambda a, o, env=env: env.action_space(a).sample(), seed=seed)
            assert env.error is None and not env.truncated
            # the first agent replied, no answer; the others never acted (the closing step)
            assert {t.agent for t in env.trace} == {env.trace[0].agent}
            assert rewards == dict.fromkeys(env.possible_agents, 0.0)
        assert all(s.format_ok and not s.tool_calls for s in chat.recorder.pop_all())
        for seed in range(3):
            rewards = play(env, tagged, seed=seed)
            assert env.error is None and not env.truncated
            first = env.trace[0].agent
            assert {t.agent for t in env.trace} == {first}
            penalty = {first: pytest.approx(-PENALTY)}
            assert rewards == {**dict.fromkeys(env.possible_agents, 0.0), **penalty}
        steps = chat.recorder.pop_all()
        assert len(steps) == 3 and not any(s.format_ok or s.tool_calls for s in steps)


@pytest.mark.parametrize("app", ["supervisor", "react"])
def test_parallel_api_and_rllib_checker(app: str, backend: HFBackend, spaces: TextSpaces) -> None:
    def make() -> GraphEnv:
        if app == "supervisor":
            return Team(backend, spaces).env
        chat = EnvChatModel(backend=backend, spaces=spaces)
        return GraphEnv(scenario(react_app(chat), spaces))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(make(), num_cycles=8)
        check_rllib(make())


# ----- agent ids ---------------------------------------------------------------------------------
class FanState(TypedDict):
    results: Annotated[list, lambda a, b: a + b]


def test_send_fan_out_instances_are_separate_agents_in_one_step(
    backend: HFBackend, spaces: TextSpaces
) -> None:
    chat = EnvChatModel(backend=backend, spaces=spaces)

    def worker(arg: dict) -> dict:
        return {"results": [chat.invoke(f"part {arg['i']}").content]}

    g = StateGraph(FanState)
    g.add_node("lead", lambda s: {})
    g.add_node("worker", worker, metadata={"max_instances": 2, "agent": True})
    g.add_edge(START, "lead")
    g.add_conditional_edges("lead", lambda s: [Send("worker", {"i": i}) for i in range(2)],
                            ["worker"])  # fmt: skip
    g.add_edge("worker", END)
    tok = backend.tokenizer
    env = GraphEnv(
        GraphScenario(
            g.compile(),
            observation_space=spaces.observation_space,
            action_space=spaces.action_space,
            score=lambda s: float(len(s["results"])),
            initial_state={"results": []},
        )
    )
    obs, infos = env.reset(seed=0)
    assert env.agents == ["worker_0", "worker_1"]  # both pending in one parallel step
    replies = {a: tokens_action(spaces, tok, f"from {a}") for a in env.agents}
    _, rewards, *_ = env.step(replies)
    assert rewards == {"worker_0": 2.0, "worker_1": 2.0, "lead": 0.0}  # lead never decides
    assert sorted(final_state(env)["results"]) == ["from worker_0", "from worker_1"]
    # boolean node metadata ("agent": True) is a topology flag, not an id: the node name is used
    assert sorted(s.agent for s in chat.recorder) == ["worker", "worker"]


def test_agent_id_precedence_outside_an_env(backend: HFBackend, spaces: TextSpaces) -> None:
    rec = GenerationRecorder()
    p = SamplingParams(max_new_tokens=2, seed=0)
    EnvChatModel(backend=backend, spaces=spaces, params=p, recorder=rec).invoke("hi")
    EnvChatModel(backend=backend, spaces=spaces, params=p, recorder=rec, agent="a").invoke("hi")
    EnvChatModel(backend=backend, spaces=spaces, params=p, recorder=rec, agent="a").invoke(
        "hi", config={"metadata": {"agent": "b"}}
    )
    EnvChatModel(backend=backend, spaces=spaces, params=p, recorder=rec, agent="a").bind(
        agent="c"
    ).invoke("hi", config={"metadata": {"agent": True}})
    assert [s.agent for s in rec] == ["agent", "a", "b", "c"]


def test_unrecorded_calls_keep_unique_tool_call_ids(backend: HFBackend, spaces: TextSpaces) -> None:
    tok = backend.tokenizer
    spaces = TextSpaces.for_tokenizer(tok, max_prompt_tokens=1024, max_new_tokens=80)
    chat = EnvChatModel(backend=backend, spaces=spaces, record=False)
    env = GraphEnv(scenario(react_app(chat), spaces))
    obs, _ = env.reset(seed=0)
    a, b = factors(spaces.prompt_text(obs["agent"], tok))
    twice = render_tool_call("multiply", {"a": a, "b": b}) * 2
    env.step({"agent": tokens_action(spaces, tok, twice)})
    env.step({"agent": tokens_action(spaces, tok, f"{a * b}")})
    assert len(chat.recorder) == 0 and env.outcome is not None and env.outcome.reward == 1.0
    msgs = final_state(env)["messages"]
    ids = [c["id"] for c in msgs[1].tool_calls]
    assert len(set(ids)) == 2 and {m.tool_call_id for m in msgs[2:4]} == set(ids)
    assert msgs[1].response_metadata["step"] is None


def test_configuration_errors(backend: HFBackend, spaces: TextSpaces) -> None:
    tok = backend.tokenizer
    with pytest.raises(RuntimeError, match="outside a GraphEnv run"):
        EnvChatModel(tokenizer=tok, spaces=spaces).invoke("hi")
    with pytest.raises(ValueError, match="max_new_tokens"):
        EnvChatModel(backend=backend, spaces=spaces, params=SamplingParams(max_new_tokens=99))
    with pytest.raises(ValueError, match="for_tokenizer"):
        EnvChatModel(backend=backend, spaces=TextSpaces(100, 16, 8))
    with pytest.raises(ValueError, match="tokenizer or a backend"):
        EnvChatModel(spaces=spaces)
    assert EnvChatModel(backend=backend, spaces=spaces).params.max_new_tokens == 40
