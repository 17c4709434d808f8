"""Rebuild ``docs/results.md`` and its plots (``docs/img/*.png``) from the saved results.

Reads every claim's JSON records under ``experiments/results/<claim>/<budget>/`` (no training,
no Ray) and writes one section per claim: the published claim, what was run, the exact command,
the budget and seeds, tables of mean ± std (min–max), findings computed from the data (with the
rule used to call a difference) and plots. Each section ends with an interpretation block for a
human to write; its text is kept when the report is rebuilt::

    <!-- interpretation:<claim> -->
    …your text…
    <!-- /interpretation:<claim> -->

Budget per claim: ``--budget auto`` (default) takes ``full`` results when there are any, else
``default``; ``smoke`` results are used only when asked for.

Run: ``python -m experiments.report`` (``--results``, ``--out``, ``--img``, ``--budget``).
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments import CLAIMS
from experiments import analysis as an
from experiments.harness import BUDGETS, RESULTS, ROOT, load_records

DOC = ROOT / "docs" / "results.md"
IMG = ROOT / "docs" / "img"
PLACEHOLDER = (
    "_Not written yet. After the runs, say here what the numbers do and do not show, including "
    "negative results, and how far the laptop-scale setting is from the published one._"
)
BLOCK = re.compile(
    r"<!-- interpretation:(?P<claim>[\w-]+) -->\n(?P<text>.*?)\n"
    r"<!-- /interpretation:(?P=claim) -->",
    re.S,
)


def pick_budget(results: Path, claim: str, budget: str) -> str | None:
    """The budget whose records the report uses for ``claim`` (``None``: nothing saved)."""
    if budget != "auto":
        return budget if load_records(results, claim, budget) else None
    for name in ("full", "default"):
        if any(r.get("kind") == "run" for r in load_records(results, claim, name)):
            return name
    return None


def interpretations(path: Path) -> dict[str, str]:
    """The human-written interpretation blocks of an existing report, by claim."""
    if not path.exists():
        return {}
    return {m["claim"]: m["text"] for m in BLOCK.finditer(path.read_text())}


def what_was_run(module: Any) -> str:
    """The claim module's docstring without its title line and its ``Run:`` paragraph."""
    doc = (module.__doc__ or "").strip()
    paragraphs = doc.split("\n\n")[1:]
    keep = [p for p in paragraphs if not p.lstrip().startswith("Run:")]
    return "\n\n".join(
        " ".join(line.strip() for line in p.splitlines()) if not _is_list(p) else p.strip()
        for p in keep
    )


def rst_to_md(text: str) -> str:
    """Docstring markup to markdown: ``:role:`x``` and double backquotes become code spans."""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")


def _is_list(paragraph: str) -> bool:
    return paragraph.lstrip().startswith(("* ", "- "))


