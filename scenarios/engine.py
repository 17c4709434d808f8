"""Executing a scenario's LangGraph graph as a Dec-POMDP: ``decide()``, ``GraphEnv``, replays.

Every agent node asks for its decision with :func:`decide`. :class:`GraphEnv` (a PettingZoo
``ParallelEnv``) runs the graph through :class:`scenarios.bridge.GraphRun` and turns every
superstep's pending decisions into one parallel step; :func:`run_inline` runs the same graph with
a policy answering in place (the baseline the bridge is measured against).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from langgraph.config import get_config
from pettingzoo import ParallelEnv

from scenarios.base import AbsentPolicy, Outcome, Scenario, ScenarioError
from scenarios.bridge import BRIDGE_KEY, GraphRun, SkipNode, agent_id_list, instance_counts
from scenarios.replay import (
    FAST_BRIDGE,
    DecisionLimit,
    FastGraph,
    RecursionLimit,
    Unsupported,
    compile_fast,
)

Policy = Callable[[str, Any], Any]


def _bridge(what: str) -> Any:
    fast = FAST_BRIDGE.get()
    if fast is not None:
        return fast
    try:
        return get_config()["configurable"][BRIDGE_KEY]
    except (RuntimeError, KeyError) as exc:
        raise RuntimeError(
            f"{what} was called outside a marl-orchestra run: execute the graph with "
            "scenarios.GraphEnv or scenarios.engine.run_inline"
        ) from exc


def decide(agent: str, observation: Any) -> Any:
    """Ask the environment for ``agent``'s action on ``observation``; call it inside a node.

    ``agent`` is the node's name; for a ``Send`` fan-out target with ``max_instances > 1`` the
    environment assigns ``<node>_<i>`` in the order LangGraph scheduled the node's tasks.
    """
    return _bridge(f"decide({agent!r}, ...)").decide(agent, observation)


def emit_reward(value: float, agents: list[str] | None = None) -> None:
    """Give a reward now (a per-step reward, as in MPE): to ``agents``, or to the team when None.

    An episode's team return is the sum of emitted team rewards plus ``Outcome.reward``.
    """
    _bridge("emit_reward()").emit_reward(float(value), agents)


def zero_action(space: gym.Space) -> Any:
    """The all-zeros element of a Discrete / MultiDiscrete / MultiBinary / Box space."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start)
    return np.zeros(space.shape, dtype=space.dtype)


def action_in_space(space: gym.Space, action: Any) -> tuple[Any, bool]:
    """``action`` in the form the env executes it (a 1-element array becomes the int of a
    ``Discrete`` space), and whether it lies in ``space``."""
    if isinstance(space, gym.spaces.Discrete) and isinstance(action, np.ndarray):
        action = action.item() if action.size == 1 else action
    try:
        return action, bool(space.contains(action))
    except (TypeError, ValueError):
        return action, False


def compile_skippable(builder: Any, agent_nodes: Iterable[str]) -> Any:
    """Compile a copy of ``builder`` whose agent nodes turn :class:`SkipNode` into "no update".

    Used only for counterfactual replays under ``absent="skip"``; the node functions are wrapped
    in place, so LangGraph's argument injection (config, runtime, ...) is unchanged.
    """
    builder = copy.copy(builder)
    builder.nodes = dict(builder.nodes)
    for name in agent_nodes:
        spec = builder.nodes[name]
        runnable = copy.copy(spec.runnable)
        if runnable.func is not None:
            runnable.func = _skippable(runnable.func)
        if getattr(runnable, "afunc", None) is not None:  # an async node
            runnable.afunc = _askippable(runnable.afunc)
        builder.nodes[name] = dataclasses.replace(spec, runnable=runnable)
    return builder.compile()


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
class TraceStep:
    """One decision: who acted, in which superstep, on what observation, with what action."""

    step: int
    superstep: int
    agent: str
    observation: Any
    action: Any


