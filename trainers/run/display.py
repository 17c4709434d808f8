"""What a run shows: the progress bar and per-iteration line, the plan and summary printed
at the start and end, the learning-curve plot, and the wandb run.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from trainers.configs.experiment import ExperimentConfig
from trainers.run.metrics import HEADLINE_EXTRA, ORACLE_FRACTION_KEY, RETURN_KEY
from trainers.run.outcome import TrainResult

log = logging.getLogger(__name__)


# ----- wandb --------------------------------------------------------------------------------
def wandb_init(cfg: ExperimentConfig, run: Path, resumed: bool) -> Any:
    mode = cfg.logging.wandb
    if mode == "disabled":
        return None
    os.environ["WANDB_MODE"] = mode
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        import wandb

        return wandb.init(
            project=cfg.logging.project,
            entity=cfg.logging.entity,
            name=run.name,
            id=run.name.replace(":", "-"),
            dir=str(run),
            config=cfg.to_dict(),
            mode=mode,
            resume="allow" if resumed else None,
            reinit="finish_previous",
        )
    except Exception as exc:  # tracking must never kill a run
        log.warning("wandb disabled for this run: %s", exc)
        return None


# ----- display ------------------------------------------------------------------------------
def progress_console(cfg: Any) -> Any:
    """A rich console when ``cfg.logging.progress`` (ExperimentConfig or FinetuneJob), else None."""
    if not cfg.logging.progress:
        return None
    from rich.console import Console

    return Console()


@contextlib.contextmanager
def progress_bar(
    console: Any, label: str, info: Callable[[Mapping[str, Any]], str] | None = None
) -> Iterator[Callable[[float, dict[str, Any]], None]]:
    """A rich progress bar for long work; yields ``advance(fraction, metrics_row)``.

    ``info`` turns the latest metrics row into the text beside the bar. No console, no bar.
    """
    if console is None:
        yield lambda fraction, row: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    describe = info or row_info
    progress = Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
    )
    task = progress.add_task(label, total=1.0, info="")

    def advance(fraction: float, row: dict[str, Any]) -> None:
        progress.update(task, completed=fraction, info=describe(row) if row else "")

    with progress:
        yield advance


def row_info(row: Mapping[str, Any]) -> str:
    if not row:
        return ""
    parts = [f"it {row.get('charts/iteration', 0)}", f"steps {row.get('charts/env_steps', 0)}"]
    if RETURN_KEY in row:
        parts.append(f"return {row[RETURN_KEY]:.3f}")
    parts += [f"{label} {row[key]:.1f}" for key, label in HEADLINE_EXTRA if key in row]
    if ORACLE_FRACTION_KEY in row:
        parts.append(f"oracle {100 * row[ORACLE_FRACTION_KEY]:.0f}%")
    if "charts/success" in row:
        parts.append(f"success {100 * row['charts/success']:.0f}%")
    parts.append(f"{row.get('charts/env_steps_per_s', 0):.0f} steps/s")
    if "timers/env_s" in row:
        phases = ("env", "forward", "sample_overhead", "learn", "sync")
        parts.append(" ".join(f"{p} {row[f'timers/{p}_s']:.2f}s" for p in phases))
    if row.get("timers/tool_wait_s"):  # slow tools: wall time with a tool call running
        parts.append(f"tool wait {row['timers/tool_wait_s']:.2f}s")
    if row.get("monitor/alarms"):
        parts.append(f"[red]{row['monitor/alarms']} alarm(s), see log[/red]")
    return " · ".join(parts)


def plain_line(row: Mapping[str, Any], budget: Any = None) -> str:
    """One iteration as a plain line (for logs and pipes): iteration (of the budget's), env
    steps, team return, success where the scenario defines it, seconds an iteration.

    >>> plain_line({"charts/iteration": 3, "charts/env_steps": 3200,
    ...             "charts/team_return": -12.3456, "charts/iteration_s": 2.14})
    'iteration 3 · env steps 3200 · return -12.346 · 2.1 s/iteration'
    """
    it = row.get("charts/iteration", 0)
    total = getattr(budget, "iterations", None)
    parts = [f"iteration {it}/{total}" if total else f"iteration {it}"]
    parts.append(f"env steps {row.get('charts/env_steps', 0)}")
    if RETURN_KEY in row:
        parts.append(f"return {row[RETURN_KEY]:.3f}")
    for key, label in HEADLINE_EXTRA:
        if key in row:
            parts.append(f"{label} {row[key]:.1f}")
    if "charts/success" in row:
        parts.append(f"success {100 * row['charts/success']:.1f}%")
    parts.append(f"{row.get('charts/iteration_s', 0.0):.1f} s/iteration")
    return " · ".join(parts)


def print_plan(console: Any, plan: Any, run: Path) -> None:
    from rich.table import Table

    from marl_agents.pools import describe

    table = Table(title=f"{plan.scenario_id} · {run.name}", title_justify="left")
    for col in ("pool", "agents", "model", "trained"):
        table.add_column(col)
    for row in describe(plan.pools):
        table.add_row(
            row["pool"],
            ", ".join(row["agents"]),
            row["model"],
            "yes" if row["trained"] else "frozen",
        )
    discovered = getattr(plan.env.build_scenario(), "discovered", None)
    if discovered:  # an app's agents found on a dry run (AppScenario without agents)
        names = ", ".join(a if a == n else f"{a} ({n})" for a, n in discovered.items())
        table.caption = f"agents discovered on a dry run of the app: {names}"
    console.print(table)


def print_summary(console: Any, result: TrainResult) -> None:
    """The final summary table of a run."""
    from rich.table import Table

    final = result.final
    table = Table(title="run summary", title_justify="left", show_header=False)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    steps_per_s = [h.get("charts/env_steps_per_s", 0.0) for h in result.history]
    rows = [
        ("status", result.status),
        ("iterations", str(result.iterations)),
        ("env steps", str(result.env_steps)),
        ("time", f"{final.get('charts/time_s', 0.0):.0f} s"),
        ("env steps/s", f"{sum(steps_per_s) / max(1, len(steps_per_s)):.0f}"),
    ]
    if RETURN_KEY in final:
        first = next((h[RETURN_KEY] for h in result.history if RETURN_KEY in h), None)
        rows.append(("team return", f"{first:.3f} → {final[RETURN_KEY]:.3f}"))
    for key, label in HEADLINE_EXTRA:
        if key in final:
            start = next(h[key] for h in result.history if key in h)
            rows.append((label, f"{start:.1f} → {final[key]:.1f}"))
    if "charts/oracle" in final:
        rows.append(("oracle return", f"{final['charts/oracle']:.3f}"))
    if ORACLE_FRACTION_KEY in final:
        rows.append(("fraction of oracle", f"{100 * final[ORACLE_FRACTION_KEY]:.1f}%"))
    if "charts/success" in final:
        rows.append(("success", f"{100 * final['charts/success']:.1f}%"))
    if result.errors:
        total = sum(e["count"] for e in result.errors)
        top = result.errors[0]
        rows.append(
            (
                "failed episodes",
                f"{total} ({len(result.errors)} distinct errors, in summary.json); most "
                f"frequent ({top['kind']}, {top['count']}×): {top['error']}",
            )
        )
    if result.alarms:
        first = result.alarms[0]
        rows.append(
            (
                "monitor alarms",
                f"{len(result.alarms)} (in summary.json); first: {first['monitor']} "
                f"({first['metric']} = {first['value']:.4g}) at iteration {first['iteration']}",
            )
        )
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    # paths outside the table, each on one line whatever the width: they can be copied
    best = result.best_checkpoint
    same = best is not None and best == result.final_checkpoint
    paths = [
        ("run dir", result.run_dir),
        ("final checkpoint", result.final_checkpoint),
        ("best checkpoint", "the final one" if same else best),
        ("learning curve", result.curve),
    ]
    width = max(len(k) for k, _ in paths)
    for key, value in paths:
        console.print(
            f"{key + ':':<{width + 1}} {value}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )


def plot_curve(history: list[dict[str, Any]], path: Path, title: str = "") -> Path | None:
    """Team return (and the oracle, when known) against env steps, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return None
    rows = [h for h in history if RETURN_KEY in h]
    if not rows:
        return None
    x = [h["charts/env_steps"] for h in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [h[RETURN_KEY] for h in rows], label="team return")
    if all("charts/oracle" in h for h in rows):
        ax.plot(x, [h["charts/oracle"] for h in rows], "--", label="oracle (same tasks)")
    if all("charts/success" in h for h in rows):
        ax.plot(x, [h["charts/success"] for h in rows], ":", label="success rate")
    ax.set_xlabel("env steps")
    ax.set_ylabel("per episode")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
