"""Nothing fails silently: reset raises for a graph that cannot run, node errors and timeouts
truncate episodes and are counted, a run where every episode fails stops with the error.

Tests that could hang if the wall-clock limit did not work run in a subprocess with a timeout,
or (the in-process training run) under ``faulthandler.dump_traceback_later``, which ends the
test process with a traceback instead of letting it hang. Assertions are about outcomes, never
about how long anything took.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from failing_toys import FlakyTool
from langgraph.graph import END, START, StateGraph
from toys import ToyStar, user_scenario

from scenarios import GraphEnv, ScenarioError
from scenarios.registry import build
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def subprocess_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("PYTHONHASHSEED", "0")
    env["COLUMNS"] = "200"
    return env


def run_python(code: str, timeout: float = 120) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (killed after ``timeout``); its last line is JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----- GraphEnv ------------------------------------------------------------------------------
def test_reset_raises_when_a_node_fails_before_any_agent_acts() -> None:
    env = GraphEnv(FlakyTool(fail="always", where="first"))
    with pytest.raises(
        ScenarioError, match=r"flaky-tool-v0.*node 'setup' raised RuntimeError"
    ) as e:
        env.reset(seed=0)
    assert isinstance(e.value.__cause__, RuntimeError)
    assert "tool broke" in str(e.value.__cause__)
    assert "fix that node" in str(e.value)


def test_reset_raises_for_a_graph_that_asks_nobody() -> None:
    def router(state: dict[str, Any]) -> str:
        return END

    b = StateGraph(dict)
    b.add_node("gate", lambda s: {}, metadata={"agent": False})
    b.add_node("worker", lambda s: {"results": []})
    b.add_edge(START, "gate")
    b.add_conditional_edges("gate", router, ["worker", END])
    b.add_edge("worker", END)
    env = GraphEnv(user_scenario(b))
    with pytest.raises(ScenarioError, match=r"without asking any agent.*scenarios\.decide"):
        env.reset(seed=0)


def test_node_error_mid_episode_truncates_with_the_error() -> None:
    env = GraphEnv(FlakyTool(fail="always"))
    obs, infos = env.reset(seed=0)
    assert infos["planner"]["acting"]
    obs, rewards, terms, truncs, infos = env.step({"planner": 1})
    # the worker was never asked: it finishes, truncated too, in the closing step
    assert truncs == {"planner": True, "worker": False} and not any(terms.values())
    info = infos["planner"]
    assert info["failure"] == "error"
    assert info["error"].startswith("node 'tool' raised RuntimeError: tool broke on task")
    assert env.agents == ["worker"] and env.failure == "error" and env.truncated
    _, rewards, terms, truncs, infos = env.step({})
    assert truncs == {"worker": True} and terms == {"worker": False} and rewards == {"worker": 0.0}
    assert infos["worker"]["failure"] == "error" and env.agents == []
    assert env.final_state is None  # the graph raised: no final state
    assert len(env.trace) == 1


def test_final_state_of_the_last_episode_is_public() -> None:
    env = GraphEnv(ToyStar("star:2", rounds=1))
    env.reset(seed=3)
    while env.agents:
        env.step(dict.fromkeys(env.agents, 1))
    assert env.failure is None and env.error is None
    assert env.final_state is not None and len(env.final_state["results"]) == 2
    assert env.final_state["task"] == env.scenario.initial_state(np.random.default_rng(3))["task"]


def test_hung_tool_is_cut_by_the_wall_clock_limit() -> None:
    """In the main thread a SIGALRM interrupts time.sleep(3600) inside a tool node; an outer
    alarm (a harness's) keeps its handler and remaining time."""
    out = run_python(
        """
        import json, signal
        from failing_toys import FlakyTool
        from scenarios import ScenarioError
        from scenarios.graph_env import GraphEnv

        fired = []
        def outer(signum, frame):
            fired.append(signum)
        signal.signal(signal.SIGALRM, outer)
        signal.setitimer(signal.ITIMER_REAL, 300.0)
        out = {}
        env = GraphEnv(FlakyTool(fail="always", mode="hang"), episode_timeout_s=0.5)
        env.reset(seed=0)
        _, rewards, terms, truncs, infos = env.step({"planner": 1})
        out["mid"] = {"truncs": truncs, "failure": infos["planner"]["failure"],
                      "error": infos["planner"]["error"], "agents": env.agents}
        try:
            GraphEnv(FlakyTool(fail="always", mode="hang", where="first"),
                     episode_timeout_s=0.5).reset(seed=0)
        except ScenarioError as exc:
            out["first"] = [str(exc), type(exc.__cause__).__name__]
        # replays of the hung episode (credit) are cut by the same limit
        out["replay"] = env.value(0, ["planner", "worker"], {"planner": [1], "worker": [1]})
        out["handler_kept"] = signal.getsignal(signal.SIGALRM) is outer
        out["outer_left"] = signal.getitimer(signal.ITIMER_REAL)[0]
        out["outer_fired"] = fired
        print(json.dumps(out))
        """
    )
    mid = out["mid"]
    assert mid["truncs"] == {"planner": True, "worker": False} and mid["agents"] == ["worker"]
    assert mid["failure"] == "timeout"
    assert "wall-clock limit of 0.5 s" in mid["error"] and "node 'tool'" in mid["error"]
    text, cause = out["first"]
    assert cause == "EpisodeTimeout"
    assert "node 'setup'" in text and "before any agent acted" in text and "raise" in text
    assert out["replay"] == 0.0
    assert out["handler_kept"] and out["outer_left"] > 0 and out["outer_fired"] == []


@pytest.mark.parametrize("handler", [signal.SIG_DFL, signal.SIG_IGN])
def test_episodes_leave_the_alarm_handler_and_timer_as_they_found_them(handler: Any) -> None:
    """Each reset/step swaps the SIGALRM handler in and out (``_Alarm``): afterwards the
    handler is the one before (the default, or ignore) and no timer is left running."""
    assert threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, handler)
    try:
        for engine in ("fast", "langgraph"):
            env = GraphEnv(build("delegate"), episode_timeout_s=60.0, engine=engine)
            for seed in range(3):
                env.reset(seed=seed)
                while env.agents:
                    env.step({a: env.action_space(a).sample() for a in env.agents})
                    assert signal.getsignal(signal.SIGALRM) is handler
                    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_limit_is_checked_between_decisions_outside_the_main_thread() -> None:
    """No SIGALRM off the main thread: a slow tool finishes, then the episode is cut."""
    env = GraphEnv(FlakyTool(fail="always", mode="hang", hang_s=0.3), episode_timeout_s=0.05)
    seen: dict[str, Any] = {}

    def play() -> None:
        env.reset(seed=0)
        seen["step"] = env.step({"planner": 1})

    worker = threading.Thread(target=play)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive()
    _, _, _, truncs, infos = seen["step"]
    assert truncs == {"planner": True, "worker": False}  # the worker finishes in the closing step
    assert infos["planner"]["failure"] == "timeout"
    assert "checked between decisions" in infos["planner"]["error"]


