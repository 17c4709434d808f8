"""LangGraph's plan-and-execute tutorial as written (``tests/apps/plan_execute.py``): with
constrained decoding every planner and replanner reply of a random tiny model parses (the
nodes read ``plan.steps`` / ``output.action`` and would raise on ``None``), every episode
reaches the verifier, and the app trains 2 iterations with the executor frozen bit-identical.
"""

from __future__ import annotations

import pytest
from episodes import play

pytest.importorskip("xgrammar")
pytest.importorskip("transformers")

import torch
from pettingzoo.test import parallel_api_test
from test_app_styles import style_cfg
from test_chat_app_training import same
from test_train import learner_weights

from marl_agents.llm.backend import SamplingParams
from marl_agents.llm.env_chat_model import backend_policy
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.llm.tiny import make_tiny_model
from scenarios.graph_env import GraphEnv
from scenarios.toolcalls import parse_tool_calls


def test_plan_and_execute_episodes_parse_on_every_decision_and_reach_the_verifier():
    from tests.apps.plan_execute import scenario, unreadable

    tok, model = make_tiny_model(seed=0)
    sc = scenario()
    assert sc.possible_agents == ["planner", "replanner", "executor"]
    policy = backend_policy(HFBackend(model, tok), sc.spaces, SamplingParams(max_new_tokens=96))
    env = GraphEnv(sc)
    torch.manual_seed(0)
    for seed in range(6):
        play(env, seed, policy)
        assert env.failure is None, env.error  # no node raised on an unparsed reply
        state = env.final_state
        assert state["plan"] and state["response"] and state["past_steps"]
        brief = 1 / len(state["past_steps"]) - 1e-3 * unreadable(state["response"])
        assert env.outcome.success and env.outcome.reward == pytest.approx(brief)
    parallel_api_test(GraphEnv(scenario()), num_cycles=10)


def test_a_constrained_string_with_a_control_character_parses():
    # xgrammar's JSON grammar admits raw control characters inside strings
    [call] = parse_tool_calls(
        '<tool>{"name": "Plan", "arguments": {"steps": ["a\x1fb"]}}</tool>'
    ).tool_calls
    assert call.arguments == {"steps": ["a\x1fb"]}


def test_plan_and_execute_trains_two_iterations_with_the_executor_frozen(ray_session, tmp_path):
    from trainers.algo import to_algorithm_config

    cfg = style_cfg(tmp_path, "tests.apps.plan_execute:scenario", ["planner", "replanner"])
    algo = to_algorithm_config(cfg).build_algo()
    try:
        frozen, trained = learner_weights(algo, "executor"), learner_weights(algo, "planner")
        for _ in range(2):
            marl = algo.train()["env_runners"].get("marl", {})
            assert marl.get("episodes") and not marl.get("error") and not marl.get("limit"), marl
        assert same(learner_weights(algo, "executor"), frozen)
        assert not same(learner_weights(algo, "planner"), trained)
    finally:
        algo.stop()
