"""Training: experiment configs to RLlib, credit assignment, sweeps, evaluation, the CLI.

Names load on first use (:mod:`topologies.lazy`), so ``import trainers`` (and ``marl --help``)
stays fast: Ray and torch load only when a function that needs them is used.

Example:
    >>> from trainers import ExperimentConfig
    >>> ExperimentConfig(scenario="delegate", train=["orchestrator"]).train
    ['orchestrator']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topologies.lazy import export_lazily

if TYPE_CHECKING:  # the exports (topologies.lazy): loaded on first use
    from trainers.algo import to_algorithm_config as to_algorithm_config
    from trainers.config import AlgoConfig as AlgoConfig
    from trainers.config import APPOAlgo as APPOAlgo
    from trainers.config import BudgetConfig as BudgetConfig
    from trainers.config import ConfigError as ConfigError
    from trainers.config import CreditConfig as CreditConfig
    from trainers.config import ExperimentConfig as ExperimentConfig
    from trainers.config import GRPOAlgo as GRPOAlgo
    from trainers.config import GRPOConfig as GRPOConfig
    from trainers.config import GRPOSettings as GRPOSettings
    from trainers.config import IMPALAAlgo as IMPALAAlgo
    from trainers.config import LoggingConfig as LoggingConfig
    from trainers.config import OutputConfig as OutputConfig
    from trainers.config import PPOAlgo as PPOAlgo
    from trainers.config import ResourcesConfig as ResourcesConfig
    from trainers.evaluate import EvalResult as EvalResult
    from trainers.evaluate import evaluate as evaluate
    from trainers.finetune import FinetuneJob as FinetuneJob
    from trainers.finetune import run_finetune as run_finetune
    from trainers.grpo_learner import GRPO as GRPO
    from trainers.grpo_learner import GRPOLearner as GRPOLearner
    from trainers.plan import Plan as Plan
    from trainers.plan import resolve as resolve
    from trainers.run import RunFailed as RunFailed
    from trainers.run import TrainResult as TrainResult
    from trainers.run import train as train
    from trainers.sweep import SweepResult as SweepResult
    from trainers.sweep import sweep as sweep

__all__ = export_lazily(__name__)
