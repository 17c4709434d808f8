"""Bad CLI flags, per command: one line naming the flag or field, the bad value and the fix,
exit code 2, no traceback, and Ray never started (``ensure_ray`` refuses in these tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.test_cluster import no_ray  # noqa: F401 (the fixture: Ray must not start)
from topologies.cli import app as topology_app
from trainers.cli import app

ROOT = Path(__file__).resolve().parents[1]
JOB = str(ROOT / "examples" / "finetune_tiny.yaml")
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("no_ray")

#: (command line, text the one-line error must hold)
RUN = [
    (["--iterations", "0"], "budget.iterations must be positive (or null to disable it), got 0"),
    (["--iterations", "-1"], "budget.iterations must be positive"),
    (["--env-steps", "0"], "budget.env_steps must be positive"),
    (["--time-s", "-1"], "budget.time_s must be positive"),
    (["--time-s", "nan"], "budget.time_s must be positive (or null to disable it), got nan"),
    (["--seed", "-3"], "seed must be an integer ≥ 0, got -3"),
    (["--algo", "XYZ"], "algorithm.name='XYZ' is not one of 'PPO'"),
    (["--credit", "shaply"], "credit.method='shaply' is not one of 'team', 'local'"),
    (["--sharing", "bogus"], "sharing='bogus' is unknown: use one of role"),
    (["--wandb", "bogus"], "logging.wandb='bogus' is unknown: use one of offline"),
    (["--topology", "star:0"], "bad topology spec 'star:0': write star:N with positive"),
    (["--topology", "mesh:1000000"], "has 1,000,000 agents, above the limit of 256"),
    (["--topology", "star:1000000"], "has 1,000,001 agents, above the limit of 256"),
    (["--train", "boss"], "neither an agent nor a pool"),
    (["--config", "/nonexistent.yaml"], "config file /nonexistent.yaml does not exist: give"),
    (["--resume", "/nonexistent"], "no algorithm checkpoint at /nonexistent: pass a run"),
    (["--address", "bogus"], "--address='bogus' is not a Ray address: give host:port"),
    (["--address", "10.0.0.1:0"], "--address='10.0.0.1:0' is not a Ray address"),
    (["--address", "127.0.0.1:1"], "--address='127.0.0.1:1': no Ray cluster answered"),
]
EVAL = [
    (["--episodes", "0"], "episodes must be ≥ 1, got 0"),
    (["--seed", "-3"], "seed must be an integer ≥ 0 (the first episode's seed), got -3"),
    (["--credit", "shaply"], "credit='shaply' is unknown: use one of team, local, loo, shapley"),
    (["--transcripts", "-1"], "transcripts must be ≥ 0, got -1"),
]
SERVE = [
    (["--port", "-1"], "port must be 0 (a free one) to 65535, got -1"),
    (["--key", " x"], "the key ' x' must be a non-empty string without surrounding spaces"),
]
FINETUNE = [
    (["--iterations", "0"], "budget.iterations must be positive"),
    (["--seed", "-3"], "seed must be an integer ≥ 0, got -3"),
    (["--wandb", "bogus"], "logging.wandb='bogus' is unknown"),
    (["--address", "bogus"], "--address='bogus' is not a Ray address"),
]
CASES = (
    [(app, ["run", "delegate", *args], text) for args, text in RUN]
    + [(app, ["eval", "/nonexistent-run", *args], text) for args, text in EVAL]
    + [(app, ["eval", "/nonexistent-run"], "no algorithm checkpoint at /nonexistent-run")]
    + [(app, ["serve", "/nonexistent-run", *args], text) for args, text in SERVE]
    + [(app, ["serve", "/nonexistent-run"], "no algorithm checkpoint at /nonexistent-run")]
    + [(app, ["sweep", "/nonexistent.yaml"], "sweep file /nonexistent.yaml does not exist")]
    + [(app, ["sweep", "/nonexistent.yaml", "--address", "x"], "does not exist")]
    + [(app, ["finetune", JOB, *args], text) for args, text in FINETUNE]
    + [(app, ["finetune", "/nonexistent.yaml"], "job file /nonexistent.yaml does not exist")]
    + [
        (topology_app, ["show", spec], "above the limit of 256")
        for spec in ("star:1000000", "mesh:1000000", "chain:100000", "tree:1000x1000")
    ]
)


@pytest.mark.parametrize(("command", "args", "text"), CASES, ids=lambda x: None)
def test_bad_flag_is_one_line_exit_2(command: Any, args: list[str], text: str) -> None:
    res = runner.invoke(command, args, env={"COLUMNS": "1000"})
    assert res.exit_code == 2, (res.output, res.exception)
    assert isinstance(res.exception, SystemExit), res.exception
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("command", "args"),
    [
        (app, ["run", "delegate", "--iterations", "abc"]),
        (app, ["eval", "x", "--seed", "1.5"]),
        (app, ["finetune", JOB, "--iterations", "two"]),
    ],
)
def test_values_of_the_wrong_type_name_the_flag(command: Any, args: list[str]) -> None:
    """Typer's own usage error: exit 2, the flag named (this typer does not echo the value)."""
    res = runner.invoke(command, args, env={"COLUMNS": "1000"})
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    assert f"Invalid value for '{args[-2]}'" in res.output
