"""Training: experiment configs to RLlib, credit assignment, sweeps, evaluation.

Names are imported lazily so that ``import trainers`` (and ``marl --help``) stays fast: Ray and
torch load only when a function that needs them is used.

Example:
    >>> from trainers import ExperimentConfig
    >>> ExperimentConfig(scenario="delegate", train=["orchestrator"]).train
    ['orchestrator']
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AlgoConfig": "trainers.config",
    "BudgetConfig": "trainers.config",
    "ConfigError": "trainers.config",
    "CreditConfig": "trainers.config",
    "ExperimentConfig": "trainers.config",
    "LoggingConfig": "trainers.config",
    "ModelConfig": "trainers.config",
    "OutputConfig": "trainers.config",
    "PoolConfig": "trainers.config",
    "ResourcesConfig": "trainers.config",
    "Plan": "trainers.algo",
    "resolve": "trainers.algo",
    "to_algorithm_config": "trainers.algo",
    "RunFailed": "trainers.run",
    "TrainResult": "trainers.run",
    "train": "trainers.run",
    "EvalResult": "trainers.evaluate",
    "evaluate": "trainers.evaluate",
    "SweepResult": "trainers.sweep",
    "sweep": "trainers.sweep",
    "FinetuneJob": "trainers.finetune",
    "run_finetune": "trainers.finetune",
    "GRPOConfig": "trainers.config",
    "GRPOSettings": "trainers.config",
    "GRPO": "trainers.grpo_learner",
    "GRPOLearner": "trainers.grpo_learner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trainers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
