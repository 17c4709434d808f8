"""Envs in flight: start ``reset``/``step`` calls on many envs, collect whichever finish first.

An episode that waits on a slow tool (or a model call) must not hold the others. A sampler
(``trainers/sampling/batched_runner.py``) drives a :class:`Stepper` over its sub-envs:

.. code-block:: python

    stepper = Stepper(envs, threads=True, call_timeout_s=60)
    for i in range(len(envs)):
        stepper.start_reset(i, seed=i)
    while ...:
        for done in stepper.wait():            # ≥ 1 finished call, sorted by env index
            if done.error is not None: ...     # the caller decides (CallTimeout: replace(i, env))
            obs, *rest = done.result           # reset: (obs, infos); step: the 5-tuple
            stepper.start_step(done.index, actions)
    stepper.close()

Contract:

* ``envs`` are RLlib-view envs (``scenarios.rllib_env.RLlibGraphEnv``,
  ``trainers.sampling.grouped_env.GroupedEnv``): ``reset(seed=..., options=...)`` → ``(obs,
  infos)``,
  ``step(actions)`` → ``(obs, rewards, terminateds, truncateds, infos)``, ``close()``.
* One call in flight per env: ``start_*`` on a busy env raises ``RuntimeError``.
* ``threads=False`` (default): a call runs at once in the caller's thread; :meth:`wait` returns
  the calls started since the last ``wait()`` (deterministic, no overhead).
* ``threads=True``: each env gets its own daemon thread for its whole life in the stepper (the
  greenlet bridge, :mod:`scenarios.bridge`, runs a graph's greenlets in the thread that created
  them: an env is never stepped from two threads); its calls run there and :meth:`wait` returns
  as soon as any call is done. Sync tools then wait in their env's thread and async apps on
  their thread's event loop, so N envs wait on their tools at once. An episode in progress
  cannot move to another thread, so an env is closed when it is handed over (in the caller's
  thread, which aborts an episode the caller started: RLlib's env checker steps one) and its
  first call must be ``start_reset``.
* An exception raised by a call comes back in :attr:`Done.error` (with a note naming the env
  index and the call), never raised by :meth:`wait`.
* ``call_timeout_s`` (``threads=True`` only): a call running longer comes back as
  ``Done(error=CallTimeout(...))`` and its env's slot is **retired**: nothing can be started on
  it until :meth:`replace` gives it a new env (and a new thread); the stuck thread is left
  behind as a daemon and anything it returns later is dropped — a hung call never hangs the
  sampler. (``GraphEnv``'s own wall-clock limit interrupts a blocked node only in the main
  thread; in a worker thread it is checked when the graph hands decisions back, so this deadline
  and ``episodes.tool_timeout_s`` are the guards there.)
* Env time (:data:`scenarios.clocks.ENV_CLOCK`, ``timers/env_s``): without threads the calls
  run in the caller's thread and ``GraphEnv`` times them itself. With threads, calls of
  several envs overlap, so the env threads are muted on the clock and the time the caller is
  blocked in :meth:`wait` is added instead: env time is then the caller's wall time spent
  waiting for envs, never more than the caller's own wall time.
* :meth:`close` closes the envs (each in its own thread) and ends every thread; a call still in
  flight is waited for up to its deadline, else its thread (a daemon) closes its env and ends
  when the call returns: ``close()`` never hangs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from scenarios.clocks import ENV_CLOCK
from topologies.errors import MarlError

RESET, STEP = "reset", "step"
_CLOSE: Any = object()  # a worker's last job


class CallTimeout(MarlError, TimeoutError):
    """A ``reset``/``step`` call ran longer than the stepper's ``call_timeout_s``."""


@dataclasses.dataclass
class Done:
    """One finished call.

    Attributes:
        index: the env's index.
        kind: ``"reset"`` or ``"step"``.
        result: what the call returned (``(obs, infos)`` or the 5-tuple); None on an error.
        error: the exception it raised (or a :class:`CallTimeout`); None when it returned.
        seconds: wall-clock seconds from start to finish (to the deadline for a timeout).
    """

    index: int
    kind: str
    result: tuple[Any, ...] | None
    error: BaseException | None
    seconds: float = 0.0


