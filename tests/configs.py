"""Experiment configs small enough to train an iteration in about a second."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainers.configs.experiment import ExperimentConfig


def tiny_config(
    tmp_path: Path, batch: int = 128, checkpoint_every: int = 1, **sections: Any
) -> ExperimentConfig:
    """Two PPO iterations of ``batch`` env steps (minibatches of half), 2 envs, no wandb or
    progress bar, run directories under ``tmp_path/runs``; ``sections`` override the rest."""
    return ExperimentConfig.from_dict(
        {
            "algorithm": {"train_batch_size": batch, "minibatch_size": batch // 2, "num_epochs": 1},
            "budget": {"iterations": 2},
            "resources": {"num_envs_per_env_runner": 2},
            "logging": {"wandb": "disabled", "progress": False},
            "output": {"dir": str(tmp_path / "runs"), "checkpoint_every": checkpoint_every},
            **sections,
        }
    )


def learning_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The losses and team-return metrics of every row of a run's ``metrics.jsonl`` (what must
    agree between two runs that sample the same episodes)."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(x).items() if k.startswith(("losses/", "charts/team"))}
        for x in lines
    ]


def supervisor_tutorial_config(
    tmp_path: Path, router: dict[str, Any], workers: dict[str, Any], **sections: Any
) -> ExperimentConfig:
    """GRPO on LangGraph's supervisor tutorial as written (``tests/apps/supervisor_tutorial.py``):
    the ``router`` pool (the supervisor) learns, the ``workers`` pool (researcher, coder) is
    frozen; 2 iterations of 2 groups of 2 unless ``sections`` say otherwise."""
    return ExperimentConfig.from_dict(
        {
            "scenario": "tests.apps.supervisor_tutorial:scenario",
            "sharing": "explicit",
            "pools": {
                "router": {"agents": ["supervisor"], "model": router},
                "workers": {"agents": ["researcher", "coder"], "model": workers},
            },
            "train": ["router"],
            "algorithm": {
                "name": "GRPO",
                "lr": 1e-3,
                "num_epochs": 1,
                "grpo": {"group_size": 2, "groups_per_iteration": 2},
            },
            "budget": {"iterations": 2},
            "seed": 0,
            "logging": {"wandb": "disabled", "progress": False},
            "output": {"dir": str(tmp_path / "runs"), "checkpoint_every": 0, "plot": False},
            **sections,
        }
    )
