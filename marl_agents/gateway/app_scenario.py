"""Any app that calls an OpenAI-compatible endpoint, as a text scenario: ``AppScenario``.

The app is left as written, in any framework (the ``openai`` SDK, LangChain's ``ChatOpenAI``,
the OpenAI Agents SDK...), or as a separate program. Per episode it gets a base URL, an API
key (the episode's own, unguessable, valid while the episode runs) and the model name of each
agent; every request it sends with an agent's model name is one decision of that agent
(:mod:`marl_agents.gateway.episodes`). Two forms:

* ``AppScenario(run, tasks=..., verifier=..., agents=[...])``: ``run(task, llm)`` — a function
  or an ``async def`` — is called per episode on a thread of its own (a pooled daemon thread,
  reused once its app returned: a fresh ``contextvars`` context each episode, but
  ``threading.local`` values stay with the thread); ``llm`` is an :class:`AppLLM`
  (``base_url``, ``api_key``, ``models``: agent id → model name). What it returns is the
  episode's result.
* ``AppScenario.command([...argv...], tasks=..., verifier=..., agents=[...])``: the command
  runs per episode with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``MARL_MODEL_<AGENT>``
  (the agent id upper-cased, other characters than letters and digits as ``_``) and
  ``MARL_TASK`` (the task as JSON) in its environment; the last line it prints is the result
  (parsed as JSON if it is JSON, else the text).

**Agents found on a dry run.** Without ``agents`` (or with ``agents=None``) the agents are
discovered when the scenario is built (once per process for the same app, tasks and replies):
the app runs on the first ``discovery_tasks`` tasks (default 4) against the gateway in a
dry-run mode that answers every request, for any model name, with that name's default reply
(``default_reply``, as an absent agent answers in loo / Shapley replays) and records the model
names requested, in first-use order (their union over the tasks, logged where they differ).
The agent ids are those names (sanitised where a name has characters other than letters,
digits, ``_``, ``.`` and ``-``; :attr:`AppScenario.model_names` maps each id to its name,
:attr:`AppScenario.discovered` holds it). A function app's ``llm.models`` answers any key with
the key itself, so an app reading ``llm.models["router"]`` (or sending its own names) works
unchanged; a command app gets no ``MARL_MODEL_<AGENT>`` in its dry run (no agent is known):
it must fall back to its own names (``os.environ.get("MARL_MODEL_ROUTER", "router")``).
An app that requests no model, fails or times out in its dry run raises
:class:`~scenarios.base.ScenarioError` (with the app's error text) naming ``agents=[...]`` as
the fix. Agents reached only after other replies than the default ones are not found:
declare them, or choose a ``default_reply`` that reaches them
(:mod:`marl_agents.gateway.discovery`).

The verifier gets the final state ``{"task": task, "result": result}``. The scenario is a
:class:`~marl_agents.llm.chat_app.ChatAppScenario` whose app is one LangGraph node running
the app and answering its requests, so pools, frozen agents, GRPO groups, loo / Shapley
credit (the app re-run with absent agents answered by ``default_reply``), transcripts and
the rest work as for an in-process app; name it in a config by reference
(``scenario: mypkg.app:scenario``, a module-level scenario or a function returning one).

**Failures.** An app that raises, exits non-zero or prints nothing ends its episode failed
(``failure: "error"``, the error text names the app and ends with its stderr's last lines);
one that runs longer than ``timeout_s`` (its own time: the time its requests wait for their
decisions does not count) is stopped — a command is killed, a Python function's thread is
left behind (it cannot be killed; its key no longer works, so an app that calls the endpoint
again fails there and ends) — and the episode ends ``failure: "timeout"``. Both count in the
run's error and timeout rates; a run whose episodes all fail stops with ``RunFailed``. An
app that fails (or times out) before its first request is counted the same way
(``Scenario.counts_early_failures``): it has no decision to learn from, so ``reset()``
records it in ``GraphEnv.lost_episodes`` (the trainer counts those as failed episodes, with
their error text) and runs the app again on the same task; only
``scenarios.graph_env.MAX_LOST_IN_A_ROW`` such failures in a row make ``reset()`` raise.

**Stuck threads.** A function app whose ``run`` never returns (it waits on something that
never comes, without calling the endpoint) keeps its thread: the process counts such threads
(:func:`stuck_app_threads`), warns once per app naming the fix (make ``run`` honour a
timeout, or run the app as a command, which is killed), and once
:data:`MAX_STUCK_APP_THREADS` are stuck refuses to start another episode of a function app
(:class:`StuckApps` from ``reset()``) instead of leaking threads without limit.

Example:
    >>> from openai import OpenAI                                        # doctest: +SKIP
    >>> def run(task, llm):
    ...     client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    ...     reply = client.chat.completions.create(
    ...         model=llm.models["writer"], messages=[{"role": "user", "content": task}]
    ...     )
    ...     return reply.choices[0].message.content                       # doctest: +SKIP
    >>> scenario = AppScenario(
    ...     run, tasks=["Say hi"], verifier=lambda s: "hi" in s["result"], agents=["writer"]
    ... )                                                                 # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import itertools
import json
import logging
import os
import queue
import re
import subprocess
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

import numpy as np

from marl_agents.gateway.discovery import (
    DEFAULT_DISCOVERY_TASKS,
    DryRun,
    ModelNames,
    agent_ids,
    discover,
)
from marl_agents.gateway.episodes import AppTimedOut, Episode
from marl_agents.gateway.protocol import GatewayError
from marl_agents.llm.chat_app import ChatAppScenario, TaskSource
from scenarios.base import Outcome, ScenarioError

#: how an app episode's timeout names the limit that fired (a run that stops because every
#: episode timed out advises raising it: ``trainers.run.episode_log.timeout_advice``)
APP_TIMEOUT_LIMIT = "the AppScenario's timeout_s"
#: the default of ``timeout_s``: seconds an app episode may run (its own time)
DEFAULT_APP_TIMEOUT_S = 120.0
#: characters of an app's stderr kept in its error text
STDERR_TAIL = 2000
#: function-app threads left running past their episodes after which no episode of a function
#: app starts in this process (:class:`StuckApps`)
MAX_STUCK_APP_THREADS = 8
#: seconds an ended episode's function app is given to return before its thread counts as stuck
STUCK_GRACE_S = 1.0
#: idle function-app worker threads kept for later episodes (:class:`_Workers`)
MAX_IDLE_APP_WORKERS = 256

log = logging.getLogger("marl.gateway")

_EPISODES = itertools.count()


@dataclasses.dataclass(frozen=True)
class AppLLM:
    """What an app episode is given to reach its agents.

    Attributes:
        base_url: the OpenAI base URL (``http://127.0.0.1:<port>/v1``).
        api_key: the episode's key (valid while the episode runs).
        models: agent id → the model name to send for it.
    """

    base_url: str
    api_key: str
    models: Mapping[str, str]

    def environ(self) -> dict[str, str]:
        """``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``MARL_MODEL_<AGENT>`` for a process."""
        env = {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key}
        for agent, name in self.models.items():
            env[model_variable(agent)] = name
        return env


def model_variable(agent: str) -> str:
    """The environment variable holding ``agent``'s model name: ``MARL_MODEL_<AGENT>``."""
    return "MARL_MODEL_" + re.sub(r"[^A-Za-z0-9]", "_", agent).upper()


class AppState(TypedDict, total=False):
    task: Any
    result: Any
    retokenized_turns: int


class AppScenario(ChatAppScenario):
    """An app talking to an OpenAI-compatible endpoint, as a Dec-POMDP of its agents.

    Args:
        run: ``run(task, llm) → result`` (sync or ``async def``), called once per episode on a
            thread of its own; ``llm`` is an :class:`AppLLM`. (Or a command: :meth:`command`.)
        tasks: ``rng → task`` or a sequence of tasks (any JSON-serialisable value for a
            command).
        verifier: final state ``{"task", "result"}`` → ``Outcome`` | float | bool.
        agents: the agent ids; ``None`` (the default): discovered when the scenario is built,
            on a dry run of the app (see "Agents found on a dry run" in the module docstring).
        model_names: agent id → the model name the app sends for it (default: the id; with
            discovered agents: what the dry run found).
        timeout_s: seconds an episode's app may run (its own time); ``None``: no limit.
        truncate_prompts: keep the last ``max_prompt_tokens`` tokens of a longer prompt (as
            ``ChatAppScenario`` does; handy for tiny models); default: such a request is
            refused (400 ``context_length_exceeded``), as OpenAI refuses it.
        token_fidelity: give the policy an earlier reply the app sends back as the ids it was
            sampled as, not re-tokenised (:mod:`marl_agents.gateway.fidelity`); the turns
            where that differs are counted (episode metric ``gateway/retokenized_turns``).
            ``False``: re-tokenise, as an in-process ``ChatAppScenario`` does.
        host: the address of the process's gateway (default: loopback only; another address
            is exposed beyond this machine: see :mod:`marl_agents.gateway.server`).
        discovery_tasks: with ``agents=None``, the dry run runs the app on this many tasks:
            the first ones of a list (all of it if shorter), or drawn from a task function
            with a generator seeded 0.
        **settings: :class:`~marl_agents.llm.chat_app.ChatAppScenario`'s other settings
            (``roles``, ``default_reply``, ``prefill``, ``tokenizer``, ``max_prompt_tokens``,
            ``max_new_tokens``, ``format_penalty``, ``complete_calls``, ``name``;
            ``max_supersteps`` caps an episode's decisions).
    """

    name = "app"
    #: the app may fail before its first request: a counted failed episode, not a graph that
    #: cannot run
    counts_early_failures = True
    #: the app's node runs the app: a failed app ends its episode (never a replay that would
    #: run the app again)
    node_errors_end_episode = True

    def __init__(
        self,
        run: Callable[..., Any],
        *,
        tasks: TaskSource,
        verifier: Callable[[dict[str, Any]], Outcome | float | bool],
        agents: Sequence[str] | None = None,
        model_names: Mapping[str, str] | None = None,
        timeout_s: float | None = DEFAULT_APP_TIMEOUT_S,
        truncate_prompts: bool = False,
        token_fidelity: bool = True,
        host: str | None = None,
        discovery_tasks: int = DEFAULT_DISCOVERY_TASKS,
        **settings: Any,
    ) -> None:
        runner = run if isinstance(run, _Command) else _Function(run)
        if timeout_s is not None and not timeout_s > 0:
            raise ScenarioError(f"timeout_s must be > 0 seconds or None, got {timeout_s}")
        #: agent id → model name found on the dry run (``None``: the agents were declared)
        self.discovered: dict[str, str] | None = None
        if agents is None:
            if model_names:
                raise ScenarioError(
                    "model_names needs agents=[...]: discovered agents take their model names "
                    "from the dry run (leave model_names out, or declare the agents)"
                )
            model_names = self.discovered = self._discover(
                runner, tasks, discovery_tasks, timeout_s, host, settings
            )
            agents = list(model_names)
        if isinstance(agents, str) or not agents:
            raise ScenarioError(
                "AppScenario's agents=[...] must be a non-empty list of the agent ids whose "
                "model names the app uses (or leave agents out to discover them on a dry run)"
            )
        agents = [str(a) for a in agents]
        names = {a: a for a in agents}
        unknown = sorted(set(model_names or {}) - set(agents))
        if unknown:
            raise ScenarioError(f"model_names names {unknown}, which are not agents: {agents}")
        names.update({a: str(n) for a, n in (model_names or {}).items()})
        if len(set(names.values())) != len(names):
            raise ScenarioError(f"two agents share a model name in {names}: give each its own")
        self.runner = runner
        self.model_names = names
        self.timeout_s = timeout_s
        self.truncate_prompts = bool(truncate_prompts)
        self.token_fidelity = bool(token_fidelity)
        self.host = host

        def build(models: Mapping[str, Any]) -> Any:
            from langgraph.graph import END, START, StateGraph

            chat = {a: models[a] for a in agents}

            def app(state: AppState) -> dict[str, Any]:
                result, retokenized = self.run_episode(state["task"], chat)
                return {"result": result, "retokenized_turns": retokenized}

            graph = StateGraph(AppState)
            graph.add_node("app", app)
            graph.add_edge(START, "app")
            graph.add_edge("app", END)
            return graph

        super().__init__(build, tasks=tasks, verifier=verifier, agents=agents, **settings)

    @classmethod
    def command(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        **kwargs: Any,
    ) -> AppScenario:
        """An app run as a command per episode (see the module docstring for its environment).

        Args:
            argv: the command and its arguments (no shell).
            env: extra environment variables for it (over this process's).
            cwd: its working directory.
            **kwargs: as for :class:`AppScenario` (``tasks``, ``verifier``, ``agents``...).
        """
        if isinstance(argv, str) or not argv:
            raise ScenarioError("argv must be a non-empty list: the command and its arguments")
        return cls(_Command([str(a) for a in argv], dict(env or {}), cwd), **kwargs)

    @staticmethod
    def _discover(
        runner: _Function | _Command,
        tasks: TaskSource,
        count: int,
        timeout_s: float | None,
        host: str | None,
        settings: Mapping[str, Any],
    ) -> dict[str, str]:
        """Agent id → model name, found on a dry run (:mod:`marl_agents.gateway.discovery`)."""
        from scenarios.text_space import load_tokenizer

        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ScenarioError(f"discovery_tasks must be an integer >= 1, got {count!r}")
        if callable(tasks):
            rng = np.random.default_rng(0)
            dry = [tasks(rng) for _ in range(count)]
        elif isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence) or not tasks:
            raise ScenarioError("tasks must be a function rng → task or a non-empty list of tasks")
        else:
            dry = list(tasks)[:count]
        replies = settings.get("default_reply", "")
        tok_arg = settings.get("tokenizer", "tiny")
        tokenizer = load_tokenizer(tok_arg) if isinstance(tok_arg, str) else tok_arg
        max_new = int(settings.get("max_new_tokens", 64))

        def reply_of(name: str) -> str:
            """``name``'s default reply as an absent agent gives it: its first tokens."""
            if isinstance(replies, Mapping):
                agent = next(iter(agent_ids([name])))
                text = replies.get(name, replies.get(agent, ""))
            else:
                text = replies
            ids = list(tokenizer(str(text), add_special_tokens=False)["input_ids"])
            return tokenizer.decode(ids[:max_new], skip_special_tokens=True)

        try:
            key = (
                runner.identity(),
                json.dumps(dry, sort_keys=True, default=repr),
                repr(replies),
                tok_arg if isinstance(tok_arg, str) else id(tok_arg),
                max_new,
            )
            hash(key)
        except TypeError:
            key = None  # not kept: discovered again by the next scenario built from it
        return discover(
            runner,
            dry,
            reply_of=reply_of,
            llm_of=lambda url, api_key, models: AppLLM(url, api_key, models),
            timeout_s=timeout_s,
            host=host,
            key=key,
        )

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        self.runner.check()  # before the episode starts: too many stuck app threads raise here
        return {"task": self._tasks(rng)}

    def score(self, state: dict[str, Any]) -> Outcome:
        outcome = super().score(state)
        if self.token_fidelity:
            turns = float(state.get("retokenized_turns") or 0)
            outcome.metrics = {**outcome.metrics, "gateway/retokenized_turns": turns}
        return outcome

    def run_episode(self, task: Any, chat: Mapping[str, Any]) -> tuple[Any, int]:
        """Run the app on ``task`` and answer its requests here until it ends (in the node);
        returns its result and the turns whose sampled ids replaced re-tokenised ones."""
        from marl_agents.gateway.server import gateway
        from scenarios.alarm import EpisodeTimeout

        server = gateway(self.host)
        names = {name: agent for agent, name in self.model_names.items()}
        episode = Episode(
            names, truncate_prompts=self.truncate_prompts, fidelity=self.token_fidelity
        )
        server.registry.add(episode)
        llm = AppLLM(
            server.base_url, episode.key, ModelNames(self.model_names, self.discovered is not None)
        )
        running = self.runner.start(task, llm, episode)
        try:
            result = episode.serve(chat, self.timeout_s)
            return result, episode.turns.retokenized_turns if episode.turns is not None else 0
        except AppTimedOut as exc:
            running.stop()
            raise EpisodeTimeout(
                f"{running.describe()}: {exc}: {APP_TIMEOUT_LIMIT} ({self.timeout_s:g} s) fired"
                f"{running.tail()}"
            ) from None
        finally:
            server.registry.remove(episode.key)
            episode.close()
            running.stop()


