"""The episode's wall-clock limit: :class:`Alarm`, raising :class:`EpisodeTimeout` in the graph.

``GraphEnv(episode_timeout_s=...)`` (default
:data:`scenarios.engines.DEFAULT_EPISODE_TIMEOUT_S`) bounds the seconds the graph itself runs
in an episode (the time inside ``reset()`` and ``step()``; the policy's time between decisions
does not count). In the process's main thread a ``SIGALRM``
timer interrupts a node that blocks (``time.sleep``, a socket read, a lock) by raising
:class:`EpisodeTimeout` inside it, and fires again every half second until the graph lets go;
elsewhere (Ray Tune runs trials in a thread) the limit is checked each time the graph hands
decisions back, so a node blocked forever is not interrupted there.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import greenlet
from langgraph.config import get_config

from scenarios.stepped import FAST_NODE
from topologies.stdlib_compat import get_signal_handler, set_signal_handler

#: once the limit is reached, the alarm fires again this often until the graph lets go
ALARM_REPEAT_S = 0.5


class EpisodeTimeout(BaseException):
    """The episode's wall-clock limit was reached; raised inside the running graph.

    A ``BaseException`` (like ``KeyboardInterrupt``) so that a node's ``except Exception`` or
    a LangGraph retry policy does not swallow it. Internal control flow, not a ``MarlError``:
    the engine catches it and records the timeout in the episode's infos.
    """


def _alarm_usable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


_SIGALRM = int(signal.SIGALRM)


class Alarm:
    """While the graph runs in the main thread: ``SIGALRM`` after ``seconds``, then every
    :data:`ALARM_REPEAT_S`, raising :class:`EpisodeTimeout` in whichever greenlet is running,
    except ``env`` (the environment's own greenlet, where it only sets :attr:`fired`: the graph
    has already let go; ``None``: raise anywhere). The previous handler and timer are put back
    on exit, an outer timer with its remaining time; an outer timer due first is left alone
    (the check between decisions covers ours). Does nothing outside the main thread or
    without ``seconds``. Entered once per ``reset``/``step``: the handler and timer calls are
    the C ones (:mod:`topologies.stdlib_compat`), ~3 µs a step in all.
    """

    def __init__(
        self, seconds: float | None, describe: Callable[[str | None], str], env: Any
    ) -> None:
        self.seconds = None if seconds is None else max(seconds, 1e-4)  # setitimer(0) disarms
        self.describe = describe
        self.fired = False
        self._active = False
        self._env = env
        self._old_handler: Any = None
        self._old_timer = (0.0, 0.0)
        self._start = 0.0

    def __enter__(self) -> Alarm:
        if self.seconds is None or not _alarm_usable():
            return self
        old = get_signal_handler(_SIGALRM)
        due, _ = signal.getitimer(signal.ITIMER_REAL)
        if old is None or (due and due <= self.seconds):
            return self  # a handler Python cannot put back, or an outer alarm that comes first
        self._old_handler = old
        self._start = time.monotonic()
        set_signal_handler(_SIGALRM, self._handler)
        self._old_timer = signal.setitimer(signal.ITIMER_REAL, self.seconds, ALARM_REPEAT_S)
        self._active = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if not self._active:
            return
        self._active = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        set_signal_handler(_SIGALRM, self._old_handler)
        due, every = self._old_timer
        if due:
            signal.setitimer(
                signal.ITIMER_REAL, max(due - (time.monotonic() - self._start), 1e-4), every
            )

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The alarm stopped meanwhile: its remaining time is kept for afterwards."""
        if not self._active:
            yield
            return
        due, every = signal.setitimer(signal.ITIMER_REAL, 0)
        paused_at = time.monotonic()
        try:
            yield
        finally:
            self._start += time.monotonic() - paused_at
            if due:
                signal.setitimer(signal.ITIMER_REAL, due, every)

    def _handler(self, signum: int, frame: Any) -> None:
        self.fired = True
        if greenlet.getcurrent() is self._env:
            return
        try:
            node = get_config()["metadata"].get("langgraph_node")
        except Exception:  # not inside a LangGraph task: a fast path task's node, or none
            node = FAST_NODE.get()
        raise EpisodeTimeout(self.describe(node))


__all__ = ["ALARM_REPEAT_S", "Alarm", "EpisodeTimeout"]
