"""``marl scenarios``: the scenarios' command; the ``marl`` app (``trainers/cli.py``) adds it.

:func:`register` adds the command to a Typer app; the registry loads inside the command only.
"""

from __future__ import annotations

import typer


def list_command() -> None:
    """List the registered scenarios with a one-line summary and the topologies each accepts."""
    from rich.console import Console
    from rich.table import Table

    from scenarios.registry import list_scenarios

    table = Table(title="scenarios", title_justify="left")
    table.add_column("id", style="bold")
    table.add_column("summary")
    table.add_column("topologies")
    table.add_column("default")
    for cls in list_scenarios():
        table.add_row(cls.id(), cls.summary, ", ".join(cls.topologies), cls.default_topology)
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add ``scenarios`` to ``app`` (the ``marl`` app)."""
    app.command("scenarios")(list_command)
