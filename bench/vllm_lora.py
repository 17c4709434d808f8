"""vLLM multi-LoRA serving vs one full-model engine per pool (``sampler: vllm``).

Builds two :class:`~marl_agents.llm.rl_module.CausalLMModule` pools in this process, twice:
``full`` (two full models, each with its own in-process vLLM engine) and ``lora`` (two LoRA
adapters on one base, served by ONE multi-LoRA engine). Printed per setup: the engine start,
the median sync time after a weight update (full: the whole state dict; LoRA: the adapter
saved and re-added under a new id) and the sampling throughput of both pools (tokens/s over
``--rounds`` rounds of ``--batch`` prompts per pool), then the LoRA/full ratios.

Models: ``tiny`` (378k parameters) or ``medium`` (a Qwen2 built in code: hidden 512,
8 layers, ~26M parameters, saved to a temporary directory).

    .venv-vllm/bin/python bench/vllm_lora.py [--size medium] [--batch 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lora_pools import LORA, MEDIUM  # noqa: E402  (the same sizes as the memory bench)


def build(model: str, lora: bool, spaces: Any) -> list[Any]:
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from marl_agents.llm.rl_module import CausalLMModule

    mods = []
    for i in range(2):
        config: dict[str, Any] = {"model": model, "sampler": "vllm", "pool": f"p{i}"}
        if lora:
            config["lora"] = dict(LORA)
        spec = RLModuleSpec(
            module_class=CausalLMModule,
            observation_space=spaces.observation_space,
            action_space=spaces.action_space,
            model_config=config,
        )
        mods.append(spec.build())
    return mods


def measure(mods: list[Any], batch: int, rounds: int) -> dict[str, float]:
    import torch

    start = time.perf_counter()
    for m in mods:
        m.vllm_sampler()
    start_s = time.perf_counter() - start
    syncs = []
    for _ in range(3):
        for m in mods:
            with torch.no_grad():
                for p in m.model.parameters():
                    p.add_(1e-3)
            m.set_state(m.get_state(inference_only=True))
            syncs.append(_sync_s(m))
    prompts = [[5 + (k * 7 + j) % 300 for j in range(12)] for k in range(batch)]
    for m in mods:  # warm-up
        m.generate(prompts[:2], 1.0)
    tokens, t0 = 0, time.perf_counter()
    for _ in range(rounds):
        for m in mods:
            tokens += sum(len(g.token_ids) for g in m.generate(prompts, 1.0))
    secs = time.perf_counter() - t0
    return {"start_s": start_s, "sync_s": statistics.median(syncs), "tok_s": tokens / secs}


def _sync_s(module: Any) -> float:
    sampler = module.vllm_sampler()  # syncs the new version
    return float(sampler.sync_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("tiny", "medium"), default="tiny")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--kinds", nargs="+", choices=("full", "lora"), default=["full", "lora"])
    args = ap.parse_args()
    from marl_agents.llm.tiny import make_tiny_model
    from scenarios.text_space import TextSpaces

    model = "tiny"
    if args.size == "medium":
        model = str(Path(tempfile.mkdtemp(prefix="bench-vllm-lora-")) / "medium")
        make_tiny_model(model, seed=0, **MEDIUM)
    spaces = TextSpaces(vocab_size=384, max_prompt_tokens=32, max_new_tokens=args.new_tokens)
    res = {}
    for kind in args.kinds:  # one process per kind (--kinds lora) avoids order effects
        res[kind] = measure(build(model, kind == "lora", spaces), args.batch, args.rounds)
        print(kind, {k: round(v, 4) for k, v in res[kind].items()}, flush=True)
    if len(res) < 2:
        return
    f, lo = res["full"], res["lora"]
    print(
        f"size={args.size} batch={args.batch}: sync LoRA/full {lo['sync_s'] / f['sync_s']:.2f}x, "
        f"tokens/s LoRA/full {lo['tok_s'] / f['tok_s']:.2f}x, "
        f"engine start LoRA/full {lo['start_s'] / f['start_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
