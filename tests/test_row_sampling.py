"""Batched token draws (``marl_agents.llm.row_sampling``): each row samples from
``softmax(logits / T)`` (renormalised over its top-p nucleus), greedy rows take the argmax,
the returned logprob is the drawn token's under that distribution, and a row's tokens
depend on its seed only."""

from __future__ import annotations

import torch

from marl_agents.llm.backend import SamplingParams
from marl_agents.llm.row_sampling import RowDraws

CPU = torch.device("cpu")
LOGITS = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf")])


def frequencies(
    params: SamplingParams, rows: int = 20000
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """How often each token is drawn over ``rows`` rows of ``LOGITS`` with seeds 0…rows-1."""
    draws = RowDraws(
        [SamplingParams(temperature=params.temperature, top_p=params.top_p, seed=s)
         for s in range(rows)],
        limit=1,
        device=CPU,
    )  # fmt: skip
    tok, lp = draws.draw(LOGITS.expand(rows, -1).clone(), 0)
    return torch.bincount(tok, minlength=len(LOGITS)).float() / rows, tok, lp


def test_rows_sample_the_tempered_distribution_and_report_its_logprob() -> None:
    for temperature in (1.0, 0.5):
        freq, tok, lp = frequencies(SamplingParams(temperature=temperature))
        want = torch.softmax(LOGITS / temperature, dim=-1)
        assert freq[-1] == 0  # a masked (-inf) token is never drawn
        assert torch.allclose(freq, want, atol=0.015), (freq, want)
        torch.testing.assert_close(lp, torch.log(want)[tok], rtol=0, atol=1e-5)


def test_top_p_keeps_the_nucleus_renormalised() -> None:
    probs = torch.softmax(LOGITS, dim=-1)  # 0.64, 0.24, 0.09, 0.03
    freq, tok, lp = frequencies(SamplingParams(temperature=1.0, top_p=0.8))
    nucleus = probs[:2] / probs[:2].sum()  # 0.64 + 0.24 reaches 0.8
    assert freq[2:].sum() == 0
    assert torch.allclose(freq[:2], nucleus, atol=0.015)
    torch.testing.assert_close(lp, torch.log(nucleus)[tok], rtol=0, atol=1e-5)


def test_greedy_rows_beside_sampled_rows_and_seeds_alone_decide_a_rows_tokens() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0 if r % 2 else 1.0, seed=r) for r in range(6)]
    tok, lp = RowDraws(params, limit=3, device=CPU).draw(logits, 2)
    assert torch.equal(tok[1::2], logits[1::2].argmax(-1)) and not lp[1::2].any()
    for r in range(0, 6, 2):  # alone, or beside other rows: the same token
        alone, alone_lp = RowDraws([params[r]], limit=3, device=CPU).draw(logits[r : r + 1], 2)
        assert int(alone) == int(tok[r]) and float(alone_lp) == float(lp[r])
    other = RowDraws([SamplingParams(seed=99)], limit=3, device=CPU).uniforms
    assert not torch.equal(other, RowDraws([params[0]], limit=3, device=CPU).uniforms)
