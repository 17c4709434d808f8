"""An OpenAI Agents SDK app (``tests/apps/agents_sdk_handoff.py``: a triage ``Agent`` with
``handoffs=[billing, tech]``, ``OpenAIChatCompletionsModel`` on ``AsyncOpenAI``, ``Runner.run``)
trained unchanged through the gateway: an episode's handoff reaches the chosen specialist's own
policy and the verifier reads ``result.last_agent.name``; two GRPO iterations complete with the
triage agent learning and the specialists frozen (bit-identical); and the trained run, served
by ``marl serve``, runs the same app unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("agents")

from marl_agents.llm.env_chat_model import tokens_action
from scenarios.graph_env import GraphEnv
from scenarios.toolcalls import render_tool_call
from tests.apps import agents_sdk_handoff


def play(sc: Any, replies: dict[str, list[str]], task: str) -> GraphEnv:
    """One episode on ``task`` whose agents reply the given texts in order."""
    env = GraphEnv(sc)
    seed = agents_sdk_handoff.TASKS.index(task)
    left = {a: list(r) for a, r in replies.items()}
    obs, infos = env.reset(seed=seed)
    while env.agents:
        actions = {
            a: tokens_action(sc.spaces, sc.tokenizer, left[a].pop(0) if infos[a]["acting"] else "")
            for a in env.agents
        }
        obs, _, _, _, infos = env.step(actions)
    assert env.failure is None, env.error
    return env


@pytest.mark.parametrize("pick", ["billing", "tech"])
def test_a_handoff_reaches_the_specialist_and_the_verifier_reads_the_last_agent(pick):
    sc = agents_sdk_handoff.scenario(tasks=[agents_sdk_handoff.TASKS[0]])  # a billing task
    task = agents_sdk_handoff.TASKS[0]
    replies = {
        "triage": [render_tool_call(f"transfer_to_{pick}", {})],
        pick: ["On it."],
    }
    env = play(sc, replies, task)
    assert env.final_state["task"] == task
    assert env.final_state["result"] == {"last_agent": pick, "output": "On it."}
    assert env.outcome.reward == (1.0 if pick == "billing" else 0.0)
    assert [s.agent for s in env.trace] == ["triage", pick]
    seen = sc.tokenizer.decode(
        sc.spaces.decode_prompt(env.trace[1].observation), skip_special_tokens=True
    )
    assert "You handle" in seen and task in seen  # the specialist's instructions, the task
    first = sc.tokenizer.decode(
        sc.spaces.decode_prompt(env.trace[0].observation), skip_special_tokens=True
    )
    assert "transfer_to_billing" in first and "transfer_to_tech" in first  # the handoff tools


def test_two_grpo_iterations_train_triage_with_the_specialists_frozen(ray_session, tmp_path):
    from configs import grpo_app_config
    from test_gateway_apps import trains_with_frozen_pool

    llm = {"type": "llm", "path": "tiny"}
    pools = {
        "triage": {"agents": ["triage"], "model": {**llm, "tiny_seed": 0}},
        "specialists": {"agents": ["billing", "tech"], "model": {**llm, "tiny_seed": 1}},
    }
    cfg = grpo_app_config(tmp_path, "tests.apps.agents_sdk_handoff:scenario", pools, ["triage"])
    result = trains_with_frozen_pool(cfg, "triage", "specialists", changes=True)
    assert result["env_runners"]["num_episodes_lifetime"] >= 8


def test_the_trained_app_runs_unchanged_against_marl_serve(ray_session, tmp_path):
    """Train it (2 iterations, a run directory), serve the run, and run the same Agents SDK
    app against the served endpoint: the triage agent hands off to a specialist, who answers."""
    import asyncio

    from configs import tiny_config

    from marl_agents.gateway.app_scenario import AppLLM
    from trainers.run.loop import train
    from trainers.serve import serve

    llm = {"type": "llm", "path": "tiny"}
    cfg = tiny_config(
        tmp_path,
        scenario="tests.apps.agents_sdk_handoff:scenario",
        sharing="explicit",
        pools={
            "triage": {"agents": ["triage"], "model": llm},
            "specialists": {"agents": ["billing", "tech"], "model": {**llm, "tiny_seed": 1}},
        },
        train=["triage"],
        algorithm={
            "name": "GRPO",
            "num_epochs": 1,
            "grpo": {"group_size": 2, "groups_per_iteration": 2},
        },
        seed=0,
    )
    result = train(cfg)
    assert result.status == "completed", result.status
    served = serve(result.run_dir, greedy=True)
    try:
        assert served.models == ["billing", "tech", "triage"]
        app = AppLLM(served.base_url, served.key, {a: a for a in served.models})
        task = agents_sdk_handoff.TASKS[2]
        out = asyncio.run(agents_sdk_handoff.run(task, app))
        assert out["last_agent"] in ("billing", "tech") and isinstance(out["output"], str)
        assert served.team.requests == 2  # the triage's handoff call, the specialist's reply
    finally:
        served.stop()
