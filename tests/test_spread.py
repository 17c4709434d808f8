"""Tests of the ``spread`` scenario: faithfulness to mpe2, determinism, topologies, errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpe2 import simple_spread_v3

from scenarios import ScenarioError, decisions
from scenarios.decisions import run_inline
from scenarios.registry import build, list_scenarios
from scenarios.spread import WORLD, Spread, env_seed
from topologies import Topology


class RecordingBridge(decisions.InlineBridge):
    """The inline bridge, also recording every ``emit_reward`` call."""

    def __init__(self, policy: Any) -> None:
        super().__init__(policy)
        self.emitted: list[tuple[float, list[str] | None]] = []

    def emit_reward(self, value: float, agents: list[str] | None = None) -> None:
        self.emitted.append((value, agents))
        super().emit_reward(value, agents)


@pytest.fixture
def bridges(monkeypatch: pytest.MonkeyPatch) -> list[RecordingBridge]:
    """Make ``run_inline`` use :class:`RecordingBridge`; yields the bridges it created."""
    made: list[RecordingBridge] = []

    def factory(policy: Any) -> RecordingBridge:
        made.append(RecordingBridge(policy))
        return made[-1]

    monkeypatch.setattr(decisions, "InlineBridge", factory)
    return made


class TablePolicy:
    """Plays a fixed random action table and records every observation it is shown."""

    def __init__(self, agents: list[str], cycles: int, seed: int = 7) -> None:
        self.index = {a: i for i, a in enumerate(agents)}
        self.table = np.random.default_rng(seed).integers(0, 5, size=(cycles, len(agents)))
        self.seen: dict[str, list[np.ndarray]] = {a: [] for a in agents}

    def __call__(self, agent: str, obs: np.ndarray) -> int:
        t = len(self.seen[agent])
        self.seen[agent].append(obs)
        return int(self.table[t, self.index[agent]])


CASES = [
    ("mesh:3", {}),
    ("mesh:3", {"local_ratio": 0.0, "max_cycles": 10}),
    ("mesh:4", {"local_ratio": 1.0, "max_cycles": 30}),
    ("single", {}),
    ("star:2", {"local_ratio": 0.25}),
]


@pytest.mark.parametrize(("topology", "kwargs"), CASES)
def test_identical_to_mpe2_parallel_env(
    topology: str, kwargs: dict[str, Any], bridges: list[RecordingBridge]
) -> None:
    scenario = Spread(topology, **kwargs)
    agents = scenario.possible_agents
    cycles, local_ratio = kwargs.get("max_cycles", 25), kwargs.get("local_ratio", 0.5)
    policy = TablePolicy(agents, cycles)
    state, outcome, decisions = run_inline(scenario, policy, seed=11)
    assert decisions == cycles * len(agents)
    assert state["mpe_seed"] == env_seed(np.random.default_rng(11))

    # mpe2 stepped directly, same kwargs, same seed, same actions
    env = simple_spread_v3.parallel_env(
        N=len(agents), max_cycles=cycles, continuous_actions=False, local_ratio=local_ratio
    )
    obs, _ = env.reset(seed=state["mpe_seed"])
    mpe = {a: f"agent_{i}" for i, a in enumerate(agents)}
    per_step: list[list[tuple[float, list[str] | None]]] = []
    for value, to in bridges[0].emitted:  # each world step emits the team reward first
        if to is None:
            per_step.append([])
        per_step[-1].append((value, to))
    assert len(per_step) == cycles
    team_return, per_agent = 0.0, dict.fromkeys(agents, 0.0)
    for t in range(cycles):
        for a in agents:
            seen = policy.seen[a][t]
            assert seen.dtype == np.float32
            assert np.array_equal(seen, obs[mpe[a]])
            assert scenario.observation_space(a).contains(seen)
        obs, rewards, _, truncs, _ = env.step(
            {mpe[a]: int(policy.table[t, i]) for i, a in enumerate(agents)}
        )
        r = {a: float(rewards[mpe[a]]) for a in agents}
        team = sum(r.values()) / len(agents)
        team_return += team
        (team_emitted, to), *own = per_step[t]
        assert (team_emitted, to) == (team, None)
        deviation = {to[0]: value for value, to in own}
        for a in agents:
            # an agent receives team + its own stream = mpe2's reward (to float rounding)
            assert team + deviation.get(a, 0.0) == pytest.approx(r[a], rel=1e-14, abs=1e-14)
            per_agent[a] += r[a]
    assert all(truncs.values()) and not env.agents
    if local_ratio > 0 and outcome.metrics["collisions"] > 0:
        assert any(len(step) > 1 for step in per_step)  # collision deviations were emitted
    assert outcome.reward == team_return  # exact: the same floats summed in the same order
    assert outcome.metrics["return"] == team_return
    assert {a: outcome.metrics[f"{a}/return"] for a in agents} == per_agent
    assert outcome.metrics["steps"] == cycles


def test_team_reward_is_the_agents_reward_without_local_term() -> None:
    _, outcome, _ = run_inline(Spread("mesh:3", local_ratio=0.0), lambda a, o: 1, seed=3)
    returns = {outcome.metrics[f"agent_{i}/return"] for i in range(3)}
    assert len(returns) == 1
    # G = -Σ landmarks nearest distance, so the team return is minus the summed distances
    assert outcome.reward == pytest.approx(-outcome.metrics["min_dist"] * 25)


def test_team_reward_mode_emits_the_mean_only(bridges: list[RecordingBridge]) -> None:
    _, outcome, _ = run_inline(Spread("mesh:2", max_cycles=5, reward="team"), lambda a, o: 0, 0)
    assert len(bridges[0].emitted) == 5
    assert all(to is None for _, to in bridges[0].emitted)
    assert outcome.reward == outcome.metrics["return"] < 0.0


def test_deterministic_and_seed_dependent() -> None:
    def run(seed: int) -> tuple[Any, ...]:
        policy = TablePolicy(["agent_0", "agent_1", "agent_2"], 25)
        _, outcome, _ = run_inline(Spread(), policy, seed=seed)
        return outcome.reward, outcome.metrics, [o.tolist() for o in policy.seen["agent_1"]]

    assert run(5) == run(5)
    assert run(5)[0] != run(6)[0]


def test_single_agent() -> None:
    scenario = Spread("single", max_cycles=8)
    assert scenario.possible_agents == ["agent"]
    assert scenario.mpe_ids == {"agent": "agent_0"}
    assert scenario.observation_space("agent").shape == (6,)
    _, outcome, decisions = run_inline(scenario, lambda a, o: 2, seed=0)
    assert decisions == 8
    assert outcome.metrics["collisions"] == 0.0
    assert outcome.metrics["steps"] == 8.0


def test_spaces_topology_and_absent_action() -> None:
    scenario = Spread("mesh:3")
    for a in scenario.possible_agents:
        space = scenario.observation_space(a)
        assert (space.shape, space.dtype) == ((18,), np.float32)
        assert scenario.action_space(a).n == 5
        assert scenario.default_action(a) == 0
    assert scenario.absent == "default"
    topo = scenario.topology
    assert topo.kind == "mesh"
    assert topo.agent_ids == ["agent_0", "agent_1", "agent_2"]
    assert (topo.attr(WORLD, "kind"), topo.attr(WORLD, "role")) == ("node", "tool")
    star = Spread("star:2")
    assert star.topology.roles == {
        "orchestrator": "orchestrator",
        "worker_0": "worker",
        "worker_1": "worker",
    }
    assert star.mpe_ids["orchestrator"] == "agent_0"


def test_registered() -> None:
    assert Spread in list_scenarios()
    scenario = build("spread")
    assert isinstance(scenario, Spread)
    assert scenario.possible_agents == ["agent_0", "agent_1", "agent_2"]
    assert Spread.id() == "spread-v0"


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("chain:3",), {}, "mesh:N, single, star:N"),
        (("tree:2x2",), {}, "mesh:N, single, star:N"),
        (("ring:3",), {}, "mesh:N, single, star:N"),
        ((), {"N": 3}, "mesh:N"),
        ((), {"max_cycles": 0}, "max_cycles"),
        ((), {"max_cycles": 2.5}, "max_cycles"),
        ((), {"max_cycles": 10**9}, "max_cycles"),
        ((), {"local_ratio": 1.5}, "local_ratio"),
        ((), {"local_ratio": "half"}, "local_ratio"),
        ((), {"reward": "local"}, "reward"),
    ],
)
def test_bad_arguments(args: tuple[Any, ...], kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        Spread(*args, **kwargs)


def test_bad_agent_and_action() -> None:
    scenario = Spread("mesh:2", max_cycles=3)
    with pytest.raises(ScenarioError, match="agent_0"):
        scenario.action_space("agent_9")
    with pytest.raises(ValueError, match="Discrete"):
        run_inline(scenario, lambda a, o: 5, seed=0)


def _graph_env() -> Any:
    from scenarios.graph_env import GraphEnv

    return GraphEnv


def test_pettingzoo_api() -> None:
    from pettingzoo.test import parallel_api_test

    parallel_api_test(_graph_env()(Spread("mesh:3", max_cycles=10)), num_cycles=30)


@pytest.mark.parametrize("topology", ["mesh:3", "single"])
def test_graph_env_steps_like_mpe2(topology: str) -> None:
    scenario = Spread(topology, max_cycles=25)
    genv = _graph_env()(scenario)
    agents = scenario.possible_agents
    mpe = scenario.mpe_ids
    obs, _ = genv.reset(seed=4)
    env = simple_spread_v3.parallel_env(
        N=len(agents), max_cycles=25, continuous_actions=False, local_ratio=0.5
    )
    ref, _ = env.reset(seed=env_seed(np.random.default_rng(4)))
    table = np.random.default_rng(1).integers(0, 5, size=(25, len(agents)))
    total = 0.0
    for t in range(25):
        assert genv.agents == agents
        for a in agents:
            assert np.array_equal(obs[a], ref[mpe[a]])
        actions = {a: int(table[t, i]) for i, a in enumerate(agents)}
        obs, rewards, terms, truncs, _ = genv.step(actions)
        ref, ref_rewards, *_ = env.step({mpe[a]: x for a, x in actions.items()})
        for a in agents:
            assert rewards[a] == pytest.approx(ref_rewards[mpe[a]], rel=1e-12, abs=1e-12)
        total += sum(rewards.values()) / len(agents)
    # mpe2 truncates at max_cycles, and so does GraphEnv (Outcome.truncated)
    assert all(truncs[a] and not terms[a] for a in agents) and not genv.agents
    assert genv.outcome.reward == pytest.approx(total, rel=1e-12)


def test_counterfactual_replays_are_exact() -> None:
    scenario = Spread("mesh:3", max_cycles=10)
    genv = _graph_env()(scenario)
    genv.reset(seed=2)
    table = np.random.default_rng(3).integers(0, 5, size=(10, 3))
    for t in range(10):
        genv.step({a: int(table[t, i]) for i, a in enumerate(scenario.possible_agents)})
    played = genv.episode_actions()
    assert genv.value(2, scenario.possible_agents, played) == genv.outcome.reward
    # nobody present: every agent takes mpe2's no-op, as an inline run of the no-op policy
    _, idle, _ = run_inline(scenario, lambda a, o: 0, seed=2)
    assert genv.value(2, [], played) == idle.reward
    # agent_1 absent: its recorded actions are replaced by no-ops
    without = {**played, "agent_1": [0] * 10}
    _, partial, _ = run_inline(scenario, _replayer(without), seed=2)
    assert genv.value(2, ["agent_0", "agent_2"], played) == partial.reward


def _replayer(actions: dict[str, list[int]]) -> Any:
    counts: dict[str, int] = {}

    def policy(agent: str, obs: np.ndarray) -> int:
        counts[agent] = counts.get(agent, 0) + 1
        return actions[agent][counts[agent] - 1]

    return policy


@pytest.mark.parametrize("topology", ["mesh:3", "single", "star:2"])
def test_graph_round_trips_through_from_langgraph(topology: str) -> None:
    scenario = Spread(topology)
    try:
        imported = Topology.from_langgraph(scenario.build_graph())
    except (ImportError, AttributeError):
        pytest.skip("Topology.from_langgraph has not landed yet")

    def shape(t: Topology) -> tuple[Any, ...]:
        nodes = sorted((n, d["kind"], d["role"]) for n, d in t.graph.nodes(data=True))
        return nodes, sorted((u, v, d["kind"]) for u, v, d in t.graph.edges(data=True))

    assert shape(imported) == shape(scenario.topology)
    assert imported.agent_ids == scenario.possible_agents


def test_inline_runner_keeps_per_agent_rewards() -> None:
    """``run_inline``'s bridge keeps the rewards emitted to agents by name: each agent's total
    plus the team outcome is its mpe2 return, and what GraphEnv pays it over the episode."""
    from scenarios.decisions import InlineBridge

    scenario, policy = Spread("mesh:3", max_cycles=6), lambda a, o: 1
    bridge = InlineBridge(policy)
    _, outcome, _ = run_inline(scenario, policy, seed=4, bridge=bridge)
    agents = scenario.possible_agents
    assert set(bridge.agent_rewards) == set(agents)
    assert any(bridge.agent_rewards[a] != 0.0 for a in agents)  # local_ratio 0.5: they differ
    env = _graph_env()(scenario)
    obs, infos = env.reset(seed=4)
    paid = dict.fromkeys(agents, 0.0)
    while env.agents:
        obs, rewards, _, _, infos = env.step({a: policy(a, obs[a]) for a in env.agents})
        for a, r in rewards.items():
            paid[a] += r
    for a in agents:
        mine = outcome.reward + bridge.agent_rewards[a]
        assert mine == pytest.approx(outcome.metrics[f"{a}/return"])
        assert mine == pytest.approx(paid[a])
