"""Credit assignment across the agents of a team: team reward, leave-one-out, Shapley values.

Everything here is pure math over a *coalition value function* ``v(S)``: the team's return when
only the agents in ``S`` act and the others are "absent" (a counterfactual replay of the
episode with the same seed, see ``GraphEnv.value``). Nothing here knows about Ray, torch or
environments.

(Over 700 lines on purpose: the estimators share one evaluator, one budget rule and one
input check, and the dispatcher chooses among them; split, each would import the others'
private parts.)

Methods and what they cost in coalition evaluations (``n`` agents):

* :func:`team_credit` — 1; everyone gets ``v(N)``.
* :func:`leave_one_out` — ``n + 1``; difference rewards, *not* efficient.
* :func:`shapley_exact` — ``2**n`` (refused above :data:`EXACT_MAX_AGENTS` agents).
* :func:`shapley_permutation` — at most ``budget`` (min ``n + 1``); unbiased.
* :func:`shapley_antithetic` — at most ``budget`` (min ``2n``); unbiased, exact for games with
  at most pairwise interactions.
* :func:`shapley_kernel` — at most ``budget`` (min ``2n + 2``); KernelSHAP, the lowest
  per-episode error measured (``experiments/credit_cost.py``), but biased at small budgets.
* :func:`shapley` — dispatches: exact up to ``exact_max`` agents, sampled above (KernelSHAP
  from ``6n`` evaluations, antithetic below).

**Budget.** ``budget`` counts *distinct* coalitions whose value an estimator asks for during
one call, including ``∅`` and ``N``. An estimator memoises values within the call, so a
coalition it meets twice (every permutation starts at ``∅`` and ends at ``N``; short prefixes
repeat) is paid for once. A budget of ``2**n`` or more buys the exact answer: the sampled
estimators then return :func:`shapley_exact`'s values. With a :class:`CachedValue`, one
coalition evaluation costs ``repeats`` calls of the underlying function.

**Efficiency.** ``Σ_i φ_i = v(N) − v(∅)`` holds to float precision for the exact and all three
sampled Shapley estimators: permutation marginals telescope, and KernelSHAP solves its
weighted least squares with the constraint eliminated exactly.

Example:
    >>> def v(s):  # a glove game: "l" holds the left glove, "r1" and "r2" a right one
    ...     return float("l" in s and bool(s & {"r1", "r2"}))
    >>> phi = shapley(["l", "r1", "r2"], v)
    >>> round(phi["l"], 4), round(phi["r1"], 4)
    (0.6667, 0.1667)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, combinations
from typing import Literal, get_args

import numpy as np

from trainers.configs.credit import EXACT_MAX_AGENTS, ShapleyMethod

__all__ = [
    "AUTO_KERNEL_BUDGET_PER_AGENT",
    "DEFAULT_SAMPLED_METHOD",
    "CachedValue",
    "NoisyValueFn",
    "ValueFn",
    "leave_one_out",
    "min_budget",
    "normalize_credit",
    "shapley",
    "shapley_antithetic",
    "shapley_exact",
    "shapley_kernel",
    "shapley_permutation",
    "team_credit",
]

#: A coalition value function: the team's value when exactly these agents act.
ValueFn = Callable[[frozenset[str]], float]
#: A noisy value function, deterministic given the repeat index ``r`` (``0 ≤ r < repeats``).
#: Using ``r`` as the replay's seed offset for *every* coalition gives common random numbers:
#: coalitions are compared under the same noise, which cancels much of it in the differences.
NoisyValueFn = Callable[[frozenset[str], int], float]

RngLike = np.random.Generator | int | None


# ----- caching ------------------------------------------------------------------------------------
class CachedValue:
    """Memoising wrapper around a (possibly noisy) coalition value function.

    ``cached(S)`` returns the mean of ``fn`` over repeats ``r = 0 … repeats − 1`` and never
    calls ``fn`` twice for the same ``(coalition, r)``. Raising :attr:`repeats` later only
    evaluates the missing repeats.

    The callee is one of:

    * ``fn(coalition) -> float`` — a deterministic value (only ``repeats=1`` makes sense);
    * ``fn(coalition, repeat) -> float`` — noisy, but deterministic given ``repeat``. Seed the
      replay with ``repeat`` (the same for every coalition) to get common random numbers.

    Which form ``fn`` has is read from its signature: two or more *required* positional
    parameters mean ``fn(coalition, repeat)``. Pass ``takes_repeat`` to say it explicitly
    (e.g. for a builtin or a ``*args`` callable).

    Args:
        fn: the value function.
        repeats: how many repeats to average per coalition (≥ 1).
        takes_repeat: whether ``fn`` takes the repeat index; ``None`` reads the signature.

    Attributes:
        evaluations: number of calls of ``fn`` so far (the real cost: one replay each).
        lookups: number of calls of this wrapper so far (hits and misses).

    Raises:
        ValueError: ``repeats < 1``, or ``repeats > 1`` with an ``fn`` that takes no repeat.

    Example:
        >>> calls = []
        >>> def v(s, r):
        ...     calls.append((s, r))
        ...     return len(s) + 0.1 * r
        >>> cv = CachedValue(v, repeats=2)
        >>> cv(frozenset({"a"})), cv(frozenset({"a"})), cv.evaluations, len(cv)
        (1.05, 1.05, 2, 1)
    """

    def __init__(
        self,
        fn: ValueFn | NoisyValueFn,
        repeats: int = 1,
        *,
        takes_repeat: bool | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"CachedValue needs a callable value function, got {fn!r}")
        if takes_repeat is None:
            takes_repeat = _required_positional(fn) >= 2
        self._fn = fn
        self._takes_repeat = takes_repeat
        self._samples: dict[frozenset[str], list[float]] = {}
        self.evaluations = 0
        self.lookups = 0
        self.repeats = repeats  # validated by the setter

    @property
    def repeats(self) -> int:
        """Repeats averaged per coalition; may be raised later (missing repeats are evaluated)."""
        return self._repeats

    @repeats.setter
    def repeats(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"repeats must be an integer ≥ 1, got {value!r}")
        if value > 1 and not self._takes_repeat:
            raise ValueError(
                f"repeats={value} needs a value function called as fn(coalition, repeat), "
                f"but {_name(self._fn)} takes only the coalition; make it accept the repeat "
                "index (and seed its replay with it), or pass takes_repeat=True"
            )
        self._repeats = int(value)

    @property
    def takes_repeat(self) -> bool:
        """Whether the wrapped function is called as ``fn(coalition, repeat)``."""
        return self._takes_repeat

    def __call__(self, coalition: Iterable[str]) -> float:
        """The value of ``coalition``: the mean over the first :attr:`repeats` repeats."""
        key = coalition if isinstance(coalition, frozenset) else frozenset(coalition)
        self.lookups += 1
        samples = self._samples.setdefault(key, [])
        while len(samples) < self._repeats:
            r = len(samples)
            raw = self._fn(key, r) if self._takes_repeat else self._fn(key)  # type: ignore[call-arg]
            self.evaluations += 1
            samples.append(_as_finite(raw, key, r))
        return math.fsum(samples[: self._repeats]) / self._repeats

    def samples(self, coalition: Iterable[str]) -> tuple[float, ...]:
        """Raw per-repeat values already evaluated for ``coalition`` (never calls ``fn``)."""
        return tuple(self._samples.get(frozenset(coalition), ()))

    def __contains__(self, coalition: object) -> bool:
        """Whether ``coalition`` has all :attr:`repeats` evaluated (a lookup would be free)."""
        if not isinstance(coalition, Iterable):
            return False
        samples = self._samples.get(frozenset(coalition), ())
        return len(samples) >= self._repeats

    def __len__(self) -> int:
        """Number of distinct coalitions evaluated at least once."""
        return len(self._samples)

    def clear(self) -> None:
        """Forget every cached value (the counters keep counting)."""
        self._samples.clear()

    def __repr__(self) -> str:
        return (
            f"CachedValue({_name(self._fn)}, repeats={self._repeats}, "
            f"coalitions={len(self)}, evaluations={self.evaluations})"
        )


def _required_positional(fn: Callable[..., object]) -> int:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(
        1 for p in sig.parameters.values() if p.kind in kinds and p.default is inspect._empty
    )


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _as_finite(raw: object, coalition: frozenset[str], repeat: int | None = None) -> float:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(
            f"the value function must return a number; v({sorted(coalition)}) returned {raw!r}"
        ) from None
    if not math.isfinite(value):
        at = "" if repeat is None else f" at repeat {repeat}"
        raise ValueError(f"the value function returned {value} for {sorted(coalition)}{at}")
    return value


# ----- input checks and the per-call evaluator ----------------------------------------------------
def _check_agents(agents: Sequence[str]) -> tuple[str, ...]:
    if isinstance(agents, str | bytes):
        raise TypeError(
            f"agents must be a sequence of agent ids, got the string {agents!r}; "
            f"pass a list, e.g. [{agents!r}]"
        )
    ids = tuple(agents)
    if not ids:
        raise ValueError("credit needs at least one agent; got an empty agent list")
    if len(set(ids)) != len(ids):
        dups = sorted({a for a in ids if ids.count(a) > 1})
        raise ValueError(f"agent ids must be unique; duplicated: {dups}")
    return ids


def min_budget(method: str, n: int) -> int:
    """Smallest ``budget`` a sampled Shapley estimator accepts for ``n`` agents.

    * ``permutation``: ``n + 1`` — one permutation: ``∅``, its ``n − 1`` proper prefixes, ``N``.
    * ``antithetic``: ``2n`` — one permutation and its reverse.
    * ``kernel``: ``2n + 2`` (or ``2**n`` if smaller) — ``∅``, ``N`` and every coalition of size
      1 and ``n − 1``, which KernelSHAP always evaluates (this makes the regression full rank;
      below it, sampled pairs alone did worse than :func:`shapley_antithetic`).

    Args:
        method: ``"permutation"``, ``"antithetic"`` or ``"kernel"``.
        n: number of agents (≥ 1).

    Returns:
        The minimum number of distinct coalition evaluations.

    Raises:
        ValueError: an unknown method or ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"n must be ≥ 1, got {n}")
    if method == "permutation":
        return n + 1
    if method == "antithetic":
        return 2 * n
    if method == "kernel":
        return min(2 * n + 2, 1 << n)
    raise ValueError(
        f"min_budget: unknown sampled method {method!r}; use 'permutation', 'antithetic' "
        "or 'kernel'"
    )


