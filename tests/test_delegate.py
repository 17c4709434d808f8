"""Tests of the ``delegate`` scenario: dynamics, oracle, parallel latency, spaces, errors, env."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from scenarios import ScenarioError
from scenarios.decisions import run_inline
from scenarios.delegate import SOLVED, Delegate
from scenarios.delegate_oracle import Planner, make_skills
from scenarios.registry import build, list_scenarios
from topologies import Topology

Policy = Callable[[str, Any], Any]
SEEDS = range(200)


def episodes(scenario: Delegate, policy: Policy, seeds: range = SEEDS) -> list[Any]:
    """Outcomes of ``policy`` on ``seeds`` (one compiled graph reused)."""
    graph = scenario.build_graph().compile()
    return [run_inline(scenario, policy, s, graph=graph)[1] for s in seeds]


def mean_reward(scenario: Delegate, policy: Policy, seeds: range = SEEDS) -> float:
    return float(np.mean([o.reward for o in episodes(scenario, policy, seeds)]))


def mean_oracle(scenario: Delegate, seeds: range = SEEDS) -> float:
    return float(np.mean([scenario.oracle_value(np.random.default_rng(s)) for s in seeds]))


def unsolved(scenario: Delegate, obs: np.ndarray) -> list[int]:
    k, t = scenario.parts, scenario.types
    status = np.asarray(obs)[k * t : k * t + 3 * k].reshape(k, 3).argmax(axis=1)
    return [i for i in range(k) if status[i] != SOLVED]


def round_robin(scenario: Delegate) -> Policy:
    """Orchestrator: every unsolved part ``i`` to ``worker_{i mod N}``; scripted workers."""

    def policy(agent: str, obs: Any) -> Any:
        if agent != "orchestrator":
            return scenario.scripted_worker(agent, obs)
        action = np.zeros(scenario.parts, dtype=np.int64)
        for i in unsolved(scenario, obs):
            action[i] = i % scenario.n_workers + 1
        return action

    return policy


def best_worker(scenario: Delegate) -> Policy:
    """Orchestrator that knows the skills: every unsolved part to its best worker, every round."""

    def policy(agent: str, obs: Any) -> Any:
        if agent != "orchestrator":
            return scenario.scripted_worker(agent, obs)
        k, t = scenario.parts, scenario.types
        types = np.asarray(obs)[: k * t].reshape(k, t).argmax(axis=1)
        action = np.zeros(k, dtype=np.int64)
        for i in unsolved(scenario, obs):
            action[i] = scenario.skills[:, types[i]].argmax() + 1
        return action

    return policy


def random_orchestrator(scenario: Delegate, seed: int = 0) -> Policy:
    """Orchestrator: uniformly random assignments; scripted workers."""
    rng = np.random.default_rng(seed)

    def policy(agent: str, obs: Any) -> Any:
        if agent != "orchestrator":
            return scenario.scripted_worker(agent, obs)
        return rng.integers(0, scenario.action_space(agent).nvec)

    return policy


class Recorder:
    """Wraps a policy and records every (agent, observation) it is asked about."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.seen: list[tuple[str, np.ndarray]] = []

    def __call__(self, agent: str, obs: Any) -> Any:
        self.seen.append((agent, np.asarray(obs)))
        return self.policy(agent, obs)


# ----- registry and construction -----------------------------------------------------------
def test_registered_with_defaults() -> None:
    assert Delegate in list_scenarios()
    s = build("delegate")
    assert isinstance(s, Delegate) and s.id() == "delegate-v0"
    assert s.possible_agents == ["orchestrator", "worker_0", "worker_1", "worker_2"]
    assert (s.parts, s.types, s.max_rounds, s.parallel) == (3, 3, 6, True)
    assert build("delegate", topology="star:5").n_workers == 5


def test_skills_fixed_by_seed_and_heterogeneous() -> None:
    a, b = Delegate(skills_seed=4).skills, Delegate(skills_seed=4).skills
    assert np.array_equal(a, b)
    assert not np.array_equal(a, Delegate(skills_seed=5).skills)
    for n, t in [(3, 3), (2, 5), (5, 2), (1, 4)]:
        skills = make_skills(n, t, 0)
        strong = skills >= 0.75
        assert strong.any(axis=0).all(), "every type has a strong worker"
        assert strong.any(axis=1).all(), "every worker is strong somewhere"
        if n > 1:
            assert not strong.all(axis=0).any(), "no type is easy for every worker"
    explicit = [[0.5, 0.5, 0.5]] * 3
    assert np.array_equal(Delegate(skills=explicit).skills, np.array(explicit))


