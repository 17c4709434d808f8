"""Asynchronous GRPO sampling: config errors, the staleness bound, an async run through
``train()`` (tiny model, one remote env runner), exact resume, and the sync path unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainers.configs.experiment import ExperimentConfig
from trainers.configs.grpo import AsyncSampling
from trainers.configs.typed import ConfigError
from trainers.finetune import FinetuneJob, TrainingConfig
from trainers.grpo.async_sampling import POLICY_VERSION, SamplePipeline, shares

STALENESS = ("grpo/staleness_mean", "grpo/staleness_max", "grpo/stale_dropped")


def grpo_experiment(tmp_path: Path, name: str, iterations: int = 3, **changes: Any) -> Any:
    """Tiny orchestrator on text-delegate easy, 2 groups of 2 an iteration, checkpoint each."""
    job = FinetuneJob(training=TrainingConfig(group_size=2, groups_per_iteration=2, lr=1e-2))
    job.budget.iterations = iterations
    job.output.dir, job.output.name = str(tmp_path), name
    job.output.export_hf, job.output.checkpoint_every = False, 1
    job.logging.progress, job.logging.wandb = False, "disabled"
    return job.to_experiment().replace(**changes)


ASYNC = {"algorithm.grpo.async_sampling.enabled": True, "resources.num_env_runners": 1}


# ----- config -------------------------------------------------------------------------------
def test_async_config_round_trips_and_defaults_off(tmp_path: Path) -> None:
    cfg = grpo_experiment(tmp_path, "x", **ASYNC)
    assert cfg.algorithm.grpo.async_sampling == AsyncSampling(enabled=True, max_staleness=1)
    assert ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg.check()
    assert grpo_experiment(tmp_path, "y").algorithm.grpo.async_sampling.enabled is False


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"resources.num_env_runners": 0}, r"async_sampling.enabled=true with resources.num_env_"),
        ({"algorithm.grpo.async_sampling.max_staleness": 0}, r"max_staleness=0: must be ≥ 1"),
        ({"algorithm.grpo.async_sampling.enabled": "yes"}, r"async_sampling.enabled"),
    ],
)
def test_async_config_errors_name_the_field(tmp_path: Path, changes: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        grpo_experiment(tmp_path, "x", **{**ASYNC, **changes}).check()
    assert "\n" not in str(err.value)


def test_rllib_config_rejects_async_without_remote_runners() -> None:
    from trainers.grpo.algorithm import GRPOAlgorithmConfig

    cfg = GRPOAlgorithmConfig().grpo(async_sampling=True).env_runners(num_env_runners=0)
    with pytest.raises(ValueError, match="num_env_runners >= 1"):
        cfg.validate()


# ----- the staleness bound (real RLlib episodes, no Ray) ------------------------------------
def episodes_of(versions: list[int]) -> list[Any]:
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    out = []
    for v in versions:
        episode = MultiAgentEpisode()
        episode.custom_data[POLICY_VERSION] = v
        out.append(episode)
    return out


def test_pipeline_drops_and_counts_episodes_over_the_bound() -> None:
    pipe = SamplePipeline(max_staleness=1, learner_version=3, runner_version=3)
    kept, stats = pipe.filter(episodes_of([3, 2, 1, 0, 2]))
    assert [e.custom_data[POLICY_VERSION] for e in kept] == [3, 2, 2]
    assert stats == {
        "grpo/staleness_mean": pytest.approx((0 + 1 + 2 + 3 + 1) / 5),
        "grpo/staleness_max": 3.0,  # what was sampled; nothing over 1 is learnt from
        "grpo/stale_dropped": 2.0,
    }


@pytest.mark.parametrize("bound", [1, 2, 3])
def test_syncs_keep_every_batch_within_the_bound(bound: int) -> None:
    """The schedule of ``GRPO._training_step_async``: launch at the runners' version, learn,
    sync when ``needs_sync``; the batch launched in iteration k is learnt in iteration k+1."""
    pipe = SamplePipeline(max_staleness=bound)
    launched, syncs = None, 0
    for _ in range(12):
        if launched is not None:
            assert 1 <= pipe.learner_version - launched <= bound
        launched = pipe.runner_version
        pipe.learner_version += 1
        if pipe.needs_sync():
            pipe.runner_version, syncs = pipe.learner_version, syncs + 1
    assert syncs == 12 // bound  # weights move only as often as the bound needs


def test_shares_split_episodes_over_runners() -> None:
    assert shares(8, 3) == [3, 3, 2] and sum(shares(5, 2)) == 5


# ----- runs through train() -----------------------------------------------------------------
def weights(run: Path) -> dict[str, np.ndarray]:
    """The trained orchestrator's weights in the run's newest checkpoint."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    from trainers.run.rundir import find_checkpoint

    ckpt, _ = find_checkpoint(run)
    path = ckpt / "learner_group" / "learner" / "rl_module" / "orchestrator"
    return {k: np.array(v) for k, v in RLModule.from_checkpoint(str(path)).get_state().items()}


def rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def untimed(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    timed = ("time", "_s", "per_s")
    return [{k: v for k, v in h.items() if not any(t in k for t in timed)} for h in history]


# staleness bound 2 behind --slow (~40 s of the default suite's budget); bound 1 stays in it
@pytest.fixture(
    scope="module", params=[1, pytest.param(2, marks=pytest.mark.slow)], ids=["bound1", "bound2"]
)
def async_run(request: Any, tmp_path_factory: Any, ray_session: Any) -> tuple[Any, Any]:
    """3 async iterations with ``max_staleness`` 1 (a sync after every update) and 2 (after
    every other: the runners lag the learner after iterations 1 and 3)."""
    from trainers.run.loop import train

    tmp = tmp_path_factory.mktemp("async")
    bound = {"algorithm.grpo.async_sampling.max_staleness": request.param}
    cfg = grpo_experiment(tmp, "full", **ASYNC, **bound)
    return cfg, train(cfg)


def test_async_run_logs_staleness_within_the_bound(async_run: Any) -> None:
    cfg, result = async_run
    bound = cfg.algorithm.grpo.async_sampling.max_staleness
    assert result.status == "completed"
    assert [h["charts/iteration"] for h in result.history] == [1, 2, 3]
    key = "losses/orchestrator/grpo/staleness_max"
    learnt = [h for h in result.history if key in h]
    assert learnt, "no update logged staleness"
    for h in learnt:
        assert 0 <= h["losses/orchestrator/grpo/staleness_mean"] <= h[key] <= bound
        assert h["losses/orchestrator/grpo/stale_dropped"] == 0
    assert any(h[key] == bound for h in learnt)  # the overlapped batches reach the bound
    assert all(h["charts/episodes"] == 4 for h in result.history)


class Stop(Exception):
    """Raised from ``report`` to stop a run after a given iteration."""


def assert_resumes_exactly(cfg: Any, full: Any, stop: int, tmp_path: Path) -> None:
    """``cfg`` stopped after iteration ``stop`` and resumed gives ``full``'s metrics and
    weights."""
    from trainers.run.loop import train

    def stop_after(row: dict[str, Any]) -> None:
        if row["charts/iteration"] == stop:
            raise Stop

    with pytest.raises(Stop):
        train(cfg.replace(**{"output.dir": str(tmp_path)}), report=stop_after)
    part = tmp_path / cfg.output.name
    assert [r["charts/iteration"] for r in rows(part)] == list(range(1, stop + 1))
    resumed = train(resume=part)
    assert resumed.status == "completed"
    assert untimed(rows(part)) == untimed(rows(full.run_dir))
    wa, wb = weights(part), weights(full.run_dir)
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)


def test_async_run_resumes_exactly(async_run: Any, tmp_path: Path) -> None:
    """Stopped (the batch sampled ahead is in the checkpoint; with bound 2 after iteration 1,
    the runners one update behind the learner) and resumed: the uninterrupted run."""
    cfg, full = async_run
    stop = 2 if cfg.algorithm.grpo.async_sampling.max_staleness == 1 else 1
    assert_resumes_exactly(cfg, full, stop, tmp_path)


@pytest.mark.usefixtures("ray_session")
def test_sync_grpo_run_resumes_exactly(tmp_path: Path) -> None:
    """The GRPO env's task-seed stream is in the checkpoint: a resumed run samples the tasks
    the uninterrupted one would have (before, it drew them from the start of the stream)."""
    from trainers.run.loop import train

    cfg = grpo_experiment(tmp_path / "full", "sync")
    assert_resumes_exactly(cfg, train(cfg), 1, tmp_path / "part")


@pytest.mark.usefixtures("ray_session")
def test_sync_run_unchanged_when_the_option_is_off(tmp_path: Path) -> None:
    """Off (the default) and off with another bound run the same sync loop bit for bit, and
    log no staleness."""
    from trainers.run.loop import train

    off = "algorithm.grpo.async_sampling.max_staleness"
    a = train(grpo_experiment(tmp_path, "a", iterations=2))
    b = train(grpo_experiment(tmp_path, "b", iterations=2, **{off: 4}))
    assert untimed(a.history) == untimed(b.history)
    assert not any(k.endswith(STALENESS) for h in a.history for k in h)
    wa, wb = weights(a.run_dir), weights(b.run_dir)
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
