"""Claim 9 — a learnability curriculum vs uniform task sampling (issue #16, point 3).

On ``delegate`` (``star:3``, 3 parts of 3 types, joint PPO, the package defaults otherwise) a
task is one episode seed from a fixed pool of 32; an episode *passes* when every part is solved
(``Outcome.success``). Three arms, each with the same env-step budget (the episode counts
they reach are reported next to it):

* ``uniform``: every task of the pool alike, at the hardest level (all 3 parts pending);
* ``learnability``: tasks sampled in proportion to ``√(p̂(1 − p̂))`` of their estimated pass
  rate, with ε = 0.1 of uniform exploration, at the hardest level;
* ``learnability-levels``: the same sampler over the pool × the ``active_parts`` difficulty
  levels 1, 2, 3 (``difficulty: seed``): it may start on easier versions of the tasks.

Compared: the training success rate (hardest-level arms), the greedy evaluation of the final
checkpoint on fresh tasks at the hardest level (every arm), and the curriculum's own metrics
(``curriculum/utility_mean``, ``curriculum/learnable_share``, ``curriculum/difficulty``).
PPO updates per env step, not per group: there is no group whose signal dynamic sampling could
throw away, so what the curriculum can buy here is only *which* tasks are practised.

Run: ``python -m experiments.curriculum`` (``--full`` for a larger budget, ``--smoke``;
``--arms uniform learnability`` runs only those arms).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from experiments import analysis as an
from experiments import harness
from experiments.harness import Condition

CLAIM = "curriculum"
TITLE = "Learnability curriculum vs uniform task sampling"
PUBLISHED = (
    "Learnability curricula (sampling tasks by √(p(1−p)) of their pass rate) are reported to "
    "speed up RL on verifiable tasks by keeping training on tasks that are neither solved nor "
    "hopeless."
)
TASKS = 32
BUDGETS: dict[str, dict[str, Any]] = {
    "smoke": {"iterations": 2, "eval": 3},
    "default": {"iterations": 12, "eval": 50},
    "full": {"iterations": 100, "eval": 200},
}
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "uniform": ("uniform over 32 tasks", {"mode": "uniform"}),
    "learnability": ("learnability over 32 tasks", {"mode": "learnability"}),
    "learnability-levels": (
        "learnability over 32 tasks × 3 levels",
        {"mode": "learnability", "levels": [0, 1, 2]},
    ),
}


HEADERS = ["arm", "seeds", "env steps", "episodes", "training success", "greedy eval success",
           "greedy eval return", "utility", "learnable", "difficulty"]  # fmt: skip
#: learnability vs uniform, per seed
CHECKS: tuple[an.Check, ...] = (
    ("final training success", an.final, "success"),
    ("greedy evaluation success", an.eval_value, "success"),
    ("greedy evaluation return", an.eval_value, "return"),
)


def conditions(budget: str) -> list[Condition]:
    """The three arms for ``budget``."""
    b = BUDGETS[budget]
    out = []
    for name, (label, section) in ARMS.items():
        config: dict[str, Any] = {
            "scenario": "delegate",
            "topology": "star:3",
            "budget": {"iterations": b["iterations"]},
            "curriculum": {"tasks": TASKS, **section},
        }
        if "levels" in section:
            config["scenario_kwargs"] = {"difficulty": "seed"}
        out.append(Condition(name, label, config, {"arm": name}, b["eval"]))
    return out


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the claim (see the module docstring); returns the records."""
    p = harness.parser(CLAIM, "Learnability curriculum vs uniform task sampling on delegate.")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="arms to run")
    args = p.parse_args(argv)
    ctx = harness.context(CLAIM, args, argv)
    chosen = [c for c in conditions(ctx.budget) if c.name in args.arms]
    return harness.run_claim(ctx, chosen, args.seeds)


# ----- report -------------------------------------------------------------------------------
def _episodes(record: Mapping[str, Any]) -> float:
    return float(sum(h.get("episodes", 0) for h in record["history"]))


def report(records: Sequence[Mapping[str, Any]], fig: an.Figures) -> str:
    """The claim's section body."""
    groups = an.group(records, order=list(ARMS))
    if not groups:
        return ""
    labels = {n: rs[0]["label"] for n, rs in groups.items()}
    rows = [
        [
            labels[name],
            len(rs),
            an.fmt([r["env_steps"] for r in rs], digits=0),
            an.fmt([_episodes(r) for r in rs], digits=0),
            an.fmt([an.final(r, "success") for r in rs], pct=True)
            if name != "learnability-levels"
            else "mixed levels",
            an.fmt([an.eval_value(r, "success") for r in rs], pct=True),
            an.fmt([an.eval_value(r, "return") for r in rs]),
            an.fmt([an.final(r, "curriculum/utility_mean") for r in rs]),
            an.fmt([an.final(r, "curriculum/learnable_share") for r in rs], pct=True),
            an.fmt([an.final(r, "curriculum/difficulty") for r in rs], digits=2)
            if name == "learnability-levels"
            else "2 (fixed)",
        ]
        for name, rs in groups.items()
    ]
    out = [
        "*Training success* is the share of training episodes that solved every part (last "
        f"{an.LAST} iterations); *greedy eval* runs the final checkpoint on fresh tasks at the "
        "hardest level; *utility* is the expected √(p̂(1−p̂)) of a drawn task; *learnable* the "
        "share of tasks with p̂ in [0.1, 0.9]; *difficulty* the expected level index of a drawn "
        "task (0: one part pending, 2: all three; the hardest-level arms have only level 2).",
        "",
        an.table(HEADERS, rows),
        "",
    ]
    uniform, learn = groups.get("uniform"), groups.get("learnability")
    if uniform and learn:
        names = ("learnability", "uniform")
        out += ["**Computed findings:**", "", *an.findings(learn, uniform, names, CHECKS)]
        levels = groups.get("learnability-levels")
        if levels:
            out += an.findings(
                levels,
                uniform,
                ("learnability over levels", "uniform"),
                [("greedy evaluation success", an.eval_value, "success")],
            )
        out.append("")
    hard = {n: rs for n, rs in groups.items() if n != "learnability-levels"}
    out.append(
        an.curve_figure(
            fig,
            hard,
            "success",
            labels,
            "training success rate",
            "curriculum vs uniform: training success vs env steps (hardest level)",
        )
    )
    return "\n".join(out)


if __name__ == "__main__":
    harness.run_as_script(main)
