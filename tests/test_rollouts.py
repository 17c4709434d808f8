"""Rollout dumps (``output.rollouts``): compressed per-iteration files, and replaying the
learner updates of iterations 2–3 from the iteration-1 checkpoint gives the run's
iteration-3 weights bit for bit."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from configs import tiny_config

from trainers.configs.experiment import ExperimentConfig, OutputConfig
from trainers.configs.typed import ConfigError


def _weights(ckpt: Path) -> dict[str, dict[str, object]]:
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule

    modules = MultiRLModule.from_checkpoint(str(ckpt / "learner_group" / "learner" / "rl_module"))
    return {mid: dict(m.state_dict()) for mid, m in modules.items()}


def _learner_weights(algo: object) -> dict[str, dict[str, object]]:
    learner = algo.learner_group._learner  # type: ignore[attr-defined]
    return {mid: dict(m.state_dict()) for mid, m in learner.module.items()}


def _train(cfg: Any) -> tuple[Path, Path]:
    """Train ``cfg`` (3 iterations, rollouts on); the run dir and a copy of its iteration-1
    checkpoint (the run keeps only its latest and best)."""
    from trainers.run.loop import train

    keep = Path(cfg.output.dir).parent / "iter_000001"

    def report(row: dict[str, Any]) -> None:
        if row["charts/iteration"] == 2:  # before iteration 2's checkpoint replaces it
            (first,) = Path(cfg.output.dir).glob("*/checkpoints/iter_000001")
            shutil.copytree(first, keep)

    run = train(cfg.replace(**{"budget.iterations": 3, "output.rollouts": True}), report=report)
    return run.run_dir, keep


def _assert_replay_matches(run: Path, first: Path, iterations: int | None) -> None:
    """Replaying iterations 2–3 from the iteration-1 checkpoint ``first`` gives iteration 3's
    weights, which differ from iteration 1's."""
    import torch

    from trainers.rollouts import replay_updates

    algo = replay_updates(run, first, iterations=iterations)
    try:
        replayed = _learner_weights(algo)
    finally:
        algo.stop()
    expected = _weights(run / "checkpoints" / "iter_000003")
    before = _weights(first)
    assert expected and replayed.keys() == expected.keys()
    changed = []
    for mid, params in expected.items():
        assert params.keys() == replayed[mid].keys()
        for name, value in params.items():
            assert torch.equal(replayed[mid][name], value), (mid, name)
            changed.append(not torch.equal(before[mid][name], value))
    assert any(changed)


def test_rollouts_option_is_a_typed_bool_for_ppo_and_grpo(tmp_path: Path) -> None:
    assert OutputConfig().rollouts is False
    with pytest.raises(ConfigError, match=r"output\.rollouts"):
        OutputConfig(rollouts="yes")  # type: ignore[arg-type]
    cfg = tiny_config(tmp_path).replace(**{"output.rollouts": True})
    assert cfg.check() is cfg
    with pytest.raises(ConfigError, match=r"output\.rollouts=true with algorithm\.name='APPO'"):
        ExperimentConfig.from_dict({"algorithm": "APPO", "output": {"rollouts": True}}).check()


@pytest.mark.usefixtures("ray_session")
def test_replayed_updates_give_the_runs_weights_bit_for_bit(tmp_path: Path) -> None:
    from trainers.rollouts import read_arrays, replay_updates
    from trainers.run.rollout_dump import RolloutDumpError, dump_path

    run, first = _train(tiny_config(tmp_path, checkpoint_every=1))
    dumps = run / "rollouts"
    files = sorted(dumps.glob("iter_*.npz"))
    assert [f.name for f in files] == [f"iter_{i:06d}.npz" for i in (1, 2, 3)]
    arrays = read_arrays(files[0])
    logp = [k for k in arrays if k.endswith("/action_logp")]
    assert logp and all(np.isfinite(arrays[k]).all() for k in logp)
    steps = sum(len(arrays[k]) for k in arrays if k.endswith("/actions"))
    assert steps >= 128  # every agent step of the iteration's batch
    with np.load(files[0]) as data:
        raw = sum(data[k].nbytes for k in data.files)
    size = files[0].stat().st_size
    print(f"\nrollout dump {files[0].name}: {size} bytes on disk for {raw} ({size / raw:.2f})")
    assert size < raw  # compressed

    _assert_replay_matches(run, first, iterations=2)

    from typer.testing import CliRunner

    from trainers.cli import app

    cli = ["replay-updates", str(run), "--from-checkpoint", str(first), "--iterations", "2"]
    out = CliRunner().invoke(app, [*cli, "--save", str(tmp_path / "replayed")])
    assert out.exit_code == 0, out.output
    assert "replayed iterations 2–3" in out.output
    assert f"weights equal {run / 'checkpoints' / 'iter_000003'} bit for bit" in out.output
    assert (tmp_path / "replayed" / "rllib_checkpoint.json").exists()

    dump_path(dumps, 3).unlink()
    with pytest.raises(RolloutDumpError, match=r"iter_000003\.npz is missing"):
        replay_updates(run, first, iterations=2)
    dump_path(dumps, 2).write_bytes(b"not a zip")
    with pytest.raises(RolloutDumpError, match=r"iter_000002\.npz is corrupt"):
        replay_updates(run, first, iterations=2)
    out = CliRunner().invoke(app, cli)
    assert out.exit_code == 2 and "iter_000002.npz is corrupt" in out.output, out.output


@pytest.mark.usefixtures("ray_session")
def test_grpo_replay_gives_the_runs_weights_bit_for_bit(tmp_path: Path) -> None:
    grpo = {"group_size": 4, "groups_per_iteration": 2}
    algorithm = {"name": "GRPO", "num_epochs": 1, "grpo": grpo}
    pools = {"agent": {"model": {"type": "mlp"}}}
    cfg = tiny_config(
        tmp_path, algorithm=algorithm, scenario="toolchain", topology="single", pools=pools
    )
    run, first = _train(cfg)
    assert len(list((run / "rollouts").glob("iter_*.npz"))) == 3
    _assert_replay_matches(run, first, iterations=None)  # every dump after the checkpoint


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["/nonexistent-run"], "/nonexistent-run is not a run directory (no config.yaml)"),
        (["/nonexistent-run", "--iterations", "0"], "iterations=0: replay at least 1 iteration"),
    ],
)
def test_replay_command_errors_are_one_line(args: list[str], text: str) -> None:
    from typer.testing import CliRunner

    from trainers.cli import app

    res = CliRunner().invoke(app, ["replay-updates", *args], env={"COLUMNS": "1000"})
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], res.output


def test_replay_of_a_missing_checkpoint_names_it(tmp_path: Path) -> None:
    from trainers.rollouts import replay_updates
    from trainers.run.rollout_dump import RolloutDumpError

    (tmp_path / "config.yaml").write_text("{}\n")
    with pytest.raises(RolloutDumpError, match=r"no checkpoint under"):
        replay_updates(tmp_path)
    with pytest.raises(RolloutDumpError, match=r"checkpoint /nonexistent is missing"):
        replay_updates(tmp_path, "/nonexistent")


def test_marl_run_rollouts_flag_sets_the_option() -> None:
    from typer.testing import CliRunner

    from trainers.cli import app

    out = CliRunner().invoke(app, ["run", "delegate", "--rollouts", "--dump"])
    assert out.exit_code == 0, out.output
    assert ExperimentConfig.from_yaml(out.output).output.rollouts is True
