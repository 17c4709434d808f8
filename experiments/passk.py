"""Claim 7 — does RL widen or narrow what the team solves? pass@1…pass@16 before and after GRPO.

The job of ``examples/finetune_tiny.yaml`` (the tiny in-code LLM as the orchestrator of
``text-delegate`` easy, ``star:8``, frozen scripted specialists, token-level GRPO) is trained
per seed; then its final checkpoint and its starting point (the same tiny model before any
update: the weights training started from) each sample ``k = 16`` episodes per task on the
same 32 evaluation tasks, with the policy's training temperature and fixed sampling seeds
(:func:`trainers.evaluate.evaluate` with ``k``). Reported: pass@k (Chen et al.'s unbiased
estimator over the 16 samples), mean@k (mean return) and best@k for k = 1, 2, 4, 8, 16.

RL *narrows* the team if pass@16 falls while pass@1 rises (the published finding for LLM
reasoning RL: sharper but not broader); it *widens* it if pass@16 rises too.

Run: ``python -m experiments.passk`` (``--smoke`` for a pipeline check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments import analysis as an
from experiments import harness
from experiments.harness import Condition

CLAIM = "passk"
TITLE = "pass@k before and after GRPO: does RL widen or narrow what the team solves?"
PUBLISHED = (
    "Yue et al. (2025, 'Does RL really incentivize reasoning capacity…') report that RL with "
    "verifiable rewards raises pass@1 but lowers pass@k at large k: RL sharpens the base "
    "model's distribution rather than widening what it can solve."
)
BUDGETS: dict[str, dict[str, Any]] = {
    "smoke": {"iterations": 2, "tasks": 2, "k": 4},
    "default": {"iterations": 40, "tasks": 32, "k": 16},
    "full": {"iterations": 70, "tasks": 64, "k": 16},
}
JOB = harness.ROOT / "examples" / "finetune_tiny.yaml"
EVAL_SEED = 1_000_000


def conditions(budget: str) -> list[Condition]:
    """The one trained arm (the baseline is its starting point, sampled after training)."""
    from trainers.finetune import FinetuneJob

    job = FinetuneJob.from_yaml(JOB)
    config = job.to_experiment().to_dict()
    for key in ("seed", "logging", "output"):
        config.pop(key, None)
    config["budget"] = {"iterations": BUDGETS[budget]["iterations"]}
    return [Condition("grpo", "GRPO (finetune_tiny)", config)]


def passk_record(ctx: harness.Context, record: Mapping[str, Any]) -> dict[str, Any]:
    """pass@k of a run's final checkpoint and of its starting point (saved; reused while the
    run is the same one: its directory, ``k`` and the training record's ``created`` time, so
    a retrained seed, which writes to the same directory, is measured again)."""
    from trainers.evaluate import evaluate

    b = BUDGETS[ctx.budget]
    name = f"passk_seed{record['seed']}"
    path = ctx.dir / f"{name}.json"
    if path.exists():
        saved = harness.read_json(path)
        same = (saved.get("run_dir"), saved.get("k"), saved.get("run_created")) == (
            record["run_dir"],
            b["k"],
            record.get("created"),
        )
        if same and "solved" in saved:
            return saved
    ckpt = Path(record["run_dir"]) / "checkpoint"
    result = evaluate(ckpt, b["tasks"], seed=EVAL_SEED, k=b["k"], baseline="init", show=False)
    data = {
        "kind": "passk",
        "seed": record["seed"],
        "run_dir": record["run_dir"],
        "run_created": record.get("created"),
        "tasks": b["tasks"],
        "k": b["k"],
        "trained": result.passk["trained"],
        "baseline": result.passk["baseline"],
        "solved": {arm: {str(t): c for t, c in s.items()} for arm, s in result.solved.items()},
    }
    harness.save_extra(ctx, name, data)
    return data


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = harness.parser(CLAIM, TITLE).parse_args(argv)
    ctx = harness.context(CLAIM, args, argv)
    records = harness.run_claim(ctx, conditions(ctx.budget), args.seeds)
    out = []
    for record in records:
        data = passk_record(ctx, record)
        t, b, top = data["trained"], data["baseline"], f"pass@{data['k']}"
        ctx.log(
            f"seed {record['seed']}: pass@1 {b['pass@1']:.3f} → {t['pass@1']:.3f}, "
            f"{top} {b[top]:.3f} → {t[top]:.3f}"
        )
        out.append(data)
    return out


def report(records: Sequence[Mapping[str, Any]], fig: an.Figures) -> str:
    """The claim's section body: pass@k, mean@k and best@k before and after, and a plot."""
    data = sorted(an.extras(records, "passk"), key=lambda d: d["seed"])
    if not data:
        return ""
    ks = [int(key.removeprefix("pass@")) for key in data[0]["trained"] if key.startswith("pass@")]
    rows = []
    for k in ks:
        row: list[Any] = [k]
        for metric in ("pass", "mean", "best"):
            before = [d["baseline"][f"{metric}@{k}"] for d in data]
            after = [d["trained"][f"{metric}@{k}"] for d in data]
            row += [an.fmt(before), an.fmt(after)]
        rows.append(row)
    head = ["k", "pass@k start", "pass@k GRPO", "mean@k start", "mean@k GRPO"]
    out = [
        f"{len(data)} seed(s), {data[0]['tasks']} tasks × {data[0]['k']} samples each "
        "(mean ± std over seeds):",
        "",
        an.table([*head, "best@k start", "best@k GRPO"], rows),
        "",
        "**Computed findings:**",
        "",
        *_findings(data, ks),
    ]
    plot = _plot(data, ks, fig)
    if plot:
        out += ["", plot]
    return "\n".join(out)


