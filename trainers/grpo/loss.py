"""Token-level GRPO loss math for LLM policies, in plain torch (no RLlib).

The pieces, each a knob of :class:`GRPOLoss` and each a small function tested against
hand-computed numbers:

* **Rewards → advantages.** :func:`shape_rewards` applies the format penalty and the length
  budget's dual penalty; :func:`group_advantages` normalises within groups (the ``G``
  completions of one prompt / task, for one agent): ``A_i = (r_i − mean_g) / (std_g + eps)``
  with the population std, or ``r_i − mean_g`` with ``scale_std=False`` (Dr. GRPO). The
  reward of a sample is the team reward or the agent's credit (leave-one-out, Shapley) —
  whatever the caller passes.
* **Dynamic sampling** (DAPO): :func:`dynamic_sampling_mask` drops groups whose (shaped)
  rewards are all equal — their advantages are all zero and carry no signal.
* **Clip-higher** (DAPO): :func:`clipped_token_loss` is PPO's clipped surrogate per token with
  ratio bounds ``[1 − clip_low, 1 + clip_high]``, ``clip_high > clip_low`` by default.
* **Token mask.** Only tokens the trained agent sampled carry gradient: prompt, tool-output and
  other agents' tokens are masked (:func:`pack_segments` builds the mask from owners).
* **Spurious-token mask**: :func:`spurious_token_mask` drops tokens with positive advantage
  that were improbable (``p < spurious_prob_max``) where the policy was confident
  (entropy ``< spurious_entropy_max``) — likely lucky tokens that a correct answer
  happened to contain; pushing them up would sharpen the policy on noise.
* **Length budget by a dual variable**: :class:`LengthDual` (update rule in its docstring).
* **KL to a reference model**: :func:`kl_k3`, Schulman's k3 estimator, weighted ``kl_coef``.
* **Truncated importance sampling** (TIS): with a sampler whose numerics differ from the
  learner's (vLLM), the ratio's old logprobs are the learner's own recompute at the start of
  the update and each token's surrogate is weighted by :func:`tis_weights`,
  ``min(exp(lp_old − lp_sampler), cap)`` per token or per sequence (``GRPOLoss.tis``).
* **Sampler–learner agreement**: :func:`sampler_kl`, the k3 estimate of
  ``KL(sampler ‖ learner)`` from the behaviour logprobs and the learner's recompute (≈ 0 at
  the sampler's weights when both score the same distribution, e.g. the same temperature).

Typical use in a learner::

    adv, keep = compute_advantages(raw, groups, cfg, lengths=lengths, format_ok=ok, dual=dual)
    lp, ent = token_logprobs(logits, input_ids), token_entropy(logits)
    loss, metrics = grpo_loss(lp, old_lp, adv[:, None], mask & keep[:, None], cfg,
                              ref_logprobs=ref_lp, entropy=ent)
    dual.update(lengths)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

# the knobs are a config dataclass like the others (YAML, sweeps)
from trainers.configs.grpo import GRPOLoss, LossAgg

__all__ = [
    "LengthDual",
    "PackedBatch",
    "Segment",
    "aggregate",
    "clipped_token_loss",
    "compute_advantages",
    "dynamic_sampling_mask",
    "group_advantages",
    "group_moments",
    "grpo_loss",
    "kl_k3",
    "pack_segments",
    "sampler_kl",
    "shape_rewards",
    "spurious_token_mask",
    "tis_weights",
    "token_entropy",
    "token_logprobs",
]


# ----- rewards and advantages -------------------------------------------------------------
def group_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, *, scale_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-normalised advantages: ``(r − mean_g) / (std_g + eps)`` per sample.

    Args:
        rewards: ``[N]`` rewards (team reward or per-agent credit).
        groups: ``[N]`` integer group ids (samples of one prompt/task and agent).
        scale_std: divide by the group's population std (``unbiased=False``).
        eps: added to the std.

    Returns:
        ``[N]`` advantages; a group of one, or of equal rewards, gets 0 (also with ``eps=0``).
    """
    centred, std = group_moments(rewards, groups)
    if not scale_std:
        return centred
    denom = std + eps
    return torch.where(denom > 0, centred / denom.clamp(min=1e-30), torch.zeros_like(centred))


