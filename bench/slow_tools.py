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

Each case runs ``--seconds`` (with threads, after every env finished an episode) and prints
episodes/s, ``c`` (tool calls per finished episode of the case), the bound ``N / (L · c)`` with
``c`` measured on a latency-free serial run of the same random policy (many episodes, so not
biased towards short ones), ``ratio`` = episodes/s ÷ bound (goal: ≥ 0.8 with threads for N up
to 64), and ``busy``: tool-call steps finished in the window × L / (N · window), the share of
the slots' time spent waiting on tools — the same quantity in steady state, counted per call,
so short windows do not bias it (the serial baseline with many envs finishes few, short
episodes per window). ``ceiling/bound``: the episodes/s of the largest N with threads and no
latency at all (this process's compute ceiling: the GIL runs one env's Python at a time) over
the bound; where it is below 1 no scheduling in one process meets the bound (more processes
do: RLlib env runners).

``--procs P[,P…]``: each case also runs as ``P`` processes (``multiprocessing`` spawn), each
with ``N / P`` of the envs in flight; they build their envs, meet at a barrier, sample a window
each, and their episodes/s add up (``P = 1`` runs here, as without the flag). Next to every
ratio the table prints the **CPU bound** ``cores / (CPU seconds per episode)`` (``cpu``:
episodes/s if every core of this process's affinity did nothing but this work; CPU seconds =
``time.process_time()`` of all processes over their windows, divided by the episodes they
finished) and ``cpu/bound`` = CPU bound ÷ the latency bound: below 1, the machine's CPU (not
the tools' latency) limits the case, and no scheduling can meet the latency bound; above 1,
latency does, and the ratio says how well envs in flight hide it. On a machine shared with
other work the CPU bound is optimistic (other processes take cores too).

``--runner``: the same bound through the trainer's sampler,
:class:`~trainers.sampling.batched_runner.
BatchedEnvRunner` on ``toolchain`` (an MLP policy, tool calls inside the scenario's nodes)
with ``episodes.tool_latency`` and ``episodes.env_threads`` on (``threads``) or off
(``serial``); ``c`` is the scenario's own count of tool calls per episode (``metric/calls``):
``ratio`` uses ``c`` of a latency-free run, ``busy`` the case's own (episodes finished in a
short window are biased towards few calls).

Usage: ``python bench/slow_tools.py [--latency 0.2] [--jitter 0] [--sizes 1,4,16,64]
[--apps sync,async] [--seconds 6] [--answer-p 0.34] [--modes threads,serial] [--procs 1,2]
[--no-ceiling] [--runner]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the apps live in tests/

from marl_agents.llm.env_chat_model import tokens_action
from scenarios.in_flight import Done, Stepper
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


class Sampler:
    """Episodes on every env through a :class:`Stepper`, counted in a time window."""

    def __init__(self, envs: list[RLlibGraphEnv], threads: bool, p: float, base: int = 0) -> None:
        self.envs, self.threads = envs, threads
        self.replies = [RandomReplies(env, p, seed=base + i) for i, env in enumerate(envs)]
        self.turns, self.calling = [0] * len(envs), [False] * len(envs)
        self.seeds = iter(range(base * 10**6, 10**12))
        self.ended = self.calls = self.finished = self.call_steps = 0
        self.start: float | None = None
        self.cpu_start = 0.0

    def take(self, stepper: Stepper, done: Done, go_on: bool) -> None:
        """Count one finished call; start env ``i``'s next call when ``go_on``."""
        i, in_window = done.index, self.start is not None
        if done.error is not None:
            raise done.error
        assert done.result is not None
        self.call_steps += in_window and self.calling[i]
        self.calling[i] = False
        if done.kind == "step" and (done.result[2]["__all__"] or done.result[3]["__all__"]):
            tools = self.envs[i].env.tool_episode
            assert tools is not None
            self.ended += 1
            self.calls += tools.calls
            self.finished += in_window
            if self.start is None and self.ended >= len(self.envs):
                self.start = time.perf_counter()  # every env has finished an episode
                self.cpu_start = time.process_time()
            self.turns[i] = 0
            if go_on:
                stepper.start_reset(i, seed=next(self.seeds))
            return
        if go_on:
            action = self.replies[i](self.turns[i])
            self.calling[i] = any(action is c for c in self.replies[i].calls)
            stepper.start_step(i, dict.fromkeys(done.result[0], action))
            self.turns[i] += 1

    def run(self, seconds: float) -> dict[str, float]:
        """Sample for a window of ``seconds``: opened once every env finished an episode with
        threads, at once serially (where every started call has run when it is collected, so
        the calls of the last batch count too)."""
        with Stepper(self.envs, threads=self.threads) as stepper:
            for i in range(len(self.envs)):
                stepper.start_reset(i, seed=next(self.seeds))
            if not self.threads:
                self.start, self.cpu_start = time.perf_counter(), time.process_time()
            while self.start is None or time.perf_counter() - self.start < seconds:
                for done in stepper.wait():
                    self.take(stepper, done, go_on=True)
            window = time.perf_counter() - self.start
            cpu = time.process_time() - self.cpu_start
            if not self.threads:
                for done in stepper.wait():
                    self.take(stepper, done, go_on=False)
        return {
            "eps": self.finished / window,
            "c": self.calls / max(self.ended, 1),
            "call_steps_s": self.call_steps / window,
            "cpu_s": cpu,
            "finished": float(self.finished),
            "ended": float(self.ended),
            "calls": float(self.calls),
        }


