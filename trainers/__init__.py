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
    from trainers.configs.algorithms import AlgoConfig as AlgoConfig
    from trainers.configs.algorithms import APPOAlgo as APPOAlgo
    from trainers.configs.algorithms import GRPOAlgo as GRPOAlgo
    from trainers.configs.algorithms import IMPALAAlgo as IMPALAAlgo
    from trainers.configs.algorithms import IPPOAlgo as IPPOAlgo
    from trainers.configs.algorithms import MAPPOAlgo as MAPPOAlgo
    from trainers.configs.algorithms import PPOAlgo as PPOAlgo
    from trainers.configs.credit import CreditConfig as CreditConfig
    from trainers.configs.experiment import BudgetConfig as BudgetConfig
    from trainers.configs.experiment import ExperimentConfig as ExperimentConfig
    from trainers.configs.experiment import LoggingConfig as LoggingConfig
    from trainers.configs.experiment import OutputConfig as OutputConfig
    from trainers.configs.experiment import ResourcesConfig as ResourcesConfig
    from trainers.configs.grpo import GRPOLoss as GRPOLoss
    from trainers.configs.grpo import GRPOSettings as GRPOSettings
    from trainers.configs.typed import ConfigError as ConfigError
    from trainers.evaluate import EvalResult as EvalResult
    from trainers.evaluate import evaluate as evaluate
    from trainers.finetune import FinetuneJob as FinetuneJob
    from trainers.finetune import run_finetune as run_finetune
    from trainers.grpo.algorithm import GRPO as GRPO
    from trainers.grpo.learner import GRPOLearner as GRPOLearner
    from trainers.plan import Plan as Plan
    from trainers.plan import resolve as resolve
    from trainers.run.loop import train as train
    from trainers.run.outcome import RunFailed as RunFailed
    from trainers.run.outcome import TrainResult as TrainResult
    from trainers.sweep import SweepResult as SweepResult
    from trainers.sweep import sweep as sweep

__all__ = export_lazily(__name__)
