"""Every registered scenario passes the conformance checks on every topology kind it accepts.

The PettingZoo view (``GraphEnv``) follows PettingZoo's ``ParallelEnv`` contract: every live
agent is stepped at once and an agent that finished never comes back (pinned below), so an
agent that waits between two decisions stays live and its waiting steps have no effect. A plain
loop that ignores ``infos["acting"]`` therefore plays the same episode and collects the same
returns as RLlib's view, which shows only the acting agents.
"""

from __future__ import annotations

import warnings
import zlib
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test

from scenarios import GraphEnv, build, list_scenarios
from scenarios.rllib_env import RLlibGraphEnv
from scenarios.testing import check_scenario

SAMPLE_SPECS = {
    "single": "single",
    "chain": "chain:3",
    "star": "star:3",
    "tree": "tree:2x1",
    "mesh": "mesh:3",
}

CASES = [
    (cls.id(), SAMPLE_SPECS[kind])
    for cls in list_scenarios()
    for kind in cls.topologies
    if kind in SAMPLE_SPECS
]
IDS = [f"{s}-{t}" for s, t in CASES]


def test_every_builtin_is_registered():
    ids = {cls.name for cls in list_scenarios()}
    assert {"delegate", "relay", "toolchain", "spread"} <= ids


@pytest.mark.parametrize(("scenario", "topology"), CASES, ids=IDS)
def test_conformance(scenario, topology):
    check_scenario(lambda: build(scenario, topology=topology), cycles=60, seeds=2)


@pytest.mark.parametrize(("scenario", "topology"), CASES, ids=IDS)
def test_pettingzoo_api_test_with_warnings_as_errors(scenario, topology):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parallel_api_test(GraphEnv(build(scenario, topology=topology)), num_cycles=60)


def policy(env: Any, agent: str, obs: Any) -> Any:
    """A deterministic function of (agent, observation): a seeded sample of the action space."""
    space = env.action_space(agent)
    space.seed(zlib.crc32(f"{agent}:{np.asarray(obs).tolist()}".encode()))
    return space.sample()


def plain_loop(env: GraphEnv, seed: int) -> list[tuple[str, Any, float, bool]]:
    """A generic consumer: every live agent acts every step; one record per agent and step."""
    obs, _ = env.reset(seed=seed)
    records = []
    while env.agents:
        actions = {a: policy(env, a, obs[a]) for a in env.agents}
        obs, rewards, terms, truncs, _ = env.step(actions)
        records += [(a, actions[a], rewards[a], terms[a] or truncs[a]) for a in actions]
    return records


def decisions(env: GraphEnv) -> list[tuple[str, list[Any], list[Any]]]:
    """The episode's decisions: agent, observation, action."""
    return [
        (t.agent, np.asarray(t.observation).tolist(), np.asarray(t.action).tolist())
        for t in env.trace
    ]


def rllib_returns(env: RLlibGraphEnv, seed: int) -> dict[str, float]:
    obs, _ = env.reset(seed=seed)
    returns: dict[str, float] = {}
    done = False
    while not done:
        actions = {a: policy(env.env, a, o) for a, o in obs.items()}
        obs, rewards, terms, truncs, _ = env.step(actions)
        for a, r in rewards.items():
            returns[a] = returns.get(a, 0.0) + r
        done = terms["__all__"] or truncs["__all__"]
    return returns


@pytest.mark.parametrize(("scenario", "topology"), CASES, ids=IDS)
def test_a_plain_loop_plays_the_real_episode(scenario, topology):
    view = RLlibGraphEnv({"env": GraphEnv(build(scenario, topology=topology))})
    expected = rllib_returns(view, seed=0)
    trace = decisions(view.env)
    env = GraphEnv(build(scenario, topology=topology))
    records = plain_loop(env, seed=0)
    # the same decisions: waiting agents' actions had no effect
    assert decisions(env) == trace
    assert env.outcome.reward == view.env.outcome.reward
    # every possible agent finishes exactly once, in its last record
    for agent in env.possible_agents:
        mine = [r for r in records if r[0] == agent]
        assert [r[3] for r in mine] == [False] * (len(mine) - 1) + [True]
    # the same returns as RLlib's view; agents never asked earn nothing
    returns = {a: sum(r[2] for r in records if r[0] == a) for a in env.possible_agents}
    assert returns == pytest.approx({a: expected.get(a, 0.0) for a in env.possible_agents})


class LeaveAndReturn(ParallelEnv):
    """``a`` acts, leaves ``agents`` while ``b`` acts (``finish``: as terminated), acts again."""

    TURNS = (["a"], ["b"], ["a"])

    def __init__(self, finish: bool) -> None:
        self.metadata = {"name": "leave_and_return"}
        self.possible_agents = ["a", "b"]
        self.space = gym.spaces.Discrete(2)
        self.finish = finish

    def observation_space(self, agent: str) -> gym.Space:
        return self.space

    def action_space(self, agent: str) -> gym.Space:
        return self.space

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.TURNS[0])
        return dict.fromkeys(self.agents, 0), {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        last = self.t == len(self.TURNS)
        self.agents = [] if last else list(self.TURNS[self.t])
        who = sorted({*actions, *self.agents})
        done = {a: last or (self.finish and a not in self.agents) for a in who}
        infos = {a: {} for a in who}
        return dict.fromkeys(who, 0), dict.fromkeys(who, 0.0), done, dict(done), infos


@pytest.mark.parametrize(
    ("finish", "match"), [(False, r"\['b'\] != "), (True, "cannot be revived")]
)
def test_pettingzoo_forbids_agents_that_leave_while_waiting(finish, match):
    """Why waiting agents stay live: PettingZoo's own test rejects an agent that leaves
    ``agents`` while another acts and comes back for its next decision."""
    with pytest.raises(AssertionError, match=match), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(LeaveAndReturn(finish), num_cycles=10)
