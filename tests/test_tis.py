"""Truncated importance sampling (``grpo.tis``) against hand-computed numbers, and the learner's
recompute of the old logprobs (no vLLM needed: the sampler's logprobs are perturbed by hand)."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.configs.grpo import GRPOLoss, GRPOSettings, TISConfig
from trainers.configs.typed import ConfigError, from_plain
from trainers.grpo.loss import grpo_loss, tis_weights

# learner_old − sampler = [0.2, −1.0, 0.0]
LEARNER_OLD = torch.tensor([[-1.0, -2.0, -0.5]])
SAMPLER = torch.tensor([[-1.2, -1.0, -0.5]])
ALL = torch.ones(1, 3, dtype=torch.bool)


def test_token_weights_are_truncated_ratios():
    w, m = tis_weights(LEARNER_OLD, SAMPLER, ALL, "token", cap=1.1)
    assert w.tolist()[0] == pytest.approx([1.1, math.exp(-1.0), 1.0])
    assert m["mismatch_abs_logprob"] == pytest.approx(1.2 / 3)
    assert m["tis_clip_fraction"] == pytest.approx(1 / 3)  # exp(0.2) = 1.221 > 1.1
    assert m["tis_weight_mean"] == pytest.approx((1.1 + math.exp(-1.0) + 1.0) / 3)


def test_sequence_weight_is_one_truncated_product_per_row():
    w, m = tis_weights(LEARNER_OLD, SAMPLER, ALL, "sequence", cap=2.0)
    assert w.tolist()[0] == pytest.approx([math.exp(-0.8)] * 3)  # exp(0.2 − 1.0 + 0)
    assert m["tis_clip_fraction"] == 0.0
    w, m = tis_weights(LEARNER_OLD, SAMPLER, ALL, "sequence", cap=0.3)
    assert w.tolist()[0] == pytest.approx([0.3] * 3)
    assert m["tis_clip_fraction"] == 1.0


def test_masked_tokens_count_nowhere():
    mask = torch.tensor([[True, False, True]])
    w, m = tis_weights(LEARNER_OLD, SAMPLER, mask, "token", cap=2.0)
    assert w.tolist()[0] == pytest.approx([math.exp(0.2), 1.0, 1.0])  # masked: delta taken as 0
    assert m["mismatch_abs_logprob"] == pytest.approx(0.2 / 2)
    assert m["tis_clip_fraction"] == 0.0
    w, m = tis_weights(LEARNER_OLD, SAMPLER, mask, "sequence", cap=1.1)
    assert w.tolist()[0] == pytest.approx([1.1] * 3)  # exp(0.2) truncated
    assert m["tis_clip_fraction"] == 1.0
    _, none = tis_weights(LEARNER_OLD, SAMPLER, torch.zeros_like(mask), "token", cap=2.0)
    assert none == {"mismatch_abs_logprob": 0.0, "tis_clip_fraction": 0.0, "tis_weight_mean": 0.0}


def test_off_measures_but_does_not_weight():
    w, m = tis_weights(LEARNER_OLD, SAMPLER, ALL, "off", cap=1.1)
    assert torch.equal(w, torch.ones(1, 3))
    assert m["mismatch_abs_logprob"] == pytest.approx(0.4)
    assert m["tis_clip_fraction"] == 0.0


def test_grpo_loss_weights_each_token_and_its_gradient():
    """At the start of the update (logprobs == learner_old, ratio 1) with advantage 1 the
    token-mean loss is −mean(w), and each token's gradient is −w_t / 3."""
    cfg = GRPOLoss(tis=TISConfig(mode="token", cap=1.1))
    lp = LEARNER_OLD.clone().requires_grad_(True)
    loss, metrics = grpo_loss(lp, LEARNER_OLD, torch.ones(1), ALL, cfg, sampler_logprobs=SAMPLER)
    w = [1.1, math.exp(-1.0), 1.0]
    assert float(loss.detach()) == pytest.approx(-sum(w) / 3)
    loss.backward()
    assert lp.grad.tolist()[0] == pytest.approx([-x / 3 for x in w])
    assert metrics["tis_clip_fraction"] == pytest.approx(1 / 3)
    assert metrics["ratio_mean"] == pytest.approx(1.0)


