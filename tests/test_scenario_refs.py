"""Scenario import references (``package.module:attr``) in every process that builds the env.

A user's scenario (``tests/apps/team.py``: a ``Scenario`` subclass, an instance, factories) is
named by reference in Python, YAML and the ``marl`` CLI, and is rebuilt by importing it in the
driver, a remote env runner, credit workers and a Tune trial. Bad references fail in
``resolve()`` (or the CLI, exit 2) with one line naming the fix, before Ray starts.
No wall-clock thresholds: assertions are about what was built and produced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from configs import tiny_config
from typer.testing import CliRunner

from scenarios.registry import build, is_reference, label, scenario_class
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError

CLASS = "tests.apps.team:Echo"
FACTORY = "tests.apps.team:make_echo"
INSTANCE = "tests.apps.team:pair"
ZERO_ARG = "tests.apps.team:app"
# the `marl` console script (trainers.cli:app); -P (3.11+): like a console script, no cwd on
# sys.path
MARL = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-m", "trainers.cli"]


def tiny(tmp_path: Path, scenario: str, **changes: Any) -> ExperimentConfig:
    """Two small iterations (an Echo episode is 4 decisions)."""
    cfg = tiny_config(tmp_path, batch=64, checkpoint_every=0, scenario=scenario)
    return cfg.replace(**changes) if changes else cfg


# ----- building by reference (no Ray) -------------------------------------------------------------
def test_a_reference_names_a_class_an_instance_or_a_factory() -> None:
    from tests.apps import team

    assert is_reference(CLASS) and not is_reference("delegate")
    echo = build(CLASS)  # no topology: the class's own default
    assert type(echo) is team.Echo
    assert echo.possible_agents == ["orchestrator", "worker_0", "worker_1"]
    made = build(FACTORY, "star:3", noise=0.5)  # topology and scenario_kwargs as keywords
    assert len(made.possible_agents) == 4 and made.noise == 0.5
    assert build(INSTANCE) is team.pair  # an instance is used as it is
    fresh = build(ZERO_ARG)
    assert fresh is not team.pair and fresh.possible_agents == ["speaker", "listener"]
    assert scenario_class(FACTORY) is team.Echo
    assert scenario_class(INSTANCE).__name__ == "GraphScenario"
    assert label(CLASS) == "team.Echo" and label("delegate") == "delegate"


def test_config_takes_a_reference_in_python_and_yaml() -> None:
    from trainers.plan import resolve
    from trainers.run.rundir import run_name

    plan = resolve(ExperimentConfig(scenario=INSTANCE))
    assert plan.agents == ["speaker", "listener"] and plan.scenario_id == INSTANCE
    assert plan.env.scenario == INSTANCE and plan.env.topology is None
    text = f"scenario: {FACTORY}\ntopology: star:3\nscenario_kwargs: {{noise: 0.25}}\n"
    cfg = ExperimentConfig.from_yaml(text)
    assert ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg
    plan = resolve(cfg)
    assert plan.agents == ["orchestrator", "worker_0", "worker_1", "worker_2"]
    assert plan.env.kwargs == {"noise": 0.25} and plan.has_oracle
    assert run_name(cfg).startswith("team.make_echo__PPO__0__")


def test_a_finetune_job_and_grpo_take_a_reference() -> None:
    """A text scenario named by reference: the job's checks, its LLM pool and GRPO resolve."""
    from trainers.finetune import FinetuneJob

    ref = "scenarios.text_delegate:TextDelegate"
    job = FinetuneJob.from_yaml(f"scenario: {ref}\ntopology: star:2\nsubagents: [scripted]\n")
    plan = job.plan()
    assert plan.scenario_id == ref and plan.env.scenario == ref
    assert plan.trainable == ["orchestrator"] and plan.cfg.algorithm.name == "GRPO"
    with pytest.raises(ConfigError, match=r"scenario 'tests\.apps\.team:Echo' has no text agents"):
        FinetuneJob.from_yaml("scenario: tests.apps.team:Echo\ntopology: star:2\n").plan()


