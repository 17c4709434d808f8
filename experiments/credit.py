"""Claim 3 — Shapley credit (SHARP reports gains over a shared team reward).

Part 1, training: joint training (every agent learns) on ``relay`` and ``delegate``
(``star:3``) with each credit method: ``team`` (everyone gets the team reward), ``local``
(each agent's own ``Outcome.local`` reward), ``loo`` (leave-one-out difference rewards) and
``shapley`` (exact Shapley values from counterfactual replays; 4 agents, 16 coalitions an
episode). A method the scenario cannot support is reported as such (``relay`` defines no
per-agent reward, so ``local`` does not run there).

Target scores, fixed before running:

* ``delegate``: 80% of the exact oracle's expected return on the same tasks (training
  episodes, 3-iteration moving average);
* ``relay``: a team return of 0.9 (the answer is exact in 90% of episodes; the optimum is 1).

Each scenario also gets a lower target of 0.5 (half of the oracle; for ``relay``, exact answers
in half of the episodes, which needs at least two of the three bits to get through; random play
scores 1/8), because pilot runs with team credit reached only 0.19 on ``relay`` after 6,000 env
steps and 0.67 of the oracle on ``delegate`` after 20,000: within the default budget the main
targets may not be reached by any method.

Reported: env steps to the target (or "not reached"), final return, greedy evaluation, and the
wall time each method costs (Shapley and leave-one-out replay every episode).

Part 2, estimator error against coalition budget, no training: the sampled Shapley estimators
of ``trainers/credit/values.py`` against exact Shapley values, measured with the functions of
``experiments/credit_cost.py`` (imported, not copied) on (a) its random interaction games and (b)
real ``relay`` episodes on ``star:7`` (8 agents, 256 coalitions; coalition values are
counterfactual replays with the optimal relay protocol, absent agents sending symbol 0).

Run: ``python -m experiments.credit`` (``--full`` for longer training, ``--smoke``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from experiments import analysis as an
from experiments import harness
from experiments.harness import Condition

CLAIM = "credit"
TITLE = "Credit assignment: team vs local vs leave-one-out vs Shapley (SHARP)"
PUBLISHED = (
    "SHARP reports that Shapley-value credit assignment improves multi-agent training over a "
    "shared team reward."
)
METHODS = ("team", "local", "loo", "shapley")
SCENARIOS = ("relay", "delegate")
#: scenario → (training metric, main target, description, a lower second target)
TARGETS: dict[str, tuple[str, float, str, float]] = {
    "delegate": ("oracle_fraction", 0.8, "80% of the oracle's expected return", 0.5),
    "relay": ("team_return", 0.9, "team return 0.9 (exact answer in 90% of episodes)", 0.5),
}
BUDGETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "iterations": {"relay": 2, "delegate": 2},
        "eval": 3,
        "estimators": {"ns": (4,), "games": 3, "seeds": 3, "relay_topology": "star:3"},
    },
    "default": {
        "iterations": {"relay": 20, "delegate": 20},
        "eval": 100,
        "estimators": {"ns": (4, 8), "games": 12, "seeds": 10, "relay_topology": "star:7"},
    },
    "full": {
        "iterations": {"relay": 60, "delegate": 60},
        "eval": 200,
        "estimators": {"ns": (4, 6, 8, 10), "games": 16, "seeds": 20, "relay_topology": "star:7"},
    },
}


def conditions(budget: str) -> list[Condition]:
    """Every (scenario, method) arm for ``budget``."""
    b = BUDGETS[budget]
    return [
        Condition(
            f"{scenario}-{method}",
            f"{scenario} · {method}",
            {
                "scenario": scenario,
                "topology": "star:3",
                "credit": {"method": method},
                "budget": {"iterations": b["iterations"][scenario]},
            },
            {"scenario": scenario, "method": method},
            b["eval"],
        )
        for scenario in SCENARIOS
        for method in METHODS
    ]


def supported(ctx: harness.Context, conds: Sequence[Condition]) -> list[Condition]:
    """The arms whose config resolves; the others are saved as ``unsupported`` records."""
    from trainers.configs.typed import ConfigError
    from trainers.plan import resolve

    out = []
    for cond in conds:
        try:
            resolve(harness.make_config(ctx, cond, 0))
        except ConfigError as exc:
            ctx.log(f"{cond.name}: not supported ({exc})")
            harness.save_extra(
                ctx,
                f"unsupported-{cond.name}",
                {
                    "kind": "unsupported",
                    "condition": cond.name,
                    "label": cond.label,
                    "params": cond.params,
                    "reason": str(exc),
                },
            )
            continue
        out.append(cond)
    return out


# ----- part 2: estimator error vs budget ----------------------------------------------------
def relay_games(topology: str, games: int) -> tuple[list, list[dict[str, float]]]:
    """``(episodes, exact)`` for :func:`experiments.credit_cost.measure`: one game per relay episode
    (seed), its coalition values tabulated by counterfactual replay with the optimal protocol."""
    from itertools import combinations

    from scenarios.graph_env import GraphEnv
    from scenarios.registry import build
    from trainers.credit.values import shapley_exact

    scenario = build("relay", topology)
    env = GraphEnv(scenario)
    policy = scenario.optimal_policy()
    agents = list(env.possible_agents)
    episodes, exact = [], []
    for seed in range(games):
        values = {
            frozenset(c): env.value(seed, c, policy)
            for k in range(len(agents) + 1)
            for c in combinations(agents, k)
        }
        episodes.append((agents, values.__getitem__))
        exact.append(shapley_exact(agents, values.__getitem__))
    return episodes, exact


def budgets_for(n: int) -> list[int]:
    """Coalition budgets tried for ``n`` agents: from the smallest any estimator accepts up to
    ``16 n``, below ``2**n`` (a budget of ``2**n`` is exact)."""
    return sorted({b for b in (n + 1, 2 * n, 2 * n + 2, 4 * n, 8 * n, 16 * n) if b < 2**n})


def estimator_rows(
    episodes: Sequence[Any], exact: Sequence[Mapping[str, float]], seeds: int
) -> list[dict[str, Any]]:
    """RMSE / bias / evaluations of every sampled estimator at every budget, plus leave-one-out
    (measured against Shapley), on the given games."""
    import numpy as np

    from experiments.credit_cost import ESTIMATORS, measure
    from trainers.credit.values import leave_one_out, min_budget

    n = len(episodes[0][0])
    scale = float(np.mean([np.mean(np.abs(list(e.values()))) for e in exact]))
    loo = [leave_one_out(agents, v) for agents, v in episodes]
    loo_rmse = math.sqrt(
        np.mean(
            [np.mean([(lo[a] - ex[a]) ** 2 for a in ex]) for lo, ex in zip(loo, exact, strict=True)]
        )
    )
    rows = [
        {
            "n": n,
            "method": "leave_one_out",
            "budget": n + 1,
            "rmse": loo_rmse,
            "bias": None,
            "evaluations": n + 1.0,
            "mean_abs_phi": scale,
        },
    ]
    for budget in budgets_for(n):
        for name, estimator in ESTIMATORS.items():
            if budget < min_budget(name, n):
                continue
            rmse, bias, evals, _ = measure(estimator, episodes, exact, budget, seeds)
            rows.append(
                {
                    "n": n,
                    "method": name,
                    "budget": budget,
                    "rmse": rmse,
                    "bias": bias,
                    "evaluations": evals,
                    "mean_abs_phi": scale,
                }
            )
    return rows


def estimators(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Part 2: estimator error on bench's interaction games and on relay episodes."""
    import time

    from experiments.credit_cost import estimator_table

    started = time.time()
    synthetic = [
        dataclasses.asdict(r)
        for r in estimator_table(
            ns=settings["ns"],
            multipliers=(2, 4, 8, 16),
            games=settings["games"],
            seeds=settings["seeds"],
        )
    ]
    episodes, exact = relay_games(settings["relay_topology"], settings["games"])
    relay = estimator_rows(episodes, exact, settings["seeds"])
    return {
        "kind": "estimator",
        "settings": dict(settings),
        "synthetic": synthetic,
        "relay": relay,
        "seconds": time.time() - started,
    }


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the claim (see the module docstring); returns the records."""
    p = harness.parser(CLAIM, "Team vs local vs leave-one-out vs Shapley credit.")
    p.add_argument("--skip-estimators", action="store_true", help="only the training part")
    args = p.parse_args(argv)
    ctx = harness.context(CLAIM, args, argv)
    if not args.skip_estimators and not (ctx.dir / "estimators.json").exists():
        ctx.log("Shapley estimator error vs coalition budget…")
        harness.save_extra(ctx, "estimators", estimators(BUDGETS[ctx.budget]["estimators"]))
    conds = supported(ctx, conditions(ctx.budget))
    return harness.run_claim(ctx, conds, args.seeds)


# ----- report -------------------------------------------------------------------------------
def report(records: Sequence[Mapping[str, Any]], fig: an.Figures) -> str:
    """The claim's section body."""
    groups = an.group(records)
    unsupported = {r["condition"]: r["reason"] for r in an.extras(records, "unsupported")}
    out: list[str] = []
    plt = an.pyplot()
    present = [s for s in SCENARIOS if any(n.startswith(f"{s}-") for n in groups)]
    if present:
        f, axes = plt.subplots(1, len(present), figsize=(5.5 * len(present), 4), squeeze=False)
    for i, scenario in enumerate(present):
        key, target, text, lower = TARGETS[scenario]
        rows, finals, notes = [], {}, []
        for method in METHODS:
            name = f"{scenario}-{method}"
            rs = groups.get(name, [])
            if not rs:
                if name in unsupported:
                    notes.append(f"- {scenario} · {method} did not run: {unsupported[name]}")
                rows.append([method, 0, "n/a" if name in unsupported else "not run"] + ["—"] * 5)
                continue
            finals[method] = [an.final(r, "team_return") for r in rs]
            wall = an.stats(h.get("iteration_s") for r in rs for h in r["history"])["mean"]
            rows.append(
                [
                    method,
                    len(rs),
                    an.fmt_steps([an.steps_to(r, key, lower) for r in rs]),
                    an.fmt_steps([an.steps_to(r, key, target) for r in rs]),
                    an.fmt(finals[method]),
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
            *notes,
        ]
        if "team" in finals:
            for method in ("local", "loo", "shapley"):
                if method in finals:
                    out.append(
                        f"- {scenario}, final return: "
                        + an.compare(finals[method], finals["team"], method, "team")
                    )
            out.append("")
        sub = {m: groups[f"{scenario}-{m}"] for m in METHODS if f"{scenario}-{m}" in groups}
        ax = axes[0][i]
        an.curves(
            ax, sub, key, {m: m for m in sub}, colors={m: f"C{METHODS.index(m)}" for m in sub}
        )
        ax.axhline(target, color="k", linestyle=":", linewidth=1, label="target")
        ax.set_ylabel(f"training {key}")
        ax.set_title(scenario, fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    if present:
        out += [fig.save(f, "curves", "learning curves per credit method"), ""]
    est = an.extras(records, "estimator")
    if est:
        out.append(_estimator_section(est[-1], fig))
    return "\n".join(out)


def _estimator_section(est: Mapping[str, Any], fig: an.Figures) -> str:
    s = est["settings"]
    parts = [
        "**Shapley estimator error vs coalition budget** (no training; "
        f"{s['games']} games × {s['seeds']} estimator seeds each; RMSE against exact Shapley "
        "values, divided by the mean |φ|; budget = distinct coalition evaluations, i.e. "
        "counterfactual replays per episode; leave-one-out is shown against Shapley, which it "
        f"does not estimate). Measured in {est.get('seconds', 0):.0f} s.",
        "",
    ]
    plt = an.pyplot()
    sources = [
        ("experiments/credit_cost.py interaction games", est["synthetic"]),
        (f"relay {s['relay_topology']} episodes (optimal protocol)", est["relay"]),
    ]
    f, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (text, rows) in zip(axes, sources, strict=True):
        n = max((r["n"] for r in rows), default=0)
        rows_n = [  # a budget of 2**n or more is exact: nothing to estimate
            r
            for r in rows
            if r["n"] == n and r.get("rmse") is not None and (r["budget"] or 0) < 2**n
        ]
        budgets = sorted({r["budget"] for r in rows_n if r["budget"] is not None})
        methods = [
            m
            for m in ("permutation", "antithetic", "kernel")
            if any(r["method"] == m for r in rows_n)
        ]
        cells = {(r["method"], r["budget"]): r for r in rows_n}
        table_rows = []
        for b in budgets:
            row = [b]
            for m in methods:
                r = cells.get((m, b))
                row.append("—" if r is None else f"{r['rmse'] / r['mean_abs_phi']:.3f}")
            table_rows.append(row)
        loo = next((r for r in rows_n if r["method"] == "leave_one_out"), None)
        parts += [f"*{text}, n = {n} agents* (RMSE / mean |φ|):", ""]
        parts.append(an.table(["budget", *methods], table_rows))
        if loo is not None:
            parts.append(
                f"\nleave-one-out ({n + 1} evaluations): RMSE / mean |φ| against Shapley = "
                f"{loo['rmse'] / loo['mean_abs_phi']:.3f}"
            )
        parts.append("")
        for i, m in enumerate(methods):
            pts = [(b, cells[(m, b)]) for b in budgets if (m, b) in cells]
            ax.plot(
                [b for b, _ in pts],
                [r["rmse"] / r["mean_abs_phi"] for _, r in pts],
                marker="o",
                color=f"C{i}",
                label=m,
            )
        if loo is not None:
            ax.axhline(
                loo["rmse"] / loo["mean_abs_phi"],
                color="k",
                linestyle=":",
                label="leave-one-out (vs Shapley)",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("coalition evaluations per episode")
        ax.set_ylabel("RMSE / mean |φ|")
        ax.set_title(f"{text}, n={n}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    parts.append(fig.save(f, "estimators", "Shapley estimator error vs coalition budget"))
    return "\n".join(parts)


if __name__ == "__main__":
    harness.run_as_script(main)
