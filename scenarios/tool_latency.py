"""Slow tools on demand: injected tool latency and per-tool timeouts for live episodes.

A :class:`~scenarios.graph_env.GraphEnv` with ``tools=ToolSettings(...)`` (experiment
config ``episodes.tool_latency: {seconds: L, jitter: J}`` and ``episodes.tool_timeout_s``;
env config keys ``tool_latency`` / ``tool_timeout_s``) gives every live episode a
:class:`ToolEpisode`, and every tool call of that episode goes through it:

* **Which calls.** LangChain tools (``BaseTool.invoke`` / ``ainvoke``: the tools of a
  ``ToolNode``, sync or async, and tools a node invokes itself; :func:`install` patches the two
  methods once, and they act only inside an episode that has settings), and a scenario's own
  tool functions called through :func:`tool_call` (``toolchain``, ``text-toolchain``). Both
  engines: the LangGraph path finds the episode in the run config (:data:`TOOLS_KEY`), the
  fast path on its bridge (``SteppedRun(tools=...)``).
* **Latency.** Each call first waits ``L`` seconds, or ``L ± J`` drawn uniformly from an RNG
  of the episode's own (seeded with ``[episode seed, SALT]``): the scenario's RNG is never
  touched, so an episode is the same with and without latency. Sync calls ``time.sleep``,
  async calls ``await asyncio.sleep`` (in an async app the event loop of the episode's thread
  waits). Counterfactual replays and the fast path's LangGraph replay after a fallback run
  without latency (timeouts still apply, and a call that timed out in the fast run raises
  :class:`ToolTimeout` at once in the replay instead of running again: see below).
* **Timeouts.** With ``timeout_s``, a call (its latency included) longer than that raises
  :class:`ToolTimeout` inside the tool call: a sync call runs on a daemon helper thread and is
  waited on (a hung tool's helper thread is left behind, blocked); an async one runs under
  ``asyncio.timeout``. An async tool that blocks its loop (``time.sleep`` in ``async def``)
  cannot be interrupted: the stepper's ``call_timeout_s`` (:mod:`scenarios.in_flight`) or the
  episode's wall-clock limit is the guard there.
* **Where a timeout goes.** ``ToolTimeout`` is an ``Exception`` raised where the tool's own
  error would be. A ``ToolNode`` with the default ``handle_tool_errors`` re-raises it, so the
  node fails and the episode ends truncated with ``infos[agent]["failure"] == "error"`` and
  ``infos[agent]["error"] == "node 'tools' raised ToolTimeout: tool 'x' ran longer than
  tool_timeout_s=…"``; a ``ToolNode(..., handle_tool_errors=True)`` turns it into an error
  ``ToolMessage`` that the agent reads, and the episode goes on. A scenario tool
  (``toolchain``) raises out of its node: a failed episode, as above.

* **A timed-out call is made once.** Each live call has an ordinal (its place among the
  episode's live calls). When live call ``k``, a call of tool ``x``, timed out, the replay of
  a fast run that falls back (:mod:`scenarios.stepped`, paused: no latency) raises the same
  ``ToolTimeout`` at its own ``k``-th call, when that is a call of ``x``, without calling the
  tool: LangGraph ends the episode exactly as it would have, and the hung tool's wait is not
  paid twice.
* **Tool wait** (``timers/tool_wait_s``): every call through a :class:`ToolEpisode` (its
  latency and its run time, up to its timeout; replays too) is timed on
  :data:`scenarios.clocks.TOOL_CLOCK`, the wall time during which at least one tool call of
  this process was running. A call the caller stopped waiting for (its timeout) stops counting
  then. Tools of an env without tool settings are not wrapped, so not timed.

:attr:`ToolEpisode.calls`, :attr:`ToolEpisode.waited_s` and :attr:`ToolEpisode.timeouts` count
the episode's live tool calls, injected seconds and timed-out calls (``GraphEnv.tool_episode``).
This module imports neither LangGraph nor LangChain (experiment configs use
:class:`ToolLatency`); :func:`install` does, on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from scenarios.clocks import TOOL_CLOCK
from topologies.errors import MarlError

#: the run-config ``configurable`` key of the episode's :class:`ToolEpisode` (LangGraph path)
TOOLS_KEY = "__marl_tools__"
#: mixed into the latency RNG's seed, so it never equals a stream the scenario draws from
SALT = 0x7001_5EED


class ToolTimeout(MarlError):
    """A tool call ran longer than ``tool_timeout_s`` (see the module doc)."""


def _seconds(name: str, value: Any, fix: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}: {fix}")
    if value < 0:
        raise ValueError(f"{name} must be ≥ 0 seconds, got {value!r}: {fix}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class ToolLatency:
    """The wait injected before every tool call: ``seconds`` ± ``jitter`` (uniform).

    Attributes:
        seconds: the mean latency, ≥ 0.
        jitter: half-width of the uniform jitter, in ``[0, seconds]`` (a wait is never negative).

    Raises:
        ValueError: a negative, non-finite or non-numeric value, or ``jitter > seconds``.
    """

    seconds: float = 0.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        fix = "give tool_latency as {seconds: L, jitter: J} with 0 ≤ J ≤ L"
        _seconds("seconds", self.seconds, fix)
        _seconds("jitter", self.jitter, fix)
        if self.jitter > self.seconds:
            raise ValueError(
                f"jitter={self.jitter:g} > seconds={self.seconds:g} would draw negative waits: "
                "use a jitter ≤ seconds"
            )

    @classmethod
    def of(cls, spec: ToolLatency | Mapping[str, Any] | float | None) -> ToolLatency | None:
        """A latency from a spec: itself, ``{seconds, jitter}``, a number of seconds, or None."""
        if spec is None or isinstance(spec, ToolLatency):
            return spec
        if isinstance(spec, Mapping):
            unknown = sorted(set(spec) - {"seconds", "jitter"})
            if unknown:
                raise ValueError(
                    f"tool_latency has unknown field(s) {unknown}: give {{seconds: L, jitter: J}}"
                )
            return cls(**spec)
        return cls(seconds=spec)  # type: ignore[arg-type]

    def draw(self, rng: Any) -> float:
        """One wait: ``seconds`` exactly, or uniform in ``seconds ± jitter`` from ``rng``."""
        if not self.jitter:
            return self.seconds
        return self.seconds + self.jitter * (2.0 * float(rng.random()) - 1.0)


@dataclasses.dataclass(frozen=True)
class ToolSettings:
    """What a :class:`~scenarios.graph_env.GraphEnv`'s episodes do to tool calls (``env.tools``).

    Attributes:
        latency: the injected wait (None: none).
        timeout_s: seconds a call may take (its latency included) before :class:`ToolTimeout`
            (None: no limit).
    """

    latency: ToolLatency | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.timeout_s is not None:
            t = _seconds("tool_timeout_s", self.timeout_s, "give a positive number or None")
            if t == 0:
                raise ValueError("tool_timeout_s must be > 0 seconds, or None for no limit")

    @classmethod
    def of(
        cls, latency: ToolLatency | Mapping[str, Any] | float | None, timeout_s: float | None
    ) -> ToolSettings | None:
        """Settings from env-config values; None when neither is set."""
        if latency is None and timeout_s is None:
            return None
        return cls(ToolLatency.of(latency), timeout_s)

    def episode(self, seed: int) -> ToolEpisode:
        """The tool calls of the episode with ``seed`` (installs the LangChain hook)."""
        install()
        return ToolEpisode(self, seed)


class ToolEpisode:
    """One episode's tool calls: the latency RNG, the counters, and the calls themselves.

    Calls may come from several threads (a ``ToolNode`` runs sync tools on a thread pool): the
    RNG and counters are guarded by a lock; which call draws which wait then depends on
    scheduling, never the episode's content.
    """

    def __init__(self, settings: ToolSettings, seed: int) -> None:
        self.settings = settings
        self.seed = seed
        self.calls = 0  #: tool calls made so far (replays without latency not counted)
        self.waited_s = 0.0  #: injected latency so far, seconds
        self.timeouts = 0  #: calls that ran into ``tool_timeout_s`` (replays not counted)
        self._rng: Any = None
        self._lock = threading.Lock()
        self._paused = 0
        self._replayed = 0  # calls made in the current replay
        self._timed_out: set[tuple[int, str]] = set()  # (ordinal, tool) of live calls

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No latency (and no counting) meanwhile: a replay redoing calls already made (a call
        that timed out raises again at once, see the module doc)."""
        with self._lock:
            if not self._paused:
                self._replayed = 0
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    def delay(self) -> float:
        """The wait of the next call (0 while paused); counts the call."""
        return self._next("")[0]

    def _next(self, name: str) -> tuple[float, int | None]:
        """``(wait, ordinal)`` of the next call of tool ``name`` (ordinal None in a replay).

        Raises:
            ToolTimeout: in a replay, the call whose live twin timed out.
        """
        latency = self.settings.latency
        with self._lock:
            if self._paused:
                k, self._replayed = self._replayed, self._replayed + 1
                if (k, name) in self._timed_out:
                    raise self._timeout_error(name)
                return 0.0, None
            k, self.calls = self.calls, self.calls + 1
            if latency is None:
                return 0.0, k
            if latency.jitter and self._rng is None:
                import numpy as np

                self._rng = np.random.default_rng([self.seed, SALT])
            wait = latency.draw(self._rng)
            self.waited_s += wait
            return wait, k

    def _timed_out_at(self, k: int | None, name: str) -> ToolTimeout:
        """Record that live call ``k`` of ``name`` timed out; the error to raise."""
        if k is not None:
            with self._lock:
                self.timeouts += 1
                self._timed_out.add((k, name))
        return self._timeout_error(name)

    def _timeout_error(self, name: str) -> ToolTimeout:
        return ToolTimeout(
            f"tool {name!r} ran longer than tool_timeout_s={self.settings.timeout_s:g} s "
            "(episodes.tool_timeout_s): fix the tool that hangs or raise the limit"
        )

    def call(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run sync tool call ``fn`` with the episode's latency and timeout (timed on
        :data:`~scenarios.clocks.TOOL_CLOCK`)."""
        wait, k = self._next(name)
        timeout = self.settings.timeout_s

        def body() -> Any:
            if wait:
                time.sleep(wait)
            return fn()

        with TOOL_CLOCK.timing():
            if timeout is None:
                return body()
            return _on_helper_thread(body, timeout, lambda: self._timed_out_at(k, name), name)

    async def acall(self, name: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """Await async tool call ``make()`` with the episode's latency and timeout (timed on
        :data:`~scenarios.clocks.TOOL_CLOCK`)."""
        wait, k = self._next(name)
        timeout = self.settings.timeout_s

        async def body() -> Any:
            if wait:
                await asyncio.sleep(wait)
            return await make()

        with TOOL_CLOCK.timing():
            if timeout is None:
                return await body()
            deadline = asyncio.timeout(timeout)
            try:
                async with deadline:
                    return await body()
            except TimeoutError:
                if deadline.expired():
                    raise self._timed_out_at(k, name) from None
                raise


def _on_helper_thread(
    body: Callable[[], Any], timeout: float, error: Callable[[], BaseException], name: str
) -> Any:
    """``body()`` on a daemon thread (in a copy of this context), waited on ``timeout`` s."""
    done = threading.Event()
    box: dict[str, Any] = {}
    context = contextvars.copy_context()

    def run() -> None:
        try:
            box["value"] = context.run(body)
        except BaseException as exc:  # handed to the waiting caller
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"marl-tool-{name}", daemon=True).start()
    if not done.wait(timeout):
        raise error()  # the helper thread is left behind: a daemon, never joined
    if "error" in box:
        raise box["error"]
    return box["value"]


def active(config: Mapping[str, Any] | None = None) -> ToolEpisode | None:
    """The :class:`ToolEpisode` of the episode running here (None: none, or no settings).

    Looks at the fast path's bridge, then ``config`` (or LangGraph's run config) for
    :data:`TOOLS_KEY`.
    """
    from scenarios.replay import FAST_BRIDGE

    fast = FAST_BRIDGE.get()
    if fast is not None:
        return getattr(fast, "tools", None)
    if config is None:
        from langgraph.config import get_config

        try:
            config = get_config()
        except RuntimeError:  # not inside a runnable
            return None
    return (config.get("configurable") or {}).get(TOOLS_KEY)


def tool_call(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` as tool call ``name`` of the running episode: with its latency
    and timeout when the env has tool settings, else a plain call. For a scenario's own tools
    (tools that are functions inside a node rather than LangChain tools)."""
    episode = active()
    if episode is None:
        return fn(*args, **kwargs)
    return episode.call(name, functools.partial(fn, *args, **kwargs))


