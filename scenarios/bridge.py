"""The bridge between a running LangGraph graph and an environment's ``step()``.

LangGraph drives the graph; the environment must be able to stop it at every agent decision and
resume it later with the learner's action. Threads and ``interrupt()`` both cost several times the
graph's own run time here, so the bridge runs everything in the caller's thread with greenlets and
a small scheduler:

* the graph runs in one greenlet (``graph.invoke``); a superstep with a single task, which
  LangGraph runs inline, runs in the greenlet that ticks it;
* every task of a parallel superstep, at any depth (a compiled subgraph node, a graph invoked
  inside a node, their own parallel supersteps), is started by our ``submit`` (LangGraph's runner
  hook, inherited by nested runs) in a greenlet of its own, and runs until it *blocks*: it waits
  for a decision, or it ticks a nested parallel superstep whose tasks have all been started and
  not all finished;
* when nothing can run any more, the decisions waiting are exactly the pending agents of this
  parallel step, and control goes to the environment; an action wakes its task.

So a step holds every decision LangGraph would have in flight at once: the agents of one
superstep, also when they decide deep inside several subgraphs running side by side.

**Agent ids.** By node (``agent_nodes``, the built-in scenarios): a decision is named after the
top-level agent node whose task makes it, ``<node>_<i>`` for the ``i``-th task of a fan-out node
with ``max_instances > 1`` in LangGraph's scheduling order. By id (``agent_ids``, apps whose
agents live in subgraphs, e.g. chat models that pass their own id): the id given to ``decide()``,
wherever it is called; an id declared with ``n > 1`` instances names its concurrent branches
``<id>_0 … <id>_{n-1}`` in the order they first decide (a branch keeps its id for the rest of its
superstep). Two decisions that would share an id at once raise :class:`BridgeError` naming the
node, the agent and the fix (never a deadlock).

**Async apps.** A node (router, tool node, subgraph node) whose LangGraph runnable has only an
``async`` function, or a ``ToolNode`` with async tools, runs its coroutine to completion on an
event loop inside its task's greenlet (loops are pooled per thread); a decision made while the
coroutine runs suspends the greenlet, loop and all. asyncio keeps the running loop per thread, so
every greenlet switch here saves, clears and restores it. Sync code keeps its sync path, so an
async app and its sync twin make the same decisions on the same observations.

LangGraph's semantics (reducers, conditional edges, ``Send``, joins, ``Command``) are untouched:
the bridge only decides when a task runs, never what it does. The LangGraph internals it relies
on live in :mod:`topologies.langgraph_compat`, pinned by ``tests/test_langgraph_compat.py``.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import inspect
import itertools
import sys
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

import greenlet
from langgraph.config import get_config

from scenarios.base import ScenarioError
from topologies import langgraph_compat as lg
from topologies.stdlib_compat import running_loop, set_running_loop

BRIDGE_KEY = "__marl_bridge__"
_EPISODES = itertools.count()


class SkipNode(Exception):
    """Raised by ``decide()`` for an agent absent under ``absent="skip"``: its node writes nothing.

    Passing the class itself as an agent's action makes that agent's ``decide()`` raise it.
    Internal control flow, not a ``MarlError``: the agent's node catches it.
    """


class EpisodeAborted(BaseException):
    """Thrown into a suspended graph to end it (a reset before the episode finished).

    Internal control flow, not a ``MarlError``: the run that throws it also catches it.
    """


class BridgeError(ScenarioError):
    """The graph cannot be stepped as declared (e.g. two concurrent decisions would act as one
    agent, or a decision comes from a worker thread); the message names the node, the agent and
    the fix. Raised by :meth:`GraphRun.start` / :meth:`GraphRun.resume` after the run is ended."""


class EmittedRewards:
    """What a run's nodes emitted (``scenarios.emit_reward``, ``scenarios.emit_state``,
    ``scenarios.leave``): the one implementation of them that every bridge
    (:class:`GraphRun`, the fast path's, the inline runner's) inherits.

    Attributes:
        team_reward: the sum of rewards emitted to the team (``agents=None``).
        agent_rewards: agent → the sum of rewards emitted to it by name.
        global_state: the last value a node gave ``emit_state()`` (``None``: none yet).
        left: the agents that left the episode (``scenarios.leave``) → whether by truncation.
    """

    def __init__(self) -> None:
        self.team_reward = 0.0
        self.agent_rewards: dict[str, float] = {}
        self.global_state: Any = None
        self.left: dict[str, bool] = {}

    def leave(self, agents: list[str], truncated: bool = False) -> None:
        for a in agents:
            self.left.setdefault(a, truncated)

    def emit_state(self, value: Any) -> None:
        self.global_state = value

    def emit_reward(self, value: float, agents: list[str] | None = None) -> None:
        if agents is None:
            self.team_reward += value
        else:
            for a in agents:
                self.agent_rewards[a] = self.agent_rewards.get(a, 0.0) + value


@dataclasses.dataclass
class Request:
    """One agent waiting for its action.

    Attributes:
        agent: the environment's agent id of this decision.
        node: the id the node passed to ``decide()``.
        observation: what the agent sees.
        superstep: the top-level graph's LangGraph superstep.
        path: the node making the decision, with its subgraph nodes (``"team/think"``).
    """

    agent: str
    node: str
    observation: Any
    superstep: int
    path: str = ""


# ----- event loops inside greenlets ------------------------------------------------------------
# asyncio's record of the running loop is per thread (its accessors: topologies.stdlib_compat)
_MAX_IDLE_LOOPS = 8
_all_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


class _IdleLoops(list):  # type: ignore[type-arg]
    """A thread's idle loops, closed when the thread ends (e.g. a LangGraph pool worker)."""

    def __del__(self) -> None:
        for loop in self:
            if not loop.is_closed() and not loop.is_running():
                loop.close()