BAD = {
    "malformed": ({"scenario": "tests.apps.team:"}, "malformed: write 'package.module:attr'"),
    "__main__": ({"scenario": "__main__:Echo"}, "move it into a module"),
    "no module": ({"scenario": "tests.apps.nosuch:Echo"}, "no module named 'tests.apps.nosuch'"),
    "no attribute": ({"scenario": "tests.apps.team:Nope"}, "has no attribute 'Nope' \\(it has"),
    "not a scenario": ({"scenario": "tests.apps.team:NOT_A_SCENARIO"}, "of type int, not a"),
    "wrong class": ({"scenario": "tests.apps.team:NotAScenario"}, "not a scenarios.Scenario"),
    "returns a number": ({"scenario": "tests.apps.team:returns_a_number"}, "returned an object"),
    "raises on import": ({"scenario": "tests.apps.broken:anything"}, "raised RuntimeError"),
    "instance + kwargs": (
        {"scenario": INSTANCE, "scenario_kwargs": {"noise": 1.0}},
        "Scenario instance \\(already built\\), so it takes no scenario_kwargs",
    ),
    "instance + topology": ({"scenario": INSTANCE, "topology": "star:2"}, "takes no topology"),
    "no topology parameter": ({"scenario": ZERO_ARG, "topology": "star:2"}, "takes no topology"),
    "unknown kwarg": (
        {"scenario": CLASS, "scenario_kwargs": {"bogus": 1}},
        "does not accept scenario_kwargs \\['bogus'\\] \\(it accepts: noise\\)",
    ),
    "unknown name": ({"scenario": "nosuch"}, "give an import reference 'package.module:attr'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_references_fail_in_resolve_naming_the_fix(case: str) -> None:
    from trainers.plan import resolve

    data, match = BAD[case]
    with pytest.raises(ConfigError, match=match) as info:
        resolve(ExperimentConfig.from_dict(data))
    message = str(info.value)
    assert "\n" not in message and message.startswith("scenario=")


def test_a_scenario_object_is_refused_with_its_reference() -> None:
    from tests.apps.team import Echo

    with pytest.raises(ConfigError, match=r"use scenario='tests\.apps\.team:Echo'"):
        ExperimentConfig(scenario=Echo).check()  # type: ignore[arg-type]


def test_bad_references_exit_2_from_the_cli_before_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainers.run.loop
    from trainers.cli import app

    def no_ray(cfg: Any) -> bool:
        raise AssertionError("Ray was started")

    monkeypatch.setattr(trainers.run.loop, "ensure_ray", no_ray)
    monkeypatch.syspath_prepend(os.getcwd())  # the commands add it; undone afterwards
    runner = CliRunner()
    env = {"COLUMNS": "1000"}
    for args, match in [
        (["run", "tests.apps.nosuch:Echo"], "no module named"),
        (["run", INSTANCE, "--topology", "star:3"], "takes no topology"),
        (["run", "__main__:Echo"], "move it into a module"),
        (["run", "tests.apps.team:"], "malformed"),
    ]:
        res = runner.invoke(app, [*args, "--iterations", "1", "--wandb", "disabled"], env=env)
        assert res.exit_code == 2, res.output
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and match in lines[0], lines


def test_workers_must_be_able_to_import_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_session: Any
) -> None:
    """With Ray already running, a module only on this process's sys.path is refused; giving
    the sys.path to the processes Ray starts (what ``ensure_ray`` does) makes it importable."""
    from scenarios.registry import unreachable_reason
    from trainers.cluster import share_sys_path
    from trainers.plan import resolve

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "refs_hidden_app.py").write_text("from tests.apps.team import app\n")
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.delitem(sys.modules, "refs_hidden_app", raising=False)
    with pytest.raises(ConfigError, match=f"imported from {lib}, which Ray's worker") as info:
        resolve(ExperimentConfig(scenario="refs_hidden_app:app"))
    assert "PYTHONPATH" in str(info.value) and "\n" not in str(info.value)
    assert unreachable_reason(ZERO_ARG, [os.getcwd()]) is None  # the driver's cwd: Ray adds it
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # restored afterwards
    share_sys_path()
    assert str(lib) in os.environ["PYTHONPATH"].split(os.pathsep)
    assert unreachable_reason("refs_hidden_app:app") is None
    monkeypatch.delitem(sys.modules, "refs_hidden_app", raising=False)


