"""Apps that make their models with ``init_chat_model("provider:name", ...)`` (issue #28,
item 7): ``models.init_chat_model`` has LangChain's signature and returns ``models[agent]``;
``examples/init_chat_model_app.py`` (LangGraph's prompt-chaining workflow) runs an episode to
its verifier and trains 2 iterations with the editor frozen bit-identical.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from pettingzoo.test import parallel_api_test
from test_app_styles import style_cfg
from test_chat_app_training import same
from test_chat_apps import steps_of
from test_train import learner_weights

from marl_agents.llm.chat_app import ChatAppScenario
from scenarios.graph_env import GraphEnv
from tests.apps.streaming import build as two_step


def test_init_chat_model_returns_the_agents_model_by_agent_or_model_name():
    seen = {}

    def build(models):
        init = models.init_chat_model
        seen["a"] = init("openai:gpt-4o", temperature=0)
        seen["b"] = init("gpt-4o")  # the same model name: the same agent
        seen["c"] = init("ollama:llama3:8b", model_provider="ollama")
        seen["d"] = init(configurable_fields="any", agent="planner")
        with pytest.raises(KeyError, match="agent='<id>'"):
            init()
        return two_step(models)

    sc = ChatAppScenario(build, tasks=["hi"], verifier=lambda s: True, max_prompt_tokens=64)
    assert seen["a"] is seen["b"] is sc.models["gpt-4o"]
    assert seen["c"].agent == "llama3_8b" and seen["d"].agent == "planner"
    assert {"gpt-4o", "llama3_8b", "planner", "writer", "reviewer"} == set(sc.possible_agents)


def test_the_init_chat_model_example_runs_an_episode_to_its_verifier():
    from examples.init_chat_model_app import scenario

    sc = scenario()
    assert sc.possible_agents == ["writer", "editor"]
    env = GraphEnv(sc)
    assert steps_of(env, {"writer": ["a pun"], "editor": ["a pun!"]}) == [["writer"], ["editor"]]
    assert env.final_state["improved_joke"] == "a pun!" and not env.outcome.success
    steps_of(env, {"writer": ["a pun!"]})
    assert "improved_joke" not in env.final_state and env.outcome.success
    parallel_api_test(GraphEnv(scenario()), num_cycles=10)


def test_the_init_chat_model_example_trains_two_iterations(ray_session, tmp_path):
    from trainers.algo import to_algorithm_config

    cfg = style_cfg(tmp_path, "examples.init_chat_model_app:scenario", ["writer"])
    algo = to_algorithm_config(cfg).build_algo()
    try:
        frozen, trained = learner_weights(algo, "editor"), learner_weights(algo, "writer")
        for _ in range(2):
            marl = algo.train()["env_runners"].get("marl", {})
            assert marl.get("episodes") and not marl.get("error") and not marl.get("limit"), marl
        assert same(learner_weights(algo, "editor"), frozen)
        assert not same(learner_weights(algo, "writer"), trained)
    finally:
        algo.stop()
