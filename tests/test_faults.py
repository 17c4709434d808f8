"""Faults a long run must survive, on real Ray: a killed env runner, an interrupted run resumed
exactly, an output directory that cannot be written (read-only, a file, a full disk).

Cheap cases run by default; the CLI ones (a real ``marl run`` interrupted by SIGINT, a full
tmpfs) are ``slow``. The tmpfs cases need root (``mount``) and are skipped otherwise. No
wall-clock thresholds: assertions are about what was written.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_train import tiny as tiny_run
from test_train_cli import TIMING, weights

from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def tiny(tmp_path: Path, **changes: Any) -> ExperimentConfig:
    """Default delegate (star:2, team credit, truncated episodes), 4 iterations of ~a second."""
    base = {"budget.iterations": 4, "output.checkpoint_every": 0, "output.plot": False}
    return tiny_run(tmp_path, **{**base, **changes})


def rows(run: Path) -> list[dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def untimed(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for module in wa:
        for key in wa[module]:
            assert np.array_equal(wa[module][key], wb[module][key]), (module, key)


# ----- no Ray -------------------------------------------------------------------------------
def test_metrics_of_an_iteration_whose_runner_died() -> None:
    """RLlib reports NaN/missing counters when no runner returned samples: no crash."""
    from trainers.run.metrics import flatten_result

    nan = float("nan")
    result = {
        "training_iteration": 3,
        "time_total_s": 4.5,
        "time_this_iter_s": 1.5,
        "num_env_steps_sampled_lifetime": nan,
        "env_runners": {"marl": {"episodes": nan, "team_return": nan}, "episode_len_mean": nan},
        "learners": {},
    }
    row = flatten_result(result, {"orchestrator": "orchestrator"}, set())
    assert row["charts/iteration"] == 3 and row["charts/episodes"] == 0
    assert row["charts/env_steps"] == 0 and row["charts/time_s"] == 4.5
    assert all(not (isinstance(v, float) and math.isnan(v)) for v in row.values())
    assert flatten_result({}, {}, set())["charts/episodes"] == 0


def test_resume_picks_the_newest_checkpoint(tmp_path: Path) -> None:
    from trainers.run.rundir import find_checkpoint

    run = tmp_path / "run"
    for name, it in (("checkpoint", 2), ("checkpoints/iter_000003", 3), ("checkpoint.partial", 4)):
        (run / name).mkdir(parents=True)
        (run / name / "algorithm_state.pkl").write_bytes(b"")
        (run / name / "marl_state.json").write_text(json.dumps({"iteration": it}))
    assert find_checkpoint(run) == (run / "checkpoints" / "iter_000003", run)
    (run / "checkpoint" / "marl_state.json").write_text(json.dumps({"iteration": 5}))
    assert find_checkpoint(run)[0] == run / "checkpoint"
    with pytest.raises(ConfigError, match="no algorithm checkpoint"):
        find_checkpoint(tmp_path)


@contextlib.contextmanager
def tmpfs(path: Path, *options: str) -> Iterator[Path]:
    """A small tmpfs at ``path`` (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)], check=True
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_unwritable_output_is_a_config_error_before_ray(tmp_path: Path) -> None:
    import ray

    from trainers.run.loop import train

    started = ray.is_initialized()
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match=r"output.dir='.*a_file' is a file, not a directory"):
        train(tiny(tmp_path, **{"output.dir": str(a_file)}))
    with pytest.raises(ConfigError, match=r"Not a directory.*choose a writable directory"):
        train(tiny(tmp_path, **{"output.dir": str(a_file / "sub")}))
    if os.geteuid() == 0:
        ctx = tmpfs(tmp_path / "ro", "ro", "size=64k")
    else:
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
        ctx = contextlib.nullcontext(tmp_path / "ro")
    with ctx as ro, pytest.raises(ConfigError, match=r"output.dir=.*cannot write a run there"):
        train(tiny(tmp_path, **{"output.dir": str(ro)}))
    assert ray.is_initialized() == started  # every case failed before Ray started


