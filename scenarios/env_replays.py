"""Counterfactual replays of a :class:`~scenarios.graph_env.GraphEnv`'s episodes.

:class:`ReplayAPI` (a mixin of ``GraphEnv``) runs the rule of
:class:`~scenarios.counterfactual.Counterfactual` — a present agent replays its recorded
actions, an absent one acts under the scenario's absent policy — through LangGraph or, where the
graph compiles for it, through :class:`scenarios.replay.FastGraph` (the first
:data:`FAST_REPLAY_CHECKS` replays run both ways; a difference switches the fast path off with a
warning). A replay gets the episode's wall-clock limit (:class:`scenarios.alarm.Alarm`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import greenlet
import numpy as np
from langgraph.errors import GraphRecursionError

from scenarios.alarm import Alarm, EpisodeTimeout
from scenarios.base import AbsentPolicy, Outcome, ReplayUnavailable, Scenario, ScenarioError
from scenarios.bridge import GraphRun, SkipNode
from scenarios.counterfactual import CoalitionPolicy, Counterfactual, Policy
from scenarios.replay import (
    DecisionLimit,
    FastGraph,
    NodeFailed,
    RecursionLimit,
    Unsupported,
    compile_fast,
    same,
)
from topologies.langgraph_compat import wrap_node_functions

_UNSET: Any = object()
#: fast replays a GraphEnv checks against LangGraph replays before trusting them
FAST_REPLAY_CHECKS = 16


def compile_skippable(builder: Any, agent_nodes: Iterable[str]) -> Any:
    """Compile a copy of ``builder`` whose agent nodes turn :class:`SkipNode` into "no update".

    Used only for counterfactual replays under ``absent="skip"``; the node functions are wrapped
    in place, so LangGraph's argument injection (config, runtime, ...) is unchanged.
    """
    return wrap_node_functions(builder, agent_nodes, _skippable, _askippable).compile()


def _skippable(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def node(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except SkipNode:
            return None

    return node


def _askippable(afunc: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(afunc)
    async def node(*args: Any, **kwargs: Any) -> Any:
        try:
            return await afunc(*args, **kwargs)
        except SkipNode:
            return None

    return node


@dataclasses.dataclass
class ReplayCheck:
    """One replay both ways (:meth:`GraphEnv.compare_replays`)."""

    truth: Outcome  #: the LangGraph replay's outcome
    fast: Outcome | None  #: the fast replay's (None: the fast path did not run it)
    same: bool  #: same decisions, observations and outcome


class ReplayAPI:
    """:class:`~scenarios.graph_env.GraphEnv`'s counterfactual replays (a mixin): :meth:`value`
    (cached team returns), :meth:`replay`, :meth:`compare_replays` and :meth:`fast_graph`.

    It uses the env's ``scenario``, ``possible_agents``, ``agent_nodes``, ``agent_ids``,
    ``fast_replay``, ``max_steps``, ``episode_timeout_s``, ``_limit_text`` and ``_new_run``.
    """

    # set by GraphEnv.__init__ (attributes this mixin reads)
    scenario: Scenario
    possible_agents: list[str]
    agent_nodes: dict[str, int]
    agent_ids: dict[str, int] | None
    fast_replay: bool
    max_steps: int
    episode_timeout_s: float | None
    _limit_text: Callable[[str | None], str]
    _new_run: Callable[..., GraphRun]

    def _init_replays(self) -> None:
        self._skip_graph: Any = None  # compiled on the first replay under absent="skip"
        self._replays: dict[tuple[Any, ...], Outcome] = {}
        self._fast: Any = _UNSET  # the fast replay executor, built on the first replay
        self._fast_checks = FAST_REPLAY_CHECKS

    def value(
        self,
        seed: int,
        coalition: Iterable[str],
        actions: Mapping[str, list[Any]] | Policy,
        absent: AbsentPolicy | None = None,
    ) -> float:
        """Team return of a replay of episode ``seed`` with only ``coalition`` present.

        Agents in the coalition act as given: ``actions`` maps each agent to the actions it took
        or is a policy ``(agent, obs) -> action``; agents outside act under ``absent`` (default:
        the scenario's declared policy), by the rule of
        :class:`~scenarios.counterfactual.Counterfactual`. Replays are deterministic (same
        seed, same task and random draws) and cached per (seed, coalition, actions).
        """
        members = frozenset(coalition)
        unknown = members - set(self.possible_agents)
        if unknown:
            raise ValueError(
                f"unknown agents {sorted(unknown)} in coalition: use env.possible_agents"
            )
        counterfactual = Counterfactual(self.scenario, actions, absent)
        key = None
        if not callable(actions):
            key = (seed, members, counterfactual.absent, _freeze(actions))
            if key in self._replays:
                return self._replays[key].reward
        outcome = self.replay(seed, counterfactual.coalition(members))
        if key is not None:
            self._replays[key] = outcome
        return outcome.reward

    def replay(self, seed: int, policy: CoalitionPolicy) -> Outcome:
        """The outcome of one replay of episode ``seed`` under a coalition's policy (not cached).

        Raises:
            ReplayUnavailable: the scenario cannot replay an episode exactly
                (``Scenario.exact_replay`` is False).
            ScenarioError: ``absent="skip"`` on an env that identifies agents by id.
        """
        if not self.scenario.exact_replay:
            raise ReplayUnavailable(
                f"{self.scenario.id()} cannot replay an episode exactly (exact_replay=False), so "
                "counterfactual values (credit 'loo' / 'shapley') are unavailable: use credit "
                "'team' or 'local'"
            )
        mode = policy.absent
        if mode == "skip" and self.agent_ids is not None:
            raise ScenarioError(
                "absent='skip' skips an agent's node, but this env identifies agents by id "
                "(agent_ids=...), whose decisions may sit deep inside a node: use "
                "absent='default' or 'placeholder'"
            )
        fast = self.fast_graph()
        if fast is None:
            return self._slow_replay(seed, policy, mode)
        if self._fast_checks > 0:  # the truth first, then the same decisions through `fast`
            self._fast_checks -= 1
            check = self.compare_replays(seed, policy)
            if not check.same:
                self._fast = None
                warnings.warn(
                    f"fast replays of {self.scenario.id()} differ from LangGraph replays "
                    f"(seed={seed}, coalition={sorted(policy.members)}); replaying through "
                    "LangGraph",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return check.truth
        act = _Recorder(policy)
        try:
            return self._fast_replay(fast, seed, act, mode)
        except Unsupported:  # replay through LangGraph, feeding the decisions already made
            return self._slow_replay(seed, _Replayer(act.log, then=act.act), mode)

    def compare_replays(self, seed: int, policy: CoalitionPolicy) -> ReplayCheck:
        """Replay ``policy`` through LangGraph (uncached), then feed the same decisions to the
        fast executor; ``same`` when decisions, observations and outcomes match (also when the
        fast path is off or does not cover the run: it falls back to LangGraph).
        """
        slow = _Recorder(policy)
        truth = self._slow_replay(seed, slow, policy.absent)
        fast = self.fast_graph()
        if fast is None:
            return ReplayCheck(truth, None, True)
        again = _Replayer(slow.log)
        try:
            outcome = self._fast_replay(fast, seed, again, policy.absent)
        except Unsupported:
            return ReplayCheck(truth, None, True)
        return ReplayCheck(truth, outcome, again.same and same(truth, outcome))

    def fast_graph(self) -> FastGraph | None:
        """The graph's fast replay executor (None: not available or switched off)."""
        if self._fast is _UNSET:
            self._fast = (
                compile_fast(self.scenario.build_graph(), self.agent_nodes, self.agent_ids)
                if self.fast_replay
                else None
            )
        return self._fast  # type: ignore[return-value]

    def _fast_replay(self, fast: FastGraph, seed: int, act: Policy, mode: AbsentPolicy) -> Outcome:
        inputs = self.scenario.initial_state(np.random.default_rng(seed))
        try:
            # the replay runs in this greenlet: the alarm may raise anywhere in it
            with Alarm(self.episode_timeout_s, self._limit_text, None):
                state, team_reward = fast.run(
                    inputs,
                    act,
                    skip_agents=mode == "skip",
                    max_decisions=self.max_steps,
                    recursion_limit=self.scenario.max_supersteps + 1,
                    keep_values=self.scenario.scores_limit_episodes,
                    errors_end_run=self.scenario.node_errors_end_episode,
                )
        except EpisodeTimeout:  # a replay gets the episode's wall-clock limit too
            return self.scenario.failure_state(None)
        except DecisionLimit as exc:
            return self.scenario.limit_state(exc.state)
        except RecursionLimit as exc:  # GraphRun keeps the error: a failure with its rewards
            outcome = self.scenario.limit_state(exc.state)
            outcome.reward += exc.team_reward
            return outcome
        except NodeFailed as exc:  # as the LangGraph replay ends, without running the node again
            outcome = self.scenario.failure_state(None)
            outcome.reward += exc.team_reward
            return outcome
        outcome = self.scenario.score(state)
        outcome.reward += team_reward
        return outcome

    def _slow_replay(self, seed: int, act: Policy, mode: AbsentPolicy) -> Outcome:
        run = self._new_run(seed, graph=self._skip_compiled() if mode == "skip" else None)
        limit = self.episode_timeout_s
        deadline = time.monotonic() + limit if limit is not None else None
        try:  # a replay gets the episode's wall-clock limit too
            with Alarm(limit, self._limit_text, greenlet.getcurrent()):
                pending = run.start()
                for _ in range(self.max_steps):
                    if run.finished or (deadline is not None and time.monotonic() >= deadline):
                        break
                    pending = run.resume({a: act(a, r.observation) for a, r in pending.items()})
        except EpisodeTimeout:
            pass
        if deadline is not None and time.monotonic() >= deadline and not run.error:
            run.abort()  # timed out, as the episode would have: a failure with its rewards
            outcome = self.scenario.failure_state(None)
            outcome.reward += run.team_reward
            return outcome
        if not run.finished:
            run.abort()
            return self.scenario.limit_state(run.latest)
        if isinstance(run.error, GraphRecursionError):
            outcome = self.scenario.limit_state(run.latest)
        elif run.error:
            outcome = self.scenario.failure_state(run.result)
        else:
            outcome = self.scenario.score(run.result)
        outcome.reward += run.team_reward
        return outcome

    def _skip_compiled(self) -> Any:
        """The graph compiled for replays under ``absent="skip"`` (on first use)."""
        if self._skip_graph is None:
            self._skip_graph = compile_skippable(self.scenario.build_graph(), self.agent_nodes)
        return self._skip_graph


def _freeze(actions: Mapping[str, list[Any]]) -> tuple[Any, ...]:
    def f(x: Any) -> Any:
        return tuple(np.asarray(x).ravel().tolist()) if isinstance(x, np.ndarray) else x

    return tuple(sorted((a, tuple(f(x) for x in seq)) for a, seq in actions.items()))


class _Recorder:
    """A policy that keeps every decision it made: ``(agent, observation, action)``."""

    def __init__(self, act: Policy) -> None:
        self.act = act
        self.log: list[tuple[str, Any, Any]] = []

    def __call__(self, agent: str, obs: Any) -> Any:
        action = self.act(agent, obs)
        self.log.append((agent, obs, action))
        return action


class _Replayer:
    """Feeds recorded decisions back in order (``same`` turns False where the run differs),
    then asks ``then`` (or gives up with a default action when there is none)."""

    def __init__(self, log: list[tuple[str, Any, Any]], then: Policy | None = None) -> None:
        self.log = log
        self.then = then
        self.same = True
        self._i = 0

    def __call__(self, agent: str, obs: Any) -> Any:
        if self._i < len(self.log):
            who, seen, action = self.log[self._i]
            self._i += 1
            self.same = self.same and who == agent and same(seen, obs)
            return action
        if self.then is not None:
            return self.then(agent, obs)
        self.same = False
        return SkipNode


__all__ = ["FAST_REPLAY_CHECKS", "ReplayAPI", "ReplayCheck", "compile_skippable"]