class GraphEnv(ParallelEnv):
    """A scenario's LangGraph graph as a PettingZoo ``ParallelEnv``.

    ``agents`` holds every agent that has been asked for a decision in this episode and has not
    finished; each step's observations cover them all, but only the agents pending in the
    current superstep act (``infos[agent]["acting"]``); other agents' actions are ignored and
    they see their last observation again. Rewards emitted during the run go to their agents
    (team rewards to every agent that has acted); the verifier's terminal team reward reaches
    every agent that acted. A node that raises ends the episode truncated, with the error in
    ``infos[agent]["error"]``; the trace and outcome are kept.

    Args:
        scenario: the scenario to run.
        max_steps: truncate an episode after this many env steps (default: the scenario's
            ``max_supersteps``).
        fast_replay: run counterfactual replays (:meth:`value`) with
            :class:`scenarios.replay.FastGraph` when the graph qualifies: same results, 10–30×
            faster; the first ``FAST_REPLAY_CHECKS`` replays run both ways and a difference
            switches it off with a warning.
        agent_ids: identify agents by the id they pass to ``decide()`` (e.g. each chat model's
            ``EnvChatModel(agent=...)``) instead of by top-level node: id → max concurrent
            instances (``<id>_<i>``), or a list of ids. Agents may then decide anywhere, inside
            subgraphs at any depth; every resulting id must be in ``possible_agents``.
            ``absent="skip"`` needs agents by node.
    """

    metadata: ClassVar[dict[str, Any]] = {
        "name": "graph_env",
        "is_parallelizable": True,
        "render_modes": [],
    }

    def __init__(
        self,
        scenario: Scenario,
        max_steps: int | None = None,
        fast_replay: bool = True,
        *,
        agent_ids: Mapping[str, int] | Iterable[str] | None = None,
    ) -> None:
        self.scenario = scenario
        self.fast_replay = fast_replay
        self.metadata = {**GraphEnv.metadata, "name": scenario.id()}
        self.possible_agents = list(scenario.possible_agents)
        self.agents: list[str] = []
        self.max_steps = max_steps or scenario.max_supersteps
        self.agent_ids = None if agent_ids is None else instance_counts(agent_ids)
        if self.agent_ids is not None:  # agents by id: they may decide inside subgraphs
            unknown = [a for a in agent_id_list(self.agent_ids) if a not in self.possible_agents]
            if unknown:
                raise ScenarioError(
                    f"agent_ids give agents {unknown} that the scenario does not declare "
                    f"(possible_agents={self.possible_agents}): add them or fix agent_ids"
                )
            self.agent_nodes: dict[str, int] = {}
        else:
            topo = scenario.topology
            nested = [n for n in topo.agents if topo.attr(n, "subgraph")]
            if nested:
                raise ScenarioError(
                    f"agent nodes inside subgraphs ({nested[:3]}) cannot be stepped by node: "
                    "run the scenario by agent id (GraphEnv(..., agent_ids=...)), set "
                    "metadata={'flatten': False} on the subgraph node to make it one agent, or "
                    "mark its inner nodes agent=False"
                )
            self.agent_nodes = {n: topo.attr(n, "max_instances") for n in topo.agents}
        self._graph = scenario.build_graph().compile()
        self._skip_graph: Any = None  # compiled on the first replay under absent="skip"
        self._obs_spaces = {a: scenario.observation_space(a) for a in self.possible_agents}
        self._act_spaces = {a: scenario.action_space(a) for a in self.possible_agents}
        self._np_random = np.random.default_rng()
        self._run: GraphRun | None = None
        self._replays: dict[tuple[Any, ...], Outcome] = {}
        self._fast: Any = _UNSET  # the fast replay executor, built on the first replay
        self._fast_checks = FAST_REPLAY_CHECKS
        self.trace: list[TraceStep] = []
        self.outcome: Outcome | None = None
        self.seed_used: int | None = None

    # ----- PettingZoo API ------------------------------------------------------------------
    def observation_space(self, agent: str) -> gym.Space:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._act_spaces[agent]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        if seed is not None:
            self._np_random = np.random.default_rng(seed)
        self.seed_used = int(self._np_random.integers(2**31)) if seed is None else int(seed)
        if self._run is not None and not self._run.finished:
            self._run.abort()
        self._run = self._new_run(self.seed_used)
        self.trace, self.outcome, self._steps = [], None, 0
        self._last_obs: dict[str, Any] = {}
        self._acted: list[str] = []
        self._paid = {"team": 0.0}
        self._acc = dict.fromkeys(self.possible_agents, 0.0)
        pending = self._run.start()
        self._absorb(pending)
        if self._run.finished:  # a graph that asked nobody: an empty episode
            self._finish()
        return self._observe()

    def step(self, actions: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
        run = self._run
        if run is None:
            raise RuntimeError("call reset() before step()")
        if run.finished:
            self.agents = []
            return {}, {}, {}, {}, {}
        chosen: dict[str, Any] = {}
        for agent in run.pending:
            if agent not in actions:
                raise ValueError(
                    f"no action for agent {agent!r}: it is pending in this step (see "
                    "infos[agent]['acting']); pass an action for every agent in env.agents"
                )
            chosen[agent] = self._check_action(agent, actions[agent])
        for agent, action in chosen.items():
            self.trace.append(
                TraceStep(
                    self._steps,
                    run.pending[agent].superstep,
                    agent,
                    run.pending[agent].observation,
                    action,
                )
            )
        self._steps += 1
        pending = run.resume(chosen)
        self._absorb(pending)
        if run.finished:
            self._finish()
        elif self._steps >= self.max_steps:
            run.abort()
            self._finish(truncated=True, error=f"step limit {self.max_steps} reached")
        obs, infos = self._observe()
        rewards = self._rewards()
        done = self._run.finished
        terms = dict.fromkeys(self.agents, done and not self.truncated)
        truncs = dict.fromkeys(self.agents, done and self.truncated)
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    def render(self) -> None:
        return None

    def close(self) -> None:
        if self._run is not None and not self._run.finished:
            self._run.abort()

    def state(self) -> np.ndarray:
        raise NotImplementedError("GraphEnv has no global state array; agents see partial views")

    # ----- internals -----------------------------------------------------------------------
    def _new_run(self, seed: int, skip: bool = False) -> GraphRun:
        inputs = self.scenario.initial_state(np.random.default_rng(seed))
        graph = self._graph
        if skip:
            if self._skip_graph is None:
                self._skip_graph = compile_skippable(self.scenario.build_graph(), self.agent_nodes)
            graph = self._skip_graph
        return GraphRun(
            graph,
            inputs,
            self.agent_nodes if self.agent_ids is None else None,
            {"recursion_limit": self.scenario.max_supersteps + 1},
            agent_ids=self.agent_ids,
        )

    def _absorb(self, pending: Mapping[str, Any]) -> None:
        for agent, req in pending.items():
            if agent not in self._obs_spaces:
                raise ValueError(
                    f"graph asked agent {agent!r} for a decision but the scenario declares "
                    f"agents {self.possible_agents}: fix possible_agents or max_instances"
                )
            self._last_obs[agent] = req.observation
            if agent not in self._acted:
                self._acted.append(agent)
        self.agents = [a for a in self.possible_agents if a in self._acted]

    def _check_action(self, agent: str, action: Any) -> Any:
        space = self._act_spaces[agent]
        action, ok = action_in_space(space, action)
        if ok:
            return action
        penalty = self.scenario.invalid_action_penalty
        if penalty is None:
            raise ValueError(f"invalid action {action!r} for agent {agent!r}: not in {space}")
        self._acc[agent] += penalty
        return self.scenario.default_action(agent)

    def _finish(self, truncated: bool = False, error: str | None = None) -> None:
        run = self._run
        assert run is not None
        self.truncated = truncated or run.error is not None
        self.error = error or (f"{type(run.error).__name__}: {run.error}" if run.error else None)
        if run.error is not None or truncated:
            self.outcome = self.scenario.failure_state(run.result)
        else:
            self.outcome = self.scenario.score(run.result)
            self.truncated = self.outcome.truncated
        self.outcome.reward += run.team_reward

    def _observe(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        run = self._run
        assert run is not None
        obs = {a: self._last_obs[a] for a in self.agents}
        infos: dict[str, dict[str, Any]] = {
            a: {"acting": a in run.pending, "superstep": run.superstep, "seed": self.seed_used}
            for a in self.agents
        }
        if run.finished and self.outcome is not None:
            actions = self.episode_actions()  # what was executed, for exact replays
            for a in self.agents:
                infos[a].update(outcome=self.outcome, error=self.error, actions=actions)
        return obs, infos

    def _rewards(self) -> dict[str, float]:
        run = self._run
        assert run is not None
        team = run.team_reward - self._paid["team"]
        self._paid["team"] = run.team_reward
        out = {}
        for a in self.agents:
            r = team + run.agent_rewards.get(a, 0.0) - self._paid.get(a, 0.0) + self._acc[a]
            self._paid[a] = run.agent_rewards.get(a, 0.0)
            self._acc[a] = 0.0
            if run.finished and self.outcome is not None:
                r += self.outcome.reward - run.team_reward
            out[a] = float(r)
        return out

    # ----- counterfactual replay -----------------------------------------------------------
    def value(
        self,
        seed: int,
        coalition: Iterable[str],
        actions: Mapping[str, list[Any]] | Policy,
        absent: AbsentPolicy | None = None,
    ) -> float:
        """Team return of a replay of episode ``seed`` with only ``coalition`` present.

        Agents in the coalition act as given: ``actions`` maps each agent to the actions it took
        (its k-th decision replays its k-th action; decisions past the recorded ones use the
        scenario's default action) or is a policy ``(agent, obs) -> action``. Agents outside act
        under ``absent`` (default: the scenario's declared policy). Replays are deterministic
        (same seed, same task and random draws) and cached per (seed, coalition, actions).
        """
        members = frozenset(coalition)
        unknown = members - set(self.possible_agents)
        if unknown:
            raise ValueError(
                f"unknown agents {sorted(unknown)} in coalition: use env.possible_agents"
            )
        mode = absent or self.scenario.absent
        if mode == "skip" and self.agent_ids is not None:
            raise ScenarioError(
                "absent='skip' skips an agent's node, but this env identifies agents by id "
                "(agent_ids=...), whose decisions may sit deep inside a node: use "
                "absent='default' or 'placeholder'"
            )
        key = None
        if not callable(actions):
            key = (seed, members, mode, _freeze(actions))
            if key in self._replays:
                return self._replays[key].reward
        outcome = self._replay(seed, members, actions, mode)
        if key is not None:
            self._replays[key] = outcome
        return outcome.reward

    def _replay(
        self, seed: int, members: frozenset[str], actions: Any, mode: AbsentPolicy
    ) -> Outcome:
        act = _Recorder(self._actor(members, actions, mode))
        fast = self._fast_graph()
        if fast is None:
            return self._slow_replay(seed, act, mode)
        if self._fast_checks > 0:  # the truth first, then the same decisions through `fast`
            self._fast_checks -= 1
            outcome = self._slow_replay(seed, act, mode)
            again = _Replayer(act.log)
            try:
                same = _same(outcome, self._fast_replay(fast, seed, again, mode)) and again.same
            except Unsupported:
                same = True  # a run fast replays do not cover: they fall back, as here
            if not same:
                self._fast = None
                warnings.warn(
                    f"fast replays of {self.scenario.id()} differ from LangGraph replays "
                    f"(seed={seed}, coalition={sorted(members)}); replaying through LangGraph",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return outcome
        try:
            return self._fast_replay(fast, seed, act, mode)
        except Unsupported:  # replay through LangGraph, feeding the decisions already made
            return self._slow_replay(seed, _Replayer(act.log, then=act.act), mode)

    def _actor(self, members: frozenset[str], actions: Any, mode: AbsentPolicy) -> Policy:
        """The policy of one replay: coalition members replay ``actions``, others ``mode``."""
        counts: dict[str, int] = {}

        def act(agent: str, obs: Any) -> Any:
            if agent not in members:
                if mode == "skip":
                    return SkipNode
                if mode == "placeholder":
                    return self.scenario.placeholder_action(agent)
                return self.scenario.default_action(agent)
            if callable(actions):
                return actions(agent, obs)
            k = counts.get(agent, 0)
            counts[agent] = k + 1
            seq = actions.get(agent, [])
            return seq[k] if k < len(seq) else self.scenario.default_action(agent)

        return act

    def _fast_graph(self) -> FastGraph | None:
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
            state, team_reward = fast.run(
                inputs,
                act,
                skip_agents=mode == "skip",
                max_decisions=self.max_steps,
                recursion_limit=self.scenario.max_supersteps + 1,
            )
        except DecisionLimit:
            return self.scenario.failure_state(None)
        except RecursionLimit as exc:  # GraphRun keeps the error: a failure with its rewards
            outcome = self.scenario.failure_state(None)
            outcome.reward += exc.team_reward
            return outcome
        outcome = self.scenario.score(state)
        outcome.reward += team_reward
        return outcome

    def _slow_replay(self, seed: int, act: Policy, mode: AbsentPolicy) -> Outcome:
        run = self._new_run(seed, skip=mode == "skip")
        pending = run.start()
        for _ in range(self.max_steps):
            if run.finished:
                break
            pending = run.resume({a: act(a, r.observation) for a, r in pending.items()})
        if not run.finished:
            run.abort()
            return self.scenario.failure_state(None)
        outcome = (
            self.scenario.failure_state(run.result)
            if run.error
            else self.scenario.score(run.result)
        )
        outcome.reward += run.team_reward
        return outcome

    def episode_actions(self) -> dict[str, list[Any]]:
        """The actions each agent took in the current episode, in order (for :meth:`value`)."""
        out: dict[str, list[Any]] = {}
        for t in self.trace:
            out.setdefault(t.agent, []).append(t.action)
        return out


def _freeze(actions: Mapping[str, list[Any]]) -> tuple[Any, ...]:
    def f(x: Any) -> Any:
        return tuple(np.asarray(x).ravel().tolist()) if isinstance(x, np.ndarray) else x

    return tuple(sorted((a, tuple(f(x) for x in seq)) for a, seq in actions.items()))


_UNSET: Any = object()
#: fast replays a GraphEnv checks against LangGraph replays before trusting them
FAST_REPLAY_CHECKS = 16


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
            self.same = self.same and who == agent and _same(seen, obs)
            return action
        if self.then is not None:
            return self.then(agent, obs)
        self.same = False
        return SkipNode


def _same(a: Any, b: Any) -> bool:
    """Exact equality of observations and outcomes (arrays, dataclasses, containers)."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and _same(dataclasses.asdict(a), dataclasses.asdict(b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b, strict=True))
        )
    return bool(a == b)


class InlineBridge:
    """Answers ``decide()`` by calling a policy directly (no environment in between)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.decisions = 0
        self.team_reward = 0.0

    def decide(self, agent: str, observation: Any) -> Any:
        self.decisions += 1
        return self.policy(agent, observation)

    def emit_reward(self, value: float, agents: list[str] | None = None) -> None:
        if agents is None:
            self.team_reward += value


def run_inline(
    scenario: Scenario, policy: Policy, seed: int, graph: Any = None
) -> tuple[dict[str, Any], Outcome, int]:
    """Run one episode with ``policy`` answering every decision inline.

    Returns the final state, the verifier's outcome (``reward`` includes emitted team rewards)
    and the number of decisions. ``graph`` is a compiled graph to reuse across episodes.
    (Fan-out instance ids are not expanded here: ``policy`` sees the name given to ``decide``.)
    """
    graph = graph if graph is not None else scenario.build_graph().compile()
    bridge = InlineBridge(policy)
    state = graph.invoke(
        scenario.initial_state(np.random.default_rng(seed)),
        config={
            "configurable": {BRIDGE_KEY: bridge},
            "recursion_limit": scenario.max_supersteps + 1,
        },
    )
    outcome = scenario.score(state)
    outcome.reward += bridge.team_reward
    return state, outcome, bridge.decisions
