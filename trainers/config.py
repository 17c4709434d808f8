"""Experiment configuration: small dataclasses per axis, with an exact YAML round trip.

An experiment is scenario × topology × pools × credit × algorithm × run settings (budget, seed,
resources, logging, output). Every axis is a small dataclass; :class:`ExperimentConfig` holds
them and converts to and from plain dicts and YAML exactly
(``ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg``). Models and algorithms are one class
per kind, selected by ``type:`` (:data:`marl_agents.pools.MODELS`) and ``name:``
(:data:`ALGORITHMS`). Field types are checked when an object is built, from YAML or Python,
and the YAML shorthands work in both (``algorithm="APPO"``, ``credit="shapley"``, a pool
given as its model type); value checks live in each class's ``check()`` (called by
:meth:`ExperimentConfig.check`); checks that need the scenario happen in
:func:`trainers.plan.resolve`, still before Ray starts. Every error is a one-line
:class:`ConfigError` naming the field, the value and the fix.

Example:
    >>> cfg = ExperimentConfig(scenario="delegate", topology="star:3", train=["orchestrator"])
    >>> ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg
    True
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from marl_agents.pools import MODELS, SHARING, ModelConfig, PoolConfig
from scenarios.tool_latency import ToolLatency
from trainers.credit import EXACT_MAX_AGENTS, ShapleyMethod
from trainers.curriculum import CurriculumConfig
from trainers.monitors import MonitorsConfig
from trainers.reward_config import RewardsConfig

CreditMethod = Literal["team", "local", "loo", "shapley"]
CreditEstimator = ShapleyMethod

CREDIT_METHODS: tuple[str, ...] = typing.get_args(CreditMethod)
CREDIT_ESTIMATORS: tuple[str, ...] = typing.get_args(CreditEstimator)
WANDB_MODES: tuple[str, ...] = ("offline", "online", "disabled")

__all__ = [
    "ALGORITHMS",
    "CREDIT_ESTIMATORS",
    "CREDIT_METHODS",
    "APPOAlgo",
    "AlgoConfig",
    "AsyncSampling",
    "BudgetConfig",
    "ConfigError",
    "CreditConfig",
    "EpisodesConfig",
    "ExperimentConfig",
    "GRPOAlgo",
    "GRPOConfig",
    "GRPOSettings",
    "IMPALAAlgo",
    "LoggingConfig",
    "OutputConfig",
    "PPOAlgo",
    "ResourcesConfig",
    "TISConfig",
    "from_plain",
    "to_plain",
]


class ConfigError(ValueError):
    """An experiment config that cannot run; the message names the field and the fix."""


@dataclasses.dataclass
class CreditConfig:
    """How the team's reward is split between agents before advantages are computed.

    The credit learner connector takes this object as it is; :meth:`check` holds every
    field-level rule, and the rules that need the team (agent count against the estimator,
    ``Outcome.local``) are :func:`trainers.credit_settings.check_credit_for`, run by ``resolve``.

    Attributes:
        method: ``"team"`` (every agent gets the team reward), ``"local"`` (each agent's own
            ``Outcome.local`` reward), ``"loo"`` (leave-one-out difference rewards) or
            ``"shapley"`` (Shapley values from counterfactual replays).
        estimator: Shapley estimator: ``"auto"`` picks ``"exact"`` for at most ``exact_max``
            agents and a sampled one beyond.
        budget: Coalition evaluations per episode for sampled estimators (``None``: the
            estimator's default, ``8n``); at least 2, and at least the estimator's minimum
            for the team (checked in ``resolve``).
        exact_max: Largest team computed exactly (``2**n`` replays an episode), at most
            :data:`trainers.credit.EXACT_MAX_AGENTS`.
        normalize: Standardise advantages per agent after GAE (matters when agents share a
            module; see ``trainers.credit_learner.PerAgentAdvantageNormalization``).
        workers: Processes that replay episodes for ``loo``/``shapley``, counting the learner
            itself (extra ones are Ray actors): ``None`` uses the cores the trainer leaves idle
            (CPUs − 1 driver − env runners − CPU learners, at least 1, at most 8). Credits do
            not depend on it.
    """

    method: CreditMethod = "team"
    estimator: CreditEstimator = "auto"
    budget: int | None = None
    exact_max: int = 8
    normalize: bool = False
    workers: int | None = None

    def check(self) -> None:
        """Every field-level rule (what the scenario supports is checked in ``resolve``)."""
        if self.method not in CREDIT_METHODS:
            raise ConfigError(
                f"credit.method={self.method!r} is an unknown credit method: use one of "
                f"{', '.join(CREDIT_METHODS)}"
            )
        if self.estimator not in CREDIT_ESTIMATORS:
            raise ConfigError(
                f"credit.estimator={self.estimator!r} is an unknown Shapley estimator: use one "
                f"of {', '.join(CREDIT_ESTIMATORS)}"
            )
        if self.budget is not None and not _int_at_least(self.budget, 2):
            raise ConfigError(
                f"credit.budget={self.budget!r} is too small: use null (8 coalition evaluations "
                "per player) or an integer ≥ 2 (v(N) and v(∅) at least)"
            )
        if not _int_at_least(self.exact_max, 0) or self.exact_max > EXACT_MAX_AGENTS:
            raise ConfigError(
                f"credit.exact_max={self.exact_max!r} is out of range: use an integer in "
                f"0…{EXACT_MAX_AGENTS} (exact Shapley values cost 2^n replays an episode)"
            )
        if not isinstance(self.normalize, bool):
            raise ConfigError(f"credit.normalize={self.normalize!r}: use true or false")
        if self.workers is not None and (not _int_at_least(self.workers, 1) or self.workers > 64):
            raise ConfigError(
                f"credit.workers={self.workers!r} is out of range: use null (the idle cores) or "
                "an integer in 1…64"
            )


def _check_async_runners(cfg: Any) -> None:
    """Asynchronous GRPO sampling overlaps remote env runners with the driver's learner."""
    grpo = getattr(cfg.algorithm, "grpo", None)
    runners = cfg.resources.num_env_runners
    if grpo is not None and grpo.async_sampling.enabled and runners < 1:
        raise ConfigError(
            f"algorithm.grpo.async_sampling.enabled=true with resources.num_env_runners="
            f"{runners}: asynchronous sampling runs on remote env runners; set "
            "resources.num_env_runners: 1 (or more), or enabled: false"
        )


#: algorithms whose learner updates take the sampled episodes (what output.rollouts dumps)
ROLLOUT_ALGOS = ("PPO", "GRPO")


def _check_rollouts(cfg: Any) -> None:
    """Rollout dumps record ``learner_group.update(episodes=...)``: PPO's and GRPO's."""
    name = cfg.algorithm.name
    if cfg.output.rollouts and name not in ROLLOUT_ALGOS:
        raise ConfigError(
            f"output.rollouts=true with algorithm.name={name!r}: rollout dumps cover "
            f"{' and '.join(ROLLOUT_ALGOS)} (their learner updates take episodes); use one of "
            "them or set output.rollouts: false"
        )


def _int_at_least(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
TurnCredit = Literal["episode", "reward_to_go", "step_groups"]
TISMode = Literal["auto", "token", "sequence", "off"]
#: ``algorithm.learner`` (PPO, GRPO): the lean learner step (:mod:`trainers.lean_learner`) or
#: RLlib's own.
LearnerKind = Literal["lean", "rllib"]
LEARNER_KINDS = ("lean", "rllib")


def check_learner(kind: Any) -> None:
    """``algorithm.learner`` is ``lean`` or ``rllib``."""
    if kind not in LEARNER_KINDS:
        raise ConfigError(
            f"algorithm.learner={kind!r} is unknown: use lean (the lean learner step, same "
            "math) or rllib (RLlib's own learner)"
        )


@dataclasses.dataclass
class TISConfig:
    """Truncated importance sampling for the sampler–learner mismatch (``grpo.tis``).

    The GRPO ratio compares the learner's logprobs with its own recompute at the start of the
    update (``lp_old``); each token's surrogate is multiplied by
    ``w = min(exp(lp_old − lp_sampler), cap)`` (``token``) or by one such weight per sequence
    from the summed differences (``sequence``), correcting for a sampler (vLLM) whose
    numerics differ from the learner's (:func:`trainers.grpo.tis_weights`).

    Attributes:
        mode: ``"auto"`` (``token`` for pools sampled by vLLM, ``off`` otherwise),
            ``"token"``, ``"sequence"`` or ``"off"`` (the ratio uses the sampler's logprobs
            as old logprobs, no recompute).
        cap: the weight's upper bound ``C`` (> 0; 2 by default).
    """

    mode: TISMode = "auto"
    cap: float = 2.0

    def __post_init__(self) -> None:
        if self.mode is False:  # YAML 1.1 reads a bare `off` as false
            self.mode = "off"
        typed(self, "grpo.tis")
        if not (self.cap > 0 and math.isfinite(self.cap)):
            raise ConfigError(
                f"grpo.tis.cap={self.cap} must be a finite number > 0 (2.0 is the usual choice)"
            )

    def active(self, sampler: str) -> bool:
        """Whether the correction applies to a pool whose ``model.sampler`` is ``sampler``."""
        return self.mode in ("token", "sequence") or (self.mode == "auto" and sampler == "vllm")


@dataclasses.dataclass
class GRPOConfig:
    """Knobs of the GRPO loss; the defaults follow DAPO (clip-higher, dynamic sampling).

    Attributes:
        clip_low: ratio lower bound is ``1 − clip_low``.
        clip_high: ratio upper bound is ``1 + clip_high`` (clip-higher: > ``clip_low``).
        scale_std: divide group-centred rewards by the group's std (GRPO); ``False`` only
            centres them (Dr. GRPO).
        adv_eps: added to the std.
        dynamic_sampling: drop groups whose rewards are all equal.
        dynamic_sampling_tol: a group is "all equal" when ``max − min <= tol``.
        spurious_mask: mask spurious tokens (see :func:`spurious_token_mask`).
        spurious_prob_max: a token is improbable when its probability is below this.
        spurious_entropy_max: the policy is confident when the entropy (nats) is below this.
        length_budget: target mean completion length in tokens (``None``: no budget).
        dual_lr: step size ``η`` of the dual variable's update.
        dual_init: initial value of the dual variable ``λ``.
        kl_coef: weight of the k3 KL to the reference model (``0``: no KL, no reference).
        format_penalty: subtracted from the reward of a sample with a malformed tool call.
        loss_agg: ``"token_mean"`` (every unmasked token in the batch weighs the same,
            DAPO), ``"seq_mean_token_mean"`` (mean over tokens, then over sequences,
            GRPO), or ``"seq_mean_token_sum"`` (sum over tokens, mean over sequences).
        turn_credit: how an agent's advantage is spread over its turns
            (:mod:`trainers.turn_credit`): ``"episode"`` (every turn gets the episode
            advantage), ``"reward_to_go"`` (a turn is not credited with rewards paid before
            it) or ``"step_groups"`` (GiGPO: the episode advantage plus ``step_weight`` × the
            turn's reward-to-go normalised among the group's turns from the same anchor state).
        step_weight: weight of the step-group advantage (``turn_credit: step_groups``).
        tis: truncated importance sampling against the sampler's logprobs
            (:class:`TISConfig`; on for vLLM-sampled pools by default).
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    scale_std: bool = True
    adv_eps: float = 1e-6
    dynamic_sampling: bool = True
    dynamic_sampling_tol: float = 0.0
    spurious_mask: bool = False
    spurious_prob_max: float = 0.05
    spurious_entropy_max: float = 1.0
    length_budget: float | None = None
    dual_lr: float = 0.05
    dual_init: float = 0.0
    kl_coef: float = 0.0
    format_penalty: float = 0.0
    loss_agg: LossAgg = "token_mean"
    turn_credit: TurnCredit = "episode"
    step_weight: float = 1.0
    tis: TISConfig = dataclasses.field(default_factory=TISConfig)

    def __post_init__(self) -> None:
        typed(self, "grpo")
        GRPOConfig.check(self)  # the learner builds these directly: bad knobs fail at once

    def check(self, where: str = "grpo") -> None:
        """The loss knobs' ranges."""
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ConfigError(
                f"{where}: need 0 ≤ clip_low < 1 and clip_high ≥ 0, got clip_low={self.clip_low}, "
                f"clip_high={self.clip_high}"
            )
        if self.length_budget is not None and self.length_budget <= 0:
            raise ConfigError(
                f"{where}.length_budget must be > 0 tokens (or null), got {self.length_budget}"
            )
        if not (self.step_weight >= 0 and math.isfinite(self.step_weight)):
            raise ConfigError(
                f"{where}.step_weight={self.step_weight} must be a finite number ≥ 0 (1.0 adds "
                "the step-group advantage to the episode advantage at equal weight)"
            )


@dataclasses.dataclass
class AsyncSampling:
    """``algorithm.grpo.async_sampling``: overlap sampling with learning (one-step off-policy).

    With ``enabled``, iteration ``k`` launches the sample for ``k+1`` on the remote env runners
    before its learner update, so the batch an update learns from was drawn by a policy
    ``staleness`` updates old; the GRPO ratio against the stored behaviour logprobs corrects
    for it (:mod:`trainers.async_sampling`). Needs ``resources.num_env_runners ≥ 1``.

    Attributes:
        enabled: overlap sampling of iteration ``k+1`` with the update of iteration ``k``.
        max_staleness: largest policy-version gap between an episode's oldest step and the
            update that learns from it (≥ 1). Weights reach the runners only as often as this
            bound needs (every update at 1); an episode over it is dropped and counted.
    """

    enabled: bool = False
    max_staleness: int = 1

    def __post_init__(self) -> None:
        typed(self, "async_sampling")

    def check(self, where: str = "algorithm.grpo.async_sampling") -> None:
        """``max_staleness ≥ 1``."""
        if self.max_staleness < 1:
            raise ConfigError(
                f"{where}.max_staleness={self.max_staleness}: must be ≥ 1 (the overlapped "
                "sample is one update old); for on-policy sampling set enabled: false"
            )


@dataclasses.dataclass
class GRPOSettings(GRPOConfig):
    """The ``grpo`` section of algorithm ``GRPO``: the loss knobs and the group schedule.

    Every field of :class:`GRPOConfig` (the loss), plus:

    Attributes:
        group_size: ``G`` rollouts per task (the GRPO group; ≥ 2), sampled side by side as
            ``G`` vector sub-envs sharing one task-seed stream when the team has LLM pools,
            else one after another in one env (``resources.num_envs_per_env_runner`` is
            replaced by ``G`` or 1).
        groups_per_iteration: tasks per iteration: ``G · groups`` finished episodes per
            iteration.
        minibatch_size: rows per gradient step (``None``: the whole iteration).
        async_sampling: overlap sampling with learning (:class:`AsyncSampling`; off).
    """

    group_size: int = 8
    groups_per_iteration: int = 8
    minibatch_size: int | None = None
    async_sampling: AsyncSampling = dataclasses.field(default_factory=AsyncSampling)

    @property
    def episodes_per_iteration(self) -> int:
        """``group_size · groups_per_iteration``."""
        return self.group_size * self.groups_per_iteration

    @property
    def loss(self) -> GRPOConfig:
        """The loss knobs alone (what the learner reads)."""
        names = [f.name for f in dataclasses.fields(GRPOConfig)]
        return GRPOConfig(**{n: getattr(self, n) for n in names})

    def check(self, where: str = "algorithm.grpo") -> None:
        """The loss knobs and the group schedule."""
        super().check(where)
        if self.group_size < 2:
            raise ConfigError(
                f"{where}.group_size={self.group_size}: GRPO normalises rewards within a group, "
                "so it needs ≥ 2 rollouts per task (8 is a good start)"
            )
        if self.groups_per_iteration < 1:
            raise ConfigError(
                f"{where}.groups_per_iteration must be ≥ 1, got {self.groups_per_iteration}"
            )
        n = self.episodes_per_iteration
        if self.minibatch_size is not None and not 1 <= self.minibatch_size <= n:
            raise ConfigError(
                f"{where}.minibatch_size={self.minibatch_size} must be in 1…{n} "
                "(group_size · groups_per_iteration), or null for the whole iteration"
            )
        self.async_sampling.check(f"{where}.async_sampling")


@dataclasses.dataclass
class AlgoConfig:
    """The RL algorithm: the base of one config class per ``name`` (:data:`ALGORITHMS`).

    ``name`` is fixed by the class and selects it in YAML (``algorithm: {name: APPO, lr: …}``
    or just ``algorithm: APPO``); each class holds only the fields its algorithm reads.

    Attributes:
        name: ``"PPO"``, ``"APPO"``, ``"IMPALA"`` or ``"GRPO"``, set by the class.
        lr: learning rate.
        num_epochs: passes over each train batch.
        grad_clip: gradient norm clip (``None``: off).
        extra: more keyword arguments for RLlib's ``AlgorithmConfig.training`` (named as
            RLlib names them), e.g. ``{"kl_coeff": 0.0}``; an unknown key is a
            :class:`ConfigError` in ``resolve``.
    """

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

    name: str = dataclasses.field(default="IMPALA", init=False)


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

    name: str = dataclasses.field(default="APPO", init=False)


@dataclasses.dataclass
class PPOAlgo(ClippedAlgo):
    """``PPO`` (the default).

    The critic: with ``value_norm`` (on by default) it learns normalised value targets and its
    outputs are de-normalised wherever they are used as values (GAE, the bootstrap value of cut
    episodes); see :mod:`trainers.value_norm`. Value clipping is off: RLlib's PPO loss clamps
    the *squared* value error at ``vf_clip_param`` (10 by RLlib's default, which stops the
    critic's gradient wherever ``|V − target| > 3.2`` and stalled ``vf_explained_var`` at 0 on
    scenarios whose returns are larger, issue #27), so it is set to infinity here;
    ``extra: {vf_clip_param: …}`` brings the clamp back (on normalised errors, in units of σ²,
    when ``value_norm`` is on). The ``critic`` monitor (:mod:`trainers.monitors`) warns when the
    critic stops explaining the returns or most of its loss is clipped.

    Attributes:
        minibatch_size: SGD minibatch size (≤ ``train_batch_size``).
        learner: ``lean`` (:mod:`trainers.lean_learner`: the same PPO math, fused Adam, less
            work per minibatch) or ``rllib`` (RLlib's own learner step).
        value_norm: normalise the critic's value targets with a running mean and std per
            module (statistics in the learner state, checkpointed); ``false``: the critic
            learns raw returns, as RLlib does.
    """

    name: str = dataclasses.field(default="PPO", init=False)
    minibatch_size: int = 250
    learner: LearnerKind = "lean"
    value_norm: bool = True

    def check(self) -> None:
        super().check()
        check_learner(self.learner)
        if self.minibatch_size < 1:
            raise ConfigError(f"algorithm.minibatch_size must be ≥ 1, got {self.minibatch_size}")
        if self.minibatch_size > self.train_batch_size:
            raise ConfigError(
                f"algorithm.minibatch_size={self.minibatch_size} exceeds train_batch_size="
                f"{self.train_batch_size}: lower it or raise the batch"
            )

    def training_kwargs(self) -> dict[str, Any]:
        kw = super().training_kwargs()
        # no value clipping (see the class doc); ``extra`` may set it
        return {**kw, "minibatch_size": self.minibatch_size, "vf_clip_param": math.inf}


@dataclasses.dataclass
class GRPOAlgo(AlgoConfig):
    """``GRPO``: token-level GRPO for LLM pools (:mod:`trainers.grpo_learner`), chosen
    explicitly (``resolve`` rejects LLM pools with another algorithm); small-network pools
    (``mlp``, ``gru``, ...) train with the same loss on their action logprobs (no ``kl_coef``).
    No value function, no GAE: an iteration's batch is
    ``grpo.group_size · grpo.groups_per_iteration`` finished episodes.

    Attributes:
        grpo: the loss knobs and group schedule.
        learner: ``lean`` (:mod:`trainers.lean_learner`: the same GRPO math, fused Adam) or
            ``rllib`` (the GRPO learner on RLlib's own step).
    """

    name: str = dataclasses.field(default="GRPO", init=False)
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
    cls.name: cls for cls in (PPOAlgo, APPOAlgo, IMPALAAlgo, GRPOAlgo)
}


@dataclasses.dataclass
class BudgetConfig:
    """When training stops: the first of the limits that are set.

    Attributes:
        iterations: training iterations (one train batch each).
        env_steps: environment steps sampled.
        time_s: wall-clock seconds.
    """

    iterations: int | None = 40
    env_steps: int | None = None
    time_s: float | None = None

    def __post_init__(self) -> None:
        typed(self, "budget")

    def check(self) -> None:
        """At least one limit, every set limit positive."""
        limits = {"iterations": self.iterations, "env_steps": self.env_steps, "time_s": self.time_s}
        if all(v is None for v in limits.values()):
            raise ConfigError(
                "budget has no limit: set budget.iterations, budget.env_steps or budget.time_s"
            )
        for name, value in limits.items():
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ConfigError(
                    f"budget.{name} must be positive (or null to disable it), got {value!r}"
                )


@dataclasses.dataclass
class ResourcesConfig:
    """Where the work runs (defaults: everything in one process, tuned for a small CPU box).

    Attributes:
        num_env_runners: remote env-runner processes (0: sample in the driver; on 2 cores a
            second process buys almost nothing).
        num_envs_per_env_runner: environments stepped together per runner (batched inference).
        num_learners: remote learner processes (0: learn in the driver).
        num_gpus_per_learner: GPUs per learner (needs a GPU on the machine or cluster).
        num_cpus: CPUs Ray may use (``None``: all of this machine's).
    """

    num_env_runners: int = 0
    num_envs_per_env_runner: int = 16
    num_learners: int = 0
    num_gpus_per_learner: float = 0.0
    num_cpus: int | None = None

    def __post_init__(self) -> None:
        typed(self, "resources")

    def check(self) -> None:
        """Non-negative counts."""
        if self.num_env_runners < 0 or self.num_learners < 0 or self.num_gpus_per_learner < 0:
            raise ConfigError("resources: counts must be ≥ 0")
        if self.num_envs_per_env_runner < 1:
            raise ConfigError("resources.num_envs_per_env_runner must be ≥ 1")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError("resources.num_cpus must be ≥ 1 or null")


@dataclasses.dataclass
class LoggingConfig:
    """Experiment tracking.

    Attributes:
        wandb: ``"offline"`` (default: files under the run dir, no account), ``"online"`` or
            ``"disabled"``.
        project: wandb project.
        entity: wandb entity (team or user), online only.
        progress: show a progress bar and summary tables.
    """

    wandb: str = "offline"
    project: str = "marl-orchestra"
    entity: str | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        typed(self, "logging")

    def check(self) -> None:
        """Known wandb mode."""
        if self.wandb not in WANDB_MODES:
            raise ConfigError(
                f"logging.wandb={self.wandb!r} is unknown: use one of {', '.join(WANDB_MODES)}"
            )


@dataclasses.dataclass
class OutputConfig:
    """Where results go.

    Attributes:
        dir: parent directory of run directories.
        name: run directory name (default ``{scenario}__{algo}__{seed}__{time}``).
        checkpoint_every: save a checkpoint every this many iterations (0: only at the end).
        plot: write a learning-curve PNG at the end.
        transcripts: episodes of each iteration saved as readable transcripts under
            ``<run>/transcripts/`` (0: none).
        export_hf: also save every trained LLM pool in Hugging Face format (model and
            tokenizer, ``save_pretrained``): ``<checkpoint>/model/<pool>`` with each periodic
            checkpoint and ``<run>/model/<pool>`` at the end.
        rollouts: save what every learner update consumed (episodes, behaviour log-probs,
            update arguments, RNG state), compressed, as ``<run>/rollouts/iter_NNNNNN.npz``;
            ``trainers.rollouts.replay_updates`` redoes the updates from a checkpoint.
    """

    dir: str = "runs"
    name: str | None = None
    checkpoint_every: int = 10
    plot: bool = True
    transcripts: int = 2
    export_hf: bool = False
    rollouts: bool = False

    def __post_init__(self) -> None:
        typed(self, "output")

    def check(self) -> None:
        """Non-negative checkpoint interval and transcript count."""
        if self.checkpoint_every < 0:
            raise ConfigError("output.checkpoint_every must be ≥ 0 (0: only at the end)")
        if not 0 <= self.transcripts <= 100:
            raise ConfigError(
                f"output.transcripts must be in 0…100 episodes per iteration, got "
                f"{self.transcripts}"
            )


#: ``episodes.engine`` values: scenarios.graph_env.ENGINES (kept here so that loading a config does
#: not import LangGraph; tests/test_fast_path.py checks that they agree)
ENGINES = ("auto", "langgraph", "fast", "check")
SAMPLERS = ("auto", "batched", "rllib")


@dataclasses.dataclass
class EpisodesConfig:
    """How episodes may fail, and when failures stop a run.

    Attributes:
        timeout_s: wall-clock seconds the graph may run in one episode (the time inside the
            env's ``reset``/``step``; the policy's time between decisions does not count). A
            longer episode is truncated and counted in ``charts/timeout_rate``; a node that
            blocks is interrupted where the env runs in a process's main thread (see
            :mod:`scenarios.alarm`). ``None``: no limit.
        fail_after: stop the run, with the first error, once every finished episode failed (a
            node error or a timeout) in this many consecutive iterations; 0: never stop.
        engine: how episodes run: ``auto`` (the stepped fast path where the graph compiles for
            it, else LangGraph), ``langgraph``, ``fast`` (the fast path, or an error naming why
            not) or ``check`` (both, compared at every step: slow, for tests); the same
            episodes either way (:class:`scenarios.graph_env.GraphEnv`).
        sampler: how env runners sample: ``auto`` (= ``batched``), ``batched``
            (:mod:`trainers.batched_runner`: one forward per module per step over all acting
            agents, for an LLM pool one batched ``generate``; per-env RNG streams) or ``rllib``
            (RLlib's own ``MultiAgentEnvRunner``, for comparison).
        env_threads: with the batched sampler, step each env of a runner on its own thread,
            so episodes waiting on slow tools or remote model calls do not hold the others
            (raise ``resources.num_envs_per_env_runner`` to keep more episodes in flight); a
            call running past ``timeout_s`` loses its episode (counted as a timeout) and its
            env is replaced. Off: envs step one after another in the sampler's thread.
            With threads each env's episodes are the same as without, but which envs' steps
            fill a ``sample()`` depends on when their calls return: runs (and resumes) are not
            bit-reproducible.
        tool_latency: ``{seconds: L, jitter: J}``: every tool call of a live episode first
            waits ``L`` s, or ``L ± J`` uniform from an RNG of its own (the episodes stay the
            same), for benchmarks and tests of slow tools (:mod:`scenarios.tool_latency`);
            ``None``: no latency.
        tool_timeout_s: a tool call longer than this raises ``ToolTimeout`` inside the tool
            (by default the episode fails with that error); ``None``: no limit.
    """

    timeout_s: float | None = 300.0
    fail_after: int = 1
    engine: str = "auto"
    sampler: str = "auto"
    env_threads: bool = False
    tool_latency: ToolLatency | None = None
    tool_timeout_s: float | None = None

    def __post_init__(self) -> None:
        typed(self, "episodes")

    def check(self) -> None:
        """A positive timeout (or null) and a non-negative iteration count."""
        if self.timeout_s is not None and not (
            self.timeout_s > 0 and math.isfinite(self.timeout_s)
        ):
            raise ConfigError(
                f"episodes.timeout_s must be a positive number of seconds, or null for no "
                f"limit, got {self.timeout_s!r}"
            )
        if self.fail_after < 0:
            raise ConfigError(
                f"episodes.fail_after must be ≥ 0 iterations (0: never stop), got {self.fail_after}"
            )
        if self.engine not in ENGINES:
            raise ConfigError(
                f"episodes.engine must be one of {', '.join(ENGINES)}, got {self.engine!r}"
            )
        if self.sampler not in SAMPLERS:
            raise ConfigError(
                f"episodes.sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}"
            )
        if self.tool_timeout_s is not None and not (
            self.tool_timeout_s > 0 and math.isfinite(self.tool_timeout_s)
        ):
            raise ConfigError(
                f"episodes.tool_timeout_s must be a positive number of seconds, or null for no "
                f"limit, got {self.tool_timeout_s!r}"
            )


@dataclasses.dataclass
class ExperimentConfig:
    """One experiment: scenario × topology × pools × credit × algorithm × run settings.

    Attributes:
        scenario: a registered scenario name (``marl scenarios`` lists them), or an import
            reference ``package.module:attr`` to your own scenario: a ``Scenario`` subclass,
            a ``Scenario`` instance or a function returning one. Every process (env runners,
            credit workers, Tune trials) rebuilds it by importing the reference; a class or
            function gets ``scenario_kwargs`` and, when set, ``topology`` as keyword arguments
            (see :mod:`scenarios.registry`).
        scenario_kwargs: keyword arguments of the scenario (none for a ``Scenario`` instance).
        topology: topology spec (``"star:3"``), a ``Topology.to_dict()`` mapping, or ``None``
            for the scenario's default.
        sharing: how agents not listed in ``pools`` are pooled: ``"role"`` (parameter sharing
            by role, default), ``"agent"`` (no sharing), ``"team"`` (one module) or
            ``"explicit"`` (only the listed pools).
        pools: pool id → :class:`PoolConfig` (its model; optionally the agents it serves).
        train: agent or pool ids that learn (``None``: all learnable pools).
            ``["orchestrator"]`` trains the orchestrator against frozen subagents: frozen pools
            with no configured model get the scenario's registered scripted policy for their
            role (e.g. ``delegate.scripted_worker``).
        credit: credit assignment (or its method: ``credit="shapley"``).
        algorithm: algorithm and hyperparameters: one of :data:`ALGORITHMS` (or its name:
            ``algorithm="APPO"``).
        budget: when to stop.
        seed: experiment seed (also set ``PYTHONHASHSEED`` for bit-identical reruns; the CLI
            does).
        resources: processes, environments, GPUs.
        logging: wandb and progress display.
        output: run directory, checkpoints, plots, transcripts.
        episodes: the wall-clock limit per episode, and when failing episodes stop the run.
        rewards: reward sources composing the reward (:mod:`trainers.reward_config`; empty:
            the scenario's verifier reward as it is).
        curriculum: which tasks episodes play (:class:`~trainers.curriculum.CurriculumConfig`).
        monitors: the reward-hacking and collapse monitors (:mod:`trainers.monitors`).
    """

    scenario: str = "delegate"
    scenario_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    topology: str | dict[str, Any] | None = None
    sharing: str = "role"
    pools: dict[str, PoolConfig] = dataclasses.field(default_factory=dict)
    train: list[str] | None = None
    credit: CreditConfig = dataclasses.field(default_factory=CreditConfig)
    algorithm: AlgoConfig = dataclasses.field(default_factory=PPOAlgo)
    budget: BudgetConfig = dataclasses.field(default_factory=BudgetConfig)
    seed: int = 0
    resources: ResourcesConfig = dataclasses.field(default_factory=ResourcesConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    output: OutputConfig = dataclasses.field(default_factory=OutputConfig)
    episodes: EpisodesConfig = dataclasses.field(default_factory=EpisodesConfig)
    rewards: RewardsConfig = dataclasses.field(default_factory=RewardsConfig)
    curriculum: CurriculumConfig = dataclasses.field(default_factory=CurriculumConfig)
    monitors: MonitorsConfig = dataclasses.field(default_factory=MonitorsConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.scenario, str):
            _check_scenario_name(self.scenario)  # names the reference to use instead
        typed(self, "")

    # ----- validation ----------------------------------------------------------------------
    def check(self) -> ExperimentConfig:
        """Field-level validation (no scenario built); returns ``self``.

        Raises:
            ConfigError: the first bad field, named with the fix.
        """
        _check_scenario_name(self.scenario)
        if self.sharing not in SHARING:
            raise ConfigError(
                f"sharing={self.sharing!r} is unknown: use one of {', '.join(SHARING)}"
            )
        if self.train is not None and (
            isinstance(self.train, str) or not all(isinstance(t, str) for t in self.train)
        ):
            raise ConfigError(f"train must be a list of agent or pool ids, got {self.train!r}")
        if self.train is not None and not self.train:
            raise ConfigError("train is empty: list agent or pool ids, or null to train all")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be an integer ≥ 0, got {self.seed!r}")
        for part in (
            self.credit,
            self.algorithm,
            self.budget,
            self.resources,
            self.logging,
            self.output,
            self.episodes,
            self.rewards,
            self.curriculum,
            self.monitors,
        ):
            part.check()
        _check_async_runners(self)
        _check_rollouts(self)
        return self

    # ----- conversions ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A plain, YAML-safe dict (nested dataclasses become dicts)."""
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentConfig:
        """Build from :meth:`to_dict` output or hand-written YAML.

        Shorthands: ``algorithm: PPO`` and ``credit: shapley`` set just the name / method;
        a pool or a model given as a string is its model type (``worker: scripted`` is
        rejected without a policy, so ``worker: {model: {type: scripted, policy: ...}}``).

        Raises:
            ConfigError: an unknown key (the message lists the valid ones) or a wrong type.
        """
        return from_plain(cls, dict(data or {}), "config")

    def to_yaml(self, path: str | Path | None = None) -> str:
        """YAML text of :meth:`to_dict` (field order kept); also written to ``path`` if given."""
        return dump_yaml(self.to_dict(), path)

    @classmethod
    def from_yaml(cls, source: str | Path) -> ExperimentConfig:
        """Load from YAML text or a ``.yaml``/``.yml`` file path."""
        data = load_yaml_mapping(source, "config", "scenario: ..., ...")
        return cls.from_dict(data or {})

    def replace(self, **changes: Any) -> ExperimentConfig:
        """A copy with dotted-path changes, e.g. ``replace(**{"algorithm.lr": 1e-3})``.

        Changing a kind (``algorithm.name``, ``pools.<id>.model.type``) keeps the fields the
        new kind has and drops the old kind's others where they hold their default (or null);
        one set to anything else is an error naming it.
        """
        data = self.to_dict()
        for key, value in changes.items():
            set_path(data, key, value)
        _drop_default_fields(data.get("algorithm"), self.algorithm, "name", ALGORITHMS)
        for pid, pool in self.pools.items():
            new = data.get("pools", {}).get(pid)
            if isinstance(new, dict):
                _drop_default_fields(new.get("model"), pool.model, "type", MODELS)
        return ExperimentConfig.from_dict(data)

    @property
    def env_config(self) -> dict[str, Any]:
        """The :class:`scenarios.rllib_env.RLlibGraphEnv` config of this experiment."""
        return {
            "scenario": self.scenario,
            "topology": self.topology,
            "kwargs": dict(self.scenario_kwargs),
            **({"rewards": self.rewards.to_spec()} if self.rewards.sources else {}),
        }


def _check_scenario_name(value: Any) -> None:
    """``scenario`` is a non-empty name or a well-formed ``package.module:attr`` reference."""
    from scenarios.base import ScenarioError
    from scenarios.registry import REF_HELP, is_reference, parse_reference

    if isinstance(value, str) and value.strip():
        if is_reference(value):
            try:
                parse_reference(value)
            except ScenarioError as exc:
                raise ConfigError(f"scenario={value!r}: {exc}") from None
        return
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None) or getattr(type(value), "__qualname__", "")
    if not isinstance(value, type) and not callable(value):
        qualname = ""  # an instance: the module names its variable, not its class
    if module and module != "__main__" and qualname:
        fix = f"scenario='{module}:{qualname}'"
    elif module and module != "__main__":
        fix = f"scenario='{module}:<the variable holding it>'"
    else:
        fix = "a reference to a module that defines it (not __main__: Ray's workers import it)"
    raise ConfigError(
        f"scenario must be {REF_HELP}, got {type(value).__name__} {value!r:.60}: use {fix}"
    )


def _drop_default_fields(data: Any, old: Any, key: str, kinds: dict[str, type]) -> None:
    """After a change of ``data[key]`` (a kind), drop the fields the new kind lacks that hold
    the old kind's default or null (the rest stay, so building the new kind names them)."""
    if not isinstance(data, dict) or data.get(key) == getattr(old, key):
        return
    new_cls = kinds.get(data.get(key))  # type: ignore[arg-type]
    if new_cls is None:
        return  # an unknown kind: building names it
    keep = {f.name for f in dataclasses.fields(new_cls)}
    defaults = to_plain(type(old)())
    for name in [k for k in data if k not in keep]:
        if data[name] is None or data[name] == defaults.get(name):
            del data[name]


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``dotted="a.b"``, creating mappings on the way."""
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted!r}: {key!r} is not a mapping")
        node = child
    node[keys[-1]] = value


# ----- YAML files of configs and jobs ------------------------------------------------------------
def dump_yaml(data: dict[str, Any], path: str | Path | None = None) -> str:
    """YAML text of a plain dict (field order kept); also written to ``path`` if given."""
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    if path is not None:
        Path(path).write_text(text)
    return text


def load_yaml_mapping(source: str | Path, what: str, example: str) -> dict[str, Any] | None:
    """The mapping in YAML text or a ``.yaml``/``.yml`` file (None for an empty document).

    Raises:
        ConfigError: a missing file, invalid YAML or a document that is not a mapping; the
            message names ``what`` ("config", "job") and shows ``example`` fields.
    """
    text = str(source)
    if isinstance(source, Path) or ("\n" not in text and text.endswith((".yaml", ".yml"))):
        path = Path(source)
        if not path.exists():
            raise ConfigError(f"{what} file {path} does not exist: give the path of a {what} YAML")
        text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} is not valid YAML: {exc}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"a {what} YAML must be a mapping ({example})")
    return data


# ----- generic dataclass <-> plain conversion -----------------------------------------------
def to_plain(value: Any) -> Any:
    """A dataclass (nested dataclasses, dicts, lists) as plain YAML-safe values.

    Floats stay floats (``0`` in a ``float`` field is written ``0.0``), so a YAML round trip
    through :func:`from_plain` gives back an equal object.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hints = _hints(type(value))
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            floaty = hints[f.name] in (float, float | None)
            if floaty and isinstance(item, int) and not isinstance(item, bool):
                item = float(item)  # 0 and 0.0 must write the same YAML
            out[f.name] = to_plain(item)
        return out
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def typed(obj: Any, where: str) -> None:
    """Check (and normalise) every field of dataclass ``obj`` against its type, in place.

    Called by the configs' ``__post_init__``, so an object built in Python is checked as one
    read from YAML: ``BudgetConfig(iterations=2.5)`` is a :class:`ConfigError`, booleans are
    not numbers, and the YAML shorthands apply (``algorithm="APPO"``). ``where`` names the
    object in errors (``"budget"``; ``""`` for the top level).
    """
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.init:
            value = getattr(obj, f.name)
            new = _coerce(hints[f.name], value, f"{where}.{f.name}" if where else f.name)
            if new is not value:
                object.__setattr__(obj, f.name, new)


def from_plain(cls: type, data: Any, where: str) -> Any:
    """Build dataclass ``cls`` from plain values (:func:`to_plain` output or hand-written YAML).

    Values are checked against the field types (nested dataclasses, lists, dicts, unions,
    ``Literal``); ``where`` names the object in errors (``"config"`` → ``config.algorithm.lr``).
    An instance of ``cls`` is checked the same way (a copy is returned if values change).

    Raises:
        ConfigError: an unknown field (the message lists the valid ones), a wrong type, or a
            value the dataclass itself rejects (a ``ValueError`` from ``__post_init__``).
    """
    if isinstance(data, cls):
        return _checked_instance(data, where)
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {data!r}")
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; valid fields are {names}")
    hints = _hints(cls)
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _checked_instance(obj: Any, where: str) -> Any:
    hints = _hints(type(obj))
    changes = {}
    for f in dataclasses.fields(obj):
        if f.init:
            value = getattr(obj, f.name)
            new = _coerce(hints[f.name], value, f"{where}.{f.name}")
            if new is not value and (type(new) is not type(value) or new != value):
                changes[f.name] = new
    return dataclasses.replace(obj, **changes) if changes else obj


#: base class → (the field that selects the subclass, kind → class, the default kind).
_KINDS: dict[type, tuple[str, dict[str, type], str]] = {
    ModelConfig: ("type", MODELS, "mlp"),  # type: ignore[dict-item]
    AlgoConfig: ("name", ALGORITHMS, "PPO"),  # type: ignore[dict-item]
}
#: class → how a string stands for it (the YAML shorthands).
_SHORTHANDS: dict[type, typing.Callable[[str], dict[str, Any]]] = {
    ModelConfig: lambda s: {"type": s},
    AlgoConfig: lambda s: {"name": s},
    PoolConfig: lambda s: {"model": {"type": s}},
    CreditConfig: lambda s: {"method": s},
    TISConfig: lambda s: {"mode": s},
}


#: classes whose own ``check()`` validates every field: an instance is taken as it is.
_CHECKS_ITSELF: tuple[type, ...] = (CreditConfig,)


def _coerce_dataclass(tp: type, value: Any, where: str) -> Any:
    if isinstance(value, str) and tp in _SHORTHANDS:
        value = _SHORTHANDS[tp](value)
    if tp in _CHECKS_ITSELF and isinstance(value, tp):
        return value
    if tp not in _KINDS:
        return from_plain(tp, value, where)
    key, kinds, default = _KINDS[tp]
    if isinstance(value, tp):
        if type(value) not in kinds.values():
            classes = ", ".join(c.__name__ for c in kinds.values())
            raise ConfigError(f"{where}: {type(value).__name__} is a base class: use {classes}")
        return from_plain(type(value), value, where)
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {value!r}")
    kind = value.get(key, default)
    if kind not in kinds:
        raise ConfigError(
            f"{where}.{key}={kind!r} is not one of {', '.join(map(repr, kinds))}: use one of "
            f"{', '.join(kinds)}"
        )
    cls = kinds[kind]
    fields = {k: v for k, v in value.items() if k != key}
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in fields if k not in names]
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]} is set but {where}.{key} is {kind!r}, which has no field(s) "
            f"{unknown}: remove them (its fields are {names})"
        )
    return from_plain(cls, fields, where)


