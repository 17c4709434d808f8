"""Claim 12 — a centralised critic (MAPPO) against independent critics (IPPO) on the built-ins.

Joint training (every agent learns, one pool per role) on ``relay`` and ``delegate``
(``star:3``) with ``algorithm: MAPPO`` (the critic reads the scenario's global state, the
agent's own observation and its id: ``critic: state_obs``) and ``algorithm: IPPO`` (each critic
reads its own observation); value normalisation on in both, every other setting equal. On
``relay`` (hidden information: each worker sees one bit of the answer, the orchestrator sees
none) both run with team credit and with Shapley credit, where Shapley credit stayed at chance
in claim 3 (a worker's message carries nothing at the start, so its Shapley credit is 0): a
critic that sees the whole state could still value the workers' states.

Targets, fixed before running (as claim 3's): ``relay`` a team return of 0.9 (and 0.5);
``delegate`` 80% of the exact oracle's expected return (and 0.5).

Run: ``python -m experiments.critics`` (``--full`` for longer training, ``--smoke``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from experiments import analysis as an
from experiments import harness
from experiments.harness import Condition

CLAIM = "critics"
TITLE = "Centralised critic (MAPPO) vs independent critics (IPPO) on the built-ins"
PUBLISHED = (
    "MAPPO (Yu et al., 2022) reports that PPO with a centralised value function over the "
    "global state matches or beats independent PPO critics on cooperative tasks."
)
ALGOS = ("IPPO", "MAPPO")
#: scenario → the credit methods run there
ARMS: dict[str, tuple[str, ...]] = {"relay": ("team", "shapley"), "delegate": ("team",)}
#: scenario → (training metric, main target, description, a lower second target)
TARGETS: dict[str, tuple[str, float, str, float]] = {
    "delegate": ("oracle_fraction", 0.8, "80% of the oracle's expected return", 0.5),
    "relay": ("team_return", 0.9, "team return 0.9 (exact answer in 90% of episodes)", 0.5),
}
BUDGETS: dict[str, dict[str, Any]] = {
    "smoke": {"iterations": {"relay": 2, "delegate": 2}, "eval": 3},
    "default": {"iterations": {"relay": 20, "delegate": 20}, "eval": 100},
    "full": {"iterations": {"relay": 60, "delegate": 60}, "eval": 200},
}


def conditions(budget: str) -> list[Condition]:
    """Every (scenario, credit, algorithm) arm for ``budget``."""
    b = BUDGETS[budget]
    return [
        Condition(
            f"{scenario}-{credit}-{algo}",
            f"{scenario} · {credit} · {algo}",
            {
                "scenario": scenario,
                "topology": "star:3",
                "algorithm": {"name": algo},
                "credit": {"method": credit},
                "budget": {"iterations": b["iterations"][scenario]},
            },
            {"scenario": scenario, "credit": credit, "algo": algo},
            b["eval"],
        )
        for scenario, credits in ARMS.items()
        for credit in credits
        for algo in ALGOS
    ]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the claim (see the module docstring); returns the records."""
    p = harness.parser(CLAIM, "MAPPO vs IPPO on relay and delegate.")
    args = p.parse_args(argv)
    ctx = harness.context(CLAIM, args, argv)
    return harness.run_claim(ctx, conditions(ctx.budget), args.seeds)


# ----- report -------------------------------------------------------------------------------
def report(records: Sequence[Mapping[str, Any]], fig: an.Figures) -> str:
    """The claim's section body: one table and one figure per scenario."""
    groups = an.group(records)
    present = [s for s in ARMS if any(n.startswith(f"{s}-") for n in groups)]
    if not present:
        return ""
    plt = an.pyplot()
    f, axes = plt.subplots(1, len(present), figsize=(5.5 * len(present), 4), squeeze=False)
    out: list[str] = []
    for i, scenario in enumerate(present):
        key, target, text, lower = TARGETS[scenario]
        rows, finals, curves = [], {}, {}
        for credit in ARMS[scenario]:
            for algo in ALGOS:
                name = f"{scenario}-{credit}-{algo}"
                rs = groups.get(name, [])
                if not rs:
                    continue
                finals[(credit, algo)] = [an.final(r, "team_return") for r in rs]
                curves[f"{credit} · {algo}"] = rs
                wall = an.stats(h.get("iteration_s") for r in rs for h in r["history"])["mean"]
                rows.append(
                    [
                        credit,
                        algo,
                        len(rs),
                        an.fmt_steps([an.steps_to(r, key, lower) for r in rs]),
                        an.fmt_steps([an.steps_to(r, key, target) for r in rs]),
                        an.fmt(finals[(credit, algo)]),
                        an.fmt([an.final(r, "oracle_fraction") for r in rs], pct=True),
                        an.fmt([an.eval_value(r, "return") for r in rs]),
                        f"{wall:.1f}",
                    ]
                )
        out += [
            f"**{scenario}** (`star:3`, joint training; target: {text}, and a lower one of "
            f"{lower:g}; 3-iteration moving average of the training `{key}`).",
            "",
            an.table(
                [
                    "credit",
                    "critic",
                    "seeds",
                    f"env steps to {lower:g}",
                    f"env steps to {target:g}",
                    "final return",
                    "final % of oracle",
                    "greedy eval return",
                    "s / iteration",
                ],
                rows,
            ),
            "",
        ]
        for credit in ARMS[scenario]:
            if (credit, "MAPPO") in finals and (credit, "IPPO") in finals:
                out.append(
                    f"- {scenario} · {credit}, final return: "
                    + an.compare(
                        finals[(credit, "MAPPO")], finals[(credit, "IPPO")], "MAPPO", "IPPO"
                    )
                )
        out.append("")
        ax = axes[0][i]
        an.curves(ax, curves, key, {k: k for k in curves})
        ax.axhline(target, color="k", linestyle=":", linewidth=1, label="target")
        ax.set_ylabel(f"training {key}")
        ax.set_title(scenario, fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    out += [fig.save(f, "curves", "learning curves, MAPPO vs IPPO"), ""]
    return "\n".join(out)


if __name__ == "__main__":
    harness.run_as_script(main)
