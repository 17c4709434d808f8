"""``algorithm.grpo:``: the GRPO loss knobs (:class:`GRPOLoss`), truncated importance sampling
(:class:`TISConfig`), asynchronous sampling (:class:`AsyncSampling`) and the whole section
(:class:`GRPOSettings`: the loss knobs plus the group schedule). The loss is
:mod:`trainers.grpo.loss`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from trainers.configs.typed import ConfigError, register_shorthand, typed

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
TurnCredit = Literal["episode", "reward_to_go", "step_groups"]
TISMode = Literal["auto", "token", "sequence", "off"]


@dataclasses.dataclass
class TISConfig:
    """Truncated importance sampling for the sampler–learner mismatch (``grpo.tis``).

    The GRPO ratio compares the learner's logprobs with its own recompute at the start of the
    update (``lp_old``); each token's surrogate is multiplied by
    ``w = min(exp(lp_old − lp_sampler), cap)`` (``token``) or by one such weight per sequence
    from the summed differences (``sequence``), correcting for a sampler (vLLM) whose
    numerics differ from the learner's (:func:`trainers.grpo.loss.tis_weights`).

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
class GRPOLoss:
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
            (:mod:`trainers.grpo.turn_credit`): ``"episode"`` (every turn gets the episode
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
        GRPOLoss.check(self)  # the learner builds these directly: bad knobs fail at once

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
    for it (:mod:`trainers.grpo.async_sampling`). Needs ``resources.num_env_runners ≥ 1``.

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
class GRPOSettings(GRPOLoss):
    """The ``grpo`` section of algorithm ``GRPO``: the loss knobs and the group schedule.

    Every field of :class:`GRPOLoss` (the loss), plus:

    Attributes:
        group_size: ``G`` rollouts per task (the GRPO group; ≥ 2), sampled side by side as
            ``G`` vector sub-envs sharing one task-seed stream when the team has LLM pools,
            else one after another in one env (``resources.num_envs_per_env_runner`` is
            replaced by ``G`` or 1).
        groups_per_iteration: tasks per iteration: ``G · groups`` finished episodes per
            iteration.
        groups_in_flight: groups an env runner samples side by side (LLM teams on the
            batched sampler: ``groups_in_flight · G`` sub-envs, and every step's decisions of
            all of them in one batched ``generate`` per pool); ``None`` (default): the runner's
            whole share of an iteration, ``ceil(groups_per_iteration / max(1,
            num_env_runners))``; 1: one group at a time (before issue #29). Each group stays
            whole (its ``G`` sub-envs start one task together and wait for each other). Only
            the speed depends on it: each rollout draws from its own random stream and
            episodes reach the learner in schedule order, so the learner gets the same rows
            at every value (issue #44; ``marl finetune`` takes this default too).
        minibatch_size: rows per gradient step (``None``: the whole iteration).
        async_sampling: overlap sampling with learning (:class:`AsyncSampling`; off).
    """

    group_size: int = 8
    groups_per_iteration: int = 8
    groups_in_flight: int | None = None
    minibatch_size: int | None = None
    async_sampling: AsyncSampling = dataclasses.field(default_factory=AsyncSampling)

    @property
    def episodes_per_iteration(self) -> int:
        """``group_size · groups_per_iteration``."""
        return self.group_size * self.groups_per_iteration

    @property
    def loss(self) -> GRPOLoss:
        """The loss knobs alone (what the learner reads)."""
        names = [f.name for f in dataclasses.fields(GRPOLoss)]
        return GRPOLoss(**{n: getattr(self, n) for n in names})

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
        if self.groups_in_flight is not None and self.groups_in_flight < 1:
            raise ConfigError(
                f"{where}.groups_in_flight={self.groups_in_flight}: must be ≥ 1 (groups an env "
                "runner samples side by side), or null for the runner's share of an iteration"
            )
        n = self.episodes_per_iteration
        if self.minibatch_size is not None and not 1 <= self.minibatch_size <= n:
            raise ConfigError(
                f"{where}.minibatch_size={self.minibatch_size} must be in 1…{n} "
                "(group_size · groups_per_iteration), or null for the whole iteration"
            )
        self.async_sampling.check(f"{where}.async_sampling")


register_shorthand(TISConfig, lambda s: {"mode": s})