# ----- real Ray -----------------------------------------------------------------------------
def env_runner_pids() -> list[int]:
    """PIDs of the live env-runner actors of this test session's Ray."""
    from ray._private import state

    return [
        int(a["Pid"])
        for a in state.actors().values()
        if a["State"] == "ALIVE" and "EnvRunner" in a["ActorClassName"]
    ]


@pytest.mark.usefixtures("ray_session")
def test_run_survives_a_killed_env_runner(tmp_path: Path) -> None:
    from trainers.run.loop import train

    killed: list[int] = []

    def kill_after_first(row: dict[str, Any]) -> None:
        if row["charts/iteration"] == 1:
            pids = env_runner_pids()
            assert len(pids) == 1, pids
            os.kill(pids[0], signal.SIGKILL)
            killed.extend(pids)

    cfg = tiny(tmp_path, **{"resources.num_env_runners": 1, "budget.iterations": 3})
    result = train(cfg, report=kill_after_first)
    assert killed and result.status == "completed"
    assert [r["charts/iteration"] for r in rows(result.run_dir)] == [1, 2, 3]
    assert [r["charts/iteration"] for r in result.history] == [1, 2, 3]
    steps = [r["charts/env_steps"] for r in result.history]
    assert steps == sorted(steps) and steps[0] > 0


class Stop(Exception):
    """Raised from ``report`` to stop a run after a given iteration."""


@pytest.mark.usefixtures("ray_session")
def test_stopped_run_resumes_as_if_never_stopped(tmp_path: Path) -> None:
    """Default delegate, the env runner in the driver: a run stopped by an exception after
    iteration 2 and resumed gives the uninterrupted run's metrics (timing aside) and final
    weights. (Remote env runners: the CLI test below, whose Ray workers get a fixed
    ``PYTHONHASHSEED``, which runs with remote runners need to be reproducible at all.)"""
    from trainers.run.loop import train

    full = train(tiny(tmp_path, **{"output.name": "full"}))

    def stop_after_two(row: dict[str, Any]) -> None:
        if row["charts/iteration"] == 2:
            raise Stop

    with pytest.raises(Stop):
        train(tiny(tmp_path, **{"output.name": "part"}), report=stop_after_two)
    part = tmp_path / "runs" / "part"
    assert [r["charts/iteration"] for r in rows(part)] == [1, 2]
    assert json.loads((part / "summary.json").read_text())["status"].startswith("failed: Stop")
    resumed = train(resume=part)
    assert resumed.status == "completed"
    assert untimed(rows(part)) == untimed(rows(full.run_dir))
    times = [r["charts/time_s"] for r in rows(part)]
    assert times == sorted(times)  # the wall clock continues, it does not restart
    assert_same_weights(part, full.run_dir)


