"""``algorithm:``: one config class per algorithm ``name:`` (:data:`ALGORITHMS`).

Each class carries what it builds: ``rllib_algorithm`` (the RLlib ``Algorithm`` class) and
``learners`` (the learner class per ``algorithm.learner`` kind), as dotted references that
:func:`load_class` imports, so this schema module stays below the code it names;
``records_rollouts`` tells whether its learner updates take the sampled episodes (what
``output.rollouts`` dumps).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal

from trainers.configs.grpo import GRPOSettings
from trainers.configs.typed import ConfigError, register_kinds, register_shorthand, typed

#: ``algorithm.learner`` (PPO, GRPO): the lean learner step (:mod:`trainers.learners.lean`) or
#: RLlib's own.
LearnerKind = Literal["lean", "rllib"]
LEARNER_KINDS = ("lean", "rllib")
#: ``algorithm.critic`` (PPO): what the critic reads (:mod:`marl_agents.critics`)
CriticInput = Literal["local", "state", "state_obs"]
CRITIC_INPUTS = ("local", "state", "state_obs")
#: the credit learner (per-agent advantage normalisation) and RLlib's PPO step with normalised
#: value targets (:func:`trainers.configs.algorithms.load_class` references)
CREDIT_LEARNER = "trainers.learners.credit_ppo:CreditPPOTorchLearner"
VALUE_NORM_LEARNER = "trainers.learners.value_norm_learner:ValueNormPPOLearner"


def load_class(ref: str) -> type:
    """The class a ``module:Class`` reference names (what an algorithm config carries)."""
    import importlib

    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def check_learner(kind: Any) -> None:
    """``algorithm.learner`` is ``lean`` or ``rllib``."""
    if kind not in LEARNER_KINDS:
        raise ConfigError(
            f"algorithm.learner={kind!r} is unknown: use lean (the lean learner step, same "
            "math) or rllib (RLlib's own learner)"
        )


@dataclasses.dataclass
class AlgoConfig:
    """The RL algorithm: the base of one config class per ``name`` (:data:`ALGORITHMS`).

    ``name`` is fixed by the class and selects it in YAML (``algorithm: {name: APPO, lr: …}``
    or just ``algorithm: APPO``); each class holds only the fields its algorithm reads.

    Attributes:
        name: ``"PPO"`` (or its presets ``"MAPPO"``, ``"IPPO"``), ``"APPO"``, ``"IMPALA"`` or
            ``"GRPO"``, set by the class.
        lr: learning rate.
        num_epochs: passes over each train batch.
        grad_clip: gradient norm clip (``None``: off).
        extra: more keyword arguments for RLlib's ``AlgorithmConfig.training`` (named as
            RLlib names them), e.g. ``{"kl_coeff": 0.0}``; an unknown key is a
            :class:`ConfigError` in ``resolve``.
    """

    #: the RLlib ``Algorithm`` class (``module:Class``), the lean learner (``learner: lean``)
    #: and whether the learner updates take sampled episodes (``output.rollouts``)
    rllib_algorithm: ClassVar[str] = ""
    lean_learner: ClassVar[str | None] = None
    records_rollouts: ClassVar[bool] = False

    name: str = dataclasses.field(default="", init=False)
    lr: float = 0.001
    num_epochs: int = 6
    grad_clip: float | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        typed(self, "algorithm")

    def check(self) -> None:
        """Field-level validation."""
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"algorithm.lr must be a positive number, got {self.lr}")
        if self.num_epochs < 1:
            raise ConfigError(f"algorithm.num_epochs must be ≥ 1, got {self.num_epochs}")

    def training_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of RLlib's ``AlgorithmConfig.training`` (``extra`` last)."""
        return {"lr": self.lr, "num_epochs": self.num_epochs, "grad_clip": self.grad_clip}

    @classmethod
    def algorithm_class(cls) -> type:
        """The RLlib ``Algorithm`` class this config builds."""
        return load_class(cls.rllib_algorithm)

    def learner_class(self, credit_normalize: bool) -> type | None:
        """The learner class this config builds (:meth:`learner_ref`), or None for the RLlib
        algorithm's own."""
        ref = self.learner_ref(credit_normalize)
        return None if ref is None else load_class(ref)

    def learner_ref(self, credit_normalize: bool) -> str | None:
        """The learner class this config builds (a :func:`load_class` reference), or None for
        the RLlib algorithm's own: the lean learner of ``learner: lean``, else the credit
        learner when credit normalises advantages per agent."""
        if getattr(self, "learner", "rllib") == "lean" and self.lean_learner:
            return self.lean_learner
        return CREDIT_LEARNER if credit_normalize else None


