"""The router → worker app of ``tests/apps/router.py``, written with the plain ``openai`` SDK and
trained through the gateway (``tests.apps.openai_router:scenario``).

``router`` reads the task and replies; a reply starting the way the task asks hands over to
``worker`` (one more call, seeing the task and the router's reply), else the app ends. The
reward is 1 for a right route. With the same tiny policies and seeds it makes the same
decisions, on the same prompts, as the in-process ``ChatAppScenario`` twin, so their credit
values agree. ``command_scenario`` runs the same app as a subprocess (``python -m
tests.apps.openai_router``) with its settings in the environment; ``located_scenario`` logs
where each episode's app ran (the Ray cluster test).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from typing import Any

from marl_agents.gateway.app_scenario import AppScenario
from tests.apps.router import TASKS, right_reply

SETTINGS: dict[str, Any] = dict(
    tasks=TASKS, default_reply="-", max_prompt_tokens=64, max_new_tokens=2
)


_HTTP: list[Any] = []  # one connection pool per process: a new one costs ~60 ms (TLS setup)


def client_of(llm: Any) -> Any:
    """An ``openai`` client for this episode, on the process's shared HTTP client."""
    from openai import DefaultHttpxClient, OpenAI

    if not _HTTP:
        _HTTP.append(DefaultHttpxClient())
    return OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, http_client=_HTTP[0])


def run(task: str, llm: Any) -> dict[str, Any]:
    """The app: two agents, plain ``openai`` client calls."""
    client = client_of(llm)
    first = client.chat.completions.create(
        model=llm.models["router"], messages=[{"role": "user", "content": task}]
    )
    reply = first.choices[0].message.content or ""
    out: dict[str, Any] = {"reply": reply, "routed": right_reply(task, reply)}
    if out["routed"]:
        second = client.chat.completions.create(
            model=llm.models["worker"],
            messages=[
                {"role": "user", "content": task},
                {"role": "assistant", "content": reply},
            ],
        )
        out["answer"] = second.choices[0].message.content
    return out


def routed(state: dict[str, Any]) -> bool:
    return bool((state.get("result") or {}).get("routed"))


def scenario(**kwargs: Any) -> AppScenario:
    """The app as a scenario (``kwargs`` override its settings)."""
    settings = {**SETTINGS, "verifier": routed, "agents": ["router", "worker"], **kwargs}
    return AppScenario(run, **settings)


def command_scenario(**kwargs: Any) -> AppScenario:
    """The same app run as a subprocess per episode."""
    settings = {**SETTINGS, "verifier": routed, "agents": ["router", "worker"], **kwargs}
    return AppScenario.command([sys.executable, "-m", "tests.apps.openai_router"], **settings)


def discovered(**kwargs: Any) -> AppScenario:
    """The app as a scenario whose agents are found on a dry run (no ``agents``): with the
    default reply ``"-"`` the router routes right on ``TASKS[1]``, so the dry run of both tasks
    finds ``router`` and then ``worker``."""
    return AppScenario(run, **{**SETTINGS, "verifier": routed, **kwargs})


def discovered_command(**kwargs: Any) -> AppScenario:
    """The program form, its agents found on a dry run."""
    argv = [sys.executable, "-m", "tests.apps.openai_router"]
    return AppScenario.command(argv, **{**SETTINGS, "verifier": routed, **kwargs})


