"""Play a :class:`~scenarios.graph_env.GraphEnv` episode in a test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def play(env: Any, seed: int, act: Callable[[str, Any], Any]) -> None:
    """Reset ``env`` with ``seed`` and step it to the episode's end: an acting agent takes
    ``act(agent, observation)``, the others their scenario's default action."""
    sc = env.scenario
    obs, infos = env.reset(seed=seed)
    while env.agents:
        actions = {
            a: act(a, obs[a]) if infos[a]["acting"] else sc.default_action(a) for a in env.agents
        }
        obs, _, _, _, infos = env.step(actions)
