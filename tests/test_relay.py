"""Tests of the ``relay`` scenario: the counting protocol, partial views, determinism, errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from scenarios import ScenarioError
from scenarios.decisions import run_inline
from scenarios.graph_env import GraphEnv
from scenarios.registry import build, get
from scenarios.relay import Relay

TOPOLOGIES = ["single", "chain:1", "chain:3", "chain:4", "star:1", "star:3", "tree:2x1", "tree:2x2"]
TARGETS = ["bits", "count"]
SEEDS = range(25)


class Recorder:
    """Wraps a policy and records every (agent, observation, action)."""

    def __init__(self, policy: Callable[[str, Any], Any]) -> None:
        self.policy = policy
        self.seen: list[tuple[str, np.ndarray, Any]] = []

    def __call__(self, agent: str, obs: np.ndarray) -> Any:
        action = self.policy(agent, obs)
        self.seen.append((agent, np.array(obs), action))
        return action


def rewards(relay: Relay, policy: Callable[[str, Any], Any], seeds: range) -> list[float]:
    """Team rewards of one episode per seed (the graph compiled once)."""
    graph = relay.build_graph().compile()
    return [run_inline(relay, policy, seed, graph=graph)[1].reward for seed in seeds]


def random_policy(relay: Relay, seed: int = 0) -> Callable[[str, Any], Any]:
    rng = np.random.default_rng(seed)

    def policy(agent: str, obs: Any) -> Any:
        space = relay.action_space(agent)
        return rng.integers(space.nvec) if hasattr(space, "nvec") else int(rng.integers(space.n))

    return policy


@pytest.mark.parametrize("spec", [*TOPOLOGIES, "tree:3x2"])
@pytest.mark.parametrize("bits", [1, 2])
@pytest.mark.parametrize("target", TARGETS)
def test_optimal_protocol_always_solves(spec: str, bits: int, target: str) -> None:
    relay = Relay(spec, bits=bits, target=target)
    assert relay.oracle_value(np.random.default_rng(0)) == 1.0
    assert rewards(relay, relay.optimal_policy(), SEEDS) == [1.0] * len(SEEDS)
    state, outcome, _ = run_inline(relay, relay.optimal_policy(), 0)
    assert outcome.success and outcome.metrics["relay/error"] == 0.0
    truth = [b for h in relay.holders for b in state["pieces"][h]]
    assert state["answer"] == (truth if target == "bits" else sum(truth))


@pytest.mark.parametrize(
    ("spec", "decisions", "messages", "bits_alphabet", "count_alphabet"),
    [
        ("single", 1, 0, 2, 2),
        ("chain:3", 3, 2, 4, 3),  # agent_1 passes two bits / a count in 0..2
        ("star:3", 4, 3, 2, 2),  # each worker passes its own bit
        ("tree:2x2", 7, 6, 4, 3),  # each lead passes two bits / a count in 0..2
        ("tree:3x2", 13, 12, 8, 4),
    ],
)
def test_wiring(
    spec: str, decisions: int, messages: int, bits_alphabet: int, count_alphabet: int
) -> None:
    assert Relay(spec, target="count").required_alphabet == count_alphabet
    relay = Relay(spec)
    assert relay.required_alphabet == bits_alphabet == relay.alphabet
    _, outcome, n = run_inline(relay, relay.optimal_policy(), 0)
    assert n == decisions
    assert outcome.metrics["relay/messages"] == messages


def test_root_answers_and_holders() -> None:
    relay = Relay("tree:2x2", bits=3, target="count")
    assert relay.answerer == "orchestrator"
    assert set(relay.holders) == {"worker_0_0", "worker_0_1", "worker_1_0", "worker_1_1"}
    assert relay.total_bits == 12
    assert relay.action_space("orchestrator").n == 13
    assert relay.action_space("lead_0").n == relay.alphabet == 7
    bits = Relay("tree:2x2", bits=3)
    assert bits.action_space("orchestrator").nvec.tolist() == [2] * 12
    assert bits.action_space("lead_0").n == bits.alphabet == 64
    chain = Relay("chain:4")
    assert chain.answerer == "agent_3" and chain.holders == chain.possible_agents
    assert chain.covers["agent_2"] == ["agent_2", "agent_1", "agent_0"]


@pytest.mark.parametrize("spec", ["chain:3", "star:3", "tree:2x2"])
@pytest.mark.parametrize("target", TARGETS)
def test_random_policy_scores_lower(spec: str, target: str) -> None:
    relay = Relay(spec, target=target)
    policy = random_policy(relay)
    assert np.mean(rewards(relay, policy, range(100))) < 0.5


@pytest.mark.parametrize("spec", TOPOLOGIES)
def test_deterministic_given_seed(spec: str) -> None:
    relay = Relay(spec, bits=2)
    runs = [run_inline(relay, random_policy(relay, seed=3), 11) for _ in range(2)]
    (s1, o1, d1), (s2, o2, d2) = runs
    assert s1 == s2 and o1 == o2 and d1 == d2
    pieces = {str(run_inline(relay, relay.optimal_policy(), s)[0]["pieces"]) for s in range(10)}
    assert len(pieces) > 1


@pytest.mark.parametrize("spec", TOPOLOGIES)
def test_observations_in_space_and_private(spec: str) -> None:
    """An agent's observation is its own bits and its in-edge messages, nothing else."""
    relay = Relay(spec, bits=2)
    graph = relay.build_graph().compile()
    for seed in range(15):
        rec = Recorder(random_policy(relay, seed))
        state, _, _ = run_inline(relay, rec, seed, graph=graph)
        sent = {(m["src"], m["dst"]): m["symbol"] for m in state["messages"]}
        for agent, obs, _ in rec.seen:
            assert relay.observation_space(agent).contains(obs)
            own = state["pieces"].get(agent, [0, 0])
            assert obs[:2].tolist() == own
            expected = np.zeros(relay.slots * relay.alphabet, np.float32)
            for slot, src in enumerate(relay.senders[agent]):
                if (src, agent) in sent:  # every sender reported before the receiver decided
                    expected[slot * relay.alphabet + sent[(src, agent)]] = 1.0
            assert np.array_equal(obs[2:], expected)


