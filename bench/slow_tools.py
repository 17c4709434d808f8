"""Episodes/s with slow tools: envs in flight (:class:`scenarios.in_flight.Stepper`) against
the bound ``N / (L · c)``.

Every tool call waits ``L`` seconds (``episodes.tool_latency``, :mod:`scenarios.tool_latency`);
with ``c`` tool calls per episode (measured), ``N`` episodes in flight finish at most
``N / (L · c)`` episodes/s when tools dominate. For N in ``--sizes`` and the sync and async
tool-using apps of ``tests/apps/slow_tools.py`` (an agent node with ``bind_tools``, a
``ToolNode``, ``tools_condition``), episodes are sampled with random valid actions — a
``lookup`` call of a random key, or the final answer with probability ``--answer-p`` (so
``c ≈ (1 - p) / p``) — through the stepper:

* ``threads``: each env its own thread (``Stepper(threads=True)``): tools wait side by side;
* ``serial``: the baseline, every call in this thread one after another (``threads=False``).

Each case runs ``--seconds`` after a warm-up and prints episodes/s, the measured ``c``, the
bound, and the ratio to it (goal: ≥ 0.8 with threads for N up to 64). ``cpu-bound`` is the
rate one core allows at the measured compute per episode (a latency-free serial run of the
same app): the GIL runs one env's Python at a time, so the ratio cannot pass
``cpu-bound / bound`` where that is below 1.

Usage: ``python bench/slow_tools.py [--latency 0.2] [--jitter 0] [--sizes 1,4,16,64]
[--apps sync,async] [--seconds 6] [--answer-p 0.34] [--modes threads,serial]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the apps live in tests/

from marl_agents.llm.env_chat_model import tokens_action
from scenarios.in_flight import Stepper
from scenarios.rllib_env import RLlibGraphEnv
from scenarios.toolcalls import render_tool_call
from tests.apps.slow_tools import VALUES

APPS = {"sync": "tests.apps.slow_tools:sync_app", "async": "tests.apps.slow_tools:async_app"}
MAX_CALLS = 8  # a random episode answers after this many calls at the latest


class RandomReplies:
    """Random valid replies: ``lookup(key)`` of a random key, or the answer with ``p``."""

    def __init__(self, env: RLlibGraphEnv, p: float, seed: int) -> None:
        scenario = env.env.scenario
        spaces, tok = scenario.spaces, scenario.tokenizer
        keys = [*sorted(VALUES), "nope"]
        self.calls = [
            tokens_action(spaces, tok, render_tool_call("lookup", {"key": k})) for k in keys
        ]
        self.answers = [tokens_action(spaces, tok, f"It is {v}.") for v in VALUES.values()]
        self.p = p
        self.rng = np.random.default_rng(seed)

    def __call__(self, turn: int) -> np.ndarray:
        if turn >= MAX_CALLS or self.rng.random() < self.p:
            return self.answers[int(self.rng.integers(len(self.answers)))]
        return self.calls[int(self.rng.integers(len(self.calls)))]


def make_envs(app: str, n: int, latency: float, jitter: float) -> list[RLlibGraphEnv]:
    # latency 0 still counts the tool calls (ToolEpisode.calls)
    config = {"scenario": APPS[app], "tool_latency": {"seconds": latency, "jitter": jitter}}
    return [RLlibGraphEnv(config) for _ in range(n)]


def sample(envs: list[RLlibGraphEnv], threads: bool, seconds: float, p: float) -> dict[str, float]:
    """Run episodes on every env for ``seconds`` after a warm-up; episodes/s and calls each."""
    n = len(envs)
    replies = [RandomReplies(env, p, seed=i) for i, env in enumerate(envs)]
    turns = [0] * n
    seeds = iter(range(10**9))
    finished = calls = ended = 0
    start = end = None
    warm_until = n if threads else 4  # episodes finished before the window opens
    with Stepper(envs, threads=threads) as stepper:
        for i in range(n):
            stepper.start_reset(i, seed=next(seeds))
        while True:
            for done in stepper.wait():
                i = done.index
                if done.error is not None:
                    raise done.error
                assert done.result is not None
                obs = done.result[0]
                if done.kind == "step" and (done.result[2]["__all__"] or done.result[3]["__all__"]):
                    tools = envs[i].env.tool_episode
                    assert tools is not None
                    calls += tools.calls  # c: over every finished episode, warm-up included
                    ended += 1
                    if start is None:
                        if ended >= warm_until:
                            start = time.perf_counter()
                    else:
                        finished += 1
                    turns[i] = 0
                    stepper.start_reset(i, seed=next(seeds))
                    continue
                stepper.start_step(i, {a: replies[i](turns[i]) for a in obs})
                turns[i] += 1
            if start is not None and time.perf_counter() - start >= seconds:
                end = time.perf_counter()
                break
        assert end is not None
    return {"eps": finished / (end - start), "c": calls / ended, "n": finished}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="L: seconds per tool call")
    parser.add_argument("--jitter", type=float, default=0.0, help="J: L ± J uniform")
    parser.add_argument("--sizes", default="1,4,16,64", help="N: episodes in flight")
    parser.add_argument("--apps", default="sync,async")
    parser.add_argument("--modes", default="threads,serial")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured window per case")
    parser.add_argument("--answer-p", type=float, default=0.34, help="P(answer) per decision")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    print(
        f"tool latency L={args.latency:g} s ± {args.jitter:g}; window {args.seconds:g} s per case; "
        f"P(answer)={args.answer_p:g}"
    )
    header = f"{'app':<6} {'N':>3} {'mode':<8} {'eps/s':>8} {'c':>5} {'bound':>8} {'ratio':>6}"
    for app in args.apps.split(","):
        # compute per episode: a latency-free serial run (one core's worth of Python)
        free = sample(make_envs(app, 1, 0.0, 0.0), False, min(args.seconds, 3.0), args.answer_p)
        print(
            f"\n{app}: {free['eps']:.1f} episodes/s without latency (serial, one env): "
            f"{1000 / free['eps']:.1f} ms of compute per episode, c={free['c']:.2f}"
        )
        print(header + f" {'cpu/bound':>9}")
        for n in sizes:
            envs = make_envs(app, n, args.latency, args.jitter)
            for mode in modes:
                r = sample(envs, mode == "threads", args.seconds, args.answer_p)
                bound = n / (args.latency * r["c"]) if args.latency > 0 else float("inf")
                print(
                    f"{app:<6} {n:>3} {mode:<8} {r['eps']:>8.2f} {r['c']:>5.2f} {bound:>8.2f} "
                    f"{r['eps'] / bound:>6.2f} {free['eps'] / bound:>9.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
