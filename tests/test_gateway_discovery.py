"""An app's agents discovered on a dry run (``AppScenario`` without ``agents``): the
``openai``-SDK router app's two agents (their union over tasks, logged), an async app whose
model names need sanitising, the app as a command, clear errors for an app that calls no
model, fails or hangs in its dry run; and 2 iterations through ``train`` with the discovered
``router`` learning and ``worker`` frozen (bit-identical), the discovered agents in
``summary.json``.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("openai")

import openai

from marl_agents.gateway.app_scenario import AppScenario
from marl_agents.gateway.discovery import agent_ids
from scenarios.base import ScenarioError
from scenarios.graph_env import GraphEnv
from tests.apps import openai_router


def finish(sc: Any, seed: int = 0) -> GraphEnv:
    """One episode of ``sc`` with every agent answering its default reply."""
    env = GraphEnv(sc)
    env.reset(seed=seed)
    while env.agents:
        env.step({a: sc.default_action(a) for a in env.agents})
    return env


def test_the_openai_router_apps_two_agents_are_discovered_in_first_use_order(caplog):
    with caplog.at_level(logging.INFO, logger="marl.gateway"):
        sc = openai_router.discovered()
    assert sc.possible_agents == ["router", "worker"]
    assert sc.discovered == sc.model_names == {"router": "router", "worker": "worker"}
    text = caplog.text
    assert "discovered the agents of the app run" in text and "['router', 'worker']" in text
    # TASKS[0]'s dry run calls only the router, TASKS[1]'s both: the union, logged
    assert "requested different models from task to task" in text
    env = finish(sc, seed=1)  # the discovered agents' names work in an episode
    assert env.failure is None, env.error


def test_a_second_scenario_of_the_same_app_reuses_the_dry_run():
    calls: list[str] = []

    def run(task: str, llm: Any) -> str:
        calls.append(task)
        c = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        c.chat.completions.create(model="solo", messages=[{"role": "user", "content": task}])
        return "ok"

    first = AppScenario(run, tasks=["a", "b"], verifier=bool)
    second = AppScenario(run, tasks=["a", "b"], verifier=bool)
    assert first.possible_agents == second.possible_agents == ["solo"]
    assert calls == ["a", "b"]  # one dry run a task, in this process, for both
    AppScenario(run, tasks=["a", "b"], verifier=bool, discovery_tasks=1)
    assert calls == ["a", "b", "a"]  # other dry-run tasks: discovered again


async def critic_loop(task: str, llm: Any) -> list[str]:
    """An async app with its own model names (one needs sanitising), as written for an
    OpenAI-compatible provider."""
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    out = []
    for model in ("openai/gpt-4o-mini", "critic", "openai/gpt-4o-mini"):
        reply = await client.chat.completions.create(
            model=llm.models[model], messages=[{"role": "user", "content": f"{task} {model}"}]
        )
        out.append(reply.choices[0].message.content)
    return out


def test_an_async_app_is_discovered_with_sanitised_ids_and_runs_with_its_own_names():
    sc = AppScenario(
        critic_loop,
        tasks=["t"],
        verifier=bool,
        default_reply={"critic": "fine"},
        max_new_tokens=8,
    )
    assert sc.possible_agents == ["openai_gpt-4o-mini", "critic"]
    assert sc.model_names == {"openai_gpt-4o-mini": "openai/gpt-4o-mini", "critic": "critic"}
    env = finish(sc)
    assert env.failure is None, env.error
    assert env.final_state["result"] == ["", "fine", ""]


def test_sanitised_ids_never_clash():
    assert agent_ids(["a/b", "a_b", "a:b", "ok-1.2"]) == {
        "a_b": "a/b",
        "a_b_2": "a_b",
        "a_b_3": "a:b",
        "ok-1.2": "ok-1.2",
    }


def test_a_command_app_is_discovered_from_the_names_it_falls_back_to():
    sc = openai_router.discovered_command()
    assert sc.possible_agents == ["router", "worker"]
    for seed in range(2):  # its episodes get MARL_MODEL_ROUTER / _WORKER
        env = finish(sc, seed=seed)
        assert env.failure is None, env.error
        state = env.final_state
        # the default reply "-" routes right on TASKS[1] only
        assert state["result"]["routed"] is (state["task"] == openai_router.TASKS[1])


def test_an_app_that_calls_no_model_is_refused_naming_the_fix():
    with pytest.raises(ScenarioError, match=r"requested no model.*agents=\['<agent>'"):
        AppScenario(lambda task, llm: "done", tasks=["t"], verifier=bool)


def test_a_dry_run_that_fails_or_hangs_raises_with_the_apps_error():
    def broken(task: str, llm: Any) -> None:
        raise RuntimeError("no database configured")

    with pytest.raises(ScenarioError, match=r"dry run.*failed.*no database configured"):
        AppScenario(broken, tasks=["t"], verifier=bool)
    code = "import sys, time; print('waiting for a queue', file=sys.stderr, flush=True); "
    hang = [sys.executable, "-c", code + "time.sleep(600)"]
    with pytest.raises(ScenarioError, match=r"(?s)timed out.*waiting for a queue"):
        AppScenario.command(hang, tasks=["t"], verifier=bool, timeout_s=5.0)
    with pytest.raises(ScenarioError, match="model_names needs agents"):
        AppScenario(broken, tasks=["t"], verifier=bool, model_names={"a": "m"})
    with pytest.raises(ScenarioError, match="discovery_tasks"):
        AppScenario(broken, tasks=["t"], verifier=bool, discovery_tasks=0)


def test_discovered_agents_train_with_one_learning_and_one_frozen_through_train(
    ray_session, tmp_path
):
    from configs import tiny_config
    from test_train import checkpoint_weights

    from marl_agents.llm.tiny import make_tiny_model
    from trainers.run.loop import train

    llm = {"type": "llm", "path": "tiny"}
    cfg = tiny_config(
        tmp_path,
        scenario="tests.apps.openai_router:discovered",
        sharing="explicit",
        pools={
            "router": {"agents": ["router"], "model": {**llm, "tiny_seed": 0}},
            "worker": {"agents": ["worker"], "model": {**llm, "tiny_seed": 1}},
        },
        train=["router"],
        algorithm={
            "name": "GRPO",
            "lr": 1e-2,
            "num_epochs": 1,
            "grpo": {"group_size": 2, "groups_per_iteration": 2},
        },
        seed=0,
    )
    result = train(cfg)
    assert result.status == "completed", result.status
    assert all(h["charts/episodes"] > 0 and h["charts/error_rate"] == 0 for h in result.history)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["discovered_agents"] == {"router": "router", "worker": "worker"}
    ckpt = result.final_checkpoint
    for pool, seed, equal in (("worker", 1, True), ("router", 0, False)):
        weights = checkpoint_weights(ckpt, pool)
        _, lm = make_tiny_model(seed=seed)
        start = {f"model.{k}": v.numpy() for k, v in lm.state_dict().items()}
        assert set(weights) <= set(start)
        assert all(np.array_equal(weights[k], start[k]) for k in weights) is equal, pool