def _check_budget(method: str, n: int, budget: int) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int | np.integer):
        raise TypeError(f"budget must be an integer number of coalition evaluations: {budget!r}")
    need = min_budget(method, n)
    if budget < need:
        raise ValueError(
            f"budget={budget} is too small for shapley_{method} with {n} agents: it needs at "
            f"least {need} coalition evaluations ({_budget_reason(method, n)})"
        )
    return int(budget)


def _budget_reason(method: str, n: int) -> str:
    if method == "permutation":
        return f"one permutation visits ∅, {n - 1} prefixes and N"
    if method == "antithetic":
        return "one permutation and its reverse"
    return "∅, N and every coalition of size 1 and n − 1"


class _Evaluator:
    """Values of coalitions given as bitmasks over ``agents``; memoised; counts distinct ones."""

    def __init__(self, agents: tuple[str, ...], v: ValueFn) -> None:
        self.agents = agents
        self.v = v
        self.values: dict[int, float] = {}

    def coalition(self, mask: int) -> frozenset[str]:
        return frozenset(a for j, a in enumerate(self.agents) if mask >> j & 1)

    def __call__(self, mask: int) -> float:
        value = self.values.get(mask)
        if value is None:
            s = self.coalition(mask)
            value = _as_finite(self.v(s), s)
            self.values[mask] = value
        return value

    @property
    def used(self) -> int:
        return len(self.values)


