"""Claim 5 — a single agent vs a team on the same task and env-step budget.

On ``delegate`` with the same task distribution (3 parts of 3 types, the same skill draws), two
arms trained with the same PPO settings and the same number of env steps:

* ``single``: the degenerate topology — one generalist agent does every part in one step; its
  skill on a type is the mean of the specialists' skills (the average specialist), it cannot
  retry, and an episode is one env step;
* ``team``: ``star:3`` — an orchestrator and three hidden-skill specialists, trained jointly
  (every agent learns), with retries and fan-out.

The reward is the same function (``solved/K − λ·latency − μ·calls``; the single agent pays one
round and no calls), so team returns compare directly. Each arm also has its own exact oracle
(the best achievable in that topology), reported next to it: the gap between the two oracles is
what the team structure can buy at most. Equal env steps are not equal episodes: the single
agent sees several times more episodes (one step each); both counts are reported.

Run: ``python -m experiments.single_vs_team`` (``--full`` for a larger budget, ``--smoke``;
``--team-train orchestrator`` trains only the team's orchestrator against frozen workers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from experiments import analysis as an
from experiments import harness
from experiments.harness import Condition

CLAIM = "single_vs_team"
TITLE = "Single agent vs team at the same env-step budget"
PUBLISHED = (
    "Multi-agent systems are usually presented as beating one agent on the same task; a fair "
    "check uses the same task, reward and budget, with one agent as the degenerate topology."
)
BUDGETS: dict[str, dict[str, Any]] = {
    "smoke": {"env_steps": 200, "eval": 3},
    "default": {"env_steps": 20_000, "eval": 100},
    "full": {"env_steps": 100_000, "eval": 200},
}


def conditions(budget: str, team_train: str = "all", team: str = "star:3") -> list[Condition]:
    """The single and team arms for ``budget``."""
    b = BUDGETS[budget]
    run = {"scenario": "delegate", "budget": {"iterations": None, "env_steps": b["env_steps"]}}
    team_cfg: dict[str, Any] = {**run, "topology": team}
    if team_train != "all":
        team_cfg["train"] = [team_train]
    tag = team.replace(":", "")
    return [
        Condition(
            "single", "single agent", {**run, "topology": "single"}, {"arm": "single"}, b["eval"]
        ),
        Condition(
            f"team-{tag}" + ("" if team_train == "all" else f"-{team_train}"),
            f"team {team} ({'joint' if team_train == 'all' else team_train + ' only'})",
            team_cfg,
            {"arm": "team", "topology": team, "train": team_train},
            b["eval"],
        ),
    ]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the claim (see the module docstring); returns the records."""
    p = harness.parser(CLAIM, "One agent vs a team on delegate at the same env-step budget.")
    p.add_argument("--team", default="star:3", help="the team topology (star:N)")
    p.add_argument(
        "--team-train",
        default="all",
        choices=("all", "orchestrator"),
        help="train every team agent (default) or only the orchestrator",
    )
    args = p.parse_args(argv)
    ctx = harness.context(CLAIM, args, argv)
    return harness.run_claim(ctx, conditions(ctx.budget, args.team_train, args.team), args.seeds)


# ----- report -------------------------------------------------------------------------------
def report(records: Sequence[Mapping[str, Any]], fig: an.Figures) -> str:
    """The claim's section body."""
    groups = an.group(records)
    if not groups:
        return ""
    names = sorted(groups, key=lambda n: (n != "single", n))
    groups = {n: groups[n] for n in names}
    labels = {n: rs[0]["label"] for n, rs in groups.items()}
    rows = []
    for name, rs in groups.items():
        episodes = [sum(h.get("episodes", 0) for h in r["history"]) for r in rs]
        rows.append(
            [
                labels[name],
                len(rs),
                an.fmt([r["env_steps"] for r in rs], digits=0),
                an.fmt(episodes, digits=0),
                an.fmt([an.final(r, "team_return") for r in rs]),
                an.fmt([an.final(r, "oracle") for r in rs]),
                an.fmt([an.final(r, "oracle_fraction") for r in rs], pct=True),
                an.fmt([an.eval_value(r, "return") for r in rs]),
                an.fmt([an.eval_value(r, "success") for r in rs], pct=True),
            ]
        )
    out = [
        "Returns are on the same scale in both arms. *Oracle* = the exact optimum of that "
        "topology on the same tasks (training episodes); *% of own oracle* compares each arm "
        "with its own ceiling.",
        "",
        an.table(
            [
                "arm",
                "seeds",
                "env steps",
                "episodes",
                "final return",
                "own oracle",
                "% of own oracle",
                "greedy eval return",
                "greedy eval success",
            ],
            rows,
        ),
        "",
    ]
    single = groups.get("single")
    team = next((rs for n, rs in groups.items() if n != "single"), None)
    if single and team:
        ceiling = {
            k: an.fmt([an.final(r, "oracle") for r in v])
            for k, v in (("team", team), ("single", single))
        }
        out += [
            "**Computed findings:**",
            "",
            *an.findings(
                team,
                single,
                ("team", "single"),
                [
                    ("final training return", an.final, "team_return"),
                    ("greedy evaluation return", an.eval_value, "return"),
                ],
            ),
            f"- ceilings: the team's oracle averages {ceiling['team']}, the single agent's "
            f"{ceiling['single']}",
            "",
        ]

    def oracles(ax: Any) -> None:
        for i, rs in enumerate(groups.values()):
            oracle = an.stats(an.final(r, "oracle") for r in rs)["mean"]
            ax.axhline(oracle, color=f"C{i}", linestyle=":", linewidth=1)

    out.append(
        an.curve_figure(
            fig,
            groups,
            "team_return",
            labels,
            "team return (dotted: each arm's oracle)",
            "single vs team return vs env steps",
            oracles,
        )
    )
    return "\n".join(out)


if __name__ == "__main__":
    harness.run_as_script(main)