class _Slot:
    """One env, its thread (``threads=True``) and its call in flight."""

    def __init__(self, index: int, env: Any, threaded: bool, results: queue.SimpleQueue) -> None:
        self.index = index
        self.env = env
        self.call: tuple[str, float] | None = None  # (kind, start) of the call in flight
        self.deadline: float | None = None
        self.retired = False
        self.reset_done = not threaded  # with threads: start_reset must come first
        self.close_error: BaseException | None = None
        self.jobs: queue.SimpleQueue[Any] | None = None
        self.thread: threading.Thread | None = None
        if threaded:
            env.close()  # hand-over: an episode in progress stays with this thread's greenlets
            self.jobs = queue.SimpleQueue()
            self.thread = threading.Thread(
                target=self._work, args=(results,), name=f"marl-env-{index}", daemon=True
            )
            self.thread.start()

    def run(self, kind: str, args: Any, catch: type[BaseException] = Exception) -> Done:
        """Make one call here; an exception of type ``catch`` comes back in ``Done.error``."""
        start = time.perf_counter()
        try:
            if kind == RESET:
                result = self.env.reset(seed=args[0], options=args[1])
            else:
                result = self.env.step(args)
        except catch as exc:
            exc.add_note(f"(in env {self.index}'s {kind}())")
            return Done(self.index, kind, None, exc, time.perf_counter() - start)
        return Done(self.index, kind, tuple(result), None, time.perf_counter() - start)

    def _work(self, results: queue.SimpleQueue) -> None:
        assert self.jobs is not None
        ENV_CLOCK.mute()  # overlapping calls: the caller's wait() is the env time (module doc)
        while True:
            job = self.jobs.get()
            if job is _CLOSE:
                try:
                    self.env.close()
                except BaseException as exc:  # raised by Stepper.close in the caller's thread
                    self.close_error = exc
                return
            results.put((self, self.run(*job, catch=BaseException)))  # nothing is lost here