@pytest.mark.usefixtures("ray_session")
def test_checkpoint_never_runs_ahead_of_the_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure inside an iteration (here: writing its metrics) saves no checkpoint of it:
    resume redoes that iteration, with one metrics row per iteration."""
    from trainers.run import loop as run_module
    from trainers.run.loop import train

    calls = {"n": 0}
    original = run_module.append_row

    def fail_on_third(file: Any, row: dict[str, Any]) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("metrics lost")
        original(file, row)

    cfg = tiny(tmp_path, **{"output.checkpoint_every": 1, "output.name": "r"})
    monkeypatch.setattr(run_module, "append_row", fail_on_third)
    with pytest.raises(RuntimeError, match="metrics lost"):
        train(cfg)
    monkeypatch.undo()
    run = tmp_path / "runs" / "r"
    assert [r["charts/iteration"] for r in rows(run)] == [1, 2]
    from trainers.run.resume import checkpoint_iteration
    from trainers.run.rundir import find_checkpoint

    ckpt, _ = find_checkpoint(run)
    assert checkpoint_iteration(ckpt) == 2
    resumed = train(resume=run)
    assert (
        [r["charts/iteration"] for r in rows(run)]
        == [1, 2, 3, 4]
        == [h["charts/iteration"] for h in resumed.history]
    )


# ----- the CLI (slow) -------------------------------------------------------------------------
TINY_YAML = """
topology: star:2
algorithm: {train_batch_size: 128, minibatch_size: 64, num_epochs: 1}
resources: {num_envs_per_env_runner: 2}
output: {checkpoint_every: 0}
logging: {progress: false}
"""


def marl(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainers.cli", "run", *args]


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["PYTHONHASHSEED"] = "0"
    env["COLUMNS"] = "400"
    return env


@pytest.mark.slow
@pytest.mark.parametrize("runners", [0, 1])
def test_sigint_then_resume_cli_is_exact(tmp_path: Path, runners: int) -> None:
    """``marl run`` stopped by SIGINT, then ``--resume``: the uninterrupted run's metrics and
    weights, with the env runner in the driver or in a process of its own."""
    config = tmp_path / "tiny.yaml"
    resources = f"num_envs_per_env_runner: 2, num_env_runners: {runners}"
    yaml = textwrap.dedent(TINY_YAML).replace("num_envs_per_env_runner: 2", resources)
    config.write_text(yaml)
    common = ["--config", str(config), "--iterations", "8", "--wandb", "disabled"]
    subprocess.run(marl(*common, "--output", str(tmp_path / "full")), env=cli_env(), check=True)
    (full,) = list((tmp_path / "full").iterdir())
    proc = subprocess.Popen(
        marl(*common, "--output", str(tmp_path / "part")),
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics: list[Path] = []
    while not metrics or len(metrics[0].read_text().splitlines()) < 2:
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.2)
        metrics = list((tmp_path / "part").glob("*/metrics.jsonl"))
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, out
    part = metrics[0].parent
    stopped = len(rows(part))
    assert 2 <= stopped < 8 and "Traceback" not in out
    res = subprocess.run(marl("--resume", str(part)), env=cli_env(), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert untimed(rows(part)) == untimed(rows(full))
    assert_same_weights(part, full)


@pytest.mark.slow
def test_full_disk_is_one_error_and_a_summary(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(
        textwrap.dedent(TINY_YAML).replace("checkpoint_every: 0", "checkpoint_every: 1")
    )
    with tmpfs(tmp_path / "full", "size=1m") as out:
        args = ["--config", str(config), "--iterations", "20", "--output", str(out)]
        res = subprocess.run(
            marl(*args, "--wandb", "offline"), env=cli_env(), capture_output=True, text=True
        )
        assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
        text = res.stdout + res.stderr
        assert "Traceback" not in text, text[-3000:]
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "No space left on device" in errors[0], text[-3000:]
        (run,) = list(out.iterdir())
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"].startswith("failed: OutputError: cannot write the run")
        assert not list(run.glob("**/*.partial"))  # the half-written checkpoint was removed


def test_only_output_errors_become_output_errors(tmp_path: Path) -> None:
    import errno

    from trainers.run.outcome import OutputError, output_error

    def chained(inner: BaseException) -> RuntimeError:
        outer = RuntimeError("wrapped")
        outer.__cause__ = inner
        return outer

    full = output_error(chained(OSError(errno.ENOSPC, "No space left on device")), tmp_path)
    assert isinstance(full, OutputError) and "No space left on device" in str(full)
    mine = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "metrics.jsonl"))
    assert isinstance(output_error(mine, tmp_path), OutputError)
    theirs = PermissionError(errno.EACCES, "Permission denied", "/etc/shadow")
    assert output_error(chained(theirs), tmp_path) is None
    assert output_error(ValueError("x"), tmp_path) is None
