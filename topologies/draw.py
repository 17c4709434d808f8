"""Draw a topology to a PNG with matplotlib's Agg canvas (no pyplot, no global backend change).

Layout (:func:`layout`): one row per BFS level from START (START on top, END at the bottom), so
a delegation round reads top to bottom; long rows wrap. Nodes are coloured by role
(plain nodes white), channels styled by kind; channels that have a reverse channel are curved
so both directions stay visible.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import networkx as nx
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from topologies.topology import END, START

if TYPE_CHECKING:
    from topologies.topology import Topology

ROLE_COLOURS = {
    "orchestrator": "#f4a261",
    "worker": "#8ecae6",
    "aggregator": "#b5e48c",
    "agent": "#cdb4db",
    "tool": "#e9ecef",
}
PLAIN, TERMINAL = "#ffffff", "#343a40"
EDGE_STYLES: dict[str, dict[str, Any]] = {  # kind → draw_networkx_edges keyword arguments
    "static": {"style": "solid", "edge_color": "#495057", "width": 1.2},
    "conditional": {"style": "dashed", "edge_color": "#1d6f91", "width": 1.2},
    "send": {"style": "solid", "edge_color": "#e76f51", "width": 2.4},
    "join": {"style": "dotted", "edge_color": "#2a9d8f", "width": 1.8},
    "command": {"style": "dashdot", "edge_color": "#7b2cbf", "width": 1.4},
}
WRAP = 16  # most nodes drawn on one line


def layout(topology: Topology, wrap: int = WRAP) -> dict[str, tuple[float, float]]:
    """Node positions: one row per BFS level from START (END on the last row).

    Within a row, nodes sit under the mean position of their parents in earlier rows (graph
    order breaks ties); a row of more than ``wrap`` nodes wraps onto several lines.
    """
    g = topology.graph
    depth = nx.single_source_shortest_path_length(g, START)
    deepest = max(d for n, d in depth.items() if n != END)
    order = {n: i for i, n in enumerate(g)}
    rows: dict[int, list[str]] = {}
    for n in g:
        row = deepest + 2 if n == END else depth.get(n, deepest + 1)
        rows.setdefault(row, []).append(n)
    pos: dict[str, tuple[float, float]] = {}
    line = 0
    for row in sorted(rows):

        def centre(n: str) -> tuple[float, int]:
            xs = [pos[p][0] for p in g.predecessors(n) if p in pos]
            return (sum(xs) / len(xs) if xs else float("inf"), order[n])

        nodes = sorted(rows[row], key=centre)
        for start in range(0, len(nodes), wrap):
            chunk = nodes[start : start + wrap]
            for i, n in enumerate(chunk):
                pos[n] = (i - (len(chunk) - 1) / 2, -float(line))
            line += 1
    return pos


def draw(topology: Topology, path: str | Path, *, title: str | None = None, dpi: int = 100) -> Path:
    """Draw ``topology`` to a PNG file.

    Args:
        topology: the topology to draw.
        path: the output file (``.png``).
        title: the figure title; defaults to the spec or name and the critical path.
        dpi: resolution.

    Returns:
        The written path.
    """
    g = topology.graph
    pos = layout(topology)
    rows: dict[float, int] = {}
    for _, y in pos.values():
        rows[y] = rows.get(y, 0) + 1
    widest = max(rows.values())
    width = max(6.0, 1.15 * widest + 1.5)
    height = max(4.0, 1.2 * len(rows) + 1.5)
    node_size = 1100.0 if widest <= 8 else 700.0
    font = 8.0 if widest <= 8 else 6.5

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    colours = [_colour(g.nodes[v]) for v in g]
    nx.draw_networkx_nodes(
        g, pos, ax=ax, node_color=colours, node_size=node_size, edgecolors="#343a40",
        linewidths=0.8,
    )  # fmt: skip
    labels = {v: _label(topology, v) for v in g if v not in (START, END)}
    nx.draw_networkx_labels(g, pos, labels=labels, ax=ax, font_size=font)
    ends = {START: "START", END: "END"}
    nx.draw_networkx_labels(g, pos, labels=ends, ax=ax, font_size=font - 1.5, font_color="white")
    for kind, style in EDGE_STYLES.items():
        edges = [(u, v) for u, v, k in g.edges(data="kind") if k == kind]
        for rad in (0.0, 0.12, 0.35):
            chosen = [(u, v) for u, v in edges if _bend(g, pos, u, v) == rad]
            if chosen:
                nx.draw_networkx_edges(
                    g, pos, edgelist=chosen, ax=ax, node_size=node_size, arrows=True,
                    arrowsize=max(6, int(font * 1.6)),
                    connectionstyle=f"arc3,rad={rad}", **style,
                )  # fmt: skip
    ax.legend(handles=_legend(topology), loc="upper left", fontsize=max(font, 6.0), frameon=False)
    label = topology.spec or topology.name
    ax.set_title(title or f"{label} — critical path {topology.critical_path_length()} supersteps")
    ax.margins(0.08)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, format="png")
    return out


def _bend(g: nx.DiGraph, pos: dict[str, tuple[float, float]], u: str, v: str) -> float:
    """Curvature of an edge: a channel that skips rows bows around the nodes between, a pair
    of opposite channels separates, others are straight."""
    if abs(pos[u][1] - pos[v][1]) > 1.01:
        return 0.35
    return 0.12 if g.has_edge(v, u) and u != v else 0.0


def _colour(data: dict[str, Any]) -> str:
    if data["kind"] in ("start", "end"):
        return TERMINAL
    return ROLE_COLOURS.get(data["role"], PLAIN) if data["kind"] == "agent" else PLAIN


def _label(topology: Topology, node: str) -> str:
    d = topology.graph.nodes[node]
    k = d["max_instances"]
    return node + (f"\n×{k}" if k > 1 else "")


def _legend(topology: Topology) -> list[Any]:
    g = topology.graph
    roles = dict.fromkeys(g.nodes[a]["role"] for a in topology.agents)
    handles: list[Any] = [
        Patch(facecolor=ROLE_COLOURS.get(r, PLAIN), edgecolor="#343a40", label=r) for r in roles
    ]
    if len(topology.agents) < len(topology.nodes):
        handles.append(Patch(facecolor=PLAIN, edgecolor="#343a40", label="plain node"))
    kinds = {k for _, _, k in g.edges(data="kind")}
    for kind, style in EDGE_STYLES.items():
        if kind in kinds:
            handles.append(
                Line2D([], [], color=style["edge_color"], linestyle=style["style"],
                       linewidth=style["width"], label=kind)
            )  # fmt: skip
    return handles
