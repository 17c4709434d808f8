"""``marl serve``: a run trained 2 iterations in the test (the ``openai``-SDK router app, its
``router`` pool learning and ``worker`` frozen) served standalone, spoken to by the official
``openai`` client: chat and streamed replies, a constrained tool-call reply parsed into
``tool_calls``, ``response_format``, ``/v1/completions`` and ``/v1/models``; an unknown model
(404 listing the agents), a missing or wrong key (401); the
server on loopback only; greedy replies are the trained module's greedy generation on the
prompt the chat template renders, decoded (token fidelity), and each agent answers with its
own pool's module. An oversized prompt is cut as the run trained on it (``marl serve``'s
default; its refusal is tested in ``tests/test_openai_semantics.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("openai")

import openai
from pydantic import BaseModel

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "enum": [1, 2, 3]}},
            "required": ["a"],
        },
    },
}


class Pick(BaseModel):
    x: bool


@pytest.fixture(scope="module")
def run_dir(ray_session: Any, tmp_path_factory: Any) -> Path:
    """A run of the router app trained 2 GRPO iterations (router learns, worker frozen)."""
    from configs import tiny_config

    from trainers.run.loop import train

    tmp = tmp_path_factory.mktemp("serve")
    cfg = tiny_config(
        tmp,
        scenario="tests.apps.openai_router:scenario",
        scenario_kwargs={"max_prompt_tokens": 320, "max_new_tokens": 40},
        sharing="explicit",
        train=["router"],
        pools={
            "router": {"agents": ["router"], "model": {"type": "llm", "path": "tiny"}},
            "worker": {
                "agents": ["worker"],
                "model": {"type": "llm", "path": "tiny", "tiny_seed": 1, "temperature": 0.7},
            },
        },
        algorithm={
            "name": "GRPO",
            "num_epochs": 1,
            "lr": 1e-2,
            "grpo": {"group_size": 2, "groups_per_iteration": 2},
        },
        seed=0,
    )
    result = train(cfg)
    assert result.status == "completed", result.status
    return Path(result.run_dir)


@pytest.fixture(scope="module")
def served(run_dir: Path) -> Any:
    from trainers.serve import serve

    s = serve(run_dir, greedy=True)
    yield s
    s.stop()


def client(s: Any, key: str | None = None) -> Any:
    return openai.OpenAI(base_url=s.base_url, api_key=key or s.key, max_retries=0)


def test_serve_answers_chat_stream_tools_json_completions_and_lists_the_agents(served):
    c = client(served)
    assert sorted(m.id for m in c.models.list()) == ["router", "worker"]
    chat = c.chat.completions.create(
        model="router", messages=[{"role": "user", "content": "Say UP"}]
    )
    text = chat.choices[0].message.content
    assert isinstance(text, str) and chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage.prompt_tokens > 0 and chat.usage.completion_tokens > 0
    stream = c.chat.completions.create(
        model="router", messages=[{"role": "user", "content": "Say UP"}], stream=True
    )
    streamed = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert streamed == text  # greedy: the same reply
    call = c.chat.completions.create(
        model="worker",
        messages=[{"role": "user", "content": "add"}],
        tools=[ADD],
        tool_choice="required",
    )
    msg = call.choices[0].message
    assert call.choices[0].finish_reason == "tool_calls", msg
    assert msg.tool_calls[0].function.name == "add"
    assert json.loads(msg.tool_calls[0].function.arguments)["a"] in (1, 2, 3)
    parsed = c.chat.completions.parse(
        model="worker", messages=[{"role": "user", "content": "x?"}], response_format=Pick
    )
    assert isinstance(parsed.choices[0].message.parsed.x, bool)
    done = c.completions.create(model="worker", prompt="Once")
    assert done.object == "text_completion" and isinstance(done.choices[0].text, str)


def test_unknown_model_wrong_key_and_oversized_prompt_are_openai_errors(served):
    with pytest.raises(openai.NotFoundError, match=r"'router', 'worker'"):
        client(served).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.AuthenticationError, match="marl serve printed"):
        client(served, key="wrong").chat.completions.create(
            model="router", messages=[{"role": "user", "content": "hi"}]
        )
    # an oversized prompt is cut as the run trained on it (marl serve's default)
    long = client(served).chat.completions.create(
        model="router",
        messages=[{"role": "user", "content": "word " * 800}],
        extra_body={"return_token_ids": True},
    )
    assert len(long.model_extra["prompt_token_ids"]) == 320  # the run's max_prompt_tokens
    assert served.gateway.host == "127.0.0.1"


def test_greedy_replies_are_the_trained_modules_greedy_generation_decoded(served, run_dir):
    """Token fidelity: the reply's prompt ids are the chat template's rendering, its sampled
    ids the pool's module's greedy generation on them, its text their decoding; the router
    answers with the trained ``router`` module and the worker with the frozen ``worker``."""
    from scenarios.text_space import encode_prompt
    from trainers.evaluate import load_team

    _, plan, policy = load_team(run_dir)
    tok = plan.env.build_scenario().tokenizer
    messages = [{"role": "user", "content": "Say DOWN"}]
    c = client(served)
    replies = {}
    for agent in ("router", "worker"):
        r = c.chat.completions.create(
            model=agent, messages=messages, extra_body={"return_token_ids": True}
        )
        prompt = r.model_extra["prompt_token_ids"]
        assert prompt == encode_prompt(tok, messages)
        module = policy.modules[plan.agent_to_pool[agent]]
        [gen] = module.generate([prompt], 0.0)
        assert r.choices[0].model_extra["token_ids"] == list(gen.token_ids)
        eos = tok.eos_token_id
        ids = list(gen.token_ids)
        ids = ids[: ids.index(eos)] if eos in ids else ids
        assert r.choices[0].message.content == tok.decode(ids, skip_special_tokens=True)
        replies[agent] = list(gen.token_ids)
    # two pools, two policies (the worker's differs from the trained router's)
    a, b = (policy.modules[p] for p in ("router", "worker"))
    wa = next(iter(a.state_dict().values()))
    wb = next(iter(b.state_dict().values()))
    assert not np.array_equal(wa.numpy(), wb.numpy())


def test_a_directory_without_a_run_is_refused_naming_what_is_missing(tmp_path):
    from trainers.configs.typed import ConfigError
    from trainers.serve import serve

    with pytest.raises(ConfigError, match=r"checkpoint|config"):
        serve(tmp_path)


def test_the_marl_serve_command_prints_its_url_and_key_and_answers(run_dir):
    """The CLI as a subprocess: the key from ``MARL_SERVE_KEY``, a free port, the printed base
    URL answering the ``openai`` client; stopped by a signal."""
    import os
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "MARL_SERVE_KEY": "sekrit-key"}
    argv = [sys.executable, "-m", "trainers.cli", "serve", str(run_dir), "--port", "0"]
    proc = subprocess.Popen(argv, env=env, cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any(x.strip().startswith("models:") for x in lines):
            line = proc.stdout.readline()
            assert line, f"marl serve ended early: {lines}"
            lines.append(line)
        found = dict(x.strip().split("=", 1) for x in lines if "=" in x)
        assert found["OPENAI_API_KEY"] == "sekrit-key"
        assert found["OPENAI_BASE_URL"].startswith("http://127.0.0.1:")
        c = openai.OpenAI(base_url=found["OPENAI_BASE_URL"], api_key="sekrit-key", max_retries=0)
        r = c.chat.completions.create(model="worker", messages=[{"role": "user", "content": "hi"}])
        assert isinstance(r.choices[0].message.content, str)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0


def test_dozens_of_requests_opening_at_once_are_all_answered(served):
    """48 clients, each on its own connection, send at once (the listen backlog holds them);
    requests waiting together are sampled in shared ``generate`` calls, and a batched greedy
    reply is the one the same request gets alone."""
    import concurrent.futures
    import threading

    n = 48
    barrier = threading.Barrier(n)

    def ask(i: int) -> str:
        c = client(served)
        barrier.wait()
        r = c.chat.completions.create(
            model="worker", messages=[{"role": "user", "content": f"q{i}"}]
        )
        return r.choices[0].message.content

    batches = served.team.policy.batchers["worker"].batch_sizes
    before = len(batches)
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        replies = list(pool.map(ask, range(n)))
    assert len(replies) == n and all(isinstance(r, str) for r in replies)
    sizes = batches[before:]
    assert sum(sizes) == n and max(sizes) > 1, sizes
    c = client(served)
    for i in range(0, n, 8):
        alone = c.chat.completions.create(
            model="worker", messages=[{"role": "user", "content": f"q{i}"}]
        )
        assert alone.choices[0].message.content == replies[i]


def test_sampled_replies_are_the_modules_samples_at_the_pools_temperature(run_dir):
    """Without ``greedy``, from the run's first checkpoint directory: a reply is the pool's
    module sampling at its own temperature (the worker pool's 0.7), the same ids for the same
    torch seed."""
    import torch

    from trainers.evaluate import load_team
    from trainers.serve import serve

    first = sorted((run_dir / "checkpoints").glob("iter_*"))[0]
    _, plan, policy = load_team(first)
    module = policy.modules["worker"]
    assert module.temperature == pytest.approx(0.7)
    s = serve(first)
    try:
        messages = [{"role": "user", "content": "Say UP"}]
        got = []
        for seed in (3, 4):
            torch.manual_seed(seed)
            r = client(s).chat.completions.create(
                model="worker", messages=messages, extra_body={"return_token_ids": True}
            )
            torch.manual_seed(seed)
            [gen] = module.generate([r.model_extra["prompt_token_ids"]], module.temperature)
            assert r.choices[0].model_extra["token_ids"] == list(gen.token_ids)
            got.append(list(gen.token_ids))
        assert got[0] != got[1]  # sampled, not greedy
    finally:
        s.stop()
