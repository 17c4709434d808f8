"""A hand-written turn-based AEC env for tests (scenario ``tests.pz_aec_toys:turn_toy``):
``quitter`` terminates after ``quit_after`` moves while ``stayer`` goes on until it is truncated
after ``limit`` moves; each move pays the mover its action (0 or 1) and the other agent 0.5 (a
reward earned on another's turn)."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv


class TurnToy(AECEnv):
    metadata: ClassVar[dict[str, Any]] = {
        "name": "turn_toy_v0",
        "is_parallelizable": False,
        "render_modes": [],
    }

    def __init__(self, quit_after: int = 2, limit: int = 5) -> None:
        super().__init__()
        self.possible_agents = ["quitter", "stayer"]
        self.quit_after, self.limit = quit_after, limit
        self.observation_spaces = {
            a: gym.spaces.Box(0.0, 100.0, (2,), np.float32) for a in self.possible_agents
        }
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}

    def observation_space(self, agent: str) -> gym.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.moves = dict.fromkeys(self.agents, 0)
        self.agent_selection = "quitter"

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.moves[agent], 1.0], np.float32)

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self.moves[agent] += 1
        other = next((a for a in self.agents if a != agent), agent)
        self.rewards[agent] += float(action)
        if other != agent:
            self.rewards[other] += 0.5
        if agent == "quitter" and self.moves[agent] >= self.quit_after:
            self.terminations[agent] = True
        if agent == "stayer" and self.moves[agent] >= self.limit:
            self.truncations[agent] = True
        self._accumulate_rewards()
        self.agent_selection = other
        self._deads_step_first()


def turn_toy(quit_after: int = 2, limit: int = 5) -> TurnToy:
    return TurnToy(quit_after, limit)
