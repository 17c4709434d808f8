"""Executing a scenario's LangGraph graph: ``decide()`` and the inline runner.

(GraphEnv, the bridge that turns each ``decide()`` into a PettingZoo step, lands here next.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from langgraph.config import get_config

from scenarios.base import Outcome, Scenario

BRIDGE_KEY = "__marl_bridge__"

Policy = Callable[[str, Any], Any]


def decide(agent: str, observation: Any) -> Any:
    """Ask the environment for ``agent``'s action on ``observation``; call it inside a node.

    ``agent`` is the node's agent id; for a ``Send`` fan-out target with ``max_instances > 1``
    pass the node name and the bridge assigns ``<node>_<i>`` in order of the calls in a superstep.

    Raises:
        RuntimeError: when called outside a graph run by :class:`GraphEnv` or :func:`run_inline`.
    """
    try:
        bridge = get_config()["configurable"][BRIDGE_KEY]
    except (RuntimeError, KeyError) as exc:
        raise RuntimeError(
            f"decide({agent!r}, ...) was called outside a marl-orchestra run: execute the graph "
            "with scenarios.GraphEnv or scenarios.engine.run_inline"
        ) from exc
    return bridge.decide(agent, observation)


def emit_reward(value: float, agents: list[str] | None = None) -> None:
    """Give a reward now (a per-step reward, as in MPE): to ``agents``, or to the team when None.

    An episode's team return is the sum of emitted team rewards plus ``Outcome.reward``.
    """
    try:
        bridge = get_config()["configurable"][BRIDGE_KEY]
    except (RuntimeError, KeyError) as exc:
        raise RuntimeError("emit_reward() was called outside a marl-orchestra run") from exc
    bridge.emit_reward(float(value), agents)


class InlineBridge:
    """Answers ``decide()`` by calling a policy directly (no environment in between)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.decisions = 0
        self.team_reward = 0.0

    def emit_reward(self, value: float, agents: list[str] | None = None) -> None:
        if agents is None:
            self.team_reward += value

    def decide(self, agent: str, observation: Any) -> Any:
        self.decisions += 1
        return self.policy(agent, observation)


def run_inline(
    scenario: Scenario, policy: Policy, seed: int
) -> tuple[dict[str, Any], Outcome, int]:
    """Run one episode with ``policy`` answering every decision inline.

    Returns the final state, the verifier's outcome (``reward`` includes emitted team rewards)
    and the number of decisions.
    (Fan-out instance ids are not expanded here: ``policy`` sees the name given to ``decide``.)
    """
    graph = scenario.build_graph().compile()
    bridge = InlineBridge(policy)
    state = graph.invoke(
        scenario.initial_state(np.random.default_rng(seed)),
        config={"configurable": {BRIDGE_KEY: bridge}, "recursion_limit": scenario.max_supersteps},
    )
    outcome = scenario.score(state)
    outcome.reward += bridge.team_reward
    return state, outcome, bridge.decisions
