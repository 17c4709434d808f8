"""Cost and accuracy of the credit-assignment estimators in ``trainers/credit/values.py``.

Part 1 (:func:`estimator_table`): for teams of ``n = 2 … 10`` agents on random seeded games with
pairwise and three-way interactions, the RMSE of each sampled Shapley estimator against the
exact values, its systematic part (bias), and the coalition evaluations it spends per episode
(one game = one episode) at a few budgets (``2n``, ``4n``, ``8n`` by default), next to exact
Shapley (``2**n`` evaluations) and leave-one-out (``n + 1``). Coalition evaluations are the
real cost in training: each one is a counterfactual replay of the episode. ``ms/call`` is the
estimator's own overhead with a table-lookup value function (no replay), for orientation only.

Part 2 (wall time of ``credit=shapley`` against ``credit=team`` inside training) is to be added
by extending :func:`main`.

Run: ``python -m experiments.credit_cost`` (about 6 s on one core). ``--help`` lists the knobs.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# this checkout's packages first, also when another one is installed in the environment
from trainers.credit.values import (
    CachedValue,
    leave_one_out,
    min_budget,
    shapley_antithetic,
    shapley_exact,
    shapley_kernel,
    shapley_permutation,
)

ESTIMATORS: dict[str, Callable[..., dict[str, float]]] = {
    "permutation": shapley_permutation,
    "antithetic": shapley_antithetic,
    "kernel": shapley_kernel,
}


def interaction_game(n: int, seed: int) -> tuple[list[str], Callable[[frozenset[str]], float]]:
    """A random game with pairwise and three-way interactions, squashed into (0, 1).

    ``v(S) = σ(3 · raw(S) / max(1, n/2) − 2)`` with ``raw(S) = Σ a_i + Σ b_ij + Σ c_ijk`` over the
    members of ``S``: ``a_i ~ U(0, 1)``, half of the pairs with ``b_ij ~ N(0, 0.5²)``, ``n``
    random triples with ``c ~ N(0, 1)``. Like a success probability: ``v(∅) ≈ 0.12``,
    ``v(N)`` mostly 0.6–0.95. The values of all ``2**n`` coalitions are tabulated up front, so
    evaluating one costs a dict lookup.
    """
    rng = np.random.default_rng(seed)
    agents = [f"agent_{i}" for i in range(n)]
    a = rng.uniform(0.0, 1.0, n)
    b = np.triu(rng.normal(0.0, 0.5, (n, n)) * (rng.random((n, n)) < 0.5), 1)
    triples = [tuple(rng.choice(n, 3, replace=False)) for _ in range(n)] if n >= 3 else []
    c = rng.normal(0.0, 1.0, len(triples))
    scale = max(1.0, n / 2)
    table: dict[frozenset[str], float] = {}
    for mask in range(1 << n):
        z = np.array([(mask >> j) & 1 for j in range(n)], dtype=float)
        raw = a @ z + z @ b @ z
        raw += sum(ci * z[i] * z[j] * z[k] for ci, (i, j, k) in zip(c, triples, strict=True))
        members = frozenset(agents[j] for j in range(n) if z[j])
        table[members] = float(1.0 / (1.0 + math.exp(-(3.0 * raw / scale - 2.0))))
    return agents, table.__getitem__


@dataclass
class Row:
    """One line of the estimator table: a method at a budget for teams of ``n`` agents."""

    n: int
    method: str
    budget: int | None  # None for methods without a budget (exact, leave-one-out)
    rmse: float | None  # against exact Shapley; None when the budget is below the minimum
    evaluations: float | None  # mean distinct coalition evaluations per episode
    mean_abs_phi: float  # mean |φ_i| of the exact values, the scale RMSE is read against
    ms_per_call: float | None
    #: systematic error: RMS over games and agents of (mean estimate over seeds − exact), with
    #: the seed-average's own variance subtracted; ≈ 0 for an unbiased estimator
    bias: float | None = None


def _rmse(estimate: dict[str, float], exact: dict[str, float]) -> float:
    return math.sqrt(sum((estimate[k] - exact[k]) ** 2 for k in exact) / len(exact))


def _episodes(n: int, games: int) -> tuple[list, list[dict[str, float]], float, float]:
    """Seeded games for ``n`` agents, their exact values, mean |φ| and exact's ms per call."""
    episodes = [interaction_game(n, seed=1000 * n + g) for g in range(games)]
    t0 = time.perf_counter()
    exacts = [shapley_exact(agents, v) for agents, v in episodes]
    exact_ms = 1e3 * (time.perf_counter() - t0) / games
    scale = float(np.mean([np.mean(np.abs(list(e.values()))) for e in exacts]))
    return episodes, exacts, scale, exact_ms


