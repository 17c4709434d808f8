"""Turn-based PettingZoo ``AECEnv``\\ s (chess, connect four, tic-tac-toe, card games) as
scenarios, stepped natively: :class:`AECScenario`.

:class:`~scenarios.pettingzoo_env.PettingZooScenario` builds one for an ``AECEnv`` whose
``metadata["is_parallelizable"]`` is not True (:func:`is_turn_based`); a parallelisable one keeps
the parallel path (PettingZoo's ``aec_to_parallel``).

Graph: the same as a parallel env's (``START → env ⇄ every agent``, ``env → END``), but the env
node routes only ``env.agent_selection``'s agent: one decision a superstep, in PettingZoo's turn
order. The env node

* resets the env with the episode's seed (first run), or steps it with the acting agent's action
  (checked against the ``action_mask`` the agent saw: a masked action raises, naming the agent,
  the action and the legal ones: masking in the pools' modules means none arrives);
* then hands the turn on: while the selected agent is terminated or truncated it takes that
  agent's last reward and steps ``None`` for it, as the AEC API requires (the policy is never
  asked); it stops at the first live agent, whose observation (``env.last()``) it passes on.
  An episode ends when ``env.agents`` is empty.

**Rewards** follow the AEC API: what ``env.last()`` reports for the selected agent (the rewards
it earned since it last acted, ``_cumulative_rewards``) is paid to that agent right before it
acts or is stepped out (``reward="env"``, :func:`~scenarios.emit_reward` to that agent alone),
so a reward earned on another agent's turn (tic-tac-toe: the loser's −1 is earned on the
winner's move) reaches its agent at its next turn or at the end, never another agent. With
``reward="team"`` each reward is split evenly over the team's stream instead. Metrics are
:class:`~scenarios.pettingzoo_env.PettingZooScenario`'s: ``<agent>/return`` (each agent's own
sum, equal to PettingZoo's cumulative rewards over the episode), ``sum_return``, ``return``
(their mean over the possible agents) and ``steps`` (decisions). Each agent leaves with its own
flag as it is stepped out (:func:`~scenarios.leave`: terminated, or truncated where PettingZoo
truncated it and did not terminate it), so RLlib bootstraps exactly the truncated ones; the
episode is truncated when every agent was.

Roles and pools come from agent names as for parallel envs: ``player_1``/``player_2`` share the
role and pool ``player``, so both seats train one policy by default (self-play by parameter
sharing); ``pools`` / ``sharing: agent`` give each seat its own.

Example:
    >>> from scenarios.registry import build
    >>> s = build("pettingzoo.classic.tictactoe_v3:env")
    >>> type(s).__name__, s.possible_agents, s.topology.roles["player_2"]
    ('AECScenario', ['player_1', 'player_2'], 'player')
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from langgraph.graph import StateGraph

from scenarios.decisions import emit_reward, leave
from scenarios.pettingzoo_env import (
    ENV_NODE,
    PettingZooScenario,
    PZState,
    _probe_reset,
)
from scenarios.pz_spaces import MASK_KEY
from topologies.errors import MarlError


def legal(mask: Any, action: Any, space: gym.Space) -> bool:
    """Whether ``mask`` (one 0/1 entry per action; for ``MultiDiscrete`` the components' masks
    concatenated) allows ``action`` of ``space``."""
    flags = np.asarray(mask).reshape(-1) != 0
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec).reshape(-1)
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        picks = np.asarray(action, np.int64).reshape(-1)
        return bool(np.all((picks >= 0) & (picks < nvec)) and flags[offsets + picks].all())
    pick = int(np.asarray(action).reshape(-1)[0])
    return 0 <= pick < flags.size and bool(flags[pick])


def is_turn_based(env: Any) -> bool:
    """Whether ``env`` is an ``AECEnv`` that PettingZoo cannot run in parallel (its
    ``metadata["is_parallelizable"]`` is not True): one agent acts per step."""
    from pettingzoo import AECEnv

    if not isinstance(env, AECEnv):
        return False
    return (getattr(env, "metadata", None) or {}).get("is_parallelizable") is not True


class IllegalActionError(MarlError, RuntimeError):
    """An action the observation's ``action_mask`` forbids reached the env node."""


class AECState(PZState, total=False):
    """Graph state of one turn-based episode: :class:`~scenarios.pettingzoo_env.PZState` and
    how each agent that was stepped out ended (``"terminated"`` or ``"truncated"``)."""

    ends: dict[str, str]


