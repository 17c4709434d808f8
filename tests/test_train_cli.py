"""The real ``marl run`` as subprocesses with a tiny budget: artifacts and same-seed determinism.

Two runs with the same seed start at once (each its own Ray); neither sets ``PYTHONHASHSEED``,
so this also covers the CLI re-executing itself with a fixed hash seed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from trainers.configs.experiment import ExperimentConfig
from trainers.signals.phase_timers import TIMER_KEYS

# the `marl` console script (trainers.cli:app); -P (3.11+): like a console script, no cwd on
# sys.path
MARL = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-m", "trainers.cli"]
TIMING = ("charts/time_s", "charts/iteration_s", "charts/env_steps_per_s", *TIMER_KEYS)

TINY_YAML = """
topology: star:2
algorithm: {train_batch_size: 128, minibatch_size: 64, num_epochs: 1}
resources: {num_envs_per_env_runner: 2}
output: {checkpoint_every: 0}
"""


def cli_env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "PYTEST_CURRENT_TEST")
    }
    env["COLUMNS"] = "120"
    return env


def only_run(out: Path) -> Path:
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def weights(run: Path) -> dict[str, dict[str, np.ndarray]]:
    from ray.rllib.core.rl_module.rl_module import RLModule

    root = run / "checkpoint" / "learner_group" / "learner" / "rl_module"
    out = {}
    for module in sorted(p.name for p in root.iterdir() if p.is_dir()):
        state = RLModule.from_checkpoint(str(root / module)).get_state()
        out[module] = {k: np.array(v) for k, v in state.items()}
    return out


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    base = tmp_path_factory.mktemp("cli")
    config = base / "tiny.yaml"
    config.write_text(textwrap.dedent(TINY_YAML))
    procs, outs = [], []
    for name in ("a", "b"):
        out = base / name
        args = [*MARL, "run", "delegate", "--config", str(config), "--iterations", "2"]
        args += ["--seed", "3", "--output", str(out), "--wandb", "disabled"]
        procs.append(subprocess.Popen(args, env=cli_env(), stdout=subprocess.PIPE, text=True))
        outs.append(out)
    logs = []
    for p in procs:
        stdout, _ = p.communicate(timeout=600)
        logs.append(stdout)
        assert p.returncode == 0, stdout
    return only_run(outs[0]), only_run(outs[1]), logs


def test_cli_run_writes_everything(two_runs: tuple[Path, Path, list[str]]) -> None:
    run, _, logs = two_runs
    assert run.name.startswith("delegate__PPO__3__")
    cfg = ExperimentConfig.from_yaml(run / "config.yaml")
    assert (cfg.seed, cfg.budget.iterations, cfg.topology) == (3, 2, "star:2")
    for name in ("metrics.jsonl", "summary.json", "curve.png", "checkpoint"):
        assert (run / name).exists(), name
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert "run summary" in logs[0] and "fraction of oracle" in logs[0]


def test_same_seed_gives_the_same_run(two_runs: tuple[Path, Path, list[str]]) -> None:
    a, b, _ = two_runs

    def rows(run: Path) -> list[dict[str, float]]:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if k not in TIMING} for x in lines]

    assert rows(a) == rows(b)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for module in wa:
        for key in wa[module]:
            assert np.array_equal(wa[module][key], wb[module][key]), (module, key)


def test_cli_eval_and_errors(two_runs: tuple[Path, Path, list[str]]) -> None:
    from trainers.cli import app

    run, _, _ = two_runs
    runner = CliRunner()
    res = runner.invoke(app, ["eval", str(run), "--episodes", "3"])
    assert res.exit_code == 0, res.output
    assert "fraction of oracle" in res.output
    res = runner.invoke(app, ["run", "delegate", "--train", "boss"])
    assert res.exit_code == 2 and "neither an agent nor a pool" in res.output
    res = runner.invoke(app, ["run", "delegate", "--train", "orchestrator", "--dump"])
    assert res.exit_code == 0
    assert ExperimentConfig.from_yaml(res.output).train == ["orchestrator"]


def test_cli_sweep_file_errors_before_ray(tmp_path: Path) -> None:
    from trainers.cli import app

    runner = CliRunner()
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: {topology: star:2}\nparam_space: {topology: [star:2, chain:3]}\n")
    res = runner.invoke(app, ["sweep", str(bad)])
    assert res.exit_code == 2 and "sweep point {'topology': 'chain:3'}" in res.output
    typo = tmp_path / "typo.yaml"
    typo.write_text("base: {}\nparam_space: {topology: [star:2]}\nsamples: 3\n")
    res = runner.invoke(app, ["sweep", str(typo)])
    assert res.exit_code == 2 and "unknown field(s) ['samples']" in res.output


def test_documented_sweep_file_validates() -> None:
    from trainers.sweep import SweepSpec, validate_space

    doc = SweepSpec.__doc__ or ""
    text = textwrap.dedent(doc.split("Example file::")[1].split("Attributes:")[0])
    spec = SweepSpec.from_yaml(text)
    assert spec.search == "grid" and spec.base.budget.iterations == 20
    # 2 topologies × 2 train settings × 3 credit methods × both ends of the lr range
    assert validate_space(spec.base, spec.param_space, spec.search) == 24