def test_episode_timeout_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="episode_timeout_s must be > 0"):
        GraphEnv(ToyStar("star:1"), episode_timeout_s=0)
    with pytest.raises(ConfigError, match=r"episodes\.timeout_s"):
        ExperimentConfig.from_dict({"episodes": {"timeout_s": -1.0}}).check()
    cfg = ExperimentConfig.from_dict({"episodes": {"timeout_s": None, "fail_after": 2}})
    assert ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg


def test_journal_keeps_distinct_errors_once() -> None:
    from trainers.signals.episode_metrics import EpisodeJournal

    journal = EpisodeJournal()
    journal.record_error("error", "node 'tool' raised RuntimeError: tool broke on task 1")
    journal.record_error("error", "node 'tool' raised RuntimeError: tool broke on task 3")
    journal.record_error("timeout", "episode wall-clock limit of 1 s reached in node 'tool'")
    errors = journal.drain(keep=2)["errors"]
    assert [(e["kind"], e["count"]) for e in errors] == [("error", 2), ("timeout", 1)]
    assert errors[0]["error"].endswith("task 1")  # the first text is kept
    assert journal.keep == 2 and journal.drain(keep=0)["errors"] == []


def test_run_status_names_the_cause_of_a_wrapped_error() -> None:
    from trainers.run.outcome import describe_error

    try:
        try:
            raise ScenarioError("x-v0: node 'setup' raised ValueError: bad input")
        except ScenarioError as exc:
            raise RuntimeError from exc
    except RuntimeError as exc:
        text = describe_error(exc)
    assert (
        text
        == "ScenarioError: x-v0: node 'setup' raised ValueError: bad input (through RuntimeError)"
    )