def main() -> None:
    """The subprocess form: settings from the environment, the result as the last line.

    ``MARL_TEST_MODE=fail`` exits 3 after printing to stderr; ``hang`` sleeps after its
    first call; ``early`` exits 4 before any call (after printing to stderr), and
    ``early-once`` does so only where the file ``MARL_TEST_MARK`` does not exist yet (it
    creates it: the first episode fails, the next ones run).
    """

    from types import SimpleNamespace

    # its own names where none is set (a dry run discovering its agents sets none)
    models = {a: os.environ.get(f"MARL_MODEL_{a.upper()}", a) for a in ("router", "worker")}
    llm = SimpleNamespace(
        base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], models=models
    )

    mode = os.environ.get("MARL_TEST_MODE", "")
    task = json.loads(os.environ["MARL_TASK"])
    if mode == "early" or (mode == "early-once" and _first(os.environ["MARL_TEST_MARK"])):
        print("the app failed before its first request on purpose", file=sys.stderr)
        sys.exit(4)
    if mode == "hang":
        client = client_of(llm)
        client.chat.completions.create(
            model=llm.models["router"], messages=[{"role": "user", "content": task}]
        )
        time.sleep(3600)
    out = run(task, llm)
    if mode == "fail":
        print("the app broke on purpose", file=sys.stderr)
        sys.exit(3)
    print(json.dumps(out))


def _first(mark: str) -> bool:
    """True the first time (``mark`` created), False once it exists."""
    try:
        with open(mark, "x"):
            return True
    except FileExistsError:
        return False


_STARTS = itertools.count()


def failing_at_start(task: str, llm: Any) -> dict[str, Any]:
    """:func:`run`, except that every third start of the app in this process raises before
    its first request."""
    if next(_STARTS) % 3 == 0:
        raise RuntimeError("the app failed before its first request on purpose")
    return run(task, llm)


def flaky_scenario(**kwargs: Any) -> AppScenario:
    """The app of :func:`failing_at_start` as a scenario."""
    settings = {**SETTINGS, "verifier": routed, "agents": ["router", "worker"], **kwargs}
    return AppScenario(failing_at_start, **settings)


def located_scenario(log: str, **kwargs: Any) -> AppScenario:
    """:func:`scenario`, except that each episode's app appends where it ran to the file
    ``log`` (a JSON line: process id, Ray node and actor ids, the base URL it was handed), so a
    test sees which process answered the app: the gateway lives in the env runner's process."""

    def located(task: str, llm: Any) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context() if ray.is_initialized() else None
        where = {
            "pid": os.getpid(),
            "node": ctx.get_node_id() if ctx else None,
            "actor": ctx.get_actor_id() if ctx else None,
            "base_url": llm.base_url,
        }
        with open(log, "a") as f:
            f.write(json.dumps(where) + "\n")
        return run(task, llm)

    settings = {**SETTINGS, "verifier": routed, "agents": ["router", "worker"], **kwargs}
    return AppScenario(located, **settings)


if __name__ == "__main__":
    main()


def supervisor_tutorial(**kwargs: Any) -> AppScenario:
    """LangGraph's supervisor tutorial with ``ChatOpenAI`` models
    (``tests/apps/supervisor_tutorial_openai.py``), run as a program per episode; the reward
    is the in-process tutorial's (``tests/apps/supervisor_tutorial.py``): the first route is
    the worker the task names."""
    from pathlib import Path

    from tests.apps.supervisor_tutorial import TASKS as TUTORIAL_TASKS

    root = str(Path(__file__).resolve().parents[2])

    def first_route_right(state: dict[str, Any]) -> bool:
        routes = (state.get("result") or {}).get("routes") or []
        want = "researcher" if state["task"] == TUTORIAL_TASKS[0] else "coder"
        return bool(routes) and routes[0] == want

    settings: dict[str, Any] = dict(
        tasks=TUTORIAL_TASKS,
        verifier=first_route_right,
        agents=["supervisor", "researcher", "coder"],
        default_reply={"supervisor": '{"next": "FINISH"}'},
        max_prompt_tokens=256,
        max_new_tokens=64,
        truncate_prompts=True,  # the in-process tutorial's prompts keep their last tokens too
        # a supervisor that never says FINISH is cut off here (failure "limit", as in process)
        # before the program's own recursion_limit of 60 makes the app raise (an error)
        max_supersteps=48,
        env={"PYTHONPATH": root},
        cwd=root,
    )
    argv = [sys.executable, "-m", "tests.apps.supervisor_tutorial_openai"]
    return AppScenario.command(argv, **{**settings, **kwargs})
