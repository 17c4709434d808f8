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
timing includes; the engine starts first, ~35–50 s). Run from the repository root::

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


if __name__ == "__main__":
    main()
