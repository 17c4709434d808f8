"""Readable episode transcripts: who acted on what, with which action, rewards, outcome, credit.

:meth:`scenarios.graph_env.GraphEnv.transcript` records an episode as plain data (observations and
actions rendered by the scenario's ``render_observation`` / ``render_action`` hooks: decoded
text for text agents, a compact repr for vectors). :func:`trainers.run.loop.train` keeps
``output.transcripts`` episodes of every iteration (the first that finished on the env
runners) and writes them under the run directory:

* ``transcripts/iter_NNNNNN.jsonl`` — one JSON object per episode: the transcript's keys plus
  ``iteration`` and, when the run's credit method is not ``team``, ``credit`` (agent → credit,
  recomputed here by replaying the episode, as the learner does; left out for timed-out
  episodes, whose replays would wait out the limit again);
* ``transcripts/iter_NNNNNN.md`` — the same, rendered by :func:`render`.

``marl eval <run> --transcripts N`` prints N evaluation episodes the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: a rendered observation or action longer than this (or multi-line) gets a block of its own
INLINE_MAX = 100


def episode_credit(
    env: Any,
    seed: int,
    actions: Mapping[str, Sequence[Any]],
    local: Mapping[str, float] | None,
    credit: Any,
) -> dict[str, float]:
    """Per-agent credit of one episode under ``credit`` (a
    :class:`~trainers.configs.credit.CreditConfig`).

    ``team``: none; ``local``: the outcome's ``local`` rewards; ``loo`` / ``shapley``: from
    replays of episode ``seed`` with the agents' recorded ``actions`` (``env.value``).
    """
    players = sorted(actions, key=env.possible_agents.index)
    if credit.method == "team" or not players:
        return {}
    if credit.method == "local":
        return {a: float(v) for a, v in (local or {}).items() if a in players}
    from trainers.credit.settings import shapley_credit
    from trainers.credit.values import leave_one_out

    def v(coalition: frozenset[str]) -> float:
        return env.value(seed, coalition, actions)

    if credit.method == "loo":
        return leave_one_out(players, v)
    return shapley_credit(credit, players, v, seed)  # the estimator call training uses


def write_iteration(run_dir: Path, iteration: int, transcripts: list[dict[str, Any]]) -> Path:
    """Write one iteration's transcripts (``.jsonl`` and ``.md``); return the ``.jsonl`` path."""
    folder = run_dir / "transcripts"
    folder.mkdir(exist_ok=True)
    path = folder / f"iter_{iteration:06d}.jsonl"
    path.write_text("".join(json.dumps(t, default=str) + "\n" for t in transcripts))
    text = f"# iteration {iteration}: {len(transcripts)} episode(s)\n\n"
    text += "\n".join(render(t) for t in transcripts)
    path.with_suffix(".md").write_text(text)
    return path


def render(t: Mapping[str, Any], title: str | None = None) -> str:
    """A transcript as Markdown: the outcome first, then every step's decisions and rewards."""
    head = title or f"episode seed {t.get('seed')} · {t.get('scenario')}"
    if t.get("iteration") is not None:
        head += f" · iteration {t['iteration']}"
    lines = [f"## {head}", ""]
    outcome = t.get("outcome") or {}
    if outcome:
        parts = [
            f"reward {outcome.get('reward', 0.0):.3f}",
            f"success {'yes' if outcome.get('success') else 'no'}",
        ]
        if outcome.get("truncated"):
            parts.append("truncated")
        lines.append("outcome: " + " · ".join(parts))
    if t.get("failure"):
        lines.append(f"failed ({t['failure']}): {t.get('error')}")
    if outcome.get("metrics"):
        lines.append("metrics: " + _pairs(outcome["metrics"]))
    if t.get("returns"):
        lines.append("returns: " + _pairs(t["returns"]))
    if t.get("credit"):
        lines.append(f"credit ({t.get('credit_method', '?')}): " + _pairs(t["credit"]))
    for step in t.get("steps", []):
        lines += ["", f"### step {step['step']} · superstep {step['superstep']}"]
        for d in step["decisions"]:
            lines.append(f"- **{d['agent']}**")
            lines += _field("observed", d["observation"])
            lines += _field("action", d["action"])
            for call in d.get("tool_calls", []):
                lines.append(f"  - tool call: `{call}`")
        if step.get("rewards"):
            lines.append(
                "- rewards: " + " · ".join(f"{a} {r:+.3f}" for a, r in step["rewards"].items())
            )
    return "\n".join(lines) + "\n"


def _field(label: str, text: str) -> list[str]:
    if "\n" not in text and len(text) <= INLINE_MAX and "`" not in text:
        return [f"  - {label}: `{text}`"]
    fence = "````" if "```" in text else "```"
    body = [f"    {line}" if line else "" for line in text.splitlines()]
    return [f"  - {label}:", "", f"    {fence}text", *body, f"    {fence}", ""]


def _pairs(values: Mapping[str, Any]) -> str:
    return " · ".join(
        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items()
    )
