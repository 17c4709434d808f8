"""Learning test (``--slow``): frozen-subagent orchestrator training on ``delegate`` reaches
≥ 90% of the oracle.

Budget: 30 iterations × 1000 env steps (30k env steps) with the default PPO settings, the
orchestrator learning and the workers frozen as the scenario's scripted policy. The greedy
policy from the final checkpoint is then scored on 200 fresh tasks against the exact oracle
(the skill-aware optimal team) on the same tasks. Measured on the 2-core CPU box: the training
return crosses 90% of the oracle after about 15–20 iterations (~1 minute of training), and the
whole test takes about 2 minutes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainers.configs.experiment import ExperimentConfig

ITERATIONS = 30
EPISODES = 200


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_orchestrator_with_frozen_scripted_workers_reaches_90_percent_of_oracle(
    tmp_path: Path,
) -> None:
    from trainers.evaluate import evaluate
    from trainers.run.loop import train

    cfg = ExperimentConfig.from_dict(
        {
            "scenario": "delegate",
            "topology": "star:3",
            "train": ["orchestrator"],
            "budget": {"iterations": ITERATIONS},
            "logging": {"wandb": "disabled", "progress": False},
            "output": {"dir": str(tmp_path)},
        }
    )
    result = train(cfg)
    assert result.iterations == ITERATIONS
    assert result.history[0]["charts/oracle_fraction"] < 0.8  # it did have to learn
    score = evaluate(result.final_checkpoint, EPISODES, show=False)
    assert score.summary["oracle_fraction"] >= 0.9, score.summary
