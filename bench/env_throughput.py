"""Decisions/s of GraphEnv against running the same graph inline with the same policies.

For each scenario × topology, the same episodes (seeds) are played four ways, in this process:

* inline: ``graph.invoke`` with the policy answering every ``decide()`` in place (LangGraph's
  own runner, thread pool for parallel supersteps) — the baseline;
* GraphEnv (``engine="langgraph"``): PettingZoo ``reset``/``step`` through the greenlet bridge;
* fast (``engine="fast"``): the same env stepping the graph on the fast path
  (:mod:`scenarios.stepped`); timed alternately with the LangGraph env, in rounds;
* interrupt: ``decide()`` as LangGraph ``interrupt()`` + ``InMemorySaver``, resumed with
  ``Command(resume=...)`` (the documented way to pause a graph; shown for reference).

Prints decisions/s and time ratios (goals: GraphEnv ≤ 1.5× inline; fast ≥ 3× GraphEnv and
faster than inline). Usage: ``python bench/env_throughput.py [--episodes N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import numpy as np
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

import scenarios
from scenarios.bridge import BRIDGE_KEY
from scenarios.decisions import run_inline
from scenarios.graph_env import GraphEnv

CASES = [
    ("delegate", "star:3"),
    ("delegate", "star:8"),
    ("relay", "chain:4"),
    ("relay", "star:4"),
    ("toolchain", "single"),
    ("spread", "mesh:3"),
]


def policy_for(env: GraphEnv, seed: int) -> Any:
    """A deterministic pseudo-random policy: the same action for the same (agent, obs)."""

    def act(agent: str, obs: Any) -> Any:
        h = hash((agent, np.asarray(obs).tobytes(), seed)) & 0xFFFFFFFF
        space = env.action_space(agent)
        space.seed(h)
        return space.sample()

    return act


class InterruptBridge:
    def decide(self, agent: str, observation: Any) -> Any:
        return interrupt({"agent": agent, "obs": observation})

    def emit_reward(self, value: float, agents: list[str] | None = None) -> None:
        pass


def run_interrupt(env: GraphEnv, graph: Any, policy: Any, seed: int) -> int:
    cfg = {
        "configurable": {BRIDGE_KEY: InterruptBridge(), "thread_id": str(uuid.uuid4())},
        "recursion_limit": env.scenario.max_supersteps + 1,
    }
    inputs: Any = env.scenario.initial_state(np.random.default_rng(seed))
    decisions = 0
    while True:
        graph.invoke(inputs, cfg)
        pending = graph.get_state(cfg).interrupts
        if not pending:
            return decisions
        decisions += len(pending)
        resume = {i.id: policy(i.value["agent"], i.value["obs"]) for i in pending}
        inputs = Command(resume={k: np.asarray(v).tolist() for k, v in resume.items()})


def play(env: GraphEnv, policies: list[Any], seeds: range) -> int:
    """Play the episodes of ``seeds``; the number of decisions."""
    n = 0
    for s in seeds:
        obs, infos = env.reset(seed=s)
        while env.agents:
            acting = {a: policies[s](a, obs[a]) for a in env.agents if infos[a]["acting"]}
            n += len(acting)
            obs, _, _, _, infos = env.step(acting)
    return n


def bench_case(name: str, topology: str, episodes: int, rounds: int) -> dict[str, float] | None:
    try:
        env = scenarios.make(name, topology=topology)
    except Exception as exc:  # a scenario that is not there or refuses the topology
        print(f"  skip {name} {topology}: {exc}")
        return None
    scenario = env.scenario
    inline_graph = scenario.build_graph().compile()
    checkpointed = scenario.build_graph().compile(checkpointer=InMemorySaver())
    policies = [policy_for(env, s) for s in range(episodes)]

    t0 = time.perf_counter()
    n_inline = sum(
        run_inline(scenario, policies[s], s, graph=inline_graph)[2] for s in range(episodes)
    )
    t_inline = time.perf_counter() - t0

    t_env = t_fast = 0.0
    n_env = n_fast = 0
    for r in range(rounds):  # alternately, so that load on the machine hits both alike
        seeds = range(r * episodes // rounds, (r + 1) * episodes // rounds)
        for engine in ("langgraph", "fast") if r % 2 == 0 else ("fast", "langgraph"):
            env.engine = engine
            t0 = time.perf_counter()
            n = play(env, policies, seeds)
            dt = time.perf_counter() - t0
            if engine == "fast":
                t_fast, n_fast = t_fast + dt, n_fast + n
            else:
                t_env, n_env = t_env + dt, n_env + n
    assert n_fast == n_env, "the fast path made other decisions: run GraphEnv(engine='check')"

    k = max(1, episodes // 5)
    t0 = time.perf_counter()
    try:
        n_int = sum(run_interrupt(env, checkpointed, policies[s], s) for s in range(k))
        t_int = (time.perf_counter() - t0) * episodes / k
    except TypeError:  # state the checkpointer cannot serialise (e.g. a simulator object)
        n_int, t_int = 0, float("nan")

    return {
        "decisions": n_env,
        "inline/s": n_inline / t_inline,
        "env/s": n_env / t_env,
        "fast/s": n_fast / t_fast,
        "env_ratio": t_env / t_inline * n_inline / max(n_env, 1),
        "fast_speedup": t_env / t_fast,
        "interrupt_ratio": t_int / t_inline * n_inline / max(n_int * episodes / k, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4, help="alternations langgraph/fast")
    args = parser.parse_args()
    print(
        f"{'scenario':<10} {'topology':<8} {'decisions':>9} {'inline/s':>9} {'env/s':>8} "
        f"{'fast/s':>8} {'env/inline':>10} {'fast/env':>9} {'fast/inline':>11} "
        f"{'interrupt/inline':>16}"
    )
    ratios, speedups, vs_inline = [], [], []
    for name, topology in CASES:
        r = bench_case(name, topology, args.episodes, args.rounds)
        if r is None:
            continue
        ratios.append(r["env_ratio"])
        speedups.append(r["fast_speedup"])
        vs_inline.append(r["fast/s"] / r["inline/s"])
        print(
            f"{name:<10} {topology:<8} {r['decisions']:>9} {r['inline/s']:>9.0f} "
            f"{r['env/s']:>8.0f} {r['fast/s']:>8.0f} {r['env_ratio']:>9.2f}x "
            f"{r['fast_speedup']:>8.2f}x {vs_inline[-1]:>10.2f}x {r['interrupt_ratio']:>15.2f}x"
        )
    if ratios:

        def gmean(xs: list[float]) -> float:
            return float(np.exp(np.mean(np.log(xs))))

        print(f"geometric mean GraphEnv/inline time per decision: {gmean(ratios):.2f}x (<= 1.5x)")
        print(f"geometric mean fast path speed-up over GraphEnv: {gmean(speedups):.2f}x (>= 3x)")
        print(f"geometric mean fast path decisions/s over inline: {gmean(vs_inline):.2f}x (>= 1x)")


if __name__ == "__main__":
    main()
