"""Streaming as LangGraph's and LangChain's docs show it (issue #28, item 4).

``model.stream``/``astream`` inside a GraphEnv episode yield ``AIMessageChunk``s cut from one
decision whose sum equals the ``invoke`` result (text and tool calls); a graph streamed with
``stream_mode="messages"`` (and ``"updates"``) yields the text chunk by chunk; tool-call chunks
assemble into the call; a structured-output reply streams; an app that streams trains.
App: ``tests/apps/streaming.py``.
"""

from __future__ import annotations

import asyncio
import operator
from functools import reduce
from typing import Any, Literal

import pytest

pytest.importorskip("transformers")

from langchain_core.messages import AIMessageChunk
from langgraph.graph import START, StateGraph
from pettingzoo.test import parallel_api_test
from pydantic import BaseModel, Field
from test_app_styles import style_cfg
from test_chat_app_training import same
from test_chat_apps import steps_of
from test_train import learner_weights
from typing_extensions import TypedDict

from marl_agents.llm.backend import SamplingParams
from marl_agents.llm.chat_app import ChatAppScenario
from marl_agents.llm.chat_model import PolicyChatModel
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.llm.tiny import make_tiny_model
from scenarios.graph_env import GraphEnv
from scenarios.toolcalls import render_tool_call


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class Add(BaseModel):
    """Add two numbers."""

    a: int = Field(ge=0, le=99)
    b: int = Field(ge=0, le=99)


class Router(TypedDict):
    """Worker to route to next."""

    next: Literal["researcher", "coder", "FINISH"]


class Seen(TypedDict, total=False):
    messages: list[Any]
    streamed: list[Any]
    invoked: Any


def twice(models: Any, asynchronous: bool) -> Any:
    """One node that streams the model, then invokes it on the same prompt (two decisions)."""
    llm = models["solver"].bind_tools([add])

    def node(state: Seen) -> dict[str, Any]:
        streamed = list(llm.stream(state["messages"]))
        return {"streamed": streamed, "invoked": llm.invoke(state["messages"])}

    async def anode(state: Seen) -> dict[str, Any]:
        streamed = [c async for c in llm.astream(state["messages"])]
        return {"streamed": streamed, "invoked": await llm.ainvoke(state["messages"])}

    builder = StateGraph(Seen)
    builder.add_node("solve", anode if asynchronous else node)
    builder.add_edge(START, "solve")
    return builder


@pytest.mark.parametrize("asynchronous", [False, True])
def test_model_stream_in_an_episode_sums_to_the_invoke_result(asynchronous):
    sc = ChatAppScenario(
        lambda models: twice(models, asynchronous),
        tasks=["What is 2 + 3?"],
        verifier=lambda state: True,
        max_prompt_tokens=256,
        max_new_tokens=48,
    )
    reply = "Let me add. " + render_tool_call("add", {"a": 2, "b": 3})
    env = GraphEnv(sc)
    assert steps_of(env, {"solver": [reply, reply]}) == [["solver"], ["solver"]]
    streamed, invoked = env.final_state["streamed"], env.final_state["invoked"]
    assert len(streamed) > 3 and all(isinstance(c, AIMessageChunk) for c in streamed)
    total = reduce(operator.add, streamed)
    assert total.content == invoked.content == "Let me add."

    def calls(message: Any) -> list[tuple[str, dict[str, Any]]]:  # ids differ per call
        return [(c["name"], c["args"]) for c in message.tool_calls]

    assert calls(total) == calls(invoked) == [("add", {"a": 2, "b": 3})]
    assert total.response_metadata == invoked.response_metadata
    assert sum(bool(c.tool_call_chunks) for c in streamed) == 2  # name + id, then the arguments