# ----- dynamics ----------------------------------------------------------------------------
@pytest.mark.parametrize("topology", ["star:3", "star:3-sequential", "single"])
def test_same_seed_same_outcome(topology: str) -> None:
    spec, _, mode = topology.partition("-")
    s = Delegate(spec, parallel=mode != "sequential")
    runs = [run_inline(s, random_orchestrator(s, 3), 11) for _ in range(2)]
    (state_a, out_a, n_a), (state_b, out_b, n_b) = runs
    assert out_a == out_b and n_a == n_b
    assert state_a["attempts"] == state_b["attempts"] and state_a["types"] == state_b["types"]
    other = run_inline(s, random_orchestrator(s, 3), 12)[0]
    assert (other["task_seed"], other["types"]) != (state_a["task_seed"], state_a["types"])


def test_attempts_follow_the_common_random_numbers() -> None:
    s = Delegate()
    for seed in range(20):
        state, _, _ = run_inline(s, random_orchestrator(s, seed), seed)
        for round_, part, worker, method, ok in state["attempts"]:
            type_ = state["types"][part]
            draw = Delegate.draw(state["task_seed"], round_, part, worker)
            assert ok == (method == type_ + 1 and draw < s.skills[worker, type_])


def test_wrong_method_or_pass_solves_nothing() -> None:
    s = Delegate(skills=np.ones((3, 3)))

    def policy(agent: str, obs: Any) -> Any:
        if agent == "orchestrator":
            return np.ones(3, dtype=np.int64)  # everything to worker_0, every round
        methods = s.scripted_worker(agent, obs)
        return np.where(methods > 0, methods % 3 + 1, 0)  # always a wrong method

    _, out, _ = run_inline(s, policy, 0)
    assert out.metrics["solved_fraction"] == 0.0
    assert out.metrics["latency"] == s.max_rounds  # retried until the round budget ran out
    _, out, _ = run_inline(s, lambda a, o: s.default_action(a) + (a == "orchestrator"), 0)
    assert out.metrics["solved_fraction"] == 0.0 and out.metrics["calls"] == 3 * s.max_rounds


def test_reward_formula_and_metrics() -> None:
    s = Delegate(skills=np.ones((3, 3)), latency_cost=0.1, call_cost=0.03)
    _, out, n = run_inline(s, round_robin(s), 5)
    m = out.metrics
    assert m == {"latency": 1.0, "calls": 3.0, "solved_fraction": 1.0, "rounds": 1.0}
    assert out.success and n == 1 + 3  # one orchestrator decision, three workers
    assert out.reward == pytest.approx(1.0 - 0.1 * 1 - 0.03 * 3)
    assert out.local["orchestrator"] == out.reward


def test_assigning_nothing_ends_the_run() -> None:
    s = Delegate()
    _, out, n = run_inline(s, lambda a, o: s.default_action(a), 0)
    assert n == 1 and out.reward == 0.0 and not out.success
    assert out.metrics == {"latency": 0.0, "calls": 0.0, "solved_fraction": 0.0, "rounds": 1.0}


def test_invalid_action_is_rejected() -> None:
    s = Delegate()
    with pytest.raises(ValueError, match="orchestrator action"):
        run_inline(s, lambda a, o: np.full(3, 9), 0)


# ----- parallel fan-out vs one worker a round ---------------------------------------------
def test_sequential_takes_more_latency_for_the_same_assignments() -> None:
    sure = np.ones((3, 3))
    par, seq = Delegate(skills=sure), Delegate(skills=sure, parallel=False)
    _, out_par, _ = run_inline(par, round_robin(par), 0)
    _, out_seq, _ = run_inline(seq, round_robin(seq), 0)
    assert out_par.metrics["latency"] == 1 and out_seq.metrics["latency"] == 3
    assert out_par.metrics["calls"] == out_seq.metrics["calls"] == 3
    assert out_seq.reward < out_par.reward
    # with the real skills, on average: every unsolved part to its best worker until solved
    par, seq = Delegate(max_rounds=16), Delegate(max_rounds=16, parallel=False)
    out_par, out_seq = (
        episodes(par, best_worker(par), range(100)),
        episodes(seq, best_worker(seq), range(100)),
    )
    assert all(o.success for o in out_par + out_seq)
    lat_par = np.mean([o.metrics["latency"] for o in out_par])
    lat_seq = np.mean([o.metrics["latency"] for o in out_seq])
    assert lat_seq > lat_par + 0.5
    assert np.mean([o.metrics["calls"] for o in out_seq]) == pytest.approx(
        np.mean([o.metrics["calls"] for o in out_par]), rel=0.2
    )


def test_sequential_calls_only_the_first_named_worker() -> None:
    s = Delegate(skills=np.ones((3, 3)), parallel=False)
    state, _, _ = run_inline(s, round_robin(s), 0)
    rounds = [[(a[0], a[2]) for a in state["attempts"] if a[0] == r] for r in range(3)]
    assert [{w for _, w in r} for r in rounds] == [{0}, {1}, {2}]