_installed = threading.Lock()
_state = {"installed": False}


def install() -> None:
    """Route ``BaseTool.invoke`` / ``ainvoke`` through the running episode's
    :class:`ToolEpisode` (idempotent; outside such an episode the tools run as before)."""
    with _installed:
        if _state["installed"]:
            return
        from langchain_core.tools import BaseTool

        invoke, ainvoke = BaseTool.invoke, BaseTool.ainvoke

        @functools.wraps(invoke)
        def timed_invoke(self: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
            episode = active(config)
            if episode is None:
                return invoke(self, input, config, **kwargs)
            return episode.call(self.name, lambda: invoke(self, input, config, **kwargs))

        @functools.wraps(ainvoke)
        async def timed_ainvoke(self: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
            episode = active(config)
            if episode is None:
                return await ainvoke(self, input, config, **kwargs)
            return await episode.acall(self.name, lambda: ainvoke(self, input, config, **kwargs))

        BaseTool.invoke = timed_invoke  # type: ignore[method-assign]
        BaseTool.ainvoke = timed_ainvoke  # type: ignore[method-assign]
        _state["installed"] = True


__all__ = [
    "SALT",
    "TOOLS_KEY",
    "ToolEpisode",
    "ToolLatency",
    "ToolSettings",
    "ToolTimeout",
    "active",
    "install",
    "tool_call",
]
