"""Live episodes on the fast path: :class:`SteppedRun` steps a :class:`~scenarios.replay.FastGraph`
superstep by superstep, with :class:`~scenarios.bridge.GraphRun`'s interface and results.

Contract (what :class:`scenarios.graph_env.GraphEnv` relies on): for the same inputs and actions a
``SteppedRun`` hands out the same pending requests (agents, observations, supersteps, in the same
order), emits the same rewards and ends with the same ``result``/``error`` as ``GraphRun``.

* The superstep loop runs in a greenlet of its own and each task of a superstep in its own
  greenlet, as ``GraphRun`` runs LangGraph's tasks: ``decide()`` suspends its task; once every
  task of the superstep has decided or ended, the pending decisions go to the environment, and
  ``resume`` wakes the tasks in the order they decided. Task greenlets are reused (a pool per
  thread: starting a fresh greenlet costs ~10 µs, reusing one ~1 µs); each task still starts
  in an empty ``contextvars`` context, as a fresh greenlet does.
* The recursion limit ends the run with LangGraph's own ``GraphRecursionError``.
* Anything else the fast executor does not run as LangGraph would (a node raising, a feature
  :func:`~scenarios.replay.compile_fast` could not see: ``interrupt()``, ``get_config()``, a
  ``Command`` to the parent, a decision from another thread) ends the fast run, and the episode
  so far is replayed through LangGraph (``GraphRun``) with the same actions; the LangGraph run
  then carries the episode on. This assumes node functions are deterministic given the state and
  the decisions (as counterfactual credit does); a replay that hands out different decisions
  raises :class:`~scenarios.base.ScenarioError`. The replay runs without tool latency, and a
  tool call that timed out in the fast run raises its ``ToolTimeout`` at once there instead of
  running again (:mod:`scenarios.tool_latency`): a hung tool is waited for once. With
  ``errors_end_run`` (``Scenario.node_errors_end_episode``) a lone task's node that raises ends
  the run with its error, as LangGraph's run would, and is not run again.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any

import greenlet
from langgraph.errors import ErrorCode, GraphRecursionError, create_error_message

from scenarios.base import ScenarioError
from scenarios.bridge import EpisodeAborted, GraphRun, Request
from scenarios.replay import (
    FAST_BRIDGE,
    FastBridge,
    FastGraph,
    RecursionLimit,
    TaskResult,
    Unsupported,
    same,
)

#: the node of the task running in this greenlet (what LangGraph's ``langgraph_node`` says)
FAST_NODE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "marl_fast_node", default=None
)
_BLOCKED: Any = object()  # a task waits for a decision
_FALLBACK: Any = object()  # the fast run cannot go on: replay through LangGraph


_IDLE_MAX = 256  # idle task greenlets a thread keeps
_pool = threading.local()  # ``idle``: this thread's task greenlets waiting for a task


def _task_loop(job: Callable[[], Any]) -> Any:
    """A pooled task greenlet: run a job, hand its result to the parent, wait for the next."""
    while True:
        job = greenlet.getcurrent().parent.switch(job())


def _take_task(parent: greenlet.greenlet) -> greenlet.greenlet:
    """An idle task greenlet of this thread (or a new one) under ``parent``, with a fresh
    ``contextvars`` context (what a new greenlet starts with)."""
    idle = getattr(_pool, "idle", None)
    glet = idle.pop() if idle else greenlet.greenlet(_task_loop)
    glet.parent = parent
    glet.gr_context = contextvars.Context()
    return glet


def _release_tasks(tasks: list[greenlet.greenlet]) -> None:
    """Give a superstep's task greenlets (each waiting in :func:`_task_loop`) back to the pool."""
    idle = getattr(_pool, "idle", None)
    if idle is None:
        idle = _pool.idle = []
    live = [t for t in tasks if not t.dead]  # (every one is, when the superstep ended)
    idle.extend(live[: _IDLE_MAX - len(idle)])


