"""The per-episode metrics callback never drops its own errors (trainers.signals.episode_metrics).

RLlib logs and discards exceptions raised on remote env runners (and restarts the runner), so
the callback records its error in the runner's journal and the trainer raises it when it
drains the journals after the iteration; on the local env runner it propagates at once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from scenarios.base import Outcome
from scenarios.relay import Relay
from trainers.configs.experiment import ExperimentConfig


class BadMetricRelay(Relay):
    """A scenario whose verifier reports a metric that is not a number (a user's bug)."""

    name = "bad-metric-relay"

    def score(self, state: dict[str, Any]) -> Outcome:
        outcome = super().score(state)
        outcome.metrics["note"] = "not a number"
        return outcome


def config(tmp_path: Path, runners: int) -> ExperimentConfig:
    return ExperimentConfig.from_dict(
        {
            "scenario": "tests.test_episode_metrics:BadMetricRelay",
            "topology": "chain:2",
            "algorithm": {"train_batch_size": 64, "minibatch_size": 32, "num_epochs": 1},
            "budget": {"iterations": 2},
            "resources": {"num_env_runners": runners, "num_envs_per_env_runner": 1},
            "logging": {"wandb": "disabled", "progress": False},
            "output": {"dir": str(tmp_path), "checkpoint_every": 0, "plot": False},
        }
    )


@pytest.mark.parametrize("runners", [0, 1], ids=["local runner", "remote runner"])
def test_an_error_in_the_metrics_callback_stops_the_run(
    tmp_path: Path, runners: int, ray_session: Any
) -> None:
    from trainers.run.loop import train

    with pytest.raises(Exception) as info:
        train(config(tmp_path, runners))
    chain, exc = [], info.value
    while exc is not None:
        chain.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    text = "\n".join(chain)
    assert "could not convert string to float: 'not a number'" in text
    if runners:
        from trainers.signals.episode_metrics import EpisodeMetricsError

        assert isinstance(info.value, EpisodeMetricsError)
        assert re.search(r"\(at \S+\.py:\d+\)$", str(info.value))  # the line that raised