def _coerce_union(tp: Any, value: Any, where: str) -> Any:
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(arg, value, where)
        except ConfigError as exc:
            errors.append(str(exc))
    if len(errors) == 1:
        raise ConfigError(errors[0])
    kinds = ", ".join(_type_name(a) for a in args)
    raise ConfigError(f"{where} must be {kinds}, got {value!r}")


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    return {dict: "a mapping", list: "a list", str: "a string"}.get(origin or tp, str(tp))


def _coerce_literal(tp: Any, value: Any, where: str) -> Any:
    if value not in typing.get_args(tp):
        choices = ", ".join(map(repr, typing.get_args(tp)))
        raise ConfigError(f"{where}={value!r} is not one of {choices}")
    return value


def _coerce_list(tp: Any, value: Any, where: str) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where} must be a list, got {value!r}")
    (item,) = typing.get_args(tp)
    return [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]


def _coerce_dict(tp: Any, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {value!r}")
    _, item = typing.get_args(tp)
    return {str(k): _coerce(item, v, f"{where}.{k}") for k, v in value.items()}


def _coerce_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def _coerce_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    return value


def _coerce_float(value: Any, where: str) -> float:
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{where} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} must be a number, got {value!r}")
    return float(value)


def _coerce_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {value!r}")
    return value


_SCALARS: dict[Any, typing.Callable[[Any, str], Any]] = {
    bool: _coerce_bool,
    int: _coerce_int,
    float: _coerce_float,
    str: _coerce_str,
}
_GENERICS: dict[Any, typing.Callable[[Any, Any, str], Any]] = {
    typing.Union: _coerce_union,
    types.UnionType: _coerce_union,
    Literal: _coerce_literal,
    list: _coerce_list,
    dict: _coerce_dict,
}


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """``value`` checked against type ``tp`` (and normalised: ``1`` → ``1.0`` for floats)."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in _GENERICS:
        return _GENERICS[origin](tp, value, where)
    if dataclasses.is_dataclass(tp):
        return _coerce_dataclass(tp, value, where)  # type: ignore[arg-type]
    if tp in _SCALARS:
        return _SCALARS[tp](value, where)
    return value
