"""Claim 8 — turn credit (reward to go, GiGPO step groups) vs episode credit for GRPO.

On a multi-turn tool-use task, :class:`StepToolchain` (``toolchain`` ``single`` — one agent
looks up two keys, combines them with ``calc`` and answers; 2 keys, 1 op, at most 4 calls, the
shortest solution — that pays ``call_reward`` 0.1 after every call that fetches or computes a
value the solution needs for the first time, and ``1`` for a correct answer at the end), one MLP
agent trained by GRPO (8 rollouts per task, 4 tasks an iteration) under three
``algorithm.grpo.turn_credit`` settings:

* ``episode``: every turn gets the episode advantage (today's GRPO);
* ``reward_to_go``: a turn is not credited with the rewards paid before it;
* ``step_groups``: the episode advantage plus the reward to go normalised among the group's
  turns from the same observation (GiGPO, ``step_weight`` 1).

Measured: env steps until the 3-iteration moving return reaches :data:`TARGET` (0.3: both
lookups and the combination made), the final return and success rate (correct answers) and, for
step groups, ``grpo/anchor_hit_rate`` (share of turns whose anchor recurs in the group). The
rollouts of a task start from the same observation and diverge after the first different call,
so anchors recur early in an episode and rarely late.

Run: ``python -m experiments.turn_credit`` (``--smoke``, ``--full``, ``--seeds N``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from experiments import analysis as an
from experiments import harness
from experiments.harness import Condition
from scenarios.base import Outcome, ScenarioError
from scenarios.decisions import emit_reward
from scenarios.toolchain import COMMUTATIVE, OPS, Toolchain

CLAIM = "turn_credit"
TITLE = "Turn credit (reward to go, step groups) vs episode credit for GRPO"
PUBLISHED = (
    "GiGPO (arXiv 2505.10978) reports that step-level groups — turns from the same anchor "
    "state, compared by their return — give multi-turn agents finer credit than one advantage "
    "per episode, at no extra rollouts, where states recur across a group's rollouts."
)
#: the return (3-iteration moving average) whose env steps are reported: 0.3 = the three
#: per-call rewards (both lookups and the combination), without the final answer.
TARGET = 0.3
#: an earlier return level (the two lookups mostly made), also reported.
EARLY_TARGET = 0.15
BUDGETS: dict[str, dict[str, Any]] = {
    "smoke": {"iterations": 2},
    "default": {"iterations": 60},
    "full": {"iterations": 150},
}
MODES = ("episode", "reward_to_go", "step_groups")
LABELS = {
    "episode": "episode credit",
    "reward_to_go": "reward to go",
    "step_groups": "step groups (GiGPO)",
}


class StepToolchain(Toolchain):
    """``toolchain`` paying per turn: ``call_reward`` after each call that makes progress (a
    valid lookup of a task key or ``calc`` of the target combination not made before, see
    :meth:`progress`), ``final_weight`` for a correct answer at the end (no end-of-episode
    checklist fractions)."""

    name = "step-toolchain"

    def __init__(self, *args: Any, call_reward: float = 0.1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not call_reward >= 0:
            raise ScenarioError(f"call_reward={call_reward!r}: give a number ≥ 0")
        self.call_reward = float(call_reward)

    def run_tool(
        self, state: dict[str, Any], log: list[dict[str, Any]], tool: int, arg: int, x: int, y: int
    ) -> dict[str, Any]:
        call = super().run_tool(state, log, tool, arg, x, y)
        if self.call_reward and self.progress(state["task"], log, call):
            emit_reward(self.call_reward)
        return call

    def progress(
        self, task: dict[str, int], log: list[dict[str, Any]], call: dict[str, Any]
    ) -> bool:
        """Whether ``call`` produced a value the solution needs that no earlier call had (a
        repeated lookup earns nothing, so the per-call reward cannot be farmed)."""
        k1, k2, (op, _) = f"L{task['k1']}", f"L{task['k2']}", OPS[task["op"]]
        needed = {k1, k2, f"{op}({k1},{k2})"} | (
            {f"{op}({k2},{k1})"} if op in COMMUTATIVE else set()
        )
        have = {c["src"] for c in log if c["ok"]}
        return bool(call["ok"]) and call["tool"] != "answer" and call["src"] in needed - have

    def score(self, state: dict[str, Any]) -> Outcome:
        out = super().score(state)
        return dataclasses.replace(out, reward=self.final_weight * out.success, local={})


def conditions(budget: str) -> list[Condition]:
    """One arm per turn-credit mode."""
    b = BUDGETS[budget]
    base = {
        "scenario": "experiments.turn_credit:StepToolchain",
        "topology": "single",
        "scenario_kwargs": {"n_keys": 2, "n_ops": 1, "max_calls": 4, "call_reward": 0.1},
        "pools": {"agent": {"model": {"type": "mlp", "hidden": [64, 64]}}},
        "budget": {"iterations": b["iterations"]},
    }
    out = []
    for mode in MODES:
        grpo = {"group_size": 8, "groups_per_iteration": 4, "turn_credit": mode}
        algo = {"name": "GRPO", "lr": 0.001, "num_epochs": 1, "grpo": grpo}
        cfg = harness.deep_merge(base, {"algorithm": algo})
        out.append(Condition(mode, LABELS[mode], cfg, {"turn_credit": mode}))
    return out


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the claim (see the module docstring); returns the records."""
    p = harness.parser(CLAIM, "GRPO turn credit vs episode credit on a multi-turn tool task.")
    args = p.parse_args(argv)
    ctx = harness.context(CLAIM, args, argv)
    records = harness.run_claim(ctx, conditions(ctx.budget), args.seeds)
    for record in records:
        _add_learner_metrics(ctx, record)
    return records


