"""What the ``marl`` commands of ``trainers`` share: options, error exits, process set-up.

Importing this module loads only Typer: Ray, torch and the configs load inside the commands.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

OutputOption = Annotated[
    Path | None, typer.Option(help="Parent directory of run directories (default runs/).")
]
SeedOption = Annotated[int | None, typer.Option(help="Experiment seed.")]
WandbOption = Annotated[
    str | None, typer.Option(help="wandb mode: offline (default), online or disabled.")
]
DumpOption = Annotated[
    bool, typer.Option("--dump", help="Print the resolved config YAML and exit.")
]
AddressOption = Annotated[
    str | None,
    typer.Option(
        help="Ray cluster to join: host:port of its head (GCS port, 6379 by default), "
        "ray://host:port for Ray Client, 'auto' for the cluster `ray start` runs on this "
        "machine, or 'local' for a new local Ray (default: RAY_ADDRESS, else a running "
        "`ray start` cluster, else local). Checked before any work (trainers.cluster)."
    ),
]


def fixed_hash_seed() -> None:
    """Re-exec with ``PYTHONHASHSEED=0`` when unset (not under pytest's in-process runner).

    Runs are bit-reproducible only with a fixed ``PYTHONHASHSEED`` (RLlib orders agents
    through sets).
    """
    if "PYTHONHASHSEED" in os.environ or "PYTEST_CURRENT_TEST" in os.environ:
        return
    os.environ["PYTHONHASHSEED"] = "0"
    argv = list(getattr(sys, "orig_argv", [])) or [sys.executable, *sys.argv]
    try:
        os.execv(sys.executable, [sys.executable, *argv[1:]])
    except OSError:  # cannot re-exec: carry on, reproducible within this process only
        return


def cwd_on_path() -> None:
    """Put the working directory on ``sys.path`` (a console script does not), so scenario
    references to modules next to the user import as they would under ``python -m``."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def fail(message: str, code: int = 2) -> None:
    """Print ``error: message`` to stderr and exit with ``code``."""
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    raise typer.Exit(code=code)


@contextlib.contextmanager
def config_errors() -> Iterator[None]:
    """Turn a ``ConfigError`` raised inside the block into ``error: ...`` and exit code 2."""
    from trainers.configs.typed import ConfigError

    try:
        yield
    except ConfigError as exc:
        fail(str(exc))


@contextlib.contextmanager
def training_errors() -> Iterator[None]:
    """A training run's errors as one line and an exit code: a ``ConfigError`` 2, a
    ``RunFailed`` (every episode failed) 1, Ctrl-C 130 (saying what was saved)."""
    from trainers.run.outcome import RunFailed

    with config_errors():
        try:
            yield
        except RunFailed as exc:  # every episode failed: the error, not a traceback
            where = f" (run directory: {exc.result.run_dir})" if exc.result is not None else ""
            fail(f"{exc}{where}", code=1)
        except KeyboardInterrupt as exc:
            notes = "; ".join(getattr(exc, "__notes__", []))  # what train() saved, and where
            typer.echo(f"interrupted; {notes}" if notes else "interrupted", err=True)
            raise typer.Exit(code=130) from None


def launch(spec: Any, run: Callable[[Any], Any], *, dump: bool, address: str | None) -> None:
    """``--dump``: print ``spec`` as YAML. Else check it, join ``address`` and ``run(spec)``
    (errors as :func:`training_errors` says); a run that did not complete exits 1."""
    from trainers.cluster import use_address

    with config_errors():
        if dump:
            typer.echo(spec.to_yaml(), nl=False)
            return
        spec.check()
        use_address(address)
    fixed_hash_seed()
    with training_errors():
        result = run(spec)
    if result.status != "completed":
        raise typer.Exit(code=1)
