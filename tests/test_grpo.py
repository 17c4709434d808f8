"""GRPO loss math against hand-computed values on tiny tensors (no model, no Ray)."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.configs.grpo import GRPOLoss
from trainers.grpo.loss import (
    LengthDual,
    aggregate,
    clipped_token_loss,
    compute_advantages,
    dynamic_sampling_mask,
    group_advantages,
    grpo_loss,
    kl_k3,
    pack_segments,
    sampler_kl,
    shape_rewards,
    spurious_token_mask,
    token_entropy,
    token_logprobs,
)

T = torch.tensor


# ----- advantages -------------------------------------------------------------------------
def test_group_advantages_hand_computed() -> None:
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5 -> ±1
    # group 1: rewards 3, 1 -> mean 2, std 1 -> +1, -1 ; group 2: a single sample -> 0
    rewards = T([1.0, 0.0, 3.0, 0.0, 1.0, 1.0, 7.0])
    groups = T([0, 0, 1, 0, 0, 1, 2])
    adv = group_advantages(rewards, groups, eps=0.0)
    assert torch.allclose(adv, T([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 0.0]))
    centred = group_advantages(rewards, groups, scale_std=False)
    assert torch.allclose(centred, T([0.5, -0.5, 1.0, -0.5, 0.5, -1.0, 0.0]))


def test_group_advantages_eps_and_constant_group() -> None:
    adv = group_advantages(T([2.0, 2.0, 2.0]), T([5, 5, 5]), eps=1e-6)
    assert torch.equal(adv, torch.zeros(3))
    # rewards 0, 3 -> centred ∓1.5, std 1.5: A = ±1.5 / (1.5 + 0.5)
    adv = group_advantages(T([0.0, 3.0]), T([0, 0]), eps=0.5)
    assert torch.allclose(adv, T([-0.75, 0.75]))


def test_per_agent_credit_groups() -> None:
    # two agents, same two episodes: the team reward gives both agents the same advantages,
    # per-agent credit gives each its own (groups = (task, agent))
    team = T([1.0, 0.0, 1.0, 0.0])  # [ep0/a, ep1/a, ep0/b, ep1/b]
    credit = T([0.9, 0.0, 0.1, 0.0])
    groups = T([0, 0, 1, 1])
    assert torch.allclose(group_advantages(team, groups, eps=0.0), T([1.0, -1.0, 1.0, -1.0]))
    assert torch.allclose(
        group_advantages(credit, groups, scale_std=False), T([0.45, -0.45, 0.05, -0.05])
    )


# ----- dynamic sampling ---------------------------------------------------------------------
def test_dynamic_sampling_drops_equal_groups() -> None:
    rewards = T([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.52, 9.0])
    groups = T([0, 0, 1, 1, 2, 2, 2, 3])
    keep = dynamic_sampling_mask(rewards, groups)
    assert keep.tolist() == [False, False, True, True, True, True, True, False]
    keep = dynamic_sampling_mask(rewards, groups, tol=0.05)  # group 2 spreads only 0.02
    assert keep.tolist() == [False, False, True, True, False, False, False, False]


# ----- clipping ---------------------------------------------------------------------------
def test_clip_higher_low_and_high_bounds() -> None:
    # ratios 0.5, 0.9, 1.1, 1.5 (as logprob differences) against old logprobs 0
    ratio = T([[0.5, 0.9, 1.1, 1.5]])
    lp = ratio.log().requires_grad_(True)
    old = torch.zeros_like(lp)
    for adv, expected, low, high in [
        # A = +1: min(ρ, clip(ρ, 0.8, 1.3)) -> 0.5, 0.9, 1.1, 1.3 ; only 1.5 is clipped (high)
        (1.0, [-0.5, -0.9, -1.1, -1.3], [False] * 4, [False, False, False, True]),
        # A = -1: min(-ρ, -clip(ρ)) -> -0.8, -0.9, -1.1, -1.5 ; only 0.5 is clipped (low)
        (-1.0, [0.8, 0.9, 1.1, 1.5], [True, False, False, False], [False] * 4),
    ]:
        loss, lo, hi = clipped_token_loss(lp, old, T([[adv]]), clip_low=0.2, clip_high=0.3)
        assert torch.allclose(loss, T([expected]), atol=1e-6)
        assert lo.tolist() == [low] and hi.tolist() == [high]
        (grad,) = torch.autograd.grad(loss.sum(), lp)
        # d(-ρA)/d logp = -ρA where unclipped; 0 where clipped
        want = [
            0.0 if c else -r * adv
            for r, c in zip(
                ratio[0].tolist(), [a or b for a, b in zip(low, high, strict=True)], strict=True
            )
        ]
        assert torch.allclose(grad, T([want]), atol=1e-6)


def test_clip_asymmetry_matters() -> None:
    lp, old, adv = T([[math.log(1.25)]]), T([[0.0]]), T([[1.0]])
    sym, _, hi_sym = clipped_token_loss(lp, old, adv, 0.2, 0.2)
    higher, _, hi = clipped_token_loss(lp, old, adv, 0.2, 0.28)
    assert sym.item() == pytest.approx(-1.2) and hi_sym.item()
    assert higher.item() == pytest.approx(-1.25) and not hi.item()


# ----- masks ------------------------------------------------------------------------------
def test_token_mask_only_agent_tokens_carry_gradient() -> None:
    packed = pack_segments(
        [
            [
                ([10, 11], None, None),
                ([12, 13], "a", [-0.1, -0.2]),
                ([14], None, None),
                ([15], "b", [-0.3]),
            ],
            [([20], None, None), ([21, 22], "b", [-0.4, -0.5])],
        ],
        pad_id=0,
    )
    assert packed.input_ids.tolist() == [[10, 11, 12, 13, 14, 15], [20, 21, 22, 0, 0, 0]]
    assert packed.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    # target positions: tokens 11..15 / 21, 22, pad...
    assert packed.mask("a").tolist() == [[False, True, True, False, False], [False] * 5]
    assert packed.mask("b").tolist() == [
        [False, False, False, False, True],
        [True, True, False, False, False],
    ]
    assert not packed.mask("nobody").any()
    assert packed.old_logprobs.tolist()[0] == pytest.approx([0.0, -0.1, -0.2, 0.0, -0.3])

    # gradient reaches only the masked positions
    lp = torch.zeros(2, 5, requires_grad=True)
    cfg = GRPOLoss(dynamic_sampling=False)
    loss, metrics = grpo_loss(lp, packed.old_logprobs, T([1.0, 1.0]), packed.mask("a"), cfg)
    loss.backward()
    assert (lp.grad != 0).tolist() == packed.mask("a").tolist()
    assert metrics["tokens"] == 2


def test_pack_segments_errors() -> None:
    with pytest.raises(ValueError, match="2 tokens but 1 logprobs"):
        pack_segments([[([1], None, None), ([2, 3], "a", [0.0])]])
    with pytest.raises(ValueError, match="start with an unowned prompt"):
        pack_segments([[([2, 3], "a", [0.0, 0.0])]])


def test_token_logprobs_and_entropy_alignment() -> None:
    logits = torch.zeros(1, 3, 4)
    logits[0, 0] = T([0.0, math.log(3.0), 0.0, 0.0])  # p(1) = 3/6 at position 0
    ids = T([[2, 1, 3]])
    lp = token_logprobs(logits, ids)
    assert lp.shape == (1, 2)
    assert lp[0, 0].item() == pytest.approx(math.log(0.5))
    assert lp[0, 1].item() == pytest.approx(math.log(0.25))
    ent = token_entropy(logits)
    assert ent[0, 1].item() == pytest.approx(math.log(4.0))
    assert ent[0, 0].item() == pytest.approx(-(0.5 * math.log(0.5) + 3 * (1 / 6) * math.log(1 / 6)))


def test_spurious_token_mask() -> None:
    # token 0 spurious (A>0, p=0.01, H=0.2); 1 probable; 2 high entropy; 3 negative advantage
    lp = T([[math.log(0.01), math.log(0.9), math.log(0.01), math.log(0.01)]])
    ent = T([[0.2, 0.2, 2.0, 0.2]])
    keep = spurious_token_mask(T([[1.0, 1.0, 1.0, -1.0]]), lp, ent, prob_max=0.05, entropy_max=1.0)
    assert keep.tolist() == [[False, True, True, True]]
    cfg = GRPOLoss(spurious_mask=True, spurious_prob_max=0.05, spurious_entropy_max=1.0)
    cur = lp.clone().requires_grad_(True)
    loss, metrics = grpo_loss(
        cur, lp, T([1.0]), torch.ones(1, 4, dtype=torch.bool), cfg, entropy=ent
    )
    # with A = +1 on every token, tokens 0 and 3 are both spurious
    assert metrics["spurious_frac"] == pytest.approx(0.5)
    assert metrics["tokens"] == 2
    assert loss.item() == pytest.approx(-1.0)  # ratio 1 on the 2 kept tokens, A = 1
    cur.grad = None
    loss.backward()
    assert (cur.grad != 0).tolist() == [[False, True, True, False]]
    with pytest.raises(ValueError, match="entropy"):
        grpo_loss(cur, lp, T([1.0]), torch.ones(1, 4, dtype=torch.bool), cfg)


# ----- length budget ----------------------------------------------------------------------
def test_length_dual_update_rule() -> None:
    dual = LengthDual(budget=10, lr=0.5, init=0.0)
    # mean length 15: violation (15 - 10) / 10 = 0.5 -> λ = 0 + 0.5 * 0.5
    assert dual.update(T([10, 20])) == pytest.approx(0.25)
    # mean 12 -> +0.5 * 0.2
    assert dual.update(T([12, 12])) == pytest.approx(0.35)
    # mean 2 -> 0.35 + 0.5 * (-0.8) < 0 -> projected to 0
    assert dual.update(T([2, 2])) == 0.0
    dual.lam = 0.4
    # r − λ (L − B) / B: 1 − 0.4 * (20 − 10) / 10 = 0.6 ; 1 − 0.4 * (5 − 10) / 10 = 1.2
    assert dual.penalize(T([1.0, 1.0]), T([20, 5])).tolist() == pytest.approx([0.6, 1.2])
    state = dual.state_dict()
    other = LengthDual(1)
    other.load_state_dict(state)
    assert other.state_dict() == state
    with pytest.raises(ValueError, match="budget"):
        LengthDual(0)


def test_shape_rewards_format_penalty_and_budget() -> None:
    cfg = GRPOLoss(format_penalty=0.5, length_budget=10, dual_init=0.2)
    dual = LengthDual.from_config(cfg)
    assert dual is not None and dual.lam == 0.2
    out = shape_rewards(
        T([1.0, 1.0]), cfg, lengths=T([10, 30]), format_ok=T([True, False]), dual=dual
    )
    # 1 − 0 − 0.2 * 0 = 1 ; 1 − 0.5 − 0.2 * 2 = 0.1
    assert out.tolist() == pytest.approx([1.0, 0.1])
    assert LengthDual.from_config(GRPOLoss()) is None
    with pytest.raises(ValueError, match="lengths"):
        shape_rewards(T([1.0]), cfg, dual=dual)


# ----- KL and aggregation -----------------------------------------------------------------
def test_kl_k3_hand_computed() -> None:
    lp = T([math.log(0.5), math.log(0.2), math.log(0.3)])
    ref = T([math.log(0.25), math.log(0.2), math.log(0.6)])
    # δ = log(ref / p): log 0.5, 0, log 2 -> e^δ − δ − 1
    want = [0.5 - math.log(0.5) - 1, 0.0, 2 - math.log(2) - 1]
    assert kl_k3(lp, ref).tolist() == pytest.approx(want)
    assert (kl_k3(lp, ref) >= 0).all()


def test_sampler_kl_hand_computed() -> None:
    # sampler gave 0.5 and 0.25 to its tokens; the learner scores 0.25 and 0.25 (and a masked
    # token it disagrees on wildly): δ = learner − behaviour = log 0.5, 0 -> e^δ − δ − 1
    behaviour = T([[math.log(0.5), math.log(0.25), math.log(0.9)]])
    learner = T([[math.log(0.25), math.log(0.25), math.log(0.01)]])
    mask = T([[True, True, False]])
    want = (0.5 - math.log(0.5) - 1 + 0.0) / 2
    assert sampler_kl(behaviour, learner, mask) == pytest.approx(want)
    assert sampler_kl(behaviour, behaviour, mask) == 0.0  # the same distribution on both sides
    assert sampler_kl(behaviour, learner, torch.zeros_like(mask)) == 0.0


def test_kl_term_in_loss() -> None:
    lp = T([[math.log(0.5), math.log(0.5)]]).requires_grad_(True)
    ref = T([[math.log(0.25), math.log(0.5)]])
    cfg = GRPOLoss(kl_coef=0.1)
    loss, metrics = grpo_loss(
        lp, lp.detach(), T([0.0]), torch.ones(1, 2, dtype=torch.bool), cfg, ref_logprobs=ref
    )
    k3 = 0.5 - math.log(0.5) - 1
    assert metrics["kl"] == pytest.approx(k3 / 2)
    assert loss.item() == pytest.approx(0.1 * k3 / 2)  # A = 0: only the KL term remains
    with pytest.raises(ValueError, match="reference"):
        grpo_loss(lp, lp.detach(), T([0.0]), torch.ones(1, 2, dtype=torch.bool), cfg)


def test_aggregation_modes() -> None:
    per = T([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = T([[True, True, True], [True, False, False]])
    assert aggregate(per, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(per, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(per, mask, "seq_mean_token_sum").item() == pytest.approx((6 + 4) / 2)
    empty = torch.zeros(2, 3, dtype=torch.bool)
    assert aggregate(per, empty, "token_mean").item() == 0.0


def test_grpo_loss_end_to_end_hand_computed() -> None:
    # two sequences of two tokens; rewards 1, 0 in one group -> A = +1, −1
    adv = group_advantages(T([1.0, 0.0]), T([0, 0]), eps=0.0)
    old = torch.zeros(2, 2)
    lp = torch.log(T([[1.5, 1.0], [1.0, 0.5]]))  # ratios
    cfg = GRPOLoss(clip_low=0.2, clip_high=0.28)
    loss, m = grpo_loss(lp, old, adv, torch.ones(2, 2, dtype=torch.bool), cfg)
    # seq 0 (A=+1): −min(1.5, 1.28) = −1.28, −1
    # seq 1 (A=−1): −min(−1, −1) = 1, −min(−0.5, −0.8) = 0.8
    assert loss.item() == pytest.approx((-1.28 - 1 + 1 + 0.8) / 4)
    assert m["clip_frac_high"] == pytest.approx(0.25)
    assert m["clip_frac_low"] == pytest.approx(0.25)
    assert m["ratio_mean"] == pytest.approx((1.5 + 1 + 1 + 0.5) / 4)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="clip_low"):
        GRPOLoss(clip_low=1.0)
    with pytest.raises(ValueError, match="length_budget"):
        GRPOLoss(length_budget=0)
    with pytest.raises(ValueError, match="loss_agg"):
        GRPOLoss(loss_agg="mean")  # type: ignore[arg-type]


def test_compute_advantages_applies_the_reward_knobs() -> None:
    rewards = T([1.0, 0.0, 1.0, 1.0])
    groups = T([0, 0, 1, 1])
    cfg = GRPOLoss(adv_eps=0.0)
    adv, keep = compute_advantages(rewards, groups, cfg)
    assert keep.tolist() == [True, True, False, False]  # group 1 all equal: dropped
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0]
    # without dynamic sampling every sample is kept (group 1 has zero advantage anyway)
    adv, keep = compute_advantages(rewards, groups, GRPOLoss(dynamic_sampling=False))
    assert keep.all()
    # the format penalty breaks group 1's tie: rewards 1, 0.5 -> ±1 (std 0.25, centred ±0.25)
    cfg = GRPOLoss(format_penalty=0.5, adv_eps=0.0)
    adv, keep = compute_advantages(rewards, groups, cfg, format_ok=T([True, True, True, False]))
    assert keep.all() and adv.tolist() == [1.0, -1.0, 1.0, -1.0]
    # Dr. GRPO: centring only; the length dual shapes before the tie check
    cfg = GRPOLoss(scale_std=False, length_budget=10)
    dual = LengthDual.from_config(cfg)
    dual.lam = 1.0
    adv, keep = compute_advantages(rewards, groups, cfg, lengths=T([10, 10, 10, 20]), dual=dual)
    # group 1 shaped: 1 − 0, 1 − 1 = 1, 0 -> centred ±0.5
    assert keep.all() and adv.tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5])