# ----- runners ---------------------------------------------------------------------------------
class AppFailed(GatewayError):
    """An app episode's app raised, exited non-zero or printed no result."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 500, "server_error", None, "app_failed")


class _Running:
    def stop(self) -> None:
        pass

    def tail(self) -> str:
        return ""

    def describe(self) -> str:
        raise NotImplementedError


class StuckApps(ScenarioError):
    """Too many function-app threads of this process never returned: no episode of a function
    app starts until some do."""


#: function apps still running past their episodes: (the event set when ``run`` returns, name)
_STUCK: list[tuple[threading.Event, str]] = []
_STUCK_LOCK = threading.Lock()
_WARNED_STUCK: set[str] = set()  # apps already warned about


def stuck_app_threads() -> list[str]:
    """The apps (by name) of this process's function-app threads still running after their
    episodes ended, one entry a thread (threads whose app returned since are dropped)."""
    with _STUCK_LOCK:
        _STUCK[:] = [(r, name) for r, name in _STUCK if not r.is_set()]
        return [name for _, name in _STUCK]


def _fix_hint() -> str:
    return (
        "make run(task, llm) honour a timeout (e.g. the openai client's timeout=..., or "
        "asyncio.wait_for in an async app) or run the app as a command "
        "(AppScenario.command([...]), which is killed at its episode's end)"
    )


class _Thread(_Running):
    def __init__(self, name: str, thread: threading.Thread, returned: threading.Event) -> None:
        self.name, self.thread, self.returned = name, thread, returned

    def describe(self) -> str:
        return f"the app {self.name}"

    def stop(self) -> None:
        """The episode ended: a ``run`` that has not returned within :data:`STUCK_GRACE_S`
        (an aborted app's next request is refused at once, so it usually ends) is left
        behind, counted."""
        if self.returned.wait(timeout=STUCK_GRACE_S):
            return
        with _STUCK_LOCK:
            if any(r is self.returned for r, _ in _STUCK):
                return
            _STUCK.append((self.returned, self.name))
        stuck = len(stuck_app_threads())
        if self.name not in _WARNED_STUCK:
            _WARNED_STUCK.add(self.name)
            log.warning(
                "the app %s did not return by the end of its episode: its thread keeps running "
                "(Python threads cannot be killed; its key no longer works). %d app thread(s) "
                "are stuck in this process; at %d no more episodes start. Fix: %s",
                self.name,
                stuck,
                MAX_STUCK_APP_THREADS,
                _fix_hint(),
            )


class _Function:
    """``run(task, llm)`` per episode on a daemon thread (:class:`_Workers`: reused once the
    app returned)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise ScenarioError(
                f"run must be a function run(task, llm) → result, got {type(fn).__name__}; "
                "use AppScenario.command([...]) for a program"
            )
        self.fn = fn
        self.name = getattr(fn, "__qualname__", repr(fn))

    def identity(self) -> Any:
        """What identifies this app in a process (for what its dry run found)."""
        return ("function", self.fn)

    def check(self) -> None:
        """Raise :class:`StuckApps` once :data:`MAX_STUCK_APP_THREADS` app threads are stuck."""
        stuck = stuck_app_threads()
        if len(stuck) >= MAX_STUCK_APP_THREADS:
            counts = {name: stuck.count(name) for name in dict.fromkeys(stuck)}
            raise StuckApps(
                f"{len(stuck)} app threads of this process never returned after their episodes "
                f"ended (by app: {counts}; the limit is {MAX_STUCK_APP_THREADS}), so no more "
                f"episodes of the app {self.name} start: {_fix_hint()}"
            )

    def start(self, task: Any, llm: AppLLM, episode: Episode | DryRun) -> _Running:
        fn, name = self.fn, self.name
        returned = threading.Event()

        def target() -> None:
            try:
                out = fn(task, llm)
                if inspect.isawaitable(out):
                    out = asyncio.run(_awaited(out))
            except BaseException as exc:
                trace = "".join(traceback.format_exception(exc)).strip()
                error = AppFailed(
                    f"the app {name} raised {type(exc).__name__}: {exc}; its traceback ends:\n"
                    f"{trace[-STDERR_TAIL:]}"
                )
                error.__cause__ = exc
                returned.set()
                episode.finish(error=error)
            else:
                returned.set()
                episode.finish(result=out)

        return _Thread(name, _WORKERS.run(target), returned)


class _Workers:
    """Daemon threads running function apps' episodes, each reused once its app returned (a
    thread started per episode cost more than the rest of a short episode's app side). A job
    runs in a fresh ``contextvars`` context, as on a new thread; a worker whose app never
    returns stays with it (:class:`_Thread` counts it as stuck), and the next episode gets
    another worker. At most :data:`MAX_IDLE_APP_WORKERS` idle workers are kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[tuple[threading.Thread, queue.SimpleQueue[Callable[[], None]]]] = []

    def run(self, job: Callable[[], None]) -> threading.Thread:
        """Run ``job`` on an idle worker (or a new one); returns the worker's thread."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
            thread = threading.Thread(
                target=self._work, args=(jobs,), name=f"marl-app-{next(_EPISODES)}", daemon=True
            )
            worker = (thread, jobs)
            jobs.put(job)
            thread.start()
        else:
            worker[1].put(job)
        return worker[0]

    def _work(self, jobs: queue.SimpleQueue[Callable[[], None]]) -> None:
        me = (threading.current_thread(), jobs)
        while True:
            contextvars.Context().run(jobs.get())
            with self._lock:
                if len(self._idle) >= MAX_IDLE_APP_WORKERS:
                    return
                self._idle.append(me)


_WORKERS = _Workers()


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class _Command:
    """A command run per episode (its environment: the module docstring)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd

    def identity(self) -> Any:
        """What identifies this app in a process (for what its dry run found)."""
        return ("command", tuple(self.argv), tuple(sorted(self.env.items())), self.cwd)

    def check(self) -> None:
        """Nothing to check: a command's process is killed at its episode's end."""

    def start(self, task: Any, llm: AppLLM, episode: Episode | DryRun) -> _Running:
        try:
            payload = json.dumps(task)
        except TypeError as exc:
            raise ScenarioError(f"a command app's task must be JSON-serialisable: {exc}") from exc
        env = {**os.environ, **self.env, **llm.environ(), "MARL_TASK": payload}
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=self.cwd,
                text=True,
                errors="replace",
            )
        except OSError as exc:
            raise ScenarioError(f"cannot start the app command {self.argv}: {exc}") from exc
        return _Process(proc, self.argv, episode)


class _Process(_Running):
    def __init__(
        self, proc: subprocess.Popen[str], argv: list[str], episode: Episode | DryRun
    ) -> None:
        self.proc, self.argv = proc, argv
        self.stderr = ""
        self._waiter = threading.Thread(target=self._wait, args=(episode,), daemon=True)
        self._waiter.start()

    def describe(self) -> str:
        return f"the app command {self.argv}"

    def _wait(self, episode: Episode | DryRun) -> None:
        out, err = self.proc.communicate()
        self.stderr = err or ""
        code = self.proc.returncode
        lines = [x for x in (out or "").splitlines() if x.strip()]
        if code != 0:
            episode.finish(
                error=AppFailed(f"{self.describe()} exited with status {code}{self.tail()}")
            )
        elif not lines:
            episode.finish(
                error=AppFailed(
                    f"{self.describe()} printed no result: print it as the last line{self.tail()}"
                )
            )
        else:
            try:
                result = json.loads(lines[-1])
            except json.JSONDecodeError:
                result = lines[-1]
            episode.finish(result=result)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self._waiter.join(timeout=5)

    def tail(self) -> str:
        err = self.stderr.strip()
        return f"; its stderr ends:\n{err[-STDERR_TAIL:]}" if err else ""


__all__ = [
    "MAX_STUCK_APP_THREADS",
    "AppFailed",
    "AppLLM",
    "AppScenario",
    "StuckApps",
    "model_variable",
    "stuck_app_threads",
]
