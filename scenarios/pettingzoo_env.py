"""Any PettingZoo environment as a scenario: ``scenario: package.module:factory``.

A scenario reference (:mod:`scenarios.registry`) may name a function or class that returns a
PettingZoo ``ParallelEnv`` (or an ``AECEnv``, converted with PettingZoo's ``aec_to_parallel``);
the registry wraps what it returns in :class:`PettingZooScenario`, so the env trains through the
same config, CLI (``marl run mpe2.simple_spread_v3:parallel_env``), sweeps and evaluation as a
LangGraph scenario. ``scenario_kwargs`` are the factory's keyword arguments (for mpe2:
``N``, ``max_cycles``, ``local_ratio``, ``continuous_actions``...); the factory is called again
for every episode, in every process (env runners rebuild the scenario by importing it).

Graph: ``START → env`` (the plain node :data:`ENV_NODE` resets the env with the episode's seed)
``→`` every live agent in one superstep (each calls ``decide(agent, its own observation)``)
``→ env`` (steps the env with the joint action, emits the step's rewards) ``→`` the agents still
live, or ``END`` once the env has no live agent. So all the env's agents act each step.
(A turn-based ``AECEnv`` is stepped natively instead: :mod:`scenarios.pz_aec`.)

* **Spaces** (:mod:`scenarios.pz_spaces`): the scenario declares each agent's observations as
  a flat ``float32`` ``Box`` (``Discrete``/``MultiDiscrete`` one-hot, ``MultiBinary`` bits,
  ``Dict``/``Tuple`` concatenated, images flattened) or, where the observation or the reset's
  ``info`` carries an ``action_mask``, as ``Dict(observations=Box, action_mask=Box)``; actions
  as ``Discrete``/``MultiDiscrete``/``Box`` (``MultiBinary(n)`` as ``MultiDiscrete([2] * n)``),
  converted back for the env. A space that cannot be trained raises
  :class:`~scenarios.pz_spaces.UnsupportedSpace` at build (``marl run`` exits 2 before Ray).
* **Agents**: ``possible_agents`` is the universe; each step routes ``env.agents`` (an agent
  absent this episode is never asked; one that joins is asked from its first step). An agent
  that terminates or is truncated while others go on leaves (:func:`scenarios.leave`): its
  last step reports its own flag with its last reward, and it is never paid or asked again.

* **Seeds**: episode seed ``s`` (``GraphEnv.reset(seed=s)``) resets the env with
  ``reset(seed=env_seed(default_rng(s)))``: the same seed gives the same episode.
* **Global state**: where the env has ``state()`` (``state_space``, or a ``state()`` that
  answers after a reset), the env node declares ``env.state()`` (flattened to ``float32``) with
  :func:`~scenarios.emit_state` after every reset and step: ``GraphEnv.state()`` (and
  ``RLlibGraphEnv.state()`` or its ``global_state`` infos) returns it, for centralised critics.
  A ``state`` that is not a method (rps keeps a dict there) means no global state; a
  ``state()`` that raises, or a state space without a flat form, too, said once in a warning.
* **Roles and pools** come from agent names: a trailing ``_<n>`` is stripped (:func:`role_of`:
  ``adversary_0`` → role and pool ``adversary``, ``speaker_0`` → ``speaker``), so agents of one
  kind share parameters by default.
* **Rewards** are the env's, every step: with ``reward="env"`` (default) each agent receives
  exactly its own reward (the env node emits the mean over the step's agents as the team
  stream, which reaches only agents still in the episode, plus each agent's deviation from
  it, as :mod:`scenarios.spread` does); with ``reward="team"`` every live agent receives the
  mean. The episode's team return (``Outcome.reward``, metric ``return``) is the sum over
  steps of the mean reward; ``<agent>/return`` (for the episode's agents) and ``sum_return``
  (Σ over agents) are reported too. Credit ``team`` keeps these rewards; credit ``local``
  gives each agent its own return (``Outcome.local``): with ``reward="env"`` that is already
  what it receives, with ``reward="team"`` its own return replaces the team's at the end.
* **No exact replay**: a wrapped env's dynamics are not ours to re-run, so ``exact_replay`` is
  False and counterfactual credit (``loo``, ``shapley``) is refused with
  :class:`~scenarios.base.ReplayUnavailable` (by ``GraphEnv.value``) and by the trainer's
  config check.
* Episodes end when the env has no live agent; they are truncated (time limit, as mpe2's
  ``max_cycles``) when every agent's last flag was a truncation, else terminated; each agent's
  own flag is what RLlib records for it (a truncated agent bootstraps from ``V(s_T)`` in every
  learner: :mod:`trainers.learners.time_limits`). Without ``max_cycles`` (a factory argument
  or the env's attribute) an episode may last :data:`DEFAULT_MAX_CYCLES` steps.

Example:
    >>> from scenarios.registry import build
    >>> s = build("mpe2.simple_spread_v3:parallel_env", N=2, max_cycles=5)
    >>> s.possible_agents, s.topology.roles["agent_1"]
    (['agent_0', 'agent_1'], 'agent')
"""

