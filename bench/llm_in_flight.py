"""Episodes/s of an LLM chat app with slow tools: envs in flight and batched generation.

The app is ``tests/apps/llm_tools.py`` (an assistant and a critic, both turns of the tiny LLM,
and a ``lookup`` tool call after every assistant reply but the last: ``c = turns - 1`` tool
calls per episode, whatever the model writes), one LLM pool for both agents
(``sharing: team``), GRPO's side-by-side groups (``N`` sub-envs of one env runner, built
directly: no Ray). Every tool call waits ``L`` s (``episodes.tool_latency``). For each ``N`` in
``--sizes`` three samplers run for ``--seconds`` each (after a warm-up ``sample()``):

* ``threads``: the batched sampler with ``episodes.env_threads`` (episodes waiting on the tool
  do not hold the others; each ``generate`` takes the envs that are ready);
* ``serial``: the batched sampler, envs stepped one after another in its thread;
* ``rllib``: RLlib's own ``MultiAgentEnvRunner`` (``episodes.sampler: rllib``; its vector env
  steps the envs in lock-step: one batched ``generate`` per step, every env waits for all).

Printed per case (the median of ``--rounds`` alternating runs): episodes/s, ``rows/gen``
(mean rows per ``generate``: the batched sampler's ``marl/llm/rows_per_generate``), the
tool-bound ``N / (L · c)`` and the ratios ``threads/serial`` and ``threads/rllib`` (side by
side in one run, so the machine's load is shared alike). Where the ratio to the bound is far
below 1 the process is compute-bound (generation and LangGraph on one GIL), not tool-bound.

Usage: ``python bench/llm_in_flight.py [--latency 0.2] [--sizes 2,8,16] [--turns 3]
[--seconds 8] [--new-tokens 6] [--modes threads,serial,rllib] [--rounds 1]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the app lives in tests/

from slow_tools import _value  # bench/ is this script's directory

APP = "tests.apps.llm_tools:app"


def make_runner(mode: str, n: int, latency: float, turns: int, new_tokens: int) -> Any:
    """An env runner of ``N`` sub-envs for ``mode`` (``threads``, ``serial`` or ``rllib``)."""
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    from trainers.algo import to_algorithm_config
    from trainers.configs.experiment import ExperimentConfig
    from trainers.sampling.batched_runner import BatchedEnvRunner

    episodes: dict[str, Any] = {"timeout_s": 120.0}
    if latency > 0:
        episodes["tool_latency"] = {"seconds": latency}
    if mode == "threads":
        episodes["env_threads"] = True
    if mode == "rllib":
        episodes["sampler"] = "rllib"
    cfg = ExperimentConfig.from_dict(
        {
            "scenario": APP,
            "scenario_kwargs": {"turns": turns, "max_new_tokens": new_tokens},
            "sharing": "team",
            "pools": {"team": {"model": {"type": "llm", "path": "tiny"}}},
            "algorithm": {"name": "GRPO", "grpo": {"group_size": n, "groups_per_iteration": 1}},
            "episodes": episodes,
            "seed": 0,
        }
    )
    cls = MultiAgentEnvRunner if mode == "rllib" else BatchedEnvRunner
    return cls(config=to_algorithm_config(cfg), worker_index=0)


def case(mode: str, n: int, args: argparse.Namespace) -> dict[str, float]:
    """Episodes/s and mean rows per generate of ``mode`` with ``n`` envs over the window."""
    runner = make_runner(mode, n, args.latency, args.turns, args.new_tokens)
    steps = 3 * n  # env steps per sample() call (an episode has 2 · turns - 1 steps)
    try:
        runner.sample(num_timesteps=steps, explore=True)  # warm-up (threads start, first reset)
        runner.get_metrics()
        start, episodes, rows, calls = time.perf_counter(), 0.0, 0.0, 0
        while time.perf_counter() - start < args.seconds:
            runner.sample(num_timesteps=steps, explore=True)
            marl = runner.get_metrics().get("marl", {})
            episodes += _value(marl.get("episodes", 0))
            r = _value((marl.get("llm") or {}).get("rows_per_generate", 0.0))
            if r:
                rows, calls = rows + r, calls + 1
        wall = time.perf_counter() - start
    finally:
        runner.stop()
    return {"eps": episodes / wall, "rows": rows / calls if calls else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="L: seconds per tool call")
    parser.add_argument("--sizes", default="2,8,16", help="N: envs (episodes in flight)")
    parser.add_argument("--turns", type=int, default=3, help="assistant replies per episode")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per case")
    parser.add_argument("--new-tokens", type=int, default=6, help="max_new_tokens per reply")
    parser.add_argument("--modes", default="threads,serial,rllib")
    parser.add_argument("--rounds", type=int, default=1, help="alternating runs (median)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    modes = args.modes.split(",")
    c = args.turns - 1
    print(
        f"{APP}: L={args.latency:g} s, c={c} tool calls per episode, {args.turns} assistant + "
        f"{args.turns - 1} critic replies of <= {args.new_tokens} tokens; {args.seconds:g} s "
        "per case"
    )
    print(
        f"{'N':>3} {'mode':<8} {'eps/s':>7} {'rows/gen':>8} {'bound':>7} {'ratio':>6} "
        "(min–max over rounds)"
    )
    for n in (int(s) for s in args.sizes.split(",")):
        bound = n / (args.latency * c) if args.latency > 0 and c > 0 else float("inf")
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for _ in range(args.rounds):  # modes alternate, so load changes hit them alike
            for mode in modes:
                runs[mode].append(case(mode, n, args))
        got = {}
        for mode in modes:
            eps = [r["eps"] for r in runs[mode]]
            got[mode] = r = {"eps": float(np.median(eps)), "rows": runs[mode][-1]["rows"]}
            spread = f"{min(eps):.2f}–{max(eps):.2f}" if len(eps) > 1 else ""
            print(
                f"{n:>3} {mode:<8} {r['eps']:>7.2f} {r['rows']:>8.2f} {bound:>7.2f} "
                f"{r['eps'] / bound:>6.2f} {spread}",
                flush=True,
            )
        ratios = [
            f"{a}/{b} = {got[a]['eps'] / got[b]['eps']:.2f}"
            for a, b in (("threads", "serial"), ("threads", "rllib"), ("serial", "rllib"))
            if a in got and b in got and got[b]["eps"] > 0
        ]
        print(f"    N={n}: " + ", ".join(ratios), flush=True)


if __name__ == "__main__":
    main()