def sample(
    envs: list[RLlibGraphEnv], threads: bool, seconds: float, p: float, base: int = 0
) -> dict[str, float]:
    """Episodes/s in the window, ``c`` (tool calls per episode finished in the whole run),
    tool-call steps finished per second in the window (see the module doc), and the process's
    CPU seconds and finished episodes in the window."""
    return Sampler(envs, threads, p, base).run(seconds)


def _proc(
    case: tuple[str, int, float, float, bool, float, float], rank: int, start: Any, out: Any
) -> None:
    """One process of a ``--procs`` case: its envs, the barrier, one window, its counts."""
    app, n, latency, jitter, threads, seconds, p = case
    envs = make_envs(app, n, latency, jitter)
    start.wait()  # every process has built its envs: the windows run side by side
    out.put(sample(envs, threads, seconds, p, base=1000 * (rank + 1)))


def sample_procs(
    procs: int, app: str, n: int, latency: float, jitter: float, threads: bool, seconds: float,
    p: float,
) -> dict[str, float]:  # fmt: skip
    """:func:`sample` in ``procs`` processes with ``n / procs`` envs each; rates and counts
    summed (``c`` over all their episodes)."""
    if procs == 1:
        return sample(make_envs(app, n, latency, jitter), threads, seconds, p)
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(procs), ctx.Queue()
    case = (app, n // procs, latency, jitter, threads, seconds, p)
    workers = [ctx.Process(target=_proc, args=(case, r, start, out)) for r in range(procs)]
    for w in workers:
        w.start()
    parts = [out.get() for _ in workers]
    for w in workers:
        w.join()
    total = {k: sum(part[k] for part in parts) for k in ("eps", "call_steps_s", "cpu_s")}
    total.update({k: sum(part[k] for part in parts) for k in ("finished", "ended", "calls")})
    total["c"] = total["calls"] / max(total["ended"], 1.0)
    return total


def cpu_bound(r: dict[str, float]) -> float:
    """Episodes/s if every core did nothing but this work: cores / CPU seconds per episode."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_episode = r["cpu_s"] / max(r["finished"], 1.0)
    return float(cores or 1) / max(per_episode, 1e-9)


def runner_case(n: int, latency: float, threads: bool, seconds: float) -> dict[str, float]:
    """Episodes/s and tool calls per episode of the batched sampler on ``toolchain`` with ``n``
    envs, sampling ``4 n`` env steps per ``sample()`` call for ``seconds`` (after a warm-up)."""
    from trainers.algo import to_algorithm_config
    from trainers.configs.experiment import ExperimentConfig
    from trainers.sampling.batched_runner import BatchedEnvRunner

    episodes = {"env_threads": threads, "timeout_s": 60.0}
    if latency > 0:
        episodes["tool_latency"] = {"seconds": latency}
    cfg = ExperimentConfig.from_dict(
        {"scenario": "toolchain", "episodes": episodes,
         "resources": {"num_envs_per_env_runner": n}}
    )  # fmt: skip
    runner = BatchedEnvRunner(config=to_algorithm_config(cfg))
    try:
        runner.sample(num_timesteps=4 * n, explore=True)
        runner.get_metrics()
        start, episodes_done, calls = time.perf_counter(), 0.0, 0.0
        while time.perf_counter() - start < seconds:
            runner.sample(num_timesteps=4 * n, explore=True)
            marl = runner.get_metrics().get("marl", {})
            episodes_done += _value(marl.get("episodes", 0))
            calls += _value(marl.get("metric/calls", 0.0))
        wall = time.perf_counter() - start
    finally:
        runner.stop()
    return {"eps": episodes_done / wall, "c": calls / max(episodes_done, 1.0)}


def _value(x: object) -> float:
    """A reduced metric: the local runner's ``get_metrics()`` holds ``Stats`` objects."""
    peek = getattr(x, "peek", None)
    value = float(peek() if peek is not None else x)  # type: ignore[arg-type]
    return 0.0 if np.isnan(value) else value  # nothing logged in this call


def run_runner(args: argparse.Namespace, sizes: list[int], modes: list[str]) -> None:
    free = runner_case(1, 0.0, False, min(args.seconds, 4.0))
    print(
        f"\ntoolchain through BatchedEnvRunner: c = {free['c']:.2f} tool calls per episode; "
        f"{free['eps']:.1f} episodes/s without latency, one env"
    )
    print(f"{'N':>3} {'mode':<8} {'eps/s':>8} {'c':>5} {'bound':>8} {'ratio':>6} {'busy':>6}")
    for n in sizes:
        for mode in modes:
            r = runner_case(n, args.latency, mode == "threads", args.seconds)
            bound = n / (args.latency * free["c"])
            busy = r["eps"] * args.latency * r["c"] / n  # with the case's own c
            print(
                f"{n:>3} {mode:<8} {r['eps']:>8.2f} {r['c']:>5.2f} {bound:>8.2f} "
                f"{r['eps'] / bound:>6.2f} {busy:>6.2f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="L: seconds per tool call")
    parser.add_argument("--jitter", type=float, default=0.0, help="J: L ± J uniform")
    parser.add_argument("--sizes", default="1,4,16,64", help="N: episodes in flight")
    parser.add_argument("--apps", default="sync,async")
    parser.add_argument("--modes", default="threads,serial")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured window per case")
    parser.add_argument("--answer-p", type=float, default=0.34, help="P(answer) per decision")
    parser.add_argument("--procs", default="1", help="P: processes sharing the N envs")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the no-latency ceiling")
    parser.add_argument("--runner", action="store_true", help="sample through BatchedEnvRunner")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    procs = [int(p) for p in args.procs.split(",")]
    if args.runner:
        run_runner(args, sizes, modes)
        return
    print(
        f"tool latency L={args.latency:g} s ± {args.jitter:g}; window {args.seconds:g} s per case; "
        f"P(answer)={args.answer_p:g}"
    )
    header = (
        f"{'app':<6} {'N':>3} {'P':>2} {'mode':<8} {'eps/s':>8} {'c':>5} {'bound':>8} "
        f"{'ratio':>6} {'cpu':>8} {'cpu/bound':>9} {'busy':>6} {'ceiling/bound':>13}"
    )
    for app in args.apps.split(","):
        # c: a latency-free serial run of one env (many episodes, none cut off by the window);
        # the ceiling: the largest N with threads and no latency, in one process
        free = sample(make_envs(app, 1, 0.0, 0.0), False, min(args.seconds, 4.0), args.answer_p)
        ceiling = None
        if not args.no_ceiling:
            envs = make_envs(app, max(sizes), 0.0, 0.0)
            ceiling = sample(envs, True, args.seconds, args.answer_p)["eps"]
        c = free["c"]
        print(
            f"\n{app}: c = {c:.2f} tool calls per episode (bound = N / (L · c)); without "
            f"latency {free['eps']:.1f} episodes/s serially with one env"
            + ("" if ceiling is None else f", {ceiling:.1f} with {max(sizes)} on threads")
        )
        print(header)
        for n in sizes:
            bound = n / (args.latency * c)
            for mode in modes:
                for p in procs:
                    if n % p:
                        continue  # N envs do not split evenly over P processes
                    r = sample_procs(
                        p, app, n, args.latency, args.jitter, mode == "threads", args.seconds,
                        args.answer_p,
                    )  # fmt: skip
                    busy = r["call_steps_s"] * args.latency / n
                    cpu = cpu_bound(r)
                    top = "-" if ceiling is None else f"{ceiling / bound:.2f}"
                    print(
                        f"{app:<6} {n:>3} {p:>2} {mode:<8} {r['eps']:>8.2f} {r['c']:>5.2f} "
                        f"{bound:>8.2f} {r['eps'] / bound:>6.2f} {cpu:>8.1f} "
                        f"{cpu / bound:>9.2f} {busy:>6.2f} {top:>13}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