def commands(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The distinct commands that produced ``records``, in first-seen order."""
    seen: list[str] = []
    for r in records:
        cmd = r.get("command")
        if cmd and cmd not in seen:
            seen.append(cmd)
    return seen


def section(
    index: int,
    claim: str,
    budget: str | None,
    records: Sequence[Mapping[str, Any]],
    fig: an.Figures,
    interpretation: str | None,
) -> str:
    """One claim's section of the report."""
    module = importlib.import_module(f"experiments.{claim}")
    head = [
        f"## {index}. {module.TITLE}",
        "",
        f"**Published claim.** {module.PUBLISHED}",
        "",
        f"**What was run.** {rst_to_md(what_was_run(module))}",
        "",
    ]
    default_cmd = f"python -m experiments.{claim}"
    if not budget or not records:
        head += [
            f"**No results yet.** Run `{default_cmd}` (then `python -m experiments.report`).",
            "",
        ]
        body = module.report([], fig)  # what a claim shows without data (e.g. its reference)
    else:
        cmds = commands(records) or [default_cmd]
        head += [
            "**Command.** "
            + ", ".join(f"`{c}`" for c in cmds)
            + f" (budget `{budget}`: "
            + _budget_settings(module, budget)
            + ").",
            "",
            f"**Budget actually used.** {an.budget_text(records)}.",
            "",
        ]
        body = module.report(records, fig)
    tail = [
        "",
        "### Interpretation",
        "",
        f"<!-- interpretation:{claim} -->",
        interpretation if interpretation is not None else PLACEHOLDER,
        f"<!-- /interpretation:{claim} -->",
        "",
    ]
    return "\n".join([*head, body, *tail])


def _budget_settings(module: Any, budget: str) -> str:
    settings = getattr(module, "BUDGETS", {}).get(budget, {})
    return ", ".join(f"{k} {_short(v)}" for k, v in settings.items())


def _short(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple | list):
        return "/".join(str(v) for v in value)
    return str(value)


def overview(rows: Sequence[Sequence[Any]]) -> str:
    """The table of claims at the top of the report."""
    return an.table(["#", "claim", "command", "budget", "runs", "seeds", "wall time"], rows)


#: sections below this line in docs/results.md are written by their own (opt-in) experiments,
#: not built from ``experiments/results/``: the report keeps them verbatim
OPT_IN_MARKER = "<!-- opt-in sections below: written by their experiments, kept by the report -->"


def kept_opt_in(path: Path) -> str:
    """The opt-in sections of an existing report (from :data:`OPT_IN_MARKER` on), or ''."""
    if not path.exists():
        return ""
    text = path.read_text()
    i = text.find(OPT_IN_MARKER)
    return "" if i < 0 else text[i:].rstrip() + "\n"


def build(
    results: Path = RESULTS,
    out: Path = DOC,
    img: Path = IMG,
    budget: str = "auto",
    claims: Sequence[str] = CLAIMS,
) -> Path:
    """Write the report to ``out`` (and PNGs to ``img``); returns ``out``."""
    out = Path(out)
    kept = interpretations(out)
    opt_in = kept_opt_in(out)
    sections, rows, machine = [], [], None
    for i, claim in enumerate(claims, start=1):
        chosen = pick_budget(Path(results), claim, budget)
        records = load_records(Path(results), claim, chosen) if chosen else []
        fig = an.Figures(Path(img), out.parent, prefix=f"{claim}_")
        sections.append(section(i, claim, chosen, records, fig, kept.get(claim)))
        rs = an.runs(records)
        if rs and machine is None:
            machine = rs[0].get("environment")
        wall = sum(r.get("wall_s", 0.0) for r in rs) / 60
        rows.append(
            [
                i,
                f"[{importlib.import_module(f'experiments.{claim}').TITLE}](#{i}-{_anchor(claim)})",
                f"`python -m experiments.{claim}`",
                chosen or "—",
                len(rs),
                len({r["seed"] for r in rs}) if rs else 0,
                f"{wall:.0f} min" if rs else "—",
            ]
        )
    text = [
        "# Results: published multi-agent training claims at laptop scale",
        "",
        "Generated by `python -m experiments.report` from the raw per-seed results under "
        "`experiments/results/` (issue #6). Everything outside the *Interpretation* blocks is "
        "rebuilt from the data each time; text inside those blocks is kept. No result was tuned "
        "to look good: the scripts run each arm with the package defaults unless a section says "
        "otherwise, and negative results are reported as they came.",
        "",
        "Run everything (defaults, then this report): `python -m experiments.run_all`; one claim: "
        "the command in its row (`--seeds N`, `--full` for a bigger budget, `--smoke` for a "
        "pipeline check). A seed whose result file exists is skipped, so an interrupted run "
        "resumes.",
        "",
        "Every arm also ships as one `marl run` config: `examples/results/<claim>_<arm>.yaml` "
        "(`marl run examples/results/credit_delegate_shapley.yaml --seed 0`; generated from "
        "these experiments by `python -m experiments.export_configs`, a test keeps them equal). "
        "Each file's header names its section, the command, the numbers recorded here and the "
        "first two iterations' team returns, which `marl run <file> --seed 0 --iterations 2` "
        "logs to the digit (a slow test reruns one file a section); should a default change "
        "after a run, the header lists the fields that changed (the list: "
        "`examples/results/README.md`). "
        "The simple_spread MAPPO headline: `marl run examples/spread_mappo.yaml`.",
        "",
        overview(rows),
        "",
    ]
    if machine:
        text += [
            "Machine and versions of the first run: "
            + ", ".join(f"{k} {v}" for k, v in machine.items() if v is not None)
            + ".",
            "",
        ]
    text += ["Conventions: " + _conventions(), "", *sections]
    out.parent.mkdir(parents=True, exist_ok=True)
    body = "\n".join(text).rstrip() + "\n"
    out.write_text(body + ("\n" + opt_in if opt_in else ""))
    return out


def _anchor(claim: str) -> str:
    title = importlib.import_module(f"experiments.{claim}").TITLE.lower()
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def _conventions() -> str:
    return (
        f"a run's *final* value is the mean of its last {an.LAST} training iterations; "
        "tables show mean ± sample standard deviation across seeds and the min–max in "
        "brackets; *steps to a target* is the first iteration whose "
        f"{an.LAST}-iteration moving average reaches it; greedy evaluation runs the final "
        "checkpoint deterministically on fresh tasks (seeds from 1,000,000); two arms are "
        "called different only when their per-seed ranges do not overlap."
    )


def main(argv: Sequence[str] | None = None) -> Path:
    """Command line: rebuild the report."""
    p = argparse.ArgumentParser(prog="python -m experiments.report", description=__doc__)
    p.add_argument("--results", type=Path, default=RESULTS, help="results root")
    p.add_argument("--out", type=Path, default=DOC, help="the markdown file to write")
    p.add_argument("--img", type=Path, default=IMG, help="directory for the PNG plots")
    p.add_argument("--budget", default="auto", choices=("auto", *BUDGETS))
    p.add_argument("--claims", nargs="+", choices=CLAIMS, default=list(CLAIMS))
    args = p.parse_args(argv)
    path = build(args.results, args.out, args.img, args.budget, args.claims)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
