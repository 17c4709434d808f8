"""``relay``: hidden information spread over a team, passed on as discrete messages.

Every *holder* agent sees a private piece of the hidden state: ``bits`` random bits. Agents send
one symbol from a ``Discrete(alphabet)`` to the agent on their out-edge; the *answerer* reports
the **number of ones among all hidden bits**, which needs every piece. Counting composes along
any tree (a message can carry a partial count), so one uniform protocol is optimal everywhere
and small MLPs learn it quickly: a sender adds its own ones to the counts it received.

Topologies (the named skeletons run unchanged):

* ``single``: the one agent holds ``bits`` bits and answers (no messages).
* ``chain:N``: every agent holds a piece; ``agent_i`` sends to ``agent_{i+1}``; the last answers.
* ``star:N``: the orchestrator fans out to all workers in parallel (a scripted route, not a
  decision); each worker holds a piece and sends one symbol back; the orchestrator answers.
* ``tree:BxD``: leaves (``worker_*``) hold pieces and report to their lead; a lead, once all its
  children reported, sends one symbol to its parent; the root orchestrator answers.

Observation (every agent, ``Box(0, 1, (bits + slots * alphabet,), float32)``): the agent's own
bits (zeros when it holds none), then one one-hot slot per in-edge sender (``slots`` = the
largest in-degree; a slot stays zero until its message arrives, unused slots are padding).
Actions: senders ``Discrete(alphabet)``; the answerer ``Discrete(total_bits + 1)``.

Reward: 1 when the answer equals the count, else 0; with ``partial_credit=True`` it is
``max(0, 1 - |answer - count| / total_bits)``. ``success`` is always the exact answer. Metrics:
``relay/abs_error`` and ``relay/messages``. The alphabet *suffices* when it can carry the largest
partial count any sender must pass on (``required_alphabet``); the default alphabet is that size.
Absent agents (counterfactual replays) send symbol 0 / answer 0 (``absent="default"``).
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import gymnasium as gym
import numpy as np
from langgraph.graph import StateGraph

from scenarios.base import Outcome, Scenario, ScenarioError
from scenarios.engine import Policy, decide
from scenarios.registry import register
from topologies import Topology, TopologyError
from topologies.generators import merge_routes

ACCEPTED = "single, chain:N, star:N, tree:BxD"
MAX_BITS = 8
MAX_ALPHABET = 64


class RelayState(TypedDict, total=False):
    """Graph state: the hidden pieces (holder → bits), messages sent, routes and the answer."""

    pieces: dict[str, list[int]]
    messages: Annotated[list[dict[str, Any]], operator.add]
    route: Annotated[dict[str, list[str]], merge_routes]
    answer: int | None


def int_kwarg(name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``, else a :class:`ScenarioError` naming ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or not (low <= value <= high)
    ):
        raise ScenarioError(f"{name}={value!r}: give an integer in [{low}, {high}]")
    return int(value)


def checked_action(space: gym.Space, action: Any, agent: str) -> np.ndarray:
    """``action`` as an int64 array inside ``space``, else a ``ValueError`` naming ``agent``."""
    raw = np.asarray(action)
    arr = raw.astype(np.int64) if raw.dtype.kind in "iuf" else None
    if arr is None or raw.shape != space.shape or not np.array_equal(arr, raw):
        arr = None
    if arr is None or not space.contains(arr):
        raise ValueError(f"agent {agent!r} chose {action!r}: its action space is {space}")
    return arr


@register
class Relay(Scenario):
    """Count the ones among bits spread over the team, talking only along the topology's edges.

    Args:
        topology: ``"single"``, ``"chain:N"``, ``"star:N"`` (default ``"star:3"``),
            ``"tree:BxD"`` or a :class:`Topology` of one of those kinds.
        alphabet: message symbols, in [2, 64]; ``None`` picks ``required_alphabet`` (capped at 64).
        bits: hidden bits per holder, in [1, 8].
        partial_credit: reward ``1 - |error| / total_bits`` instead of exact-or-nothing.

    Raises:
        ScenarioError: a bad argument value or an unsupported topology.

    Example:
        >>> from scenarios.engine import run_inline
        >>> relay = Relay("chain:3")
        >>> _, outcome, decisions = run_inline(relay, relay.optimal_policy(), seed=0)
        >>> outcome.reward, decisions
        (1.0, 3)
    """

    name = "relay"
    version = 0
    summary = "hidden bits spread over the team; messages along edges; the root counts the ones"
    topologies = ("single", "chain", "star", "tree")
    default_topology = "star:3"
    absent = "default"

    def __init__(
        self,
        topology: str | Topology = "star:3",
        *,
        alphabet: int | None = None,
        bits: int = 1,
        partial_credit: bool = False,
    ) -> None:
        try:
            self.topology = Topology.from_spec(topology)
        except TopologyError as exc:
            raise ScenarioError(f"{exc}; relay runs on {ACCEPTED}") from exc
        if self.topology.kind not in self.topologies:
            label = self.topology.spec or self.topology.name
            raise ScenarioError(f"relay runs on {ACCEPTED}, not {label!r}")
        self.bits = int_kwarg("bits", bits, 1, MAX_BITS)
        if not isinstance(partial_credit, bool):
            raise ScenarioError(f"partial_credit={partial_credit!r}: give True or False")
        self.partial_credit = partial_credit
        self._wire()
        self.total_bits = self.bits * len(self.holders)
        if alphabet is None:
            alphabet = min(self.required_alphabet, MAX_ALPHABET)
        self.alphabet = int_kwarg("alphabet", alphabet, 2, MAX_ALPHABET)
        self.slots = max(len(s) for s in self.senders.values())
        size = self.bits + self.slots * self.alphabet
        self._obs_space = gym.spaces.Box(0.0, 1.0, (size,), np.float32)
        self._act_spaces = {
            a: gym.spaces.Discrete(self.total_bits + 1 if a == self.answerer else self.alphabet)
            for a in self.topology.agents
        }
        # one superstep per chain agent, two per tree level and back: the base cap may be short
        self.max_supersteps = max(Scenario.max_supersteps, 2 * len(self.topology.agents) + 4)

    def _wire(self) -> None:
        """Who holds a piece, who messages whom, who answers, and the alphabet that suffices."""
        t = self.topology
        delegation = [(u, v) for u, v, d in t.edges("conditional") if d["label"] == v]
        if delegation:  # star / tree: reports flow up the delegation tree
            #: node → the children it fans out to on its first visit.
            self.children = {n: [v for u, v in delegation if u == n] for n in t.agents}
            self.receiver = {v: u for u, v in delegation}
            self.senders = self.children
        else:  # single / chain: messages flow along the static edges
            self.children = {n: [] for n in t.agents}
            self.receiver = {n: t.children(n)[0] for n in t.agents if t.children(n)}
            self.senders = {n: t.parents(n) for n in t.agents}
        self.holders = [n for n in t.agents if not self.children[n]]
        self.answerer = next(n for n in t.agents if n not in self.receiver)
        covered: dict[str, int] = {}

        def cover(n: str) -> int:
            if n not in covered:
                own = self.bits if n in self.holders else 0
                covered[n] = own + sum(cover(s) for s in self.senders[n])
            return covered[n]

        #: smallest alphabet that carries every partial count a sender must pass on.
        self.required_alphabet = max([cover(n) + 1 for n in self.receiver] or [2])

    # ----- the Dec-POMDP -------------------------------------------------------------------
    @property
    def possible_agents(self) -> list[str]:
        return list(self.topology.agents)

    def observation_space(self, agent: str) -> gym.Space:
        self._known(agent)
        return self._obs_space

    def action_space(self, agent: str) -> gym.Space:
        return self._act_spaces[self._known(agent)]

    def default_action(self, agent: str) -> int:
        """Symbol 0 for a sender, answer 0 for the answerer."""
        self._known(agent)
        return 0

    def _known(self, agent: str) -> str:
        if agent not in self._act_spaces:
            raise ScenarioError(
                f"unknown agent {agent!r}: relay's agents are {self.possible_agents}"
            )
        return agent

    def observe(self, agent: str, state: dict[str, Any]) -> np.ndarray:
        """``agent``'s view: its own bits and the symbols received on its in-edges."""
        obs = np.zeros(self._obs_space.shape, np.float32)
        obs[: self.bits] = state["pieces"].get(agent, 0)
        inbox = {m["src"]: m["symbol"] for m in state.get("messages", []) if m["dst"] == agent}
        for slot, src in enumerate(self.senders[agent]):
            if src in inbox:
                obs[self.bits + slot * self.alphabet + inbox[src]] = 1.0
        return obs

    def build_graph(self) -> StateGraph:
        return self.topology.to_langgraph(self._node, RelayState)

    def _node(self, node: str) -> Any:
        children = self.children[node]
        space = self._act_spaces[node]

        def act(state: dict[str, Any]) -> dict[str, Any]:
            heard = {m["src"] for m in state.get("messages", []) if m["dst"] == node}
            if children and not heard.issuperset(children):  # first visit: fan out
                return {"route": {node: list(children)}}
            action = int(checked_action(space, decide(node, self.observe(node, state)), node))
            if node == self.answerer:
                return {"answer": action, "route": {node: []}}
            dst = self.receiver[node]
            return {
                "messages": [{"src": node, "dst": dst, "symbol": action}],
                "route": {node: [dst]},
            }

        act.__name__ = f"relay_{node}"
        return act

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        pieces = {h: [int(b) for b in rng.integers(0, 2, size=self.bits)] for h in self.holders}
        return {"pieces": pieces, "messages": [], "route": {}, "answer": None}

    def score(self, state: dict[str, Any]) -> Outcome:
        """Exact count → 1 (or partial credit); metrics ``relay/abs_error``, ``relay/messages``."""
        truth = sum(sum(p) for p in state["pieces"].values())
        answer = state.get("answer")
        error = self.total_bits if answer is None else abs(int(answer) - truth)
        if self.partial_credit:
            reward = max(0.0, 1.0 - error / self.total_bits)
        else:
            reward = float(error == 0)
        metrics = {
            "relay/abs_error": float(error),
            "relay/messages": float(len(state.get("messages", []))),
        }
        return Outcome(reward=reward, success=error == 0, metrics=metrics)

    def oracle_value(self, rng: np.random.Generator) -> float | None:
        """1.0 when the alphabet suffices (the counting protocol is exact); unknown otherwise."""
        return 1.0 if self.alphabet >= self.required_alphabet else None

    # ----- the scripted protocol -----------------------------------------------------------
    def optimal_policy(self) -> Policy:
        """The counting protocol as a policy ``(agent, obs) -> action`` (reads only ``obs``).

        Each agent adds its own ones to the counts it received and sends the sum (clipped to
        the alphabet); the answerer reports it. Optimal (reward 1) when the alphabet suffices.
        """
        bits, slots, alphabet = self.bits, self.slots, self.alphabet

        def policy(agent: str, obs: Any) -> int:
            obs = np.asarray(obs)
            inbox = obs[bits:].reshape(slots, alphabet)
            count = int(obs[:bits].sum()) + sum(int(row.argmax()) for row in inbox if row.any())
            return min(count, self._act_spaces[agent].n - 1)

        return policy
