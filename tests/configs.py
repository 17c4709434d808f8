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


def grpo_app_config(
    tmp_path: Path,
    scenario: str,
    pools: dict[str, Any],
    train: list[str],
    lr: float = 1e-2,
    **sections: Any,
) -> ExperimentConfig:
    """GRPO on a chat app (``scenario`` by reference): ``train`` learns, the other pools are
    frozen; 2 iterations of 2 groups of 2, seed 0, no wandb, progress bar, checkpoints or plot,
    run directories under ``tmp_path/runs``; ``sections`` override the rest."""
    return ExperimentConfig.from_dict(
        {
            "scenario": scenario,
            "sharing": "explicit",
            "pools": pools,
            "train": train,
            "algorithm": {
                "name": "GRPO",
                "lr": lr,
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


def supervisor_tutorial_config(
    tmp_path: Path, router: dict[str, Any], workers: dict[str, Any], **sections: Any
) -> ExperimentConfig:
    """GRPO on LangGraph's supervisor tutorial as written (``tests/apps/supervisor_tutorial.py``):
    the ``router`` pool (the supervisor) learns, the ``workers`` pool (researcher, coder) is
    frozen; 2 iterations of 2 groups of 2 unless ``sections`` say otherwise."""
    scenario = sections.pop("scenario", "tests.apps.supervisor_tutorial:scenario")
    return grpo_app_config(
        tmp_path,
        scenario,
        {
            "router": {"agents": ["supervisor"], "model": router},
            "workers": {"agents": ["researcher", "coder"], "model": workers},
        },
        ["router"],
        lr=1e-3,
        **sections,
    )