def test_grpo_loss_is_unchanged_when_sampler_and_learner_agree():
    cfg = GRPOLoss(tis="token", clip_low=0.1, clip_high=0.1)
    lp = torch.tensor([[-0.7, -1.9, -0.2], [-2.0, -0.1, -0.3]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.1, -0.4]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    plain, _ = grpo_loss(lp, old, adv, mask, cfg)
    (g_plain,) = torch.autograd.grad(plain, lp)
    weighted, m = grpo_loss(lp, old, adv, mask, cfg, sampler_logprobs=old.clone())
    (g_weighted,) = torch.autograd.grad(weighted, lp)
    assert torch.equal(weighted.detach(), plain.detach())
    assert torch.equal(g_weighted, g_plain)
    assert m["mismatch_abs_logprob"] == 0.0 and m["tis_weight_mean"] == 1.0


def test_tis_config_modes_and_errors():
    assert TISConfig().active("vllm") and not TISConfig().active("transformers")
    assert TISConfig(mode="token").active("transformers")
    assert not TISConfig(mode="off").active("vllm")
    assert TISConfig(mode=False).mode == "off"  # YAML's bare `off`
    assert from_plain(GRPOSettings, {"tis": "sequence"}, "g").tis == TISConfig("sequence")
    with pytest.raises(ConfigError, match=r"grpo\.tis\.cap=0\.0 must be .* > 0"):
        TISConfig(cap=0)
    with pytest.raises(ConfigError, match=r"grpo\.tis\.mode='seq' is not one of"):
        GRPOLoss(tis={"mode": "seq"})


# ----- the learner ---------------------------------------------------------------------------
def test_learner_recomputes_old_logprobs_and_weights_against_the_sampler():
    """The connector scores the batch with the learner's weights; the loss is ``grpo_loss``
    with those as old logprobs and the (perturbed) sampler logprobs as TIS's denominator."""
    from llm_modules import build_learner
    from ray.rllib.core.columns import Columns
    from test_llm_rllib import hand_batch

    from marl_agents.llm.rl_module import TOKEN_LOGP
    from scenarios.text_space import TextSpaces
    from trainers.grpo.connectors import LEARNER_OLD_LOGP, LearnerOldLogprobs

    spaces = TextSpaces(vocab_size=384, max_prompt_tokens=48, max_new_tokens=8)
    learner = build_learner(spaces, tis={"mode": "token", "cap": 1.2})
    assert learner.tis_active("trained") and not learner.tis_active("frozen")
    trained = learner.module["trained"].unwrapped()
    batch = hand_batch(trained, spaces, [1.0, -1.0, 0.5, -0.5, 2.0, 3.0])
    exact = batch[TOKEN_LOGP].clone()
    own = batch[Columns.ACTIONS] != spaces.pad_id
    torch.manual_seed(0)
    skew = 0.3 * own * torch.sign(torch.randn_like(exact))  # a "vLLM" skew of ±0.3 nats
    batch[TOKEN_LOGP] = exact + skew
    out = LearnerOldLogprobs(active=learner.tis_active)(
        rl_module=learner.module, batch={"trained": batch}, episodes=[]
    )
    assert torch.allclose(out["trained"][LEARNER_OLD_LOGP], exact, atol=1e-5)
    fwd = trained.forward_train(batch)
    loss = learner.compute_loss_for_module(
        module_id="trained", config=learner.config, batch=batch, fwd_out=fwd
    )
    mask = own & batch["grpo_keep"][:, None]
    expect, stats = grpo_loss(
        fwd[TOKEN_LOGP],
        batch[LEARNER_OLD_LOGP],
        batch["advantages"][:, None],
        mask,
        GRPOLoss(tis={"mode": "token", "cap": 1.2}),
        sampler_logprobs=batch[TOKEN_LOGP],
    )
    assert torch.allclose(loss, expect)
    assert stats["mismatch_abs_logprob"] == pytest.approx(0.3, abs=1e-4)
    # exp(+0.3) = 1.35 is truncated at 1.2 where the sampler was 0.3 lower, exp(−0.3) is not
    below = float(((skew < 0) & mask).sum() / mask.sum())
    assert stats["tis_clip_fraction"] == pytest.approx(below)
    assert 0 < below < 1
    logged = learner.metrics.peek(("trained", "grpo/mismatch_abs_logprob"))
    assert logged == pytest.approx(0.3, abs=1e-4)