class AECScenario(PettingZooScenario):
    """A turn-based PettingZoo ``AECEnv`` as a scenario (see the module doc).

    Built by :class:`~scenarios.pettingzoo_env.PettingZooScenario` for a turn-based env; the
    arguments are its own, plus:

    Args:
        check_mask: refuse (raise :class:`IllegalActionError`) an action the agent's
            ``action_mask`` forbids before it reaches the env (default). ``False`` lets it
            through to the env, whose own rule then applies (PettingZoo's classic games end
            the episode with a −1 for the player who moved illegally). Experiments set it
            from the pools (:attr:`scenarios.env_spec.EnvSpec.check_action_masks`: off where a
            pool sets ``model.action_mask: false``).
    """

    summary = "a turn-based PettingZoo AECEnv, one agent acting per step"

    def __init__(
        self,
        env: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        reward: str = "env",
        made: Any = None,
        check_mask: bool = True,
    ) -> None:
        self.check_mask = check_mask
        super().__init__(env, env_kwargs, reward=reward, made=made)

    def _probe_env(self, made: Any) -> Any:
        return made  # stepped natively, not through aec_to_parallel

    def _probe_infos(self, ref: Any) -> dict[str, Any]:
        _probe_reset(ref, self.env_ref)  # an AEC reset returns nothing: the env keeps its infos
        return getattr(ref, "infos", None) or {}

    def _decisions_a_step(self, agents: list[str]) -> int:
        return max(len(agents), 1)  # one agent acts a step

    def _make(self) -> Any:
        return self._make_raw()

    def build_graph(self) -> StateGraph:
        return self.topology.to_langgraph(self._node, AECState)

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        return {**super().initial_state(rng), "obs": {}, "ends": {}}

    def _env_step(self, state: dict[str, Any]) -> dict[str, Any]:
        """Reset (first run) or step the env with the acting agent's action; then step out the
        agents that are done and route the next live one (module doc)."""
        env, t = state["env"], state["t"]
        returns, ends = dict(state["agent_returns"]), dict(state.get("ends") or {})
        team = state["team_return"]
        if t < 0:
            env.reset(seed=state["env_seed"])
            returns = dict.fromkeys(env.agents, 0.0)  # this episode's agents
            t = 0
        else:
            agent = env.agent_selection
            chosen = state.get("actions") or {}
            if agent not in chosen:
                raise RuntimeError(
                    f"agent {agent!r} (env.agent_selection) gave no action in decision {t}"
                )
            action = chosen[agent]
            if self.check_mask:
                self._check_legal(agent, action, state["obs"].get(agent))
            env.step(self._acts[agent](action))
            t += 1
        obs: dict[str, Any] = {}
        route: list[str] = []
        while env.agents:
            agent = env.agent_selection
            observation, reward, term, trunc, info = env.last()
            team += self._pay(agent, float(reward), returns)
            if term or trunc:
                ends[agent] = "terminated" if term else "truncated"
                leave([agent], truncated=not term)  # its own flag, now
                env.step(None)
                continue
            obs[agent] = self._observe[agent](observation, info)
            route = [agent]
            break
        if env.agents:
            self._emit_state(env)
        truncated = bool(ends) and all(v == "truncated" for v in ends.values())
        return {
            "obs": {**state["obs"], **obs},
            "actions": None,
            "t": t,
            "team_return": team,
            "agent_returns": returns,
            "ends": ends,
            "truncated": truncated if not env.agents else False,
            "route": {ENV_NODE: route},
        }

    def _pay(self, agent: str, reward: float, returns: dict[str, float]) -> float:
        """Pay ``agent`` the ``reward`` ``env.last()`` reported for it; returns its share of
        the team return (the mean over the possible agents)."""
        returns[agent] = returns.get(agent, 0.0) + reward
        if reward == 0.0:
            return 0.0
        share = reward / len(self.possible_agents)
        if self.reward == "env":
            emit_reward(reward, agents=[agent])
        else:
            emit_reward(share)
        return share

    def _check_legal(self, agent: str, action: Any, observation: Any) -> None:
        """Raise :class:`IllegalActionError` when ``observation``'s mask forbids ``action``."""
        if not isinstance(observation, dict) or MASK_KEY not in observation:
            return
        mask = observation[MASK_KEY]
        if legal(mask, action, self.action_space(agent)):
            return
        allowed = np.flatnonzero(np.asarray(mask).reshape(-1) != 0).tolist()
        raise IllegalActionError(
            f"{self.env_ref}: agent {agent!r} chose action {action!r}, which its observation's "
            f"action_mask forbids (allowed mask entries: {allowed}); the mlp/gru/mpnn pools "
            "mask illegal actions (model.action_mask, on by default), so a policy that does not "
            "mask produced it (a scripted, LLM or checkpoint policy): make it respect the mask, "
            "or set model.action_mask: false on a pool (AECScenario(check_mask=False) in "
            "Python) to let the env's own rule for illegal moves apply"
        )


__all__ = ["AECScenario", "AECState", "IllegalActionError", "is_turn_based", "legal"]