_loops = threading.local()


@atexit.register
def _close_loops() -> None:
    """Close pooled loops before interpreter teardown (their ``__del__`` fails late)."""
    for loop in list(_all_loops):
        if not loop.is_closed() and not loop.is_running():
            loop.close()


def run_coroutine(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion on an idle event loop of this thread, in this greenlet.

    The caller may itself be inside a running loop (an async node calling sync code): that loop
    is set aside for the call. Tasks the coroutine leaves behind are cancelled, so a pooled loop
    never runs an earlier call's work.
    """
    idle: list[asyncio.AbstractEventLoop] = _loops.__dict__.setdefault("idle", _IdleLoops())
    if idle:
        loop = idle.pop()
    else:
        loop = asyncio.new_event_loop()
        _all_loops.add(loop)
    outer = running_loop()
    set_running_loop(None)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            if left:
                for task in left:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        finally:
            set_running_loop(outer)
            if len(idle) < _MAX_IDLE_LOOPS and not loop.is_closed():
                idle.append(loop)
            else:
                loop.close()


#: the run's own ``configurable`` keys, carried into a graph invoked with a ``configurable`` of
#: its own (LangGraph replaces the caller's): the bridge, tool episodes, the runner hook
_CARRIED_PREFIX = "__marl"


def episode_config(graph: Any, config: Any) -> Any:
    """The config of a graph run (``Pregel.stream``) inside an episode (else ``config``).

    Persistence as LangGraph documents it keeps working and stays in the episode:

    * a graph invoked inside a node with ``configurable`` of its own (``{"thread_id": "1"}``)
      gets the episode's keys back (LangGraph replaced the caller's ``configurable``), so its
      chat models decide in this episode;
    * a graph with a checkpointer of its own runs on a thread of this episode: its
      ``thread_id`` (or none) becomes ``<episode>/<thread_id>``, so no state leaks from one
      episode (or counterfactual replay) into the next; the episode's threads are deleted
      from the checkpointer when it ends (memory stays bounded).
    """
    conf = (config or {}).get("configurable") or {}
    run = conf.get(BRIDGE_KEY)
    if run is None:
        parent = lg.parent_configurable()
        run = parent.get(BRIDGE_KEY)
        if run is None:
            return config  # not in an episode: LangGraph's own behaviour
        ours = {k: v for k, v in parent.items() if k.startswith(_CARRIED_PREFIX)}
        hook = lg.runner_config(run._submit) if isinstance(run, GraphRun) else {}
        conf = {**ours, **hook, **conf}
    saver = getattr(graph, "checkpointer", None)
    if saver is not None and not isinstance(saver, bool) and isinstance(run, GraphRun):
        thread = conf.get("thread_id")
        scope = run.thread_scope
        if thread is None or not str(thread).startswith(scope):
            scoped = scope if thread is None else f"{scope}/{thread}"
            conf = {**conf, "thread_id": scoped}
            run.threads.append((saver, scoped))
    return {**(config or {}), "configurable": conf}


# async-only runnables and awaited graphs run on the task's greenlet inside our runs
lg.install(lambda configurable: BRIDGE_KEY in configurable, run_coroutine, episode_config)


def _switch(glet: greenlet.greenlet, *args: Any) -> Any:
    """``glet.switch(*args)``, with this thread's running event loop set aside meanwhile (every
    greenlet of a run switches through here, so each finds its own loop back when resumed)."""
    loop = running_loop()
    if loop is None:
        return glet.switch(*args)
    hooks = sys.get_asyncgen_hooks()
    set_running_loop(None)
    try:
        return glet.switch(*args)
    finally:
        set_running_loop(loop)
        sys.set_asyncgen_hooks(*hooks)


def _throw(glet: greenlet.greenlet, exc: type[BaseException]) -> None:
    loop = running_loop()
    set_running_loop(None)
    try:
        glet.throw(exc)
    finally:
        set_running_loop(loop)


class _Glet(greenlet.greenlet):
    """A greenlet of the run: the graph's, or one task of a parallel superstep.

    Attributes:
        bridge: the run it belongs to.
        agent: by-node runs: the agent id of the top-level agent task it works for.
        step: the top-level superstep it runs in (None: the graph greenlet, which looks it up).
        holds: base id → agent id this greenlet decides as (released when it ends or spawns).
        where: the node path of its last decision (for error messages).
        overflow: by-node runs: why its task has no agent id (a fan-out beyond
            ``max_instances``), raised if it decides.
    """

    def __init__(self, run: Callable[..., Any], bridge: GraphRun, parent: greenlet.greenlet):
        super().__init__(run, parent=parent)
        self.bridge = bridge
        self.agent: str | None = None
        self.step: int | None = None
        self.holds: dict[str, str] = {}
        self.where = ""
        self.overflow: str | None = None


@dataclasses.dataclass(eq=False)
class _Tick:
    """One parallel superstep being submitted (keyed by its ``PregelRunner.tick`` frame)."""

    tasks: tuple[Any, ...]
    submitted: int = 0
    running: int = 0  # submitted tasks not finished
    waiter: _Glet | None = None
    names: dict[str, str] = dataclasses.field(default_factory=dict)  # task id → agent id
    overflow: dict[str, str] = dataclasses.field(default_factory=dict)  # task id → error
    step: int | None = None


class GraphRun(EmittedRewards):
    """One episode of a compiled graph, suspended at every agent decision.

    Args:
        graph: a compiled LangGraph graph whose agents call ``scenarios.decide``.
        inputs: the graph's input.
        agent_nodes: by-node agent ids: top-level node name → max fan-out instances, for every
            agent node (decisions are named after their top-level node).
        config: extra run config (``recursion_limit``, ``configurable`` entries).
        agent_ids: by-id agent ids instead: id given to ``decide()`` → max concurrent instances
            (an iterable of ids means one instance each). Decisions may come from any depth.
        keep_latest: stream the run's values and keep the state after the last superstep in
            :attr:`latest` (also when the run ends on its recursion limit; ``invoke`` loses it).
    """

    def __init__(
        self,
        graph: Any,
        inputs: Any,
        agent_nodes: Mapping[str, int] | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        agent_ids: Mapping[str, int] | Iterable[str] | None = None,
        keep_latest: bool = False,
    ) -> None:
        if (agent_nodes is None) == (agent_ids is None):
            raise ValueError("GraphRun takes exactly one of agent_nodes (by node) or agent_ids")
        self.graph = graph
        self.inputs = inputs
        self.agent_nodes = dict(agent_nodes or {})
        self.agent_ids = None if agent_ids is None else instance_counts(agent_ids)
        self.config = dict(config or {})
        #: the thread ids of this episode (``<thread_scope>[/<app's id>]``) and their savers
        self.thread_scope = f"marl-episode-{next(_EPISODES)}"
        self.threads: list[tuple[Any, str]] = []
        self.pending: dict[str, Request] = {}
        self.result: Any = None
        self.keep_latest = keep_latest
        #: the state after the last superstep (with ``keep_latest``), kept when the run fails
        self.latest: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.superstep = 0
        EmittedRewards.__init__(self)
        self._thread = threading.get_ident()
        self._ready: collections.deque[tuple[_Glet, Any]] = collections.deque()
        self._waiting: dict[str, _Glet] = {}  # pending agent → its suspended greenlet
        self._owners: dict[str, _Glet] = {}  # agent id → the greenlet deciding as it
        self._live: list[_Glet] = []  # task greenlets not finished, in creation order
        self._ticks: dict[int, _Tick] = {}  # id(tick frame) → its superstep
        self._fatal: BaseException | None = None
        self._env_glet: greenlet.greenlet | None = None
        self._graph_glet: _Glet | None = None

    # ----- environment side ----------------------------------------------------------------
    def start(self) -> dict[str, Request]:
        """Run the graph until its first decisions (or its end); return the pending requests."""
        self._env_glet = greenlet.getcurrent()
        self._graph_glet = _Glet(self._main, self, self._env_glet)
        self._ready.append((self._graph_glet, None))
        return self._schedule()

    def resume(self, actions: Mapping[str, Any]) -> dict[str, Request]:
        """Give every pending agent its action; run to the next decisions or the end."""
        missing = set(self.pending) - set(actions)
        if missing:
            raise ValueError(f"no action for pending agents {sorted(missing)}")
        for agent in self.pending:
            self._ready.append((self._waiting.pop(agent), actions[agent]))
        self.pending = {}
        self._env_glet = greenlet.getcurrent()
        return self._schedule()

    def abort(self) -> None:
        """End a suspended run: every greenlet still suspended is unwound, innermost first."""
        self._ready.clear()
        self._waiting.clear()
        self.pending = {}
        me = greenlet.getcurrent()
        for glet in [*reversed(self._live), self._graph_glet]:
            if glet is not None and not glet.dead:
                glet.parent = me
                with contextlib.suppress(EpisodeAborted):
                    _throw(glet, EpisodeAborted)
        self._live.clear()
        self.finished = True

    def _schedule(self) -> dict[str, Request]:
        """Run ready greenlets until every one of them is waiting; return the pending agents."""
        me = greenlet.getcurrent()
        while True:
            if self._fatal is not None:
                error, self._fatal = self._fatal, None
                self.abort()
                raise error
            if self._ready:
                glet, value = self._ready.popleft()
                glet.parent = me
                try:
                    _switch(glet, *((value,) if glet else ()))  # a new greenlet takes no value
                except BaseException:  # escaped the graph (KeyboardInterrupt, ...): end the run
                    self.abort()
                    raise
                continue
            assert self._graph_glet is not None
            if self._graph_glet.dead:
                self.finished = True
                return self.pending
            if self.pending:
                return self.pending
            self._fatal = BridgeError(
                "the graph is stuck: no task can run and no agent waits for a decision "
                f"(tasks waiting: {[g.where or '?' for g in self._live]}); this is a bug in "
                "scenarios.bridge: please report it with the graph"
            )

    # ----- graph side ----------------------------------------------------------------------
    def _main(self) -> None:
        configurable = {
            **self.config.get("configurable", {}),
            BRIDGE_KEY: self,
            **lg.runner_config(self._submit),
        }
        config = {**self.config, "configurable": configurable}
        try:
            if self.keep_latest:  # what invoke returns is the last values chunk
                for values in self.graph.stream(self.inputs, config, stream_mode="values"):
                    self.latest = values
                self.result = self.latest
            else:
                self.result = self.graph.invoke(self.inputs, config=config)
        except EpisodeAborted:
            pass
        except Exception as exc:  # a node raised: the episode ends, the error is kept
            self.error = exc
        finally:
            for saver, thread in dict.fromkeys(self.threads):
                saver.delete_thread(thread)  # the episode's checkpoints go with it
        self.finished = True

    def _block(self) -> Any:
        """Suspend the current greenlet until it is woken; return the value it is given.

        The next ready greenlet runs at once (the scheduler's own step, without a detour
        through the environment's greenlet); when none is ready the scheduler decides.
        """
        assert self._env_glet is not None
        if self._ready and self._fatal is None:
            glet, value = self._ready.popleft()
            glet.parent = self._env_glet
            return _switch(glet, *((value,) if glet else ()))
        return _switch(self._env_glet)

    def _fail(self, error: BaseException) -> None:
        """End the run with ``error``, raised to the environment (never returns)."""
        self._fatal = error
        self._block()
        raise EpisodeAborted  # only reached if the scheduler resumed us anyway

    def _submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        __name__: str | None = None,
        __cancel_on_exit__: bool = False,
        __reraise_on_exit__: bool = True,
        __next_tick__: bool = False,
        **kwargs: Any,
    ) -> Any:
        if inspect.iscoroutinefunction(fn):  # an async run (a node awaiting graph.ainvoke)
            loop = asyncio.get_running_loop()
            return loop.create_task(
                fn(*args, **kwargs), name=__name__, context=contextvars.copy_context()
            )
        caller = sys._getframe(1)
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        me = greenlet.getcurrent()
        tasks = lg.tick_tasks(caller)
        if tasks is None or getattr(me, "bridge", None) is not self:
            # a functional-API call(), or a graph run from a worker thread (a sync tool's):
            # run it in place (a decision in it then fails, naming the fix)
            _settle(fut, fn, args, kwargs)
            return fut
        assert isinstance(me, _Glet)
        tick = self._ticks.get(id(caller))
        if tick is None or tick.tasks is not tasks:
            tick = self._ticks[id(caller)] = self._new_tick(me, tasks)
        task = args[0] if args else None
        glet = _Glet(self._body, self, self._env_glet)  # type: ignore[arg-type]
        task_id = getattr(task, "id", None)
        glet.agent = tick.names.get(task_id, me.agent)
        glet.overflow = tick.overflow.get(task_id, me.overflow)
        glet.step = tick.step
        self._live.append(glet)
        tick.submitted += 1
        tick.running += 1
        self._ready.appendleft((me, None))  # the submitter goes on once the task blocks or ends
        _switch(glet, fn, args, kwargs, fut, tick)
        if tick.submitted >= len(tick.tasks) and tick.running:
            tick.waiter = me  # every task started: wait until all have finished
            self._block()
        return fut

    def _new_tick(self, me: _Glet, tasks: tuple[Any, ...]) -> _Tick:
        """A parallel superstep starts: name its agent tasks (top level, by node)."""
        self._release(me)  # the submitter's decisions pause while its tasks run
        if tasks and lg.is_nested(lg.checkpoint_ns(tasks[0].config)):
            return _Tick(tasks, step=me.step if me.step is not None else self._graph_step())
        tick = _Tick(tasks, step=lg.task_step(tasks[0].config) if tasks else None)
        if self.agent_ids is not None:
            return tick
        counts: dict[str, int] = {}
        for t in tasks:
            if t.name in self.agent_nodes:
                counts[t.name] = counts.get(t.name, 0) + 1
        seen: dict[str, int] = {}
        for t in tasks:
            if t.name not in counts:
                continue
            i = seen[t.name] = seen.get(t.name, -1) + 1
            m, k = self.agent_nodes[t.name], counts[t.name]
            if i < m:
                tick.names[t.id] = f"{t.name}_{i}" if m > 1 else t.name
            else:  # an error if this task decides (a tool node fanned out by Send may not)
                tick.overflow[t.id] = (
                    f"node {t.name!r} runs {k} tasks in superstep {tick.step} (a Send fan-out) "
                    f"but is declared with max_instances={m}, so task {i + 1} has no agent id "
                    f"of its own: declare add_node({t.name!r}, ..., "
                    f"metadata={{'max_instances': N}}) with N >= {k} (instances become agents "
                    f"{t.name}_0 … {t.name}_{{N-1}}) and annotate its Send router "
                    "'-> list[Send]' so the topology shows the fan-out"
                )
        return tick

    def _body(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        fut: concurrent.futures.Future[Any],
        tick: _Tick,
    ) -> None:
        me = greenlet.getcurrent()
        assert isinstance(me, _Glet)
        try:
            _settle(fut, fn, args, kwargs)
        finally:
            self._release(me)
            if me in self._live:
                self._live.remove(me)
        tick.running -= 1
        if tick.running == 0 and tick.waiter is not None:
            self._ready.append((tick.waiter, None))
            tick.waiter = None

    def _release(self, glet: _Glet) -> None:
        for agent in glet.holds.values():
            if self._owners.get(agent) is glet:
                del self._owners[agent]
        glet.holds.clear()

    def _graph_step(self) -> int:
        """The top-level superstep, seen from the graph greenlet: the ``tasks`` of the outermost
        ``PregelRunner.tick`` frame on its stack."""
        step = lg.outermost_tick_step(sys._getframe(1))
        return self.superstep if step is None else step

    def decide(self, node: str, observation: Any) -> Any:
        """Called by ``scenarios.decide`` inside an agent's node (or its chat model)."""
        me = greenlet.getcurrent()
        if threading.get_ident() != self._thread or getattr(me, "bridge", None) is not self:
            error = BridgeError(
                f"decide({node!r}) was called from a worker thread (a sync tool run by "
                "ToolNode's thread pool, a RunnableLambda under ainvoke, or your own thread): "
                "decisions must run on the episode's thread; make that tool or function "
                "`async def` (it then runs on the episode's greenlet) or call the agent from a node"
            )
            self._fatal = error
            raise error
        config = get_config()
        ns = lg.checkpoint_ns(config)
        path = lg.task_path(ns)
        if me.step is not None:
            step = me.step
        elif not lg.is_nested(ns):
            step = lg.task_step(config, self.superstep)
        else:
            step = self._graph_step()
        agent = self._agent_id(me, node, path)
        me.where = path
        self.superstep = step
        self.pending[agent] = Request(agent, node, observation, step, path)
        self._waiting[agent] = me
        action = self._block()
        if action is SkipNode:
            raise SkipNode(agent)
        return action

    def _agent_id(self, me: _Glet, node: str, path: str) -> str:
        """The environment's id of a decision ``decide(node, ...)`` made by ``me`` at ``path``."""
        if me.overflow is not None:
            self._fail(BridgeError(me.overflow))
        if self.agent_ids is not None:
            n = self.agent_ids.get(node, 1)
        elif me.agent is not None:  # the top-level agent task it works for names it
            n, node = 1, me.agent
        else:
            n = self.agent_nodes.get(node, 1)
        held = me.holds.get(node)
        if held is not None:
            return held
        names = [node] if n <= 1 else [f"{node}_{i}" for i in range(n)]
        for name in names:
            owner = self._owners.get(name)
            if owner is None or owner.dead:
                self._owners[name] = me
                me.holds[node] = name
                return name
        others = {name: self._owners[name].where for name in names}
        if self.agent_ids is not None:
            fix = (
                f"declare {n + 1} or more instances of {node!r} (GraphEnv/GraphRun "
                f"agent_ids={{{node!r}: N}}: they become agents {node}_0 … {node}_{{N-1}}, in the "
                "order they first decide) or give each branch its own agent id"
            )
        else:
            fix = (
                "in a by-node run a node's agent id is its top-level node: give the deciding nodes "
                "their own names or max_instances, or run the scenario by agent id (agent_ids=...)"
            )
        self._fail(
            BridgeError(
                f"agent {node!r} is asked to decide at node {path!r} while {others} already "
                f"act(s) as it in the same parallel step: {fix}"
            )
        )
        raise AssertionError  # unreachable: _fail never returns


def instance_counts(agent_ids: Mapping[str, int] | Iterable[str]) -> dict[str, int]:
    """``{"a": 1, "w": 3}`` from a mapping id → instances or an iterable of ids (one each)."""
    if isinstance(agent_ids, str):
        raise ValueError(f"agent_ids must be a mapping or a list of ids, not {agent_ids!r}")
    if isinstance(agent_ids, Mapping):
        counts = {str(a): int(n) for a, n in agent_ids.items()}
    else:
        counts = dict.fromkeys(map(str, agent_ids), 1)
    bad = {a: n for a, n in counts.items() if n < 1}
    if bad:
        raise ValueError(f"agent_ids instance counts must be >= 1: {bad}")
    return counts


def agent_id_list(counts: Mapping[str, int]) -> list[str]:
    """Every environment agent id of ``instance_counts`` (``w`` × 3 → ``w_0, w_1, w_2``)."""
    return [a if n == 1 else f"{a}_{i}" for a, n in counts.items() for i in range(n)]


def _settle(
    fut: concurrent.futures.Future[Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Run ``fn`` into ``fut`` (its result or its exception); an aborted episode propagates."""
    try:
        fut.set_result(fn(*args, **kwargs))
    except EpisodeAborted:
        raise
    except BaseException as exc:
        fut.set_exception(exc)