def group_moments(rewards: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r − mean_g, std_g)`` per sample: group-centred rewards and the group's population std."""
    rewards = rewards.float()
    ids, inv = torch.unique(groups, return_inverse=True)
    count = torch.zeros(len(ids), dtype=rewards.dtype).index_add_(0, inv, torch.ones_like(rewards))
    mean = torch.zeros(len(ids), dtype=rewards.dtype).index_add_(0, inv, rewards) / count
    centred = rewards - mean[inv]
    var = torch.zeros(len(ids), dtype=rewards.dtype).index_add_(0, inv, centred**2) / count
    return centred, var.sqrt()[inv]


def dynamic_sampling_mask(
    rewards: torch.Tensor, groups: torch.Tensor, tol: float = 0.0
) -> torch.Tensor:
    """Keep-mask ``[N]``: ``False`` for samples of groups whose rewards are all equal.

    A group is dropped when ``max(r) − min(r) <= tol`` (groups of one are always dropped).
    """
    ids, inv = torch.unique(groups, return_inverse=True)
    hi = torch.full((len(ids),), -torch.inf).scatter_reduce(0, inv, rewards.float(), "amax")
    lo = torch.full((len(ids),), torch.inf).scatter_reduce(0, inv, rewards.float(), "amin")
    return (hi - lo > tol)[inv]


