"""What app episodes reuse across episodes (issue #29's endpoint speed): worker threads,
recording copies of the chat models and rendered prompts, each giving what a fresh one gives."""

from __future__ import annotations

import contextvars
import json
import threading
from typing import Any

import pytest

pytest.importorskip("transformers")

import openai

from marl_agents.gateway import fidelity
from marl_agents.gateway.app_scenario import AppScenario
from marl_agents.gateway.episodes import RecordingCopies
from marl_agents.llm.chat_model import GenerationRecorder
from marl_agents.llm.env_chat_model import EnvChatModel, tokens_action
from scenarios.graph_env import GraphEnv
from scenarios.text_space import TextSpaces, chat_text, make_tiny_tokenizer
from scenarios.toolcalls import render_tool_call

MARK: contextvars.ContextVar[str | None] = contextvars.ContextVar("mark", default=None)


def test_function_apps_reuse_threads_with_a_fresh_context_and_tool_call_ids_as_fresh():
    seen: list[tuple[int, str | None, str]] = []

    def run(task: Any, llm: Any) -> str:
        before = MARK.get()  # what an earlier episode on this thread set: nothing
        MARK.set(task)
        client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        reply = client.chat.completions.create(
            model=llm.models["writer"],
            messages=[{"role": "user", "content": task}],
            tools=[{"type": "function", "function": {"name": "add", "parameters": {}}}],
        )
        calls = reply.choices[0].message.tool_calls or []
        seen.append((threading.get_ident(), before, calls[0].id if calls else ""))
        return "ok"

    scenario = AppScenario(
        run,
        tasks=["one", "two", "three"],
        verifier=lambda s: True,
        agents=["writer"],
        max_prompt_tokens=256,
        max_new_tokens=24,
    )
    env = GraphEnv(scenario)
    call = tokens_action(scenario.spaces, scenario.tokenizer, render_tool_call("add", {}))
    for seed in range(3):
        env.reset(seed=seed)
        env.step({"writer": call})
        assert not env.agents and env.failure is None, env.error
    assert len({t for t, _, _ in seen}) == 1  # one worker thread ran the three episodes
    assert [before for _, before, _ in seen] == [None, None, None]  # no context leaked
    # the reused recording copy numbers its tool calls as a fresh copy does
    assert len({i for _, _, i in seen}) == 1 and seen[0][2]


def test_recording_copies_are_emptied_and_refused_once_their_model_changed():
    tok = make_tiny_tokenizer()
    spaces = TextSpaces.for_tokenizer(tok, max_prompt_tokens=64, max_new_tokens=8)
    source = EnvChatModel(tokenizer=tok, spaces=spaces, agent="a", record=False)
    copies = RecordingCopies()
    assert copies.take(source) is None
    copy = source.model_copy(update={"record": True, "recorder": GenerationRecorder()})
    copy.recorder.add(object())  # type: ignore[arg-type]
    copy._calls = 5
    copies.give(source, copy)
    again = copies.take(source)
    assert again is copy and len(again.recorder) == 0 and again._calls == source._calls
    assert copies.take(source) is None  # one episode at a time per copy
    copies.give(source, again)
    source.prefill = "changed"
    assert copies.take(source) is None  # copied with the old prefill: not handed out


def test_rendered_prompts_are_kept_and_equal_a_fresh_rendering():
    tok = make_tiny_tokenizer()
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    fresh = list(tok(chat_text(tok, chat), add_special_tokens=False)["input_ids"])
    first = fidelity.TurnIds().prompt(tok, chat)
    key = (id(tok), json.dumps(chat, sort_keys=True))
    assert key in fidelity._RENDERED
    assert first == fresh and fidelity.TurnIds().prompt(tok, chat) == fresh
    other = make_tiny_tokenizer()  # another tokenizer never gets this one's rendering
    assert fidelity.TurnIds().prompt(other, chat) == fresh