class _Failed:
    """A task ended with an exception the fast path does not reproduce."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Fallback(BaseException):
    """The fast run must fall back (a BaseException: a node's ``except Exception`` around its
    ``decide()`` cannot swallow it). Internal control flow, not a ``MarlError``: the stepped
    run catches it and hands the episode to ``GraphRun``."""


class _Bridge(FastBridge):
    def decide(self, node: str, observation: Any) -> Any:
        try:
            return super().decide(node, observation)
        except Unsupported as exc:  # GraphRun decides (e.g. it fails the run, naming the fix)
            raise _Fallback(str(exc)) from exc


def needs_langgraph(reason: str) -> None:
    """Say that the calling node needs LangGraph's runtime (its run config, callbacks): inside
    a fast run (a live stepped episode or a fast replay) the run falls back to LangGraph, which
    carries the episode on; elsewhere nothing happens. Code that reads LangGraph's run config
    to find its episode (``marl_agents.llm.env_chat_model.in_env_run``) calls it, since the fast
    executor has no such config and would otherwise run the node as if outside any episode."""
    bridge = FAST_BRIDGE.get()
    if bridge is None:
        return
    if isinstance(bridge, _Bridge):
        raise _Fallback(reason)  # a BaseException: a node's ``except Exception`` lets it pass
    raise Unsupported(reason)


class SteppedRun:
    """One episode of ``fast`` on ``inputs``, stepped like :class:`~scenarios.bridge.GraphRun`.

    Args:
        fast: the compiled fast graph.
        inputs: the graph's input dict.
        recursion_limit: LangGraph's recursion limit of the run.
        fallback: builds the ``GraphRun`` of the same episode (see the module doc).
        uncounted: a context manager the fallback's replay runs in (the env stops the
            episode's wall-clock limit there: the replay redoes work already counted).
        tools: the episode's tool calls (:class:`scenarios.tool_latency.ToolEpisode`), found
            by ``tool_latency.active()`` on the bridge; None: tools run as they are.
        keep_latest: keep the state after every superstep in :attr:`latest` (``GraphRun``'s).
        errors_end_run: a lone task's node that raises ends the run with its error (as
            LangGraph's run ends) instead of falling back, which would run the node again
            (``Scenario.node_errors_end_episode``).
    """

    def __init__(
        self,
        fast: FastGraph,
        inputs: Any,
        recursion_limit: int,
        fallback: Callable[[], GraphRun],
        uncounted: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
        tools: Any = None,
        keep_latest: bool = False,
        errors_end_run: bool = False,
    ) -> None:
        self._uncounted = uncounted
        self._errors_end_run = errors_end_run
        self.fast = fast
        self.inputs = inputs
        self.recursion_limit = recursion_limit
        self._fallback = fallback
        self._lg: GraphRun | None = None  # the LangGraph run, once the episode fell back
        self.bridge = _Bridge(self._act, fast.agent_nodes, 1 << 62, fast.agent_ids)
        self.bridge.keep_values = keep_latest
        self.bridge.tools = tools
        self._pending: dict[str, Request] = {}
        self._result: Any = None
        self._error: BaseException | None = None
        self._finished = False
        self._superstep = 0
        self._thread = threading.get_ident()
        self._env: greenlet.greenlet | None = None
        self._main: greenlet.greenlet | None = None
        self._tasks: list[greenlet.greenlet] = []
        self._waiting: dict[str, int] = {}  # pending agent → its task
        self._actions: list[dict[str, Any]] = []  # every step's actions, for a fallback
        self._seen: list[dict[str, Request]] = []  # what each call handed out

    # ----- GraphRun's interface ------------------------------------------------------------
    @property
    def pending(self) -> dict[str, Request]:
        return self._pending if self._lg is None else self._lg.pending

    @property
    def result(self) -> Any:
        return self._result if self._lg is None else self._lg.result

    @property
    def latest(self) -> Any:
        """The state after the last superstep, with ``keep_latest`` (``GraphRun.latest``)."""
        return self.bridge.values if self._lg is None else self._lg.latest

    @property
    def error(self) -> BaseException | None:
        return self._error if self._lg is None else self._lg.error

    @property
    def finished(self) -> bool:
        return self._finished if self._lg is None else self._lg.finished

    @property
    def superstep(self) -> int:
        return self._superstep if self._lg is None else self._lg.superstep

    @property
    def team_reward(self) -> float:
        return self.bridge.team_reward if self._lg is None else self._lg.team_reward

    @property
    def agent_rewards(self) -> dict[str, float]:
        return self.bridge.agent_rewards if self._lg is None else self._lg.agent_rewards

    @property
    def global_state(self) -> Any:
        return self.bridge.global_state if self._lg is None else self._lg.global_state

    @property
    def left(self) -> dict[str, bool]:
        return self.bridge.left if self._lg is None else self._lg.left

    @property
    def fell_back(self) -> bool:
        """The episode went on through LangGraph (see the module doc)."""
        return self._lg is not None

    def start(self) -> dict[str, Request]:
        """Run the graph until its first decisions (or its end); return the pending requests."""
        self._main = greenlet.greenlet(self._loop)
        return self._drive(())

    def resume(self, actions: Mapping[str, Any]) -> dict[str, Request]:
        """Give every pending agent its action; run to the next decisions or the end."""
        missing = set(self.pending) - set(actions)
        if missing:
            raise ValueError(f"no action for pending agents {sorted(missing)}")
        self._actions.append({a: actions[a] for a in self.pending})
        if self._lg is not None:
            return self._lg.resume(actions)
        return self._drive((actions,))

    def abort(self) -> None:
        """End a suspended run: suspended tasks are unwound (the last started first)."""
        if self._lg is not None:
            self._lg.abort()
            return
        self._unwind()

    # ----- environment side ----------------------------------------------------------------
    def _drive(self, args: tuple[Any, ...]) -> dict[str, Request]:
        assert self._main is not None
        self._env = greenlet.getcurrent()
        self._main.parent = self._env
        try:
            out = self._main.switch(*args)
        except BaseException:  # escaped the graph (a timeout, KeyboardInterrupt): end the run
            self._unwind()
            raise
        if out is _FALLBACK:
            return self._fall_back()
        self._seen.append(dict(self._pending))
        return self._pending

    def _unwind(self) -> None:
        self._pending = {}
        self._waiting.clear()
        me = greenlet.getcurrent()
        for glet in [*reversed(self._tasks), self._main]:  # (a lone task is the loop's)
            if glet is not None and glet and not glet.dead:
                try:
                    glet.parent = me
                except ValueError:  # suspended on another thread (an env thread still hung in
                    continue  # a call past its timeout): a greenlet is bound to its thread
                with contextlib.suppress(EpisodeAborted):
                    glet.throw(EpisodeAborted)
        self._tasks = []
        self._finished = True

    def _fall_back(self) -> dict[str, Request]:
        """Replay the episode so far through LangGraph; it carries the episode on."""
        self._unwind()
        self._finished = False
        run = self._lg = self._fallback()
        with self._uncounted():  # the fast run already spent this time
            pending = run.start()
            for seen, actions in zip(self._seen, self._actions, strict=False):
                self._check(run, pending, seen)
                pending = run.resume(actions)
        return pending

    @staticmethod
    def _check(run: GraphRun, pending: Mapping[str, Request], seen: Mapping[str, Request]) -> None:
        if not run.finished and _same_requests(pending, seen):
            return
        run.abort()
        raise ScenarioError(
            "the fast path's episode cannot be replayed through LangGraph: the replay asked "
            f"{sorted(pending)} where the fast run asked {sorted(seen)} (a node that is not "
            "deterministic given the state and the decisions?): run it with episodes.engine: "
            "langgraph (GraphEnv(engine='langgraph'))"
        )

    # ----- graph side ----------------------------------------------------------------------
    def _loop(self) -> Any:
        FAST_BRIDGE.set(self.bridge)  # this greenlet's own context
        try:
            self._result = self.fast._run(
                self.inputs, self.bridge, False, self.recursion_limit, self._execute
            )
        except EpisodeAborted:
            pass
        except RecursionLimit:  # LangGraph's error, word for word
            self._error = GraphRecursionError(
                create_error_message(
                    message=(
                        f"Recursion limit of {self.recursion_limit} reached "
                        "without hitting a stop condition. You can increase the "
                        "limit by setting the `recursion_limit` config key."
                    ),
                    error_code=ErrorCode.GRAPH_RECURSION_LIMIT,
                )
            )
        except (Exception, _Fallback) as exc:  # a node raised, an invalid update, unsupported
            if not (self._errors_end_run and exc is self.bridge.node_error and not self._tasks):
                return _FALLBACK
            self._error = exc  # a lone node's own error: LangGraph's run ends with it too
        self._finished = True
        self._pending = {}
        return None

    def _execute(self, calls: list[Callable[[], TaskResult]]) -> list[TaskResult]:
        """Run one superstep's tasks, each in its own greenlet; hand decisions to the env."""
        if len(calls) == 1:  # a lone task runs in this greenlet (as LangGraph runs it inline)
            return [self._solo(calls[0])]
        results: list[Any] = [None] * len(calls)
        me = greenlet.getcurrent()
        self._tasks = [_take_task(me) for _ in calls]
        for i, call in enumerate(calls):
            self._enter(i, results, functools.partial(self._body, call))
        while self._waiting:
            assert self._env is not None
            actions = self._env.switch(_BLOCKED)  # the env's step, then resume(actions)
            woken, self._waiting = self._waiting, {}
            self._pending = {}
            for agent, i in woken.items():
                self._enter(i, results, actions[agent])
        _release_tasks(self._tasks)  # every task has ended: each waits for its next one
        self._tasks = []
        return results

    def _enter(self, i: int, results: list[Any], value: Any) -> None:
        """Run task ``i`` until it decides or ends."""
        self.bridge.task = i
        out = self._tasks[i].switch(value)
        if out is _BLOCKED:
            return
        if isinstance(out, _Failed):
            raise _Fallback from out.exc
        results[i] = out

    def _solo(self, call: Callable[[], TaskResult]) -> TaskResult:
        token = FAST_NODE.set(self.bridge.task_names[0])
        self.bridge.task = 0
        self._tasks = [greenlet.getcurrent()]
        try:
            return call()
        finally:
            FAST_NODE.reset(token)
            self._tasks = []

    def _body(self, call: Callable[[], TaskResult]) -> Any:
        FAST_BRIDGE.set(self.bridge)
        FAST_NODE.set(self.bridge.task_names[self.bridge.task])
        try:
            return call()
        except (Exception, _Fallback) as exc:
            return _Failed(exc)

    def _act(self, agent: str, observation: Any) -> Any:
        """``decide()`` of the running task: suspend it until the env gives its action."""
        me = greenlet.getcurrent()
        bridge, i = self.bridge, self.bridge.task
        if (
            threading.get_ident() != self._thread
            or i >= len(self._tasks)
            or self._tasks[i] is not me
        ):
            raise _Fallback("a decision outside the superstep's tasks")
        self._superstep = bridge.superstep
        request = Request(agent, bridge.asked, observation, self._superstep, bridge.task_names[i])
        self._pending[agent] = request
        if me is self._main:  # a lone task: the env's step, then resume(actions)
            assert self._env is not None
            actions = self._env.switch(_BLOCKED)
            self._pending = {}
            self.bridge.task = i
            return actions[agent]
        self._waiting[agent] = i
        assert self._main is not None
        return self._main.switch(_BLOCKED)


def _same_requests(a: Mapping[str, Request], b: Mapping[str, Request]) -> bool:
    return list(a) == list(b) and all(same(a[k].observation, b[k].observation) for k in a)
