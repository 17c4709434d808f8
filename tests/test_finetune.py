"""Fine-tuning jobs: YAML round trip, every config error, a 2-iteration run, the CLI, learning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainers.configs.experiment import BudgetConfig, OutputConfig
from trainers.configs.typed import ConfigError
from trainers.finetune import (
    FinetuneJob,
    OrchestratorConfig,
    SubagentConfig,
    TrainingConfig,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "finetune_tiny.yaml"


def small_job(tmp_path, **changes) -> FinetuneJob:
    job = FinetuneJob(
        training=TrainingConfig(group_size=2, groups_per_iteration=2, lr=1e-3),
        budget=BudgetConfig(iterations=2),
        output=OutputConfig(dir=str(tmp_path), name="smoke", export_hf=True),
    )
    job.logging.progress = False
    job.logging.wandb = "disabled"
    for key, value in changes.items():
        setattr(job, key, value)
    return job


# ----- YAML ----------------------------------------------------------------------------------
def test_yaml_round_trip_default_and_example():
    job = FinetuneJob()
    assert FinetuneJob.from_yaml(job.to_yaml()) == job
    example = FinetuneJob.from_yaml(EXAMPLE)
    assert example.orchestrator.model == "tiny" and example.topology == "star:8"
    assert FinetuneJob.from_yaml(example.to_yaml()) == example
    example.check()


def test_yaml_shorthands_and_full_round_trip(tmp_path):
    job = FinetuneJob.from_yaml(
        "orchestrator: tiny\nsubagents: [scripted, {type: hf, path: tiny, seed: 3}, scripted]\n"
        "topology: star:3\ngrpo: {clip_high: 0.3, length_budget: 6, loss_agg: seq_mean_token_sum}\n"
    )
    assert job.orchestrator == OrchestratorConfig(model="tiny")
    assert [s.type for s in job.subagents] == ["scripted", "hf", "scripted"]
    assert job.grpo.clip_high == 0.3 and job.grpo.length_budget == 6.0
    path = tmp_path / "job.yaml"
    job.to_yaml(path)
    assert FinetuneJob.from_yaml(path) == job
    job.check()


def test_lora_orchestrator_and_async_sampling_reach_the_experiment():
    job = FinetuneJob.from_yaml(
        "orchestrator: {model: tiny, lora: {r: 4, alpha: 8}}\nsubagents: [scripted]\n"
        "training: {async_sampling: {enabled: true, max_staleness: 2}}\n"
        "resources: {num_env_runners: 1}\n"
    )
    assert FinetuneJob.from_yaml(job.to_yaml()) == job
    exp = job.check().to_experiment()
    model = exp.pools["orchestrator"].model
    assert model.is_lora and (model.lora.r, model.lora.alpha) == (4, 8.0)
    assert exp.algorithm.grpo.async_sampling.enabled
    assert exp.algorithm.grpo.async_sampling.max_staleness == 2


# ----- config errors -------------------------------------------------------------------------
ERRORS = [
    ("orchestrator:\n  model: /nonexistent/model\n", "save_pretrained"),
    ("orchestrator:\n  temperature: 0\n", "greedy decoding"),
    ("orchestrator:\n  top_p: 1.5\n", "top_p"),
    ("orchestrator:\n  dtype: int8\n", "float32, bfloat16 or float16"),
    ("subagents: []\n", "subagents is empty"),
    ("subagents: [gpt]\n", "is not one of"),
    ("subagents: [{type: hf}]\n", "needs 'path'"),
    ("subagents: [{type: hf, path: /nonexistent}]\n", "config.json"),
    ("subagents: [{type: vllm, url: 'http://localhost:8000'}]\n", "served model name"),
    ("subagents: [scripted, scripted, scripted]\ntopology: star:2\n", "3 specs for 2 workers"),
    ("scenario_kwargs: {tokenizer: tiny}\n", "set orchestrator.model"),
    ("scenario_kwargs: {level: hard}\n", "level must be one of"),
    ("scenario: delegate\n", "text scenario"),
    ("scenario: nope\n", "unknown scenario"),
    ("topology: chain:3\n", "star:N"),
    ("training: {group_size: 1}\n", "≥ 2 rollouts per task"),
    ("training: {groups_per_iteration: 0}\n", "groups_per_iteration"),
    ("training: {lr: -1}\n", "training.lr"),
    ("training: {num_epochs: 0}\n", "num_epochs"),
    ("training: {minibatch_size: 1000}\n", "minibatch_size"),
    ("training: {grad_clip: 0}\n", "grad_clip"),
    ("orchestrator:\n  lora: {r: 0}\n", "lora.r=0"),
    ("orchestrator:\n  lora: {rank: 4}\n", r"unknown field\(s\) \['rank'\]"),
    ("training: {async_sampling: {enabled: true}}\n", "num_env_runners"),
    ("grpo: {clip_low: 1.5}\n", "clip_low"),
    ("grpo: {loss_agg: mean}\n", "loss_agg"),
    ("grpo: {bogus: 1}\n", "unknown field"),
    ("budget: {iterations: null, time_s: null}\n", "budget has no limit"),
    ("budget: {iterations: -2}\n", "budget.iterations"),
    ("resources: {num_gpus_per_learner: 1}\n", "num_learners=1"),
    ("resources: {num_env_runners: 64}\n", "lower resources.num_env_runners"),
    ("resources: {num_cpus: 100000}\n", "resources.num_cpus"),
    ("logging: {wandb: cloud}\n", "logging.wandb"),
    ("seed: -1\n", "seed must be"),
    ("colour: blue\n", "unknown field"),
    ("- a list\n", "must be a mapping"),
]


@pytest.mark.parametrize(("text", "match"), ERRORS, ids=[m for _, m in ERRORS])
def test_every_config_error_names_the_fix(text, match):
    with pytest.raises(ConfigError, match=match):
        FinetuneJob.from_yaml(text).check()


def test_gpus_requested_but_absent(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    job = FinetuneJob.from_yaml("resources: {num_learners: 1, num_gpus_per_learner: 1}\n")
    with pytest.raises(ConfigError, match=r"no GPU.*num_gpus_per_learner=0"):
        job.check()


def test_export_hf_needs_a_trained_llm_pool():
    from trainers.configs.experiment import ExperimentConfig
    from trainers.run.loop import train

    cfg = ExperimentConfig(scenario="delegate", output=OutputConfig(export_hf=True))
    with pytest.raises(ConfigError, match=r"output\.export_hf=true but no trained pool is an LLM"):
        train(cfg)  # raised before Ray starts or a run directory exists


def test_cli_needs_a_job_or_a_run_to_resume(tmp_path):
    from typer.testing import CliRunner

    from trainers.cli import app

    out = CliRunner().invoke(app, ["finetune"])
    assert out.exit_code == 2 and "--resume RUN_DIR" in out.output
    out = CliRunner().invoke(app, ["finetune", "--resume", str(tmp_path)])
    assert out.exit_code == 2 and "no algorithm checkpoint" in out.output


def test_missing_job_file():
    with pytest.raises(ConfigError, match="does not exist"):
        FinetuneJob.from_yaml("/nonexistent/job.yaml")


# ----- a short run ---------------------------------------------------------------------------
def digit_model(path: Path) -> Path:
    """The tiny model nudged (a few supervised steps) to answer the easy prompt with a digit.

    A random tiny model almost never writes a valid worker number, so every reward of a short
    run would be equal and GRPO would (rightly) not move the weights. Also exercises the
    ``orchestrator.model: <directory>`` path.
    """
    import numpy as np

    from marl_agents.llm.tiny import make_tiny_model
    from scenarios.text_delegate import TextDelegate

    tok, model = make_tiny_model(seed=0)
    scenario = TextDelegate("star:8")
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(8)]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(0)
    for step in range(40):
        state = scenario.initial_state(np.random.default_rng(step))
        prompt = scenario.prompt_ids(state)
        answers = torch.tensor(digits)[torch.as_tensor(rng.permutation(8))]
        ids = torch.tensor([[*prompt, int(d), tok.eos_token_id] for d in answers])
        logits = model(ids).logits[:, len(prompt) - 1 : len(prompt) + 1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 ids[:, len(prompt) :].reshape(-1))  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, ray_session):
    """2 iterations (8 episodes each) of a digit-nudged tiny orchestrator loaded from a
    directory; a frozen HF subagent (tiny, seed 1) serves worker 0, scripted ones the rest."""
    from trainers.finetune import run_finetune

    tmp = tmp_path_factory.mktemp("finetune")
    job = small_job(
        tmp,
        orchestrator=OrchestratorConfig(model=str(digit_model(tmp / "start"))),
        subagents=[SubagentConfig(type="hf", path="tiny", seed=1)] + [SubagentConfig()] * 7,
        training=TrainingConfig(group_size=4, groups_per_iteration=2, lr=1e-3),
    )
    job.output.checkpoint_every = 1  # periodic checkpoints hold HF weights too
    os.environ["WANDB_MODE"] = "offline"
    job.logging.wandb = "offline"
    try:
        result = run_finetune(job)
    finally:
        os.environ["WANDB_MODE"] = "disabled"
    return job, result


def test_smoke_run_writes_artifacts_and_metrics(smoke_run):
    job, result = smoke_run
    run = result.run_dir
    assert result.summary["status"] == "completed" and result.summary["iterations"] == 2
    for name in ("job.yaml", "metrics.jsonl", "summary.json", "model", "checkpoint", "wandb"):
        assert (run / name).exists(), name
    assert result.model_dir == run / "model" / "orchestrator"
    assert FinetuneJob.from_yaml(run / "job.yaml") == job
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["charts/iteration"] for r in rows] == [1, 2]
    assert all("charts/team_return" in r and "charts/format_ok" in r for r in rows)
    assert rows[0]["charts/episodes"] == job.episodes_per_iteration
    assert "losses/orchestrator/grpo/logprob_gap_fresh" in rows[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model_dir"] == str(result.model_dir)
    assert summary["models"] == {"orchestrator": str(result.model_dir)}


def test_smoke_run_tracks_the_best_checkpoint_with_its_hf_weights(smoke_run):
    from transformers import AutoModelForCausalLM

    _, result = smoke_run
    best = result.best_checkpoint
    assert best is not None and result.summary["best_checkpoint"] == str(best)
    assert (best / "algorithm_state.pkl").exists()
    if best != result.final_checkpoint:  # a periodic one: its own HF export
        AutoModelForCausalLM.from_pretrained(best / "model" / "orchestrator")
    periodic = sorted((result.run_dir / "checkpoints").iterdir())
    assert periodic
    for path in periodic:
        assert (path / "model" / "orchestrator" / "config.json").exists(), path


def test_smoke_run_logprob_agreement_at_the_start_of_each_update(smoke_run):
    _, result = smoke_run
    assert result.summary["logprob_gap_fresh_max"] < 1e-4


def test_smoke_run_saves_trained_weights_in_hf_format(smoke_run):
    from transformers import AutoModelForCausalLM

    job, result = smoke_run
    saved = AutoModelForCausalLM.from_pretrained(result.model_dir)
    initial = AutoModelForCausalLM.from_pretrained(job.orchestrator.model)
    changed = [
        k for k, v in saved.state_dict().items() if not torch.equal(v, initial.state_dict()[k])
    ]
    assert changed  # the orchestrator learned something


def test_smoke_run_frozen_subagent_weights_bit_identical(smoke_run):
    from marl_agents.llm.subagents import HF_CACHE
    from marl_agents.llm.tiny import make_tiny_model

    _, fresh = make_tiny_model(seed=1)
    served = HF_CACHE[("tiny", 1)].model  # the subagent the env runner used
    for (name, a), (_, b) in zip(
        served.state_dict().items(), fresh.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_smoke_run_checkpoint_restores_the_same_weights(smoke_run):
    from ray.rllib.algorithms.algorithm import Algorithm
    from transformers import AutoModelForCausalLM

    _, result = smoke_run
    algo = Algorithm.from_checkpoint(str(result.final_checkpoint))
    try:
        module = algo.get_module("orchestrator")
        saved = AutoModelForCausalLM.from_pretrained(result.model_dir).state_dict()
        for k, v in module.model.state_dict().items():
            assert torch.equal(v, saved[k]), k
        assert algo.iteration == 2
    finally:
        algo.stop()


# ----- the CLI -------------------------------------------------------------------------------
def test_cli_dump_and_errors(tmp_path):
    from typer.testing import CliRunner

    from trainers.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["finetune", str(EXAMPLE), "--dump", "--iterations", "3"])
    assert out.exit_code == 0, out.output
    assert FinetuneJob.from_yaml(out.output).budget.iterations == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("training: {group_size: 1}\n")
    out = runner.invoke(app, ["finetune", str(bad)])
    assert out.exit_code == 2 and "rollouts per task" in out.output


def finetune_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m trainers.cli finetune ARGS`` with wandb off and a fixed hash seed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "trainers.cli", "finetune", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )


def test_cli_runs_a_job_then_resumes_it_as_a_subprocess(tmp_path, ray_session):
    """``marl finetune JOB`` (in this process, on the session's Ray), then ``--resume`` in a
    process of its own, as a user runs it."""
    from typer.testing import CliRunner

    from trainers.cli import app

    job = small_job(tmp_path)
    job.budget.iterations = 1
    path = tmp_path / "job.yaml"
    job.to_yaml(path)
    out = CliRunner().invoke(app, ["finetune", str(path), "--wandb", "disabled"])
    assert out.exit_code == 0, out.output
    run = tmp_path / "smoke"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["iterations"] == 1
    # --resume continues the run (its own job.yaml) to the larger budget
    proc = finetune_cli("--resume", str(run), "--iterations", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["iterations"] == 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["charts/iteration"] for r in rows] == [1, 2]
    assert FinetuneJob.from_yaml(run / "job.yaml").budget.iterations == 2
    assert summary["model_dir"] == str(run / "model" / "orchestrator")


# ----- learning (slow) -----------------------------------------------------------------------
@pytest.mark.slow
def test_tiny_orchestrator_learns_the_easy_task(tmp_path, ray_session):
    """The example job, 3 seeds: the mean reward of the last 3 iterations beats the first 3."""
    from trainers.finetune import run_finetune

    results = []
    for seed in range(3):
        job = FinetuneJob.from_yaml(EXAMPLE)
        job.seed, job.orchestrator.tiny_seed = seed, seed
        job.output.dir, job.output.name = str(tmp_path), f"learn-{seed}"
        job.logging.wandb, job.logging.progress = "disabled", False
        s = run_finetune(job).summary
        results.append((s["reward_first"], s["reward_last"], s["iteration_s_mean"]))
    print("first / last / s per iteration:", results)
    for first, last, _ in results:
        assert last - first > 0.3 and last > 0.25
