"""Coalition values of one finished episode, by counterfactual replays shared through a trie.

:class:`EpisodeReplays` answers ``v(S)`` for coalitions ``S`` of an episode's players. Which
action each decision of a replay gets is :class:`scenarios.counterfactual.Counterfactual`'s
rule; :meth:`scenarios.graph_env.GraphEnv.replay` runs it. Replays are deterministic, so two
coalitions that feed the same action at every decision asked share one trajectory: every
replay's decisions go into a trie (node = the ``(agent, k)`` asked, edge = the action fed,
leaf = the value) and a coalition whose actions follow a known path is answered without
replaying. A replay that leaves a known path's decisions raises (the scenario is not
deterministic given the seed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from scenarios.bridge import SkipNode
from scenarios.counterfactual import Counterfactual
from trainers.credit.settings import CreditError

if TYPE_CHECKING:
    from scenarios.base import AbsentPolicy
    from scenarios.graph_env import GraphEnv

__all__ = ["EpisodeReplays"]

#: the trie key of a skipped decision
_SKIP_KEY = ("skip",)


class _Node:
    """A trie node: the decision asked at this point of a replay, or the value at its end."""

    __slots__ = ("children", "decision", "value")

    def __init__(self, decision: tuple[str, int] | None) -> None:
        self.decision = decision
        self.children: dict[Any, _Node] = {}
        self.value: float | None = None


class EpisodeReplays:
    """``v(S)`` of one finished episode: from the trie when a known path covers ``S``, else one
    replay (whose decisions join the trie).

    Args:
        env: the environment whose scenario replays the episode.
        seed: the episode's seed (``infos[agent]["seed"]``).
        actions: each player's actions in the episode, in order.
        absent: absent policy (default: the scenario's).

    Attributes:
        players: the agents with recorded actions; only they are ever present.
        replays: replays actually run.
        lookups: coalitions asked for (hits and replays).

    Raises:
        CreditError: a coalition with an agent that did not act in the episode.
        RuntimeError: a replay that does not follow the decisions of an earlier one.
    """

    def __init__(
        self,
        env: GraphEnv,
        seed: int,
        actions: Mapping[str, Sequence[Any]],
        absent: AbsentPolicy | None = None,
    ) -> None:
        self.env = env
        self.seed = int(seed)
        self.counterfactual = Counterfactual(env.scenario, actions, absent)
        self.players = frozenset(actions)
        self._root: _Node | None = None
        self._keys: dict[tuple[str, int, bool], Any] = {}
        self.replays = 0
        self.lookups = 0

    def key(self, agent: str, k: int, present: bool) -> Any:
        """The trie key of the action fed at ``agent``'s ``k``-th decision, present or absent."""
        cache_key = (agent, k, present)
        key = self._keys.get(cache_key)
        if key is None:
            action = self.counterfactual.action(agent, k, present)
            key = self._keys[cache_key] = _SKIP_KEY if action is SkipNode else _action_key(action)
        return key

    def __call__(self, coalition: Iterable[str]) -> float:
        """``v(coalition)``."""
        members = coalition if isinstance(coalition, frozenset) else frozenset(coalition)
        strangers = members - self.players
        if strangers:
            raise CreditError(
                f"agents {sorted(strangers)} did not act in episode seed={self.seed}: "
                f"coalitions are subsets of its players {sorted(self.players)}"
            )
        self.lookups += 1
        node = self._root
        while node is not None:
            if node.decision is None:
                assert node.value is not None
                return node.value
            agent, k = node.decision
            node = node.children.get(self.key(agent, k, agent in members))
        return self._replay(members)

    def _replay(self, members: frozenset[str]) -> float:
        policy = self.counterfactual.coalition(members)
        value = float(self.env.replay(self.seed, policy).reward)
        self.replays += 1
        self._insert(policy.decisions, value, members)
        return value

    def _insert(self, decisions: list[tuple[str, int]], value: float, members: frozenset) -> None:
        if self._root is None:
            self._root = _Node(decisions[0] if decisions else None)
        node = self._root
        for j, (agent, k) in enumerate(decisions):
            if node.decision != (agent, k):
                raise RuntimeError(
                    f"replays of episode seed={self.seed} are not deterministic: with "
                    f"coalition {sorted(members)} decision {j} asked {agent!r} (its decision "
                    f"{k}) where an earlier replay with the same actions so far asked "
                    f"{node.decision}; a scenario must draw all randomness from the seed"
                )
            key = self.key(agent, k, agent in members)
            child = node.children.get(key)
            if child is None:
                nxt = decisions[j + 1] if j + 1 < len(decisions) else None
                child = node.children[key] = _Node(nxt)
            node = child
        if node.decision is not None:
            raise RuntimeError(
                f"replays of episode seed={self.seed} are not deterministic: coalition "
                f"{sorted(members)} ended where an earlier replay asked {node.decision}"
            )
        node.value = value


def _action_key(x: Any) -> Any:
    """A hashable key equal for actions that a scenario cannot tell apart."""
    if isinstance(x, np.ndarray):
        kind = "i" if x.dtype.kind in "biu" else x.dtype.kind
        return ("nd", kind, x.shape, tuple(x.ravel().tolist()))
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, list | tuple):
        return (type(x).__name__, tuple(_action_key(y) for y in x))
    if isinstance(x, dict):
        return ("dict", tuple(sorted((str(k), _action_key(v)) for k, v in x.items())))
    try:
        hash(x)
    except TypeError:
        return ("repr", repr(x))
    return (type(x).__name__, x)
