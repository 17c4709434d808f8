"""What a built-in scenario declares: the topologies it runs on and its agents' spaces.

:func:`accept_topology` turns a spec or :class:`~topologies.Topology` into the topology a
scenario runs on, or raises :class:`~scenarios.base.ScenarioError` naming the scenario, the
value and what it accepts. :class:`DeclaredSpaces` implements ``possible_agents``,
``observation_space`` and ``action_space`` from ``agent_spaces`` (agent → (observation space,
action space), in agent order), set in ``__init__``; an unknown agent is a ``ScenarioError``
naming the known ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import gymnasium as gym

from scenarios.base import ScenarioError
from topologies import Topology, TopologyError


def accept_topology(
    scenario: str,
    topology: str | Topology,
    kinds: Iterable[str],
    accepted: str,
    fix: str = "",
    *,
    named: bool = False,
) -> Topology:
    """``topology`` as a :class:`Topology` of one of ``kinds`` (``named``: from a spec string).

    Args:
        scenario: the scenario's name, for the error.
        accepted: what it accepts, in words (``"single, chain:N"``).
        fix: how to fix a bad value, appended to the error.
    """
    hint = f": {fix}" if fix else ""
    try:
        topo = Topology.from_spec(topology)
    except TopologyError as exc:
        raise ScenarioError(f"{exc}; {scenario} runs on {accepted}{hint}") from exc
    if topo.kind not in tuple(kinds) or (named and topo.spec is None):
        label = topo.spec or topo.name
        raise ScenarioError(f"{scenario} runs on {accepted}, not {label!r}{hint}")
    return topo


class DeclaredSpaces:
    """Mixin (before :class:`~scenarios.base.Scenario`) for agents and spaces fixed at build."""

    name: ClassVar[str]
    #: said after the list of known agents when an unknown one is asked for
    agents_note: ClassVar[str] = ""
    agent_spaces: dict[str, tuple[gym.Space, gym.Space]]

    @property
    def possible_agents(self) -> list[str]:
        return list(self.agent_spaces)

    def observation_space(self, agent: str) -> gym.Space:
        return self.agent_spaces[self._known(agent)][0]

    def action_space(self, agent: str) -> gym.Space:
        return self.agent_spaces[self._known(agent)][1]

    def _known(self, agent: str) -> str:
        if agent not in self.agent_spaces:
            raise ScenarioError(
                f"unknown agent {agent!r}: {self.name}'s agents are "
                f"{self.possible_agents}{self.agents_note}"
            )
        return agent
