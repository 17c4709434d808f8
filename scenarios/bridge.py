"""The bridge between a running LangGraph graph and an environment's ``step()``.

LangGraph drives the graph; the environment must be able to stop it at every agent decision and
resume it later with the learner's action. Threads and ``interrupt()`` both cost several times the
graph's own run time here, so the bridge runs everything in the caller's thread with greenlets:

* the graph runs in one greenlet (``graph.invoke``), so a single task of a superstep, which
  LangGraph runs inline, suspends by switching straight back to the environment;
* the tasks of a parallel superstep are started by our own ``submit`` (LangGraph's runner hook),
  each in a greenlet; a task that calls ``decide()`` switches back to the graph greenlet, which
  starts the next task;
* LangGraph announces every superstep's tasks before it runs them (its ``tasks`` stream); once
  every announced agent task has started, the superstep's pending agents are exactly the ones
  waiting, and control goes to the environment as one parallel step.

LangGraph's own semantics (reducers, conditional edges, ``Send``, joins, ``Command``) are
untouched: the bridge only decides when a task runs, never what it does. It relies on two
LangGraph-internal hooks (the runner's submit function and the task stream in the run config),
which is why ``langgraph`` is pinned to a minor version.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import greenlet
from langgraph._internal._constants import (
    CONFIG_KEY_RUNNER_SUBMIT,
    CONFIG_KEY_RUNTIME,
    CONFIG_KEY_STREAM,
    CONFIG_KEY_TASK_ID,
)
from langgraph.config import get_config
from langgraph.pregel.protocol import StreamProtocol
from langgraph.runtime import DEFAULT_RUNTIME

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
        self._unstarted: set[str] = set()  # announced agent tasks not yet started
        self._instance: dict[str, str] = {}  # task id → agent id
        self._counts: dict[str, int] = {}  # fan-out instances announced per node this superstep
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
            CONFIG_KEY_STREAM: StreamProtocol(self._on_stream, {"tasks"}),
            CONFIG_KEY_RUNTIME: DEFAULT_RUNTIME,
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

    def _on_stream(self, chunk: tuple[tuple[str, ...], str, Any]) -> None:
        ns, _mode, payload = chunk
        if ns or payload.get("name") not in self.agent_nodes:
            return  # only the root graph's agent tasks matter
        if "input" not in payload:  # a task's result: it may have finished without deciding
            self._unstarted.discard(payload["id"])
            return
        node = payload["name"]
        if not self._unstarted and not self._waiting:  # first announcement of a superstep
            self.superstep += 1
            self._counts.clear()
        self._unstarted.add(payload["id"])
        i = self._counts.get(node, 0)
        self._counts[node] = i + 1
        self._instance[payload["id"]] = f"{node}_{i}" if self.agent_nodes[node] > 1 else node

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
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def body() -> None:
            try:
                fut.set_result(fn(*args, **kwargs))
            except EpisodeAborted:
                raise
            except BaseException as exc:
                fut.set_exception(exc)

        task_glet = greenlet.greenlet(body, parent=greenlet.getcurrent())
        task_glet.gr_context = contextvars.copy_context()
        task_glet.switch()
        if not self._unstarted:
            self._drain()
        return fut

    def _drain(self) -> None:
        """Hand the superstep's pending agents to the environment until none is left."""
        while self.pending:
            assert self._env_glet is not None
            self._env_glet.switch()
            for agent in list(self.actions):
                self._waiting.pop(agent).switch()

    def decide(self, node: str, observation: Any) -> Any:
        """Called by ``scenarios.decide`` inside an agent node."""
        task_id = get_config()["configurable"].get(CONFIG_KEY_TASK_ID)
        agent = self._instance.get(task_id, node)
        self._unstarted.discard(task_id)
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