class Stepper:
    """Start env calls and wait for whichever finish first (see the module doc).

    Args:
        envs: RLlib-view envs, one slot each (index = position).
        threads: run each env's calls on its own thread (else at once, in the caller's).
        call_timeout_s: seconds a call may run before it comes back as a :class:`CallTimeout`
            and its slot is retired (``threads=True`` only; None: no limit).

    Raises:
        ValueError: ``call_timeout_s`` without threads (a call in the caller's thread cannot be
            abandoned), or not a positive number.
    """

    def __init__(
        self, envs: Sequence[Any], *, threads: bool = False, call_timeout_s: float | None = None
    ) -> None:
        if call_timeout_s is not None:
            if not threads:
                raise ValueError(
                    "call_timeout_s needs threads=True: a call running in the caller's thread "
                    "cannot be abandoned (there, GraphEnv's episode_timeout_s is the limit)"
                )
            if not call_timeout_s > 0:
                raise ValueError(
                    f"call_timeout_s must be > 0 seconds or None, got {call_timeout_s}"
                )
        self.threads = bool(threads)
        self.call_timeout_s = call_timeout_s
        self._results: queue.SimpleQueue[tuple[_Slot, Done | None]] = queue.SimpleQueue()
        self._slots = [_Slot(i, env, self.threads, self._results) for i, env in enumerate(envs)]
        self._done: list[Done] = []  # finished, not yet returned by wait()
        self._closed = False

    # ----- starting calls ------------------------------------------------------------------
    def start_reset(
        self, i: int, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> None:
        """Begin env ``i``'s ``reset(seed=seed, options=options)``."""
        self._start(i, RESET, (seed, None if options is None else dict(options)))

    def start_step(self, i: int, actions: Mapping[str, Any]) -> None:
        """Begin env ``i``'s ``step(actions)``."""
        self._start(i, STEP, actions)

    def _start(self, i: int, kind: str, args: Any) -> None:
        slot = self._slot(i)
        if slot.retired:
            raise RuntimeError(
                f"env {i}'s slot was retired after a call timed out: give it a new env with "
                f"replace({i}, env) first"
            )
        if slot.call is not None:
            raise RuntimeError(
                f"env {i} already has a {slot.call[0]}() in flight: wait() for it first"
            )
        if kind == STEP and not slot.reset_done:
            raise RuntimeError(
                f"start_step({i}, ...) before start_reset({i}): with threads an env's episodes "
                "start in its own thread (an episode begun elsewhere cannot move there)"
            )
        slot.reset_done = True
        now = time.perf_counter()
        slot.call = (kind, now)
        if slot.jobs is None:
            self._done.append(slot.run(kind, args))
            slot.call = None
            return
        slot.deadline = None if self.call_timeout_s is None else now + self.call_timeout_s
        slot.jobs.put((kind, args))

    # ----- collecting them -----------------------------------------------------------------
    @property
    def in_flight(self) -> list[int]:
        """Indices of envs with a call started and not yet returned by :meth:`wait`."""
        busy = {d.index for d in self._done}
        return sorted({s.index for s in self._slots if s.call is not None} | busy)

    def wait(self) -> list[Done]:
        """Block until at least one started call has finished; return every finished one,
        sorted by env index.

        Raises:
            RuntimeError: no call is in flight (nothing to wait for).
        """
        if not self._done and not any(s.call is not None for s in self._slots):
            raise RuntimeError("wait() with no call in flight: start_reset/start_step first")
        start = time.perf_counter()
        while not self._done:
            deadlines = [s.deadline for s in self._slots if s.deadline is not None]
            block = None if not deadlines else max(0.0, min(deadlines) - time.perf_counter())
            with contextlib.suppress(queue.Empty):
                self._accept(*self._results.get(timeout=block))
            self._drain()
            self._expire()
        if self.threads:
            ENV_CLOCK.add(time.perf_counter() - start)
        out, self._done = self._done, []
        return sorted(out, key=lambda d: d.index)

    def _accept(self, slot: _Slot, done: Done | None) -> None:
        if done is None or slot.retired or self._slots[slot.index] is not slot:
            return  # a late answer of a retired slot (or a close acknowledgement)
        slot.call, slot.deadline = None, None
        self._done.append(done)

    def _drain(self) -> None:
        while True:
            try:
                self._accept(*self._results.get_nowait())
            except queue.Empty:
                return

    def _expire(self) -> None:
        now = time.perf_counter()
        for slot in self._slots:
            if slot.deadline is None or now < slot.deadline or slot.call is None:
                continue
            kind, start = slot.call
            error = CallTimeout(
                f"env {slot.index}'s {kind}() ran longer than call_timeout_s="
                f"{self.call_timeout_s:g} s: its slot is retired and its thread left behind "
                f"(a daemon); give the slot a new env with replace({slot.index}, env)"
            )
            slot.retired = True
            slot.call, slot.deadline = None, None
            self._done.append(Done(slot.index, kind, None, error, now - start))

    # ----- slots ---------------------------------------------------------------------------
    def replace(self, i: int, env: Any) -> None:
        """Give slot ``i`` a new env (and, with threads, a new thread).

        The slot must be idle or retired. An idle slot's old env is closed in its own thread;
        a retired one's is left to its stuck thread.
        """
        slot = self._slot(i)
        if slot.call is not None and not slot.retired:
            raise RuntimeError(f"env {i} has a {slot.call[0]}() in flight: wait() for it first")
        self._close_slot(slot)
        self._slots[i] = _Slot(i, env, self.threads, self._results)

    @property
    def envs(self) -> list[Any]:
        """The envs, by index (after :meth:`replace`, the new ones)."""
        return [s.env for s in self._slots]

    def close(self) -> None:
        """Close every env in its own thread and end the threads. A call still in flight is
        waited for up to its deadline; past it, or with no deadline, its thread (a daemon) is
        left to close its env and end when the call returns — close never hangs."""
        if self._closed:
            return
        self._closed = True
        for slot in self._slots:
            self._close_slot(slot)

    def _close_slot(self, slot: _Slot) -> None:
        """Close the slot's env in its thread, which then ends; a retired slot's thread does
        that once (if ever) its hung call returns, and is not waited for."""
        if slot.jobs is None:
            slot.env.close()
            return
        slot.jobs.put(_CLOSE)  # after the call in flight, if any
        if slot.retired:
            return
        busy = slot.call is not None
        slot.retired = True  # its answers, if any still come, are dropped
        if busy and slot.deadline is None:
            return  # no deadline to wait for: the thread ends after its call
        left = None if slot.deadline is None else max(0.0, slot.deadline - time.perf_counter())
        assert slot.thread is not None
        slot.thread.join(left)  # past its deadline a call is hung: its daemon thread stays
        if slot.close_error is not None:
            raise slot.close_error

    def _slot(self, i: int) -> _Slot:
        if self._closed:
            raise RuntimeError("the stepper is closed")
        if not 0 <= i < len(self._slots):
            raise IndexError(f"env index {i} out of range: the stepper has {len(self._slots)} envs")
        return self._slots[i]

    def __len__(self) -> int:
        return len(self._slots)

    def __enter__(self) -> Stepper:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


__all__ = ["RESET", "STEP", "CallTimeout", "Done", "Stepper"]
