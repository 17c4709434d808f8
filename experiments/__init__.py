"""Experiment scripts that reproduce the field's published multi-agent training claims at
laptop scale (issue #6), and the report that turns their raw results into ``docs/results.md``.

One module per claim, each runnable as ``python -m experiments.<claim>`` with ``--seeds N``
(default 3), ``--full`` (bigger budget), ``--smoke`` (tiny budget, for tests) and ``--out``:

* :mod:`experiments.orchestrator_only` — frozen-subagent orchestrator training vs joint training;
* :mod:`experiments.fanout_latency` — parallel fan-out vs forced sequential delegation;
* :mod:`experiments.credit` — team / local / leave-one-out / Shapley credit, and Shapley
  estimator error vs coalition budget;
* :mod:`experiments.heterogeneous` — heterogeneous pools vs one homogeneous pool of the same size;
* :mod:`experiments.single_vs_team` — the degenerate one-agent topology vs a team;
* :mod:`experiments.spread_benchmark` — IPPO-style training on ``spread`` next to published
  numbers;
* :mod:`experiments.judge_voting` — a majority of noisy judges vs the exact verifier as reward
  (scripted judges: :mod:`experiments.judges`);
* :mod:`experiments.curriculum` — learnability curriculum vs uniform task sampling;
* :mod:`experiments.passk` — pass@1…pass@16 before and after GRPO on ``text-delegate``;
* :mod:`experiments.sampler_curves` — the batched sampler's learning curves vs RLlib's sampler;
* :mod:`experiments.critics` — a centralised critic (MAPPO) vs independent critics (IPPO) on
  ``relay`` and ``delegate``.

:mod:`experiments.harness` runs one config per seed and writes one JSON per (condition, seed)
under ``experiments/results/<claim>/<budget>/``; :mod:`experiments.report` rebuilds the report
from those files; :mod:`experiments.run_all` runs every default and then the report.
"""

from __future__ import annotations

#: the claims, in report order (module names under ``experiments``).
CLAIMS: tuple[str, ...] = (
    "orchestrator_only",
    "fanout_latency",
    "credit",
    "heterogeneous",
    "single_vs_team",
    "spread_benchmark",
    "judge_voting",
    "turn_credit",
    "curriculum",
    "passk",
    "sampler_curves",
    "critics",
)
