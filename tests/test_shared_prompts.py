"""Rows sharing a prompt (a GRPO group) run it once: ``marl_agents.llm.prefix``.

The sampler's prefill and the learner's teacher-forced scoring must give what one forward per
row gives: the same sampled tokens and logprobs, the same logprobs, entropies and gradients —
on the tiny Qwen2, a LoRA adapter on it, and a sliding-window architecture (Gemma 3) whose
prompts are longer than its window.
"""

from __future__ import annotations

import pytest
import torch

from marl_agents.llm import hf_backend
from marl_agents.llm.backend import SamplingParams
from marl_agents.llm.hf_backend import HFBackend, teacher_forced_logprobs
from marl_agents.llm.prefix import distinct, suffix_logits
from marl_agents.llm.tiny import make_tiny_model


def tiny_gemma3() -> tuple[object, torch.nn.Module]:
    """A 2-layer Gemma 3 (one sliding-window layer of window 8, one global) built in code."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tok, _ = make_tiny_model(seed=0)
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    return tok, Gemma3ForCausalLM(config).eval()


def lora_tiny() -> tuple[object, torch.nn.Module]:
    """The tiny Qwen2 under a fresh LoRA adapter whose B matrices are non-zero (so the
    adapter changes the logits and its gradients are not trivially equal)."""
    from peft import LoraConfig, get_peft_model

    tok, model = make_tiny_model(seed=0)
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return tok, peft.eval()


MODELS = {
    "qwen2": lambda: make_tiny_model(seed=0),
    "lora": lora_tiny,
    "gemma3-sliding": tiny_gemma3,
}


def groups(lengths: tuple[int, ...], size: int, seed: int = 0) -> list[list[int]]:
    """``size`` rows of each of ``len(lengths)`` random prompts, interleaved (as GRPO's
    groups reach a batch: rows of one prompt need not be adjacent)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 380, (n,), generator=g).tolist() for n in lengths]
    return [prompts[i % len(prompts)] for i in range(size * len(prompts))]


def test_distinct_keeps_first_seen_order() -> None:
    assert distinct([[5, 6], [1], [5, 6], [1], [2]]) == ([0, 1, 4], [0, 1, 0, 1, 2])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shared_prefill_samples_what_one_prompt_at_a_time_samples(name: str) -> None:
    tok, model = MODELS[name]()
    backend = HFBackend(model, tok)
    prompts = groups((20, 35, 7), size=3)  # 35 > the Gemma window of 8
    params = [SamplingParams(temperature=1.0, max_new_tokens=6, seed=r) for r in range(9)]
    batched = backend.generate(prompts, params)
    alone = [backend.generate([p], [q])[0] for p, q in zip(prompts, params, strict=True)]
    for b, a in zip(batched, alone, strict=True):
        assert b.token_ids == a.token_ids
        assert b.sampling_logprobs == pytest.approx(a.sampling_logprobs, abs=1e-4)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shared_scoring_equals_one_forward_per_row(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok, model = MODELS[name]()
    prompts = groups((20, 35, 7), size=3)
    gens = HFBackend(model, tok).generate(
        prompts, [SamplingParams(temperature=1.0, max_new_tokens=6, seed=r) for r in range(9)]
    )
    tokens = [g.token_ids for g in gens]
    tokens[4] = []  # a row without tokens is scored as zeros on either path
    assert suffix_logits(model, prompts, tokens, pad_id=tok.pad_token_id) is not None

    def scored() -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        lp, ent = teacher_forced_logprobs(
            model, prompts, tokens, pad_id=tok.pad_token_id, with_entropy=True, temperature=0.7
        )
        (lp.sum() + 0.1 * ent.sum()).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        return lp.detach(), ent.detach(), grads

    shared = scored()
    monkeypatch.setattr(hf_backend, "suffix_logits", lambda *a, **k: None)  # one row each
    per_row = scored()
    torch.testing.assert_close(shared[0], per_row[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(shared[1], per_row[1], atol=1e-4, rtol=0)
    assert shared[0][4].abs().sum() == 0
    for a, b in zip(shared[2], per_row[2], strict=True):
        # the same gradients up to float32 rounding of differently shaped kernels: relative to
        # the tensor's size (an element-wise rtol fails where a gradient is near 0, e.g.
        # 1.1e-5 off a 7.8e-4 element on an AMD EPYC)
        assert (a - b).norm() <= 1e-4 * b.norm() + 1e-7
    # the sampler's behaviour logprobs are what the learner scores at the same weights
    lp_t1, _ = teacher_forced_logprobs(model, prompts, tokens, pad_id=tok.pad_token_id)
    for r, g in enumerate(gens):
        if tokens[r]:
            assert lp_t1[r, : len(g.logprobs)].tolist() == pytest.approx(g.logprobs, abs=1e-4)


def test_no_shared_prompt_or_a_one_token_prompt_runs_one_forward_per_row() -> None:
    tok, model = make_tiny_model(seed=0)
    pad = tok.pad_token_id
    assert suffix_logits(model, [[5, 6], [7, 8]], [[1], [2]], pad_id=pad) is None
    assert suffix_logits(model, [[5], [5]], [[1], [2]], pad_id=pad) is None
    assert suffix_logits(model, [[4, 5], [4, 5]], [[1], [2]], pad_id=pad) is not None
