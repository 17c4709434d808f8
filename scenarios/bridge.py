"""The bridge between a running LangGraph graph and an environment's ``step()``.

LangGraph drives the graph; the environment must be able to stop it at every agent decision and
resume it later with the learner's action. Threads and ``interrupt()`` both cost several times the
graph's own run time here, so the bridge runs everything in the caller's thread with greenlets:

* the graph runs in one greenlet (``graph.invoke``), so a single task of a superstep, which
  LangGraph runs inline, suspends by switching straight back to the environment;
* the tasks of a parallel superstep are started by our own ``submit`` (LangGraph's runner hook),
  each in a greenlet; a task that calls ``decide()`` switches back to the graph greenlet, which
  starts the next task;
* the first ``submit`` of a superstep reads the superstep's task list from LangGraph's scheduler
  (``PregelRunner.tick``); once every agent task in it has started, the superstep's pending
  agents are exactly the ones waiting, and control goes to the environment as one parallel step.

LangGraph's own semantics (reducers, conditional edges, ``Send``, joins, ``Command``) are
untouched: the bridge only decides when a task runs, never what it does. It relies on two
LangGraph internals (the runner's submit hook in the run config, and the ``tasks`` local of
``PregelRunner.tick``), which is why ``langgraph`` is pinned to a minor version and
``tests/test_engine.py`` exercises every scheduling pattern.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any

import greenlet
from langgraph._internal._constants import CONFIG_KEY_RUNNER_SUBMIT, CONFIG_KEY_TASK_ID
from langgraph.config import get_config
from langgraph.pregel._runner import PregelRunner

#: the code of LangGraph's superstep scheduler, whose frame lists the superstep's tasks
_TICK_CODE = PregelRunner.tick.__code__

BRIDGE_KEY = "__marl_bridge__"


class SkipNode(Exception):
    """Raised by ``decide()`` for an agent absent under ``absent="skip"``: its node writes nothing.

    Passing the class itself as an agent's action makes that agent's ``decide()`` raise it.
    """


class EpisodeAborted(BaseException):
    """Thrown into a suspended graph to end it (a reset before the episode finished)."""


@dataclasses.dataclass
class Request:
    """One agent waiting for its action."""

    agent: str
    node: str
    observation: Any
    superstep: int


class GraphRun:
    """One episode of a compiled graph, suspended at every agent decision.

    Args:
        graph: a compiled LangGraph graph whose agent nodes call ``scenarios.decide``.
        inputs: the graph's input.
        agent_nodes: node name → max fan-out instances, for every agent node.
        config: extra run config (``recursion_limit``, ``configurable`` entries).
    """

    def __init__(
        self,
        graph: Any,
        inputs: Any,
        agent_nodes: Mapping[str, int],
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.graph = graph
        self.inputs = inputs
        self.agent_nodes = dict(agent_nodes)
        self.config = dict(config or {})
        self.pending: dict[str, Request] = {}
        self.actions: dict[str, Any] = {}
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.superstep = 0
        self.team_reward = 0.0
        self.agent_rewards: dict[str, float] = {}
        self._unstarted: set[str] = set()  # agent tasks of this superstep not yet started
        self._instance: dict[str, str] = {}  # task id → agent id
        self._step_tasks: tuple[Any, ...] | None = None  # tasks of the current parallel superstep
        self._waiting: dict[str, greenlet.greenlet] = {}  # agent → its suspended task greenlet
        self._env_glet: greenlet.greenlet | None = None
        self._graph_glet: greenlet.greenlet | None = None

    # ----- environment side ----------------------------------------------------------------
    def start(self) -> dict[str, Request]:
        """Run the graph until its first decisions (or its end); return the pending requests."""
        self._env_glet = greenlet.getcurrent()
        self._graph_glet = greenlet.greenlet(self._main, parent=self._env_glet)
        self._graph_glet.switch()
        return self.pending

    def resume(self, actions: Mapping[str, Any]) -> dict[str, Request]:
        """Give every pending agent its action; run to the next decisions or the end."""
        missing = set(self.pending) - set(actions)
        if missing:
            raise ValueError(f"no action for pending agents {sorted(missing)}")
        self.actions = {a: actions[a] for a in self.pending}
        self.pending = {}
        self._env_glet = greenlet.getcurrent()
        assert self._graph_glet is not None
        self._graph_glet.parent = self._env_glet
        self._graph_glet.switch()
        return self.pending

    def abort(self) -> None:
        """End a suspended run: unwind the graph greenlet; waiting task greenlets are dropped."""
        glet = self._graph_glet
        self._waiting.clear()
        self.pending = {}
        if glet is not None and not glet.dead:
            glet.parent = greenlet.getcurrent()
            with contextlib.suppress(EpisodeAborted):
                glet.throw(EpisodeAborted)
        self.finished = True

    # ----- graph side ----------------------------------------------------------------------
    def _main(self) -> None:
        configurable = {
            **self.config.get("configurable", {}),
            BRIDGE_KEY: self,
            CONFIG_KEY_RUNNER_SUBMIT: lambda: self._submit,
        }
        try:
            self.result = self.graph.invoke(
                self.inputs, config={**self.config, "configurable": configurable}
            )
        except EpisodeAborted:
            pass
        except Exception as exc:  # a node raised: the episode ends, the error is kept
            self.error = exc
        self.finished = True

    def _submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        __name__: str | None = None,
        __cancel_on_exit__: bool = False,
        __reraise_on_exit__: bool = True,
        __next_tick__: bool = False,
        **kwargs: Any,
    ) -> concurrent.futures.Future[Any]:
        caller = sys._getframe(1)
        if caller.f_code is _TICK_CODE and caller.f_locals.get("tasks") is not self._step_tasks:
            self._new_superstep(caller.f_locals["tasks"])
        task_id = getattr(args[0], "id", None) if args else None
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def body() -> None:
            try:
                fut.set_result(fn(*args, **kwargs))
            except EpisodeAborted:
                raise
            except BaseException as exc:
                fut.set_exception(exc)
            self._unstarted.discard(task_id)  # it may have finished without deciding

        task_glet = greenlet.greenlet(body, parent=greenlet.getcurrent())
        task_glet.gr_context = contextvars.copy_context()
        task_glet.switch()
        if not self._unstarted:
            self._drain()
        return fut

    def _new_superstep(self, tasks: tuple[Any, ...]) -> None:
        """Name the agent tasks of a parallel superstep; all must start before it is handed over."""
        self._step_tasks = tasks
        counts: dict[str, int] = {}
        for t in tasks:
            if t.name in self.agent_nodes:
                i = counts[t.name] = counts.get(t.name, -1) + 1
                self._instance[t.id] = f"{t.name}_{i}" if self.agent_nodes[t.name] > 1 else t.name
                self._unstarted.add(t.id)

    def _drain(self) -> None:
        """Hand the superstep's pending agents to the environment until none is left."""
        while self.pending:
            assert self._env_glet is not None
            self._env_glet.switch()
            for agent in list(self.actions):
                self._waiting.pop(agent).switch()

    def decide(self, node: str, observation: Any) -> Any:
        """Called by ``scenarios.decide`` inside an agent node."""
        config = get_config()
        task_id = config["configurable"].get(CONFIG_KEY_TASK_ID)
        agent = self._instance.get(task_id) or (
            f"{node}_0" if self.agent_nodes.get(node, 1) > 1 else node
        )
        self._unstarted.discard(task_id)
        self.superstep = config["metadata"].get("langgraph_step", self.superstep)
        me = greenlet.getcurrent()
        self.pending[agent] = Request(agent, node, observation, self.superstep)
        if me is self._graph_glet:  # a lone task runs inline in the graph greenlet
            assert self._env_glet is not None
            self._env_glet.switch()
        else:  # a task of a parallel superstep: back to the graph greenlet's submit
            self._waiting[agent] = me
            assert self._graph_glet is not None
            self._graph_glet.switch()
        action = self.actions.pop(agent)
        if action is SkipNode:
            raise SkipNode(agent)
        return action

    def emit_reward(self, value: float, agents: list[str] | None = None) -> None:
        if agents is None:
            self.team_reward += value
        else:
            for a in agents:
                self.agent_rewards[a] = self.agent_rewards.get(a, 0.0) + value