def _rng(rng: RngLike) -> np.random.Generator:
    return np.random.default_rng(rng)


def _result(agents: tuple[str, ...], phi: Iterable[float]) -> dict[str, float]:
    return {a: float(p) for a, p in zip(agents, phi, strict=True)}


# ----- simple credits -----------------------------------------------------------------------------
def team_credit(agents: Sequence[str], v: ValueFn) -> dict[str, float]:
    """Team reward: every agent gets ``v(N)``. One coalition evaluation.

    Args:
        agents: agent ids (unique, non-empty).
        v: coalition value function.

    Returns:
        ``{agent: v(N)}`` in the order of ``agents``.
    """
    ids = _check_agents(agents)
    full = frozenset(ids)
    value = _as_finite(v(full), full)
    return dict.fromkeys(ids, value)


def leave_one_out(agents: Sequence[str], v: ValueFn) -> dict[str, float]:
    """Difference rewards: ``φ_i = v(N) − v(N ∖ {i})``. ``n + 1`` coalition evaluations.

    Not efficient: the credits need not sum to ``v(N) − v(∅)``. With complementary agents (the
    team succeeds only if all of them act) every agent gets the full ``v(N) − v(N∖{i})`` and the
    sum is ``n`` times the team's value; with substitutes (any one suffices) everyone gets 0.
    It satisfies the null-player property (an agent that never changes ``v`` gets 0) and
    additivity.

    Args:
        agents: agent ids (unique, non-empty).
        v: coalition value function.

    Returns:
        ``{agent: credit}`` in the order of ``agents``.
    """
    ids = _check_agents(agents)
    full = frozenset(ids)
    v_full = _as_finite(v(full), full)
    out: dict[str, float] = {}
    for a in ids:
        rest = full - {a}
        out[a] = v_full - _as_finite(v(rest), rest)
    return out


