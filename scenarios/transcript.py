"""A finished episode as plain JSON-safe data (``GraphEnv.transcript()``).

Written per iteration by :mod:`trainers.transcripts` and printed by ``marl eval --transcripts``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scenarios.graph_env import GraphEnv


def transcript(env: GraphEnv) -> dict[str, Any]:
    """The last episode of ``env`` as plain JSON-safe data: who acted on what, rewards, outcome.

    Observations and actions are rendered with the scenario's
    :meth:`~scenarios.base.Scenario.render_observation` / ``render_action`` (decoded text
    for text agents), so call it only for the episodes you keep. Keys: ``scenario``,
    ``seed``, ``steps`` (one per env step: ``step``, ``superstep``, ``decisions`` — each
    ``agent``, ``observation``, ``action`` and, where the reply holds ``<tool>`` calls,
    ``tool_calls`` — and the non-zero ``rewards`` of that step), ``returns`` (agent → sum of
    its rewards), ``outcome`` (``reward``, ``success``, ``truncated``, ``metrics``,
    ``local``), ``failure`` and ``error``.
    """
    scenario = env.scenario
    steps: dict[int, dict[str, Any]] = {}
    for t in env.trace:
        row = steps.setdefault(
            t.step, {"step": t.step, "superstep": t.superstep, "decisions": [], "rewards": {}}
        )
        decision = {
            "agent": t.agent,
            "observation": _render(scenario.render_observation, t.agent, t.observation),
            "action": _render(scenario.render_action, t.agent, t.action),
        }
        calls = _tool_calls(decision["action"])
        if calls:
            decision["tool_calls"] = calls
        row["decisions"].append(decision)
    returns: dict[str, float] = {}
    for k, rewards in enumerate(env.step_rewards):
        for agent, r in rewards.items():
            returns[agent] = returns.get(agent, 0.0) + float(r)
        if k in steps:
            steps[k]["rewards"] = {a: float(r) for a, r in rewards.items() if r}
    outcome = env.outcome
    return {
        "scenario": scenario.id(),
        "seed": env.seed_used,
        "steps": [steps[k] for k in sorted(steps)],
        "returns": returns,
        "outcome": None
        if outcome is None
        else {
            "reward": float(outcome.reward),
            "success": bool(outcome.success),
            "truncated": bool(env.truncated),
            "metrics": {k: float(v) for k, v in (outcome.metrics or {}).items()},
            "local": {k: float(v) for k, v in (outcome.local or {}).items()},
        },
        "failure": env.failure,
        "error": env.error,
    }


def _render(hook: Callable[[str, Any], str], agent: str, value: Any) -> str:
    """A scenario's rendering of a value; a failing hook shows its error instead of raising."""
    try:
        return str(hook(agent, value))
    except Exception as exc:  # a transcript must not end a training run
        return f"<{getattr(hook, '__name__', 'render')} failed: {type(exc).__name__}: {exc}>"


def _tool_calls(text: str) -> list[str]:
    """``name({"arg": ...})`` for each ``<tool>`` call in an action's text."""
    if "<tool>" not in text:
        return []
    from scenarios.toolcalls import parse_tool_calls

    return [
        f"{c.name}({json.dumps(c.arguments, sort_keys=True, default=str)})"
        for c in parse_tool_calls(text).tool_calls
    ]


__all__ = ["transcript"]