@dataclasses.dataclass
class ActorCriticAlgo(AlgoConfig):
    """Fields of the value-based algorithms (PPO, APPO, IMPALA).

    Attributes:
        gamma: discount.
        train_batch_size: env steps per learner update (``train_batch_size_per_learner``).
        entropy_coeff: entropy bonus.
        vf_loss_coeff: value loss weight.
    """

    gamma: float = 0.99
    train_batch_size: int = 1000
    entropy_coeff: float = 0.0
    vf_loss_coeff: float = 0.5

    def check(self) -> None:
        super().check()
        if not 0 <= self.gamma <= 1:
            raise ConfigError(f"algorithm.gamma must be in [0, 1], got {self.gamma}")
        if self.train_batch_size < 1:
            raise ConfigError(
                f"algorithm.train_batch_size must be ≥ 1, got {self.train_batch_size}"
            )

    def training_kwargs(self) -> dict[str, Any]:
        return {
            **super().training_kwargs(),
            "gamma": self.gamma,
            "train_batch_size_per_learner": self.train_batch_size,
            "entropy_coeff": self.entropy_coeff,
            "vf_loss_coeff": self.vf_loss_coeff,
            # asynchronous learners consume whole rollout fragments: no minibatches
            "minibatch_size": None,
        }


@dataclasses.dataclass
class IMPALAAlgo(ActorCriticAlgo):
    """``IMPALA``: asynchronous actor-critic with V-trace."""

    rllib_algorithm: ClassVar[str] = "ray.rllib.algorithms.impala:IMPALA"
    name: str = dataclasses.field(default="IMPALA", init=False)

    def learner_ref(self, credit_normalize: bool) -> str | None:
        """As :meth:`AlgoConfig.learner_ref`; else RLlib's IMPALA learner with time limits
        bootstrapped (:mod:`trainers.learners.async_learners`)."""
        ref = super().learner_ref(credit_normalize)
        return "trainers.learners.async_learners:IMPALALearner" if ref is None else ref


@dataclasses.dataclass
class ClippedAlgo(ActorCriticAlgo):
    """Fields of the clipped-surrogate algorithms (PPO, APPO).

    Attributes:
        gae_lambda: GAE λ.
        clip_param: surrogate clip.
    """

    gae_lambda: float = 0.95
    clip_param: float = 0.2

    def check(self) -> None:
        super().check()
        if not 0 <= self.gae_lambda <= 1:
            raise ConfigError(f"algorithm.gae_lambda must be in [0, 1], got {self.gae_lambda}")

    def training_kwargs(self) -> dict[str, Any]:
        kw = super().training_kwargs()
        return {**kw, "lambda_": self.gae_lambda, "clip_param": self.clip_param}


@dataclasses.dataclass
class APPOAlgo(ClippedAlgo):
    """``APPO``: asynchronous PPO (needs a target network: ``mlp`` pools only)."""

    rllib_algorithm: ClassVar[str] = "ray.rllib.algorithms.appo:APPO"
    name: str = dataclasses.field(default="APPO", init=False)

    def learner_ref(self, credit_normalize: bool) -> str | None:
        """As :meth:`AlgoConfig.learner_ref`; else RLlib's APPO learner with time limits
        bootstrapped (:mod:`trainers.learners.async_learners`)."""
        ref = super().learner_ref(credit_normalize)
        return "trainers.learners.async_learners:APPOLearner" if ref is None else ref


