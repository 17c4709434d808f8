"""OpenAI semantics apps rely on, through the gateway with real clients (``openai``,
``ChatOpenAI``, raw ``httpx``) and in the in-process chat model: ``stop`` strings (the text
before the first, ``finish_reason: "stop"``, the ids up to the token completing it, the next
turn's ids those of the text); a deeply nested JSON body and a huge prompt refused cheaply
(the prompt before it is tokenised, without holding a request that waits meanwhile); served
prompts cut as training cuts them (``marl serve``'s default, named in its ``--help`` and in the
refusal); an app episode's timeout naming ``AppScenario``'s ``timeout_s``.

A served team here is the tiny model answering through the gateway's standalone path
(:class:`~marl_agents.gateway.standalone.ServedTeam`, what ``marl serve`` serves), no Ray.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("openai")

import httpx
import openai

from marl_agents.gateway.episodes import Registry
from marl_agents.gateway.prompt_bound import bound_prompt, char_bound
from marl_agents.gateway.protocol import ChatRequest
from marl_agents.gateway.server import Gateway
from marl_agents.gateway.standalone import ServedTeam
from marl_agents.llm.backend import Generation, SamplingParams
from marl_agents.llm.env_chat_model import EnvChatModel, backend_policy
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.llm.stop_strings import cut_at_stop, text_ids
from marl_agents.llm.tiny import make_tiny_model
from scenarios.text_space import TextSpaces

MAX_PROMPT, MAX_NEW = 64, 24


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return make_tiny_model(seed=0)


def served_team(tiny: Any, policy: Any = None, truncate: bool = True) -> tuple[Gateway, Any]:
    """The tiny model served as agent ``a`` (greedy), on its own gateway."""
    tok, model = tiny
    spaces = TextSpaces.for_tokenizer(tok, MAX_PROMPT, MAX_NEW, model)
    backend = HFBackend(model, tok)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW)
    chat = EnvChatModel(tokenizer=tok, spaces=spaces, backend=backend)
    team = ServedTeam(
        {"a": chat},
        policy or backend_policy(backend, spaces, greedy),
        truncate_prompts=truncate,
    )
    registry = Registry(key_hint="the test's key")
    registry.add(team)
    return Gateway(registry=registry), team


@pytest.fixture(scope="module")
def served(tiny: Any) -> Any:
    gw, team = served_team(tiny)
    yield gw, team
    gw.stop()


def sdk(gw: Gateway, team: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=team.key, max_retries=0)


# ----- stop ------------------------------------------------------------------------------------
def test_the_stop_rule_keeps_the_completing_token_and_the_text_before_the_stop(tiny):
    """Hand-checked on the tiny tokenizer: ``"hello world, how are you today"`` is
    ``he l lo ␣wor l d , ␣ h o w ␣a re ␣ y ou …``; a stop string ending on a token boundary,
    one starting inside a token (``"o w"`` starts in ``lo``), and none."""
    tok, _ = tiny
    text = "hello world, how are you today"
    ids = [*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[:4] == ["he", "l", "lo", " wor"] and pieces[14:16] == ["y", "ou"]
    gen = Generation([1], ids, [-1.0] * len(ids), text, "stop", [-0.5] * len(ids))
    cut = cut_at_stop(tok, gen, ["you"])
    assert cut.text == "hello world, how are " and cut.finish_reason == "stop"
    assert cut.token_ids == ids[:16]  # up to and with "ou", which completes "you"
    assert cut.logprobs == gen.logprobs[:16] and cut.sampling_logprobs == [-0.5] * 16
    # the next turn sees the text's ids: the sampled ones before "you"
    assert text_ids(tok, cut.text, cut.token_ids) == ids[:14]
    mid = cut_at_stop(tok, gen, ["zz", "o w"])
    assert mid.text == "hell" and mid.token_ids == ids[:4]  # " wor" completes "o w"
    again = text_ids(tok, "hell", mid.token_ids)
    assert again[:2] == ids[:2] and tok.decode(again) == "hell"  # "l" of "lo" re-tokenised
    assert cut_at_stop(tok, gen, ["zzz"]) is gen


def test_stop_ends_the_in_process_chat_models_reply_and_what_it_records(tiny):
    """``invoke(stop=...)``, ``bind(stop=...)`` and the model's ``stop`` field: the reply is the
    text before the stop string; the recorded generation (what training uses) is the sampled
    ids up to the token completing it."""
    from marl_agents.llm.chat_model import PolicyChatModel

    tok, model = tiny
    params = SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW)
    chat = PolicyChatModel(backend=HFBackend(model, tok), params=params)
    whole = chat.invoke("Say something")
    full = chat.recorder.steps()[-1].generation
    text = whole.content
    assert len(text) >= 6, text
    stop = text[3:6]
    start = text.find(stop)
    for reply in (
        chat.invoke("Say something", stop=[stop]),
        chat.bind(stop=stop).invoke("Say something"),
        chat.model_copy(update={"stop": [stop]}).invoke("Say something"),
    ):
        gen = chat.recorder.steps()[-1].generation
        assert reply.content == text[:start]
        assert reply.response_metadata["finish_reason"] == "stop"
        assert gen.token_ids == full.token_ids[: len(gen.token_ids)]  # a prefix: as sampled
        done = tok.decode(gen.token_ids, skip_special_tokens=True)
        before = tok.decode(gen.token_ids[:-1], skip_special_tokens=True)
        assert stop in done and stop not in before  # its last token completes the stop


def test_stop_through_the_endpoint_with_openai_chatopenai_and_httpx(served, tiny):
    """A string or a list, from the ``openai`` SDK, ``ChatOpenAI`` and raw HTTP: the content is
    the text before the stop string, ``finish_reason`` ``stop``, and ``token_ids`` (vLLM's
    ``return_token_ids``) end with the token completing it."""
    from langchain_openai import ChatOpenAI

    gw, team = served
    tok, _ = tiny
    c = sdk(gw, team)
    messages = [{"role": "user", "content": "Say something"}]
    whole = c.chat.completions.create(
        model="a", messages=messages, extra_body={"return_token_ids": True}
    )
    text = whole.choices[0].message.content
    assert len(text) >= 6, text
    stop = text[3:6]
    want = text[: text.find(stop)]
    for given in (stop, [stop, "\x00never"]):
        r = c.chat.completions.create(
            model="a", messages=messages, stop=given, extra_body={"return_token_ids": True}
        )
        assert r.choices[0].message.content == want
        assert r.choices[0].finish_reason == "stop"
        ids = r.choices[0].model_extra["token_ids"]
        assert ids == whole.choices[0].model_extra["token_ids"][: len(ids)]
        assert stop in tok.decode(ids) and stop not in tok.decode(ids[:-1])
        assert r.usage.completion_tokens == len(ids)
    lc = ChatOpenAI(base_url=gw.base_url, api_key=team.key, model="a", max_retries=0)
    assert lc.invoke("Say something", stop=[stop]).content == want
    raw = httpx.post(
        f"{gw.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {team.key}"},
        json={"model": "a", "messages": messages, "stop": stop},
    )
    assert raw.status_code == 200 and raw.json()["choices"][0]["message"]["content"] == want
    bad = httpx.post(
        f"{gw.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {team.key}"},
        json={"model": "a", "messages": messages, "stop": ["a", "b", "c", "d", "e"]},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stop"


# ----- bounded parsing -------------------------------------------------------------------------
def test_a_deeply_nested_body_is_a_cheap_400(served):
    gw, team = served
    deep = b'{"model": "a", "messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    r = httpx.post(
        f"{gw.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {team.key}", "Content-Type": "application/json"},
        content=deep,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "json_too_deep" and "flatten" in error["message"]
    ok = sdk(gw, team).chat.completions.create(
        model="a", messages=[{"role": "user", "content": "hi"}]
    )
    assert ok.choices[0].finish_reason in ("stop", "length")  # the server still answers


def test_a_huge_prompt_is_refused_while_a_request_waiting_meanwhile_is_not_held(tiny):
    """A small request waits for its decision (the policy holds it until the huge one has been
    answered); a 3.5 MB prompt sent meanwhile is refused (400, before tokenising: the bound is
    in characters) while the small one still waits, which then completes. Were the huge one
    tokenised holding the served team's lock, or queued behind the small one, it could not be
    answered first."""
    refused = threading.Event()
    inner: list[Any] = []

    def policy(agent: str, observation: Any) -> Any:
        if not refused.wait(timeout=120):
            raise AssertionError("the huge prompt was not answered while a request waited")
        return inner[0](agent, observation)

    gw, team = served_team(tiny, policy, truncate=False)
    tok, model = tiny
    spaces = team.chat_models["a"].spaces
    inner.append(backend_policy(HFBackend(model, tok), spaces, SamplingParams(temperature=0.0)))
    c = sdk(gw, team)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            small = pool.submit(
                c.chat.completions.create,
                model="a",
                messages=[{"role": "user", "content": "hi"}],
            )
            while team.requests == 0:  # the small request is in (waiting for its decision)
                threading.Event().wait(0.01)
            with pytest.raises(openai.BadRequestError) as err:
                c.chat.completions.create(
                    model="a", messages=[{"role": "user", "content": "word " * 700_000}]
                )
            assert not small.done()  # answered first: the small one still waits
            refused.set()
            assert small.result(timeout=120).choices[0].message.content is not None
        body = err.value.body
        assert body["code"] == "context_length_exceeded"
        assert "3500000 characters" in body["message"] and "truncat" in body["message"]
    finally:
        refused.set()
        gw.stop()


def test_a_truncated_prompt_keeps_the_tokens_training_keeps(tiny):
    """Cut to the character bound before tokenising, a long chat gives the policy the same
    observation as the chat model's own cut of the whole chat in an episode (what training
    observes)."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_core.runnables import RunnableLambda

    from scenarios.bridge import BRIDGE_KEY
    from scenarios.decisions import InlineBridge

    tok, model = tiny
    spaces = TextSpaces.for_tokenizer(tok, MAX_PROMPT, MAX_NEW, model)
    chat = EnvChatModel(tokenizer=tok, spaces=spaces, agent="a")
    bound = char_bound(tok, MAX_PROMPT)
    eos = spaces.encode_action([tok.eos_token_id])

    def observed(messages: list[Any]) -> list[int]:
        seen: list[Any] = []

        def policy(agent: str, observation: Any) -> Any:
            seen.append(spaces.decode_prompt(observation))
            return eos

        config = {"configurable": {BRIDGE_KEY: InlineBridge(policy)}}
        RunnableLambda(lambda _: chat.invoke(messages)).invoke(None, config=config)
        return seen[0]

    for messages in (
        [HumanMessage("alpha beta " * 3000)],
        [
            SystemMessage("You route."),
            HumanMessage("first question " * 2000),
            AIMessage("an answer " * 500),
            HumanMessage("the last one"),
        ],
    ):
        cut = bound_prompt(chat, ChatRequest(model="a", messages=messages), truncate=True)
        rest = [m for m in cut.messages if m.type != "system"]
        assert sum(len(m.content) for m in rest) <= bound < 30_000
        assert observed(cut.messages) == observed(messages)