def measure(
    estimator: Callable[..., dict[str, float]],
    episodes: Sequence[tuple[list[str], Callable[[frozenset[str]], float]]],
    exacts: Sequence[dict[str, float]],
    budget: int,
    seeds: int,
) -> tuple[float, float, float, float]:
    """RMSE, bias, mean evaluations per episode and ms per call of one estimator at a budget.

    The bias is the RMS over games and agents of the seed-averaged error with the average's
    own sampling variance removed: ``E[mean err²] = bias² + var/seeds`` and
    ``E[err²] = bias² + var``, solved for ``bias²`` (clipped at 0; noisy for few seeds).
    """
    sq, mean_sq, evals, elapsed = [], [], [], 0.0
    for (agents, v), exact in zip(episodes, exacts, strict=True):
        errors = []
        for seed in range(seeds):
            cached = CachedValue(v)
            t0 = time.perf_counter()
            phi = estimator(agents, cached, budget, seed)
            elapsed += time.perf_counter() - t0
            errors.append([phi[a] - exact[a] for a in agents])
            evals.append(cached.evaluations)
        err = np.array(errors)  # seeds × agents
        sq.append(np.mean(err**2))
        mean_sq.append(np.mean(err.mean(axis=0) ** 2))
    total, of_mean = float(np.mean(sq)), float(np.mean(mean_sq))
    bias_sq = (seeds * of_mean - total) / (seeds - 1) if seeds > 1 else of_mean
    ms = 1e3 * elapsed / (len(episodes) * seeds)
    return math.sqrt(total), math.sqrt(max(bias_sq, 0.0)), float(np.mean(evals)), ms


def estimator_table(
    ns: Sequence[int] = range(2, 11),
    multipliers: Sequence[int] = (2, 4, 8),
    games: int = 16,
    seeds: int = 12,
) -> list[Row]:
    """RMSE against exact Shapley and evaluations per episode for every estimator and budget.

    Args:
        ns: team sizes.
        multipliers: budgets as multiples of ``n`` (``budget = m · n``).
        games: random games (episodes) per team size.
        seeds: estimator seeds per game.

    Returns:
        Rows: per ``n`` one ``exact`` and one ``leave_one_out`` row (RMSE of the difference
        rewards against Shapley), then one row per (budget, estimator). RMSE is the root mean
        square over games, seeds and agents.
    """
    rows: list[Row] = []
    for n in ns:
        episodes, exacts, scale, exact_ms = _episodes(n, games)
        rows.append(Row(n, "exact", None, 0.0, float(2**n), scale, exact_ms))
        loo_sq = [
            _rmse(leave_one_out(agents, v), exact) ** 2
            for (agents, v), exact in zip(episodes, exacts, strict=True)
        ]
        rows.append(Row(n, "leave_one_out", None, math.sqrt(np.mean(loo_sq)), n + 1.0, scale, None))
        for budget in sorted({m * n for m in multipliers}):
            for name, estimator in ESTIMATORS.items():
                if budget < min_budget(name, n):
                    rows.append(Row(n, name, budget, None, None, scale, None))
                    continue
                rmse, bias, evals, ms = measure(estimator, episodes, exacts, budget, seeds)
                rows.append(Row(n, name, budget, rmse, evals, scale, ms, bias))
    return rows


