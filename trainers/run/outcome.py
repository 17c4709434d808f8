"""What a run produced (:class:`TrainResult`) and how runs fail: :class:`RunFailed` (every episode
failed, or the output is unwritable:
:class:`OutputError`), the telling line of an exception chain (:func:`describe_error`), and
Ctrl-C between iterations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from topologies.errors import MarlError

log = logging.getLogger(__name__)


def os_reason(exc: OSError) -> str:
    """``Read-only file system: /path`` (``str(OSError)`` without the errno)."""
    text = exc.strerror or type(exc).__name__
    return f"{text}: {exc.filename}" if exc.filename else text


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` produced.

    Attributes:
        run_dir: the run directory.
        history: one metrics dict per iteration (the lines of ``metrics.jsonl``).
        final_checkpoint: the checkpoint saved at the end.
        best_checkpoint: the saved checkpoint with the highest smoothed team return.
        best_return: that smoothed team return.
        status: ``"completed"``, or ``"failed: <error>"``.
        curve: the learning-curve PNG (``None`` when plotting is off or failed).
        errors: the distinct errors of failed episodes: ``kind`` (``error`` or ``timeout``),
            ``error`` (the first text), ``count`` and ``first_iteration``.
        models: pool → its Hugging Face directory saved at the end (``output.export_hf``).
        alarms: the monitors' alarms (:class:`trainers.signals.monitors.Alarm` as dicts), in order.
        discovered_agents: agent id → model name, where the scenario found its agents on a dry
            run (``AppScenario`` without ``agents``); empty where they were declared.
    """

    run_dir: Path
    history: list[dict[str, Any]]
    final_checkpoint: Path | None
    best_checkpoint: Path | None
    best_return: float | None
    status: str = "completed"
    curve: Path | None = None
    errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    models: dict[str, Path] = dataclasses.field(default_factory=dict)
    alarms: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    discovered_agents: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def final(self) -> dict[str, Any]:
        """The last iteration's metrics ({} if none ran)."""
        return self.history[-1] if self.history else {}

    @property
    def iterations(self) -> int:
        """Iterations reached (the algorithm's counter)."""
        return int(self.final.get("charts/iteration", 0))

    @property
    def env_steps(self) -> int:
        """Environment steps sampled in total."""
        return int(self.final.get("charts/env_steps", 0))


class RunFailed(MarlError, RuntimeError):
    """The run stopped because every episode failed (see ``episodes.fail_after``).

    Attributes:
        result: the run's :class:`TrainResult` (``status`` ``"failed: …"``), set once the run
            directory is written.
    """

    result: TrainResult | None = None


def describe_error(exc: BaseException, limit: int = 4000) -> str:
    """``Type: message`` of the most telling exception in ``exc``'s chain of causes: the
    deepest :class:`~topologies.errors.MarlError` (the project's errors name the thing and the
    fix), else the root cause; the exceptions it was raised through follow by type
    (``(through RuntimeError)``).
    RLlib re-raises env errors wrapped (``RuntimeError from e``, or a ``ValueError`` of its env
    checker about the gymnasium API), and those messages alone would hide what went wrong."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not x for x in chain) and len(chain) < 10:
        chain.append(e)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    own = [x for x in chain if isinstance(x, MarlError)]
    head = own[-1] if own else chain[-1]
    msg = str(head).strip()
    text = f"{type(head).__name__}: {msg}" if msg else type(head).__name__
    outer = [type(x).__name__ for x in chain[: chain.index(head)]]
    if outer:
        text += f" (through {' ← '.join(reversed(outer))})"
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ----- faults: interrupts, metrics rows, unwritable output -----------------------------------
class OutputError(RunFailed):
    """The run directory could not be written (full disk, read-only file system, quota)."""


#: errnos of a full disk (wherever they come from) and of an unwritable file (in the run dir)
FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
DENIED_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}


def output_error(exc: BaseException, run: Path) -> OutputError | None:
    """An :class:`OutputError` (one line: what, where, the fix) when ``exc`` or one of its
    causes is an ``OSError`` of a full disk, or of a file in ``run`` that cannot be written;
    else None."""
    e: BaseException | None = exc
    for _ in range(10):
        if e is None:
            return None
        if isinstance(e, OSError) and (
            e.errno in FULL_ERRNOS
            or (e.errno in DENIED_ERRNOS and run in Path(str(e.filename or "/")).parents)
        ):
            return OutputError(
                f"cannot write the run directory {run} ({os_reason(e)}): free space or choose "
                f"a writable output.dir (--output); the run continues from its last checkpoint "
                f"with: marl run --resume {run}"
            )
        e = e.__cause__ or e.__context__
    return None


@contextlib.contextmanager
def logged_os_error(what: str) -> Iterator[None]:
    """Writing ``what`` at the end of a run: an ``OSError`` is one warning, never a traceback
    hiding the run's own error."""
    try:
        yield
    except OSError as exc:
        log.warning("could not write %s: %s", what, os_reason(exc))


def append_row(file: Any, row: Mapping[str, Any]) -> None:
    """Append one iteration's metrics and make them durable before any checkpoint of it."""
    file.write(json.dumps(row) + "\n")
    file.flush()
    os.fsync(file.fileno())


@contextlib.contextmanager
def interrupt_between_iterations() -> Iterator[Callable[[], None]]:
    """Defer Ctrl-C (SIGINT) and SIGTERM to the end of the running iteration; yields
    ``check()``, which raises ``KeyboardInterrupt`` once one arrived, so a run stopped by a
    job scheduler or a timeout saves a checkpoint as one stopped with Ctrl-C does. A second
    signal interrupts at once (no checkpoint of that iteration then). Only in the main thread
    (Tune trials run in others)."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    arrived: list[str] = []

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if arrived:
            raise KeyboardInterrupt(f"{name} twice: stopped mid-iteration")
        arrived.append(name)
        log.warning(
            "%s: stopping after this iteration with a checkpoint (send it again, or Ctrl-C, "
            "to stop now; the run then continues from its last checkpoint)",
            "interrupted" if signum == signal.SIGINT else f"{name} received",
        )

    def check() -> None:
        if arrived:
            raise KeyboardInterrupt(f"{arrived[0]}: stopped between iterations")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield check
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
