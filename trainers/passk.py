"""pass@k by sampling: k completions per task, for a trained team and its starting point.

Contract: :func:`sample_trials` runs ``n`` episodes per task (task = episode seed) with the
team's *exploration* policy (LLM pools sample at their training temperature; small networks
sample their action distribution), each episode's sampling seeded from (seed, task, sample)
so a rerun draws the same trials. The estimators are pure functions over the trials:

* pass@k — Chen et al. (2021): ``1 − C(n−c, k) / C(n, k)`` per task with ``c`` of ``n``
  samples solved, averaged over tasks (:func:`pass_at_k`);
* mean@k — the expected mean return of k samples, i.e. the task's mean return (the same for
  every k; the "average" view next to pass@k's "any" view);
* best@k — the expected best return among k samples drawn without replacement from the n
  (:func:`best_at_k`, order statistics).

:func:`passk_table` computes them for k = 1, 2, 4, … ≤ n. The starting point of a run
(``baseline="init"``) is the team built fresh from the run's config: for LLM pools exactly
the weights training started from; for small networks a fresh initialisation with the run's
seed (the same distribution, not necessarily the same draw). A checkpoint path compares with
that checkpoint instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task: ``1 − C(n−c, k) / C(n, k)`` (n samples, c solved)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 ≤ c ≤ n and 1 ≤ k ≤ n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # C(n−c, k) / C(n, k) = Π_{i = n−c+1..n} (1 − k / i), stable for large n
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def best_at_k(returns: Sequence[float], k: int) -> float:
    """Expected maximum of ``k`` of the ``returns`` drawn without replacement: the i-th
    smallest (1-based) is the maximum in ``C(i−1, k−1)`` of the ``C(n, k)`` subsets."""
    r = np.sort(np.asarray(returns, dtype=float))
    n = len(r)
    if not 1 <= k <= n:
        raise ValueError(f"best@k needs 1 ≤ k ≤ n, got n={n}, k={k}")
    weights = np.array([math.comb(i - 1, k - 1) for i in range(1, n + 1)], dtype=float)
    return float((r * weights).sum() / math.comb(n, k))


def ks_up_to(n: int) -> list[int]:
    """1, 2, 4, … up to ``n`` (and ``n`` itself)."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks if ks[-1] == n else [*ks, n]


def passk_table(trials: Mapping[int, Sequence[Mapping[str, float]]]) -> dict[str, float]:
    """``pass@k``, ``mean@k`` and ``best@k`` for k in :func:`ks_up_to` (n = the fewest samples
    of any task) from ``task → [{"success", "return"}, …]``, averaged over tasks."""
    if not trials:
        raise ValueError("pass@k needs at least one task")
    n = min(len(t) for t in trials.values())
    out: dict[str, float] = {"tasks": float(len(trials)), "samples": float(n)}
    for k in ks_up_to(n):
        passes, means, bests = [], [], []
        for samples in trials.values():
            s = samples[:n]
            c = sum(1 for x in s if x["success"] > 0.5)
            passes.append(pass_at_k(n, c, k))
            means.append(float(np.mean([x["return"] for x in s])))
            bests.append(best_at_k([x["return"] for x in s], k))
        out[f"pass@{k}"] = float(np.mean(passes))
        out[f"mean@{k}"] = float(np.mean(means))
        out[f"best@{k}"] = float(np.mean(bests))
    return out


def sample_seed(seed: int, task: int, sample: int) -> int:
    """The torch seed of one sampled episode (fixed by seed, task and sample index)."""
    return int(np.random.SeedSequence([seed, task, sample]).generate_state(1)[0])


def sample_trials(
    env: Any, policy: Any, tasks: Sequence[int], n: int, seed: int
) -> dict[int, list[dict[str, float]]]:
    """``n`` exploration episodes of ``policy`` (a :class:`~trainers.evaluate.TeamPolicy`) on
    each task seed in ``tasks``: ``task → [{"success", "return"}, …]``."""
    import torch

    out: dict[int, list[dict[str, float]]] = {}
    for task in tasks:
        runs = []
        for j in range(n):
            torch.manual_seed(sample_seed(seed, task, j))
            policy.reset()
            obs, infos = env.reset(seed=int(task))
            while env.agents:
                acting = {a: obs[a] for a in env.agents if infos[a]["acting"]}
                obs, _, _, _, infos = env.step(policy.act(acting, explore=True))
            runs.append({"success": float(env.outcome.success), "return": env.outcome.reward})
        out[int(task)] = runs
    return out


def initial_modules(cfg: Any, plan: Any) -> Any:
    """The team's modules as a run of ``cfg`` starts (see the module doc)."""
    import torch
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec

    from marl_agents.modules import module_spec

    default = cfg.algorithm.algorithm_class().get_default_config().get_default_rl_module_spec()
    torch.manual_seed(cfg.seed)
    specs = {pid: module_spec(p, plan.env) for pid, p in plan.pools.items()}
    for spec in specs.values():
        if spec.module_class is None:  # the algorithm's default network (RLlib fills it in)
            spec.module_class = default.module_class
    return MultiRLModuleSpec(rl_module_specs=specs).build()
