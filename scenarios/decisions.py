"""What agent nodes call — :func:`decide`, :func:`emit_reward` — and the inline runner.

Inside a run, :func:`decide` and :func:`emit_reward` reach the run's bridge: the fast path's
(:data:`scenarios.replay.FAST_BRIDGE`), else the one in LangGraph's run config
(:data:`scenarios.bridge.BRIDGE_KEY`: a :class:`~scenarios.bridge.GraphRun` of
:class:`~scenarios.graph_env.GraphEnv`, or an :class:`InlineBridge`). :func:`run_inline` runs a
graph with a policy answering in place (the baseline the bridge is measured against).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from langgraph.config import get_config

from scenarios.base import Outcome, Scenario
from scenarios.bridge import BRIDGE_KEY, EmittedRewards
from scenarios.counterfactual import Policy
from scenarios.replay import FAST_BRIDGE


def _bridge(what: str) -> Any:
    fast = FAST_BRIDGE.get()
    if fast is not None:
        return fast
    try:
        return get_config()["configurable"][BRIDGE_KEY]
    except (RuntimeError, KeyError) as exc:
        raise RuntimeError(
            f"{what} was called outside a marl-orchestra run: execute the graph with "
            "scenarios.GraphEnv or scenarios.run_inline"
        ) from exc


def decide(agent: str, observation: Any) -> Any:
    """Ask the environment for ``agent``'s action on ``observation``; call it inside a node.

    ``agent`` is the node's name; for a ``Send`` fan-out target with ``max_instances > 1`` the
    environment assigns ``<node>_<i>`` in the order LangGraph scheduled the node's tasks.
    """
    return _bridge(f"decide({agent!r}, ...)").decide(agent, observation)


def emit_reward(value: float, agents: list[str] | None = None) -> None:
    """Give a reward now (a per-step reward, as in MPE): to ``agents``, or to the team when None.

    An episode's team return is the sum of emitted team rewards plus ``Outcome.reward``.
    """
    _bridge("emit_reward()").emit_reward(float(value), agents)


def emit_state(value: Any) -> None:
    """Declare the Dec-POMDP's global state as of now (call it in a node, e.g. after a world
    step): what :meth:`GraphEnv.state <scenarios.graph_env.GraphEnv.state>` returns until the
    next call, for centralised critics. Agents never see it through ``decide()``; declare its
    space as ``Scenario.state_space``.
    """
    _bridge("emit_state()").emit_state(value)


def leave(agents: list[str], truncated: bool = False) -> None:
    """Say that ``agents`` left the episode now (PettingZoo: an agent terminated or truncated
    while others go on); call it in a node.

    From the env step in which the graph hands decisions back, each of them is reported
    terminated (``truncated``: truncated), with its last observation and the rewards it was
    owed, and is never paid or asked again: rewards emitted later (team rewards too) go to the
    agents still in the episode, and a graph that asks a departed agent for a decision raises.
    The episode itself ends when the graph does.
    """
    _bridge("leave()").leave(list(agents), truncated)


class InlineBridge(EmittedRewards):
    """Answers ``decide()`` by calling a policy directly (no environment in between); keeps
    the rewards emitted meanwhile (``team_reward``, ``agent_rewards``) and counts decisions."""

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.policy = policy
        self.decisions = 0

    def decide(self, agent: str, observation: Any) -> Any:
        self.decisions += 1
        return self.policy(agent, observation)


def run_inline(
    scenario: Scenario,
    policy: Policy,
    seed: int,
    graph: Any = None,
    *,
    bridge: InlineBridge | None = None,
) -> tuple[dict[str, Any], Outcome, int]:
    """Run one episode with ``policy`` answering every decision inline.

    Returns the final state, the verifier's outcome (``reward`` includes emitted team rewards,
    as ``GraphEnv``'s outcome does) and the number of decisions. ``graph`` is a compiled graph
    to reuse across episodes. ``bridge`` (default: ``InlineBridge(policy)``) answers the
    decisions; pass one to read the per-agent totals of rewards emitted to agents by name
    (``bridge.agent_rewards``; an agent's return is the outcome's reward plus its own).
    (Fan-out instance ids are not expanded here: ``policy`` sees the name given to ``decide``.)
    """
    graph = graph if graph is not None else scenario.build_graph().compile()
    bridge = bridge if bridge is not None else InlineBridge(policy)
    state = graph.invoke(
        scenario.initial_state(np.random.default_rng(seed)),
        config={
            "configurable": {BRIDGE_KEY: bridge},
            "recursion_limit": scenario.max_supersteps + 1,
        },
    )
    outcome = scenario.score(state)
    outcome.reward += bridge.team_reward
    return state, outcome, bridge.decisions


__all__ = ["InlineBridge", "decide", "emit_reward", "emit_state", "leave", "run_inline"]