# ----- serving truncates as training did ------------------------------------------------------
def test_marl_serve_truncates_by_default_and_says_so(served, tiny):
    """``serve()`` and ``marl serve`` cut a long prompt by default (named in ``--help``); with
    ``--no-truncate-prompts`` the refusal names the flag."""
    import inspect

    from typer.testing import CliRunner

    from trainers.cli import app
    from trainers.serve import serve

    assert inspect.signature(serve).parameters["truncate_prompts"].default is True
    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "300"}).output
    assert "--truncate-prompts" in out and "--no-truncate-prompts" in out
    assert "as the run trained" in out and "default: truncate-prompts" in out
    gw, team = served
    long = [{"role": "user", "content": "word " * 400}]  # ~800 tokens, a 64-token context
    r = sdk(gw, team).chat.completions.create(
        model="a", messages=long, extra_body={"return_token_ids": True}
    )
    assert len(r.model_extra["prompt_token_ids"]) == MAX_PROMPT
    gw2, team2 = served_team(tiny, truncate=False)
    try:
        with pytest.raises(openai.BadRequestError, match="--truncate-prompts"):
            sdk(gw2, team2).chat.completions.create(model="a", messages=long)
    finally:
        gw2.stop()


# ----- errors name the limit that fired ---------------------------------------------------------
def test_an_app_timeout_names_appscenarios_timeout_s_and_the_advice_follows():
    """An app that asks once and then hangs: its episode times out naming the AppScenario's
    ``timeout_s`` (not ``episodes.timeout_s``), and a run whose episodes all end so is told to
    raise that one (``RunFailed``'s advice)."""
    from marl_agents.gateway.app_scenario import APP_TIMEOUT_LIMIT, AppScenario
    from marl_agents.llm.env_chat_model import tokens_action
    from scenarios.graph_env import GraphEnv
    from trainers.run.episode_log import timeout_advice

    hang = threading.Event()

    def app(task: str, llm: Any) -> str:
        c = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        c.chat.completions.create(model="a", messages=[{"role": "user", "content": task}])
        hang.wait(30)
        return "late"

    sc = AppScenario(app, tasks=["t"], verifier=bool, agents=["a"], timeout_s=0.5)
    env = GraphEnv(sc)
    try:
        env.reset(seed=0)
        env.step({"a": tokens_action(sc.spaces, sc.tokenizer, "ok")})
    finally:
        hang.set()
    assert env.failure == "timeout", env.error
    assert APP_TIMEOUT_LIMIT in env.error and "(0.5 s) fired" in env.error, env.error
    advice = timeout_advice([{"kind": "timeout", "error": env.error, "count": 1}])
    assert "AppScenario(timeout_s=" in advice and "episodes.timeout_s" not in advice
    assert "episodes.timeout_s" in timeout_advice(
        [{"kind": "timeout", "error": "episode wall-clock limit of 5 s reached", "count": 1}]
    )


