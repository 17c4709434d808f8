"""Claim 7 — a majority of noisy judges trains like the exact verifier it approximates.

On ``delegate`` ``star:3`` (the orchestrator trains with PPO against frozen scripted workers)
the reward is replaced by a ``judge`` reward source (``rewards:`` in the config) whose judges
give the success verdict of the episode (all parts solved: 1, else 0):

* ``exact``: one judge that is always right (the exact verifier's verdict);
* ``noisy-1``: one judge that flips the verdict with probability 0.2
  (``experiments.judges:noisy_verifier``);
* ``majority-5``: five such judges with independent noise, majority vote (a verdict is
  wrong only when at least three flip: probability 0.058).

Every arm is measured on the *true* success (the verifier's ``Outcome.success``, training
episodes and greedy evaluation of the final checkpoint), whatever reward it trained on; the
judges' own disagreement and failures are logged as ``reward/judge_disagreement`` and
``reward/judge_failures``.

Run: ``python -m experiments.judge_voting`` (``--full`` for a larger budget, ``--smoke``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from experiments import analysis as an
from experiments import harness
from experiments.harness import Condition

CLAIM = "judge_voting"
TITLE = "Judge majority vs the exact verifier as the training reward"
PUBLISHED = (
    "LLM judges are noisy; practitioners vote several judges (majority or mean) and expect the "
    "vote to train like the exact reward it approximates, while a single noisy judge trains "
    "worse."
)
BUDGETS = harness.iteration_budgets(default=12, full=40)
FLIP = 0.2
ARMS = (("exact", 1, 0.0), ("noisy-1", 1, FLIP), ("majority-5", 5, FLIP))
LABELS = {
    "exact": "exact verdict (1 judge, no noise)",
    "noisy-1": f"1 noisy judge ({int(100 * FLIP)}% flips)",
    "majority-5": f"majority of 5 noisy judges ({int(100 * FLIP)}% flips each)",
}


def rewards(judges: int, flip: float) -> dict[str, Any]:
    """The ``rewards:`` section of one arm: one judge source, ``judges`` judges."""
    panel = [
        {"ref": "experiments.judges:noisy_verifier", "kwargs": {"flip": flip, "seed": i}}
        for i in range(judges)
    ]
    return {"sources": [{"name": "verdict", "kind": "judge", "judges": panel, "vote": "majority"}]}


def conditions(budget: str) -> list[Condition]:
    """The three arms for ``budget``."""
    b = BUDGETS[budget]
    base = {
        "scenario": "delegate",
        "topology": "star:3",
        "train": ["orchestrator"],
        "budget": {"iterations": b["iterations"]},
    }
    return [
        Condition(
            name,
            LABELS[name],
            {**base, "rewards": rewards(judges, flip)},
            {"judges": judges, "flip": flip},
            b["eval"],
        )
        for name, judges, flip in ARMS
    ]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the claim (see the module docstring); returns the records."""
    p = harness.parser(CLAIM, "A majority of noisy judges vs the exact verifier as reward.")
    args = p.parse_args(argv)
    ctx = harness.context(CLAIM, args, argv)
    return harness.run_claim(ctx, conditions(ctx.budget), args.seeds)


# ----- report -------------------------------------------------------------------------------
def report(records: Sequence[Mapping[str, Any]], fig: an.Figures) -> str:
    """The claim's section body: what ran, tables, computed findings and plots."""
    groups = an.group(records, order=[name for name, _, _ in ARMS])
    if not groups:
        return ""
    labels = {name: rs[0]["label"] for name, rs in groups.items()}
    rows = [
        [
            labels[name],
            len(rs),
            an.fmt([an.final(r, "success") for r in rs], pct=True),
            an.fmt([an.final(r, "solved_fraction") for r in rs], pct=True),
            an.fmt([an.final(r, "reward/judge_disagreement") for r in rs]),
            an.fmt([an.eval_value(r, "success") for r in rs], pct=True),
            an.fmt([an.eval_value(r, "return") for r in rs]),
        ]
        for name, rs in groups.items()
    ]
    out = [
        "Success is the verifier's (all parts solved), whatever reward an arm trained on. Final "
        "training values are means over the last 3 iterations; ± is the standard deviation "
        "across seeds, brackets the min–max. Greedy evaluation: the final checkpoint on "
        f"{an.eval_episodes(records)} fresh tasks, scored by the scenario's own reward "
        "(solved/K − λ·latency − μ·calls), which no arm trained on.",
        "",
        an.table(
            [
                "arm",
                "seeds",
                "final success (training)",
                "final solved parts",
                "judge disagreement",
                "greedy eval success",
                "greedy eval return (verifier)",
            ],
            rows,
        ),
        "",
        "**Computed findings** (rule: an arm is called better only when its per-seed range does "
        "not overlap the other's):",
        "",
    ]
    checks = (
        ("final training success", an.final, "success"),
        ("greedy evaluation success", an.eval_value, "success"),
    )
    for a, b in (("majority-5", "exact"), ("majority-5", "noisy-1"), ("noisy-1", "exact")):
        if a in groups and b in groups:
            out += an.findings(groups[a], groups[b], (a, b), checks)
    caption = "true success of training episodes vs env steps"
    out += ["", an.curve_figure(fig, groups, "success", labels, "success (training)", caption)]
    return "\n".join(out)


if __name__ == "__main__":
    harness.run_as_script(main)