# ----- training ------------------------------------------------------------------------------
def flaky_config(tmp_path: Path, **scenario_kwargs: Any) -> ExperimentConfig:
    return ExperimentConfig.from_dict(
        {
            "scenario": "flaky-tool",
            "scenario_kwargs": scenario_kwargs,
            "algorithm": {"train_batch_size": 32, "minibatch_size": 16, "num_epochs": 1},
            "budget": {"iterations": 2},
            "resources": {"num_envs_per_env_runner": 2},
            "logging": {"wandb": "disabled", "progress": False},
            "output": {"dir": str(tmp_path / "runs"), "checkpoint_every": 0, "plot": False},
            "episodes": {"timeout_s": 0.3},
        }
    )


@pytest.fixture
def hang_guard() -> Any:
    """Ends the test process with a traceback if the test hangs (harness-side, no signals)."""
    faulthandler.dump_traceback_later(240, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.usefixtures("ray_session", "hang_guard")
def test_training_truncates_hung_tools_and_goes_on(tmp_path: Path) -> None:
    from trainers.run.loop import train

    result = train(flaky_config(tmp_path, fail="sometimes", mode="hang"))
    assert result.status == "completed" and result.iterations == 2
    rows = result.history
    assert all("charts/timeout_rate" in r and "charts/error_rate" in r for r in rows)
    assert any(r["charts/timeout_rate"] > 0 for r in rows)
    assert all(r["charts/timeout_rate"] < 1 for r in rows)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    timeouts = [e for e in summary["errors"] if e["kind"] == "timeout"]
    assert len(timeouts) == 1 and timeouts[0]["count"] >= 1
    assert "node 'tool'" in timeouts[0]["error"]
    assert (result.run_dir / "transcripts" / "iter_000002.jsonl").exists()


@pytest.mark.usefixtures("ray_session")
def test_run_where_every_episode_fails_stops_with_the_error(tmp_path: Path) -> None:
    from trainers.run.loop import train
    from trainers.run.outcome import RunFailed

    with pytest.raises(RunFailed, match="every episode of iteration 1 failed") as e:
        train(flaky_config(tmp_path, fail="always"))
    assert "node 'tool' raised RuntimeError: tool broke" in str(e.value)
    result = e.value.result
    assert result is not None and result.status.startswith("failed: RunFailed: every episode")
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["status"] == result.status and summary["iterations"] == 1
    assert summary["errors"][0]["kind"] == "error"
    row = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["charts/error_rate"] == 1.0


@pytest.mark.usefixtures("ray_session")
def test_a_graph_that_cannot_run_stops_training_at_reset(tmp_path: Path) -> None:
    from trainers.run.loop import train

    cfg = flaky_config(tmp_path, fail="always", where="first")
    with pytest.raises(Exception) as e:  # RLlib may wrap it; the chain names it
        train(cfg)
    chain, exc = [], e.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    assert any(isinstance(x, ScenarioError) and "node 'setup'" in str(x) for x in chain)
    (run,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"].startswith("failed: ScenarioError: flaky-tool-v0")
    assert "node 'setup' raised RuntimeError: tool broke" in summary["status"]


def test_cli_exits_nonzero_with_the_error_when_every_episode_fails(tmp_path: Path) -> None:
    config = tmp_path / "flaky.yaml"
    flaky_config(tmp_path, fail="always").replace(**{"budget.iterations": 1}).to_yaml(config)
    code = "import failing_toys; from trainers.cli import app; app()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "run", "--config", str(config)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr  # the error, not a trace
    assert "every episode of iteration 1 failed" in proc.stderr
    assert "tool broke" in proc.stderr
    (run,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"].startswith("failed: RunFailed: every episode of iteration 1")
