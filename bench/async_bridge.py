"""Decisions/s of the bridge on app patterns: an async app against its sync twin, and a
``create_supervisor`` app through GraphEnv against running it inline.

Each LLM call of the apps is one decision (a fake chat model asks ``scenarios.decide`` and
replies with a scripted menu item), so the numbers are the bridge's and LangGraph's overhead:

* **assistant** (an assistant with a ``ToolNode``, then two critics in parallel, then a sync
  tally; 5 decisions an episode), in two twins: ``async def`` nodes/router/tools calling
  ``ainvoke`` (a server-style app), and the same app sync. Played
  - *inline*: the graph run directly with the policy answering in place (the sync twin with
    ``invoke``; the async twin with LangGraph's own ``ainvoke``, one event loop per episode);
  - *GraphEnv*: ``reset``/``step`` through the greenlet bridge (agents by id; the async twin's
    coroutines run on event loops inside the tasks' greenlets).
* **supervisor**: ``create_supervisor`` over two ``create_react_agent`` workers with tools and
  handoffs (7 decisions an episode), GraphEnv against ``scenarios.decisions.run_inline``.

Prints decisions/s and time ratios per decision. Usage:
``python bench/async_bridge.py [--episodes N] [--io SECONDS]`` (``--io`` adds a real
``asyncio.sleep`` to every async call: it then dominates, and the ratios show what the bridge's
serialisation of parallel async I/O costs).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the apps live in tests/

from scenarios.bridge import BRIDGE_KEY
from scenarios.decisions import InlineBridge, run_inline
from scenarios.graph_env import GraphEnv
from tests.test_bridge_apps import AppScenario, answered, assistant_app, supervisor_app
from topologies.langgraph_compat import PREGEL_AINVOKE

# the apps are the ones tests/test_bridge_apps.py checks (same graphs, same scripted models)
ASSISTANT = {"assistant": [1, 2, 0], "critic_a": [1], "critic_b": [0]}
SUPERVISOR = {"supervisor": [1, 2, 3], "math": [1, 0], "research": [1, 0]}


# ----- timing ----------------------------------------------------------------------------------
def scripted(script: dict[str, list[int]]) -> Callable[[str, Any], int]:
    """The same policy for every way of running: each agent's k-th decision takes its k-th
    scripted action (then 0)."""
    counts: dict[str, int] = {}

    def act(agent: str, obs: Any) -> int:
        k = counts[agent] = counts.get(agent, 0) + 1
        seq = script.get(agent, [])
        return seq[k - 1] if k <= len(seq) else 0

    return act


def time_env(env: GraphEnv, script: dict[str, list[int]], episodes: int) -> tuple[float, int]:
    n = 0
    t0 = time.perf_counter()
    for s in range(episodes):
        act = scripted(script)
        obs, infos = env.reset(seed=s)
        while env.agents:
            acting = {a: act(a, obs[a]) for a in env.agents if infos[a]["acting"]}
            n += len(acting)
            obs, _, _, _, infos = env.step(acting)
    return time.perf_counter() - t0, n


def time_inline(
    scenario: AppScenario, script: dict[str, list[int]], episodes: int, use_ainvoke: bool = False
) -> tuple[float, int]:
    graph = scenario.build_graph().compile()
    n = 0
    t0 = time.perf_counter()
    for s in range(episodes):
        if use_ainvoke:  # LangGraph's own async runtime (not the bridge's sync emulation)
            bridge = InlineBridge(scripted(script))
            config = {"configurable": {BRIDGE_KEY: bridge}, "recursion_limit": 100}
            asyncio.run(PREGEL_AINVOKE(graph, scenario.initial_state(None), config))
            n += bridge.decisions
        else:
            n += run_inline(scenario, scripted(script), s, graph=graph)[2]
    return time.perf_counter() - t0, n


def row(name: str, t: float, n: int, base: tuple[float, int] | None) -> None:
    ratio = f"{t / n / (base[0] / base[1]):>8.2f}x" if base else f"{'':>9}"
    print(f"{name:<48} {n:>9} {n / t:>10.0f} {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--io", type=float, default=0.0)
    args = parser.parse_args()
    e, io = args.episodes, args.io
    agents = ["assistant", "critic_a", "critic_b"]

    def assistant(use_async: bool) -> AppScenario:
        return AppScenario(
            lambda: assistant_app(use_async, io),
            agents,
            3,
            lambda s: s["score"],
            lambda rng: {"messages": [HumanMessage("Weather?")]},
        )

    sync_s, async_s = assistant(False), assistant(True)
    for s in (sync_s, async_s):  # warm up (imports, loop pool)
        time_env(GraphEnv(s, agent_ids=agents), ASSISTANT, 3)
    print(f"{'case':<48} {'decisions':>9} {'decisions/s':>10} {'ratio':>9}")
    for label, script in (("tools", ASSISTANT), ("no tools", {"critic_a": [1]})):
        sync_inline = time_inline(sync_s, script, e)
        row(f"assistant ({label}), sync twin, inline invoke", *sync_inline, None)
        sync_env = time_env(GraphEnv(sync_s, agent_ids=agents), script, e)
        row("  sync twin, GraphEnv    (/sync inline)", *sync_env, sync_inline)
        async_inline = time_inline(async_s, script, e, use_ainvoke=True)
        row("  async app, inline ainvoke", *async_inline, None)
        async_env = time_env(GraphEnv(async_s, agent_ids=agents), script, e)
        row("  async app, GraphEnv    (/async inline)", *async_env, async_inline)
        row("  async app, GraphEnv    (/sync GraphEnv)", *async_env, sync_env)

    sup = AppScenario(
        supervisor_app,
        ["supervisor", "math", "research"],
        4,
        lambda s: answered(s, "12"),
        lambda rng: {"messages": [HumanMessage("3 times 4?")]},
    )
    time_env(GraphEnv(sup, agent_ids=sup.agents), SUPERVISOR, 3)
    sup_inline = time_inline(sup, SUPERVISOR, e)
    row("create_supervisor, inline (run_inline)", *sup_inline, None)
    sup_env = time_env(GraphEnv(sup, agent_ids=sup.agents), SUPERVISOR, e)
    row("  GraphEnv              (/inline)", *sup_env, sup_inline)


if __name__ == "__main__":
    main()
