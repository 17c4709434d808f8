"""The ``marl`` command line: scenarios, topologies, and (from ``trainers``) run/sweep/eval."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from topologies.cli import app as topology_app

app = typer.Typer(
    name="marl",
    help="Train teams of agents (LangGraph graphs) as Dec-POMDPs with Ray RLlib.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(topology_app, name="topology")


@app.command("scenarios")
def list_command() -> None:
    """List the registered scenarios with a one-line summary and the topologies each accepts."""
    from scenarios.registry import list_scenarios

    table = Table(title="scenarios", title_justify="left")
    table.add_column("id", style="bold")
    table.add_column("summary")
    table.add_column("topologies")
    table.add_column("default")
    for cls in list_scenarios():
        table.add_row(cls.id(), cls.summary, ", ".join(cls.topologies), cls.default_topology)
    Console().print(table)


def _register_training_commands() -> None:
    from trainers.cli import register
    from trainers.finetune_cli import register as register_finetune

    register(app)
    register_finetune(app)


_register_training_commands()


if __name__ == "__main__":
    app()
