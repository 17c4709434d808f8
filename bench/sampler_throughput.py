"""Sampling throughput of a trained LLM pool: ``sampler: vllm`` vs ``sampler: transformers``.

Builds the tiny ``CausalLMModule`` twice (same weights), once per sampler, and times
``forward_exploration`` — what an env runner calls for a batch of text agents — on B prompts
for each batch size B (default 8, 32, 64), best of ``--repeats``; prints generated tokens/s
for each and the ratio vllm / transformers. Then the weight sync: ``set_state`` with new
weights followed by the next sample reloads the engine (``VLLMSampler.sync``), timed over
``--syncs`` updates, next to a pickle round trip of the same state (a lower bound for
shipping weights to an engine in another process, e.g. a shared Ray actor).

Needs vLLM (``scripts/install_vllm.sh``); run from its venv, from the repository root::

    PYTHONPATH=$PWD .venv-vllm/bin/python bench/sampler_throughput.py
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time
from typing import Any

import numpy as np
import torch
from llm_rollout import TASKS as TEXTS  # bench/ is the script's directory


def build(sampler: str, new_tokens: int) -> Any:
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from marl_agents.llm.rl_module import CausalLMModule
    from scenarios.text_space import TextSpaces

    spaces = TextSpaces(vocab_size=384, max_prompt_tokens=48, max_new_tokens=new_tokens)
    return RLModuleSpec(
        module_class=CausalLMModule,
        observation_space=spaces.observation_space,
        action_space=spaces.action_space,
        model_config={"model": "tiny", "tiny_seed": 0, "sampler": sampler},
    ).build()


def obs_batch(module: Any, n: int) -> torch.Tensor:
    from scenarios.text_space import encode_prompt

    rows = [
        module.spaces.encode_prompt(encode_prompt(module.tokenizer, TEXTS[i % len(TEXTS)]))
        for i in range(n)
    ]
    return torch.as_tensor(np.stack(rows))


def throughput(module: Any, n: int, repeats: int) -> tuple[float, int]:
    """Best tokens/s of ``forward_exploration`` on ``n`` prompts, and the tokens of that run."""
    from ray.rllib.core.columns import Columns

    obs = obs_batch(module, n)
    best, best_tokens = 0.0, 0
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.no_grad():
            out = module.forward_exploration({Columns.OBS: obs})
        elapsed = time.perf_counter() - start
        tokens = int((out[Columns.ACTIONS] != module.pad_id).sum())
        if tokens / elapsed > best:
            best, best_tokens = tokens / elapsed, tokens
    return best, best_tokens


def weight_syncs(module: Any, syncs: int) -> tuple[list[float], float, float]:
    """Seconds per engine reload after ``set_state``, a pickle round trip, the state's MB."""
    gen = torch.Generator().manual_seed(0)
    times, pickles = [], []
    for _ in range(syncs):
        state = {
            k: torch.as_tensor(v) + 1e-3 * torch.randn(v.shape, generator=gen)
            for k, v in module.get_state().items()
        }
        module.set_state(state)
        module.vllm_sampler()  # reloads the engine: the version moved
        times.append(module.vllm_sampler().sync_s)
        start = time.perf_counter()
        pickle.loads(pickle.dumps(state))
        pickles.append(time.perf_counter() - start)
    mb = sum(v.numel() * v.element_size() for v in state.values()) / 2**20
    return times, statistics.median(pickles), mb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 32, 64])
    ap.add_argument("--tokens", type=int, default=32, help="max new tokens per completion")
    ap.add_argument("--repeats", type=int, default=3, help="report the best of this many")
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (transformers)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hf = build("transformers", args.tokens)
    start = time.perf_counter()
    vllm = build("vllm", args.tokens)
    throughput(vllm, 2, 1)  # starts the engine
    print(f"vLLM engine start (in process): {time.perf_counter() - start:.1f} s")
    throughput(hf, 2, 1)
    print(f"tiny model, {args.tokens} max new tokens, best of {args.repeats}")
    print(f"{'batch':>5} {'transformers tok/s':>19} {'vllm tok/s':>11} {'vllm/transformers':>18}")
    for n in args.batches:
        t_hf, _ = throughput(hf, n, args.repeats)
        t_vllm, _ = throughput(vllm, n, args.repeats)
        print(f"{n:>5} {t_hf:>19.0f} {t_vllm:>11.0f} {t_vllm / t_hf:>18.2f}")
    times, pickled, mb = weight_syncs(vllm, args.syncs)
    print(
        f"weight sync into the engine ({mb:.2f} MB, {args.syncs} updates): median "
        f"{statistics.median(times) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms; "
        f"pickle round trip of the same state: {pickled * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