def bias_table(
    n: int = 10,
    budgets: Sequence[int] | None = None,
    methods: Sequence[str] = ("antithetic", "kernel"),
    games: int = 12,
    seeds: int = 40,
) -> list[Row]:
    """Systematic error (bias) next to RMSE, with enough seeds per game to tell them apart.

    Per-episode RMSE is what one credit estimate gets wrong; the bias is what remains when
    credit is averaged over many episodes (as a policy gradient does). Permutation sampling is
    unbiased; KernelSHAP is not (a regression on a partly deterministic design).

    Args:
        n: team size.
        budgets: coalition evaluations; default ``2n + 2, 3n, 4n, 6n, 8n``.
        methods: estimator names (keys of :data:`ESTIMATORS`).
        games: random games per budget.
        seeds: estimator seeds per game (the bias estimate needs many).
    """
    if budgets is None:
        budgets = [2 * n + 2, 3 * n, 4 * n, 6 * n, 8 * n]
    episodes, exacts, scale, _ = _episodes(n, games)
    rows = []
    for budget in sorted(set(budgets)):
        for name in methods:
            rmse, bias, evals, ms = measure(ESTIMATORS[name], episodes, exacts, budget, seeds)
            rows.append(Row(n, name, budget, rmse, evals, scale, ms, bias))
    return rows


def format_table(rows: Sequence[Row], *, bias: bool = False) -> str:
    """Render :func:`estimator_table` or :func:`bias_table` rows as a fixed-width text table."""

    def cell(x: float | None, fmt: str) -> str:
        return "—" if x is None else format(x, fmt)

    bias_head = f" {'bias':>7} {'bias/|φ|':>9}" if bias else ""
    lines = [
        f"{'n':>3} {'2^n':>5} {'mean|φ|':>8}  {'method':<13} {'budget':>6} {'evals/ep':>9} "
        f"{'RMSE':>8} {'RMSE/|φ|':>9}{bias_head} {'ms/call':>8}",
    ]
    lines.append("-" * len(lines[0]))
    last_n = None
    for r in rows:
        if last_n is not None and r.n != last_n:
            lines.append("")
        last_n = r.n
        rel = None if r.rmse is None else r.rmse / r.mean_abs_phi
        bias_cells = ""
        if bias:
            rel_bias = None if r.bias is None else r.bias / r.mean_abs_phi
            bias_cells = f" {cell(r.bias, '.4f'):>7} {cell(rel_bias, '.3f'):>9}"
        note = ""
        if r.budget is not None and r.rmse is None:
            note = f"  (min budget {min_budget(r.method, r.n)})"
        elif r.budget is not None and r.budget >= 2**r.n:
            note = "  (budget ≥ 2^n: exact)"
        lines.append(
            f"{r.n:>3} {2**r.n:>5} {r.mean_abs_phi:>8.4f}  {r.method:<13} "
            f"{cell(r.budget, 'd'):>6} {cell(r.evaluations, '.1f'):>9} {cell(r.rmse, '.4f'):>8} "
            f"{cell(rel, '.3f'):>9}{bias_cells} {cell(r.ms_per_call, '.2f'):>8}{note}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the estimator table (part 1). Part 2, training wall time, is to be added here."""
    parser = argparse.ArgumentParser(description="Cost and accuracy of the credit estimators.")
    parser.add_argument("--min-n", type=int, default=2)
    parser.add_argument("--max-n", type=int, default=10)
    parser.add_argument("--multipliers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--games", type=int, default=16, help="random games (episodes) per n")
    parser.add_argument("--seeds", type=int, default=12, help="estimator seeds per game")
    parser.add_argument("--no-bias", action="store_true", help="skip the bias table")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    rows = estimator_table(
        range(args.min_n, args.max_n + 1), args.multipliers, args.games, args.seeds
    )
    print(
        f"Shapley estimators vs exact: {args.games} random interaction games × {args.seeds} "
        "seeds per n.\nevals/ep = distinct coalition evaluations (counterfactual replays) per "
        "episode; RMSE/|φ| = RMSE / mean |φ|.\nleave_one_out's RMSE is measured against "
        "Shapley (it is not an estimator of it).\n"
    )
    print(format_table(rows))
    if not args.no_bias:
        t1 = time.perf_counter()
        print(
            "\nBias at n = 10 (12 games × 40 seeds): the error left after averaging credit over "
            "many episodes."
        )
        print(format_table(bias_table(), bias=True))
        print(f"({time.perf_counter() - t1:.1f} s)")
    print(f"\n(total {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