# ----- exact Shapley ------------------------------------------------------------------------------
def shapley_exact(agents: Sequence[str], v: ValueFn) -> dict[str, float]:
    """Exact Shapley values by enumerating all ``2**n`` coalitions.

    ``φ_i = Σ_{S ⊆ N∖{i}} |S|! (n − |S| − 1)! / n! · (v(S ∪ {i}) − v(S))``.

    Args:
        agents: agent ids (unique, non-empty, at most :data:`EXACT_MAX_AGENTS`).
        v: coalition value function; called once per coalition.

    Returns:
        ``{agent: φ}`` in the order of ``agents``.

    Raises:
        ValueError: empty or duplicated ids, or more than :data:`EXACT_MAX_AGENTS` agents
            (``2**n`` evaluations); use a sampled method (``shapley(..., method="kernel")``).
    """
    ids = _check_agents(agents)
    n = len(ids)
    if n > EXACT_MAX_AGENTS:
        raise ValueError(
            f"shapley_exact needs 2**{n} = {2**n:,} coalition evaluations for {n} agents; it is "
            f"limited to {EXACT_MAX_AGENTS} agents. Use a sampled estimator instead, e.g. "
            "shapley(agents, v, method='kernel', budget=...)"
        )
    ev = _Evaluator(ids, v)
    return _result(ids, _exact_from(ev))


def _exact_from(ev: _Evaluator) -> np.ndarray:
    """Exact Shapley values, evaluating (through ``ev``) every coalition not yet known."""
    n = len(ev.agents)
    masks = np.arange(1 << n, dtype=np.int64)
    values = np.fromiter((ev(int(m)) for m in masks), dtype=float, count=1 << n)
    sizes = np.zeros(1 << n, dtype=np.int64)
    for j in range(n):
        sizes += (masks >> j) & 1
    # w(s) = s! (n - s - 1)! / n! = 1 / (n * C(n - 1, s)) for s = 0 … n - 1
    weight = np.array([1.0 / (n * math.comb(n - 1, s)) for s in range(n)])
    phi = np.empty(n)
    for i in range(n):
        without = masks[(masks >> i) & 1 == 0]
        phi[i] = np.dot(weight[sizes[without]], values[without | (1 << i)] - values[without])
    return phi


def _covers_everything(n: int, budget: int) -> bool:
    return n <= EXACT_MAX_AGENTS and budget >= (1 << n)


def _sampled(
    method: Literal["permutation", "antithetic", "kernel"],
    agents: Sequence[str],
    v: ValueFn,
    budget: int,
    rng: RngLike,
) -> dict[str, float]:
    """A sampled estimator's checks and estimate; exact when the budget covers every coalition."""
    ids = _check_agents(agents)
    n = len(ids)
    budget = _check_budget(method, n, budget)
    ev = _Evaluator(ids, v)
    if _covers_everything(n, budget):
        return _result(ids, _exact_from(ev))
    if method == "kernel":
        return _result(ids, _kernel_estimate(ev, budget, _rng(rng)))
    antithetic = method == "antithetic"
    return _result(ids, _permutation_estimate(ev, budget, _rng(rng), antithetic=antithetic))


