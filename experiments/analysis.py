"""Numbers and plots from saved records: per-seed summaries, mean ± std, curves on a common
env-step grid, markdown tables. Used by every claim's ``report`` function; no Ray, no torch.

Conventions: a *final* training value is the mean over the last :data:`LAST` iterations of a
run (one iteration's mean is noisy); spread across seeds is the sample standard deviation and
the min–max range; two arms are called different only when their per-seed ranges do not overlap
(:func:`compare`), a deliberately conservative rule for 3 seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: iterations averaged for a run's final training value.
LAST = 3


# ----- records ------------------------------------------------------------------------------
def runs(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The training-run records (``kind == "run"``), sorted by condition then seed."""
    out = [r for r in records if r.get("kind") == "run"]
    return sorted(out, key=lambda r: (r["condition"], r["seed"]))


def extras(records: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    """The non-run records of one ``kind`` (``reference``, ``unsupported``, ``estimator``…)."""
    return [r for r in records if r.get("kind") == kind]


def group(
    records: Iterable[Mapping[str, Any]], order: Sequence[str] | None = None
) -> dict[str, list[Mapping[str, Any]]]:
    """Run records by condition name (in ``order`` when given, then the rest)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in runs(records):
        groups.setdefault(r["condition"], []).append(r)
    if order is None:
        return groups
    ordered = {name: groups[name] for name in order if name in groups}
    ordered.update({k: v for k, v in groups.items() if k not in ordered})
    return ordered


def series(record: Mapping[str, Any], key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(env_steps, values)`` of ``key`` over a run's iterations (rows without it skipped)."""
    rows = [h for h in record["history"] if key in h and h[key] is not None]
    return (
        np.array([h["env_steps"] for h in rows], dtype=float),
        np.array([h[key] for h in rows], dtype=float),
    )


def final(record: Mapping[str, Any], key: str, last: int = LAST) -> float:
    """Mean of ``key`` over the last ``last`` iterations that report it (nan if none)."""
    _, values = series(record, key)
    return float(values[-last:].mean()) if len(values) else math.nan


def best(record: Mapping[str, Any], key: str, window: int = LAST) -> float:
    """The highest ``window``-iteration moving average of ``key`` during training."""
    _, values = series(record, key)
    if not len(values):
        return math.nan
    w = min(window, len(values))
    return float(np.convolve(values, np.ones(w) / w, mode="valid").max())


def steps_to(
    record: Mapping[str, Any], key: str, target: float, window: int = LAST
) -> float | None:
    """Env steps at the first iteration whose ``window``-iteration moving average of ``key``
    reaches ``target`` (``None``: never reached within the run)."""
    steps, values = series(record, key)
    for i in range(len(values)):
        lo = max(0, i - window + 1)
        if i + 1 >= min(window, len(values)) and values[lo : i + 1].mean() >= target:
            return float(steps[i])
    return None


def eval_value(record: Mapping[str, Any], key: str) -> float:
    """A greedy-evaluation number: the summary's ``key``, else the mean scenario metric."""
    ev = record.get("eval") or {}
    if key in (ev.get("summary") or {}):
        return float(ev["summary"][key])
    if key in (ev.get("metrics") or {}):
        return float(ev["metrics"][key])
    return math.nan


# ----- statistics ---------------------------------------------------------------------------
def stats(values: Iterable[float | None]) -> dict[str, float]:
    """``n``, ``mean``, ``std`` (sample; 0 for one value), ``min`` and ``max`` of the finite
    values (``n = 0`` and nans when none)."""
    vals = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if not len(vals):
        return {"n": 0, "mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan}
    std = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
    return {
        "n": len(vals),
        "mean": float(vals.mean()),
        "std": std,
        "min": float(vals.min()),
        "max": float(vals.max()),
    }


def fmt(values: Iterable[float | None], pct: bool = False, digits: int = 3) -> str:
    """``mean ± std (min–max)`` of ``values``; percentages with ``pct``; ``—`` when empty."""
    s = stats(values)
    if s["n"] == 0:
        return "—"
    scale, unit = (100.0, "%") if pct else (1.0, "")
    d = 1 if pct else digits

    def f(x: float) -> str:
        return f"{scale * x:.{d}f}"

    if s["n"] == 1:
        return f"{f(s['mean'])}{unit} (1 seed)"
    return f"{f(s['mean'])}{unit} ± {f(s['std'])} ({f(s['min'])}–{f(s['max'])})"


def fmt_steps(values: Sequence[float | None]) -> str:
    """Steps to a target over seeds: ``12.0k ± 2.1k (k/n reached)`` or ``not reached (0/n)``."""
    reached = [v for v in values if v is not None]
    n = len(values)
    if not reached:
        return f"not reached (0/{n})"
    s = stats(reached)
    text = f"{s['mean'] / 1000:.1f}k"
    if s["n"] > 1:
        text += f" ± {s['std'] / 1000:.1f}k"
    return f"{text} ({len(reached)}/{n} reached)"


def compare(a: Iterable[float | None], b: Iterable[float | None], name_a: str, name_b: str) -> str:
    """A conservative verdict: which arm is higher, only when the per-seed ranges do not
    overlap; otherwise say there is no clear difference at this number of seeds."""
    sa, sb = stats(a), stats(b)
    if sa["n"] == 0 or sb["n"] == 0:
        return f"cannot compare {name_a} and {name_b}: missing results"
    if min(sa["n"], sb["n"]) < 2:
        return f"no verdict on {name_a} vs {name_b}: fewer than 2 seeds in an arm"
    if sa["min"] > sb["max"]:
        return f"{name_a} is higher than {name_b} on every seed (ranges do not overlap)"
    if sb["min"] > sa["max"]:
        return f"{name_b} is higher than {name_a} on every seed (ranges do not overlap)"
    n = min(sa["n"], sb["n"])
    return (
        f"no clear difference between {name_a} ({sa['mean']:.3g}) and {name_b} "
        f"({sb['mean']:.3g}): their ranges over {n} seeds overlap"
    )


#: a finding's check: (label, value function such as :func:`final`, metric key)
Check = tuple[str, Callable[[Mapping[str, Any], str], float], str]


def findings(
    a: Sequence[Mapping[str, Any]],
    b: Sequence[Mapping[str, Any]],
    names: tuple[str, str],
    checks: Sequence[Check],
) -> list[str]:
    """One ``- label: verdict`` line per check ``(label, value, key)``: :func:`compare` of
    ``value(record, key)`` over arm ``a``'s records and arm ``b``'s."""
    return [
        f"- {label}: " + compare([value(r, key) for r in a], [value(r, key) for r in b], *names)
        for label, value, key in checks
    ]


#: the usual findings on delegate: final training fraction of oracle and greedy evaluation
ORACLE_CHECKS: tuple[Check, ...] = (
    ("final fraction of oracle", final, "oracle_fraction"),
    ("greedy evaluation", eval_value, "oracle_fraction"),
)


# ----- markdown -----------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def eval_episodes(records: Iterable[Mapping[str, Any]]) -> str:
    """How many greedy evaluation episodes the runs used (``"no"`` when none)."""
    counts = sorted({int(r["eval"]["summary"]["episodes"]) for r in runs(records) if r.get("eval")})
    return "/".join(str(c) for c in counts) if counts else "no"


def budget_text(records: Sequence[Mapping[str, Any]]) -> str:
    """Iterations, env steps, seeds and wall time of a set of runs, as one sentence."""
    rs = runs(records)
    if not rs:
        return "no runs"
    steps = stats(r["env_steps"] for r in rs)
    its = stats(r["iterations"] for r in rs)
    seeds = sorted({r["seed"] for r in rs})
    wall = sum(r.get("wall_s", 0.0) for r in rs)
    per_it = [
        h["iteration_s"] for r in rs for h in r["history"] if h.get("iteration_s") is not None
    ]
    text = (
        f"{len(rs)} run{'s' if len(rs) != 1 else ''}, seeds {seeds}; "
        f"{its['mean']:.0f} iterations and "
        f"{steps['mean'] / 1000:.1f}k env steps per run on average; "
        f"{wall / 60:.1f} min of wall time in total"
    )
    if per_it:
        text += f" ({np.mean(per_it):.1f} s per training iteration)"
    return text


# ----- plots --------------------------------------------------------------------------------
class Figures:
    """Writes PNGs into ``img_dir`` and returns markdown image links relative to ``md_dir``."""

    def __init__(self, img_dir: Path, md_dir: Path, prefix: str = "") -> None:
        self.img_dir = Path(img_dir)
        self.md_dir = Path(md_dir)
        self.prefix = prefix
        self.written: list[Path] = []

    def save(self, fig: Any, name: str, alt: str) -> str:
        """Save a matplotlib figure as ``<prefix><name>.png``; returns its markdown link."""
        import matplotlib.pyplot as plt

        self.img_dir.mkdir(parents=True, exist_ok=True)
        path = self.img_dir / f"{self.prefix}{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        self.written.append(path)
        rel = Path(_relpath(path, self.md_dir))
        return f"![{alt}]({rel.as_posix()})"


def _relpath(path: Path, start: Path) -> str:
    import os

    return os.path.relpath(Path(path).resolve(), Path(start).resolve())


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curves(
    ax: Any,
    groups: Mapping[str, Sequence[Mapping[str, Any]]],
    key: str,
    labels: Mapping[str, str] | None = None,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    colors: Mapping[str, str] | None = None,
) -> None:
    """Mean (line) and min–max over seeds (band) of ``key`` against env steps per group, on a
    common grid up to the shortest run; each seed as a thin line. ``colors``: group → color."""
    for i, (name, rs) in enumerate(groups.items()):
        color = (colors or {}).get(name, f"C{i}")
        data = [series(r, key) for r in rs]
        data = [(x, y) for x, y in data if len(x)]
        if not data:
            continue
        if transform is not None:
            data = [(x, transform(y)) for x, y in data]
        for x, y in data:
            ax.plot(x, y, color=color, alpha=0.25, linewidth=0.8)
        end = min(x[-1] for x, _ in data)
        start = max(x[0] for x, _ in data)
        label = (labels or {}).get(name, name)
        if end > start:
            grid = np.linspace(start, end, 60)
            ys = np.array([np.interp(grid, x, y) for x, y in data])
            ax.plot(grid, ys.mean(axis=0), color=color, linewidth=2, label=f"{label} (n={len(ys)})")
            if len(ys) > 1:
                ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=color, alpha=0.15)
        else:
            ax.plot([], [], color=color, label=f"{label} (n={len(data)})")
    ax.set_xlabel("env steps")
    ax.grid(alpha=0.3)


def curve_figure(
    fig: Figures,
    groups: Mapping[str, Sequence[Mapping[str, Any]]],
    key: str,
    labels: Mapping[str, str],
    ylabel: str,
    caption: str,
    decorate: Callable[[Any], None] | None = None,
) -> str:
    """One axis of :func:`curves` of ``key`` (``decorate(ax)`` adds reference lines), saved as
    ``curves``; returns the markdown image link."""
    f, ax = pyplot().subplots(figsize=(7, 4))
    curves(ax, groups, key, labels)
    if decorate is not None:
        decorate(ax)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc="lower right")
    return fig.save(f, "curves", caption)
