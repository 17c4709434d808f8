"""examples/results/: one ``marl run`` config per arm of docs/results.md, built from the
experiments' code (``python -m experiments.export_configs``); nothing here starts Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from experiments import export_configs as ex
from experiments import harness

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "rerun `python -m experiments.export_configs` and commit examples/results/"


@pytest.fixture(scope="module")
def every_arm() -> list[ex.Arm]:
    return ex.arms()


@pytest.fixture(scope="module")
def arms(every_arm: list[ex.Arm]) -> list[ex.Arm]:
    return [arm for arm in every_arm if arm.records]


def test_shipped_files_are_what_the_experiments_build(every_arm: list[ex.Arm]) -> None:
    built = ex.files(every_arm)
    shipped = {p.relative_to(ROOT) for p in ex.OUT.iterdir()}
    assert shipped == set(built), f"files differ ({REGENERATE})"
    for path, text in built.items():
        assert (ROOT / path).read_text() == text, f"{path} is stale: {REGENERATE}"


def test_marl_run_loads_each_file_as_the_experiment_trains_it(arms: list[ex.Arm]) -> None:
    """What ``marl run <file> --seed 0`` trains (the CLI's loader, text defaults included) is
    the harness's config of the arm for seed 0, run settings (logging, output) aside."""
    from trainers.cli import _experiment
    from trainers.configs.experiment import ExperimentConfig
    from trainers.plan import with_text_defaults

    assert len(arms) >= 12  # every numbered section has at least one arm
    assert {arm.section for arm in arms} == set(range(1, 13))
    default = ExperimentConfig()
    for arm in arms:
        ctx = harness.Context(arm.claim, ex.BUDGET, ROOT / "unused", "test")
        trained = harness.make_config(ctx, arm.condition, 0)
        trained = trained.replace(logging=default.logging, output=default.output)
        loaded = _experiment(ROOT / arm.file, None, {"seed": 0})
        assert loaded == with_text_defaults(trained), arm.file


def test_each_header_names_its_section_command_and_numbers(arms: list[ex.Arm]) -> None:
    for arm in arms:
        text = (ROOT / arm.file).read_text()
        assert text.startswith(f"# docs/results.md § {arm.section} ("), arm.file
        assert f"#   marl run {arm.file.as_posix()} --seed 0\n" in text
        assert "seed 0 " in text and "wall time a seed: " in text, arm.file


def test_minimal_round_trip_keeps_kinds() -> None:
    """The YAML keeps an algorithm's and a pool model's kind even where every other field is
    its default (MAPPO's defaults are the headline settings), and loads back to the config."""
    from trainers.configs.experiment import ExperimentConfig

    data: dict[str, Any] = {
        "scenario": "spread",
        "sharing": "team",
        "pools": {"team": {"model": {"type": "mlp"}}},
        "algorithm": {"name": "MAPPO"},
    }
    cfg = ExperimentConfig.from_dict(data)
    small = ex.minimal(cfg)
    assert small["algorithm"] == "MAPPO"
    assert small["pools"] == {"team": {"model": {"type": "mlp"}}}
    assert ExperimentConfig.from_dict(small) == cfg


def test_readme_links_the_spread_headline_config() -> None:
    text = (ex.OUT / "README.md").read_text()
    assert "(../spread_mappo.yaml)" in text and (ROOT / "examples" / "spread_mappo.yaml").exists()


@pytest.mark.slow
@pytest.mark.parametrize("section", range(1, 13))
def test_a_shipped_config_reproduces_its_record(
    every_arm: list[ex.Arm], tmp_path: Path, section: int
) -> None:
    """What a user types, ``marl run examples/results/<file> --seed 0 --iterations 2``, logs
    the team returns of the record's first two iterations to the digit (one arm a section, the
    cheapest): the number in the file's header is what the file trains."""
    import json
    import os
    import subprocess
    import sys

    (arm,) = [arm for arm in ex.reproduced(every_arm) if arm.section == section]
    seed0 = next(r for r in arm.records if r["seed"] == 0)
    want = [row["team_return"] for row in seed0["history"][:2]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONHASHSEED="0", WANDB_MODE="disabled")  # as the marl CLI re-execs itself
    cmd = [sys.executable, "-m", "trainers.cli", "run", str(arm.file), "--seed", "0"]
    cmd += ["--iterations", "2", "--output", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (metrics,) = tmp_path.glob("*/metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    got = [row["charts/team_return"] for row in rows]
    assert got == want, f"{arm.file}: logged {got}, the record {want}"
