"""The GPU learner path: PPO (with Shapley credit in the learner), GRPO on the tiny LLM, on
a Qwen2 checkpoint, and with vLLM sampling (weight sync, a frozen vLLM pool).

Opt-in (``--gpu``; needs CUDA): CI has no GPU. Each test builds the algorithm from the same
config ``train()`` uses, asks the remote learner where its module lives, trains two
iterations and checks that the weights moved and stayed finite.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_train import learner_weights

from trainers.configs.experiment import ExperimentConfig

pytestmark = pytest.mark.gpu


def on_gpu(cfg: ExperimentConfig) -> ExperimentConfig:
    res = dataclasses.replace(cfg.resources, num_learners=1, num_gpus_per_learner=1)
    return cfg.replace(resources=res)


def learner_devices(algo: Any) -> set[str]:
    def devices(learner: Any) -> list[str]:
        return sorted({str(p.device) for m in learner.module.values() for p in m.parameters()})

    return {d for call in algo.learner_group.foreach_learner(devices) for d in call.get()}


def trains_on_gpu(cfg: ExperimentConfig, module: str) -> None:
    from trainers.algo import to_algorithm_config

    algo = to_algorithm_config(on_gpu(cfg)).build_algo()
    try:
        assert learner_devices(algo) == {"cuda:0"}
        before = learner_weights(algo, module)
        for _ in range(2):
            result = algo.train()
        after = learner_weights(algo, module)
    finally:
        algo.stop()
    assert "learners" in result
    assert all(np.isfinite(v).all() for v in after.values())
    assert any(not np.array_equal(before[k], after[k]) for k in before), "weights did not move"


def test_ppo_with_shapley_credit_learns_on_the_gpu(ray_session: Any, tmp_path: Path) -> None:
    cfg = ExperimentConfig.from_dict(
        {
            "topology": "star:2",
            "credit": {"method": "shapley"},
            "algorithm": {"train_batch_size": 128, "minibatch_size": 64, "num_epochs": 1},
            "resources": {"num_envs_per_env_runner": 2},
            "logging": {"wandb": "disabled", "progress": False},
            "output": {"dir": str(tmp_path)},
        }
    )
    trains_on_gpu(cfg, "orchestrator")


def test_grpo_on_the_tiny_llm_learns_on_the_gpu(ray_session: Any, tmp_path: Path) -> None:
    from trainers.finetune import FinetuneJob

    job = FinetuneJob.from_yaml(Path(__file__).parents[1] / "examples" / "finetune_tiny.yaml")
    cfg = job.to_experiment()
    cfg = cfg.replace(output=dataclasses.replace(cfg.output, dir=str(tmp_path)))
    trains_on_gpu(cfg, "orchestrator")


def test_grpo_on_a_qwen2_checkpoint_learns_on_the_gpu(ray_session: Any, tmp_path: Path) -> None:
    """A Qwen2 model from a ``save_pretrained`` directory (random weights, built in code),
    memory-checked against the GPU in ``resolve``, trained on the GPU learner. Built with the
    tiny model's init range: at the family default (0.02) every reply of the random model
    earns the same reward, GRPO's advantages are all 0 and the weights cannot move (seen on
    an H200, 2026-11-27)."""
    from marl_agents.llm.tiny import make_tiny_model
    from trainers.finetune import FinetuneJob

    job = FinetuneJob.from_yaml(Path(__file__).parents[1] / "examples" / "finetune_tiny.yaml")
    make_tiny_model(tmp_path / "qwen2", seed=0)
    job.orchestrator.model = str(tmp_path / "qwen2")
    cfg = job.to_experiment()
    cfg = cfg.replace(output=dataclasses.replace(cfg.output, dir=str(tmp_path)))
    trains_on_gpu(cfg, "orchestrator")


def test_grpo_with_vllm_sampling_and_a_frozen_vllm_pool_on_the_gpu(
    ray_session: Any, tmp_path: Path
) -> None:
    """Issue #12 point 5: the GPU learner trains a vLLM-sampled pool next to a frozen
    vLLM-sampled pool (text-toolchain chain:2, as ``test_llm_vllm``); every update starts from
    the engine's own logprobs (weights synced) and the frozen pool stays bit-identical. Needs
    vLLM's CUDA build (``pip install vllm``) on the GPU machine."""
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm")
    import json

    from test_llm_vllm import test_frozen_vllm_pool_stays_bit_identical, vllm_experiment

    from trainers.run.loop import train

    cfg = on_gpu(vllm_experiment(tmp_path))
    result = train(cfg)
    assert result.status == "completed" and result.iterations == 2
    for line in (result.run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert row["losses/agent_0/grpo/mismatch_abs_logprob"] < 1e-3
    test_frozen_vllm_pool_stays_bit_identical((cfg, result))


def test_grpo_samples_on_a_gpu_env_runner(ray_session: Any, tmp_path: Path) -> None:
    """``resources.num_gpus_per_env_runner``: the remote env runner's LLM pool generates on the
    GPU it shares with the learner (0.5 each), the sampled logprobs match the learner's
    teacher-forced ones (on-policy), and the synced weights reach the runner."""
    from trainers.algo import to_algorithm_config
    from trainers.finetune import FinetuneJob

    job = FinetuneJob.from_yaml(Path(__file__).parents[1] / "examples" / "finetune_tiny.yaml")
    cfg = job.to_experiment()
    res = dataclasses.replace(
        cfg.resources,
        num_env_runners=1,
        num_gpus_per_env_runner=0.5,
        num_learners=1,
        num_gpus_per_learner=0.5,
    )
    cfg = cfg.replace(resources=res, output=dataclasses.replace(cfg.output, dir=str(tmp_path)))
    algo = to_algorithm_config(cfg).build_algo()

    def runner_devices(runner: Any) -> list[str]:
        return sorted({str(p.device) for m in runner.module.values() for p in m.parameters()})

    try:
        runners = algo.env_runner_group.foreach_env_runner(runner_devices, local_env_runner=False)
        assert {d for devices in runners for d in devices} == {"cuda:0"}
        assert learner_devices(algo) == {"cuda:0"}
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    stats = results[-1]["learners"]["orchestrator"]
    # the first pass over a fresh batch scores it at the weights that sampled it
    assert stats["grpo/logprob_gap_fresh"] < 1e-2, stats["grpo/logprob_gap_fresh"]
