"""Claim 11 — the batched sampler learns like RLlib's sampler (issue #17, "learning unchanged").

Two arms per scenario, differing only in ``episodes.sampler``: ``rllib`` (RLlib's own
``MultiAgentEnvRunner``) and ``batched`` (:mod:`trainers.sampling.batched_runner`: one forward per
module per step, per-env RNG streams). Scenarios, each with its default topology and pools and
the package's PPO defaults (1000 env steps an iteration, 16 envs per runner, team credit):
``delegate`` (``star:3``), ``relay`` (``star:3``) and ``spread`` (``mesh:3``). The two
samplers draw different random numbers, so seed k of one arm is an independent run from seed k
of the other: the comparison is between seed distributions, not run by run.

Compared, per scenario: the team return (mean of a 3-iteration window) at 25/50/75/100% of the
budget, and whether each arm's seed mean lies inside the other arm's seed range (min–max, not
widened); the final return (mean ± sd); and throughput, both sampling only (env steps per
second of ``sample()`` time: env, forward and sampler overhead from the phase timers) and end
to end (env steps per second of iteration wall time, learner included), with batched ÷ rllib
ratios. Each pair of runs (same scenario and seed, one per sampler) trains back to back, so
both arms see the same load on the machine.

**LLM pools** (issue #25, GRPO): ``supervisor`` (``examples/supervisor_app.yaml``, success
rate), ``finetune`` (``examples/finetune_tiny.yaml``: text-delegate, mean reward) and
``lora`` (two LoRA pools on one tiny base, ``tests/apps/lora_pair.py``), each as its example
or test writes it; since issue #25 both samplers hand the learner whole groups (the batched
one side by side, RLlib's one rollout after another). The batched arm runs GRPO's default
``groups_in_flight`` (all of a runner's groups at once, ``marl finetune``'s default too);
since issue #44 the learner gets the same rows at any ``groups_in_flight``, so its curves are
also those of one group at a time.

Run: ``python -m experiments.sampler_curves`` (``--full`` for a larger budget, ``--smoke``;
``--scenarios delegate relay`` runs only those; the LLM workloads run when named:
``--scenarios supervisor finetune lora``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from experiments import analysis as an
from experiments import harness
from experiments.harness import Condition

CLAIM = "sampler_curves"
TITLE = "Batched sampler vs RLlib's sampler: learning curves"
PUBLISHED = (
    "A faster sampler must not change learning: with the batched sampler, learning curves on "
    "delegate, relay and spread lie within the seed spread of RLlib's sampler (issue #17)."
)
#: scenario → its default topology (named in the config, so the record says it)
SMALL: dict[str, str] = {"delegate": "star:3", "relay": "star:3", "spread": "mesh:3"}
#: LLM pools (GRPO, issue #25): the chat-app example (examples/supervisor_app.yaml, in
#: docs/tutorials/langgraph-app.md), the fine-tuning example
#: (text-delegate) and the LoRA pair; each as its example or test writes it (team credit for
#: the supervisor: its Shapley credit gives the identical curve, the frozen workers' is 0)
LLM: tuple[str, ...] = ("supervisor", "finetune", "lora")
#: workload → what the report calls it
SCENARIOS: dict[str, str] = {
    **SMALL,
    "supervisor": "examples/supervisor_app.yaml",
    "finetune": "examples/finetune_tiny.yaml",
    "lora": "tests.apps.lora_pair, 2 LoRA pools",
}
SAMPLERS: tuple[str, ...] = ("rllib", "batched")
LABELS = {"rllib": "RLlib sampler", "batched": "batched sampler"}
BUDGETS: dict[str, dict[str, Any]] = {
    "smoke": {"iterations": {**dict.fromkeys(SCENARIOS, 2)}},
    "default": {
        "iterations": {
            "delegate": 20,
            "relay": 20,
            "spread": 20,
            "supervisor": 100,
            "finetune": 70,
            "lora": 25,
        }
    },
    "full": {
        "iterations": {
            "delegate": 60,
            "relay": 60,
            "spread": 100,
            "supervisor": 150,
            "finetune": 100,
            "lora": 50,
        }
    },
}
#: the metric each workload is compared on (``team_return`` where not named)
KEYS: dict[str, str] = {"supervisor": "success"}
#: fractions of the budget at which the arms are compared
CHECKPOINTS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
KEY = "team_return"
#: P(the mean of 3 seeds lies outside the min–max of 3 other seeds of the same distribution),
#: simulated with normal returns (10⁶ draws)
CHANCE_OUTSIDE = 0.37
#: phase timers that add up to a ``sample()`` call's time
SAMPLE_TIMERS = ("timers/env_s", "timers/forward_s", "timers/sample_overhead_s")


def llm_config(workload: str) -> dict[str, Any]:
    """An LLM workload's experiment, as its example or test writes it."""
    from pathlib import Path

    from trainers.configs.experiment import ExperimentConfig
    from trainers.finetune import FinetuneJob

    examples = Path(__file__).resolve().parents[1] / "examples"
    if workload == "supervisor":
        data = ExperimentConfig.from_yaml(examples / "supervisor_app.yaml").to_dict()
        data["credit"] = {"method": "team"}
    elif workload == "finetune":
        data = FinetuneJob.from_yaml(examples / "finetune_tiny.yaml").to_experiment().to_dict()
    else:  # lora: tests/test_lora.py's specialisation test, through train()
        lora = {"r": 8, "alpha": 16.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
        model = {"type": "llm", "path": "tiny", "lora": lora}
        data = {
            "scenario": "tests.apps.lora_pair:pair",
            "sharing": "explicit",
            "pools": {n: {"agents": [n], "model": model} for n in ("alice", "bob")},
            "algorithm": {
                "name": "GRPO",
                "lr": 0.02,
                "num_epochs": 1,
                "grpo": {"group_size": 8, "groups_per_iteration": 4},
            },
        }
    for key in ("logging", "output", "seed", "budget"):
        data.pop(key, None)
    return data


def condition(scenario: str, sampler: str, iterations: int) -> Condition:
    """One arm: ``scenario`` (on its default topology, or an LLM workload as its example
    writes it), ``sampler``, ``iterations`` iterations."""
    if scenario in LLM:
        config = llm_config(scenario)
    else:
        config = {"scenario": scenario, "topology": SCENARIOS[scenario]}
    episodes = {**config.get("episodes", {}), "sampler": sampler}
    config = {**config, "budget": {"iterations": iterations}, "episodes": episodes}
    label = f"{scenario}, {LABELS[sampler]}"
    return Condition(
        f"{scenario}-{sampler}", label, config, {"scenario": scenario, "sampler": sampler}
    )


def conditions(
    budget: str,
    scenarios: Sequence[str] = tuple(SCENARIOS),
    iterations: Mapping[str, int] | None = None,
) -> list[Condition]:
    """Both arms of every scenario in ``scenarios`` (``iterations`` overrides the budget's)."""
    its = {**BUDGETS[budget]["iterations"], **(iterations or {})}
    return [condition(s, sampler, its[s]) for s in scenarios for sampler in SAMPLERS]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the claim (see the module docstring); returns the records."""
    p = harness.parser(CLAIM, "Batched sampler vs RLlib's sampler: learning curves.")
    p.add_argument(
        "--scenarios",
        nargs="+",
        choices=list(SCENARIOS),
        default=list(SMALL),
        help="scenarios to run",
    )
    args = p.parse_args(argv)
    ctx = harness.context(CLAIM, args, argv)
    return harness.run_claim(ctx, conditions(ctx.budget, args.scenarios), args.seeds)


# ----- numbers ------------------------------------------------------------------------------
def key_of(record: Mapping[str, Any]) -> str:
    """The metric a record's workload is compared on (:data:`KEYS`)."""
    return KEYS.get(record["params"]["scenario"], KEY)


def at(record: Mapping[str, Any], fraction: float, key: str | None = None) -> tuple[float, float]:
    """``(env steps, value)`` at ``fraction`` of a run: the value is the mean of ``key`` over
    the :data:`~experiments.analysis.LAST` iterations ending at iteration ⌈fraction·n⌉."""
    steps, values = an.series(record, key or key_of(record))
    if not len(values):
        return math.nan, math.nan
    end = max(1, math.ceil(fraction * len(values) - 1e-9))
    window = values[max(0, end - an.LAST) : end]
    return float(steps[end - 1]), float(window.mean())


def inside(value: float, others: Sequence[float], margin: float = 0.0) -> bool:
    """Whether ``value`` lies in ``[min(others) − margin, max(others) + margin]``."""
    return min(others) - margin <= value <= max(others) + margin


def pooled_sd(a: Sequence[float], b: Sequence[float]) -> float:
    """√((s_a² + s_b²)/2): the seed standard deviation of two arms of equal size, pooled."""
    return float(math.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2))


