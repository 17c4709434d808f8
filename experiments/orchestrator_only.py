"""Claim 1 — orchestrator-only training with frozen subagents (Kimi K2.5's PARL).

PARL trains only the orchestrator and keeps the subagents frozen, which the K2.5 report argues
makes training stable and cheap. Here, on ``delegate`` (``star:3`` by default), two arms:

* ``orchestrator``: ``train=["orchestrator"]``; the workers are the scenario's frozen scripted
  policy (``delegate.scripted_worker``, which always picks the method matching a part's type);
* ``joint``: every agent learns (workers shared by role, as in ``marl run delegate``).

Same PPO settings, same env-step budget, seeds 0…N-1 (the hidden skill matrix is the
scenario's default, ``skills_seed=0``, in every run). Measured: team return and the fraction of
the exact oracle's expected return on the same tasks against env steps, the spread across
seeds, and a greedy evaluation of each final checkpoint on fresh tasks.

Note the arms do not face the same problem: with scripted workers the orchestrator only has to
learn who is good at what, while joint training must also learn the workers' methods. That is
the point of the claim (frozen subagents make the orchestrator's problem easier), not a flaw.

Run: ``python -m experiments.orchestrator_only`` (``--full`` for 100 iterations, ``--smoke``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from experiments import analysis as an
from experiments import harness
from experiments.harness import Condition

CLAIM = "orchestrator_only"
TITLE = "Orchestrator-only training with frozen subagents (PARL)"
PUBLISHED = (
    "Kimi K2.5's PARL trains only the orchestrator against frozen subagents and reports "
    "stable, efficient training of the orchestrator's decomposition and delegation."
)
BUDGETS = harness.iteration_budgets(default=40)
DEFAULT_TOPOLOGY = "star:3"
#: fractions of the oracle whose first crossing (3-iteration moving average) is reported.
TARGETS = (0.8, 0.9)


def conditions(budget: str, topology: str = DEFAULT_TOPOLOGY) -> list[Condition]:
    """The two arms for ``budget`` on ``delegate`` with ``topology``."""
    b = BUDGETS[budget]
    base = {"scenario": "delegate", "topology": topology, "budget": {"iterations": b["iterations"]}}
    tag = topology.replace(":", "")
    return [
        Condition(
            f"orchestrator-{tag}",
            "orchestrator only (frozen scripted workers)",
            {**base, "train": ["orchestrator"]},
            {"train": "orchestrator", "topology": topology},
            b["eval"],
        ),
        Condition(
            f"joint-{tag}",
            "joint (every agent learns)",
            base,
            {"train": "all", "topology": topology},
            b["eval"],
        ),
    ]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the claim (see the module docstring); returns the records."""
    p = harness.parser(CLAIM, "Orchestrator-only (frozen subagents) vs joint training.")
    p.add_argument("--topology", default=DEFAULT_TOPOLOGY, help="delegate topology (star:N)")
    args = p.parse_args(argv)
    ctx = harness.context(CLAIM, args, argv)
    return harness.run_claim(ctx, conditions(ctx.budget, args.topology), args.seeds)


# ----- report -------------------------------------------------------------------------------
def report(records: Sequence[Mapping[str, Any]], fig: an.Figures) -> str:
    """The claim's section body: what ran, tables, computed findings and plots."""
    groups = an.group(records)
    if not groups:
        return ""
    labels = {name: rs[0]["label"] for name, rs in groups.items()}
    rows = []
    for name, rs in groups.items():
        rows.append(
            [
                f"{labels[name]} · {rs[0]['params'].get('topology', '')}",
                len(rs),
                an.fmt([an.final(r, "team_return") for r in rs]),
                an.fmt([an.final(r, "oracle_fraction") for r in rs], pct=True),
                *[
                    an.fmt_steps([an.steps_to(r, "oracle_fraction", t) for r in rs])
                    for t in TARGETS
                ],
                an.fmt([an.eval_value(r, "oracle_fraction") for r in rs], pct=True),
                an.fmt([an.eval_value(r, "success") for r in rs], pct=True),
            ]
        )
    out = [
        "Final training values are means over the last 3 iterations; ± is the standard "
        "deviation across seeds, brackets the min–max. Steps to a target: first iteration "
        "whose 3-iteration moving average of the training oracle fraction reaches it. "
        f"Greedy evaluation: the final checkpoint on {an.eval_episodes(records)} fresh tasks "
        "(seeds from 1,000,000).",
        "",
        an.table(
            [
                "arm",
                "seeds",
                "final return",
                "final % of oracle",
                *[f"env steps to {int(100 * t)}% of oracle" for t in TARGETS],
                "greedy eval % of oracle",
                "greedy eval success",
            ],
            rows,
        ),
        "",
        "**Computed findings** (rule: an arm is called better only when its per-seed range does "
        "not overlap the other's):",
        "",
    ]
    names = list(groups)
    orch = next((n for n in names if n.startswith("orchestrator")), None)
    joint = next((n for n in names if n.startswith("joint")), None)
    if orch and joint:
        a, b = groups[orch], groups[joint]
        out += an.findings(
            a,
            b,
            ("orchestrator-only", "joint"),
            an.ORACLE_CHECKS,
        )
        for t in TARGETS:
            sa = [an.steps_to(r, "oracle_fraction", t) for r in a]
            sb = [an.steps_to(r, "oracle_fraction", t) for r in b]
            out.append(
                f"- {int(100 * t)}% of oracle reached by {sum(v is not None for v in sa)}/{len(sa)}"
                f" orchestrator-only seeds and {sum(v is not None for v in sb)}/{len(sb)} joint "
                "seeds within the budget"
            )
        spread = {
            n: an.stats(an.final(r, "oracle_fraction") for r in groups[n])["std"]
            for n in (orch, joint)
        }
        out.append(
            "- spread across seeds (std of the final fraction of oracle): orchestrator-only "
            f"{100 * spread[orch]:.1f} points, joint {100 * spread[joint]:.1f} points"
        )
    plt = an.pyplot()
    f, axes = plt.subplots(1, 2, figsize=(11, 4))
    an.curves(axes[0], groups, "oracle_fraction", labels)
    axes[0].set_ylabel("fraction of oracle (training episodes)")
    axes[0].axhline(1.0, color="k", linestyle=":", linewidth=1)
    an.curves(axes[1], groups, "team_return", labels)
    axes[1].set_ylabel("team return")
    axes[0].legend(loc="lower right", fontsize=8)
    out += ["", fig.save(f, "curves", "fraction of oracle and return vs env steps")]
    return "\n".join(out)


if __name__ == "__main__":
    harness.run_as_script(main)