# ----- permutation sampling -----------------------------------------------------------------------
def shapley_permutation(
    agents: Sequence[str], v: ValueFn, budget: int, rng: RngLike = None
) -> dict[str, float]:
    """Shapley values by Monte Carlo over random permutations (Castro et al. 2009).

    Each sampled permutation ``π`` credits every agent with its marginal contribution
    ``v(P ∪ {i}) − v(P)`` where ``P`` is the set of agents before ``i`` in ``π``; the estimate is
    the mean over permutations. Marginals telescope, so each permutation, and hence the mean,
    sums to ``v(N) − v(∅)`` exactly. A null player gets exactly 0.

    Budget: ``∅`` and ``N`` are paid once; a permutation then needs its ``n − 1`` proper
    non-empty prefixes, of which only the ones not seen before are paid (short and long
    prefixes repeat often). Permutations are drawn until the next one would not fit into the
    budget (that one is dropped). The stopping rule depends on which coalitions were visited,
    never on their values, and is symmetric in the agents, so the estimate stays unbiased.

    Args:
        agents: agent ids (unique, non-empty).
        v: coalition value function.
        budget: max distinct coalition evaluations, at least ``n + 1``; ``≥ 2**n`` gives the
            exact values.
        rng: a numpy ``Generator`` or a seed.

    Returns:
        ``{agent: φ̂}`` in the order of ``agents``.

    Raises:
        ValueError: bad agents, or ``budget < n + 1``.
    """
    return _sampled("permutation", agents, v, budget, rng)


def shapley_antithetic(
    agents: Sequence[str], v: ValueFn, budget: int, rng: RngLike = None
) -> dict[str, float]:
    """Permutation sampling with antithetic pairs: every permutation with its reverse.

    An agent early in ``π`` is late in its reverse, so the pair's two marginals are negatively
    correlated and their mean varies less. For games with at most pairwise interactions
    (``v(S) = Σ a_i + Σ b_ij``) one pair already gives the exact Shapley values. Efficient and
    null-player exact like :func:`shapley_permutation`.

    Budget: as for :func:`shapley_permutation`, with the pair as the unit (the reverse's
    prefixes are the complements of the permutation's). The first pair costs ``2n``; a later
    one up to ``2n − 2``, so up to ``2n − 3`` evaluations of the budget can stay unspent
    (a lone permutation is never added: it would break exactness on pairwise games).

    Args:
        agents: agent ids (unique, non-empty).
        v: coalition value function.
        budget: max distinct coalition evaluations, at least ``2n``; ``≥ 2**n`` gives the exact
            values.
        rng: a numpy ``Generator`` or a seed.

    Returns:
        ``{agent: φ̂}`` in the order of ``agents``.

    Raises:
        ValueError: bad agents, or ``budget < 2n``.
    """
    return _sampled("antithetic", agents, v, budget, rng)


#: Draws (permutations or kernel pairs) without paying anything new before a sampler gives up;
#: only reachable when the budget is close to ``2**n`` and nearly every coalition is known.
_MAX_FREE_DRAWS = 10_000


def _permutation_estimate(
    ev: _Evaluator, budget: int, rng: np.random.Generator, *, antithetic: bool
) -> np.ndarray:
    n = len(ev.agents)
    full = (1 << n) - 1
    ev(0)
    ev(full)
    total = np.zeros(n)
    count = 0
    free_streak = 0
    while free_streak < _MAX_FREE_DRAWS:
        perm = rng.permutation(n)
        orders = [perm, perm[::-1]] if antithetic else [perm]
        chains = []
        new: set[int] = set()
        for order in orders:
            # Python ints, not int64: masks must not overflow for teams of 63+ agents
            prefixes = list(accumulate((1 << int(j) for j in order), initial=0))
            chains.append((order, prefixes))
            new.update(m for m in prefixes if m not in ev.values)
        if ev.used + len(new) > budget:
            break
        free_streak = 0 if new else free_streak + 1
        for order, prefixes in chains:
            vals = np.array([ev(m) for m in prefixes])
            total[order] += np.diff(vals)
            count += 1
    return total / count


