"""``marl scenarios``: the scenarios' command; the ``marl`` app (``trainers/cli.py``) adds it.

:func:`register` adds the command to a Typer app; the registry loads inside the command only.
"""

from __future__ import annotations

import typer


def list_command() -> None:
    """List the registered scenarios (summary, topologies) and the mpe2 tasks by reference."""
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
    Console().print(pettingzoo_table())


def pettingzoo_table() -> object:
    """mpe2's tasks by import reference (any PettingZoo env factory is a scenario the same way)."""
    from rich.table import Table

    from scenarios.pettingzoo_env import MPE2_TASKS

    table = Table(
        title="PettingZoo envs by import reference (scenario_kwargs go to the factory)",
        title_justify="left",
    )
    table.add_column("reference", style="bold")
    table.add_column("summary")
    for ref, summary in MPE2_TASKS.items():
        table.add_row(ref, summary)
    return table


def register(app: typer.Typer) -> None:
    """Add ``scenarios`` to ``app`` (the ``marl`` app)."""
    app.command("scenarios")(list_command)
