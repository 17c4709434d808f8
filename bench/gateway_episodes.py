"""Episodes/s and time per decision of an app through the gateway against its in-process twin.

The router → worker app of ``tests/apps/router.py`` is played two ways with the same scripted
policy (a fixed reply, so only the machinery is timed, not a model):

* in process: the ``ChatAppScenario`` (LangGraph nodes calling ``EnvChatModel``);
* gateway: the same app written with the plain ``openai`` SDK (``tests/apps/openai_router.py``),
  an ``AppScenario``: per episode a thread runs the app, each call is an HTTP request to the
  process's gateway, answered by the episode's node.

Episodes run ``--in-flight`` at a time (GraphEnvs stepped round-robin in this thread, as an
env runner's sub-envs are), in alternating rounds. Prints episodes/s, decisions/s and the
gateway/in-process time ratio. Usage (from the repository root):
``PYTHONPATH=. python bench/gateway_episodes.py [--episodes N] [--in-flight K] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from marl_agents.llm.env_chat_model import tokens_action
from scenarios.graph_env import GraphEnv


def play(scenario: Any, episodes: int, in_flight: int) -> tuple[float, int]:
    """Seconds and decisions for ``episodes`` episodes, ``in_flight`` at a time."""
    reply = tokens_action(scenario.spaces, scenario.tokenizer, "a")  # routes TASKS[0] right
    envs = [GraphEnv(scenario) for _ in range(in_flight)]
    started, decisions, next_seed = time.perf_counter(), 0, 0
    live: dict[int, Any] = {}

    def start(i: int) -> None:
        nonlocal next_seed
        live[i] = envs[i].reset(seed=next_seed)
        next_seed += 1

    for i in range(min(in_flight, episodes)):
        start(i)
    done = 0
    while live:
        for i in list(live):
            env, (obs, infos) = envs[i], live[i]
            acting = [a for a in env.agents if infos[a]["acting"]]
            decisions += len(acting)
            obs, _, _, _, infos = env.step(dict.fromkeys(env.agents, reply))
            if env.agents:
                live[i] = (obs, infos)
                continue
            assert env.failure is None, env.error
            done += 1
            del live[i]
            if next_seed < episodes:
                start(i)
    return time.perf_counter() - started, decisions


def main() -> None:
    from tests.apps import openai_router
    from tests.apps.router import app

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cases = {
        "in process": app(max_prompt_tokens=64),
        "gateway": openai_router.scenario(),
    }
    play(cases["gateway"], 4, 2)  # warm up: the server, the openai client's imports
    totals = {name: [0.0, 0] for name in cases}
    for _ in range(args.rounds):
        for name, sc in cases.items():
            seconds, decisions = play(sc, args.episodes, args.in_flight)
            totals[name][0] += seconds
            totals[name][1] += decisions
    n = args.episodes * args.rounds
    for name, (seconds, decisions) in totals.items():
        print(
            f"{name:>10}: {n / seconds:7.1f} episodes/s  {decisions / seconds:7.1f} decisions/s  "
            f"{1e3 * seconds / decisions:6.2f} ms/decision"
        )
    ratio = totals["gateway"][0] / totals["in process"][0]
    print(f"gateway / in process time: {ratio:.2f}x ({args.in_flight} episodes in flight)")


if __name__ == "__main__":
    main()
