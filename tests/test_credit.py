"""Credit assignment math: Shapley axioms, hand-computed values, estimator convergence, caching.

Pure numpy; no Ray, no environments. Every random game and estimator is seeded, so each test is
deterministic; no test depends on wall-clock time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest

from trainers.configs.credit import EXACT_MAX_AGENTS
from trainers.credit.values import (
    CachedValue,
    leave_one_out,
    min_budget,
    normalize_credit,
    shapley,
    shapley_antithetic,
    shapley_exact,
    shapley_kernel,
    shapley_permutation,
    team_credit,
)

Game = Callable[[frozenset[str]], float]
SAMPLED = {
    "permutation": shapley_permutation,
    "antithetic": shapley_antithetic,
    "kernel": shapley_kernel,
}
ALL_SHAPLEY = {"exact": None, **SAMPLED}


def run(method: str, agents: list[str], v: Game, budget: int | None = None, seed: int = 0):
    """One Shapley method with a uniform signature (exact ignores budget and seed)."""
    if method == "exact":
        return shapley_exact(agents, v)
    n = len(agents)
    return SAMPLED[method](agents, v, budget or max(8 * n, min_budget(method, n)), seed)


# ----- games --------------------------------------------------------------------------------------
def agents_of(n: int) -> list[str]:
    return [f"agent_{i}" for i in range(n)]


def table_game(values: dict[str, float]) -> Game:
    """A game from a table keyed by the sorted, concatenated one-letter ids ("" for ∅)."""
    return lambda s: values["".join(sorted(s))]


def interaction_game(n: int, seed: int) -> tuple[list[str], Game]:
    """A random game with pairwise and three-way interactions, squashed into (0, 1)."""
    rng = np.random.default_rng(seed)
    agents = agents_of(n)
    index = {a: i for i, a in enumerate(agents)}
    a = rng.uniform(0.0, 1.0, n)
    b = np.triu(rng.normal(0.0, 0.5, (n, n)) * (rng.random((n, n)) < 0.5), 1)
    triples = [tuple(rng.choice(n, 3, replace=False)) for _ in range(n)] if n >= 3 else []
    c = rng.normal(0.0, 1.0, len(triples))
    scale = max(1.0, n / 2)

    def v(s: frozenset[str]) -> float:
        z = np.zeros(n)
        z[[index[x] for x in s]] = 1.0
        raw = (
            a @ z
            + z @ b @ z
            + sum(ci * z[i] * z[j] * z[k] for ci, (i, j, k) in zip(c, triples, strict=True))
        )
        return float(1.0 / (1.0 + np.exp(-(3.0 * raw / scale - 2.0))))

    return agents, v


def pairwise_game(n: int, seed: int) -> tuple[list[str], Game]:
    """``v(S) = Σ a_i + Σ b_ij`` over S: interactions of order two at most."""
    rng = np.random.default_rng(seed)
    agents = agents_of(n)
    index = {a: i for i, a in enumerate(agents)}
    a = rng.normal(size=n)
    b = np.triu(rng.normal(size=(n, n)), 1)

    def v(s: frozenset[str]) -> float:
        z = np.zeros(n)
        z[[index[x] for x in s]] = 1.0
        return float(a @ z + z @ b @ z)

    return agents, v


def unanimity_game(agents: list[str], value: float = 1.0) -> Game:
    """Complementary agents: the team scores only if every agent acts (a join)."""
    full = frozenset(agents)
    return lambda s: value if s == full else 0.0


def rmse(estimate: dict[str, float], exact: dict[str, float]) -> float:
    return math.sqrt(sum((estimate[k] - exact[k]) ** 2 for k in exact) / len(exact))


# ----- hand-computed values -----------------------------------------------------------------------
def test_exact_three_player_game_matches_hand_computation():
    # φ_A = 1/3·10 + 1/6·(50−20) + 1/6·(60−30) + 1/3·(120−70) = 30; likewise φ_B = 40, φ_C = 50
    v = table_game({"": 0, "A": 10, "B": 20, "C": 30, "AB": 50, "AC": 60, "BC": 70, "ABC": 120})
    phi = shapley_exact(["A", "B", "C"], v)
    assert phi == pytest.approx({"A": 30.0, "B": 40.0, "C": 50.0}, abs=1e-12)
    assert list(phi) == ["A", "B", "C"]


def test_exact_glove_game():
    # L holds the left glove, R1 and R2 a right one; a pair is worth 1. L is pivotal in 4 of 6
    # orders: φ_L = 2/3, φ_R1 = φ_R2 = 1/6.
    def v(s):
        return float("L" in s and bool(s & {"R1", "R2"}))

    phi = shapley_exact(["L", "R1", "R2"], v)
    assert phi == pytest.approx({"L": 2 / 3, "R1": 1 / 6, "R2": 1 / 6}, abs=1e-12)


def test_exact_weighted_majority_game():
    # quota 4, weights A=3, B=2, C=1, D=1. Winning minimal coalitions: AB, AC, AD, BCD.
    # Pivotal counts over the 24 orders (hand count): A 12, B 4, C 4, D 4.
    weights = {"A": 3, "B": 2, "C": 1, "D": 1}

    def v(s):
        return float(sum(weights[a] for a in s) >= 4)

    phi = shapley_exact(list(weights), v)
    assert phi == pytest.approx({"A": 1 / 2, "B": 1 / 6, "C": 1 / 6, "D": 1 / 6}, abs=1e-12)


def test_single_agent_gets_everything():
    v = table_game({"": 0.25, "A": 1.0})
    for method in ALL_SHAPLEY:
        assert run(method, ["A"], v) == pytest.approx({"A": 0.75})


# ----- axioms -------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", list(ALL_SHAPLEY))
@pytest.mark.parametrize("n", [2, 4, 6, 9])
def test_efficiency_holds_to_float_precision(method, n):
    agents, v = interaction_game(n, seed=n)
    total = v(frozenset(agents)) - v(frozenset())
    for seed in range(3):
        budget = max(min_budget(method, n) if method != "exact" else 0, 3 * n)
        phi = run(method, agents, v, budget=budget, seed=seed)
        assert math.fsum(phi.values()) == pytest.approx(total, abs=1e-12)


@pytest.mark.parametrize("method", list(ALL_SHAPLEY))
def test_efficiency_with_nonzero_empty_coalition(method):
    agents, g = interaction_game(7, seed=3)

    def v(s):
        return g(s) + 5.0  # v(∅) = 5 + g(∅): only the difference is shared

    phi = run(method, agents, v, budget=30, seed=1)
    assert math.fsum(phi.values()) == pytest.approx(
        v(frozenset(agents)) - v(frozenset()), abs=1e-12
    )


def test_exact_symmetry():
    # agent_1 and agent_2 are interchangeable: v is invariant when they are swapped
    agents, g = interaction_game(6, seed=11)

    def swap(s):
        t = set(s)
        a, b = "agent_1" in t, "agent_2" in t
        t -= {"agent_1", "agent_2"}
        if a:
            t.add("agent_2")
        if b:
            t.add("agent_1")
        return frozenset(t)

    def v(s):
        return g(s) + g(swap(s))

    phi = shapley_exact(agents, v)
    assert phi["agent_1"] == pytest.approx(phi["agent_2"], abs=1e-12)
    assert phi["agent_0"] != pytest.approx(phi["agent_1"], abs=1e-6)  # not trivially equal


def test_exact_symmetric_game_splits_equally():
    agents = agents_of(5)

    def v(s):
        return len(s) ** 2 / 25

    assert shapley_exact(agents, v) == pytest.approx(dict.fromkeys(agents, 1 / 5), abs=1e-12)


@pytest.mark.parametrize("method", ["exact", "permutation", "antithetic"])
def test_null_player_gets_exactly_zero(method):
    agents, g = interaction_game(7, seed=5)
    null = "agent_3"

    def v(s):
        return g(s - {null})  # adding the null player never changes the value

    for seed in range(3):
        phi = run(method, agents, v, budget=40, seed=seed)
        assert phi[null] == 0.0
        assert math.fsum(phi.values()) == pytest.approx(v(frozenset(agents)) - v(frozenset()))


def test_kernel_null_player_is_close_to_zero_and_exact_with_full_budget():
    agents, g = interaction_game(7, seed=5)

    def v(s):
        return g(s - {"agent_3"})

    assert shapley_kernel(agents, v, 2**7, rng=0)["agent_3"] == pytest.approx(0.0, abs=1e-12)
    errs = [abs(shapley_kernel(agents, v, 64, rng=seed)["agent_3"]) for seed in range(10)]
    assert np.mean(errs) < 0.02  # regression estimate: small, not exactly 0


@pytest.mark.parametrize("method", list(ALL_SHAPLEY))
def test_additivity_with_common_seed(method):
    # sampled estimators are linear in v for a fixed sample, and the samples never depend on
    # the values, so φ(v + w) = φ(v) + φ(w) holds exactly with the same seed
    agents, v = interaction_game(8, seed=1)
    _, w = pairwise_game(8, seed=2)

    def vw(s):
        return v(s) + w(s)

    for seed in range(3):
        both = run(method, agents, vw, budget=40, seed=seed)
        one = run(method, agents, v, budget=40, seed=seed)
        two = run(method, agents, w, budget=40, seed=seed)
        for a in agents:
            assert both[a] == pytest.approx(one[a] + two[a], abs=1e-10)


def test_leave_one_out_is_additive_and_null_player_exact():
    agents, v = interaction_game(5, seed=2)
    _, w = pairwise_game(5, seed=3)
    both = leave_one_out(agents, lambda s: v(s) + w(s))
    one, two = leave_one_out(agents, v), leave_one_out(agents, w)
    assert both == pytest.approx({a: one[a] + two[a] for a in agents}, abs=1e-12)
    assert leave_one_out(agents, lambda s: v(s - {"agent_0"}))["agent_0"] == 0.0


# ----- estimators exact by construction -----------------------------------------------------------
@pytest.mark.parametrize("n", [4, 7, 10])
def test_every_estimator_is_exact_on_additive_games(n):
    rng = np.random.default_rng(n)
    agents = agents_of(n)
    a = dict(zip(agents, rng.normal(size=n), strict=True))

    def v(s):
        return sum(a[x] for x in s)

    for method in SAMPLED:
        phi = run(method, agents, v, budget=min_budget(method, n), seed=n)
        assert phi == pytest.approx(a, abs=1e-10), method


@pytest.mark.parametrize("method", ["antithetic", "kernel"])
@pytest.mark.parametrize("n", [5, 8, 11])
def test_antithetic_and_kernel_are_exact_on_pairwise_games(method, n):
    # a permutation and its reverse see each pair in both orders; paired kernel samples see a
    # coalition and its complement: both cancel order-2 interactions exactly
    agents, v = pairwise_game(n, seed=n)
    exact = shapley_exact(agents, v)
    for seed, budget in itertools.product(range(3), (min_budget(method, n), 5 * n)):
        phi = SAMPLED[method](agents, v, budget, seed)
        assert phi == pytest.approx(exact, abs=1e-9)


def test_plain_permutation_is_not_exact_on_pairwise_games():
    agents, v = pairwise_game(8, seed=8)
    assert rmse(shapley_permutation(agents, v, 30, 0), shapley_exact(agents, v)) > 1e-3


@pytest.mark.parametrize("method", list(SAMPLED))
def test_budget_covering_every_coalition_gives_exact_values(method):
    agents, v = interaction_game(6, seed=4)
    exact = shapley_exact(agents, v)
    assert SAMPLED[method](agents, v, 2**6, 0) == pytest.approx(exact, abs=1e-12)


# ----- convergence --------------------------------------------------------------------------------
@pytest.mark.parametrize("method", list(SAMPLED))
@pytest.mark.parametrize("n", [6, 7, 8])
def test_estimators_converge_to_exact(method, n):
    games = [interaction_game(n, seed=100 * n + g) for g in range(4)]
    exacts = [shapley_exact(agents, v) for agents, v in games]
    scale = np.mean([np.mean(np.abs(list(e.values()))) for e in exacts])
    budgets = [2 * n + 2, 4 * n, 8 * n, min(12 * n, 2**n - 1)]
    errors = []
    for budget in budgets:
        sq = [
            rmse(SAMPLED[method](agents, v, budget, seed), exact) ** 2
            for (agents, v), exact in zip(games, exacts, strict=True)
            for seed in range(8)
        ]
        errors.append(math.sqrt(np.mean(sq)))
    assert all(b < a for a, b in itertools.pairwise(errors)), errors
    # mean |φ| is 0.07–0.12 in these games; measured final RMSE ≈ 0.05–0.35 of it
    assert errors[-1] < 0.5 * scale, (errors, scale)
    assert errors[-1] < 0.5 * errors[0], errors


@pytest.mark.parametrize("multiplier", [4, 8, 12])
def test_kernel_beats_antithetic_beats_permutation_at_equal_budget(multiplier):
    # the measurement behind shapley(method="auto") choosing KernelSHAP
    # (experiments/credit_cost.py);
    # 12n at n = 10 is where enumerating sizes 2 and 8 greedily (110 of 120 evaluations) used to
    # make KernelSHAP worse than antithetic sampling
    n = 10
    games = [interaction_game(n, seed=900 + g) for g in range(3)]
    exacts = [shapley_exact(agents, v) for agents, v in games]

    def err(method):
        return np.mean(
            [
                rmse(SAMPLED[method](agents, v, multiplier * n, seed), exact) ** 2
                for (agents, v), exact in zip(games, exacts, strict=True)
                for seed in range(8)
            ]
        )

    assert err("kernel") < err("antithetic") < err("permutation")


def test_estimators_are_deterministic_given_a_seed():
    agents, v = interaction_game(9, seed=0)
    for method, fn in SAMPLED.items():
        assert fn(agents, v, 50, 7) == fn(agents, v, 50, np.random.default_rng(7)), method
        assert fn(agents, v, 50, 7) != fn(agents, v, 50, 8), method


# ----- leave-one-out and team credit --------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 5])
def test_leave_one_out_overcounts_complementary_agents(n):
    # the team scores only if all agents act (a join): each agent is pivotal, so LOO gives
    # every agent the full value, summing to n · v(N) — not efficient — while Shapley splits it
    agents = agents_of(n)
    v = unanimity_game(agents)
    loo = leave_one_out(agents, v)
    assert loo == dict.fromkeys(agents, 1.0)
    assert sum(loo.values()) == pytest.approx(n * (v(frozenset(agents)) - v(frozenset())))
    assert shapley_exact(agents, v) == pytest.approx(dict.fromkeys(agents, 1.0 / n))


def test_leave_one_out_gives_substitutes_nothing():
    agents = agents_of(3)

    def v(s):
        return float(bool(s))  # any single agent suffices

    assert leave_one_out(agents, v) == dict.fromkeys(agents, 0.0)


def test_team_credit_gives_everyone_the_team_value_with_one_evaluation():
    agents, g = interaction_game(5, seed=0)
    v = CachedValue(g)
    credit = team_credit(agents, v)
    assert credit == dict.fromkeys(agents, g(frozenset(agents)))
    assert v.evaluations == 1


def test_leave_one_out_costs_n_plus_one_evaluations():
    agents, g = interaction_game(6, seed=0)
    v = CachedValue(g)
    leave_one_out(agents, v)
    assert v.evaluations == 7


# ----- budget accounting --------------------------------------------------------------------------
@pytest.mark.parametrize("method", list(SAMPLED))
@pytest.mark.parametrize("n", [5, 9, 12])
def test_sampled_estimators_stay_within_budget(method, n):
    agents, g = interaction_game(n, seed=n)
    for budget in (min_budget(method, n), 3 * n + 1, 8 * n):
        v = CachedValue(g)
        SAMPLED[method](agents, v, budget, 0)
        assert v.evaluations == len(v) <= budget
        assert frozenset() in v and frozenset(agents) in v
        if method == "kernel":  # sizes 1 and n − 1 are always enumerated
            assert all(frozenset({a}) in v and frozenset(agents) - {a} in v for a in agents)


def test_budget_is_spent_almost_fully():
    # draws stop only when the next permutation (pair) would not fit
    agents, g = interaction_game(10, seed=0)
    for method in SAMPLED:
        v = CachedValue(g)
        SAMPLED[method](agents, v, 80, 0)
        assert len(v) > 80 - 2 * 10, method


@pytest.mark.parametrize("method", list(SAMPLED))
def test_budget_below_minimum_names_the_minimum(method):
    agents, v = interaction_game(6, seed=0)
    need = min_budget(method, 6)
    assert need == {"permutation": 7, "antithetic": 12, "kernel": 14}[method]
    with pytest.raises(ValueError, match=f"at least {need} coalition evaluations"):
        SAMPLED[method](agents, v, need - 1, 0)
    SAMPLED[method](agents, v, need, 0)


def test_min_budget_kernel_small_teams_is_all_coalitions():
    assert [min_budget("kernel", n) for n in (1, 2, 3, 4)] == [2, 4, 8, 10]
    with pytest.raises(ValueError, match="unknown sampled method"):
        min_budget("exact", 4)


def test_budget_must_be_an_integer():
    agents, v = interaction_game(4, seed=0)
    with pytest.raises(TypeError, match="budget must be an integer"):
        shapley_permutation(agents, v, 10.5, 0)


# ----- dispatcher ---------------------------------------------------------------------------------
def test_auto_is_exact_up_to_exact_max():
    agents, g = interaction_game(8, seed=0)
    v = CachedValue(g)
    assert shapley(agents, v) == pytest.approx(shapley_exact(agents, g), abs=1e-12)
    assert v.evaluations == 2**8


def test_auto_samples_with_kernel_above_exact_max():
    agents, g = interaction_game(9, seed=0)
    v = CachedValue(g)
    phi = shapley(agents, v, rng=3)
    assert v.evaluations <= 8 * 9  # default budget 8n
    assert phi == shapley_kernel(agents, g, 72, 3)
    assert shapley(agents, g, exact_max=9) == pytest.approx(shapley_exact(agents, g))


def test_auto_falls_back_to_what_the_budget_affords():
    agents, v = interaction_game(9, seed=0)
    assert shapley(agents, v, budget=54, rng=1) == shapley_kernel(agents, v, 54, 1)  # 6n
    assert shapley(agents, v, budget=53, rng=1) == shapley_antithetic(agents, v, 53, 1)
    assert shapley(agents, v, budget=18, rng=1) == shapley_antithetic(agents, v, 18, 1)
    assert shapley(agents, v, budget=10, rng=1) == shapley_permutation(agents, v, 10, 1)
    assert shapley(agents, v, budget=2**9, rng=1) == pytest.approx(shapley_exact(agents, v))
    with pytest.raises(ValueError, match="at least 10"):
        shapley(agents, v, budget=9)


@pytest.mark.parametrize("method", ["permutation", "antithetic", "kernel"])
def test_dispatcher_named_methods(method):
    agents, v = interaction_game(6, seed=0)
    assert shapley(agents, v, method, budget=30, rng=2) == SAMPLED[method](agents, v, 30, 2)
    assert shapley(agents, v, "exact", budget=3) == shapley_exact(agents, v)


def test_dispatcher_rejects_bad_arguments():
    agents, v = interaction_game(4, seed=0)
    with pytest.raises(ValueError, match="unknown Shapley method 'owen'"):
        shapley(agents, v, "owen")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exact_max"):
        shapley(agents, v, exact_max=17)


# ----- bad input ----------------------------------------------------------------------------------
def _with_budget(estimator):
    return lambda agents, v: estimator(agents, v, 64, 0)


ALL_METHODS = {
    "team": team_credit,
    "loo": leave_one_out,
    "exact": shapley_exact,
    "auto": shapley,
    **{name: _with_budget(estimator) for name, estimator in SAMPLED.items()},
}


@pytest.mark.parametrize("name", list(ALL_METHODS))
def test_empty_agent_list_is_refused(name):
    with pytest.raises(ValueError, match="at least one agent"):
        ALL_METHODS[name]([], lambda s: 0.0)


@pytest.mark.parametrize("name", list(ALL_METHODS))
def test_duplicate_agent_ids_are_refused(name):
    with pytest.raises(ValueError, match=r"unique; duplicated: \['b'\]"):
        ALL_METHODS[name](["a", "b", "c", "b"], lambda s: 0.0)


def test_a_string_is_not_an_agent_list():
    with pytest.raises(TypeError, match="pass a list"):
        shapley_exact("abc", lambda s: 0.0)


def test_exact_refuses_large_teams_before_evaluating_anything():
    def v(s):
        raise AssertionError("must not be called")

    agents = agents_of(EXACT_MAX_AGENTS + 1)
    with pytest.raises(ValueError, match=r"limited to 16 agents.*method='kernel'"):
        shapley_exact(agents, v)
    with pytest.raises(ValueError, match="limited to 16 agents"):
        shapley(agents, v, "exact")


def test_non_finite_or_non_numeric_values_are_refused():
    agents = agents_of(3)
    with pytest.raises(ValueError, match="returned nan"):
        shapley_exact(agents, lambda s: float("nan") if len(s) == 2 else 1.0)
    with pytest.raises(TypeError, match="must return a number"):
        leave_one_out(agents, lambda s: "high")


@pytest.mark.parametrize("method", ["antithetic", "kernel"])
def test_large_teams_beyond_64_bit_masks(method):
    # 70 agents: coalition masks exceed int64. For a pairwise game the Shapley values are
    # a_i + ½ Σ_j b_ij, which both estimators reproduce exactly.
    n = 70
    rng = np.random.default_rng(0)
    agents = agents_of(n)
    a = rng.normal(size=n)
    b = np.triu(rng.normal(size=(n, n)), 1)
    b = b + b.T
    index = {x: i for i, x in enumerate(agents)}

    def v(s):
        z = np.zeros(n)
        z[[index[x] for x in s]] = 1.0
        return float(a @ z + 0.5 * z @ b @ z)

    expected = dict(zip(agents, a + 0.5 * b.sum(axis=1), strict=True))
    cached = CachedValue(v)
    phi = shapley(agents, cached, method, budget=3 * n, rng=0)
    assert phi == pytest.approx(expected, abs=1e-8)
    assert cached.evaluations <= 3 * n


# ----- CachedValue --------------------------------------------------------------------------------
def test_cached_value_memoises_and_counts():
    calls: list[frozenset[str]] = []

    def g(s):
        calls.append(s)
        return float(len(s))

    v = CachedValue(g)
    assert not v.takes_repeat
    assert v(frozenset({"a"})) == 1.0
    assert v({"a"}) == 1.0  # any iterable; keyed by frozenset
    assert v(["b", "a"]) == 2.0
    assert v.evaluations == 2 and v.lookups == 3 and len(v) == 2
    assert calls == [frozenset({"a"}), frozenset({"a", "b"})]
    assert frozenset({"a"}) in v and frozenset({"c"}) not in v
    assert "CachedValue(" in repr(v)


def test_cached_value_averages_repeats_and_never_repeats_a_call():
    seen: list[tuple[frozenset[str], int]] = []

    def noisy(coalition, repeat):
        seen.append((coalition, repeat))
        return len(coalition) + (0.5 if repeat % 2 else -0.5)  # noise cancels over 2 repeats

    agents = agents_of(5)
    v = CachedValue(noisy, repeats=2)
    assert v.takes_repeat
    phi = shapley_exact(agents, v)
    assert phi == pytest.approx(dict.fromkeys(agents, 1.0))
    assert len(seen) == len(set(seen)) == 2 * 2**5 == v.evaluations
    shapley_exact(agents, v)
    shapley_permutation(agents, v, 20, 0)
    assert v.evaluations == 2 * 2**5  # everything cached
    assert v.samples(frozenset(agents)) == (4.5, 5.5)


def test_cached_value_raising_repeats_evaluates_only_missing_repeats():
    seen: list[tuple[frozenset[str], int]] = []

    def noisy(coalition, repeat):
        seen.append((coalition, repeat))
        return float(repeat)

    v = CachedValue(noisy)
    key = frozenset({"x"})
    assert v(key) == 0.0  # repeat 0 only: common random numbers across coalitions
    v.repeats = 4
    assert frozenset({"x"}) not in v  # has 1 of 4 repeats
    assert v(key) == pytest.approx(1.5)
    assert seen == [(key, 0), (key, 1), (key, 2), (key, 3)]
    v.repeats = 2
    assert v(key) == pytest.approx(0.5) and v.evaluations == 4


def test_cached_value_shared_across_credit_methods():
    agents, g = interaction_game(6, seed=0)
    v = CachedValue(g)
    team_credit(agents, v)
    leave_one_out(agents, v)
    shapley_exact(agents, v)
    assert v.evaluations == 2**6  # N and N∖{i} were reused by the exact enumeration


def test_cached_value_signature_detection_and_errors():
    def one(s):
        return 0.0

    def two(s, r):
        return 0.0

    def optional(s, scale=1.0):
        return 0.0

    assert not CachedValue(one).takes_repeat
    assert CachedValue(two).takes_repeat
    assert not CachedValue(optional).takes_repeat  # an optional parameter is not the repeat
    assert CachedValue(optional, takes_repeat=True, repeats=3).takes_repeat
    with pytest.raises(ValueError, match=r"takes only the coalition.*takes_repeat=True"):
        CachedValue(one, repeats=2)
    with pytest.raises(ValueError, match="repeats must be an integer ≥ 1"):
        CachedValue(two, repeats=0)
    with pytest.raises(TypeError, match="needs a callable"):
        CachedValue(3.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"returned inf .* at repeat 1"):
        CachedValue(lambda s, r: float("inf") if r else 0.0, repeats=2)(frozenset())


# ----- normalize_credit ---------------------------------------------------------------------------
def test_normalize_credit_maxabs_keeps_signs_ratios_and_zeros():
    out = normalize_credit({"a": 0.5, "b": -0.25, "c": 0.0})
    assert out == pytest.approx({"a": 1.0, "b": -0.5, "c": 0.0})
    assert list(out) == ["a", "b", "c"]


def test_normalize_credit_zscore_is_relative():
    out = normalize_credit({"a": 3.0, "b": 1.0, "c": 2.0}, mode="zscore")
    values = np.array(list(out.values()))
    assert values.mean() == pytest.approx(0.0) and values.std() == pytest.approx(1.0)
    assert out["a"] > out["c"] > out["b"]


def test_normalize_credit_degenerate_and_bad_input():
    assert normalize_credit({"a": 0.0, "b": 0.0}) == {"a": 0.0, "b": 0.0}
    assert normalize_credit({"a": 0.3, "b": 0.3}, mode="zscore") == {"a": 0.0, "b": 0.0}
    assert normalize_credit({}) == {}
    with pytest.raises(ValueError, match="unknown normalisation mode"):
        normalize_credit({"a": 1.0}, mode="softmax")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"not finite for \['b'\]"):
        normalize_credit({"a": 1.0, "b": float("nan")})


# ----- the estimator-error measurement keeps running ------------------------------------------
def test_credit_cost_smoke() -> None:
    from experiments import credit_cost as bench

    rows = bench.estimator_table(ns=[3, 9], multipliers=[2, 8], games=1, seeds=2)
    by_key = {(r.n, r.method, r.budget): r for r in rows}
    assert by_key[(9, "kernel", 18)].rmse is None  # below KernelSHAP's minimum of 20
    assert by_key[(9, "exact", None)].evaluations == 512
    assert by_key[(3, "kernel", 24)].rmse == pytest.approx(0.0, abs=1e-12)  # 24 ≥ 2**3: exact
    assert 0 < by_key[(9, "kernel", 72)].evaluations <= 72
    text = bench.format_table(rows) + bench.format_table(
        bench.bias_table(n=6, budgets=[24], games=1, seeds=2), bias=True
    )
    assert "min budget 20" in text and "bias/|φ|" in text
