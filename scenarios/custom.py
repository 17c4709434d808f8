"""A user's own LangGraph graph as a scenario, without writing a Scenario subclass."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from scenarios.base import AbsentPolicy, Outcome, Scenario, ScenarioError
from topologies import Topology

SpaceSpec = gym.Space | Mapping[str, gym.Space] | Callable[[str], gym.Space]


class GraphScenario(Scenario):
    """Wrap a ``StateGraph`` (or compiled graph) whose agent nodes call ``decide()``.

    Args:
        graph: the user's builder or compiled graph; its topology comes from
            :meth:`Topology.from_langgraph` (node metadata marks roles, pools, tools).
        observation_space: one space for every agent, a dict agent id → space, or a function.
        action_space: likewise.
        score: final state → :class:`Outcome` or a float reward.
        initial_state: ``rng → input dict``, or a fixed input dict.
        absent: what an agent left out of a counterfactual coalition does.
        max_supersteps: LangGraph recursion limit of an episode.
        node_metadata: node name → metadata merged over the graph's own, for an app whose
            ``add_node`` calls you cannot edit (e.g. ``{"tools": {"agent": False}}`` for the
            tool node of ``create_react_agent``).

    Example:
        >>> env = GraphEnv(GraphScenario(builder, observation_space=Box(0, 1, (4,)),
        ...                              action_space=Discrete(3), score=my_verifier,
        ...                              initial_state=lambda rng: {"task": rng.integers(9)}))
        ... # doctest: +SKIP
    """

    name = "graph"
    topologies = ("graph",)

    def __init__(
        self,
        graph: Any,
        *,
        observation_space: SpaceSpec,
        action_space: SpaceSpec,
        score: Callable[[dict[str, Any]], Outcome | float],
        initial_state: Callable[[np.random.Generator], dict[str, Any]] | dict[str, Any],
        absent: AbsentPolicy = "default",
        max_supersteps: int = 64,
        node_metadata: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.builder = _with_metadata(getattr(graph, "builder", graph), node_metadata or {})
        self.topology = Topology.from_langgraph(self.builder)
        self._obs = {
            a: _space(observation_space, a, "observation_space") for a in self.possible_agents
        }
        self._act = {a: _space(action_space, a, "action_space") for a in self.possible_agents}
        self._score = score
        self._init = initial_state
        self.absent = absent
        self.max_supersteps = max_supersteps

    @property
    def possible_agents(self) -> list[str]:
        return self.topology.agent_ids

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._act[agent]

    def build_graph(self) -> Any:
        return self.builder

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        return self._init(rng) if callable(self._init) else dict(self._init)

    def score(self, state: dict[str, Any]) -> Outcome:
        out = self._score(state)
        return out if isinstance(out, Outcome) else Outcome(reward=float(out))


def _with_metadata(builder: Any, extra: Mapping[str, Mapping[str, Any]]) -> Any:
    """A shallow copy of ``builder`` whose nodes carry ``extra`` metadata (the user's is kept)."""
    if not extra:
        return builder
    unknown = sorted(set(extra) - set(builder.nodes))
    if unknown:
        raise ScenarioError(
            f"node_metadata names {unknown}, which the graph does not have: its nodes are "
            f"{sorted(builder.nodes)}"
        )
    copied = copy.copy(builder)
    copied.nodes = {
        name: dataclasses.replace(spec, metadata={**(spec.metadata or {}), **extra[name]})
        if name in extra
        else spec
        for name, spec in builder.nodes.items()
    }
    return copied


def _space(spec: SpaceSpec, agent: str, what: str) -> gym.Space:
    if isinstance(spec, gym.Space):
        return spec
    if isinstance(spec, Mapping):
        if agent not in spec:
            raise ScenarioError(f"{what} has no entry for agent {agent!r}: add one")
        return spec[agent]
    if callable(spec):
        return spec(agent)
    raise ScenarioError(f"{what} must be a gym.Space, a dict of spaces or a function of the agent")