class LengthDual:
    """A Lagrange multiplier ``λ ≥ 0`` enforcing a mean-length budget ``B``.

    The constrained problem ``max E[R]  s.t.  E[L] <= B`` has the Lagrangian
    ``E[R] − λ (E[L] − B)``. The policy maximises it for fixed ``λ`` through the shaped reward
    ``r̃_i = r_i − λ (L_i − B) / B`` (:meth:`penalize`; dividing by ``B`` makes ``λ`` a reward
    per budget-length, and the constant ``λ`` term cancels in group normalisation). ``λ``
    takes a projected gradient step on the dual after each batch (:meth:`update`):

        ``λ ← max(0, λ + η (mean_i L_i − B) / B)``

    so ``λ`` grows while completions are over budget and decays to 0 once under it.

    Args:
        budget: ``B``, mean completion length in tokens.
        lr: ``η``.
        init: the initial ``λ``.
    """

    def __init__(self, budget: float, lr: float = 0.05, init: float = 0.0) -> None:
        if budget <= 0:
            raise ValueError(f"budget must be > 0 tokens, got {budget}")
        self.budget = float(budget)
        self.lr = float(lr)
        self.lam = max(0.0, float(init))

    @classmethod
    def from_config(cls, config: GRPOLoss) -> LengthDual | None:
        """The dual for ``config.length_budget``, or ``None`` when there is no budget."""
        if config.length_budget is None:
            return None
        return cls(config.length_budget, config.dual_lr, config.dual_init)

    def penalize(self, rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``r − λ (L − B) / B``."""
        return rewards.float() - self.lam * (lengths.float() - self.budget) / self.budget

    def update(self, lengths: torch.Tensor) -> float:
        """One dual step on a batch's completion lengths; returns the new ``λ``."""
        violation = (float(lengths.float().mean()) - self.budget) / self.budget
        self.lam = max(0.0, self.lam + self.lr * violation)
        return self.lam

    def state_dict(self) -> dict[str, float]:
        """For checkpoints."""
        return {"budget": self.budget, "lr": self.lr, "lam": self.lam}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        """Restore :meth:`state_dict`."""
        self.budget, self.lr, self.lam = state["budget"], state["lr"], state["lam"]


def shape_rewards(
    rewards: torch.Tensor,
    config: GRPOLoss,
    *,
    lengths: torch.Tensor | None = None,
    format_ok: torch.Tensor | None = None,
    dual: LengthDual | None = None,
) -> torch.Tensor:
    """Rewards after the format penalty and the length dual's penalty.

    ``r − format_penalty · [not format_ok] − λ (L − B) / B`` (each term only when its input and
    knob are given).
    """
    out = rewards.float()
    if format_ok is not None and config.format_penalty:
        out = out - config.format_penalty * (~format_ok.bool()).float()
    if dual is not None:
        if lengths is None:
            raise ValueError("a length budget needs the completion lengths")
        out = dual.penalize(out, lengths)
    return out


def compute_advantages(
    rewards: torch.Tensor,
    groups: torch.Tensor,
    config: GRPOLoss,
    *,
    lengths: torch.Tensor | None = None,
    format_ok: torch.Tensor | None = None,
    dual: LengthDual | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards → ``(advantages, keep)`` with every reward-side knob of ``config`` applied.

    :func:`shape_rewards` (format penalty, length dual), then
    :func:`dynamic_sampling_mask` on the shaped rewards (when ``config.dynamic_sampling``;
    otherwise every sample is kept), then :func:`group_advantages`. Dropped samples get
    advantage 0. The dual is not updated here: call ``dual.update(lengths)`` once per batch.

    Returns:
        ``[N]`` advantages and the ``[N]`` bool keep-mask (AND it into the token mask).
    """
    shaped = shape_rewards(rewards, config, lengths=lengths, format_ok=format_ok, dual=dual)
    if config.dynamic_sampling:
        keep = dynamic_sampling_mask(shaped, groups, config.dynamic_sampling_tol)
    else:
        keep = torch.ones_like(shaped, dtype=torch.bool)
    adv = group_advantages(shaped, groups, scale_std=config.scale_std, eps=config.adv_eps)
    return adv * keep, keep


# ----- token masks ------------------------------------------------------------------------
def spurious_token_mask(
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    *,
    prob_max: float,
    entropy_max: float,
) -> torch.Tensor:
    """Keep-mask: ``False`` for spurious tokens.

    A token is spurious when its advantage is positive, its probability ``exp(logprob)`` is
    below ``prob_max`` and the entropy of its next-token distribution is below
    ``entropy_max``. Pass the sampling-time (old) logprobs so the mask does not move during
    an update's epochs. Shapes broadcast (e.g. advantages ``[B, 1]``, others ``[B, T]``).
    """
    spurious = (advantages > 0) & (logprobs.exp() < prob_max) & (entropy < entropy_max)
    return ~spurious


@dataclasses.dataclass
class PackedBatch:
    """Token sequences packed for one forward pass, aligned to *target* positions.

    Position ``t`` of the ``[B, L − 1]`` tensors is the token ``input_ids[:, t + 1]`` that the
    logits at ``t`` predict (see :func:`token_logprobs`).

    Attributes:
        input_ids: ``[B, L]`` right-padded ids.
        attention_mask: ``[B, L]``.
        owners: ``[B, L − 1]`` owner index of each target token (``-1``: nobody's — the
            prompt, tool outputs, padding).
        old_logprobs: ``[B, L − 1]`` recorded sampling-time logprobs (0 where none).
        owner_ids: owner name → index.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    owners: torch.Tensor
    old_logprobs: torch.Tensor
    owner_ids: dict[str, int]

    def mask(self, agent: str) -> torch.Tensor:
        """``[B, L − 1]`` bool: the target tokens ``agent`` sampled (the ones with gradient)."""
        index = self.owner_ids.get(agent)
        if index is None:
            return torch.zeros_like(self.owners, dtype=torch.bool)
        return self.owners == index


Segment = tuple[Sequence[int], str | None, Sequence[float] | None]


def pack_segments(sequences: Sequence[Sequence[Segment]], pad_id: int = 0) -> PackedBatch:
    """Concatenate each sequence's segments and record who sampled each token.

    Args:
        sequences: per sequence, segments ``(token_ids, owner, logprobs)``: ``owner`` is the
            agent that sampled the tokens (``None`` for prompt text, tool outputs, messages
            the agent did not generate) and ``logprobs`` their sampling-time logprobs
            (required when ``owner`` is set).
        pad_id: right padding id.

    Raises:
        ValueError: an owned segment without matching logprobs, or a first segment owned
            (the first token has no prediction; start with the prompt).
    """
    owner_ids: dict[str, int] = {}
    rows: list[tuple[list[int], list[int], list[float]]] = []
    for segments in sequences:
        ids: list[int] = []
        own: list[int] = []
        lps: list[float] = []
        for tokens, owner, logprobs in segments:
            tokens = list(tokens)
            if owner is None:
                own += [-1] * len(tokens)
                lps += [0.0] * len(tokens)
            else:
                if logprobs is None or len(logprobs) != len(tokens):
                    raise ValueError(
                        f"segment of {owner!r} has {len(tokens)} tokens but "
                        f"{None if logprobs is None else len(logprobs)} logprobs"
                    )
                if not ids:
                    raise ValueError("a sequence must start with an unowned prompt segment")
                own += [owner_ids.setdefault(owner, len(owner_ids))] * len(tokens)
                lps += [float(x) for x in logprobs]
            ids += tokens
        rows.append((ids, own, lps))
    width = max((len(r[0]) for r in rows), default=1)
    n = len(rows)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    owners = torch.full((n, width), -1, dtype=torch.long)
    old = torch.zeros((n, width), dtype=torch.float32)
    for r, (ids, own, lps) in enumerate(rows):
        input_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attn[r, : len(ids)] = 1
        owners[r, : len(ids)] = torch.tensor(own, dtype=torch.long)
        old[r, : len(ids)] = torch.tensor(lps, dtype=torch.float32)
    return PackedBatch(input_ids, attn, owners[:, 1:], old[:, 1:], owner_ids)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``[B, L − 1]`` next-token logprobs: ``log_softmax(logits[:, t])[input_ids[:, t + 1]]``."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``[B, L − 1]`` entropy (nats) of each next-token distribution, aligned as above."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


# ----- sampler–learner mismatch -----------------------------------------------------------
def tis_weights(
    learner_old: torch.Tensor,
    sampler: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    cap: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights of the learner's policy against the sampler's.

    ``token``: ``w_t = min(exp(lp_old_t − lp_sampler_t), cap)``. ``sequence``: one weight per
    row, ``min(exp(Σ_t mask_t (lp_old_t − lp_sampler_t)), cap)``, broadcast over its tokens.
    ``off``: all ones (the mismatch is still measured). No gradient flows through the weights.

    Args:
        learner_old: ``[B, T]`` the learner's logprobs at the start of the update.
        sampler: ``[B, T]`` the sampler's (behaviour) logprobs of the same tokens.
        mask: ``[B, T]`` bool, the tokens that count.
        mode: ``"token"``, ``"sequence"`` or ``"off"`` (``"auto"`` means ``"token"``).
        cap: the upper bound ``C > 0``.

    Returns:
        ``([B, T] weights, metrics)``: ``mismatch_abs_logprob`` (mean ``|lp_old − lp_sampler|``
        over the masked tokens), ``tis_clip_fraction`` (share of masked tokens — of rows with
        a masked token, for ``sequence`` — whose weight was truncated at ``cap``) and
        ``tis_weight_mean`` (mean weight over the masked tokens).
    """
    mask = mask.bool()
    delta = (learner_old.detach() - sampler.detach()).double() * mask
    if mode == "sequence":
        raw = delta.sum(-1, keepdim=True).exp().expand_as(delta)
        rows = mask.any(-1)
        clipped = float((raw[:, 0] > cap)[rows].float().mean()) if rows.any() else 0.0
    elif mode in ("token", "auto"):
        raw = delta.exp()
        clipped = float((raw > cap)[mask].float().mean()) if mask.any() else 0.0
    elif mode == "off":
        raw = torch.ones_like(delta)
        clipped = 0.0
    else:
        raise ValueError(f"TIS mode {mode!r}: use 'token', 'sequence' or 'off'")
    weights = raw.clamp(max=cap).float()
    n = max(float(mask.sum()), 1.0)
    metrics = {
        "mismatch_abs_logprob": float(delta.abs().sum()) / n,
        "tis_clip_fraction": clipped,
        "tis_weight_mean": float((weights * mask).sum()) / n,
    }
    return weights, metrics


# ----- losses -----------------------------------------------------------------------------
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of ``KL(π ‖ π_ref)`` on tokens sampled from ``π``.

    ``k3 = exp(δ) − δ − 1`` with ``δ = log π_ref(x) − log π(x)``: unbiased, always ≥ 0.
    """
    delta = ref_logprobs - logprobs
    return delta.exp() - delta - 1.0


def sampler_kl(behaviour: torch.Tensor, learner: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean k3 estimate of ``KL(sampler ‖ learner)`` over the masked sampled tokens.

    The tokens were drawn from the sampler, so :func:`kl_k3` with the sampler in the role of
    ``π`` — ``exp(δ) − δ − 1``, ``δ = learner − behaviour`` — is unbiased and ``≥ 0``. At the
    sampler's weights (an update's first minibatch) it is ≈ 0 unless the two sides score
    different distributions (a temperature applied on one side only); later minibatches add
    the update's own drift.

    Args:
        behaviour: ``[B, T]`` logprobs recorded at sampling.
        learner: ``[B, T]`` the learner's logprobs of the same tokens.
        mask: ``[B, T]`` bool, the tokens to average over (none: 0).
    """
    mask = mask.bool()
    if not mask.any():
        return 0.0
    # float64: k3 ≈ δ²/2 is far below float32's resolution for δ ~ 1e-6 (rounding noise)
    return float(kl_k3(behaviour.detach().double(), learner.detach().double())[mask].mean())


def clipped_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, with separate low / high clip ranges.

    ``loss = −min(ρ A, clip(ρ, 1 − clip_low, 1 + clip_high) A)``, ``ρ = exp(logprobs − old)``.

    Returns:
        ``(loss, clipped_low, clipped_high)``: unreduced ``[B, T]`` loss and bool masks of the
        tokens where the clip is active (gradient zero) at the lower / upper bound.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        active = clipped < unclipped
        low = active & (ratio < 1.0 - clip_low)
        high = active & (ratio > 1.0 + clip_high)
    return loss, low, high


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: LossAgg) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss over ``mask`` (see :attr:`GRPOLoss.loss_agg`).

    An all-masked batch gives 0 (with a gradient path, so ``backward`` still works).
    """
    m = mask.float()
    if mode == "token_mean":
        return (per_token * m).sum() / m.sum().clamp(min=1.0)
    per_seq = (per_token * m).sum(-1)
    has = m.sum(-1) > 0
    if mode == "seq_mean_token_mean":
        per_seq = per_seq / m.sum(-1).clamp(min=1.0)
    return (per_seq * has).sum() / has.sum().clamp(min=1)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GRPOLoss,
    *,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    sampler_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The token-level GRPO loss for one module.

    Args:
        logprobs: ``[B, T]`` current logprobs of the sampled tokens (with gradient).
        old_logprobs: ``[B, T]`` the ratio's old logprobs: the sampling-time ones, or with
            ``sampler_logprobs`` the learner's recompute at the start of the update.
        advantages: ``[B, 1]`` (per sequence) or ``[B, T]`` (per token).
        mask: ``[B, T]`` bool, the agent's own sampled tokens (and kept groups).
        config: the knobs.
        ref_logprobs: ``[B, T]`` reference-model logprobs (needed when ``kl_coef > 0``).
        entropy: ``[B, T]`` next-token entropy (needed when ``spurious_mask``).
        sampler_logprobs: ``[B, T]`` the sampler's logprobs: each token's surrogate is
            weighted by :func:`tis_weights` (``config.tis``: mode and cap), and the metrics
            gain ``mismatch_abs_logprob``, ``tis_clip_fraction`` and ``tis_weight_mean``.

    Returns:
        ``(loss, metrics)`` with metrics ``clip_frac_low``, ``clip_frac_high``,
        ``spurious_frac``, ``kl``, ``ratio_mean`` and ``tokens`` over the masked tokens.
    """
    mask = mask.bool()
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    n_before = float(mask.sum())
    if config.spurious_mask:
        if entropy is None:
            raise ValueError("spurious_mask needs the per-token entropy")
        mask = mask & spurious_token_mask(
            advantages,
            old_logprobs,
            entropy.detach(),
            prob_max=config.spurious_prob_max,
            entropy_max=config.spurious_entropy_max,
        )
    per_token, low, high = clipped_token_loss(
        logprobs, old_logprobs, advantages, config.clip_low, config.clip_high
    )
    tis: dict[str, float] = {}
    if sampler_logprobs is not None:
        weights, tis = tis_weights(
            old_logprobs, sampler_logprobs, mask, config.tis.mode, config.tis.cap
        )
        per_token = per_token * weights
    kl = torch.zeros((), dtype=per_token.dtype)
    if config.kl_coef:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs the reference model's logprobs")
        kl_tok = kl_k3(logprobs, ref_logprobs)
        per_token = per_token + config.kl_coef * kl_tok
        kl = aggregate(kl_tok.detach(), mask, "token_mean")
    loss = aggregate(per_token, mask, config.loss_agg)
    with torch.no_grad():
        n = float(mask.sum())
        denom = max(n, 1.0)
        ratio = torch.exp(logprobs - old_logprobs)
        metrics = {
            "clip_frac_low": float((low & mask).sum()) / denom,
            "clip_frac_high": float((high & mask).sum()) / denom,
            "spurious_frac": (n_before - n) / max(n_before, 1.0),
            "kl": float(kl),
            "ratio_mean": float((ratio * mask).sum()) / denom,
            "tokens": n,
            **tis,
        }
    return loss, metrics