# ----- the oracle --------------------------------------------------------------------------
def test_planner_matches_hand_computed_values() -> None:
    lam, mu, p = 0.1, 0.05, 0.6
    one = Planner(np.array([[p]]), parts=1, max_rounds=1, latency_cost=lam, call_cost=mu,
                  parallel=True)  # fmt: skip
    assert one.value((1,)) == pytest.approx(p - lam - mu)
    two = Planner(np.array([[p]]), 1, 2, lam, mu, True)
    assert two.value((1,)) == pytest.approx(p - lam - mu + (1 - p) * (p - lam - mu))
    hopeless = Planner(np.array([[0.1]]), 1, 3, lam, mu, True)
    assert hopeless.value((1,)) == 0.0 and hopeless.best((1,), 0) == (0, (0,))
    # two parts of two types, parallel: each to its best worker in one round
    skills = np.array([[0.9, 0.2], [0.3, 0.8]])
    par = Planner(skills, parts=2, max_rounds=1, latency_cost=lam, call_cost=mu, parallel=True)
    assert par.value((1, 1)) == pytest.approx((0.9 + 0.8) / 2 - lam - 2 * mu)
    seq = Planner(skills, parts=2, max_rounds=1, latency_cost=lam, call_cost=mu, parallel=False)
    # one worker a round: worker_0 takes both parts (0.9 and 0.2) rather than one alone
    both = (0.9 + 0.2) / 2 - lam - 2 * mu
    assert both > 0.9 / 2 - lam - mu
    assert seq.value((1, 1)) == pytest.approx(both)
    assert seq.best((1, 1), 0) == (0, (1, 1))


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"parallel": False}, {"topology": "star:2", "parts": 4}, {"topology": "single"}],
    ids=["star3", "sequential", "star2-4parts", "single"],
)
def test_oracle_policy_scores_its_oracle_value(kwargs: dict[str, Any]) -> None:
    s = Delegate(**kwargs)
    assert mean_reward(s, s.oracle_policy) == pytest.approx(mean_oracle(s), abs=0.03)


def test_random_and_naive_orchestrators_score_clearly_below_the_oracle() -> None:
    s = Delegate()
    oracle = mean_oracle(s)
    assert mean_reward(s, random_orchestrator(s)) < oracle - 0.2
    assert mean_reward(s, round_robin(s)) < oracle - 0.2
    # the skill-aware team beats the single generalist
    assert mean_oracle(Delegate("single")) < oracle - 0.2


# ----- observations and spaces -------------------------------------------------------------
@pytest.mark.parametrize("topology", ["star:3", "star:1", "single"])
def test_observations_in_spaces_and_skill_free(topology: str) -> None:
    seen: dict[int, list[tuple[str, np.ndarray]]] = {}
    for skills_seed in (0, 1):
        s = Delegate(topology, skills_seed=skills_seed)
        rec = Recorder(random_orchestrator(s, 1))
        for seed in range(30):
            run_inline(s, rec, seed)
        for agent, obs in rec.seen:
            space = s.observation_space(agent)
            assert space.contains(obs), (agent, obs)
            assert set(np.unique(obs)) <= {0.0, 1.0}, "one-hot only: no skill values"
        seen[skills_seed] = rec.seen
        for agent in s.possible_agents:
            assert s.action_space(agent).contains(s.default_action(agent))
    # the first decision of every episode looks the same whatever the hidden skills
    first = [[o for a, o in seen[k] if a == seen[k][0][0]][:1] for k in (0, 1)]
    assert np.array_equal(first[0][0], first[1][0])


def test_worker_sees_only_its_parts() -> None:
    s = Delegate(skills=np.ones((3, 3)))
    rec = Recorder(round_robin(s))
    state, _, _ = run_inline(s, rec, 2)
    for agent, obs in rec.seen:
        if agent.startswith("worker_"):
            rows = obs.reshape(3, 3)
            i = int(agent.rpartition("_")[2])
            assert rows.any(axis=1).tolist() == [p == i for p in range(3)]
            assert rows[i].argmax() == state["types"][i]


# ----- single topology ---------------------------------------------------------------------
def test_single_agent_does_everything_once() -> None:
    s = Delegate("single", parallel=False)
    assert s.possible_agents == ["agent"]
    state, out, n = run_inline(s, s.scripted_worker, 4)
    assert n == 1 and out.metrics["latency"] == 1 and out.metrics["calls"] == 0
    assert len(state["attempts"]) == s.parts
    skill = s.skills.mean(axis=0)  # the average specialist
    for _, part, _, _, ok in state["attempts"]:
        type_ = state["types"][part]
        assert ok == (Delegate.draw(state["task_seed"], 0, part, 3) < skill[type_])
    assert Delegate("single", skills=[[1.0, 0.0, 1.0]]).skills.shape == (1, 3)


