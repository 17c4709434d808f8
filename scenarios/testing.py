"""Conformance checks for scenarios: run them on your own scenario or topology with one call.

Example:
    >>> from scenarios.testing import check_scenario
    >>> check_scenario(lambda: scenarios.build("delegate", topology="star:3"))  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
from pettingzoo.test import parallel_api_test, parallel_seed_test

from scenarios.base import Scenario
from scenarios.counterfactual import Counterfactual
from scenarios.graph_env import GraphEnv


def random_episode(env: GraphEnv, seed: int) -> float:
    """Play one episode with uniformly random actions (seeded); return the team outcome reward."""
    obs, _ = env.reset(seed=seed)
    for a in env.possible_agents:
        env.action_space(a).seed(seed)
    while env.agents:
        for a in env.agents:
            space = env.observation_space(a)
            if not space.contains(obs[a]):
                raise AssertionError(f"observation of {a!r} is outside its space {space}")
        obs, *_ = env.step({a: env.action_space(a).sample() for a in env.agents})
    assert env.outcome is not None
    return env.outcome.reward


def check_replay(env: GraphEnv, seed: int) -> None:
    """A replay of an episode with every agent present reproduces its outcome exactly."""
    reward = random_episode(env, seed)
    if env.outcome is not None and env.truncated:
        return  # a failed episode has nothing to reproduce
    replayed = env.value(seed, env.possible_agents, env.episode_actions())
    if not np.isclose(replayed, reward):
        raise AssertionError(f"replay of seed {seed} gave {replayed}, the episode gave {reward}")


def check_fast_replay(env: GraphEnv, seed: int, coalitions: int = 32) -> None:
    """Fast replays (:mod:`scenarios.replay`) equal LangGraph replays: same decisions, same
    observations, same outcome, for up to ``coalitions`` coalitions of a random episode's
    players (the full and the empty one, then random ones; each distinct coalition once) under
    every absent policy. Passes trivially for graphs the fast path does not run.
    """
    if env.fast_graph() is None:
        return
    random_episode(env, seed)
    actions = env.episode_actions()
    players = sorted(actions)
    rng = np.random.default_rng(seed)
    subsets = [
        frozenset(p for p, keep in zip(players, bits, strict=True) if keep)
        for bits in (rng.integers(2, size=len(players)) for _ in range(coalitions - 2))
    ]
    for members in dict.fromkeys([frozenset(players), frozenset(), *subsets]):
        for mode in ("skip", "placeholder", "default"):
            policy = Counterfactual(env.scenario, actions, mode).coalition(members)
            check = env.compare_replays(seed, policy)
            if not check.same:
                raise AssertionError(
                    f"fast replay of seed {seed} with coalition {sorted(members)} "
                    f"(absent={mode!r}) differs from the LangGraph replay: "
                    f"{check.fast} vs {check.truth}"
                )


def check_rllib(env: GraphEnv) -> None:
    """The RLlib view passes RLlib's own multi-agent env checker."""
    from ray.rllib.utils.pre_checks.env import check_multiagent_environments

    from scenarios.rllib_env import RLlibGraphEnv

    check_multiagent_environments(RLlibGraphEnv({"env": env}))


def check_pettingzoo(factory: Callable[[], Scenario], cycles: int = 200) -> None:
    """PettingZoo's ``parallel_api_test`` and ``parallel_seed_test``, their warnings as errors."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=UserWarning, module=r"pettingzoo\.")
        try:
            parallel_api_test(GraphEnv(factory()), num_cycles=cycles)
            parallel_seed_test(lambda: GraphEnv(factory()), num_cycles=cycles)
        except UserWarning as exc:
            raise AssertionError(f"PettingZoo's API test warned: {exc}") from exc


def check_scenario(
    factory: Callable[[], Scenario], cycles: int = 200, seeds: int = 3, rllib: bool = True
) -> None:
    """Run every conformance check on a scenario factory.

    Checks PettingZoo's ``parallel_api_test`` and ``parallel_seed_test`` (their warnings are
    errors), observations inside their spaces, exact replays (determinism and common random
    numbers), fast replays equal to LangGraph replays and, with ``rllib``, RLlib's env checker
    on the RLlib view.

    Raises:
        AssertionError: naming the check that failed.
    """
    check_pettingzoo(factory, cycles)
    env = GraphEnv(factory())
    for seed in range(seeds):
        check_replay(env, seed)
        check_fast_replay(env, seed)
    if rllib:
        check_rllib(GraphEnv(factory()))
