"""The gateway's OpenAI wire protocol, spoken by the official ``openai`` client: chat,
streaming, tool calls (also streamed, and sent back with their results), JSON-schema parsing,
``/v1/completions``, ``/v1/models``; OpenAI-style errors for an unknown model, a bad request,
an oversized body or prompt, a missing, wrong or stale key; the server on loopback only.

Each app below runs as a real episode (``GraphEnv`` of an ``AppScenario``) whose decisions are
scripted replies of the tiny tokenizer, so every response is known exactly.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("openai")

import openai
from pydantic import BaseModel

from marl_agents.gateway.app_scenario import AppScenario
from marl_agents.gateway.server import LOOPBACK, gateway
from marl_agents.llm.env_chat_model import tokens_action
from scenarios.graph_env import GraphEnv
from scenarios.text_space import make_tiny_tokenizer
from scenarios.toolcalls import render_tool_call

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


class Point(BaseModel):
    x: int
    y: int


def play(scenario: AppScenario, replies: dict[str, list[str]], seed: int = 0) -> GraphEnv:
    """One episode whose agents reply the given texts in order; returns the finished env."""
    env = GraphEnv(scenario)
    sc, tok = scenario, scenario.tokenizer
    left = {a: list(r) for a, r in replies.items()}
    obs, infos = env.reset(seed=seed)
    while env.agents:
        actions = {}
        for a in env.agents:
            text = left[a].pop(0) if infos[a]["acting"] else ""
            actions[a] = tokens_action(sc.spaces, tok, text)
        obs, _, _, _, infos = env.step(actions)
    return env


def client(llm: Any, **kw: Any) -> Any:
    return openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, **kw)


def app_scenario(run: Any, **kw: Any) -> AppScenario:
    settings = dict(
        tasks=["go"],
        verifier=lambda s: True,
        agents=["writer", "caller"],
        max_prompt_tokens=512,
        max_new_tokens=48,
    )
    return AppScenario(run, **{**settings, **kw})


def test_chat_stream_tools_json_schema_completions_and_models_parse_with_the_openai_client():
    def run(task: str, llm: Any) -> dict[str, Any]:
        c = client(llm)
        out: dict[str, Any] = {}
        chat = c.chat.completions.create(
            model="writer",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": task},
            ],
            extra_body={"return_token_ids": True},  # vLLM's extension
        )
        out["chat"] = (chat.choices[0].message.content, chat.choices[0].finish_reason)
        extra = chat.model_extra, chat.choices[0].model_extra
        out["ids"] = (extra[0]["prompt_token_ids"], extra[1]["token_ids"])
        out["usage"] = chat.usage.model_dump()
        stream = c.chat.completions.create(
            model="writer",
            messages=[{"role": "user", "content": task}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        out["stream"] = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        out["stream_usage"] = chunks[-1].usage.completion_tokens
        call = c.chat.completions.create(
            model="caller",
            messages=[{"role": "user", "content": "add 2 and 3"}],
            tools=[ADD],
            tool_choice="required",
        )
        msg = call.choices[0].message
        out["call"] = (
            msg.tool_calls[0].function.name,
            json.loads(msg.tool_calls[0].function.arguments),
            call.choices[0].finish_reason,
        )
        answer = c.chat.completions.create(  # the call and its result sent back
            model="caller",
            messages=[
                {"role": "user", "content": "add 2 and 3"},
                msg.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "5"},
            ],
            tools=[ADD],
        )
        out["answer"] = answer.choices[0].message.content
        streamed = c.chat.completions.create(
            model="caller",
            messages=[{"role": "user", "content": "add 4 and 5"}],
            tools=[ADD],
            stream=True,
        )
        name, args = "", ""
        for ch in streamed:
            for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                name += tc.function.name or ""
                args += tc.function.arguments or ""
        out["streamed_call"] = (name, json.loads(args))
        parsed = c.chat.completions.parse(
            model="writer",
            messages=[{"role": "user", "content": "a point"}],
            response_format=Point,
        )
        out["parsed"] = parsed.choices[0].message.parsed.model_dump()
        done = c.completions.create(model="writer", prompt="Once upon")
        out["completion"] = (done.object, done.choices[0].text)
        out["models"] = sorted(m.id for m in c.models.list())
        return out

    replies = {
        "writer": ["hello world", "streamed words here", '{"x": 1, "y": 2}', "a time"],
        "caller": [
            render_tool_call("add", {"a": 2, "b": 3}),
            "It is 5.",
            render_tool_call("add", {"a": 4, "b": 5}),
        ],
    }
    env = play(app_scenario(run), replies)
    assert env.failure is None, env.error
    out = env.final_state["result"]
    assert out["chat"] == ("hello world", "stop")
    sc, tok = env.scenario, env.scenario.tokenizer
    first = next(s for s in env.trace if s.agent == "writer")  # the ids are the policy's own
    assert out["ids"][0] == sc.spaces.decode_prompt(first.observation)
    sampled = [*tok("hello world", add_special_tokens=False)["input_ids"], tok.eos_token_id]
    assert out["ids"][1] == sampled
    assert out["usage"]["completion_tokens"] > 0 and out["usage"]["prompt_tokens"] > 0
    assert out["usage"]["total_tokens"] == sum(
        out["usage"][k] for k in ("prompt_tokens", "completion_tokens")
    )
    assert out["stream"] == "streamed words here" and out["stream_usage"] > 0
    assert out["call"] == ("add", {"a": 2, "b": 3}, "tool_calls")
    assert out["answer"] == "It is 5."
    assert out["streamed_call"] == ("add", {"a": 4, "b": 5})
    assert out["parsed"] == {"x": 1, "y": 2}
    assert out["completion"] == ("text_completion", "a time")
    assert out["models"] == ["caller", "writer"]
    # the answer's prompt holds the call and its result, rendered as an in-process app's is
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from marl_agents.llm.chat_model import to_chat_dicts
    from scenarios.text_space import encode_prompt

    call = {"name": "add", "args": {"a": 2, "b": 3}, "id": "c", "type": "tool_call"}
    sent = [
        HumanMessage("add 2 and 3"),
        AIMessage("", tool_calls=[call]),
        ToolMessage("5", tool_call_id="c"),
    ]
    expected = sc.spaces.encode_prompt(encode_prompt(sc.tokenizer, to_chat_dicts(sent, [ADD])))
    [second] = [s for s in env.trace if s.agent == "caller"][1:2]
    assert (second.observation == expected).all()


def test_model_names_map_to_agents_and_sampling_fields_are_logged_as_not_used(caplog):
    def run(task: str, llm: Any) -> Any:
        assert llm.models == {"writer": "gpt-4o-mini", "caller": "caller"}
        r = client(llm).chat.completions.create(
            model=llm.models["writer"],
            messages=[{"role": "user", "content": task}],
            temperature=0.3,
        )
        return r.choices[0].message.content

    with caplog.at_level("WARNING", logger="marl.gateway"):
        env = play(app_scenario(run, model_names={"writer": "gpt-4o-mini"}), {"writer": ["ok"]})
    assert env.failure is None and env.final_state["result"] == "ok"
    assert "temperature=0.3, which is not used" in caplog.text


def test_errors_are_openai_style():
    def run(task: str, llm: Any) -> dict[str, Any]:
        c = client(llm)
        out: dict[str, Any] = {}

        def status(fn: Any) -> tuple[int, str | None, str]:
            try:
                fn()
            except openai.APIStatusError as exc:
                err = exc.body if isinstance(exc.body, dict) else {}
                return exc.status_code, err.get("code"), str(err.get("message"))
            raise AssertionError("no error")

        user = [{"role": "user", "content": task}]
        out["unknown"] = status(lambda: c.chat.completions.create(model="gpt-5", messages=user))
        out["role"] = status(
            lambda: c.chat.completions.create(
                model="writer", messages=[{"role": "wizard", "content": "x"}]
            )
        )
        out["n"] = status(lambda: c.chat.completions.create(model="writer", messages=user, n=2))
        big = [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]
        out["body"] = status(lambda: c.chat.completions.create(model="writer", messages=big))
        long = [{"role": "user", "content": "word " * 2000}]
        out["prompt"] = status(lambda: c.chat.completions.create(model="writer", messages=long))
        wrong = openai.OpenAI(base_url=llm.base_url, api_key="not-a-key", max_retries=0)
        out["wrong"] = status(lambda: wrong.chat.completions.create(model="writer", messages=user))
        req = urllib.request.Request(
            llm.base_url + "/chat/completions",
            data=json.dumps({"model": "writer", "messages": user}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(req, timeout=30)
        except urllib.error.HTTPError as exc:
            out["missing"] = (exc.code, json.loads(exc.read())["error"]["code"])
        # the key in the base URL instead of the header; the episode goes on after errors
        root = llm.base_url.removesuffix("/v1")
        by_path = openai.OpenAI(base_url=f"{root}/e/{llm.api_key}/v1", api_key="x", max_retries=0)
        r = by_path.chat.completions.create(model="writer", messages=user)
        out["by_path"] = r.choices[0].message.content
        out["key"] = (llm.base_url, llm.api_key)
        return out

    env = play(app_scenario(run, max_prompt_tokens=256), {"writer": ["fine"]})
    assert env.failure is None, env.error
    out = env.final_state["result"]
    code, kind, message = out["unknown"]
    assert (code, kind) == (404, "model_not_found") and "caller" in message and "writer" in message
    assert out["role"][0] == 400 and "wizard" in out["role"][2]
    assert out["n"][0] == 400
    assert out["body"][:2] == (413, "request_too_large")
    assert out["prompt"][:2] == (400, "context_length_exceeded")
    assert out["wrong"][:2] == (401, "invalid_api_key")
    assert out["missing"] == (401, "invalid_api_key")
    assert out["by_path"] == "fine"
    base_url, key = out["key"]  # the episode has ended: its key is stale
    stale = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stale.models.list()


def test_a_completions_prompt_of_token_ids_is_the_policys_prompt_as_given():
    """``/v1/completions`` with ``prompt`` as token ids (OpenAI's API allows it): the policy
    observes exactly those ids (no chat template), the reply's ids are the sampled ones; ids
    outside the vocabulary, a batch, a non-integer or too many ids are OpenAI-style 400s."""
    sent: dict[str, Any] = {}

    def run(task: str, llm: Any) -> dict[str, Any]:
        c = client(llm)
        out: dict[str, Any] = {}
        tok = make_tiny_tokenizer()
        ids = sent["ids"] = tok("<tool>raw ids", add_special_tokens=False)["input_ids"]
        done = c.completions.create(
            model="writer", prompt=ids, extra_body={"return_token_ids": True}
        )
        choice = done.choices[0]
        out["done"] = (done.object, choice.text, choice.model_extra["token_ids"])
        out["prompt_ids"] = done.model_extra["prompt_token_ids"]

        def status(prompt: Any) -> tuple[int, str | None]:
            try:
                c.completions.create(model="writer", prompt=prompt)
            except openai.APIStatusError as exc:
                return exc.status_code, exc.body.get("param") if isinstance(
                    exc.body, dict
                ) else None
            raise AssertionError("no error")

        out["vocab"] = status([1, 10**6])
        out["batch"] = status([[1, 2], [3, 4]])
        out["negative"] = status([1, -2])
        out["long"] = status([1] * 300)
        return out

    env = play(app_scenario(run, max_prompt_tokens=256), {"writer": ["a time"]})
    assert env.failure is None, env.error
    out = env.final_state["result"]
    tok = env.scenario.tokenizer
    [step] = [s for s in env.trace if s.agent == "writer"]
    assert env.scenario.spaces.decode_prompt(step.observation) == sent["ids"] == out["prompt_ids"]
    sampled = [*tok("a time", add_special_tokens=False)["input_ids"], tok.eos_token_id]
    assert out["done"] == ("text_completion", "a time", sampled)
    assert out["vocab"] == (400, "prompt")
    assert out["batch"] == (400, "prompt")
    assert out["negative"] == (400, "prompt")
    assert out["long"] == (400, "prompt")


def test_the_gateway_listens_on_loopback_only_by_default():
    gw = gateway()
    assert gw.host == LOOPBACK and gw.url.startswith("http://127.0.0.1:")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outward address
            outward = s.getsockname()[0]
        except OSError:
            outward = None
    if outward is None or outward.startswith("127."):
        pytest.skip("this machine has no non-loopback address")
    with pytest.raises(OSError):
        socket.create_connection((outward, gw.port), timeout=2).close()
