"""PolicyChatModel inside real LangGraph graphs: recording, tools, ReAct, fan-out batching."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("transformers")

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from marl_agents.llm.backend import Generation, SamplingParams
from marl_agents.llm.batching import BatchingBackend
from marl_agents.llm.chat_model import GenerationRecorder, PolicyChatModel, to_chat_dicts
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.llm.tiny import make_tiny_model
from scenarios.text_space import Prompt, encode_prompt, make_tiny_tokenizer

LOGPROB_ATOL = 1e-5


@pytest.fixture(scope="module")
def hf() -> HFBackend:
    tok, model = make_tiny_model(seed=0)
    return HFBackend(model, tok)


class ScriptedBackend:
    """Replies with fixed texts in turn (tokenised with the tiny tokenizer), logprobs 0."""

    def __init__(self, replies: Sequence[str]) -> None:
        self.tokenizer = make_tiny_tokenizer()
        self.replies = list(replies)
        self.prompts: list[list[int]] = []

    def generate(
        self, prompts: Sequence[Prompt], params: SamplingParams | Any = None
    ) -> list[Generation]:
        out = []
        for p in prompts:
            ids = encode_prompt(self.tokenizer, p)
            self.prompts.append(ids)
            text = self.replies.pop(0)
            toks = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            toks.append(self.tokenizer.eos_token_id)
            out.append(Generation(ids, toks, [0.0] * len(toks), text, "stop"))
        return out


class ChatState(TypedDict):
    messages: Annotated[list, operator.add]


class FanState(TypedDict):
    results: Annotated[list, operator.add]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_records_tokens_per_node_in_a_state_graph(hf: HFBackend) -> None:
    recorder = GenerationRecorder()
    chat = PolicyChatModel(
        backend=hf, params=SamplingParams(max_new_tokens=10, seed=0), recorder=recorder
    )

    def planner(state: ChatState) -> dict:
        return {"messages": [chat.invoke(state["messages"])]}

    def solver(state: ChatState) -> dict:
        msgs = [SystemMessage("You solve."), *state["messages"]]
        return {"messages": [chat.invoke(msgs)]}

    g = StateGraph(ChatState).add_sequence([planner, solver])
    g.add_edge(START, "planner")
    final = g.compile().invoke({"messages": [HumanMessage("What is 2 + 3?")]})

    steps = recorder.steps()
    assert [s.agent for s in steps] == ["planner", "solver"]  # keyed by the calling node
    assert list(recorder.by_agent()) == ["planner", "solver"]
    replies = final["messages"][1:]
    tok = hf.tokenizer
    for step, reply in zip(steps, replies, strict=True):
        gen = step.generation
        assert reply.content == gen.text
        assert reply.response_metadata["agent"] == step.agent
        assert reply.response_metadata["num_tokens"] == len(gen.token_ids)
        assert gen.prompt_ids == encode_prompt(tok, step.messages)
        assert step.format_ok and step.tool_calls == []
    # the solver's prompt holds the planner's reply as an assistant turn
    assert steps[1].messages[0]["role"] == "system"
    assert steps[1].messages[-1] == {"role": "assistant", "content": replies[0].content}
    # recorded logprobs = teacher-forced recompute of the recorded token ids
    recomputed = hf.logprobs(
        [s.generation.prompt_ids for s in steps], [s.generation.token_ids for s in steps]
    )
    for s, r in zip(steps, recomputed, strict=True):
        assert s.generation.logprobs == pytest.approx(r, abs=LOGPROB_ATOL)
    assert len(recorder.pop_all()) == 2 and len(recorder) == 0


def test_agent_key_precedence(hf: HFBackend) -> None:
    recorder = GenerationRecorder()
    p = SamplingParams(max_new_tokens=2, seed=0)
    PolicyChatModel(backend=hf, params=p, recorder=recorder).invoke("hi")
    PolicyChatModel(backend=hf, params=p, recorder=recorder, agent="solver").invoke("hi")
    PolicyChatModel(backend=hf, params=p, recorder=recorder, agent="solver").invoke(
        "hi", config={"metadata": {"agent": "worker_3"}}
    )
    assert [s.agent for s in recorder] == ["agent", "solver", "worker_3"]


def test_call_overrides_of_sampling_params(hf: HFBackend) -> None:
    chat = PolicyChatModel(backend=hf, params=SamplingParams(max_new_tokens=20, seed=0))
    short = chat.bind(max_new_tokens=3, temperature=0).invoke("hello")
    assert short.response_metadata["num_tokens"] == 3
    [step] = chat.recorder.steps()
    greedy = hf.generate([step.messages], SamplingParams(temperature=0, max_new_tokens=3))
    assert step.generation.token_ids == greedy[0].token_ids


def test_react_agent_calls_a_tool_and_records_both_turns() -> None:
    from langgraph.prebuilt import create_react_agent

    backend = ScriptedBackend(
        ['Let me add. <tool>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool>', "It is 5."]
    )
    chat = PolicyChatModel(backend=backend, agent="solver")
    agent = create_react_agent(chat, [add])
    out = agent.invoke({"messages": [HumanMessage("What is 2 + 3?")]})
    msgs = out["messages"]
    assert [type(m).__name__ for m in msgs] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    assert msgs[1].tool_calls[0]["name"] == "add" and msgs[1].tool_calls[0]["args"] == {
        "a": 2,
        "b": 3,
    }
    assert msgs[1].content == "Let me add."
    assert isinstance(msgs[2], ToolMessage) and msgs[2].content == "5"
    assert msgs[3].content == "It is 5."
    steps = chat.recorder.steps("solver")
    assert len(steps) == 2 and all(s.format_ok for s in steps)
    # tools are described in the system message; the tool result comes back as a tool turn
    first, second = steps[0].messages, steps[1].messages
    assert first[0]["role"] == "system" and "- add: Add two integers." in first[0]["content"]
    assert second[-2]["role"] == "assistant" and '"name": "add"' in second[-2]["content"]
    assert second[-1] == {"role": "tool", "content": "5"}
    # the recorded token ids are what the backend generated, not a re-tokenisation
    tok = backend.tokenizer
    assert steps[0].generation.token_ids[-1] == tok.eos_token_id


def test_malformed_tool_call_ends_without_exception_and_is_flagged() -> None:
    from langgraph.prebuilt import create_react_agent

    backend = ScriptedBackend(['<tool>{"name": "add", "arguments": {"a": 2</tool>'])
    chat = PolicyChatModel(backend=backend, agent="solver")
    out = create_react_agent(chat, [add]).invoke({"messages": [HumanMessage("2 + 3?")]})
    last = out["messages"][-1]
    assert isinstance(last, AIMessage) and last.tool_calls == []
    assert last.response_metadata["format_ok"] is False
    [step] = chat.recorder.steps()
    assert not step.format_ok and "not valid JSON" in step.errors[0]


def test_unknown_tool_name_is_a_format_error() -> None:
    backend = ScriptedBackend(['<tool>{"name": "rm", "arguments": {}}</tool>'])
    chat = PolicyChatModel(backend=backend)
    msg = chat.bind_tools([add]).invoke("go")
    assert msg.tool_calls == [] and msg.response_metadata["format_ok"] is False


def test_send_fan_out_is_one_batched_generate_call(hf: HFBackend) -> None:
    k = 4
    batching = BatchingBackend(hf, max_batch_size=k, max_wait_s=30.0)
    chat = PolicyChatModel(backend=batching, params=SamplingParams(max_new_tokens=5, seed=1))

    def orchestrator(state: FanState) -> dict:
        return {}

    def fan_out(state: FanState) -> list[Send]:
        return [Send("worker", {"i": i}) for i in range(k)]

    def worker(arg: dict) -> dict:
        reply = chat.invoke(
            f"part {arg['i']}", config={"metadata": {"agent": f"worker_{arg['i']}"}}
        )
        return {"results": [reply.content]}

    g = StateGraph(FanState)
    g.add_node("orchestrator", orchestrator)
    g.add_node("worker", worker)
    g.add_edge(START, "orchestrator")
    g.add_conditional_edges("orchestrator", fan_out, ["worker"])
    g.add_edge("worker", END)
    out = g.compile().invoke({"results": []})
    assert len(out["results"]) == k
    assert batching.batch_sizes == [k]  # the k parallel workers shared one generate call
    assert sorted(s.agent for s in chat.recorder) == [f"worker_{i}" for i in range(k)]
    for step in chat.recorder:  # batched = alone, with the same seed
        [alone] = hf.generate([step.messages], chat.params)
        assert step.generation.token_ids == alone.token_ids


def test_to_chat_dicts_roles() -> None:
    msgs = [
        SystemMessage("sys"),
        HumanMessage("q"),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1}, "id": "c1"}]),
        ToolMessage("1", tool_call_id="c1"),
    ]
    out = to_chat_dicts(msgs)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool"]
    assert out[2]["content"] == '<tool>{"name": "add", "arguments": {"a": 1}}</tool>'
    with_tools = to_chat_dicts(msgs[1:], tools=[{"type": "function", "function": {"name": "add"}}])
    assert with_tools[0]["role"] == "system" and "- add:" in with_tools[0]["content"]