def sampling_rate(record: Mapping[str, Any]) -> float:
    """Env steps per second of sampling (``sample()`` time from the phase timers), over the
    whole run; nan when the run has no timers."""
    rows = record["history"]
    sample_s = sum(sum(float(h.get(k, 0.0) or 0.0) for k in SAMPLE_TIMERS) for h in rows)
    if not rows or sample_s <= 0:
        return math.nan
    return _steps(rows) / sample_s


def wall_rate(record: Mapping[str, Any]) -> float:
    """Env steps per second of iteration wall time (sampling, learning, syncing)."""
    rows = record["history"]
    wall = sum(float(h.get("iteration_s", 0.0) or 0.0) for h in rows)
    return _steps(rows) / wall if wall > 0 else math.nan


def _steps(rows: Sequence[Mapping[str, Any]]) -> float:
    return float(rows[-1]["env_steps"]) if rows else 0.0


def ratio(fast: Sequence[float], slow: Sequence[float]) -> str:
    """``1.84×`` of the mean rates (``—`` when either is missing)."""
    a, b = an.stats(fast), an.stats(slow)
    if not a["n"] or not b["n"] or b["mean"] <= 0:
        return "—"
    return f"{a['mean'] / b['mean']:.2f}×"


def checkpoint_rows(
    rllib: Sequence[Mapping[str, Any]], batched: Sequence[Mapping[str, Any]]
) -> list[list[Any]]:
    """One row per checkpoint: env steps, each arm's ``mean (min–max)``, and whether each
    arm's seed mean lies inside the other's seed range."""
    rows = []
    for f in CHECKPOINTS:
        points = {name: [at(r, f) for r in rs] for name, rs in (("r", rllib), ("b", batched))}
        steps = np.mean([s for s, _ in points["r"] + points["b"]])
        r = [v for _, v in points["r"]]
        b = [v for _, v in points["b"]]
        rows.append(
            [
                f"{int(100 * f)}%",
                f"{steps / 1000:.1f}k",
                _mean_range(r),
                _mean_range(b),
                _verdict(float(np.mean(b)), r),
                _verdict(float(np.mean(r)), b),
            ]
        )
    return rows


