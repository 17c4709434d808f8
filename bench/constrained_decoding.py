"""Tokens/s of constrained decoding (the app's schema as an xgrammar mask) vs free sampling.

The tiny model with :class:`~marl_agents.llm.hf_backend.HFBackend` samples ``--batch``
prompts per ``generate`` at temperature 1, three ways: **free** (no constraint), **forced
call** (the supervisor tutorial's ``Router``: ``with_structured_output``'s forced tool call)
and **JSON plan** (a nested object with an array, as a ``response_format``). Each mode is
timed over ``--repeats`` calls (best of); generated tokens / wall seconds are printed per
mode with the ratio constrained / free. A constrained reply stops when its grammar closes,
so tokens/s (not calls/s) is the comparison. The first call of a mode compiles its grammar
(cached after); ``--repeats`` > 1 times the cached path. ``--sampler vllm`` samples with an
in-process vLLM engine instead (:class:`~marl_agents.llm.vllm_backend.VLLMBackend`: the
grammar applied by vLLM's xgrammar structured outputs, the masks replayed here, which the
timing includes; the engine starts first, ~35–50 s).

**Closing check** (``--sampler transformers``): the per-token cost of keeping replies closable
(:mod:`marl_agents.llm.closing`). Each constrained mode samples ``--batch`` replies at a budget
of its shortest reply + :data:`~marl_agents.llm.closing.MARGIN` (every token within the check's
reach) and at ``--new-tokens`` (the check reached only by long replies), then replays their
tokens through the row matchers twice, with the budgets (the shortest-completion check and
closing masks) and without (the grammar's masks alone); the difference per token is the
check's overhead (memo warm from the sampling, as in training after the first calls; ``first
search``: a schema's shortest reply with the memo cold). Run
from the repository root::

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/constrained_decoding.py
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv-vllm/bin/python bench/constrained_decoding.py \
        --sampler vllm
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field
from typing_extensions import TypedDict


class Router(TypedDict):
    """Worker to route to next. If no workers needed, route to FINISH."""

    next: Literal["researcher", "coder", "FINISH"]


class Inner(BaseModel):
    level: Literal["low", "high"]
    ok: bool


class Plan(BaseModel):
    steps: list[Literal["search", "code", "ask"]] = Field(max_length=3)
    inner: Inner
    count: int = Field(ge=0, le=9)


def constraints() -> dict[str, Any]:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from marl_agents.llm.constraints import Constraint

    return {
        "free": None,
        "forced call": Constraint.for_call([convert_to_openai_tool(Router)], "any"),
        "JSON plan": Constraint.for_call(response_format=Plan),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sampler", choices=("transformers", "vllm"), default="transformers")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from marl_agents.llm.backend import SamplingParams
    from marl_agents.llm.hf_backend import HFBackend
    from marl_agents.llm.tiny import make_tiny_model

    if args.sampler == "vllm":
        import tempfile

        from marl_agents.llm.vllm_backend import VLLMBackend

        path = tempfile.mkdtemp(prefix="constrained-bench-")
        tok, model = make_tiny_model(path, seed=0)
        backend: Any = VLLMBackend(path, tokenizer=tok, behaviour_logprobs=True)
    else:
        tok, model = make_tiny_model(seed=0)
        backend = HFBackend(model, tok)
    prompts = [tok(f"Task {i}: route it.")["input_ids"] for i in range(args.batch)]
    rates: dict[str, float] = {}
    for name, constraint in constraints().items():
        params = SamplingParams(max_new_tokens=args.new_tokens, constraint=constraint)
        best = 0.0
        for r in range(args.repeats):
            torch.manual_seed(r)
            start = time.perf_counter()
            gens = backend.generate(prompts, params)
            wall = time.perf_counter() - start
            best = max(best, sum(len(g.token_ids) for g in gens) / wall)
        rates[name] = best
        print(
            f"{name:12s} {best:8.0f} tokens/s  ({args.sampler}, batch {args.batch}, "
            f"≤ {args.new_tokens} tokens)"
        )
    for name in ("forced call", "JSON plan"):
        print(f"ratio {name} / free: {rates[name] / rates['free']:.2f}")
    if args.sampler == "transformers":
        closing_overhead(backend, tok, model, prompts, args.repeats, args.new_tokens)


def closing_overhead(
    backend: Any, tok: Any, model: Any, prompts: list, repeats: int, new_tokens: int
) -> None:
    """Print the shortest-completion check's cost per generated token (see the docstring)."""
    from marl_agents.llm.backend import SamplingParams
    from marl_agents.llm.closing import MARGIN
    from marl_agents.llm.constraints import RowMatchers, shortest_reply_tokens

    vocab, stops = int(model.config.vocab_size), [tok.eos_token_id]
    for name, constraint in constraints().items():
        if constraint is None:
            continue
        probe = RowMatchers(tok, vocab, [constraint], stops)
        probe.closers[0].dist.clear()  # cold memo: the schema's first search
        start = time.perf_counter()
        need = shortest_reply_tokens(tok, vocab, constraint, stops)
        first = time.perf_counter() - start
        assert need is not None
        for budget in (need + MARGIN, new_tokens):
            torch.manual_seed(0)
            params = SamplingParams(max_new_tokens=budget, constraint=constraint)
            gens = backend.generate(prompts, params)
            tokens = sum(len(g.token_ids) for g in gens)
            per_token = {}
            for check in (True, False):
                best = float("inf")
                for _ in range(repeats):
                    rows = RowMatchers(tok, vocab, [constraint] * len(gens), stops)
                    start = time.perf_counter()
                    for step in range(budget):
                        done = [step >= len(g.token_ids) for g in gens]
                        if all(done):
                            break
                        rows.next_masks(done, [budget - step] * len(gens) if check else None)
                        for r, g in enumerate(gens):
                            if not done[r]:
                                rows.accept(r, g.token_ids[step])
                    best = min(best, time.perf_counter() - start)
                per_token[check] = best / tokens * 1e6
            print(
                f"closing check {name:12s} {per_token[True] - per_token[False]:6.0f} µs/token "
                f"over the grammar's {per_token[False]:4.0f} (budget {budget}, shortest {need}; "
                f"{tokens / len(gens):.0f} tokens a reply; first search {first * 1e3:.0f} ms)"
            )


if __name__ == "__main__":
    main()