# ----- training by reference (the session's Ray) ------------------------------------------------
@pytest.fixture(scope="module")
def trained(ray_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two iterations on the class reference, sampling in the driver."""
    from trainers.run.loop import train

    cfg = tiny(tmp_path_factory.mktemp("refs"), CLASS)
    return cfg, train(cfg)


def test_train_on_a_class_reference_and_evaluate(trained: Any) -> None:
    from trainers.evaluate import evaluate

    cfg, result = trained
    assert result.status == "completed" and result.iterations == 2
    assert result.run_dir.name.startswith("team.Echo__PPO__0__")
    assert ExperimentConfig.from_yaml(result.run_dir / "config.yaml").scenario == CLASS
    assert result.final["charts/env_steps"] > 0 and "charts/oracle_fraction" in result.final
    out = evaluate(result.run_dir, episodes=4, credit="shapley", show=False)
    assert out.summary["episodes"] == 4
    assert set(out.credit) <= {"orchestrator", "worker_0", "worker_1"}


def test_remote_env_runner_rebuilds_the_factory_by_import(ray_session: Any, tmp_path: Path) -> None:
    """One remote env runner samples every step: it imported the reference itself."""
    from trainers.run.loop import train

    cfg = tiny(
        tmp_path,
        FACTORY,
        topology="star:3",
        scenario_kwargs={"noise": 0.1},
        **{"resources.num_env_runners": 1},
    )
    result = train(cfg)
    assert result.status == "completed" and result.iterations == 2
    assert result.final["charts/env_steps"] > 0
    assert "worker_2/return" in result.final


def test_shapley_credit_workers_rebuild_the_instance_by_import(
    ray_session: Any, tmp_path: Path
) -> None:
    """credit.workers=2: a CreditWorker actor replays half of each batch after importing the
    reference (a failed import there fails the iteration)."""
    from trainers.run.loop import train

    cfg = tiny(tmp_path, INSTANCE, credit={"method": "shapley", "workers": 2})
    result = train(cfg)
    assert result.status == "completed" and result.iterations == 2
    assert {"speaker/credit", "listener/credit"} <= set(result.final)


def test_one_trial_tune_sweep_on_a_reference(ray_session: Any, tmp_path: Path) -> None:
    from trainers.sweep import sweep

    cfg = tiny(tmp_path, ZERO_ARG, **{"budget.iterations": 1})
    result = sweep(cfg, {"algorithm.lr": [0.001]}, name="refs_sweep", show=False)
    assert [t["status"] for t in result.trials] == ["ok"], result.trials
    run = Path(result.best["run_dir"])
    assert ExperimentConfig.from_yaml(run / "config.yaml").scenario == ZERO_ARG
    assert result.path.name == "refs_sweep" and result.best["iterations"] == 1


# ----- the real CLI, from the user's directory ----------------------------------------------------
USER_APP = '''
"""A user's LangGraph app next to where they run marl (not installed)."""
from typing import TypedDict

import gymnasium as gym
import numpy as np
from langgraph.graph import END, START, StateGraph

from scenarios import Outcome, decide
from scenarios.custom import GraphScenario


class S(TypedDict, total=False):
    task: int
    answer: int


def solo(state: S) -> dict:
    return {"answer": int(decide("solo", np.array([state["task"]], np.float32)))}


builder = StateGraph(S)
builder.add_node("solo", solo)
builder.add_edge(START, "solo")
builder.add_edge("solo", END)
scenario = GraphScenario(
    builder,
    observation_space=gym.spaces.Box(0.0, 1.0, (1,), np.float32),
    action_space=gym.spaces.Discrete(2),
    score=lambda s: float(s["answer"] == s["task"]),
    initial_state=lambda rng: {"task": int(rng.integers(2))},
)
'''

RUN_YAML = """
algorithm: {train_batch_size: 64, minibatch_size: 32, num_epochs: 1}
resources: {num_env_runners: 1, num_envs_per_env_runner: 2}
output: {checkpoint_every: 0}
"""


def test_marl_run_and_eval_a_module_next_to_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_session: Any
) -> None:
    """``marl run refs_userpkg.app:scenario`` as a subprocess from the directory holding the
    package (a console script does not put it on sys.path), one remote env runner; then
    ``marl eval`` on the run from the same directory, in this process while a Ray it did not
    give that directory is running (evaluation needs no worker to import it)."""
    from trainers.cli import app

    (tmp_path / "refs_userpkg").mkdir()
    (tmp_path / "refs_userpkg" / "__init__.py").write_text("")
    (tmp_path / "refs_userpkg" / "app.py").write_text(textwrap.dedent(USER_APP))
    (tmp_path / "tiny.yaml").write_text(RUN_YAML)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    args = [*MARL, "run", "refs_userpkg.app:scenario", "--config", "tiny.yaml"]
    args += ["--iterations", "2", "--output", "out", "--wandb", "disabled"]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert run.name.startswith("app.scenario__PPO__0__")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["iterations"] == 2
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # what the command adds, undone afterwards
    try:
        res = CliRunner().invoke(app, ["eval", str(run), "--episodes", "4"], env={"COLUMNS": "200"})
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "refs_userpkg"]:
            del sys.modules[name]
    assert res.exit_code == 0, res.output
    assert "evaluation · refs_userpkg.app:scenario" in res.output and "success" in res.output


def test_a_registered_module_imported_under_two_names_registers_once() -> None:
    """``tests/`` on ``sys.path`` too: ``failing_toys`` and ``tests.failing_toys`` are one file."""
    import importlib

    from scenarios.registry import get

    first = importlib.import_module("failing_toys").FlakyTool
    second = importlib.import_module("tests.failing_toys").FlakyTool
    assert first is not second  # two module objects of one file, as Python imports them
    assert get("flaky-tool") in (first, second)