def _findings(data: Sequence[Mapping[str, Any]], ks: Sequence[int]) -> list[str]:
    lo, hi = ks[0], ks[-1]
    d1 = [d["trained"][f"pass@{lo}"] - d["baseline"][f"pass@{lo}"] for d in data]
    dk = [d["trained"][f"pass@{hi}"] - d["baseline"][f"pass@{hi}"] for d in data]
    mean1, meank = sum(d1) / len(d1), sum(dk) / len(dk)
    if meank > 0.02:
        verdict = "RL **widened** what the team solves (pass@{hi} rose)"
    elif meank < -0.02:
        verdict = "RL **narrowed** what the team solves (pass@{hi} fell)"
    else:
        verdict = "RL left pass@{hi} unchanged (|Δ| ≤ 0.02): sharper, not broader"
    return [
        *_overlap(data),
        f"- pass@{lo}: Δ = {mean1:+.3f} on average (per seed: "
        + ", ".join(f"{x:+.3f}" for x in d1)
        + ").",
        f"- pass@{hi}: Δ = {meank:+.3f} on average (per seed: "
        + ", ".join(f"{x:+.3f}" for x in dk)
        + ").",
        "- " + verdict.format(hi=hi) + " (rule: mean Δpass@k over seeds beyond ±0.02).",
    ]


def _overlap(data: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per seed: tasks solved (in any of the k samples) by the start only, GRPO only, both."""
    lines = []
    for d in data:
        solved = d.get("solved")
        if not solved:
            continue
        start = {t for t, c in solved["baseline"].items() if c > 0}
        after = {t for t, c in solved["trained"].items() if c > 0}
        lines.append(
            f"- seed {d['seed']}: of {d['tasks']} tasks, solved in {d['k']} samples by the start "
            f"only: {len(start - after)}, by GRPO only: {len(after - start)}, by both: "
            f"{len(start & after)}, by neither: {d['tasks'] - len(start | after)}."
        )
    return lines


def _plot(data: Sequence[Mapping[str, Any]], ks: Sequence[int], fig: an.Figures) -> str:
    plt = an.pyplot()
    if plt is None:
        return ""
    f, ax = plt.subplots(figsize=(6, 3.6))
    for arm, style in (("baseline", "--"), ("trained", "-")):
        for d in data:
            ys = [d[arm][f"pass@{k}"] for k in ks]
            label = ("start" if arm == "baseline" else "GRPO") if d is data[0] else None
            ax.plot(
                ks,
                ys,
                style,
                marker="o",
                color="C0" if arm == "trained" else "C1",
                label=label,
                alpha=0.8,
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ks), [str(k) for k in ks])
    ax.set_xlabel("k (samples per task)")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="center right")
    f.tight_layout()
    return fig.save(f, "passk", "pass@k before and after GRPO, one line per seed")


if __name__ == "__main__":
    harness.run_as_script(main)
