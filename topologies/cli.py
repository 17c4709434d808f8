"""``marl topology``: inspect and draw a topology.

The main ``marl`` app mounts :data:`app` as ``marl topology``::

    marl topology show star:4 --png star.png
    marl topology show mypkg.graphs:builder        # a StateGraph, compiled graph or Topology
    marl topology show mypkg.graphs:make_graph     # ... or a function returning one
    marl topology show team.yaml

Errors (a bad spec, an import failure, a missing attribute, a graph that does not validate)
print one line naming the fix and exit with code 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from topologies.errors import MarlError
from topologies.imports import ImportRefError, import_attr
from topologies.paths import critical_path
from topologies.topology import END, START, Topology, TopologyError

app = typer.Typer(
    name="topology",
    help="Inspect and draw agent topologies (named specs, LangGraph graphs, YAML files).",
    no_args_is_help=True,
    add_completion=False,
)
TARGET_HELP = (
    "A spec (single, chain:N, star:N, tree:BxD, mesh:N), a package.module:attribute naming a "
    "StateGraph, compiled graph, Topology or a function returning one, or a .yaml file."
)


class LoadError(MarlError):
    """A target that cannot be loaded; the message names the fix."""


@app.callback()
def main() -> None:
    """Inspect and draw agent topologies."""


@app.command()
def show(
    target: Annotated[str, typer.Argument(metavar="SPEC|MODULE:ATTR|FILE.yaml", help=TARGET_HELP)],
    png: Annotated[
        Path | None, typer.Option("--png", help="Also draw the topology to this PNG file.")
    ] = None,
    mermaid: Annotated[
        bool, typer.Option("--mermaid", help="Also print the mermaid text.")
    ] = False,
) -> None:
    """Print a summary of a topology (agents, roles, pools, channels, critical path)."""
    try:
        if png is not None and not png.parent.is_dir():
            raise LoadError(f"cannot write {str(png)!r}: its directory does not exist; create it")
        topology = load(target)
        console = Console(highlight=False)
        summarize(topology, console)
        if mermaid:
            console.print(topology.to_mermaid(), markup=False, end="")
        if png is not None:
            try:
                out = topology.draw(png)
            except OSError as exc:
                raise LoadError(
                    f"cannot write {str(png)!r} ({exc.strerror or exc}): pick a writable path"
                ) from None
            console.print(f"drew {out}", markup=False, soft_wrap=True)
    except (LoadError, TopologyError) as exc:
        message = " ".join(str(exc).split())
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(2) from None


def load(target: str) -> Topology:
    """The topology ``target`` names (see :data:`TARGET_HELP`).

    Raises:
        LoadError: import failures and missing attributes.
        TopologyError: a bad spec or a graph that does not validate.
    """
    from topologies.generators import GENERATORS  # loads LangGraph: only when needed

    target = target.strip()
    if target.endswith((".yaml", ".yml")):
        return Topology.from_yaml(Path(target))
    head, sep, attr = target.partition(":")
    if head in GENERATORS:
        return Topology.from_spec(target)
    if not sep or not attr or not head:
        kinds = ", ".join(form for _, form in GENERATORS.values())
        raise LoadError(
            f"unknown topology {target!r}: give a spec ({kinds}), a package.module:attribute "
            "or a .yaml file"
        )
    obj = _import(head, attr)
    return _as_topology(obj, f"{head}:{attr}", call=True)


def _import(module_name: str, attr: str) -> Any:
    if os.getcwd() not in sys.path:  # a console script does not put the cwd on sys.path
        sys.path.insert(0, os.getcwd())
    try:
        return import_attr(
            module_name, attr, "a StateGraph, compiled graph, Topology or a function returning one"
        )
    except ImportRefError as exc:
        raise LoadError(str(exc)) from None


def _as_topology(obj: Any, where: str, call: bool) -> Topology:
    if isinstance(obj, Topology):
        return obj.validate()
    if hasattr(obj, "builder") or type(obj).__name__ == "StateGraph" or _is_builder(obj):
        return Topology.from_langgraph(obj, name=where)
    if call and callable(obj):
        try:
            made = obj()
        except Exception as exc:  # user code
            raise LoadError(
                f"calling {where}() failed ({type(exc).__name__}: {exc}): it must take no "
                "arguments and return a graph"
            ) from None
        return _as_topology(made, where, call=False)
    raise LoadError(
        f"{where} is a {type(obj).__name__}, not a graph: name a StateGraph, compiled graph, "
        "Topology or a function returning one"
    )


def _is_builder(obj: Any) -> bool:
    from langgraph.graph import StateGraph

    return isinstance(obj, StateGraph)


def summarize(topology: Topology, console: Console) -> None:
    """Print the summary tables of ``topology``."""
    g = topology.graph
    label = topology.spec or topology.name
    console.print(
        f"[bold]{label}[/bold]: {len(topology.agent_ids)} agent(s) on {len(topology.agents)} "
        f"agent node(s), {len(topology.nodes) - len(topology.agents)} plain node(s)",
        soft_wrap=True,
    )
    table = Table(title="nodes", title_justify="left")
    plain = len(topology.nodes) > len(topology.agents)
    fanout = any(g.nodes[n]["max_instances"] > 1 for n in topology.agents)
    grouped = any(g.nodes[n]["subgraph"] for n in topology.nodes)
    columns = ["node", *(["kind"] if plain else []), "role", "pool", "trainable"]
    columns += (["agent ids"] if fanout else []) + (["subgraph"] if grouped else [])
    for column in columns:
        table.add_column(column, overflow="fold")
    for n in topology.nodes:
        d = g.nodes[n]
        ids = topology.instances(n) if d["kind"] == "agent" else []
        cells = {
            "node": n,
            "kind": d["kind"],
            "role": str(d["role"]),
            "pool": d["pool"] or "-",
            "trainable": "yes" if d["trainable"] else "no",
            "agent ids": ", ".join(ids) if len(ids) <= 3 else f"{n}_{{0..{len(ids) - 1}}}",
            "subgraph": d["subgraph"] or "-",
        }
        table.add_row(*(cells[c] for c in columns))
    console.print(table)
    channels = Table(title="channels", title_justify="left")
    channels.add_column("kind")
    channels.add_column("count", justify="right")
    for kind, count in topology.edge_counts().items():
        channels.add_row(kind, str(count))
    console.print(channels)
    path = [n.replace(START, "START").replace(END, "END") for n in critical_path(topology)]
    console.print(
        f"critical path: {topology.critical_path_length()} superstep(s) ({' → '.join(path)})",
        markup=False,
        soft_wrap=True,
    )