from __future__ import annotations

import re
import warnings
from typing import Annotated, Any, TypedDict

import gymnasium as gym
import numpy as np
from langgraph.graph import StateGraph

from scenarios.base import Outcome, Scenario, ScenarioError
from scenarios.decisions import decide, emit_reward, emit_state, leave
from scenarios.declared import DeclaredSpaces
from scenarios.pz_matches import match_metrics
from scenarios.pz_spaces import (
    MASK_KEY,
    UnsupportedSpace,
    convert_action_space,
    convert_observation_space,
    flat_space,
    flattener,
    is_image,
)
from topologies import END, START, Topology
from topologies.generators import merge_routes

#: the plain node that resets and steps the env (not an agent; an agent may not take the name)
ENV_NODE = "pettingzoo_env"
REWARDS = ("env", "team")
#: env steps an episode may last when the env does not say (``max_cycles``)
DEFAULT_MAX_CYCLES = 10_000

#: mpe2's tasks as scenario references (``marl scenarios`` lists them); each takes mpe2's own
#: keyword arguments as ``scenario_kwargs`` (discrete actions unless ``continuous_actions``).
MPE2_TASKS: dict[str, str] = {
    "mpe2.simple_v3:parallel_env": "one agent reaches a landmark",
    "mpe2.simple_spread_v3:parallel_env": "N agents cover N landmarks, avoid collisions",
    "mpe2.simple_reference_v3:parallel_env": "two agents tell each other their goal landmark",
    "mpe2.simple_speaker_listener_v4:parallel_env": "a speaker guides a listener to a landmark",
    "mpe2.simple_adversary_v3:parallel_env": "agents hide the goal from an adversary",
    "mpe2.simple_crypto_v3:parallel_env": "encrypted messages against an eavesdropper",
    "mpe2.simple_push_v3:parallel_env": "an adversary pushes an agent off its landmark",
    "mpe2.simple_tag_v3:parallel_env": "predators chase a faster prey",
    "mpe2.simple_world_comm_v3:parallel_env": "tag with a leader, forests and food",
    "mpe2.simple_line_v1:parallel_env": "agents form a line",
    "mpe2.simple_formation_v1:parallel_env": "agents form a shape around a landmark",
    "mpe2.collect_treasure_v1:parallel_env": "collectors and banks share treasure",
}

_SUFFIX = re.compile(r"_\d+$")


def role_of(agent: str) -> str:
    """The role (and default pool) of a PettingZoo agent name: a trailing ``_<n>`` stripped.

    >>> role_of("adversary_0"), role_of("agent_12"), role_of("speaker")
    ('adversary', 'agent', 'speaker')
    """
    return _SUFFIX.sub("", agent) or agent


def is_pettingzoo_env(obj: Any) -> bool:
    """Whether ``obj`` is a PettingZoo ``ParallelEnv`` or ``AECEnv`` (possibly wrapped)."""
    from pettingzoo import AECEnv, ParallelEnv

    return isinstance(obj, (ParallelEnv, AECEnv))


def as_parallel(env: Any) -> Any:
    """``env`` as a ``ParallelEnv`` (an ``AECEnv`` through PettingZoo's ``aec_to_parallel``)."""
    from pettingzoo import AECEnv
    from pettingzoo.utils.conversions import aec_to_parallel

    return aec_to_parallel(env) if isinstance(env, AECEnv) else env


def env_seed(rng: np.random.Generator) -> int:
    """The seed given to the env's ``reset`` for an episode whose randomness is ``rng``."""
    return int(rng.integers(0, 2**31 - 1))


