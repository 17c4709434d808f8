"""Slow: the supervisor of a real ``create_supervisor`` app learns to route tasks to the right
worker — ``examples/supervisor_app.yaml`` as written (GRPO, tiny in-code LLMs, frozen workers,
Shapley credit), run with ``--slow``.

A random supervisor never completes a handoff (success ≈ 0); the prefilled, completed handoff
makes one generated letter pick the worker, so chance level for a supervisor that always hands
off is 0.5; the trained one routes by the task. Measured (seed 0, 2 cores): see the YAML.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("langgraph_supervisor")

from trainers.configs.experiment import ExperimentConfig

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "supervisor_app.yaml"


@pytest.mark.slow
def test_supervisor_learns_to_route_tasks_to_the_right_worker(ray_session, tmp_path):
    from trainers.run.loop import train

    cfg = ExperimentConfig.from_yaml(EXAMPLE).replace(
        **{
            "seed": 0,
            "logging.wandb": "disabled",
            "logging.progress": False,
            "output.dir": str(tmp_path / "runs"),
            "output.checkpoint_every": 0,
            "output.plot": False,
        }
    )
    result = train(cfg)
    assert result.status == "completed", result.status
    success = np.array([h["charts/success"] for h in result.history])
    print("success per iteration:", np.round(success, 2).tolist())
    assert success[:5].mean() <= 0.1  # a random supervisor: no completed handoff
    assert success[-10:].mean() >= 0.8  # well above the 0.5 of routing by coin flip
