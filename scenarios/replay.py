"""Fast counterfactual replays: a scenario's graph executed without LangGraph's runtime.

Credit assignment replays one episode many times (``GraphEnv.value``; exact Shapley needs up to
``2**n`` coalitions). Through LangGraph a replay of a ``delegate`` episode costs 4–17 ms, almost
all of it Pregel machinery (tasks, checkpoints, callbacks, streaming) around node functions that
take microseconds. :class:`FastGraph` runs the same builder's node functions with LangGraph's
superstep semantics in a plain loop:

* state channels are LangGraph's own channel objects (``LastValue``, reducers through
  ``BinaryOperatorAggregate``), fresh per run, so reducers and initial values are LangGraph's;
* a superstep runs ``Send`` tasks in the order they were sent, then the triggered nodes sorted
  by name (LangGraph's task order, which also names fan-out instances ``<node>_<i>``); every
  task reads the state as it was when the superstep began;
* writes are applied in LangGraph's order (pull tasks by name, then push tasks by index);
  static edges, conditional edges (path maps, ``Send``), joins (``add_edge([a, b], c)``) and
  ``Command(update=..., goto=...)`` trigger the next superstep as LangGraph's channels do, and a
  router reads the state with its own node's writes applied (LangGraph's "fresh" read).

Only plain graphs qualify (:func:`compile_fast`): a ``StateGraph`` whose nodes and routers are
plain sync functions of the state (no injected config, runtime or store; no ``async def`` node or
router, no compiled subgraph as a node: those replay through LangGraph), with no deferred nodes,
retry, cache, timeout or error-handler policies, no managed values and only ``LastValue`` and
reducer channels. Anything unexpected during a run (a node raising, a ``Command`` to the parent,
a run near the recursion limit) raises :class:`Unsupported`, and the caller replays through
LangGraph instead; :class:`scenarios.graph_env.GraphEnv` also checks its first fast replays against
LangGraph replays and stops using the fast path if one differs.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.channels.last_value import LastValue
from langgraph.constants import END, START
from langgraph.graph import StateGraph
from langgraph.types import Command, Send

from scenarios.bridge import EmittedRewards, SkipNode
from topologies.langgraph_compat import MISSING, command_updates, plain_function

#: the bridge answering ``decide()`` / ``emit_reward()`` while a :class:`FastGraph` runs
FAST_BRIDGE: contextvars.ContextVar[Any] = contextvars.ContextVar("marl_fast_bridge", default=None)

Task = tuple[str, Any, bool]  # node, Send argument, is a push (Send) task
TaskResult = tuple[list[tuple[str, Any]], set[str], list[Send]]  # writes, next nodes, sends


class Unsupported(Exception):
    """This run cannot be replayed fast; replay it through LangGraph.

    Internal control flow, not a ``MarlError``: its callers fall back to LangGraph.
    """


class RecursionLimit(Exception):
    """The run reached LangGraph's recursion limit (LangGraph raises ``GraphRecursionError``
    after the superstep that reaches it); ``team_reward`` was emitted before.

    Internal control flow, not a ``MarlError``: callers turn it into a failed episode or
    LangGraph's own ``GraphRecursionError``.
    """

    def __init__(self, team_reward: float, state: dict[str, Any] | None = None) -> None:
        super().__init__(f"recursion limit reached (team reward so far {team_reward})")
        self.team_reward = team_reward
        #: the graph's state after the superstep that reached the limit
        self.state = state


class NodeFailed(Exception):
    """A lone task's node raised and the run was asked to end with that error
    (``FastGraph.run(errors_end_run=True)``, as ``SteppedRun``'s): LangGraph's run would fail
    with it too, so the caller scores a failed episode instead of replaying through LangGraph
    (which would run the node, e.g. a user's app, again). ``team_reward`` was emitted before.

    Internal control flow, not a ``MarlError``."""

    def __init__(self, team_reward: float) -> None:
        super().__init__(f"a node raised (team reward so far {team_reward})")
        self.team_reward = team_reward


class DecisionLimit(BaseException):
    """The replay needs more decision steps than the environment allows (a BaseException, so
    that a node's own ``except Exception`` cannot swallow it). Internal control flow, not a
    ``MarlError``: the caller ends the replay as a failed episode. ``state``: the state the
    run reached (with ``keep_values``), else ``None``."""

    state: dict[str, Any] | None = None


def compile_fast(
    builder: Any, agent_nodes: Mapping[str, int], agent_ids: Mapping[str, int] | None = None
) -> FastGraph | None:
    """A :class:`FastGraph` of ``builder`` (an uncompiled ``StateGraph``), or None when the
    graph uses a feature the fast executor does not run (see the module doc). Agents are
    named by node (``agent_nodes``) or, when ``agent_ids`` is given, by the id given to
    ``decide()`` (as :class:`scenarios.bridge.GraphRun` names them)."""
    if not isinstance(builder, StateGraph):  # e.g. an app kept compiled (its checkpointer)
        return None
    try:
        compiled = builder.compile()
    except Exception:
        return None
    if builder.managed or builder.input_schema is not builder.state_schema:
        return None
    if any(
        type(compiled.channels[k]) not in (LastValue, BinaryOperatorAggregate)
        for k in builder.channels
    ):
        return None
    for name, spec in builder.nodes.items():
        policies = (spec.retry_policy, spec.cache_policy, spec.timeout, spec.error_handler_node)
        if plain_function(spec.runnable) is None or spec.defer or spec.is_error_handler:
            return None
        if any(p is not None for p in policies):
            return None
        if isinstance((spec.metadata or {}).get("agent"), str):
            return None  # chat models read it off LangGraph's run metadata (PolicyChatModel)
        node = compiled.nodes[name]
        if node.mapper is not None or isinstance(node.channels, str):
            return None
    if any(plain_function(s.path) is None for b in builder.branches.values() for s in b.values()):
        return None
    return FastGraph(builder, compiled, agent_nodes, agent_ids)


class FastGraph:
    """A ``StateGraph`` prepared for fast replays; build it with :func:`compile_fast`."""

    def __init__(
        self,
        builder: Any,
        compiled: Any,
        agent_nodes: Mapping[str, int],
        agent_ids: Mapping[str, int] | None = None,
    ) -> None:
        self.agent_nodes = dict(agent_nodes)
        self.agent_ids = None if agent_ids is None else dict(agent_ids)
        self.state_keys = list(builder.channels)
        self.input_keys = set(builder.schemas[builder.input_schema])
        #: empty channels to copy per run (from_checkpoint builds each from its type: slower)
        self.templates = {k: compiled.channels[k].from_checkpoint(MISSING) for k in self.state_keys}
        self.containers = {
            k
            for k, t in self.templates.items()
            if isinstance(t, BinaryOperatorAggregate) and t.value is not MISSING
        }
        out = compiled.output_channels
        self.output_keys = [out] if isinstance(out, str) else list(out)
        self.reads = {n: list(compiled.nodes[n].channels) for n in builder.nodes}
        #: nodes that read every state key in the schema's order: their input is the state
        self.reads_all = {n for n, r in self.reads.items() if r == self.state_keys}
        self.funcs = {n: plain_function(s.runnable) for n, s in builder.nodes.items()}
        self.static: dict[str, list[str]] = {}
        for src, dst in builder.edges:
            if dst != END:
                self.static.setdefault(src, []).append(dst)
        self.joins = [(frozenset(srcs), end) for srcs, end in builder.waiting_edges]
        self.routers = {
            src: [
                (plain_function(s.path), dict(s.ends) if s.ends else None, s.input_schema is None)
                for s in specs.values()
            ]
            for src, specs in builder.branches.items()
        }

    def run(
        self,
        inputs: Any,
        act: Callable[[str, Any], Any],
        *,
        skip_agents: bool,
        max_decisions: int,
        recursion_limit: int,
        keep_values: bool = False,
        errors_end_run: bool = False,
    ) -> tuple[dict[str, Any], float]:
        """Run the graph on ``inputs`` with ``act(agent, obs)`` answering every ``decide()``.

        Args:
            inputs: the graph's input dict.
            act: the policy answering every decision (``SkipNode`` makes ``decide`` raise it).
            skip_agents: agent nodes turn ``SkipNode`` into "no update" (``absent="skip"``).
            max_decisions: environment steps allowed; one more raises :class:`DecisionLimit`.
            recursion_limit: the LangGraph run's recursion limit: a run that executes that many
                node supersteps raises :class:`RecursionLimit`, as LangGraph fails it.
            keep_values: the limit errors carry the state the run reached (``state``).
            errors_end_run: a lone task's node that raises ends the run with
                :class:`NodeFailed` (``Scenario.node_errors_end_episode``), not
                :class:`Unsupported`.

        Returns:
            The final state and the team reward emitted with ``emit_reward`` during the run.
        """
        if not isinstance(inputs, Mapping):
            raise Unsupported("the graph input is not a dict")
        bridge = FastBridge(act, self.agent_nodes, max_decisions, self.agent_ids)
        bridge.keep_values = keep_values
        token = FAST_BRIDGE.set(bridge)
        try:
            return self._run(inputs, bridge, skip_agents, recursion_limit), bridge.team_reward
        except DecisionLimit as exc:
            exc.state = bridge.values
            raise
        except (Unsupported, RecursionLimit):
            raise
        except Exception as exc:  # a node raised, an invalid update, ...: LangGraph decides
            if errors_end_run and exc is bridge.node_error and len(bridge.task_names) == 1:
                raise NodeFailed(bridge.team_reward) from exc
            raise Unsupported(f"{type(exc).__name__}: {exc}") from exc
        finally:
            FAST_BRIDGE.reset(token)

    def _run(
        self,
        inputs: Mapping[str, Any],
        bridge: FastBridge,
        skip: bool,
        limit: int,
        execute: Callable[[list[Callable[[], TaskResult]]], list[TaskResult]] | None = None,
    ) -> dict[str, Any]:
        """The superstep loop; ``execute`` runs one superstep's task calls and returns their
        results in task order (default: one after the other, in this greenlet)."""
        channels = {k: t.copy() for k, t in self.templates.items()}
        for k in self.containers:  # a reducer's fresh initial value (``typ()``), never shared
            channels[k].value = copy.copy(channels[k].value)
        barriers: list[set[str]] = [set() for _ in self.joins]
        # LangGraph's START task: the input's state keys, then START's edges and routers
        writes = [(k, v) for k, v in inputs.items() if k in self.input_keys]
        state = self._snapshot(channels)
        pulls, sends = self._route(START, dict(inputs), writes, channels, state)
        updated = self._apply([writes], channels)
        if bridge.keep_values:
            bridge.values = self._values(channels)
        steps = 0  # node supersteps
        while pulls or sends:
            steps += 1
            tasks: list[Task] = [(s.node, s.arg, True) for s in sends]
            tasks += [(n, None, False) for n in sorted(pulls)]
            for i, (srcs, end) in enumerate(self.joins):
                if end in pulls and barriers[i] == srcs:
                    barriers[i].clear()  # the join is consumed by its end node
            state = self._restate(state, updated, channels)
            bridge.new_superstep([t[0] for t in tasks])
            bridge.superstep = steps
            calls = [
                functools.partial(self._task, t, i, state, channels, bridge, skip)
                for i, t in enumerate(tasks)
            ]
            results = execute(calls) if execute is not None else [call() for call in calls]
            bridge.end_superstep()
            # LangGraph applies a superstep's writes by task path: pulls by name (the tasks
            # after the pushes, already sorted by name), then pushes by index
            order = [*range(len(sends), len(tasks)), *range(len(sends))]
            updated = self._apply([results[j][0] for j in order], channels)
            if bridge.keep_values:
                bridge.values = self._values(channels)
            pulls, sends = set(), []
            for j in order:
                _, nxt, snd = results[j]
                pulls |= nxt
                sends.extend(snd)
                for i, (srcs, end) in enumerate(self.joins):
                    if tasks[j][0] in srcs and tasks[j][0] not in barriers[i]:
                        barriers[i].add(tasks[j][0])
                        if barriers[i] == srcs:
                            pulls.add(end)
            if steps >= limit:  # LangGraph checks before it looks for more tasks
                raise RecursionLimit(bridge.team_reward, self._values(channels))
        return self._values(channels)

    def _values(self, channels: dict[str, Any]) -> dict[str, Any]:
        """The graph's state (its output channels), as LangGraph's ``values`` stream gives it."""
        return {k: ch.get() for k in self.output_keys if (ch := channels[k]).is_available()}

    def _task(
        self,
        task: Task,
        i: int,
        state: dict[str, Any],
        channels: dict[str, Any],
        bridge: FastBridge,
        skip: bool,
    ) -> TaskResult:
        """Run one task: its node function, then its routers; its writes are applied later."""
        name, arg, push = task
        fn = self.funcs.get(name)
        if fn is None:
            raise Unsupported(f"a Send to unknown node {name!r}")
        bridge.task = i
        try:
            output = fn(arg if push else self._read(name, state))
        except SkipNode:
            if not (skip and name in self.agent_nodes):
                raise
            output = None
        except Exception as exc:
            bridge.node_error = exc  # the node's own error (not the executor's)
            raise
        writes, goto_nodes, goto_sends = _updates(output)
        nxt, snd = self._route(name, output, writes, channels, state)
        return writes, nxt | goto_nodes, [*goto_sends, *snd]

    def _snapshot(self, channels: dict[str, Any]) -> dict[str, Any]:
        """The available channels' values in schema order (``LastValue`` and
        ``BinaryOperatorAggregate`` hold theirs in ``value``, ``MISSING`` when unavailable)."""
        return {k: v for k in self.state_keys if (v := channels[k].value) is not MISSING}

    def _restate(
        self, state: dict[str, Any], updated: list[str], channels: dict[str, Any]
    ) -> dict[str, Any]:
        """:meth:`_snapshot` after the channels ``updated`` took writes, from the last one:
        when no key appears or disappears only the updated values change."""
        out = dict(state)
        for k in updated:
            v = channels[k].value
            if v is MISSING or k not in state:
                return self._snapshot(channels)
            out[k] = v
        return out

    def _read(self, name: str, state: dict[str, Any]) -> dict[str, Any]:
        """A pull task's input: the superstep's state, restricted to the keys its node reads."""
        if name in self.reads_all:  # the same dict, in the same order, built at C speed
            return dict(state)
        return {k: state[k] for k in self.reads[name] if k in state}

    def _route(
        self,
        name: str,
        output: Any,
        writes: list[tuple[str, Any]],
        channels: dict[str, Any],
        state: dict[str, Any],
    ) -> tuple[set[str], list[Send]]:
        """Nodes triggered and packets sent by ``name``'s static edges and routers."""
        nxt = set(self.static.get(name, ()))
        sends: list[Send] = []
        routers = self.routers.get(name)
        if not routers:
            return nxt, sends
        fresh = self._fresh(writes, channels, state)
        for path, ends, passthrough in routers:
            value = {**output, **fresh} if passthrough and isinstance(output, dict) else fresh
            result = path(value)
            for r in result if isinstance(result, (list, tuple)) else [result]:
                dest = r if isinstance(r, Send) or ends is None else ends[r]
                if dest is None or dest == START:
                    raise Unsupported("a router returned no valid destination")
                if isinstance(dest, Send):
                    sends.append(dest)
                elif dest != END:
                    nxt.add(dest)
        return nxt, sends

    def _fresh(
        self, writes: list[tuple[str, Any]], channels: dict[str, Any], state: dict[str, Any]
    ) -> dict[str, Any]:
        """The state with one task's writes applied (what its routers read)."""
        mine: dict[str, list[Any]] = {}
        for k, v in writes:
            if k in channels:
                mine.setdefault(k, []).append(v)
        if not mine.keys() <= state.keys():  # a key becomes available: keep the schema's order
            state = {k: None for k in self.state_keys if k in state or k in mine}
            state.update({k: channels[k].get() for k in state if k not in mine})
        out = dict(state)
        for k, values in mine.items():
            ch = channels[k]
            if type(ch) is LastValue and len(values) == 1 and values[0] is not MISSING:
                out[k] = values[0]  # what a copy updated with it holds (no copy needed)
                continue
            ch = ch.copy()
            ch.update(values)
            if ch.is_available():
                out[k] = ch.get()
            else:
                del out[k]
        return out

    @staticmethod
    def _apply(task_writes: list[list[tuple[str, Any]]], channels: dict[str, Any]) -> list[str]:
        """Apply a superstep's writes (in task order); the keys written."""
        grouped: dict[str, list[Any]] = {}
        for writes in task_writes:
            for k, v in writes:
                if k in channels:
                    grouped.setdefault(k, []).append(v)
        for k, values in grouped.items():
            channels[k].update(values)
        return list(grouped)


def _updates(output: Any) -> tuple[list[tuple[str, Any]], set[str], list[Send]]:
    """A node's state writes and ``Command``/``Send`` gotos (LangGraph's ``_get_updates``)."""
    if output is None:
        return [], set(), []
    if isinstance(output, dict):
        return list(output.items()), set(), []
    if isinstance(output, Send):
        return [], set(), [output]
    if isinstance(output, Command):
        if output.graph == Command.PARENT:
            raise Unsupported("a Command to the parent graph")
        goto = [output.goto] if isinstance(output.goto, (Send, str)) else list(output.goto)
        nodes = {g for g in goto if isinstance(g, str) and g != END}
        return command_updates(output), nodes, [g for g in goto if isinstance(g, Send)]
    raise Unsupported(f"a node returned {type(output).__name__}")


_OVERFLOW = "<overflow>"  # a fan-out task beyond its node's max_instances


class FastBridge(EmittedRewards):
    """Answers ``decide()`` in place; names agents and counts steps as ``GraphRun`` does."""

    def __init__(
        self,
        act: Callable[[str, Any], Any],
        agent_nodes: Mapping[str, int],
        max_steps: int,
        agent_ids: Mapping[str, int] | None = None,
    ) -> None:
        self.act = act
        self.agent_nodes = agent_nodes
        self.agent_ids = agent_ids
        self._held: dict[tuple[int, str], str] = {}  # by id: (task, id) → instance this superstep
        self.max_steps = max_steps
        self.steps = 0  # environment steps before the current superstep
        EmittedRewards.__init__(self)
        self.superstep = 0  # the node superstep running (LangGraph's ``langgraph_step``)
        self.task = 0
        self.task_names: list[str] = []  # the superstep's tasks (their nodes)
        self.asked = ""  # the id the last decide() was given
        self._names: list[str | None] = []
        self._rounds: dict[int, int] = {}
        #: keep the graph's state after every superstep in :attr:`values` (as ``GraphRun``'s
        #: ``keep_latest``): what a run cut off by a limit reached
        self.keep_values = False
        self.values: dict[str, Any] | None = None
        #: the last exception a node function raised (``SteppedRun``'s ``errors_end_run``)
        self.node_error: BaseException | None = None

    def new_superstep(self, tasks: list[str]) -> None:
        """Name the superstep's agent tasks (``<node>_<i>`` for fan-out nodes)."""
        self._rounds = {}
        self.task_names = tasks
        # by id, as GraphRun: the tasks of the last superstep have ended (their instances are
        # free); a lone task keeps its instances until a parallel superstep starts
        if self._held:
            self._held = {k: v for k, v in self._held.items() if k[0] == -1 and len(tasks) == 1}
        if len(tasks) == 1:  # LangGraph runs a lone task inline; GraphRun names it by decide()
            self._names = [None]
            return
        seen: dict[str, int] = {}
        self._names = []
        for n in tasks:
            if n in self.agent_nodes:
                i = seen[n] = seen.get(n, -1) + 1
                m = self.agent_nodes[n]
                self._names.append(_OVERFLOW if i >= m else f"{n}_{i}" if m > 1 else n)
            else:
                self._names.append(None)

    def end_superstep(self) -> None:
        """A superstep takes as many environment steps as its busiest task has decisions."""
        self.steps += max(self._rounds.values(), default=0)

    def decide(self, node: str, observation: Any) -> Any:
        self.asked = node
        if self.agent_ids is not None:
            agent = self._by_id(node)
        else:
            agent = self._names[self.task] or self._untasked(node)
            if agent is _OVERFLOW:  # GraphRun fails the run, naming the fix
                raise Unsupported("a Send fan-out beyond max_instances: GraphRun decides")
        r = self._rounds[self.task] = self._rounds.get(self.task, 0) + 1
        if self.steps + r > self.max_steps:
            if r > 1 and len(self._names) > 1:  # GraphRun would have asked others first
                raise Unsupported("the decision limit falls inside a parallel superstep")
            raise DecisionLimit
        action = self.act(agent, observation)
        if action is SkipNode:
            raise SkipNode(agent)
        return action

    def _untasked(self, node: str) -> str:
        """A decision of a task that is no agent node: named by ``decide()``'s id."""
        if len(self._names) > 1:  # GraphRun names it by who owns the id at that moment
            raise Unsupported("a decision of a non-agent task in a parallel superstep")
        return f"{node}_0" if self.agent_nodes.get(node, 1) > 1 else node

    def _by_id(self, node: str) -> str:
        """GraphRun's by-id naming: a task keeps its instance; a new one takes the first free."""
        assert self.agent_ids is not None
        key = (self.task if len(self._names) > 1 else -1, node)
        if key in self._held:
            return self._held[key]
        n = self.agent_ids.get(node, 1)
        taken = {v for (t, a), v in self._held.items() if a == node and t != key[0]}
        for name in [node] if n <= 1 else [f"{node}_{i}" for i in range(n)]:
            if name not in taken:
                self._held[key] = name
                return name
        raise Unsupported(f"more concurrent decisions of {node!r} than instances: GraphRun decides")


def same(a: Any, b: Any) -> bool:
    """Exact equality of observations and outcomes (arrays, dataclasses, containers)."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and same(dataclasses.asdict(a), dataclasses.asdict(b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    return bool(a == b)