#: learner metrics (``metrics.jsonl`` keys) averaged over a run into ``extra_metrics``.
LEARNER_KEYS = {"anchor_hit_rate": "losses/agent/grpo/anchor_hit_rate"}


def _add_learner_metrics(ctx: harness.Context, record: dict[str, Any]) -> None:
    """Add the run's mean learner metrics (the harness keeps ``charts/…`` only) to its file."""
    import json
    from pathlib import Path

    path = Path(record["run_dir"]) / "metrics.jsonl"
    if "extra_metrics" in record or not path.exists():
        return
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    record["extra_metrics"] = {
        name: sum(vals) / len(vals)
        for name, key in LEARNER_KEYS.items()
        if (vals := [r[key] for r in rows if r.get(key) is not None])
    }
    harness.write_json(ctx.record_path(record["condition"], record["seed"]), record)


# ----- report -------------------------------------------------------------------------------
def report(records: Sequence[Mapping[str, Any]], fig: an.Figures) -> str:
    """The claim's section body."""
    groups = an.group(records, order=list(MODES))
    if not groups:
        return ""
    rows = []
    for name, rs in groups.items():
        rows.append(
            [
                LABELS.get(name, name),
                len(rs),
                an.fmt_steps([an.steps_to(r, "team_return", EARLY_TARGET) for r in rs]),
                an.fmt_steps([an.steps_to(r, "team_return", TARGET) for r in rs]),
                an.fmt([an.final(r, "success") for r in rs], pct=True),
                an.fmt([an.final(r, "team_return") for r in rs]),
                an.fmt([an.final(r, "episode_len") for r in rs], digits=2),
                an.fmt([r.get("extra_metrics", {}).get("anchor_hit_rate") for r in rs], pct=True),
            ]
        )
    out = [
        f"*Steps to return {TARGET}* = env steps until the 3-iteration moving average of the "
        "return first reaches it (both lookups and the combination paid, 0.1 each); success = "
        "share of episodes answering correctly (+1). *Anchor hit rate* = "
        "share of turns whose observation recurs among the group's turns (mean over the run; "
        "only logged with step groups).",
        "",
        an.table(
            [
                "turn credit",
                "seeds",
                f"steps to return {EARLY_TARGET}",
                f"steps to return {TARGET}",
                "final success",
                "final return",
                "episode length",
                "anchor hit rate",
            ],
            rows,
        ),
        "",
    ]
    episode = groups.get("episode")
    for name in ("reward_to_go", "step_groups"):
        other = groups.get(name)
        if episode and other:
            out += [
                f"**Computed findings ({LABELS[name]} vs episode credit):**",
                "",
                *an.findings(
                    other,
                    episode,
                    (LABELS[name], "episode credit"),
                    [
                        ("final return", an.final, "team_return"),
                        ("best return (3-iteration average)", an.best, "team_return"),
                        ("final success", an.final, "success"),
                    ],
                ),
                "",
            ]
    out.append(
        an.curve_figure(
            fig,
            groups,
            "team_return",
            LABELS,
            "return",
            "return per turn-credit mode",
            decorate=lambda ax: ax.axhline(TARGET, color="grey", linestyle=":", linewidth=1),
        )
    )
    return "\n".join(out)


if __name__ == "__main__":
    harness.run_as_script(main)
