"""Counterfactual decisions: the action each decision of a replay gets, given a coalition.

A replay runs an episode's graph again with the same seed. At each decision an agent of the
coalition *present* acts as it did: its ``k``-th decision replays its ``k``-th recorded action
as the env executed it (:func:`scenarios.args.executed_action`; past the recorded ones, the
scenario's default action), or asks a policy when one is given instead of recordings. Any
other agent is *absent* and acts under the absent policy: ``skip`` (:data:`SkipNode`: its node
writes nothing), ``placeholder`` or ``default``. This is the one place that rule is written:
``GraphEnv.value`` and the credit connector's replay trie both use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from scenarios.args import executed_action
from scenarios.base import AbsentPolicy, Scenario
from scenarios.bridge import SkipNode

__all__ = ["CoalitionPolicy", "Counterfactual", "Policy"]

Policy = Callable[[str, Any], Any]


class Counterfactual:
    """One episode's recorded actions (or a policy) and the absent policy of its replays.

    Args:
        scenario: the scenario replayed.
        actions: each agent's actions in the episode, in order, or a policy
            ``(agent, observation) -> action`` for present agents.
        absent: the absent policy (default: the scenario's).
    """

    def __init__(
        self,
        scenario: Scenario,
        actions: Mapping[str, Sequence[Any]] | Policy,
        absent: AbsentPolicy | None = None,
    ) -> None:
        self.scenario = scenario
        self.absent: AbsentPolicy = absent or scenario.absent
        self._policy: Policy | None = actions if callable(actions) else None
        self._recorded: Mapping[str, Sequence[Any]] = {} if callable(actions) else actions
        self._fed: dict[tuple[str, int, bool], Any] = {}

    def action(self, agent: str, k: int, present: bool, observation: Any = None) -> Any:
        """The action fed at ``agent``'s ``k``-th decision (from 0), present or absent.

        With recorded actions the answer depends only on the arguments and is memoised (the
        same object is fed again: a node must not change its action in place).
        """
        if present and self._policy is not None:
            return self._policy(agent, observation)
        key = (agent, k, present)
        if key not in self._fed:
            self._fed[key] = self._choose(agent, k, present)
        return self._fed[key]

    def _choose(self, agent: str, k: int, present: bool) -> Any:
        if not present:
            if self.absent == "skip":
                return SkipNode
            if self.absent == "placeholder":
                return self.scenario.placeholder_action(agent)
            return self.scenario.default_action(agent)
        seq = self._recorded.get(agent, ())
        if k >= len(seq):
            return self.scenario.default_action(agent)
        return executed_action(self.scenario, agent, seq[k])[0]

    def coalition(self, members: Iterable[str]) -> CoalitionPolicy:
        """The policy of one replay in which exactly ``members`` are present."""
        return CoalitionPolicy(self, frozenset(members))


class CoalitionPolicy:
    """The policy ``(agent, observation) -> action`` of one replay (see :class:`Counterfactual`).

    Attributes:
        members: the agents present.
        absent: the absent policy (``GraphEnv`` runs the graph whose agent nodes may skip under
            ``"skip"``).
        decisions: ``(agent, k)`` of every decision asked so far, in order.
    """

    __slots__ = ("_counts", "absent", "counterfactual", "decisions", "members")

    def __init__(self, counterfactual: Counterfactual, members: frozenset[str]) -> None:
        self.counterfactual = counterfactual
        self.members = members
        self.absent = counterfactual.absent
        self.decisions: list[tuple[str, int]] = []
        self._counts: dict[str, int] = {}

    def __call__(self, agent: str, observation: Any) -> Any:
        k = self._counts.get(agent, 0)
        self._counts[agent] = k + 1
        self.decisions.append((agent, k))
        return self.counterfactual.action(agent, k, agent in self.members, observation)
