"""One decoding step's tokens for every row of a batch at once.

:class:`RowDraws` holds, per row, its sampling settings (temperature, top-p; temperature 0:
greedy) and its own stream of uniform numbers, drawn up front from the row's
``torch.Generator`` (one ``torch.rand`` per row and generation, seeded by the row's
:class:`~marl_agents.llm.backend.SamplingParams` ``seed``). :meth:`RowDraws.draw` samples
every row's next token with a handful of batched tensor ops — inverse-CDF sampling of
``softmax(logits / T)`` (renormalised over the top-p nucleus where ``top_p < 1``) at the row's
uniform number for that step — so a step costs no per-row kernel and no per-row host sync (what
a GPU pays most for). A row's tokens depend only on its logits, settings and seed, not on the
rows beside it.

Example:
    >>> from marl_agents.llm.backend import SamplingParams
    >>> params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=3)]
    >>> draws = RowDraws(params, limit=2, device=torch.device("cpu"))
    >>> tok, lp = draws.draw(torch.tensor([[0.0, 5.0], [0.0, 0.0]]), step=0)
    >>> int(tok[0]), float(lp[0])
    (1, 0.0)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from marl_agents.llm.backend import SamplingParams


def row_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A row's generator: seeded by ``seed``, or (``None``) from torch's global RNG, so that
    ``torch.manual_seed`` makes unseeded runs repeatable."""
    gen = torch.Generator(device=device)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    gen.manual_seed(int(seed))
    return gen


class RowDraws:
    """The rows' settings and uniform streams for one generation of at most ``limit`` steps."""

    def __init__(self, params: Sequence[SamplingParams], limit: int, device: torch.device) -> None:
        self.greedy = torch.tensor([p.temperature == 0 for p in params], device=device)
        temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
        self.temps = torch.tensor(temps, dtype=torch.float32, device=device)[:, None]
        top_p = [p.top_p if p.temperature > 0 else 1.0 for p in params]
        self.top_p = torch.tensor(top_p, dtype=torch.float32, device=device)[:, None]
        self.nucleus = any(t < 1.0 for t in top_p)
        self.all_greedy = all(p.temperature == 0 for p in params)
        self.uniforms = None
        if not self.all_greedy:
            steps = max(limit, 1)
            self.uniforms = torch.stack(
                [torch.rand(steps, generator=row_generator(p.seed, device), device=device)
                 for p in params]
            )  # fmt: skip

    def draw(self, logits: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's token at decoding step ``step`` from float32 ``logits`` ``[n, vocab]``
        (masked where a constraint applies), and its log-probability under the distribution
        that drew it (``0`` for greedy rows).

        Returns:
            ``(tokens, sampling_logprobs)``: ``[n]`` long and ``[n]`` float32 tensors.
        """
        best = torch.argmax(logits, dim=-1)
        if self.uniforms is None:
            return best, torch.zeros(len(logits), dtype=torch.float32, device=logits.device)
        logp = torch.log_softmax(logits / self.temps, dim=-1)
        if self.nucleus:
            logp = torch.where(self.top_p < 1.0, _nucleus(logp, self.top_p), logp)
        cdf = logp.exp().cumsum(-1)
        # the row's uniform scaled to its CDF's total (float rounding), kept > 0 so that a
        # zero-probability token at the start is never drawn
        x = (self.uniforms[:, step : step + 1] * cdf[:, -1:]).clamp(
            min=torch.finfo(torch.float32).tiny
        )
        tok = torch.searchsorted(cdf, x).squeeze(1).clamp(max=logits.shape[-1] - 1)
        tok = torch.where(self.greedy, best, tok)
        lp = logp.gather(1, tok[:, None]).squeeze(1)
        return tok, torch.where(self.greedy, torch.zeros_like(lp), lp)


def _nucleus(logp: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``logp`` renormalised over each row's nucleus: the smallest prefix of its tokens by
    probability whose mass reaches the row's ``top_p`` (the first token always stays)."""
    sorted_lp, order = torch.sort(logp, dim=-1, descending=True)
    probs = sorted_lp.exp()
    drop = (probs.cumsum(-1) - probs) >= top_p
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    kept = torch.full_like(logp, float("-inf")).scatter(1, order, sorted_lp)
    return torch.log_softmax(kept, dim=-1)
