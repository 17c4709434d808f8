"""An app's agents found on a dry run: ``AppScenario(run, ...)`` without ``agents``.

:func:`discover` runs the app (a function or a command, as its episodes run) on the first
``discovery_tasks`` tasks, one after the other, against the process's gateway. Each dry run is
a :class:`DryRun` in the gateway's registry (its own key, removed at its end): it answers every
request, whatever its ``model``, at once on the server thread with that name's **default
reply** (the scenario's ``default_reply``, the reply an absent agent gives in loo / Shapley
replays; tool calls parsed from it where the request has tools), and records the model names
in the order they are first requested. No policy runs, no episode is counted.

The agents are the names found, in first-use order (their union over the dry runs, in
first-use order, when they differ from task to task — logged). An agent's id is its model
name, or, where the name has characters other than letters, digits, ``_``, ``.`` and ``-``
(``openai/gpt-4o``), the name with each such character as ``_`` (``openai_gpt-4o``; a clash
gets ``_2``, ``_3``...): the scenario's ``model_names`` maps each id to its name.

What the app is given during a dry run: a function app's ``llm.models`` answers any key with
the key itself (``llm.models["router"]`` → ``"router"``), so an app that reads its names there
(or hard-codes them) sends its own names; a command app gets ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` but no ``MARL_MODEL_<AGENT>`` (no agent is known yet): it must fall back to
its own names (``os.environ.get("MARL_MODEL_ROUTER", "router")``). After discovery, episodes
get the found names under the found ids (and a function app's ``llm.models`` still answers an
unknown key with itself, so the app sends the same names as in its dry run).

Agents the app reaches only after replies other than the default ones are not found: declare
``agents=[...]``, or give a ``default_reply`` that reaches them, or more ``discovery_tasks``.

Cost: one dry run a task, no model; done once per process for the same app, tasks and
replies (:func:`discover` keeps what it found), so the envs of one process share it; every
Ray worker process that builds the scenario runs it once.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

from marl_agents.gateway.episodes import AppTimedOut
from marl_agents.gateway.protocol import ChatRequest, GatewayError, Reply
from scenarios.base import ScenarioError

log = logging.getLogger("marl.gateway")

#: the default of ``AppScenario(discovery_tasks=...)``: tasks the dry run runs the app on
DEFAULT_DISCOVERY_TASKS = 4

_FOUND: dict[Hashable, dict[str, str]] = {}  # what discover() found in this process, by key
_FOUND_LOCK = threading.Lock()


class ModelNames(Mapping[str, str]):
    """An app's ``llm.models``: agent id → model name; any other key → the key itself where
    ``echo`` (a dry run, a discovered app: the app's own names pass through)."""

    def __init__(self, names: Mapping[str, str], echo: bool = False) -> None:
        self._names, self.echo = dict(names), bool(echo)

    def __getitem__(self, key: str) -> str:
        if key in self._names:
            return self._names[key]
        if self.echo and isinstance(key, str):
            return key
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"ModelNames({self._names!r}, echo={self.echo})"


class DryRun:
    """One dry run's side of the gateway: every request answered with its name's default
    reply on the server thread, the names recorded in first-use order.

    Args:
        reply_of: model name → the default reply's text.
    """

    def __init__(self, reply_of: Callable[[str], str]) -> None:
        self.key = secrets.token_urlsafe(24)
        self.reply_of = reply_of
        self.models: dict[str, str] = {}  # model name → itself, in first-use order
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._closed = False
        self.result: Any = None
        self.error: BaseException | None = None

    def ask(self, request: ChatRequest) -> Reply:
        from langchain_core.messages import AIMessage

        from marl_agents.llm.chat_model import tool_names
        from scenarios.toolcalls import parse_tool_calls

        with self._lock:
            if self._closed:
                raise GatewayError(
                    "this dry run has ended: its key is no longer valid",
                    401,
                    "authentication_error",
                    None,
                    "invalid_api_key",
                )
            self.models.setdefault(request.model, request.model)
        text = self.reply_of(request.model)
        calls: list[dict[str, Any]] = []
        if request.tools and request.tool_choice != "none":
            parsed = parse_tool_calls(text, tool_names(request.tools))
            text = parsed.content
            calls = [
                {"name": c.name, "args": c.arguments, "id": f"call_dry_{i}", "type": "tool_call"}
                for i, c in enumerate(parsed.tool_calls)
            ]
        message = AIMessage(content=text, tool_calls=calls)
        return Reply(message, [], [])

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """The app ended (with ``result``, or failing with ``error``)."""
        self.result, self.error = result, error
        self._done.set()

    def wait(self, timeout_s: float | None) -> list[str]:
        """The model names requested, once the app has ended.

        Raises:
            AppTimedOut: it ran ``timeout_s`` seconds without ending.
            BaseException: the app's error (:class:`AppFailed`).
        """
        if not self._done.wait(timeout_s):
            raise AppTimedOut(
                f"the app ran longer than timeout_s={timeout_s:g} s without ending "
                f"(after requesting {list(self.models)})"
            )
        if self.error is not None:
            raise self.error
        return list(self.models)

    def close(self) -> None:
        with self._lock:
            self._closed = True


def agent_ids(names: Sequence[str]) -> dict[str, str]:
    """Agent id → model name for ``names`` (see the module docstring for the ids)."""
    out: dict[str, str] = {}
    for name in names:
        base = re.sub(r"[^A-Za-z0-9_.\-]", "_", name) or "_"
        agent, k = base, 2
        while agent in out:
            agent, k = f"{base}_{k}", k + 1
        out[agent] = name
    return out


def discover(
    runner: Any,
    tasks: Sequence[Any],
    *,
    reply_of: Callable[[str], str],
    llm_of: Callable[[str, str, Mapping[str, str]], Any],
    timeout_s: float | None,
    host: str | None,
    key: Hashable | None = None,
) -> dict[str, str]:
    """Agent id → model name of the app ``runner`` runs, found on dry runs over ``tasks``.

    Args:
        runner: the scenario's runner (``start(task, llm, run)`` → a running app).
        tasks: the tasks of the dry runs, in order.
        reply_of: model name → its default reply's text.
        llm_of: ``(base_url, api_key, models)`` → what the app is given.
        timeout_s: seconds each dry run may take (``None``: no limit).
        host: the gateway's address.
        key: what identifies this app, its tasks and replies in this process (``None``: not
            kept): a second call with the same key returns what the first found.

    Raises:
        ScenarioError: a dry run failed or timed out (with the app's error text), or the app
            requested no model.
    """
    from marl_agents.gateway.server import gateway

    if key is not None:
        with _FOUND_LOCK:
            if key in _FOUND:
                return dict(_FOUND[key])
    server = gateway(host)
    found: dict[str, None] = {}
    seen: list[list[str]] = []
    what = "the app"
    for task in tasks:
        runner.check()
        run = DryRun(reply_of)
        server.registry.add(run)
        llm = llm_of(server.base_url, run.key, ModelNames({}, True))
        try:
            running = runner.start(task, llm, run)
        except BaseException:
            server.registry.remove(run.key)
            raise
        what = running.describe()
        try:
            names = run.wait(timeout_s)
        except AppTimedOut as exc:
            running.stop()
            raise ScenarioError(
                f"the dry run that discovers the agents of {what} timed out on the task "
                f"{task!r}: {exc}{running.tail()}; make the app end on default replies, or "
                "declare agents=[...]"
            ) from None
        except GatewayError as exc:
            raise ScenarioError(
                f"the dry run that discovers the agents of {what} failed on the task {task!r}: "
                f"{exc}; fix the app, or declare agents=[...]"
            ) from exc
        finally:
            server.registry.remove(run.key)
            run.close()
            running.stop()
        seen.append(names)
        found.update(dict.fromkeys(names))
    if not found:
        raise ScenarioError(
            f"{what} requested no model in its dry run on {len(seen)} task(s), so no agent was "
            "discovered: declare them, AppScenario(..., agents=['<agent>', ...]) (and "
            "model_names={...} where an agent's model name differs from its id)"
        )
    ids = agent_ids(list(found))
    if any(names != seen[0] for names in seen):
        log.info(
            "the dry runs of %s requested different models from task to task (%s): its agents "
            "are their union, in first-use order",
            what,
            "; ".join(f"{t!r}: {n}" for t, n in zip(tasks, seen, strict=True)),
        )
    log.info(
        "discovered the agents of %s on a dry run of %d task(s): %s (agent id → model name: %s)",
        what,
        len(seen),
        list(ids),
        ids,
    )
    if key is not None:
        with _FOUND_LOCK:
            _FOUND[key] = dict(ids)
    return ids


__all__ = ["DEFAULT_DISCOVERY_TASKS", "DryRun", "ModelNames", "agent_ids", "discover"]