def _mean_range(values: Sequence[float]) -> str:
    s = an.stats(values)
    return f"{s['mean']:.3f} ({s['min']:.3f}–{s['max']:.3f})"


def _verdict(mean: float, others: Sequence[float]) -> str:
    if inside(mean, others):
        return "inside"
    side, gap = (
        ("below", min(others) - mean) if mean < min(others) else ("above", mean - max(others))
    )
    return f"**outside** ({side} by {gap:.3f})"


# ----- report -------------------------------------------------------------------------------
HEADERS = [
    "scenario",
    "sampler",
    "seeds",
    "env steps",
    "final return",
    "sampling steps/s",
    "end-to-end steps/s",
]
CHECK_HEADERS = [
    "checkpoint",
    "env steps",
    "RLlib: mean (min–max)",
    "batched: mean (min–max)",
    "batched mean in RLlib range",
    "RLlib mean in batched range",
]


def report(records: Sequence[Mapping[str, Any]], fig: an.Figures) -> str:
    """The claim's section body: summary table, per-scenario checkpoints and plots."""
    groups = an.group(records, order=[f"{s}-{m}" for s in SCENARIOS for m in SAMPLERS])
    if not groups:
        return ""
    out = [
        "*Final return*: team return, mean of the last "
        f"{an.LAST} iterations, mean ± sd over seeds (min–max). *Sampling steps/s*: env steps "
        "per second of `sample()` time (env + forward + sampler overhead, from the phase "
        "timers); *end-to-end*: per second of iteration wall time, learner included. Both "
        "arms of a seed ran back to back on the same (shared, busy) machine.",
        "",
        "How to read the *inside/outside* columns: with 3 seeds per arm, the seed mean of one "
        "arm falls outside the min–max of another arm drawn from the *same* distribution "
        f"{100 * CHANCE_OUTSIDE:.0f}% of the time (simulated with normal returns), so some "
        "*outside* marks are expected even when the samplers learn alike; a real difference "
        "shows as the same arm ahead at every checkpoint, by more than the seed spread.",
        "",
        an.table(HEADERS, _summary_rows(groups)),
        "",
    ]
    for scenario in SCENARIOS:
        rllib, batched = groups.get(f"{scenario}-rllib"), groups.get(f"{scenario}-batched")
        if not rllib or not batched:
            continue
        out += _scenario_part(scenario, rllib, batched, fig)
    return "\n".join(out)


