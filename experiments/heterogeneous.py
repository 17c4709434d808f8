"""Claim 4 — heterogeneous teams (MARS2: diverse agents beat a single larger one).

On ``delegate`` (``star:3``, joint training: every agent learns), two arms with the same
orchestrator (an MLP ``[64, 64]``) and the same total number of worker parameters:

* ``heterogeneous``: every worker its own pool and its own architecture — ``worker_0`` a
  recurrent GRU pool, ``worker_1`` a small MLP ``[32]``, ``worker_2`` an MLP ``[64, 64]`` with
  ReLU (no parameter sharing between workers);
* ``homogeneous``: one shared worker pool (parameter sharing by role), an MLP ``[h, h]`` whose
  width ``h`` is chosen so that its parameter count is the closest to the heterogeneous
  workers' total.

Parameters are counted on the modules RLlib builds (policy and value networks together, since
PPO trains both), and printed and reported. Caveats: the GRU pool makes RLlib sample complete
episodes in the heterogeneous arm (``batch_mode="complete_episodes"``), while the homogeneous
arm uses truncated fragments; and the shared pool learns from three workers' experience, the
separate pools from one each — which is part of what sharing buys.

Run: ``python -m experiments.heterogeneous`` (``--full`` for 100 iterations, ``--smoke``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from experiments import analysis as an
from experiments import harness
from experiments.harness import Condition

CLAIM = "heterogeneous"
TITLE = "Heterogeneous pools vs one homogeneous pool of the same size (MARS2)"
PUBLISHED = (
    "MARS2 reports that teams of diverse (heterogeneous) agents outperform a single larger "
    "homogeneous model."
)
BUDGETS = harness.iteration_budgets(default=25)
ORCHESTRATOR = {"model": {"type": "mlp", "hidden": [64, 64]}}
HETEROGENEOUS_WORKERS: dict[str, dict[str, Any]] = {
    "worker_0": {"model": {"type": "gru", "hidden": [32], "gru_size": 32, "max_seq_len": 8}},
    "worker_1": {"model": {"type": "mlp", "hidden": [32]}},
    "worker_2": {"model": {"type": "mlp", "hidden": [64, 64], "activation": "relu"}},
}
BASE = {"scenario": "delegate", "topology": "star:3"}


def heterogeneous_config() -> dict[str, Any]:
    """The heterogeneous arm's config (without budget)."""
    return {
        **BASE,
        "sharing": "agent",
        "pools": {"orchestrator": ORCHESTRATOR, **HETEROGENEOUS_WORKERS},
    }


def homogeneous_config(width: int) -> dict[str, Any]:
    """The homogeneous arm's config with a shared worker MLP ``[width, width]``."""
    return {
        **BASE,
        "sharing": "role",
        "pools": {
            "orchestrator": ORCHESTRATOR,
            "worker": {"model": {"type": "mlp", "hidden": [width, width]}},
        },
    }


def parameter_counts(config: Mapping[str, Any]) -> dict[str, int]:
    """Pool id → trainable parameters of the module RLlib builds for it (no Ray started)."""
    from marl_agents.modules import module_spec
    from trainers.configs.experiment import ExperimentConfig
    from trainers.plan import resolve

    cfg = ExperimentConfig.from_dict(dict(config))
    plan = resolve(cfg)
    default = cfg.algorithm.algorithm_class().get_default_config()
    counts = {}
    for pid, pool in plan.pools.items():
        spec = module_spec(pool, plan.env)
        if spec.module_class is None:  # mlp pools: the algorithm's default module
            spec.module_class = default.get_default_rl_module_spec().module_class
        module = spec.build()
        counts[pid] = int(sum(p.numel() for p in module.parameters() if p.requires_grad))
    return counts


@lru_cache(maxsize=1)
def matched_width() -> tuple[int, dict[str, int], dict[str, int]]:
    """The homogeneous width whose worker pool is closest in size to the heterogeneous workers,
    with both arms' parameter counts."""
    het = parameter_counts(heterogeneous_config())
    target = sum(v for k, v in het.items() if k != "orchestrator")
    best: tuple[int, int, dict[str, int]] | None = None
    lo, hi = 4, 1024
    while lo <= hi:  # the count grows with the width: bisect, then check the neighbours
        mid = (lo + hi) // 2
        if parameter_counts(homogeneous_config(mid))["worker"] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    for width in {max(4, lo - 1), lo, lo + 1}:
        counts = parameter_counts(homogeneous_config(width))
        gap = abs(counts["worker"] - target)
        if best is None or gap < best[1]:
            best = (width, gap, counts)
    assert best is not None
    return best[0], het, best[2]


