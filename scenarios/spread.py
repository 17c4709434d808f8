"""``spread``: mpe2's ``simple_spread_v3`` (cooperative navigation) as a topology-aware scenario.

N agents must cover N landmarks without colliding. Each episode builds its own
``mpe2.simple_spread_v3.parallel_env(N=n, max_cycles=max_cycles, continuous_actions=False,
local_ratio=local_ratio)`` (n from the topology; ``render_mode``, ``curriculum``,
``terminate_on_success`` and the partial-observability options keep mpe2's defaults) and resets
it with ``seed = env_seed(rng)``, so episodes are deterministic and counterfactual replays exact.
Observations and actions are mpe2's: ``Box(-inf, inf, (4N+2,), float32)`` (18 dims for N=3) and
``Discrete(5)`` (no-op, left, right, down, up).

Graph: every cycle all agent nodes run in one superstep, each calling
``decide(agent_id, its own mpe2 observation)``; then the plain node ``world`` (kind ``node``,
role ``tool``; joined on all agents) steps the env with the joint action, emits the step's
rewards and routes back to every agent, or to END after ``max_cycles`` cycles (2 supersteps a
cycle). Topologies: ``mesh:N`` (default ``mesh:3``; ids ``agent_i`` = mpe2's ``agent_i``),
``single`` (N=1; ``agent`` → ``agent_0``) and ``star:K`` (N=K+1; ``orchestrator`` → ``agent_0``,
``worker_i`` → ``agent_{i+1}``). Only the named topology's agent ids, roles and pools are used
(``star`` buys a separate orchestrator pool, no extra communication); the executed graph is
always agents ⇄ world. Absent agents (counterfactuals) take the no-op action 0.

Rewards: mpe2 gives agent i at step t ``r_i = (1 - local_ratio) * G + local_ratio * L_i``, where
``G = -Σ_landmarks min_agents distance`` and ``L_i = -(number of other agents colliding with i)``.
The engine adds the team stream and an agent's own stream, so with ``reward="mpe2"`` (default)
the world node emits the team reward ``mean_i r_i = (1 - local_ratio) * G + local_ratio *
mean_i L_i`` (``emit_reward(mean)``) and to each agent its deviation ``r_i - mean_i r_i``
(``emit_reward(dev, agents=[i])``, skipped when 0): every agent receives mpe2's ``r_i`` (to float
rounding) and the team value used for credit is the agents' mean reward, collisions included.
With ``local_ratio=0`` all ``r_i`` equal ``G``. ``reward="team"`` emits the mean only (a common
reward). ``Outcome.reward`` is 0: everything was emitted per step, so the team return is
``Σ_t mean_i r_i``; codebases that sum rewards over agents report N times that.

Global state (centralised critics): mpe2's own ``state()``, the agents' observations of the
current step concatenated in mpe2's agent order (``Spread.global_state``; 54 dims for N=3).

Metrics: ``return`` (episode sum of the team reward), ``<agent>/return`` (mpe2 per-agent return),
``collisions`` (colliding agent pairs summed over steps), ``min_dist`` (per-step Σ over landmarks
of the nearest agent's distance, i.e. ``-G``, averaged over steps), ``covered`` (landmarks within
0.1 of an agent at the last step; ``success`` when all are) and ``steps``.

Reference numbers: ``docs/results.md`` (section "spread") compares training here with EPyMARL's
benchmark (Papoudakis et al., NeurIPS 2021 Datasets and Benchmarks, arXiv:2006.07869, Table 3,
MPE Spread), with the provenance of each number and how the conventions differ: their returns
use the older MPE reward (a self-collision term) divided by the number of agents
(github.com/uoe-agents/epymarl/issues/29); ``experiments/spread_benchmark.py`` converts our
episodes into that convention.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypedDict

import numpy as np
from langgraph.graph import StateGraph
from mpe2 import simple_spread_v3

from scenarios.base import Outcome, Scenario, ScenarioError
from scenarios.decisions import decide, emit_reward
from scenarios.declared import DeclaredSpaces, accept_topology
from scenarios.global_state import concat_state
from scenarios.registry import register
from topologies import END, START, Topology
from topologies.generators import merge_routes

WORLD = "world"
ACCEPTED = "mesh:N, single, star:N"
REWARDS = ("mpe2", "team")
#: longest episode accepted (an episode of N agents holds 2 * max_cycles env steps).
MAX_CYCLES = 10_000
#: mpe2's own "landmark occupied" distance (``Scenario.CAPTURE_RADIUS``).
CAPTURE_RADIUS = 0.1


def merge_actions(left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    """Reducer of ``actions``: agents add theirs; ``None`` (written by the world) clears them."""
    return {} if right is None else {**(left or {}), **right}


class SpreadState(TypedDict, total=False):
    """Graph state of one episode (``env`` is that episode's own mpe2 ``parallel_env``)."""

    env: Any
    mpe_seed: int
    obs: dict[str, np.ndarray]
    actions: Annotated[dict[str, Any], merge_actions]
    route: Annotated[dict[str, list[str]], merge_routes]
    t: int
    team_return: float
    agent_returns: dict[str, float]
    collisions: int
    min_dist_sum: float
    covered: int


def env_seed(rng: np.random.Generator) -> int:
    """The seed given to mpe2's ``reset`` for an episode whose randomness is ``rng``."""
    return int(rng.integers(0, 2**31 - 1))


def world_stats(env: Any) -> tuple[int, float, int]:
    """Colliding agent pairs, Σ over landmarks of the nearest agent distance, covered landmarks."""
    raw = env.unwrapped
    agents, landmarks = raw.world.agents, raw.world.landmarks
    pos = np.array([a.state.p_pos for a in agents])
    marks = np.array([lm.state.p_pos for lm in landmarks])
    nearest = np.linalg.norm(marks[:, None, :] - pos[None, :, :], axis=-1).min(axis=1)
    pairs = sum(
        bool(raw.scenario.is_collision(a, b)) for i, a in enumerate(agents) for b in agents[i + 1 :]
    )
    return pairs, float(nearest.sum()), int((nearest < CAPTURE_RADIUS).sum())


@register
class Spread(DeclaredSpaces, Scenario):
    """mpe2 ``simple_spread_v3`` with discrete actions, one LangGraph cycle per env step.

    Args:
        topology: ``"mesh:N"`` (default ``"mesh:3"``), ``"single"`` or ``"star:K"`` (K+1 agents),
            or a :class:`Topology` of one of those kinds.
        max_cycles: env steps an episode lasts (mpe2's ``max_cycles``), ≥ 1.
        local_ratio: mpe2's weight of the local (collision) reward, in [0, 1].
        reward: ``"mpe2"`` (each agent receives mpe2's own reward) or ``"team"`` (each receives
            the mean over agents).

    Raises:
        ScenarioError: unknown arguments, bad values, or an unsupported topology.

    Example:
        >>> from scenarios.decisions import run_inline
        >>> _, outcome, decisions = run_inline(Spread("mesh:3"), lambda a, o: 0, seed=0)
        >>> decisions
        75
    """

    name = "spread"
    version = 0
    summary = "mpe2 simple_spread_v3 (cover N landmarks, avoid collisions), exact mpe2 dynamics"
    topologies = ("mesh", "single", "star")
    default_topology = "mesh:3"

    def __init__(
        self,
        topology: str | Topology = "mesh:3",
        *,
        max_cycles: int = 25,
        local_ratio: float = 0.5,
        reward: str = "mpe2",
        **unknown: Any,
    ) -> None:
        if unknown:
            hint = " (N comes from the topology: mesh:N)" if {"N", "n"} & set(unknown) else ""
            raise ScenarioError(
                f"spread got unknown argument(s) {sorted(unknown)}{hint}: it accepts topology, "
                "max_cycles, local_ratio, reward"
            )
        ok = isinstance(max_cycles, int) and not isinstance(max_cycles, bool)
        if not ok or not 1 <= max_cycles <= MAX_CYCLES:
            raise ScenarioError(
                f"max_cycles={max_cycles!r}: give an integer in [1, {MAX_CYCLES}] (mpe2 uses 25; "
                "an episode holds 2 env steps per cycle)"
            )
        if not isinstance(local_ratio, (int, float)) or not 0 <= local_ratio <= 1:
            raise ScenarioError(f"local_ratio={local_ratio!r}: give a number in [0, 1]")
        if reward not in REWARDS:
            raise ScenarioError(f"reward={reward!r}: use one of {', '.join(REWARDS)}")
        src = self._source(topology)
        #: topology agent id → mpe2 agent name.
        self.mpe_ids = {aid: f"agent_{i}" for i, aid in enumerate(src.agent_ids)}
        self.max_cycles, self.local_ratio, self.reward = max_cycles, float(local_ratio), reward
        #: the exact keyword arguments given to ``simple_spread_v3.parallel_env``.
        self.env_kwargs = {
            "N": len(self.mpe_ids),
            "max_cycles": max_cycles,
            "continuous_actions": False,
            "local_ratio": self.local_ratio,
        }
        # per-instance cap: 2 supersteps a cycle plus slack (the base class default is 64)
        self.max_supersteps = 2 * max_cycles + 4
        self.topology = self._executed(src)
        ref = simple_spread_v3.parallel_env(**self.env_kwargs)
        self.agent_spaces = {
            a: (ref.observation_space(m), ref.action_space(m)) for a, m in self.mpe_ids.items()
        }

    @staticmethod
    def _source(topology: str | Topology) -> Topology:
        why = "mpe2 agents move at once, so sequential or hierarchical topologies do not apply"
        src = accept_topology("spread", topology, Spread.topologies, ACCEPTED, why)
        if WORLD in src.graph:
            raise ScenarioError(f"node id {WORLD!r} is reserved for the env step: rename the agent")
        return src

    @staticmethod
    def _executed(src: Topology) -> Topology:
        """The topology actually run: ``src``'s agents (roles, pools kept) ⇄ the world node."""
        t = Topology.empty(f"spread/{src.spec or src.name}", spec=src.spec)
        for aid in src.agent_ids:
            d = src.graph.nodes[src.node_of(aid)]
            t.add_agent(aid, d["role"], pool=d["pool"], trainable=d["trainable"])
        t.add_agent(WORLD, "tool", kind="node")
        for aid in src.agent_ids:
            t.add_channel(START, aid)
            t.add_channel(aid, WORLD, "join")
            t.add_channel(WORLD, aid, "conditional", label=aid)
        t.add_channel(WORLD, END, "conditional", label="done")
        return t

    # ----- the Dec-POMDP -------------------------------------------------------------------
    def default_action(self, agent: str) -> int:
        """mpe2's no-op (action 0)."""
        self._known(agent)
        return 0

    def build_graph(self) -> StateGraph:
        return self.topology.to_langgraph(self._node, SpreadState)

    def global_state(self, observations: Mapping[str, Any]) -> np.ndarray:
        """mpe2's ``state()``: every agent's current mpe2 observation in mpe2's agent order
        (``agent_0``, ``agent_1``, ...), concatenated as float32. All agents observe the same
        world step (they act in one superstep), so this equals ``env.state()`` of the episode's
        mpe2 env at that step (tested)."""
        return concat_state(observations, list(self.mpe_ids), self.observation_spaces())

    def observation_spaces(self) -> dict[str, Any]:
        """Agent id → observation space, in mpe2's agent order."""
        return {a: self.agent_spaces[a][0] for a in self.mpe_ids}

    def _node(self, node: str) -> Any:
        if node == WORLD:
            return self._world
        mpe = self.mpe_ids[node]

        def act(state: dict[str, Any]) -> dict[str, Any]:
            return {"actions": {node: decide(node, state["obs"][mpe])}}

        act.__name__ = f"act_{node}"
        return act

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        seed = env_seed(rng)
        env = simple_spread_v3.parallel_env(**self.env_kwargs)
        obs, _ = env.reset(seed=seed)
        return {
            "env": env,
            "mpe_seed": seed,
            "obs": obs,
            "actions": {},
            "route": {},
            "t": 0,
            "team_return": 0.0,
            "agent_returns": dict.fromkeys(self.mpe_ids, 0.0),
            "collisions": 0,
            "min_dist_sum": 0.0,
            "covered": 0,
        }

    def _world(self, state: dict[str, Any]) -> dict[str, Any]:
        """Step mpe2 with the joint action, emit the step's rewards, route on or to END."""
        env, chosen = state["env"], state.get("actions") or {}
        joint: dict[str, int] = {}
        for aid, mpe in self.mpe_ids.items():
            if aid not in chosen:
                raise RuntimeError(f"agent {aid!r} gave no action in cycle {state['t']}")
            action = chosen[aid]
            space = self.action_space(aid)
            if not space.contains(action):
                raise ValueError(f"agent {aid!r} chose {action!r}: spread's actions are {space}")
            joint[mpe] = int(action)
        obs, rewards, terms, truncs, _ = env.step(joint)
        r = {aid: float(rewards[mpe]) for aid, mpe in self.mpe_ids.items()}
        team = sum(r.values()) / len(r)
        emit_reward(team)
        if self.reward == "mpe2":
            for aid, value in r.items():
                if value != team:
                    emit_reward(value - team, agents=[aid])
        pairs, dist, covered = world_stats(env)
        t = state["t"] + 1
        done = t >= self.max_cycles or all(terms[m] or truncs[m] for m in self.mpe_ids.values())
        returns = state["agent_returns"]
        return {
            "obs": obs,
            "actions": None,
            "t": t,
            "team_return": state["team_return"] + team,
            "agent_returns": {aid: returns[aid] + r[aid] for aid in returns},
            "collisions": state["collisions"] + pairs,
            "min_dist_sum": state["min_dist_sum"] + dist,
            "covered": covered,
            "route": {WORLD: [] if done else list(self.mpe_ids)},
        }

    def score(self, state: dict[str, Any]) -> Outcome:
        """Zero terminal reward (all rewards were emitted per step) and the episode's metrics."""
        steps = int(state.get("t", 0))
        metrics = {
            "return": float(state.get("team_return", 0.0)),
            "collisions": float(state.get("collisions", 0)),
            "min_dist": float(state.get("min_dist_sum", 0.0)) / max(steps, 1),
            "covered": float(state.get("covered", 0)),
            "steps": float(steps),
        }
        for aid, value in (state.get("agent_returns") or {}).items():
            metrics[f"{aid}/return"] = float(value)
        success = steps > 0 and int(state.get("covered", 0)) == len(self.mpe_ids)
        # mpe2 ends every episode on its max_cycles time limit: a truncation, not a terminal state
        return Outcome(reward=0.0, success=success, metrics=metrics, truncated=True)