# ----- KernelSHAP ---------------------------------------------------------------------------------
def shapley_kernel(
    agents: Sequence[str], v: ValueFn, budget: int, rng: RngLike = None
) -> dict[str, float]:
    """KernelSHAP (Lundberg & Lee 2017): Shapley values as a constrained weighted regression.

    The Shapley values are the solution of
    ``min_φ Σ_S k(S) (v(S) − v(∅) − Σ_{i∈S} φ_i)²`` subject to ``Σ_i φ_i = v(N) − v(∅)``,
    over ``0 < |S| < n``, with the Shapley kernel ``k(S) = (n − 1) / (C(n, |S|) |S| (n − |S|))``.
    The estimator solves it on a subset of coalitions:

    * ``∅`` and ``N`` are evaluated exactly and enter only through the constraint, which is
      eliminated exactly (``φ = Δ/n + ψ`` with ``Σ ψ = 0``), so efficiency holds to float
      precision whatever was sampled.
    * Sizes are taken in pairs ``(k, n − k)`` from ``k = 1`` up and, if enumerated, all their
      coalitions are evaluated with their exact kernel weight. Sizes 1 and ``n − 1`` always
      are (they carry the most kernel mass: 39% at ``n = 10``). A further pair is enumerated
      only if that lowers ``M² / B``, the variance proxy of sampling the open kernel mass
      ``M`` with the ``B`` evaluations left; spending nearly all the budget on one size pair
      and leaving much mass to a handful of samples was measured to double the error.
    * The rest of the budget samples coalitions from the remaining sizes in proportion to the
      kernel, each together with its complement (paired sampling); a sample weighs the
      remaining kernel mass divided by the number of samples, and a coalition drawn twice
      counts twice but is paid once. Pairs are drawn until the next one would not fit.
    * If the samples leave the regression under-determined, the minimum-norm ``ψ`` is taken:
      the solution closest to the equal split ``Δ/n``.

    Estimates are additive in ``v`` for a fixed ``rng`` seed (the samples do not depend on the
    values) and exact for games with at most pairwise interactions, but biased: at ``n = 10``
    the systematic error measured 37% of mean ``|φ|`` at the minimum budget ``2n + 2`` (the
    design is then deterministic: all of the error is bias), ~20% at ``3n``, 6–10% at ``4n`` and
    1–2% at ``8n`` (``experiments/credit_cost.py``), against a per-episode RMSE of 37%, 40%, 37% and
    20%. If credit is averaged over many episodes at a small budget, the unbiased
    :func:`shapley_antithetic` is the better choice (``shapley(method="auto")`` makes it below
    ``6n``).

    Args:
        agents: agent ids (unique, non-empty).
        v: coalition value function.
        budget: max distinct coalition evaluations, at least ``2n + 2`` (``2**n`` if smaller);
            ``≥ 2**n`` gives the exact values.
        rng: a numpy ``Generator`` or a seed.

    Returns:
        ``{agent: φ̂}`` in the order of ``agents``.

    Raises:
        ValueError: bad agents, or a budget below :func:`min_budget` ``("kernel", n)``.
    """
    return _sampled("kernel", agents, v, budget, rng)


def _kernel_estimate(ev: _Evaluator, budget: int, rng: np.random.Generator) -> np.ndarray:
    n = len(ev.agents)
    full = (1 << n) - 1
    v_empty = ev(0)
    delta = ev(full) - v_empty

    # kernel mass of each size k = 1 … n-1 (C(n, k) coalitions of weight k(S) each)
    mass = {k: (n - 1) / (k * (n - k)) for k in range(1, n)}
    weights: dict[int, float] = {}  # coalition mask → regression weight

    # 1) enumerate complete size pairs, smallest first: sizes 1 and n-1 always (the budget
    #    minimum covers them), a further pair while it lowers the sampling-variance proxy
    #    (open kernel mass)² / (samples left)
    remaining = budget - ev.used
    open_sizes = list(range(1, n))
    k = 1
    while k <= n // 2:
        pair = [k] if k == n - k else [k, n - k]
        cost = sum(math.comb(n, s) for s in pair)
        if cost > remaining:
            break
        open_mass = sum(mass[s] for s in open_sizes)
        rest_mass = open_mass - sum(mass[s] for s in pair)
        rest = remaining - cost
        worse = rest <= 0 or rest_mass**2 / rest >= open_mass**2 / remaining
        if k > 1 and rest_mass > 1e-12 and worse:
            break
        for s in pair:
            w = mass[s] / math.comb(n, s)
            for combo in _combinations_masks(n, s):
                ev(combo)
                weights[combo] = w
            open_sizes.remove(s)
        remaining = budget - ev.used
        k += 1

    # 2) paired kernel sampling over the open sizes
    if open_sizes:
        sizes = np.array(open_sizes)
        p = np.array([mass[s] for s in open_sizes])
        open_mass = float(p.sum())
        p /= open_mass
        draws: dict[int, int] = {}
        n_draws = 0
        free_streak = 0
        while free_streak < _MAX_FREE_DRAWS:
            s = int(rng.choice(sizes, p=p))
            members = rng.choice(n, size=s, replace=False)
            mask = sum(1 << int(j) for j in members)
            pair = (mask, full ^ mask)
            new = {m for m in pair if m not in ev.values}
            if ev.used + len(new) > budget:
                break
            free_streak = 0 if new else free_streak + 1
            for m in pair:
                ev(m)
                draws[m] = draws.get(m, 0) + 1
            n_draws += 2
        for m, c in draws.items():
            weights[m] = weights.get(m, 0.0) + open_mass * c / n_draws

    return _constrained_wls(n, weights, ev.values, v_empty, delta)