def _summary_rows(groups: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[list[Any]]:
    rows = []
    for scenario in SCENARIOS:
        arms = {m: groups.get(f"{scenario}-{m}") for m in SAMPLERS}
        for m, rs in arms.items():
            if not rs:
                continue
            rows.append(
                [
                    scenario,
                    LABELS[m],
                    len(rs),
                    an.fmt([r["env_steps"] for r in rs], digits=0),
                    an.fmt([an.final(r, key_of(r)) for r in rs]),
                    an.fmt([sampling_rate(r) for r in rs], digits=0),
                    an.fmt([wall_rate(r) for r in rs], digits=0),
                ]
            )
        if arms["rllib"] and arms["batched"]:
            rows.append(
                [
                    scenario,
                    "**batched ÷ RLlib**",
                    "",
                    "",
                    "",
                    ratio(
                        [sampling_rate(r) for r in arms["batched"]],
                        [sampling_rate(r) for r in arms["rllib"]],
                    ),
                    ratio(
                        [wall_rate(r) for r in arms["batched"]],
                        [wall_rate(r) for r in arms["rllib"]],
                    ),
                ]
            )
    return rows


def _scenario_part(
    scenario: str,
    rllib: Sequence[Mapping[str, Any]],
    batched: Sequence[Mapping[str, Any]],
    fig: an.Figures,
) -> list[str]:
    misses = sum(
        not inside(float(np.mean([at(r, f)[1] for r in mine])), [at(r, f)[1] for r in other])
        for f in CHECKPOINTS
        for mine, other in ((batched, rllib), (rllib, batched))
    )
    groups = {f"{scenario}-rllib": rllib, f"{scenario}-batched": batched}
    labels = {f"{scenario}-{m}": LABELS[m] for m in SAMPLERS}
    f, ax = an.pyplot().subplots(figsize=(7, 4))
    key = KEYS.get(scenario, KEY)
    an.curves(
        ax, groups, key, labels, colors={f"{scenario}-rllib": "C0", f"{scenario}-batched": "C3"}
    )
    ax.set_ylabel(f"{key.replace('_', ' ')} (training)")
    ax.set_title(f"{scenario} ({SCENARIOS[scenario]})", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    caption = f"{scenario}: {key.replace('_', ' ')} vs env steps, RLlib vs batched sampler"
    return [
        f"**{scenario}** (`{SCENARIOS[scenario]}`): {key.replace('_', ' ')} at each checkpoint "
        "(mean of a "
        f"{an.LAST}-iteration window); a seed mean outside the other arm's min–max is marked. "
        f"{misses} of {2 * len(CHECKPOINTS)} comparisons outside.",
        "",
        an.table(CHECK_HEADERS, checkpoint_rows(rllib, batched)),
        "",
        fig.save(f, scenario, caption),
        "",
    ]


if __name__ == "__main__":
    harness.run_as_script(main)