@dataclasses.dataclass
class PPOAlgo(ClippedAlgo):
    """``PPO`` (the default).

    The critic: with ``value_norm`` (on by default) it learns normalised value targets and its
    outputs are de-normalised wherever they are used as values (GAE, the bootstrap value of cut
    episodes); see :mod:`trainers.learners.value_norm`. Value clipping is off: RLlib's PPO loss
    clamps
    the *squared* value error at ``vf_clip_param`` (10 by RLlib's default, which stops the
    critic's gradient wherever ``|V − target| > 3.2`` and stalled ``vf_explained_var`` at 0 on
    scenarios whose returns are larger, issue #27), so it is set to infinity here;
    ``extra: {vf_clip_param: …}`` brings the clamp back (on normalised errors, in units of σ²,
    when ``value_norm`` is on). The ``critic`` monitor (:mod:`trainers.signals.monitors`) warns
    when the
    critic stops explaining the returns or most of its loss is clipped.

    Attributes:
        minibatch_size: SGD minibatch size, in rows of one module's batch (≤
            ``train_batch_size``). The units differ: ``train_batch_size`` counts env steps,
            a module's batch holds one row per agent step of the agents it serves (plus one
            bootstrap row per episode chunk), so with ``N`` agents sharing a pool an epoch
            is about ``N·train_batch_size / minibatch_size`` SGD steps (simple_spread, 3
            agents, 3,200 env steps, minibatch 3,200: ~3.1 minibatches per epoch, not one).
        learner: ``lean`` (:mod:`trainers.learners.lean`: the same PPO math, fused Adam, less
            work per minibatch) or ``rllib`` (RLlib's own learner step).
        value_norm: normalise the critic's value targets with a running mean and std per
            module (statistics in the learner state, checkpointed); ``false``: the critic
            learns raw returns, as RLlib does.
        value_norm_beta: weight of the normaliser's running statistics at each training
            batch, in ``[0, 1)``: 0.99 (the default) tracks about the last hundred batches;
            0.99999 (MAPPO's) is the mean over every batch so far, so the statistics settle.
            On simple_spread 0.99999 did not change the outcome (issue #27, docs/results.md).
        critic: what the critic reads (centralised training, decentralised execution):
            ``local`` (the agent's own observation: IPPO), ``state`` (the scenario's global
            state) or ``state_obs`` (global state + the agent's own observation + a one-hot
            agent id: MAPPO). A centralised critic is a separate value network over a column
            only the learner builds (:mod:`trainers.learners.critic_input`); actors read only
            their own observation.
    """

    rllib_algorithm: ClassVar[str] = "trainers.ppo:PPO"
    lean_learner: ClassVar[str | None] = "trainers.learners.lean:LeanPPOLearner"
    records_rollouts: ClassVar[bool] = True
    name: str = dataclasses.field(default="PPO", init=False)
    minibatch_size: int = 250
    learner: LearnerKind = "lean"
    value_norm: bool = True
    value_norm_beta: float = 0.99
    critic: CriticInput = "local"

    def check(self) -> None:
        super().check()
        check_learner(self.learner)
        if not 0 <= self.value_norm_beta < 1:
            raise ConfigError(
                f"algorithm.value_norm_beta must be in [0, 1), got {self.value_norm_beta}: "
                "0.99 (the default) or 0.99999 (MAPPO's: the mean over every batch so far)"
            )
        if self.critic not in CRITIC_INPUTS:
            raise ConfigError(
                f"algorithm.critic={self.critic!r} is unknown: use local (own observation), "
                "state (global state) or state_obs (global state + own observation + agent id)"
            )
        if self.minibatch_size < 1:
            raise ConfigError(f"algorithm.minibatch_size must be ≥ 1, got {self.minibatch_size}")
        if self.minibatch_size > self.train_batch_size:
            raise ConfigError(
                f"algorithm.minibatch_size={self.minibatch_size} exceeds train_batch_size="
                f"{self.train_batch_size}: lower it or raise the batch (RLlib refuses it too; "
                "minibatch_size counts rows of a module's batch, one per acting agent and step, "
                "while train_batch_size counts env steps)"
            )

    def training_kwargs(self) -> dict[str, Any]:
        kw = super().training_kwargs()
        # no value clipping (see the class doc); ``extra`` may set it
        return {**kw, "minibatch_size": self.minibatch_size, "vf_clip_param": math.inf}

    def learner_ref(self, credit_normalize: bool) -> str | None:
        """As :meth:`AlgoConfig.learner_ref`; on RLlib's step without a credit learner, RLlib's
        PPO learner with normalised value targets when ``value_norm`` is on, and in every case
        with time limits bootstrapped (:mod:`trainers.learners.time_limits`)."""
        ref = super().learner_ref(credit_normalize)
        return VALUE_NORM_LEARNER if ref is None else ref


