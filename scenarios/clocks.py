"""Process-wide phase clocks (``timers/…`` in ``metrics.jsonl``), safe to use from any thread.

Why process-wide, not passed: the envs that add to them are built by RLlib inside each env
runner from a pickled env config (a clock, holding a lock, cannot travel in it), and the tool
calls that time themselves run deep inside user graphs, while the reader
(``trainers.phase_timers``, in the same process) holds no reference to either: no call path
links writer and reader, so each process keeps one of each.

* :class:`Clock`: a running sum of seconds (:meth:`Clock.add`, under a lock). A thread that
  called :meth:`Clock.mute` adds nothing: its time is counted elsewhere. The env threads of a
  :class:`~scenarios.in_flight.Stepper` mute :data:`ENV_CLOCK`, because their calls overlap;
  the time the sampler's thread is blocked waiting for them is the env time instead.
* :class:`BusyClock`: wall seconds during which at least one timed call was running
  (overlapping calls count once). Read over any interval it never exceeds that interval's
  wall time. A call still running is counted up to the moment of reading.

:data:`ENV_CLOCK` (``timers/env_s``: ``GraphEnv.reset``/``step`` in the sampler's thread, or
the sampler's wait for env threads) and :data:`TOOL_CLOCK` (``timers/tool_wait_s``: the tool
calls of :mod:`scenarios.tool_latency`) are this process's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator


class Clock:
    """Seconds spent in a phase: a running sum (``seconds``), added to from any thread."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()
        self._local = threading.local()

    def add(self, seconds: float) -> None:
        """Add ``seconds``, unless this thread is muted."""
        if getattr(self._local, "muted", False):
            return
        with self._lock:
            self.seconds += seconds

    def mute(self) -> None:
        """From now on this thread adds nothing (its time is counted elsewhere)."""
        self._local.muted = True


class BusyClock:
    """Wall seconds during which at least one call between :meth:`enter` and :meth:`exit` ran.

    Args:
        now: the time source (``time.perf_counter``; tests give a fake one).
    """

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self._lock = threading.Lock()
        self._running = 0
        self._since = 0.0  # when the running calls began (the first of them)
        self._closed = 0.0  # seconds of the busy spans already over

    @property
    def seconds(self) -> float:
        """Busy seconds so far, the span in progress included (never decreases)."""
        with self._lock:
            return self._closed + (self._now() - self._since if self._running else 0.0)

    def enter(self) -> None:
        with self._lock:
            if not self._running:
                self._since = self._now()
            self._running += 1

    def exit(self) -> None:
        with self._lock:
            self._running -= 1
            if not self._running:
                self._closed += self._now() - self._since

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Count the ``with`` body as a running call."""
        self.enter()
        try:
            yield
        finally:
            self.exit()


#: seconds the sampler spent on env calls (``timers/env_s``; see the module doc)
ENV_CLOCK = Clock()
#: wall seconds during which a tool call of a live episode was running (``timers/tool_wait_s``)
TOOL_CLOCK = BusyClock()

__all__ = ["ENV_CLOCK", "TOOL_CLOCK", "BusyClock", "Clock"]