# ----- argument errors ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"topology": "chain:3"}, "star:N"),
        ({"topology": "mesh:2"}, "star:N"),
        ({"topology": "tree:2x2"}, "star:N"),
        ({"topology": "star:0"}, "topology"),
        ({"topology": "ring"}, "topology"),
        ({"topology": Topology.empty("mine")}, "star:N"),
        ({"tasks": 3}, "unknown argument.*tasks.*parts"),
        ({"parts": 0}, r"parts must be an integer in \[1, 8\]"),
        ({"parts": 9}, "parts"),
        ({"parts": True}, "parts"),
        ({"parts": 2.0}, "parts"),
        ({"types": 0}, r"types must be an integer in \[1, 8\]"),
        ({"types": 9}, "types"),
        ({"skills_seed": -1}, "skills_seed must be an integer ≥ 0"),
        ({"skills_seed": "a"}, "skills_seed"),
        ({"skills": [[0.5] * 3] * 2}, r"skills must have shape \(3, 3\)"),
        ({"skills": [0.5, 0.5, 0.5]}, "skills must have shape"),
        ({"skills": [[0.5] * 3] * 2 + [[1.5] * 3]}, r"skills must be .* in \[0, 1\]"),
        ({"skills": [[np.nan] * 3] * 3}, r"skills must be .* in \[0, 1\]"),
        ({"skills": "strong"}, "skills must be a numeric matrix"),
        ({"topology": "single", "skills": [[0.5] * 2]}, r"skills must have shape \(N, 3\)"),
        ({"parallel": "yes"}, "parallel must be True or False"),
        ({"max_rounds": 0}, r"max_rounds must be an integer in \[1, 16\]"),
        ({"max_rounds": 17}, "max_rounds"),
        ({"latency_cost": -0.1}, "latency_cost must be a finite number ≥ 0"),
        ({"latency_cost": float("nan")}, "latency_cost"),
        ({"latency_cost": "high"}, "latency_cost"),
        ({"call_cost": float("inf")}, "call_cost must be a finite number ≥ 0"),
        ({"call_cost": -1}, "call_cost"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        Delegate(**kwargs)


def test_unknown_agent() -> None:
    with pytest.raises(ScenarioError, match="unknown agent"):
        Delegate().observation_space("worker_7")


# ----- as a PettingZoo environment ---------------------------------------------------------
ENV_CASES = [
    {},
    {"topology": "single"},
    {"parallel": False},
    {"topology": "star:1", "parts": 2, "types": 2},
]


@pytest.mark.parametrize("kwargs", ENV_CASES, ids=["star3", "single", "sequential", "star1"])
def test_graph_env_passes_pettingzoo_api_tests(kwargs: dict[str, Any]) -> None:
    from scenarios.testing import check_pettingzoo

    check_pettingzoo(lambda: Delegate(**kwargs), cycles=100)  # their warnings are errors


def test_graph_env_matches_inline_and_replays_exactly() -> None:
    from scenarios.graph_env import GraphEnv

    s = Delegate()
    env = GraphEnv(s)
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        while env.agents:
            obs, *_ = env.step({a: s.oracle_policy(a, obs[a]) for a in env.agents})
        assert env.outcome is not None
        assert env.outcome == run_inline(s, s.oracle_policy, seed)[1]
        actions = env.episode_actions()
        assert env.value(seed, s.possible_agents, actions) == env.outcome.reward
        assert env.value(seed, [], actions) == 0.0  # absent orchestrator assigns nothing
        # an absent worker passes: the team loses exactly the parts it would have solved
        for w in ("worker_0", "worker_1", "worker_2"):
            rest = [a for a in s.possible_agents if a != w]
            assert env.value(seed, rest, actions) <= env.outcome.reward


def test_skill_draws_are_the_common_random_numbers_of_the_seed_list() -> None:
    """``draw`` seeds from uint32 words where every key fits one (faster); the draw is the one
    ``default_rng([task_seed, round, part, worker])`` gives, and a key it refuses still fails."""
    rng = np.random.default_rng(0)
    keys = [tuple(int(x) for x in rng.integers(0, 2**31, 4)) for _ in range(300)]
    keys += [(0, 0, 0, 0), (2**32 - 1, 15, 7, 8), (2**32, 1, 2, 3), (2**40 + 5, 0, 1, 2)]
    for key in keys:
        assert Delegate.draw(*key) == float(np.random.default_rng(list(key)).random())
    with pytest.raises(ValueError):
        Delegate.draw(-1, 0, 0, 0)