def _combinations_masks(n: int, k: int) -> Iterable[int]:
    for combo in combinations(range(n), k):
        yield sum(1 << j for j in combo)


def _constrained_wls(
    n: int, weights: dict[int, float], values: dict[int, float], v_empty: float, delta: float
) -> np.ndarray:
    """Solve ``min Σ w (v(S) − v(∅) − Σ_{i∈S} φ_i)²`` s.t. ``Σ φ = delta``; min-norm if singular."""
    if not weights:
        return np.full(n, delta / n)
    masks = list(weights)
    w = np.fromiter(weights.values(), dtype=float, count=len(masks))
    y = np.array([values[m] for m in masks]) - v_empty
    z = np.array([[(m >> j) & 1 for j in range(n)] for m in masks], dtype=float)
    size = z.sum(axis=1)
    # φ = delta/n + ψ, Σψ = 0: regress the residual on the centred indicators
    x = z - size[:, None] / n
    target = y - size * delta / n
    sw = np.sqrt(w)
    psi, *_ = np.linalg.lstsq(x * sw[:, None], target * sw, rcond=None)
    psi -= psi.mean()  # already in 1⊥ up to rounding; make the constraint exact
    return delta / n + psi


# ----- dispatcher ---------------------------------------------------------------------------------
#: Sampled method ``shapley(method="auto")`` uses above ``exact_max`` agents at the default
#: budget ``8n`` and from :data:`AUTO_KERNEL_BUDGET_PER_AGENT` ``· n`` up.
DEFAULT_SAMPLED_METHOD = "kernel"
#: ``shapley(method="auto")`` samples with KernelSHAP from ``6n`` evaluations up and with
#: antithetic permutations below. Measured by ``experiments/credit_cost.py`` on random interaction
#: games (n = 5–12): KernelSHAP's per-episode RMSE was below antithetic sampling's at every
#: budget (by 3–60%; 15–50% from 6n up), but part of its error is a bias that does not
#: average out over episodes, as the antithetic estimator's does: at n = 10 it was 37% of
#: mean |φ| at its minimum budget 2n + 2 (all of its error there), ~20% at 3n, 6–10% at 4n,
#: 3–6% at 6n and 1–2% at 8n. Below 6n, unbiased credit is worth the larger per-episode noise.
AUTO_KERNEL_BUDGET_PER_AGENT = 6


def _auto_sampled(n: int, budget: int) -> str:
    """The sampled method ``auto`` uses at this budget: kernel, antithetic, or permutation."""
    if budget >= max(AUTO_KERNEL_BUDGET_PER_AGENT * n, min_budget("kernel", n)):
        return "kernel"
    if budget >= min_budget("antithetic", n):
        return "antithetic"
    return "permutation"  # below its minimum too: shapley_permutation names the minimum