def conditions(budget: str) -> list[Condition]:
    """The two arms (the homogeneous width matched to the heterogeneous parameter count)."""
    b = BUDGETS[budget]
    width, het, hom = matched_width()
    counts = {"heterogeneous": het, "homogeneous": hom, "width": width}
    run = {"budget": {"iterations": b["iterations"]}}
    return [
        Condition(
            "heterogeneous",
            "heterogeneous (GRU / MLP[32] / MLP[64,64] relu, one pool per worker)",
            {**heterogeneous_config(), **run},
            {"arm": "heterogeneous"},
            b["eval"],
            {"parameters": counts},
        ),
        Condition(
            "homogeneous",
            f"homogeneous (one shared worker MLP[{width},{width}])",
            {**homogeneous_config(width), **run},
            {"arm": "homogeneous", "width": width},
            b["eval"],
            {"parameters": counts},
        ),
    ]


def print_counts() -> None:
    """Print both arms' parameter counts per pool."""
    width, het, hom = matched_width()
    for name, counts in (("heterogeneous", het), ("homogeneous", hom)):
        workers = sum(v for k, v in counts.items() if k != "orchestrator")
        detail = ", ".join(f"{k} {v:,}" for k, v in counts.items())
        print(f"{name}: {detail} — workers {workers:,}, total {sum(counts.values()):,}")
    print(f"(homogeneous worker width {width} is the closest match)")


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the claim (see the module docstring); returns the records."""
    p = harness.parser(CLAIM, "Heterogeneous pools vs a homogeneous pool of equal size.")
    p.add_argument("--count-only", action="store_true", help="print parameter counts and stop")
    args = p.parse_args(argv)
    ctx = harness.context(CLAIM, args, argv)
    if not args.quiet or args.count_only:
        print_counts()
    if args.count_only:
        return []
    return harness.run_claim(ctx, conditions(ctx.budget), args.seeds)


# ----- report -------------------------------------------------------------------------------
def report(records: Sequence[Mapping[str, Any]], fig: an.Figures) -> str:
    """The claim's section body."""
    groups = an.group(records, order=["heterogeneous", "homogeneous"])
    if not groups:
        return ""
    first = next(iter(groups.values()))[0]
    counts = first["extra"]["parameters"]
    count_rows = []
    for arm in ("heterogeneous", "homogeneous"):
        c = counts[arm]
        workers = sum(v for k, v in c.items() if k != "orchestrator")
        count_rows.append(
            [
                arm,
                ", ".join(f"{k}: {v:,}" for k, v in c.items()),
                f"{workers:,}",
                f"{sum(c.values()):,}",
            ]
        )
    labels = {name: rs[0]["label"] for name, rs in groups.items()}
    rows = [
        [
            labels[name],
            len(rs),
            an.fmt([an.final(r, "team_return") for r in rs]),
            an.fmt([an.final(r, "oracle_fraction") for r in rs], pct=True),
            an.fmt_steps([an.steps_to(r, "oracle_fraction", 0.8) for r in rs]),
            an.fmt([an.eval_value(r, "oracle_fraction") for r in rs], pct=True),
            an.fmt([an.eval_value(r, "success") for r in rs], pct=True),
        ]
        for name, rs in groups.items()
    ]
    out = [
        "Parameters (policy + value networks, as built by RLlib):",
        "",
        an.table(["arm", "per pool", "workers", "total"], count_rows),
        "",
        an.table(
            [
                "arm",
                "seeds",
                "final return",
                "final % of oracle",
                "env steps to 80% of oracle",
                "greedy eval % of oracle",
                "greedy eval success",
            ],
            rows,
        ),
        "",
    ]
    if "heterogeneous" in groups and "homogeneous" in groups:
        het, hom = groups["heterogeneous"], groups["homogeneous"]
        out += [
            "**Computed findings:**",
            "",
            *an.findings(
                het,
                hom,
                ("heterogeneous", "homogeneous"),
                an.ORACLE_CHECKS,
            ),
            "",
        ]
    out.append(
        an.curve_figure(
            fig,
            groups,
            "oracle_fraction",
            {k: k for k in groups},
            "fraction of oracle (training episodes)",
            "heterogeneous vs homogeneous learning curves",
        )
    )
    return "\n".join(out)


if __name__ == "__main__":
    harness.run_as_script(main)
