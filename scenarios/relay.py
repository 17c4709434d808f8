"""``relay``: hidden information spread over a team, passed on as discrete messages.

Every *holder* agent sees a private piece of the hidden state: ``bits`` random bits. Agents send
one symbol from a ``Discrete(alphabet)`` to the agent on their out-edge; the *answerer* reports
a function of all hidden bits that needs every piece (``target``):

* ``"bits"`` (default): every holder's bits, ``MultiDiscrete([2] * total_bits)`` in the order
  of ``holders``. Each informative sender raises the success rate (1/8 → 1/4 → 1/2 → 1 on
  ``star:3``), so small MLPs learn it (a quick check: independent PPO-style MLPs solved
  ``star:3`` within ~2000 episodes on 2 of 3 seeds; ``chain:3``, where ``agent_1`` must relay
  two bits, reached 0.6–0.75 by 6000). The alphabet grows as ``2 ** covered bits``.
* ``"count"``: the number of ones, ``Discrete(total_bits + 1)``. Partial counts compose, so the
  alphabet grows linearly, but learning is harder: knowing one or two of three bits gives the
  same exact-answer rate (1/2), and the same learners stalled on that plateau.

A uniform protocol is optimal for both: a sender packs its own bits with what it received
(``bits``: concatenated, as a little-endian code; ``count``: summed) and the answerer unpacks.

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
Actions: senders ``Discrete(alphabet)``; the answerer as given by ``target``.

Reward: 1 for an exact answer, else 0; with ``partial_credit=True`` it is ``1 - error /
total_bits`` (``error``: wrong bits, or ``|answer - count|``). ``success`` is always the exact
answer. Metrics: ``relay/error`` and ``relay/messages``. The alphabet *suffices* when it carries
the largest message any sender must pass on (``required_alphabet``, the default alphabet).
Absent agents (counterfactual replays) send symbol 0 / answer zeros (``absent="default"``).
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import gymnasium as gym
import numpy as np
from langgraph.graph import StateGraph

from scenarios.args import checked_action, int_arg, zero_action
from scenarios.base import Outcome, Scenario, ScenarioError, ScriptedPolicy
from scenarios.counterfactual import Policy
from scenarios.decisions import decide
from scenarios.declared import DeclaredSpaces, accept_topology
from scenarios.registry import register
from topologies import Topology
from topologies.generators import merge_routes

ACCEPTED = "single, chain:N, star:N, tree:BxD"
TARGETS = ("bits", "count")
MAX_BITS = 8
MAX_ALPHABET = 64


class RelayState(TypedDict, total=False):
    """Graph state: the hidden pieces (holder → bits), messages sent, routes and the answer."""

    pieces: dict[str, list[int]]
    messages: Annotated[list[dict[str, Any]], operator.add]
    route: Annotated[dict[str, list[str]], merge_routes]
    answer: int | list[int] | None


@register
class Relay(DeclaredSpaces, Scenario):
    """Report hidden bits spread over the team, talking only along the topology's edges.

    Args:
        topology: ``"single"``, ``"chain:N"``, ``"star:N"`` (default ``"star:3"``),
            ``"tree:BxD"`` or a :class:`Topology` of one of those kinds.
        alphabet: message symbols, in [2, 64]; ``None`` picks ``required_alphabet`` (capped at 64).
        bits: hidden bits per holder, in [1, 8].
        target: ``"bits"`` (report every hidden bit) or ``"count"`` (report the number of ones).
        partial_credit: reward ``1 - error / total_bits`` instead of exact-or-nothing.

    Raises:
        ScenarioError: a bad argument value or an unsupported topology.

    Example:
        >>> from scenarios.decisions import run_inline
        >>> relay = Relay("chain:3")
        >>> _, outcome, decisions = run_inline(relay, relay.optimal_policy(), seed=0)
        >>> outcome.reward, decisions
        (1.0, 3)
    """

    name = "relay"
    version = 0
    summary = "hidden bits spread over the team; messages along edges; the root reports them"
    topologies = ("single", "chain", "star", "tree")
    default_topology = "star:3"
    has_oracle = True
    scripted_policies = (
        ScriptedPolicy(
            "optimal",
            lambda s: s.optimal_policy(),
            "relay: the counting protocol (optimal when the alphabet suffices)",
        ),
    )

    def __init__(
        self,
        topology: str | Topology = "star:3",
        *,
        alphabet: int | None = None,
        bits: int = 1,
        target: str = "bits",
        partial_credit: bool = False,
    ) -> None:
        self.topology = accept_topology("relay", topology, self.topologies, ACCEPTED)
        self.bits = int_arg("bits", bits, 1, MAX_BITS)
        if target not in TARGETS:
            raise ScenarioError(f"target={target!r}: use one of {', '.join(TARGETS)}")
        self.target = target
        if not isinstance(partial_credit, bool):
            raise ScenarioError(f"partial_credit={partial_credit!r}: give True or False")
        self.partial_credit = partial_credit
        self._wire()
        self.total_bits = self.bits * len(self.holders)
        if alphabet is None:
            alphabet = min(self.required_alphabet, MAX_ALPHABET)
        self.alphabet = int_arg("alphabet", alphabet, 2, MAX_ALPHABET)
        self.slots = max(len(s) for s in self.senders.values())
        size = self.bits + self.slots * self.alphabet
        obs_space = gym.spaces.Box(0.0, 1.0, (size,), np.float32)
        answer: gym.Space = (
            gym.spaces.MultiDiscrete([2] * self.total_bits)
            if target == "bits"
            else gym.spaces.Discrete(self.total_bits + 1)
        )
        self.agent_spaces = {
            a: (obs_space, answer if a == self.answerer else gym.spaces.Discrete(self.alphabet))
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
        #: node → the holders whose bits reach it: itself first, then its senders' in order.
        self.covers: dict[str, list[str]] = {}

        def cover(n: str) -> list[str]:
            if n not in self.covers:
                own = [n] if n in self.holders else []
                self.covers[n] = own + [h for s in self.senders[n] for h in cover(s)]
            return self.covers[n]

        for n in t.agents:
            cover(n)
        sizes = [self.bits * len(self.covers[n]) for n in self.receiver]
        #: smallest alphabet that carries every message a sender must pass on.
        self.required_alphabet = max(
            [2**k if self.target == "bits" else k + 1 for k in sizes] or [2]
        )

    # ----- the Dec-POMDP -------------------------------------------------------------------
    def default_action(self, agent: str) -> Any:
        """Symbol 0 for a sender; all-zero bits or a count of 0 for the answerer."""
        return zero_action(self.action_space(agent))

    def observe(self, agent: str, state: dict[str, Any]) -> np.ndarray:
        """``agent``'s view: its own bits and the symbols received on its in-edges."""
        obs = np.zeros(self.observation_space(agent).shape, np.float32)
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
        space = self.action_space(node)

        def act(state: dict[str, Any]) -> dict[str, Any]:
            heard = {m["src"] for m in state.get("messages", []) if m["dst"] == node}
            if children and not heard.issuperset(children):  # first visit: fan out
                return {"route": {node: list(children)}}
            action = checked_action(space, decide(node, self.observe(node, state)), node).tolist()
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
        """Exact answer → 1 (or partial credit); metrics ``relay/error``, ``relay/messages``."""
        truth = [b for h in self.holders for b in state["pieces"][h]]
        answer = state.get("answer")
        if answer is None:
            error = self.total_bits
        elif self.target == "bits":
            error = sum(a != b for a, b in zip(answer, truth, strict=True))
        else:
            error = abs(answer - sum(truth))
        if self.partial_credit:
            reward = max(0.0, 1.0 - error / self.total_bits)
        else:
            reward = float(error == 0)
        metrics = {
            "relay/error": float(error),
            "relay/messages": float(len(state.get("messages", []))),
        }
        return Outcome(reward=reward, success=error == 0, metrics=metrics)

    def message_layout(self, agent: str) -> tuple[int, int]:
        """Own ``bits``, then ``slots`` one-hot message slots (see the module doc)."""
        return self.bits, self.slots

    def oracle_value(self, rng: np.random.Generator) -> float | None:
        """1.0 when the alphabet suffices (the scripted protocol is exact); unknown otherwise."""
        return 1.0 if self.alphabet >= self.required_alphabet else None

    # ----- the scripted protocol -----------------------------------------------------------
    def optimal_policy(self) -> Policy:
        """The packing protocol as a policy ``(agent, obs) -> action`` (state read only from obs).

        A sender packs its own bits with the messages it received — concatenated into a
        little-endian code for ``target="bits"``, summed for ``"count"`` — and sends the result
        (clipped to the alphabet); the answerer unpacks it. Optimal when the alphabet suffices.
        """
        bits, slots, alphabet = self.bits, self.slots, self.alphabet

        def unpack(code: int, n: int) -> list[int]:
            return [(code >> j) & 1 for j in range(n)]

        def policy(agent: str, obs: Any) -> Any:
            obs = np.asarray(obs)
            own = [int(b) for b in obs[:bits]] if agent in self.holders else []
            inbox = obs[bits:].reshape(slots, alphabet)
            symbols = [int(row.argmax()) for row in inbox[: len(self.senders[agent])]]
            if self.target == "count":
                return min(sum(own) + sum(symbols), self.action_space(agent).n - 1)
            flat = own + [
                b for s, c in zip(self.senders[agent], symbols, strict=True)
                for b in unpack(c, bits * len(self.covers[s]))
            ]  # fmt: skip
            if agent != self.answerer:
                return min(sum(b << j for j, b in enumerate(flat)), alphabet - 1)
            order = {h: i for i, h in enumerate(self.covers[agent])}
            return np.array([flat[order[h] * bits + j] for h in self.holders for j in range(bits)])

        return policy