def shapley(
    agents: Sequence[str],
    v: ValueFn,
    method: ShapleyMethod = "auto",
    *,
    budget: int | None = None,
    rng: RngLike = None,
    exact_max: int = 8,
) -> dict[str, float]:
    """Shapley credit, exact for small teams and sampled for large ones.

    ``method="auto"`` is exact when ``n ≤ exact_max`` (``2**n`` evaluations, budget ignored)
    or when ``budget ≥ 2**n``. Otherwise it samples: KernelSHAP from ``6n`` evaluations up
    (including the default ``8n``: lowest error, bias ≤ ~2% of mean ``|φ|``), antithetic
    permutations from ``2n`` (unbiased; KernelSHAP's bias is large at small budgets), plain
    permutations from ``n + 1``. See :data:`AUTO_KERNEL_BUDGET_PER_AGENT` for the measurements.
    Ask for ``method="antithetic"`` to get unbiased credit at any budget.

    Args:
        agents: agent ids (unique, non-empty).
        v: coalition value function (wrap it in :class:`CachedValue` to share values across
            calls, average noisy repeats and count evaluations).
        method: ``"auto"``, ``"exact"``, ``"permutation"``, ``"antithetic"`` or ``"kernel"``.
        budget: distinct coalition evaluations for a sampled method; default ``8n`` (at least
            the method's minimum). Ignored by ``"exact"``.
        rng: a numpy ``Generator`` or a seed, for the sampled methods.
        exact_max: largest team ``"auto"`` computes exactly (≤ :data:`EXACT_MAX_AGENTS`).

    Returns:
        ``{agent: φ}`` in the order of ``agents``; sums to ``v(N) − v(∅)``.

    Raises:
        ValueError: bad agents, unknown method, ``exact_max`` out of range, a budget below the
            method's minimum (see :func:`min_budget`), or ``"exact"`` for more than
            :data:`EXACT_MAX_AGENTS` agents.
    """
    ids = _check_agents(agents)
    n = len(ids)
    if not 0 <= exact_max <= EXACT_MAX_AGENTS:
        raise ValueError(f"exact_max must be in 0…{EXACT_MAX_AGENTS}, got {exact_max}")
    methods = get_args(ShapleyMethod)
    if method not in methods:
        raise ValueError(f"unknown Shapley method {method!r}; use one of {', '.join(methods)}")
    if method == "auto":
        if n <= exact_max or (budget is not None and _covers_everything(n, budget)):
            method = "exact"
        else:
            method = DEFAULT_SAMPLED_METHOD if budget is None else _auto_sampled(n, budget)
    if method == "exact":
        return shapley_exact(ids, v)
    if budget is None:
        budget = max(8 * n, min_budget(method, n))
    estimator = {
        "permutation": shapley_permutation,
        "antithetic": shapley_antithetic,
        "kernel": shapley_kernel,
    }[method]
    return estimator(ids, v, budget, rng)


# ----- normalisation ------------------------------------------------------------------------------
def normalize_credit(
    credits: dict[str, float], mode: Literal["maxabs", "zscore"] = "maxabs", eps: float = 1e-8
) -> dict[str, float]:
    """Rescale one episode's credits across agents, e.g. before mixing them into advantages.

    * ``"maxabs"``: ``φ_i / max_j |φ_j|``. Keeps signs, ratios and zeros (a null player stays
      at 0), so the credits land in ``[−1, 1]``; the sum is scaled by the same factor.
    * ``"zscore"``: ``(φ_i − mean φ) / std φ``. *Relative* credit: zero mean across agents, so
      the team's absolute outcome is gone (combine it with the team reward) and a null player
      among contributors gets a negative score.

    If every ``|φ_i|`` (``"maxabs"``) or the spread (``"zscore"``) is below ``eps``, all agents
    get 0. This is a per-episode, across-agent rescaling; running normalisation of advantages
    over a batch is the learner's job.

    Args:
        credits: ``{agent: credit}``.
        mode: ``"maxabs"`` or ``"zscore"``.
        eps: threshold below which the scale counts as zero.

    Returns:
        A new dict with the same keys in the same order.

    Raises:
        ValueError: an unknown mode, or a non-finite credit.
    """
    if mode not in ("maxabs", "zscore"):
        raise ValueError(f"unknown normalisation mode {mode!r}; use 'maxabs' or 'zscore'")
    if not credits:
        return {}
    keys = list(credits)
    x = np.array([credits[k] for k in keys], dtype=float)
    if not np.all(np.isfinite(x)):
        bad = [k for k, val in zip(keys, x, strict=True) if not math.isfinite(val)]
        raise ValueError(f"credits must be finite; not finite for {bad}")
    if mode == "maxabs":
        scale = float(np.max(np.abs(x)))
        out = x / scale if scale >= eps else np.zeros_like(x)
    else:
        spread = float(x.std())
        out = (x - x.mean()) / spread if spread >= eps else np.zeros_like(x)
    return {k: float(val) for k, val in zip(keys, out, strict=True)}
