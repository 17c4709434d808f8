"""The endpoint's overhead per decision: a request over HTTP against the same policy in process.

The ``router`` agent of ``tests/apps/openai_router.py`` is served as ``marl serve`` serves a
run (:class:`~marl_agents.gateway.standalone.ServedTeam` behind a
:class:`~marl_agents.gateway.server.Gateway` on loopback) and asked the same chat request two
ways, ``--in-flight`` requests at a time (one thread each):

* in process: ``ServedTeam.ask`` on the parsed request (the agent's ``EnvChatModel`` under an
  inline bridge, the policy answering in place: what an in-process app's call costs);
* endpoint: the official ``openai`` client over HTTP (one shared connection pool), which
  adds the JSON body, the HTTP round trip, parsing and the response.

``--policy scripted`` replies a fixed token (only the machinery is timed); ``--policy tiny``
generates with the tiny model built in code (``max_new_tokens`` 2). Requests are answered one
at a time (the served team's lock), so at 32 in flight the HTTP work of waiting requests
overlaps the decisions. Prints ms per decision and the endpoint / in-process ratio per level.
Usage (from the repository root):
``PYTHONPATH=. python bench/gateway_overhead.py [--policy scripted|tiny] [--requests N]``.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from typing import Any

MESSAGES = [{"role": "user", "content": "Reply in CAPITALS: status?"}]


def timed(calls: int, in_flight: int, call: Callable[[], Any]) -> float:
    """Seconds for ``calls`` calls of ``call``, ``in_flight`` threads at a time."""
    per, extra = divmod(calls, in_flight)
    counts = [per + (1 if i < extra else 0) for i in range(in_flight)]
    barrier = threading.Barrier(in_flight + 1)

    def worker(n: int) -> None:
        barrier.wait()
        for _ in range(n):
            call()

    threads = [threading.Thread(target=worker, args=(n,)) for n in counts]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def main() -> None:
    import httpx
    import openai

    from marl_agents.gateway.episodes import Registry
    from marl_agents.gateway.protocol import parse_chat
    from marl_agents.gateway.server import Gateway
    from marl_agents.gateway.standalone import ServedTeam
    from marl_agents.llm.env_chat_model import tokens_action
    from tests.apps import openai_router

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=["scripted", "tiny"], default="scripted")
    parser.add_argument("--requests", type=int, default=320)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    sc = openai_router.scenario()
    if args.policy == "scripted":
        reply = tokens_action(sc.spaces, sc.tokenizer, "a")

        def policy(agent: str, observation: Any) -> Any:
            return reply
    else:
        import torch

        from marl_agents.llm.backend import SamplingParams
        from marl_agents.llm.env_chat_model import backend_policy
        from marl_agents.llm.hf_backend import HFBackend
        from marl_agents.llm.tiny import make_tiny_model

        torch.set_num_threads(1)
        tok, model = make_tiny_model(seed=0)
        policy = backend_policy(HFBackend(model, tok), sc.spaces, SamplingParams(max_new_tokens=2))
    team = ServedTeam({a: sc.models[a] for a in sc.models}, policy)
    registry = Registry()
    registry.add(team)
    server = Gateway(registry=registry)
    limits = httpx.Limits(max_connections=max(args.in_flight) + 4)
    http = openai.DefaultHttpxClient(limits=limits)
    client = openai.OpenAI(
        base_url=server.base_url, api_key=team.key, max_retries=0, http_client=http
    )
    request = parse_chat({"model": "router", "messages": MESSAGES})
    cases: dict[str, Callable[[], Any]] = {
        "in process": lambda: team.ask(request),
        "endpoint": lambda: client.chat.completions.create(model="router", messages=MESSAGES),
    }
    for call in cases.values():  # warm up: imports, the connection pool, the model
        timed(8, 4, call)
    try:
        for k in args.in_flight:
            totals = dict.fromkeys(cases, 0.0)
            for _ in range(args.rounds):  # alternating rounds: a loaded machine hits both
                for name, call in cases.items():
                    totals[name] += timed(args.requests, k, call)
            n = args.requests * args.rounds
            ms = {name: 1e3 * s / n for name, s in totals.items()}
            print(
                f"{k:>3} in flight ({args.policy}): in process {ms['in process']:6.2f} ms/decision"
                f"  endpoint {ms['endpoint']:6.2f} ms/decision"
                f"  ratio {ms['endpoint'] / ms['in process']:.2f}x"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