@pytest.mark.parametrize("spec", ["chain:3", "star:3", "tree:2x2"])
def test_observation_independent_of_other_pieces(spec: str) -> None:
    """With fixed messages, an agent's observation is a function of its own piece only."""
    relay = Relay(spec, bits=2)
    views: dict[tuple[str, str], set[bytes]] = {}
    graph = relay.build_graph().compile()
    for seed in range(40):
        rec = Recorder(lambda agent, obs: relay.default_action(agent))
        state, _, _ = run_inline(relay, rec, seed, graph=graph)
        for agent, obs, _ in rec.seen:
            key = (agent, str(state["pieces"].get(agent)))
            views.setdefault(key, set()).add(obs.tobytes())
    assert all(len(v) == 1 for v in views.values())


@pytest.mark.parametrize("target", TARGETS)
def test_partial_credit(target: str) -> None:
    """All-zero answers: ``count`` is off by the number of ones, ``bits`` gets the ones wrong."""
    relay = Relay("star:3", bits=2, target=target, partial_credit=True)
    state, outcome, _ = run_inline(relay, lambda agent, obs: relay.default_action(agent), 5)
    ones = sum(sum(p) for p in state["pieces"].values())
    assert 0 < ones < 6
    assert outcome.reward == pytest.approx(1 - ones / 6)
    assert outcome.success is False
    assert outcome.metrics["relay/error"] == ones
    exact = Relay("star:3", bits=2, target=target)
    assert run_inline(exact, lambda agent, obs: exact.default_action(agent), 5)[1].reward == 0.0


@pytest.mark.parametrize(("target", "required"), [("bits", 4), ("count", 3)])
def test_small_alphabet_has_no_oracle_and_clips(target: str, required: int) -> None:
    relay = Relay("chain:3", alphabet=2, target=target)
    assert relay.required_alphabet == required
    assert relay.oracle_value(np.random.default_rng(0)) is None
    assert 0.0 < np.mean(rewards(relay, relay.optimal_policy(), range(50))) < 1.0


def test_default_action_and_invalid_action() -> None:
    relay = Relay("star:2")
    assert relay.default_action("worker_0") == 0
    assert relay.default_action("orchestrator").tolist() == [0, 0]
    for agent in relay.possible_agents:
        assert relay.action_space(agent).contains(relay.default_action(agent))
    with pytest.raises(ValueError, match=r"agent .worker_[01]. chose 5"):
        run_inline(relay, lambda agent, obs: 5, 0)
    with pytest.raises(ScenarioError, match="unknown agent"):
        relay.action_space("nobody")


def test_registry() -> None:
    assert get("relay") is Relay and get("relay-v0") is Relay
    relay = build("relay", topology="chain:3", bits=2)
    assert isinstance(relay, Relay) and relay.topology.spec == "chain:3"
    assert build("relay").topology.spec == "star:3"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alphabet": 1}, "alphabet"),
        ({"alphabet": 65}, "alphabet"),
        ({"alphabet": 2.5}, "alphabet"),
        ({"alphabet": True}, "alphabet"),
        ({"bits": 0}, "bits"),
        ({"bits": 9}, "bits"),
        ({"bits": "2"}, "bits"),
        ({"partial_credit": 1}, "partial_credit"),
        ({"target": "parity"}, "target"),
        ({"topology": "mesh:3"}, "single, chain:N, star:N, tree:BxD"),
        ({"topology": "ring:3"}, "relay runs on"),
        ({"topology": "chain:0"}, "relay runs on"),
    ],
)
def test_argument_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        Relay(**kwargs)


@pytest.mark.parametrize("spec", ["single", "chain:3", "star:3", "tree:2x2"])
@pytest.mark.parametrize("target", TARGETS)
def test_pettingzoo_parallel_api(spec: str, target: str) -> None:
    from pettingzoo.test import parallel_api_test, parallel_seed_test

    parallel_api_test(GraphEnv(Relay(spec, target=target)), num_cycles=40)
    parallel_seed_test(lambda: GraphEnv(Relay(spec, target=target)), num_cycles=20)


def test_graph_env_optimal_episode() -> None:
    relay = Relay("star:3")
    env = GraphEnv(relay)
    policy = relay.optimal_policy()
    obs, infos = env.reset(seed=4)
    assert sorted(obs) == ["worker_0", "worker_1", "worker_2"]
    rewards: dict[str, float] = {}
    while env.agents:
        acting = {a: policy(a, o) for a, o in obs.items() if infos[a]["acting"]}
        obs, rewards, _, _, infos = env.step({**dict.fromkeys(env.agents, 0), **acting})
    assert env.outcome is not None and env.outcome.reward == 1.0
    assert set(rewards.values()) == {1.0}
