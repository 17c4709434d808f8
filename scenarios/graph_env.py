"""A scenario's LangGraph graph as a Dec-POMDP: :class:`GraphEnv`, stepping live episodes.

Every agent node asks for its decision with :func:`scenarios.decisions.decide`. :class:`GraphEnv`
(a PettingZoo ``ParallelEnv``) runs the graph through :class:`scenarios.bridge.GraphRun` (or,
where it compiles for the fast path, :class:`scenarios.stepped.SteppedRun`) and turns every
superstep's pending decisions into one parallel step. Its counterfactual replays are
:class:`scenarios.env_replays.ReplayAPI`'s; :meth:`GraphEnv.transcript` is
:func:`scenarios.transcript.transcript`.

Nothing fails silently: a graph that cannot run (a node raising, or the wall-clock limit
reached, before any agent acted; or a graph that asks no agent at all) makes ``reset()`` raise
:class:`~scenarios.base.ScenarioError` with the original error chained; later node errors and
timeouts end the episode truncated, with ``infos[agent]["failure"]`` (``"error"``,
``"timeout"`` or ``"limit"``) and ``infos[agent]["error"]`` (the text). A scenario that runs a
program which may fail on its own (``Scenario.counts_early_failures``: an app behind the
gateway) has a node error or timeout before any agent acted counted instead: the episode is
recorded in ``GraphEnv.lost_episodes`` (what the trainer's episode metrics count as a failed
episode) and ``reset()`` starts another of the same seed; :data:`MAX_LOST_IN_A_ROW` such
failures in one ``reset()`` make it raise.

**Wall-clock limit.** ``GraphEnv(episode_timeout_s=...)`` bounds the seconds the graph itself
runs in an episode (:mod:`scenarios.alarm`: a ``SIGALRM`` in the main thread, else a check each
time the graph hands decisions back).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import itertools
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

import greenlet
import gymnasium as gym
import numpy as np
from langgraph.errors import GraphRecursionError
from pettingzoo import ParallelEnv

from scenarios.alarm import Alarm, EpisodeTimeout
from scenarios.args import executed_action, zero_action
from scenarios.base import Outcome, Scenario, ScenarioError
from scenarios.bridge import GraphRun, agent_id_list, instance_counts
from scenarios.clocks import ENV_CLOCK  # time in reset/step (timers/env_s)
from scenarios.engines import DEFAULT_EPISODE_TIMEOUT_S, ENGINE_ENV, ENGINES
from scenarios.env_replays import ReplayAPI
from scenarios.global_state import state_space_of
from scenarios.replay import FastGraph, compile_fast, same
from scenarios.stepped import SteppedRun
from scenarios.tool_latency import TOOLS_KEY, ToolEpisode, ToolSettings
from scenarios.transcript import transcript


def _unrunnable(exc: BaseException) -> bool:
    """``exc`` says a greenlet can no longer be switched to (finalized, or another thread's)."""
    text = str(exc)
    return isinstance(exc, greenlet.error) or "greenlet is being finalized" in text


def blank_observation(space: gym.Space) -> Any:
    """What an agent the graph never asked observes: the element of ``space`` nearest zero
    (for spaces without one, the first sample of a copy seeded with 0)."""
    if isinstance(space, gym.spaces.Box):
        zeros = np.zeros(space.shape, space.dtype)
        return np.clip(zeros, space.low, space.high).astype(space.dtype)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return np.array(space.start, dtype=space.dtype)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiBinary)):
        return zero_action(space)
    if isinstance(space, gym.spaces.Dict):
        return {k: blank_observation(v) for k, v in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(blank_observation(v) for v in space.spaces)
    seeded = copy.deepcopy(space)
    seeded.seed(0)
    return seeded.sample()


#: episodes in a row that may fail before any agent acted (``Scenario.counts_early_failures``)
#: in one :meth:`GraphEnv.reset` before it raises
MAX_LOST_IN_A_ROW = 8


@dataclasses.dataclass
class LostEpisode:
    """An episode that failed before any agent acted, counted rather than raised
    (``Scenario.counts_early_failures``): its seed, ``failure`` (``"error"`` or ``"timeout"``),
    error text and the scenario's failure outcome."""

    seed: int | None
    failure: str
    error: str
    outcome: Outcome


@dataclasses.dataclass
class TraceStep:
    """One decision: who acted, in which superstep, on what observation, with what action."""

    step: int
    superstep: int
    agent: str
    observation: Any
    action: Any


class GraphEnv(ReplayAPI, ParallelEnv):
    """A scenario's LangGraph graph as a PettingZoo ``ParallelEnv``.

    PettingZoo's contract: every live agent is stepped at once, an agent that finished never
    comes back, and an episode ends with every possible agent terminated or truncated. Here an
    agent is live from its first decision to the end of the episode, or to the step in which
    the graph says it left (:func:`scenarios.leave`: that step reports it terminated, or
    truncated, and it is neither paid nor asked again); each step's dicts cover
    every live agent, but only the agents pending in the current superstep act
    (``infos[agent]["acting"]``): a waiting agent's action has no effect and it sees its last
    observation again. When the graph ends, agents it never asked join for one closing step
    (a blank observation, reward 0) so that they finish too. Rewards emitted during the run go
    to their agents (team rewards to every live agent that has acted); the verifier's terminal
    team reward reaches every agent that acted and did not leave. A node that raises, the
    wall-clock limit and the step limit end the episode truncated, with
    ``infos[agent]["failure"]`` (``"error"``, ``"timeout"``, ``"limit"``) and
    ``infos[agent]["error"]``; the trace and outcome are kept.
    A graph that cannot run (see the module doc) raises :class:`ScenarioError` at
    :meth:`reset`.

    After an episode, :attr:`final_state` is the graph's final state (``None`` when the run
    failed), :attr:`outcome` the verifier's outcome and :meth:`transcript` a readable record.

    Args:
        scenario: the scenario to run.
        max_steps: truncate an episode after this many env steps (default: the scenario's
            ``max_supersteps``).
        fast_replay: run counterfactual replays (:meth:`value`) with
            :class:`scenarios.replay.FastGraph` when the graph qualifies: same results, 10–30×
            faster; the first ``FAST_REPLAY_CHECKS`` replays run both ways and a difference
            switches it off with a warning.
        episode_timeout_s: wall-clock seconds the graph may run in one episode (see the module
            doc); ``None``: no limit.
        agent_ids: identify agents by the id they pass to ``decide()`` (e.g. each chat model's
            ``EnvChatModel(agent=...)``) instead of by top-level node: id → max concurrent
            instances (``<id>_<i>``), or a list of ids. Agents may then decide anywhere, inside
            subgraphs at any depth; every resulting id must be in ``possible_agents``.
            ``absent="skip"`` needs agents by node. Default: by id for a scenario that sets
            ``agents_by_id`` (its topology's agent nodes and their ``max_instances``), else by
            node.
        engine: how live episodes run (:data:`ENGINES`): ``"auto"`` steps the graph with
            :class:`scenarios.stepped.SteppedRun` (no LangGraph runtime: the same episodes,
            ~3× faster) where it compiles for the fast path, else through LangGraph;
            ``"langgraph"`` always through LangGraph; ``"fast"`` like auto but a graph that
            does not compile raises :class:`ScenarioError`; ``"check"`` runs every episode both
            ways and raises :class:`ScenarioError` at the first observation, reward,
            termination or info that differs (for tests). Default: ``$MARL_ENGINE`` or auto.
        rewards: composed reward sources (a :class:`scenarios.reward_sources.RewardSources`)
            paying the episodes' rewards; ``None``: the verifier's reward as it is.
        tools: tool latency and timeouts of live episodes
            (:class:`scenarios.tool_latency.ToolSettings`); ``None``: tools run as they are.

    ``engine``, ``episode_timeout_s``, ``rewards`` and ``tools`` stay settable between episodes.
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
        episode_timeout_s: float | None = DEFAULT_EPISODE_TIMEOUT_S,
        *,
        agent_ids: Mapping[str, int] | Iterable[str] | None = None,
        engine: str | None = None,
        rewards: Any = None,
        tools: ToolSettings | None = None,
    ) -> None:
        self.engine = engine or os.environ.get(ENGINE_ENV) or "auto"
        if episode_timeout_s is not None and not episode_timeout_s > 0:
            raise ValueError(
                f"episode_timeout_s must be > 0 seconds or None (no limit), got {episode_timeout_s}"
            )
        self.episode_timeout_s = episode_timeout_s
        self.scenario = scenario
        self.fast_replay = fast_replay
        self.metadata = {**GraphEnv.metadata, "name": scenario.id()}
        self.possible_agents = list(scenario.possible_agents)
        self.agents: list[str] = []
        self.max_steps = max_steps or scenario.max_supersteps
        if agent_ids is None and scenario.agents_by_id:
            topo = scenario.topology
            agent_ids = {n: topo.attr(n, "max_instances") for n in topo.agents}
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
        self._init_replays()
        self._obs_spaces = {a: scenario.observation_space(a) for a in self.possible_agents}
        #: the space of :meth:`state` (``None``: the scenario has no global state)
        self.state_space = state_space_of(scenario)
        self._act_spaces = {a: scenario.action_space(a) for a in self.possible_agents}
        self._np_random = np.random.default_rng()
        self._run: GraphRun | SteppedRun | None = None
        self.trace: list[TraceStep] = []
        self.outcome: Outcome | None = None
        self.seed_used: int | None = None
        #: the graph's final state of the last episode (``None`` when it failed or is running)
        self.final_state: dict[str, Any] | None = None
        self.truncated = False
        #: how the last episode failed: ``"error"``, ``"timeout"``, ``"limit"`` or ``None``
        self.failure: str | None = None
        self.error: str | None = None
        #: the rewards each env step of the last episode paid (agent → reward)
        self.step_rewards: list[dict[str, float]] = []
        self._graph_s = 0.0  # seconds the graph has run in this episode
        self._alarm: Alarm | None = None  # the alarm of the reset/step in progress
        self._timeout: EpisodeTimeout | None = None
        #: composed reward sources (:mod:`scenarios.reward_sources`); ``None``: the verifier's
        #: reward as it is
        self.rewards: Any = rewards
        #: tool latency and timeouts of live episodes (:mod:`scenarios.tool_latency`); ``None``:
        #: tools run as they are. ``tool_episode``: the current episode's calls (None: no tools)
        self.tools: ToolSettings | None = tools
        self.tool_episode: ToolEpisode | None = None
        #: episodes that failed before any agent acted where the scenario counts such failures
        #: (``Scenario.counts_early_failures``): :meth:`reset` started another one; whoever
        #: reports episodes drains the list (the trainer's episode metrics do)
        self.lost_episodes: list[LostEpisode] = []

    @property
    def engine(self) -> str:
        """How live episodes run (see the class doc); settable between episodes."""
        return self._engine

    @engine.setter
    def engine(self, value: str) -> None:
        if value not in ENGINES:
            raise ScenarioError(
                f"engine must be one of {', '.join(ENGINES)}, got {value!r} (GraphEnv(engine=...) "
                f"or ${ENGINE_ENV})"
            )
        self._engine = value
        self._stepper: Any = _UNSET  # the FastGraph live episodes step through (None: LangGraph)
        self._twin: GraphEnv | None = None  # the LangGraph env an engine check compares with

    # ----- PettingZoo API ------------------------------------------------------------------
    def observation_space(self, agent: str) -> gym.Space:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._act_spaces[agent]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        start = time.perf_counter()
        try:
            out = self._reset(seed, options)
            twin = self._check_twin()
            if twin is not None:
                self._compare("reset", out, twin._reset(self.seed_used, options))
        finally:
            ENV_CLOCK.add(time.perf_counter() - start)
        return out

    def step(self, actions: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
        start = time.perf_counter()
        try:
            out = self._step(actions)
            if self._twin is not None:
                self._compare(f"step {self._steps}", out, self._twin._step(actions))
        finally:
            ENV_CLOCK.add(time.perf_counter() - start)
        return out

    def _reset(
        self, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        if seed is not None:
            self._np_random = np.random.default_rng(seed)
        self.seed_used = int(self._np_random.integers(2**31)) if seed is None else int(seed)
        if self._run is not None and not self._run.finished:
            self._run.abort()
        for attempt in itertools.count(1):
            pending = self._start_episode()
            if not self._run.finished:
                break
            if not self._counts_early_failure():
                self._cannot_run()
            self._lose_episode(attempt)
        self._absorb(pending)
        return self._observe(self.agents)

    def _start_episode(self) -> dict[str, Any]:
        """Start episode :attr:`seed_used`'s graph and run it to its first decisions."""
        self.tool_episode = None if self.tools is None else self.tools.episode(self.seed_used)
        self._run = self._episode_run(self.seed_used)
        self.trace, self.outcome, self._steps = [], None, 0
        self.final_state, self.truncated, self.failure, self.error = None, False, None, None
        self.step_rewards, self._graph_s, self._timeout = [], 0.0, None
        self._last_obs: dict[str, Any] = {}
        self._acted: list[str] = []
        self._gone: set[str] = set()  # agents that left (scenarios.leave), already reported
        self._paid = {"team": 0.0}
        self._acc = dict.fromkeys(self.possible_agents, 0.0)
        if self.rewards is not None:
            self.rewards.start()
        return self._advance(self._run.start, first=True)

    def _counts_early_failure(self) -> bool:
        """The graph ended before any agent acted in a way the scenario counts as a failed
        episode (``Scenario.counts_early_failures``: a node raised or timed out)."""
        run = self._run
        assert run is not None
        failed = self._timeout is not None or run.error is not None
        return failed and self.scenario.counts_early_failures

    def _lose_episode(self, attempt: int) -> None:
        """Record the episode that failed before any agent acted (:attr:`lost_episodes`) and
        let :meth:`reset` start another one of the same seed; raise once
        :data:`MAX_LOST_IN_A_ROW` in a row failed so."""
        run = self._run
        assert run is not None
        if self._timeout is not None:
            failure, error = "timeout", str(self._timeout)
        else:
            failure, error = "error", _error_text(run.error)
        outcome = self.scenario.failure_state(None)
        self.lost_episodes.append(LostEpisode(self.seed_used, failure, error, outcome))
        if attempt >= MAX_LOST_IN_A_ROW:
            raise ScenarioError(
                f"{self.scenario.id()} (episode seed {self.seed_used}): {attempt} episodes in a "
                f"row failed before any agent acted, so no episode can run; the last one: "
                f"{error}. Fix what fails there (each was counted as a failed episode)"
            ) from (self._timeout or run.error)

    def _step(self, actions: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
        run = self._run
        if run is None:
            raise RuntimeError("call reset() before step()")
        if run.finished:
            return self._close()
        chosen: dict[str, Any] = {}
        pending = run.pending
        for agent in pending:
            if agent not in actions:
                raise ValueError(
                    f"no action for agent {agent!r}: it is pending in this step (see "
                    "infos[agent]['acting']); pass an action for every agent in env.agents"
                )
            chosen[agent] = self._check_action(agent, actions[agent])
        for agent, action in chosen.items():
            req = pending[agent]
            self.trace.append(TraceStep(self._steps, req.superstep, agent, req.observation, action))
        self._steps += 1
        pending = self._advance(lambda: run.resume(chosen))
        self._absorb(pending)
        if self.rewards is not None:  # per-turn sources pay the agents that acted, now
            turns = self.trace[len(self.trace) - len(chosen) :]
            for agent, r in self.rewards.on_turns(
                self.scenario, run.inputs, turns, self.seed_used
            ).items():
                self._acc[agent] += r
        if run.finished:
            self._finish()
        elif self._steps >= self.max_steps:
            run.abort()
            self._finish(truncated=True, error=f"step limit {self.max_steps} reached")
        obs, infos = self._observe(self.agents)
        rewards = self._rewards()
        self.step_rewards.append(rewards)
        done = run.finished
        left = run.left  # agents that left end by their own flag, the others as the episode
        terms = {a: not left[a] if a in left else done and not self.truncated for a in self.agents}
        truncs = {a: left.get(a, done and self.truncated) for a in self.agents}
        if not done:
            gone = [a for a in self.agents if a in left]
            if gone:  # reported once, in this step; never paid or asked again
                self._gone.update(gone)
                self.agents = [a for a in self.agents if a not in left]
            return obs, rewards, terms, truncs, infos
        self.agents = [a for a in self.possible_agents if a not in self._acted]
        late_obs, late_infos = self._observe(self.agents)  # they finish in the closing step
        flags = dict.fromkeys(self.agents, False)
        return (
            {**obs, **late_obs},
            {**rewards, **dict.fromkeys(self.agents, 0.0)},
            {**terms, **flags},
            {**truncs, **flags},
            {**infos, **late_infos},
        )

    @property
    def finished(self) -> bool:
        """The graph has finished this episode (the closing step may still be due)."""
        return self._run is not None and self._run.finished

    def render(self) -> None:
        return None

    def close(self) -> None:
        """Abort an unfinished episode. Where its greenlets cannot run any more (interpreter
        shutdown, when RLlib's vector env closes its envs from ``__del__``; or another thread)
        the run is dropped with them: there is nothing left to clean up or report."""
        if self._run is not None and not self._run.finished:
            try:
                self._run.abort()
            except (greenlet.error, RuntimeError) as exc:
                if not _unrunnable(exc):
                    raise
        if self._twin is not None:
            self._twin.close()

    def state(self) -> np.ndarray:
        """The global state, what centralised critics read and actors never do
        (:mod:`scenarios.global_state`): the value the graph last declared with
        :func:`scenarios.emit_state` where it emits one (a wrapped PettingZoo env: its
        ``state()``), else :meth:`Scenario.global_state <scenarios.base.Scenario.global_state>`
        of every agent's latest observation.

        Raises:
            NotImplementedError: the scenario has no global state (its ``state_space`` is None:
                text agents, or observations that are not all ``Box``es).
        """
        if self.state_space is None:
            raise NotImplementedError(
                f"{self.scenario.id()} has no global state (its state_space is None: text agents "
                "or non-Box observations): declare Scenario.global_state and state_space"
            )
        emitted = None if self._run is None else self._run.global_state
        if emitted is not None:
            return np.asarray(emitted, np.float32).reshape(-1)
        return self.scenario.global_state(getattr(self, "_last_obs", {}))

    # ----- internals -----------------------------------------------------------------------
    def stepped_graph(self) -> FastGraph | None:
        """The fast graph live episodes step through (None: they run through LangGraph)."""
        if self._stepper is _UNSET:
            fast = None
            if self.engine != "langgraph":
                fast = compile_fast(self.scenario.build_graph(), self.agent_nodes, self.agent_ids)
            if fast is None and self.engine == "fast":
                raise ScenarioError(
                    f"engine='fast' but the graph of {self.scenario.id()} does not compile for "
                    "the fast path (async nodes, subgraphs, injected config, node policies or "
                    "custom channels: see scenarios.replay.compile_fast): use engine 'auto' or "
                    "'langgraph' (episodes.engine)"
                )
            self._stepper = fast
        return self._stepper  # type: ignore[no-any-return]

    def _episode_run(self, seed: int) -> GraphRun | SteppedRun:
        fast = self.stepped_graph()
        tools = self.tool_episode
        if fast is None:
            return self._new_run(seed, tools=tools)
        return SteppedRun(
            fast,
            self.scenario.initial_state(np.random.default_rng(seed)),
            self.scenario.max_supersteps + 1,
            fallback=functools.partial(self._new_run, seed, tools=tools),
            uncounted=self._uncounted,
            tools=tools,
            keep_latest=self.scenario.scores_limit_episodes,
            errors_end_run=self.scenario.node_errors_end_episode,
        )

    @contextlib.contextmanager
    def _uncounted(self) -> Iterator[None]:
        """Time the episode's wall-clock limit does not count (a fallback's replay)."""
        start = time.monotonic()
        alarm, tools = self._alarm, self.tool_episode
        try:
            with (
                alarm.paused() if alarm is not None else contextlib.nullcontext(),
                tools.paused() if tools is not None else contextlib.nullcontext(),
            ):
                yield
        finally:
            self._graph_s -= time.monotonic() - start

    def _check_twin(self) -> GraphEnv | None:
        """Under ``engine="check"``: the LangGraph env run beside this one (None: no check, or
        nothing to compare: the graph runs through LangGraph here too)."""
        if self.engine != "check" or self.stepped_graph() is None:
            return None
        if self._twin is None:
            self._twin = GraphEnv(
                self.scenario,
                self.max_steps,
                self.fast_replay,
                self.episode_timeout_s,
                agent_ids=self.agent_ids,
                engine="langgraph",
                # its own per-episode reward state; the sources themselves (judges) are shared
                rewards=copy.copy(self.rewards),
            )
        self._twin.episode_timeout_s = self.episode_timeout_s
        self._twin.tools = self.tools
        return self._twin

    def _compare(self, where: str, fast: tuple[Any, ...], truth: tuple[Any, ...]) -> None:
        names = ("observations", "rewards", "terminations", "truncations", "infos")
        for name, a, b in zip(names, fast, truth, strict=False):
            if not same(a, b):
                raise ScenarioError(
                    f"engine check: the fast path's {name} differ from LangGraph's at {where} of "
                    f"{self.scenario.id()} (episode seed {self.seed_used}): fast {a!r}, "
                    f"langgraph {b!r}; run it with engine='langgraph' and report the graph"
                )

    def _new_run(self, seed: int, tools: ToolEpisode | None = None, graph: Any = None) -> GraphRun:
        """A LangGraph run of episode ``seed`` (``graph``: a replay's own compiled graph)."""
        inputs = self.scenario.initial_state(np.random.default_rng(seed))
        graph = self._graph if graph is None else graph
        config: dict[str, Any] = {"recursion_limit": self.scenario.max_supersteps + 1}
        if tools is not None:  # a live episode's tool calls (replays run without)
            config["configurable"] = {TOOLS_KEY: tools}
        return GraphRun(
            graph,
            inputs,
            self.agent_nodes if self.agent_ids is None else None,
            config,
            agent_ids=self.agent_ids,
            keep_latest=self.scenario.scores_limit_episodes,
        )

    def _advance(self, call: Callable[[], dict[str, Any]], first: bool = False) -> dict[str, Any]:
        """Run the graph to its next decisions (``call``) under the episode's wall-clock limit.

        On a timeout the run is aborted, :attr:`_timeout` says why and nobody is pending. With
        ``first`` (the reset) a limit found spent only after the graph handed decisions back is
        left to the next step, which ends the episode without running the graph again.
        """
        run = self._run
        assert run is not None
        limit = self.episode_timeout_s
        if limit is None:
            try:
                return call()
            except EpisodeTimeout as exc:  # a node's own limit (e.g. an app episode's timeout_s)
                self._timeout = exc
                return {}
        if self._graph_s >= limit:  # spent between decisions: do not run the graph again
            self._timeout = EpisodeTimeout(self._limit_text("between decisions"))
            run.abort()
            return {}
        alarm = self._alarm = Alarm(limit - self._graph_s, self._limit_text, greenlet.getcurrent())
        start = time.monotonic()
        try:
            try:
                with alarm:
                    pending = call()
            finally:
                self._graph_s += time.monotonic() - start
                self._alarm = None
        except EpisodeTimeout as exc:  # the alarm interrupted a node
            self._timeout = exc
            run.abort()
            return {}
        if not (alarm.fired or self._graph_s >= limit) or (first and not run.finished):
            return pending
        # over the limit without an interrupted node: no alarm here (not the main thread), a
        # node that swallowed it, or a graph that finished late; the episode still timed out
        self._timeout = EpisodeTimeout(
            self._limit_text(None if alarm.fired else "between decisions")
        )
        self._timeout.__cause__ = run.error
        if not run.finished:
            run.abort()
        return {}

    def _limit_text(self, node: str | None) -> str:
        where = f" in node {node!r}" if node and node != "between decisions" else ""
        checked = " (checked between decisions)" if node == "between decisions" else ""
        return (
            f"episode wall-clock limit of {self.episode_timeout_s:g} s (episode_timeout_s) "
            f"reached{where}{checked}"
        )

    def _cannot_run(self) -> None:
        """The graph ended before any agent acted: raise, naming the node and the fix."""
        run = self._run
        assert run is not None
        where = f"{self.scenario.id()} (episode seed {self.seed_used})"
        if self._timeout is not None:
            raise ScenarioError(
                f"{where}: {self._timeout} before any agent acted: fix the node that hangs, or "
                "raise episode_timeout_s (episodes.timeout_s in an experiment) if it is only slow"
            ) from self._timeout
        if run.error is not None:
            raise ScenarioError(
                f"{where}: {_error_text(run.error)} before any agent acted, so the graph cannot "
                "run: fix that node (or the scenario's initial_state, if the graph's input is "
                "wrong); the original error is chained"
            ) from run.error
        raise ScenarioError(
            f"{where}: the graph finished without asking any agent for a decision, so there is "
            "no episode to learn from: agent nodes must call scenarios.decide(agent, "
            "observation), and the graph must reach one from START (leave tasks that need no "
            "decision out of initial_state)"
        )

    def _absorb(self, pending: Mapping[str, Any]) -> None:
        left = self._run.left if self._run is not None else {}
        for agent, req in pending.items():
            if agent not in self._obs_spaces:
                raise ValueError(
                    f"graph asked agent {agent!r} for a decision but the scenario declares "
                    f"agents {self.possible_agents}: fix possible_agents or max_instances"
                )
            if agent in left:
                raise ValueError(
                    f"graph asked agent {agent!r} for a decision after it left the episode "
                    "(scenarios.leave): route only the agents still in it"
                )
            self._last_obs[agent] = req.observation
            if agent not in self._acted:
                self._acted.append(agent)
        self.agents = [a for a in self.possible_agents if a in self._acted and a not in self._gone]

    def _check_action(self, agent: str, action: Any) -> Any:
        executed, ok = executed_action(self.scenario, agent, action)
        if not ok:
            penalty = self.scenario.invalid_action_penalty
            if penalty is None:
                raise ValueError(
                    f"invalid action {action!r} for agent {agent!r}: not in "
                    f"{self._act_spaces[agent]}"
                )
            self._acc[agent] += penalty
        return executed

    def _finish(self, truncated: bool = False, error: str | None = None) -> None:
        run = self._run
        assert run is not None
        self.final_state = run.result  # None when the graph raised or was aborted
        if self._timeout is not None:
            self.failure, self.error = "timeout", str(self._timeout)
        elif run.error is not None:
            limit = isinstance(run.error, GraphRecursionError)
            self.failure, self.error = ("limit" if limit else "error"), _error_text(run.error)
        elif truncated:
            self.failure, self.error = "limit", error
        else:
            self.failure, self.error = None, None
        self.truncated = self.failure is not None
        if self.failure == "limit":  # recursion limit or decision cap: the state reached
            self.outcome = self.scenario.limit_state(run.latest)
        elif self.truncated:
            self.outcome = self.scenario.failure_state(self.final_state)
        else:
            self.outcome = self.scenario.score(run.result)
            self.truncated = self.outcome.truncated
        self.outcome.reward += run.team_reward
        if self.rewards is not None:
            self.outcome = self.rewards.on_end(
                self.scenario,
                self.final_state,
                self.outcome,
                self.trace,
                self._acted,
                failed=self.failure is not None,
                seed=self.seed_used,
            )

    def _observe(self, agents: list[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        run = self._run
        assert run is not None
        obs = {
            a: self._last_obs[a] if a in self._last_obs else blank_observation(self._obs_spaces[a])
            for a in agents
        }
        pending, superstep, seed = run.pending, run.superstep, self.seed_used
        infos: dict[str, dict[str, Any]] = {
            a: {"acting": a in pending, "superstep": superstep, "seed": seed} for a in agents
        }
        if run.finished and self.outcome is not None:
            actions = self.episode_actions()  # what was executed, for exact replays
            for a in agents:
                infos[a].update(
                    outcome=self.outcome, error=self.error, failure=self.failure, actions=actions
                )
                if self.rewards is not None:
                    infos[a].update(self.rewards.infos(a))
        return obs, infos

    def _close(self) -> tuple[dict[str, Any], ...]:
        """The closing step: agents the graph never asked finish as the episode did."""
        late, self.agents = self.agents, []
        obs, infos = self._observe(late)
        return (
            obs,
            dict.fromkeys(late, 0.0),
            dict.fromkeys(late, not self.truncated),
            dict.fromkeys(late, self.truncated),
            infos,
        )

    def _rewards(self) -> dict[str, float]:
        run = self._run
        assert run is not None
        paid, acc, earned, team_reward = self._paid, self._acc, run.agent_rewards, run.team_reward
        team = team_reward - paid["team"]
        paid["team"] = team_reward
        end = run.finished and self.outcome is not None
        out = {}
        for a in self.agents:
            mine = earned.get(a, 0.0)
            r = team + mine - paid.get(a, 0.0) + acc[a]
            paid[a] = mine
            acc[a] = 0.0
            if end:
                r += self.outcome.reward - team_reward  # type: ignore[union-attr]
            out[a] = float(r)
        return out

    def transcript(self) -> dict[str, Any]:
        """The last episode as plain JSON-safe data (:func:`scenarios.transcript.transcript`)."""
        return transcript(self)

    def episode_actions(self) -> dict[str, list[Any]]:
        """The actions each agent took in the current episode, in order (for :meth:`value`)."""
        out: dict[str, list[Any]] = {}
        for t in self.trace:
            out.setdefault(t.agent, []).append(t.action)
        return out


_TASK_NOTE = re.compile(r"During task with name '([^']*)'")


def _error_text(exc: BaseException) -> str:
    """``node 'x' raised Type: message`` (the node from LangGraph's note on the exception)."""
    node = next(
        (m.group(1) for n in getattr(exc, "__notes__", ()) if (m := _TASK_NOTE.search(n))),
        None,
    )
    text = f"{type(exc).__name__}: {exc}"
    return f"node {node!r} raised {text}" if node else text


_UNSET: Any = object()

__all__ = ["MAX_LOST_IN_A_ROW", "GraphEnv", "LostEpisode", "TraceStep", "blank_observation"]
