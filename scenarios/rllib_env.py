"""RLlib's view of a :class:`~scenarios.graph_env.GraphEnv`: only acting agents appear.

Each observation dict holds exactly the agents pending in the current superstep, so RLlib records
one step per real decision. Rewards earned while an agent waits are held back and paid with its
next observation; when the graph ends every agent that acted gets its last observation, its held
rewards and the terminal team reward, and is terminated (or truncated when a node failed or the
step limit was hit). An agent that leaves the episode before it ends (:func:`scenarios.leave`)
gets its last observation, held rewards and its own flag in the step it leaves, and is not seen
again. Agents that never acted never appear (the PettingZoo view's closing step is not shown).

Global state (:mod:`scenarios.global_state`): with every observation it returns (reset and step)
it reports ``GraphEnv.state()`` under ``infos[agent][STATE_INFO]``, for scenarios that have one
(``state_space`` not None), unless the env config sets ``"global_state": False`` (what
``train()`` sets when no critic reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.rllib.env.multi_agent_env import MultiAgentEnv

from scenarios.env_spec import EnvSpec
from scenarios.global_state import STATE_INFO
from scenarios.graph_env import GraphEnv


class RLlibGraphEnv(MultiAgentEnv):
    """A :class:`GraphEnv` as an RLlib ``MultiAgentEnv``.

    Args:
        config: ``{"spec": EnvSpec(...)}`` (:class:`~scenarios.env_spec.EnvSpec`: the scenario,
            its topology and kwargs, the wall-clock limit, engine, reward sources, tool
            settings, ``seed_once`` and ``global_state``; what ``trainers.plan.resolve``
            builds), the same fields as plain keys (``{"scenario": "delegate", "topology":
            "star:3", "kwargs": {...}}``), or ``{"env": GraphEnv(...)}`` (an env already
            built; the spec's settings given as plain keys are set on it).
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        config = dict(config or {})
        if "env" in config:
            env: GraphEnv = config["env"]
            spec = EnvSpec(scenario=env.scenario.id(), built=env.scenario)
            given = {k: v for k, v in config.items() if k != "env"}
            if given:
                spec = EnvSpec.of({"scenario": spec.scenario, **given})
                for name, value in spec.env_settings(env.scenario).items():
                    if name in given or name in ("rewards", "tools"):
                        setattr(env, name, value)
        else:
            spec = EnvSpec.of(config)
            env = spec.make_env()
        self.spec = spec
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self.agents = []
        self.observation_spaces = {a: env.observation_space(a) for a in self.possible_agents}
        self.action_spaces = {a: env.action_space(a) for a in self.possible_agents}
        self._held: dict[str, float] = {}
        self._seed: int | None = None  # the last seed given to reset()
        self._seed_once = spec.seed_once
        #: report the global state under ``infos[agent][STATE_INFO]``
        self.reports_state = env.state_space is not None and spec.global_state

    def state(self) -> Any:
        """The scenario's global state now (:meth:`scenarios.graph_env.GraphEnv.state`)."""
        return self.env.state()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        # RLlib passes its config seed to every reset when it samples complete episodes: with
        # ``seed_once`` reseed only on the first reset or a new seed, or every batch would
        # replay the same tasks
        if self._seed_once and seed is not None and seed == self._seed:
            seed = None
        else:
            self._seed = seed if seed is not None else self._seed
        obs, infos = self.env.reset(seed=seed, options=options)
        self._held = dict.fromkeys(self.possible_agents, 0.0)
        acting = [a for a in obs if infos[a]["acting"]]
        self.agents = list(self.env.agents)
        return {a: obs[a] for a in acting}, self._with_state({a: infos[a] for a in acting})

    def _with_state(self, infos: dict[str, Any]) -> dict[str, Any]:
        """``infos`` with the global state under :data:`STATE_INFO` (one array, shared)."""
        if self.reports_state and infos:
            state = self.env.state()
            for info in infos.values():
                info[STATE_INFO] = state
        return infos

    def close(self) -> None:
        """Close the graph env (an unfinished episode is aborted, in the calling thread)."""
        self.env.close()

    def step(self, action_dict: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
        live = list(self.env.agents)
        obs, rewards, terms, truncs, infos = self.env.step(action_dict)
        for a, r in rewards.items():
            self._held[a] += r
        if self.env.finished:  # the agents that acted end here (not the closing step's)
            out = list(live)
            # each agent by its own flag (one that left here: its own, the others the
            # episode's); the episode is truncated when every agent was, else terminated
            # (RLlib then also flags the truncated agents terminated: the learners clear it,
            # trainers.learners.time_limits)
            truncated = bool(out) and all(truncs.get(a, False) for a in out)
            out_obs = {a: obs[a] for a in out}
            out_rew = {a: self._held[a] for a in out}
            out_inf = self._with_state({a: infos[a] for a in out})
            terms_out = {**{a: not truncs.get(a, False) for a in out}, "__all__": not truncated}
            truncs_out = {**{a: bool(truncs.get(a, False)) for a in out}, "__all__": truncated}
            self.agents = out  # the agents receiving their final observation
            return out_obs, out_rew, terms_out, truncs_out, out_inf
        # the acting agents, and those that left the episode in this step (scenarios.leave):
        # their last observation, what they were owed and their own flag
        gone = [a for a in obs if terms.get(a) or truncs.get(a)]
        out = [a for a in obs if infos[a]["acting"]] + gone
        out_rew = {a: self._held[a] for a in out}
        for a in out:
            self._held[a] = 0.0
        self.agents = list(self.env.agents)
        return (
            {a: obs[a] for a in out},
            out_rew,
            {**{a: bool(terms[a]) for a in gone}, "__all__": False},
            {**{a: bool(truncs[a]) for a in gone}, "__all__": False},
            self._with_state({a: infos[a] for a in out}),
        )