@dataclasses.dataclass
class MAPPOAlgo(PPOAlgo):
    """``MAPPO``: PPO with a centralised critic over the global state, the agent's own
    observation and its id (``critic: state_obs``) and normalised value targets; every other
    field is PPO's (and may be set).

    Its defaults are the measured MARL settings, docs/results.md's simple_spread headline
    (mpe2, 3 agents, 25 steps; ``examples/spread_mappo.yaml``): lr 2.8e-3, entropy 0.03, 10
    epochs over 3,200 env steps in minibatches of 3,200 rows (MAPPO −144.4 and IPPO −163.6
    greedy at 500k env steps, 5 seeds, where MAPPO's published MPE recipe, lr 7e-4 and
    entropy 0.01, gave −185.7).
    """

    name: str = dataclasses.field(default="MAPPO", init=False)
    critic: CriticInput = "state_obs"
    lr: float = 2.8e-3
    entropy_coeff: float = 0.03
    num_epochs: int = 10
    train_batch_size: int = 3200
    minibatch_size: int = 3200


@dataclasses.dataclass
class IPPOAlgo(MAPPOAlgo):
    """``IPPO``: PPO with each agent's critic on its own observation (``critic: local``; the
    same as ``PPO``), named for comparisons with ``MAPPO``, with MAPPO's measured defaults
    (IPPO −163.6 on simple_spread with them)."""

    name: str = dataclasses.field(default="IPPO", init=False)
    critic: CriticInput = "local"


@dataclasses.dataclass
class GRPOAlgo(AlgoConfig):
    """``GRPO``: token-level GRPO for LLM pools (:mod:`trainers.grpo.learner`), chosen
    explicitly (``resolve`` rejects LLM pools with another algorithm); small-network pools
    (``mlp``, ``gru``, ...) train with the same loss on their action logprobs (no ``kl_coef``).
    No value function, no GAE: an iteration's batch is
    ``grpo.group_size · grpo.groups_per_iteration`` finished episodes.

    Defaults are the measured LLM settings: one epoch and lr 3e-4,
    what every shipped LLM example learns with (``examples/supervisor_app.yaml``,
    ``examples/openai_app.yaml``, ``marl finetune``'s ``training``), where ``AlgoConfig``'s
    lr 1e-3 and 6 epochs collapsed the supervisor tutorial's router (lr 3e-3) or lost the
    reply format for good on 3 of 10 seeds (``examples/finetune_tiny.yaml``, lr 1e-3), and 6
    epochs cost 6× the learner's time an iteration (issue #44: 425 s of ``learn_s``).

    Attributes:
        grpo: the loss knobs and group schedule.
        learner: ``lean`` (:mod:`trainers.learners.lean`: the same GRPO math, fused Adam) or
            ``rllib`` (the GRPO learner on RLlib's own step).
    """

    rllib_algorithm: ClassVar[str] = "trainers.grpo.algorithm:GRPO"
    lean_learner: ClassVar[str | None] = "trainers.grpo.lean:LeanGRPOLearner"
    records_rollouts: ClassVar[bool] = True
    name: str = dataclasses.field(default="GRPO", init=False)
    lr: float = 3e-4
    num_epochs: int = 1
    grpo: GRPOSettings = dataclasses.field(default_factory=GRPOSettings)
    learner: LearnerKind = "lean"

    def check(self) -> None:
        super().check()
        check_learner(self.learner)
        self.grpo.check()

    def training_kwargs(self) -> dict[str, Any]:
        n = self.grpo.episodes_per_iteration
        return {
            **super().training_kwargs(),
            "train_batch_size_per_learner": n,
            "minibatch_size": self.grpo.minibatch_size or n,
        }


#: algorithm ``name`` → its config class (what YAML's ``name:`` selects).
ALGORITHMS: dict[str, type[AlgoConfig]] = {
    cls.name: cls for cls in (PPOAlgo, APPOAlgo, IMPALAAlgo, GRPOAlgo, MAPPOAlgo, IPPOAlgo)
}


register_kinds(AlgoConfig, "name", ALGORITHMS, "PPO")  # type: ignore[arg-type]
register_shorthand(AlgoConfig, lambda s: {"name": s})
