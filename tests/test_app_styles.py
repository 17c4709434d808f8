"""App styles beyond StateGraph, written as LangGraph's docs write them (only change: models
from ``models[...]``): the Functional API (``@entrypoint``/``@task``, with and without a
checkpointer), persistence (a graph invoked in a node with its own ``thread_id``, the app's own
checkpointer kept with a fresh thread per episode), step-limit episodes counted, and a policy
per agent by default where the app's structure gives no roles. Apps: ``tests/apps/``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from pettingzoo.test import parallel_api_test
from test_chat_app_training import app_cfg, same
from test_chat_apps import steps_of
from test_train import learner_weights

from scenarios.base import ScenarioError
from scenarios.graph_env import GraphEnv
from trainers.configs.experiment import ExperimentConfig


# ----- the Functional API --------------------------------------------------------------------
@pytest.mark.parametrize("saved", [False, True])
def test_functional_app_decides_per_model_call_and_reaches_the_verifier(saved):
    from tests.apps.functional import essays

    sc = essays(checkpointer=saved)
    assert sc.possible_agents == ["writer", "critic"]
    assert sc.topology.pools == {"writer": "writer", "critic": "critic"}  # a policy each
    env = GraphEnv(sc)
    for _ in range(2):  # a fresh thread per episode: the second is like the first
        steps = steps_of(env, {"writer": ["a", "bb"], "critic": ["1"]})
        assert steps[:3] == [["writer"], ["writer"], ["critic"]]
        assert env.final_state == {"essays": ["a", "bb"], "verdict": "1"}
        assert env.failure is None and env.outcome.reward == pytest.approx(1 - 0.003)
    if saved:  # the episode's threads are deleted when it ends
        assert not sc.build_graph().compile().checkpointer.storage
    parallel_api_test(GraphEnv(essays(checkpointer=saved)), num_cycles=20)


def test_functional_app_trains_with_the_critic_frozen_bit_identical(ray_session, tmp_path):
    from trainers.algo import to_algorithm_config

    cfg = style_cfg(tmp_path, "tests.apps.functional:essays_saved", ["writer"])
    algo = to_algorithm_config(cfg).build_algo()
    try:
        frozen, trained = learner_weights(algo, "critic"), learner_weights(algo, "writer")
        for _ in range(2):
            marl = algo.train()["env_runners"].get("marl", {})
            assert marl.get("episodes") and not marl.get("error") and not marl.get("limit"), marl
        assert same(learner_weights(algo, "critic"), frozen)
        assert not same(learner_weights(algo, "writer"), trained)
    finally:
        algo.stop()


def style_cfg(tmp_path: Path, app: str, train: list[str]) -> ExperimentConfig:
    """test_chat_app_training's GRPO settings on ``app``, default pools (one per agent)."""
    data = app_cfg(tmp_path).to_dict()
    data.update(scenario=app, scenario_kwargs={}, train=train, pools={})
    data["algorithm"]["grpo"]["groups_per_iteration"] = 1
    data["algorithm"]["name"] = "GRPO"
    from trainers.plan import with_text_defaults

    bare = ExperimentConfig.from_dict({k: v for k, v in data.items() if k != "algorithm"})
    pools = with_text_defaults(bare).pools  # the zero-config pools: an LLM per agent
    return ExperimentConfig.from_dict(data).replace(pools=pools)


def test_an_app_compiled_to_wait_for_a_human_is_refused_naming_the_fix():
    from marl_agents.llm.chat_app import ChatAppScenario
    from tests.apps.loop import build

    def waits(models):
        return build(models).builder.compile(interrupt_before=["call_model"])

    with pytest.raises(ScenarioError, match="interrupt_before"):
        ChatAppScenario(waits, tasks=["hi"], verifier=lambda s: 1.0)


# ----- persistence ---------------------------------------------------------------------------
def test_nested_graph_with_its_own_thread_id_stays_in_the_episode_and_threads_are_fresh():
    from tests.apps.persistence import chat

    sc = chat()
    env = GraphEnv(sc)
    for _ in range(2):  # the nested thread "1" holds this episode's 2 turns only
        steps = steps_of(env, {"planner": ["p"], "helper": ["x", "y"]})
        assert steps[:3] == [["planner"], ["helper"], ["helper"]]
        assert env.final_state["turns"] == 4 and env.outcome.success, env.error
    assert not sc.build_graph().compile().checkpointer.storage  # the app's saver, kept: emptied
    parallel_api_test(GraphEnv(chat()), num_cycles=20)


# ----- step-limit episodes -------------------------------------------------------------------
def test_a_step_limit_episode_is_truncated_in_the_transcript_and_the_metrics():
    from tests.apps.loop import forever
    from trainers.run.transcripts import render
    from trainers.signals.episode_metrics import outcome_values

    env = GraphEnv(forever())
    steps_of(env, {})
    assert env.failure == "limit" and env.truncated
    t = env.transcript()
    assert t["outcome"]["truncated"] and "failed (limit)" in render(t)
    values = outcome_values(env.outcome.reward, env.outcome.success, env.outcome.truncated, "limit")
    assert values["truncated"] == 1.0 and values["limit"] == 1.0


def test_a_run_whose_every_episode_hits_the_limit_says_so(ray_session, tmp_path, caplog):
    from trainers.run.loop import train

    cfg = style_cfg(tmp_path, "tests.apps.loop:forever", ["agent"]).replace(
        **{"budget.iterations": 1}
    )
    with caplog.at_level(logging.WARNING, logger="trainers.run.episode_log"):
        result = train(cfg)
    assert result.status == "completed", result.status
    row = result.history[-1]
    assert row["charts/truncated"] == 1.0 and row["charts/limit_rate"] == 1.0
    assert "max_supersteps" in caplog.text


# ----- a policy per agent by default ---------------------------------------------------------
def test_agents_without_roles_get_a_pool_each_so_train_names_any_agent(tmp_path):
    from trainers.plan import resolve, with_text_defaults

    bare = ExperimentConfig(scenario="tests.apps.chat_team:async_app", train=["writer"])
    plan = resolve(with_text_defaults(bare))
    assert plan.agent_to_pool == {"researcher": "researcher", "writer": "writer"}
    assert plan.trainable == ["writer"] and plan.frozen == ["researcher"]


def test_the_functional_example_runs_an_episode_to_its_verifier():
    from examples.functional_app import scenario

    env = GraphEnv(scenario())
    steps = steps_of(env, {"writer": ["rain rain"], "critic": ["yes"]}, seed=0)
    assert steps[:2] == [["writer"], ["critic"]] and env.failure is None
    assert env.outcome.reward == (1.0 if "rain" in env.final_state["topic"] else 0.0)
