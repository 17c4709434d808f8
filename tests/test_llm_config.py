"""LLM pools through ExperimentConfig: YAML, resolve() errors, the RLlib config, train(), the
length dual across checkpoints.

The tiny model (built in code) is the orchestrator of text-delegate; one frozen HF subagent
(the tiny model, seed 1) serves worker 0 (the random orchestrator rarely calls it: the frozen
subagent's weights are checked in tests/test_finetune.py, whose jobs run through the same
ExperimentConfig conversion). Config tests never start Ray.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marl_agents.pools import LLMModel
from trainers.algo import to_algorithm_config
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.grpo import GRPOSettings
from trainers.configs.typed import ConfigError
from trainers.plan import resolve

BUDGET = 0.5  # tokens: every completion (≥ 1 token) is over it, so the dual λ grows


def llm_data(tmp_path: Path | None = None) -> dict:
    return {
        "scenario": "text-delegate",
        "topology": "star:2",
        "scenario_kwargs": {
            "level": "easy",
            "subagents": [
                {"type": "hf", "path": "tiny", "seed": 1, "max_new_tokens": 8},
                "scripted",
            ],
        },
        "pools": {"orchestrator": {"model": {"type": "llm", "path": "tiny", "tiny_seed": 0}}},
        "algorithm": {
            "name": "GRPO",
            "lr": 1e-3,
            "num_epochs": 1,
            "grad_clip": 1.0,
            "grpo": {
                "group_size": 2,
                "groups_per_iteration": 2,
                "clip_high": 0.3,
                "length_budget": BUDGET,
                "dual_lr": 0.05,
            },
        },
        "budget": {"iterations": 2},
        "seed": 0,
        "logging": {"wandb": "disabled", "progress": False},
        "output": {
            "dir": str(tmp_path or "runs"),
            "name": "llm",
            "checkpoint_every": 0,
            "plot": False,
        },
    }


def llm_cfg(tmp_path: Path | None = None) -> ExperimentConfig:
    return ExperimentConfig.from_dict(llm_data(tmp_path))


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory) -> Path:
    """The tiny model (seed 3) saved as a Hugging Face directory."""
    from marl_agents.llm.tiny import make_tiny_model

    path = tmp_path_factory.mktemp("tiny") / "model"
    make_tiny_model(path, seed=3)
    return path


# ----- YAML ----------------------------------------------------------------------------------
def test_yaml_round_trip_of_an_llm_experiment(tmp_path):
    cfg = llm_cfg(tmp_path)
    assert ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg
    cfg.to_yaml(tmp_path / "exp.yaml")
    assert ExperimentConfig.from_yaml(tmp_path / "exp.yaml") == cfg
    assert cfg.algorithm.grpo == GRPOSettings(
        group_size=2, groups_per_iteration=2, clip_high=0.3, length_budget=BUDGET
    )


def test_hand_written_llm_yaml_shorthands_and_sweep_dimensions():
    from trainers.sweep import validate_space

    cfg = ExperimentConfig.from_yaml(
        "scenario: text-delegate\ntopology: star:2\npools: {orchestrator: llm}\n"
        "algorithm: {name: GRPO, grpo: {group_size: 4, loss_agg: seq_mean_token_sum}}\n"
    )
    model = cfg.pools["orchestrator"].model
    assert model.type == "llm" and model == LLMModel() and model.path == "tiny"
    assert cfg.algorithm.grpo.group_size == 4 and cfg.algorithm.grpo.clip_low == 0.2
    assert ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg
    changed = cfg.replace(
        **{"algorithm.grpo.clip_high": 0.35, "pools.orchestrator.model.top_p": 0.9}
    )
    assert (
        changed.algorithm.grpo.clip_high == 0.35
        and changed.pools["orchestrator"].model.top_p == 0.9
    )
    space = {
        "algorithm.grpo.clip_high": [0.2, 0.3],
        "pools.orchestrator.model.temperature": [0.7, 1],
    }
    assert validate_space(cfg, space, "grid") == 4


def test_a_finetune_job_is_an_experiment():
    from trainers.finetune import FinetuneJob

    job = FinetuneJob.from_yaml(Path(__file__).resolve().parents[1] / "examples/finetune_tiny.yaml")
    exp = job.to_experiment()
    assert ExperimentConfig.from_yaml(exp.to_yaml()) == exp
    assert exp.algorithm.name == "GRPO" and exp.algorithm.grpo.group_size == job.training.group_size
    assert exp.pools["orchestrator"].model.path == job.orchestrator.model
    plan = resolve(exp)
    assert plan.trainable == ["orchestrator"]


# ----- resolve and the RLlib config ----------------------------------------------------------
def test_llm_pool_maps_to_causal_lm_module_and_grpo():
    from marl_agents.llm.rl_module import CausalLMModule
    from trainers.grpo.algorithm import GRPO
    from trainers.sampling.grouped_env import GroupedEnv

    cfg = llm_cfg()
    plan = resolve(cfg)
    assert plan.trainable == ["orchestrator"] and plan.pools["orchestrator"].model.type == "llm"
    config = to_algorithm_config(cfg, plan)
    assert config.algo_class is GRPO and config.env is GroupedEnv
    runner, spec = config.env_config["runner"], config.env_config["spec"]
    assert runner.seed == 0 and runner.shared_seeds and runner.grouped
    assert not spec.seed_once  # GroupedEnv draws its own task seeds
    assert config.num_envs_per_env_runner == 4  # both groups (G = 2) side by side, not 16
    assert config.batch_mode == "complete_episodes"
    assert config.train_batch_size_per_learner == 4 and config.minibatch_size == 4
    assert (config.group_size, config.groups_per_iteration) == (2, 2)
    knobs = config.learner_config_dict["grpo"]
    assert knobs["clip_high"] == 0.3 and knobs["length_budget"] == BUDGET
    assert "group_size" not in knobs and "minibatch_size" not in knobs
    spec = config.rl_module_spec.rl_module_specs["orchestrator"]
    assert spec.module_class is CausalLMModule
    assert spec.model_config["model"] == "tiny" and spec.model_config["temperature"] == 1.0
    assert config.policies_to_train == ["orchestrator"]


def test_frozen_and_heterogeneous_llm_pools(saved_tiny):
    """text-toolchain chain:2: a frozen greedy tiny LLM (seed 0) and a trained one (seed 1)."""
    cfg = ExperimentConfig.from_dict(
        {
            "scenario": "text-toolchain",
            "topology": "chain:2",
            "sharing": "agent",
            "pools": {
                "agent_0": {"model": {"type": "llm", "temperature": 0.0}},
                "agent_1": {"model": {"type": "llm", "tiny_seed": 1}},
            },
            "train": ["agent_1"],
            "algorithm": "GRPO",
        }
    )
    plan = resolve(cfg)
    assert plan.trainable == ["agent_1"] and plan.frozen == ["agent_0"]
    specs = to_algorithm_config(cfg, plan).rl_module_spec.rl_module_specs
    assert specs["agent_0"].model_config["temperature"] == 0.0
    assert specs["agent_1"].model_config["tiny_seed"] == 1
    # a saved model: the scenario renders prompts with that model's tokenizer
    cfg = llm_cfg()
    cfg.pools["orchestrator"].model.path = str(saved_tiny)
    assert resolve(cfg).env.kwargs["tokenizer"] == str(saved_tiny)


def _bad(changes: dict) -> dict:
    data = llm_data()
    for dotted, value in changes.items():
        node = data
        *head, last = dotted.split(".")
        for key in head:
            node = node.setdefault(key, {})
        if value is None and last in node:
            del node[last]
        else:
            node[last] = value
    return data


ERRORS = [
    ({"scenario": "delegate", "scenario_kwargs": {}}, "text scenario"),
    ({"pools": {}, "algorithm.name": "PPO", "algorithm.grpo": None}, "model.type: llm"),
    ({"algorithm.name": "PPO", "algorithm.grpo": None}, "set algorithm.name: GRPO"),
    ({"algorithm.name": "PPO"}, "algorithm.grpo is set"),
    (
        {"pools": {}, "scenario": "delegate", "scenario_kwargs": {}, "algorithm.grpo.kl_coef": 0.1},
        "kl_coef: 0",
    ),
    ({"pools.orchestrator.model.path": "/nonexistent/model"}, "save_pretrained"),
    ({"pools.orchestrator.model.temperature": 0.0}, "greedy decoding"),
    ({"pools.orchestrator.model.top_p": 0.0}, "top_p"),
    ({"pools.orchestrator.model.dtype": "int8"}, "float32, bfloat16 or float16"),
    ({"pools.orchestrator.model.type": "gpt"}, "is not one of"),
    ({"algorithm.grpo.group_size": 1}, "≥ 2 rollouts per task"),
    ({"algorithm.grpo.minibatch_size": 5}, r"minibatch_size=5 must be in 1…4"),
    ({"algorithm.grpo.clip_low": 1.5}, "clip_low"),
    ({"algorithm.grpo.loss_agg": "mean"}, "loss_agg"),
    ({"algorithm.grpo.bogus": 1}, "unknown field"),
    ({"scenario_kwargs.subagents": [{"type": "hf", "path": "/nonexistent"}]}, "config.json"),
    ({"scenario_kwargs.subagents": [{"type": "vllm", "url": "http://x"}]}, "served model name"),
    ({"credit": {"method": "loo", "normalize": True}}, "credit.normalize"),
    ({"resources.num_gpus_per_learner": 1.0}, "num_learners=1"),
]


@pytest.mark.parametrize(("changes", "match"), ERRORS, ids=[m for _, m in ERRORS])
def test_bad_llm_combinations_fail_in_resolve(changes, match, monkeypatch):
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    with pytest.raises(ConfigError, match=match):
        resolve(ExperimentConfig.from_dict(_bad(changes)))


def test_llm_pools_of_different_models_need_a_shared_tokenizer(saved_tiny):
    data = {
        "scenario": "text-toolchain",
        "topology": "chain:2",
        "sharing": "agent",
        "pools": {
            "agent_0": {"model": {"type": "llm"}},
            "agent_1": {"model": {"type": "llm", "path": str(saved_tiny)}},
        },
        "algorithm": "GRPO",
    }
    with pytest.raises(ConfigError, match=r"set scenario_kwargs\.tokenizer"):
        resolve(ExperimentConfig.from_dict(data))
    data["scenario_kwargs"] = {"tokenizer": "tiny"}  # both are the tiny tokenizer
    assert resolve(ExperimentConfig.from_dict(data)).trainable == ["agent_0", "agent_1"]


def test_a_model_larger_than_the_text_spaces_is_rejected(tmp_path):
    from marl_agents.llm.tiny import make_tiny_model

    make_tiny_model(tmp_path / "wide", vocab_size=420)
    data = llm_data()
    data["pools"]["orchestrator"]["model"]["path"] = str(tmp_path / "wide")
    data["scenario_kwargs"]["tokenizer"] = "tiny"  # 384 ids: the model emits more
    with pytest.raises(ConfigError, match=r"has 4\d\d token ids but .* allow 384"):
        resolve(ExperimentConfig.from_dict(data))


# ----- train() -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llm_run(tmp_path_factory, ray_session):
    """train() for 2 iterations of 2 groups × 2 rollouts (the tiny LLM orchestrator)."""
    from trainers.run.loop import train

    cfg = llm_cfg(tmp_path_factory.mktemp("llm_train"))
    return cfg, train(cfg)


def test_train_runs_an_llm_experiment(llm_run):
    cfg, result = llm_run
    run = result.run_dir
    assert result.status == "completed" and result.iterations == 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["charts/iteration"] for r in rows] == [1, 2]
    for row in rows:
        assert row["charts/episodes"] == 4  # G · groups finished episodes per iteration
        assert "charts/team_return" in row and "charts/format_ok" in row
        for key in ("total_loss", "entropy", "mean_kl_loss"):
            assert f"losses/orchestrator/{key}" in row, key
    assert (run / "checkpoint" / "algorithm_state.pkl").exists()
    assert result.final_checkpoint == run / "checkpoint"
    assert ExperimentConfig.from_yaml(run / "config.yaml") == cfg
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def _lam(algo) -> float:
    from ray.rllib.core import COMPONENT_LEARNER

    return algo.learner_group.get_state()[COMPONENT_LEARNER]["grpo_duals"]["orchestrator"]["lam"]


def test_length_dual_survives_checkpoints_and_resumes(llm_run, tmp_path):
    """λ is learner state: saved in the algorithm checkpoint, restored by from_checkpoint (what
    train(resume=...) uses), and the next update continues from it."""
    from ray.rllib.algorithms.algorithm import Algorithm

    cfg, result = llm_run
    eta = cfg.algorithm.grpo.dual_lr
    algo = Algorithm.from_checkpoint(str(result.final_checkpoint))
    try:
        restored = _lam(algo)
        # each of the 2 iterations added η·(mean length − B)/B ≥ η·(1 − B)/B; a fresh dual is 0
        assert restored >= 2 * eta * (1 - BUDGET) / BUDGET
        stats = algo.train()["learners"]["orchestrator"]
        length = float(stats["grpo/completion_tokens_mean"])
        expected = max(0.0, restored + eta * (length - BUDGET) / BUDGET)
        assert float(stats["grpo/length_dual"]) == pytest.approx(expected)
        assert _lam(algo) == pytest.approx(expected)
        saved = Path(algo.save_to_path(str(tmp_path / "again")))
        live = _lam(algo)
    finally:
        algo.stop()
    again = Algorithm.from_checkpoint(str(saved))
    try:
        assert _lam(again) == live
    finally:
        again.stop()


def test_sweep_runs_an_llm_trial(tmp_path, ray_session):
    """Ray Tune runs an LLM experiment unchanged (one trial, one iteration, in a Tune worker)."""
    from trainers.sweep import sweep

    cfg = llm_cfg(tmp_path)
    cfg.budget.iterations = 1
    result = sweep(cfg, {"algorithm.grpo.clip_high": [0.25]}, show=False)
    [trial] = result.trials
    assert trial["status"] == "ok" and trial["iterations"] == 1, trial
    assert trial["params"] == {"algorithm.grpo.clip_high": 0.25}
    saved = ExperimentConfig.from_yaml(Path(trial["run_dir"]) / "config.yaml")
    assert saved.algorithm.grpo.clip_high == 0.25 and saved.algorithm.name == "GRPO"


def test_an_iteration_where_no_trained_agent_acts_skips_the_update(ray_session):
    """text-toolchain chain:2: the frozen greedy agent_0 never passes the turn, so the trained
    agent_1 never acts; the iteration must not reach RLlib's learner with an empty batch."""
    from ray.rllib.utils.metrics import ALL_MODULES

    from trainers.grpo.connectors import SKIPPED_UPDATES

    cfg = ExperimentConfig.from_dict(
        {
            "scenario": "text-toolchain",
            "topology": "chain:2",
            "scenario_kwargs": {"max_prompt_tokens": 256, "max_new_tokens": 16, "max_turns": 4},
            "sharing": "agent",
            "pools": {
                "agent_0": {"model": {"type": "llm", "temperature": 0.0}},
                "agent_1": {"model": {"type": "llm", "tiny_seed": 1}},
            },
            "train": ["agent_1"],
            "algorithm": {"name": "GRPO", "grpo": {"group_size": 2, "groups_per_iteration": 1}},
        }
    )
    algo = to_algorithm_config(cfg).build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["num_episodes"] == 2
        assert "agent_1/return" not in result["env_runners"].get("agent_episode_returns_mean", {})
        assert result["learners"][ALL_MODULES][SKIPPED_UPDATES] == 1
    finally:
        algo.stop()
