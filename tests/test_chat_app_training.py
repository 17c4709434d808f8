"""A user's chat-model app trained through ExperimentConfig by import reference: the supervisor
of ``examples/supervisor_app.py`` (a real ``create_supervisor`` app; ``tests/apps/chat_team.py``
adds a conciseness term to its reward) learns with GRPO while its workers are frozen tiny-LLM
pools — in process, with a remote env runner, and with Shapley credit spread over credit
workers. Frozen weights stay bit-identical. Every other pattern of ``tests/apps/chat_team.py``
(ReAct alone, swarm, map-reduce with ``Send``, async nodes, an agent in a nested subgraph) trains
too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("langgraph_supervisor")

from configs import grpo_app_config
from test_train import learner_weights

from trainers.configs.experiment import ExperimentConfig

APP = "tests.apps.chat_team:supervisor"


def app_cfg(tmp_path: Path, **changes: Any) -> ExperimentConfig:
    pools = {
        "orchestrator": {"model": {"type": "llm", "path": "tiny", "tiny_seed": 0}},
        "worker": {"model": {"type": "llm", "path": "tiny", "tiny_seed": 1}},
    }
    cfg = grpo_app_config(
        tmp_path,
        APP,
        pools,
        ["supervisor"],
        sharing="role",  # the default, over the helper's explicit pools
        scenario_kwargs={"max_prompt_tokens": 512, "max_new_tokens": 4},
    )
    return cfg.replace(**changes) if changes else cfg


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_plan_of_the_app_trains_the_supervisor_only(tmp_path):
    from trainers.plan import resolve

    plan = resolve(app_cfg(tmp_path))
    assert plan.agents == ["supervisor", "math_expert", "research_expert"]
    assert plan.trainable == ["orchestrator"] and sorted(plan.frozen) == ["worker"]
    assert plan.agent_to_pool == {
        "supervisor": "orchestrator",
        "math_expert": "worker",
        "research_expert": "worker",
    }


@pytest.mark.parametrize("runners", [0, 1])
def test_supervisor_learns_and_frozen_workers_stay_bit_identical(ray_session, tmp_path, runners):
    from trainers.algo import to_algorithm_config

    cfg = app_cfg(tmp_path, **{"resources.num_env_runners": runners})
    algo = to_algorithm_config(cfg).build_algo()
    try:
        frozen, trained = learner_weights(algo, "worker"), learner_weights(algo, "orchestrator")
        for _ in range(2):
            result = algo.train()
            marl = result["env_runners"].get("marl", {})
            assert not marl.get("error") and not marl.get("timeout"), marl  # real episodes
        assert same(learner_weights(algo, "worker"), frozen)
        assert not same(learner_weights(algo, "orchestrator"), trained)
        episodes = result["env_runners"]["num_episodes_lifetime"]
        assert episodes >= 8  # 2 iterations × 2 groups × 2 rollouts
    finally:
        algo.stop()


def test_shapley_credit_with_credit_workers_on_the_app(ray_session, tmp_path):
    from trainers.run.loop import train

    cfg = app_cfg(tmp_path, **{"credit.method": "shapley", "credit.workers": 1})
    result = train(cfg)
    assert result.status == "completed", result.status
    assert [h["charts/iteration"] for h in result.history] == [1, 2]
    assert all(h["charts/episodes"] > 0 for h in result.history)


LLM = {"type": "llm", "path": "tiny"}


TEAM = {"team": {"model": LLM}}  # one LLM pool serving every agent (sharing: team)
PEERS = {"alice": {"agents": ["Alice"], "model": LLM}, "bob": {"agents": ["Bob"], "model": LLM}}


@pytest.mark.parametrize(
    ("app", "sharing", "pools", "train"),
    [
        ("react", "team", TEAM, None),
        ("swarm", "explicit", PEERS, ["alice"]),
        ("map_reduce", "team", TEAM, None),
        ("async_app", "team", TEAM, None),
        ("nested", "team", TEAM, None),
    ],
)
def test_each_app_pattern_trains(ray_session, tmp_path, app, sharing, pools, train):
    from trainers.run.loop import train as run

    data = app_cfg(tmp_path).to_dict()
    data.update(scenario=f"tests.apps.chat_team:{app}", pools=pools, train=train)
    data.update(scenario_kwargs={}, sharing=sharing)
    data["algorithm"]["grpo"]["groups_per_iteration"] = 1
    result = run(ExperimentConfig.from_dict(data))
    assert result.status == "completed", result.status
    assert all(h["charts/episodes"] > 0 for h in result.history)
    assert all(h["charts/error_rate"] == 0 for h in result.history)


def test_a_chat_app_left_at_the_defaults_gets_llm_pools_and_grpo(tmp_path):
    from trainers.plan import resolve, with_text_defaults

    bare = ExperimentConfig(scenario=APP, train=["supervisor"])
    cfg = with_text_defaults(bare)
    assert cfg.algorithm.name == "GRPO" and cfg.algorithm.grpo is not None
    assert {p: m.model.type for p, m in cfg.pools.items()} == {
        "orchestrator": "llm",
        "worker": "llm",
    }
    assert resolve(cfg).trainable == ["orchestrator"]
    chosen = app_cfg(tmp_path)  # an algorithm of its own: left as it is
    assert with_text_defaults(chosen) == chosen
    assert with_text_defaults(ExperimentConfig()) == ExperimentConfig()  # not a text scenario


def marl_run_dump(*args: str) -> ExperimentConfig:
    """The experiment ``marl run ARGS --dump`` prints (a fresh process, from the repo root)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    marl = [sys.executable, "-c", "from trainers.cli import app; app()"]
    proc = subprocess.run(
        [*marl, "run", *args, "--dump"], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ExperimentConfig.from_yaml(proc.stdout)


def test_marl_run_of_a_chat_app_fills_the_defaults(tmp_path):
    dumped = marl_run_dump(APP, "--train", "supervisor")
    assert dumped.algorithm.name == "GRPO" and dumped.pools["worker"].model.type == "llm"


def test_marl_run_takes_the_example_yaml_as_its_argument(tmp_path):
    dumped = marl_run_dump("examples/supervisor_app.yaml")
    assert dumped.scenario == "examples.supervisor_app:scenario"
    assert dumped.credit.method == "shapley" and dumped.train == ["supervisor"]