def test_streaming_app_runs_as_an_episode_and_passes_the_api_test():
    from tests.apps.streaming import app

    sc = app()
    assert sc.possible_agents == ["writer", "reviewer"]
    env = GraphEnv(sc)
    assert steps_of(env, {"writer": ["a poem"], "reviewer": ["fine"]}) == [
        ["writer"],
        ["reviewer"],
    ]
    assert env.final_state["messages"][1].content == "a poem"
    assert env.final_state["review"] == "fine"  # collected from AIMessageChunks
    assert env.failure is None
    parallel_api_test(GraphEnv(app()), num_cycles=10)


@pytest.fixture(scope="module")
def tiny_chat() -> PolicyChatModel:
    tok, model = make_tiny_model(seed=0)
    params = SamplingParams(max_new_tokens=48, temperature=0.8, seed=1)
    return PolicyChatModel(backend=HFBackend(model, tok), params=params)


def test_a_graph_streamed_with_messages_and_updates_modes_yields_chunks_and_updates(tiny_chat):
    from tests.apps.streaming import build

    graph = build({"writer": tiny_chat, "reviewer": tiny_chat}).compile()
    text: dict[str, str] = {}
    updates = []
    for mode, item in graph.stream(
        {"messages": [("user", "Write a haiku.")]}, stream_mode=["messages", "updates"]
    ):
        if mode == "messages":
            msg, meta = item
            if isinstance(msg, AIMessageChunk):
                text[meta["langgraph_node"]] = text.get(meta["langgraph_node"], "") + msg.content
        else:
            updates.append(item)
    assert [next(iter(u)) for u in updates] == ["write", "review"]
    draft = updates[0]["write"]["messages"][0].content
    assert draft and text["write"] == draft
    # the reviewer's node collected its own graph's chunks: its model's whole reply
    assert updates[1]["review"]["review"] == tiny_chat.recorder.steps()[-1].generation.text


def test_tool_call_and_structured_output_chunks_assemble_as_in_langchain(tiny_chat):
    llm = tiny_chat.bind_tools([Add], tool_choice="any")  # constrained: a call with its args
    chunks = list(llm.stream("What is 2 + 3?", seed=5))
    invoked = llm.invoke("What is 2 + 3?", seed=5)
    total = reduce(operator.add, chunks)
    [call] = total.tool_calls
    assert call["name"] == "Add" and set(call["args"]) == {"a", "b"}
    assert [(c["name"], c["args"]) for c in invoked.tool_calls] == [(call["name"], call["args"])]
    assert all(isinstance(c, AIMessageChunk) for c in chunks)

    routed = tiny_chat.with_structured_output(Router)
    parts = list(routed.stream("Who next?", seed=7))
    assert parts[-1] == routed.invoke("Who next?", seed=7)
    assert parts[-1]["next"] in {"researcher", "coder", "FINISH"}

    async def collect() -> list[AIMessageChunk]:
        return [c async for c in tiny_chat.astream("Hello", seed=3)]

    streamed = reduce(operator.add, asyncio.run(collect()))
    assert streamed.content == tiny_chat.invoke("Hello", seed=3).content

    # the agent id a streamed call names in its config metadata is kept (as invoke keeps it)
    list(tiny_chat.stream("Hi", config={"metadata": {"agent": "worker_1"}}))
    assert tiny_chat.recorder.steps()[-1].agent == "worker_1"


def test_streaming_app_trains_two_iterations_with_the_reviewer_frozen(ray_session, tmp_path):
    from trainers.algo import to_algorithm_config

    cfg = style_cfg(tmp_path, "tests.apps.streaming:app", ["writer"])
    algo = to_algorithm_config(cfg).build_algo()
    try:
        frozen, trained = learner_weights(algo, "reviewer"), learner_weights(algo, "writer")
        for _ in range(2):
            marl = algo.train()["env_runners"].get("marl", {})
            assert marl.get("episodes") and not marl.get("error") and not marl.get("limit"), marl
        assert same(learner_weights(algo, "reviewer"), frozen)
        assert not same(learner_weights(algo, "writer"), trained)
    finally:
        algo.stop()