def test_a_reply_cut_at_a_stop_string_comes_back_as_its_texts_ids_in_an_episode():
    """An app episode (token fidelity on): the app asks with ``stop`` and sends the reply back;
    the next prompt holds the reply's text as the ids it was sampled as up to the stop string
    (never the stop string's ids, which the app never saw)."""
    from marl_agents.gateway.app_scenario import AppScenario
    from marl_agents.llm.env_chat_model import tokens_action
    from scenarios.graph_env import GraphEnv

    def app(task: str, llm: Any) -> str:
        c = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        first = c.chat.completions.create(
            model="a", messages=[{"role": "user", "content": task}], stop=["you"]
        )
        reply = first.choices[0].message.content
        assert first.choices[0].finish_reason == "stop", first
        c.chat.completions.create(
            model="a",
            messages=[
                {"role": "user", "content": task},
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "more"},
            ],
        )
        return reply

    sc = AppScenario(
        app, tasks=["hi"], verifier=bool, agents=["a"], max_prompt_tokens=128, max_new_tokens=24
    )
    tok = sc.tokenizer
    sampled = tok("hello world, how are you today", add_special_tokens=False)["input_ids"]
    env = GraphEnv(sc)
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step({"a": sc.spaces.encode_action([*sampled, tok.eos_token_id])})
    second = sc.spaces.decode_prompt(obs["a"])
    env.step({"a": tokens_action(sc.spaces, tok, "ok")})
    assert env.failure is None and env.final_state["result"] == "hello world, how are "
    kept = sampled[:14]  # the sampled ids before "you" (hand-checked in the first test)
    at = next(i for i in range(len(second)) if second[i : i + len(kept)] == kept)
    assert "you" not in tok.decode(second[at : at + len(kept) + 2])


def test_a_json_reply_closed_on_the_budgets_last_token_is_a_finished_reply(served):
    """The tiny model's reply to this schema closes exactly at ``max_new_tokens`` (no room for
    the end-of-turn id): complete JSON, so ``finish_reason`` is ``stop`` and the ``openai``
    SDK's ``parse`` returns the object (it refuses a ``length`` reply)."""
    from pydantic import BaseModel

    class Joke(BaseModel):
        setup: str
        punchline: str

    gw, team = served
    r = sdk(gw, team).chat.completions.parse(
        model="a",
        messages=[{"role": "user", "content": "Tell me a joke about cats"}],
        response_format=Joke,
    )
    assert r.usage.completion_tokens == MAX_NEW  # closed on the last token of the budget
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(r.choices[0].message.parsed, Joke)