def merge_actions(left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    """Reducer of ``actions``: agents add theirs; ``None`` (written by the env node) clears."""
    return {} if right is None else {**(left or {}), **right}


class PZState(TypedDict, total=False):
    """Graph state of one episode (``env`` is that episode's own env)."""

    env: Any
    env_seed: int
    obs: dict[str, Any]
    actions: Annotated[dict[str, Any], merge_actions]
    route: Annotated[dict[str, list[str]], merge_routes]
    t: int
    team_return: float
    agent_returns: dict[str, float]
    truncated: bool


class PettingZooScenario(DeclaredSpaces, Scenario):
    """A PettingZoo env, made by ``factory(**env_kwargs)``, as a scenario (see the module doc).

    Usually built by the registry from ``scenario: package.module:factory``; build it directly
    to choose the reward split: ``PettingZooScenario("mpe2.simple_spread_v3:parallel_env",
    {"N": 3}, reward="team")``.

    Args:
        env: the factory's import reference ``package.module:attr``.
        env_kwargs: the factory's keyword arguments.
        reward: ``"env"`` (each agent its own reward) or ``"team"`` (the agents' mean).
        made: an env the factory already returned for these arguments (used for the spaces).

    Raises:
        ScenarioError: a factory that does not return a PettingZoo env, an agent named
            :data:`ENV_NODE`, a bad ``reward``.
    """

    name = "pettingzoo"
    version = 0
    summary = "a PettingZoo ParallelEnv / AECEnv named by its factory's import reference"
    topologies = ("graph",)
    default_topology = "graph"
    exact_replay = False
    has_local_rewards = True

    def __new__(
        cls, env: str | None = None, env_kwargs: dict[str, Any] | None = None, **kw: Any
    ) -> PettingZooScenario:
        """A turn-based ``AECEnv`` (not parallelisable) is built as
        :class:`scenarios.pz_aec.AECScenario` instead: stepped natively, one agent a step."""
        if cls is PettingZooScenario and env is not None:
            from scenarios.pz_aec import AECScenario, is_turn_based
            from scenarios.registry import load

            made = kw.get("made")
            probe = made if made is not None else load(env)(**dict(env_kwargs or {}))
            if is_turn_based(probe):
                cls = AECScenario
            if made is None and is_pettingzoo_env(probe):
                probe.close()
        return super().__new__(cls)

    def __init__(
        self,
        env: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        reward: str = "env",
        made: Any = None,
    ) -> None:
        from scenarios.registry import load

        if reward not in REWARDS:
            raise ScenarioError(f"reward={reward!r}: use one of {', '.join(REWARDS)}")
        self.env_ref, self.env_kwargs, self.reward = env, dict(env_kwargs or {}), reward
        self._factory = load(env)
        ref = self._probe_env(made if made is not None else self._make_raw())
        agents = list(ref.possible_agents)
        if ENV_NODE in agents:
            raise ScenarioError(
                f"{env}: an agent is named {ENV_NODE!r}, the node that steps the env: rename it"
            )
        # the probe's reset: the infos say which agents get their action mask there
        infos = self._probe_infos(ref)
        self._acts = {a: convert_action_space(a, ref.action_space(a)) for a in agents}
        self._observe = {
            a: convert_observation_space(
                a,
                ref.observation_space(a),
                ref.action_space(a),
                info_mask=MASK_KEY in (infos.get(a) or {}),
            )
            for a in agents
        }
        self.agent_spaces = {a: (self._observe[a].space, self._acts[a].space) for a in agents}
        self.state_space = _state_space(ref, reset=False)
        cycles = self.env_kwargs.get("max_cycles", getattr(ref.unwrapped, "max_cycles", None))
        cycles = cycles if isinstance(cycles, int) and cycles > 0 else DEFAULT_MAX_CYCLES
        # two supersteps a step (env node, agents), each agent acting once a cycle
        self.max_supersteps = 2 * cycles * self._decisions_a_step(agents) + 4
        self.topology = self._topology(agents)
        ref.close()

    def _probe_env(self, made: Any) -> Any:
        """The env the spaces are probed on: ``made`` as a ``ParallelEnv``."""
        return as_parallel(made)

    def _probe_infos(self, ref: Any) -> dict[str, Any]:
        """The infos of the probe env's reset (:func:`_probe_reset`)."""
        return _probe_reset(ref, self.env_ref)[1] or {}

    def _decisions_a_step(self, agents: list[str]) -> int:
        """Env-node runs an env step takes apart (1: every live agent acts in one)."""
        return 1

    def _make_raw(self) -> Any:
        made = self._factory(**self.env_kwargs)
        if not is_pettingzoo_env(made):
            raise ScenarioError(
                f"{self.env_ref} returned {type(made).__name__}, not a PettingZoo ParallelEnv "
                "or AECEnv: name a factory that returns one"
            )
        return made

    def _make(self) -> Any:
        return as_parallel(self._make_raw())

    def _topology(self, agents: list[str]) -> Topology:
        """Every agent ⇄ the env node; roles (and pools) from agent names."""
        t = Topology.empty(f"pettingzoo/{self.env_ref}")
        t.add_agent(ENV_NODE, "tool", kind="node")
        for a in agents:
            t.add_agent(a, role_of(a))
        t.add_channel(START, ENV_NODE)
        for a in agents:
            t.add_channel(ENV_NODE, a, "conditional", label=a)
            t.add_channel(a, ENV_NODE)  # static: the env node runs once per superstep
        t.add_channel(ENV_NODE, END, "conditional", label="done")
        return t

    # ----- the Dec-POMDP -------------------------------------------------------------------
    def default_action(self, agent: str) -> Any:
        space = self.action_space(agent)
        return 0 if isinstance(space, gym.spaces.Discrete) else super().default_action(agent)

    def build_graph(self) -> StateGraph:
        return self.topology.to_langgraph(self._node, PZState)

    def _node(self, node: str) -> Any:
        if node == ENV_NODE:
            return self._env_step

        def act(state: dict[str, Any]) -> dict[str, Any]:
            return {"actions": {node: decide(node, state["obs"][node])}}

        act.__name__ = f"act_{node}"
        return act

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        return {
            "env": self._make(),
            "env_seed": env_seed(rng),
            "actions": {},
            "route": {},
            "t": -1,  # the env node's first run resets the env
            "team_return": 0.0,
            "agent_returns": {},  # the agents of this episode (possible_agents may hold more)
            "truncated": False,
        }

    def _observations(self, obs: dict[str, Any], infos: dict[str, Any]) -> dict[str, Any]:
        """The env's observations as the declared spaces' (:mod:`scenarios.pz_spaces`)."""
        infos = infos or {}
        return {a: self._observe[a](o, infos.get(a)) for a, o in obs.items() if a in self._observe}

    def _env_step(self, state: dict[str, Any]) -> dict[str, Any]:
        """Reset (first run) or step the env with the joint action; route the live agents."""
        env, t = state["env"], state["t"]
        if t < 0:
            obs, infos = env.reset(seed=state["env_seed"])
            self._emit_state(env)
            live = self._live(env.agents)
            return {
                "obs": self._observations(obs, infos),
                "t": 0,
                "agent_returns": dict.fromkeys(live, 0.0),
                "route": {ENV_NODE: live},
            }
        acting = self._live(env.agents)
        chosen = state.get("actions") or {}
        missing = [a for a in acting if a not in chosen]
        if missing:
            raise RuntimeError(f"agents {missing} gave no action in step {t}")
        obs, rewards, terms, truncs, infos = env.step({a: self._acts[a](chosen[a]) for a in acting})
        # the agents of this step: those that acted (an agent without a reward gets 0)
        r = {a: float(rewards.get(a, 0.0)) for a in acting}
        team = sum(r.values()) / len(r) if r else 0.0
        emit_reward(team)  # to the agents still in the episode (team + deviation = own)
        if self.reward == "env":
            for a, value in r.items():
                if value != team:
                    emit_reward(value - team, agents=[a])
        live = self._live(env.agents)
        ended = [a for a in acting if a not in live]
        truncated = bool(ended) and all(
            truncs.get(a, False) and not terms.get(a, False) for a in ended
        )
        for flag in (False, True):  # each agent that ended leaves by its own flag
            out = [a for a in ended if bool(truncs.get(a) and not terms.get(a)) == flag]
            if out:
                leave(out, truncated=flag)
        if live:
            self._emit_state(env)
        returns = dict(state["agent_returns"])
        for a, value in r.items():
            returns[a] = returns.get(a, 0.0) + value
        for a in live:  # an agent that joined this step
            returns.setdefault(a, 0.0)
        return {
            "obs": {**state["obs"], **self._observations(obs, infos)},
            "actions": None,
            "t": t + 1,
            "team_return": state["team_return"] + team,
            "agent_returns": returns,
            "truncated": truncated if not live else state.get("truncated", False),
            "route": {ENV_NODE: live},
        }

    def _live(self, agents: list[str]) -> list[str]:
        """``agents`` (the env's live ones), each of which must be a possible agent."""
        unknown = [a for a in agents if a not in self.agent_spaces]
        if unknown:
            raise ScenarioError(
                f"{self.env_ref}: agents {unknown} are live but not in possible_agents "
                f"{self.possible_agents}: possible_agents must list every agent an episode may have"
            )
        return list(agents)

    def _emit_state(self, env: Any) -> None:
        if self.state_space is not None:
            emit_state(_flat_state(env))

    def score(self, state: dict[str, Any]) -> Outcome:
        """Zero terminal reward (every reward was emitted per step) and the episode's metrics."""
        steps = max(int(state.get("t", 0)), 0)
        returns = {a: float(v) for a, v in (state.get("agent_returns") or {}).items()}
        team = float(state.get("team_return", 0.0))
        metrics = {"return": team, "sum_return": sum(returns.values()), "steps": float(steps)}
        metrics.update({f"{a}/return": v for a, v in returns.items()})
        metrics.update(match_metrics(returns))  # two players: <agent>/win, /draw, /loss
        env = state.get("env")
        if env is not None:
            env.close()
        local = returns if self.reward == "team" else dict.fromkeys(returns, team)
        return Outcome(
            reward=0.0, metrics=metrics, local=local, truncated=bool(state.get("truncated"))
        )


def _probe_reset(env: Any, ref: str) -> tuple[Any, Any]:
    """``env.reset(seed=0)`` (what the scenario probes its spaces, infos and state on)."""
    try:
        return env.reset(seed=0)  # type: ignore[no-any-return]
    except Exception as exc:
        raise ScenarioError(
            f"{ref}: the env's reset(seed=0) raised {type(exc).__name__}: {exc} — the env cannot "
            "start an episode: fix the env or its scenario_kwargs (the original error is chained)"
        ) from exc


def _state_space(env: Any, *, reset: bool = True) -> gym.spaces.Box | None:
    """The flat ``float32`` space of the env's global state (:func:`_flat_state`), or ``None``
    (no global state): its ``state_space`` converted by :func:`scenarios.pz_spaces.flat_space`,
    else a ``Box`` as wide as ``state()`` after a reset (``reset=False``: the env was just
    reset). A ``state`` that is not a method (rps keeps a dict there), a ``state()`` that
    raises or a state space without a flat form mean no global state, said once in a warning:
    centralised critics then read the agents' observations."""
    name = _env_name(env)
    own = getattr(getattr(env, "unwrapped", env), "state", None)  # rps_v2: a dict
    if not callable(getattr(env, "state", None)) or not callable(own):
        return None
    space = getattr(env, "state_space", None)
    if isinstance(space, gym.Space):
        try:
            return flat_space("", space, "global state space")
        except UnsupportedSpace as exc:
            _warn_once(name, f"{name}: no global state ({exc})")
            return None
    try:
        if reset:
            env.reset(seed=0)
        value = np.asarray(env.state(), np.float32).reshape(-1)
    except NotImplementedError:
        return None
    except Exception as exc:
        _warn_once(
            name,
            f"{name}: state() raised {type(exc).__name__}: {exc}; trained without a global state "
            "(centralised critics read the agents' observations)",
        )
        return None
    return gym.spaces.Box(-np.inf, np.inf, value.shape, np.float32)


def _flat_state(env: Any) -> np.ndarray:
    """``env.state()`` as the flat ``float32`` vector of :func:`_state_space`'s space: as
    :mod:`scenarios.pz_spaces` flattens observations where its ``state_space`` is not a plain
    ``Box`` (an image state is pooled and scaled too), else the value as it is, flattened."""
    space = getattr(env, "state_space", None)
    if isinstance(space, gym.Space) and (not isinstance(space, gym.spaces.Box) or is_image(space)):
        return flattener("", space, "global state space")(env.state())
    return np.asarray(env.state(), np.float32).reshape(-1)


def _env_name(env: Any) -> str:
    meta = getattr(env, "metadata", None) or {}
    return str(meta.get("name") or type(getattr(env, "unwrapped", env)).__name__)


_WARNED: set[str] = set()


def _warn_once(key: str, text: str) -> None:
    """``warnings.warn(text)`` the first time ``key`` is seen in this process."""
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(text, stacklevel=3)
