"""Hand-written PettingZoo envs for the PettingZoo-path tests (tests/test_pz_spaces.py,
tests/test_pz_agents_leave.py): every observation and action space kind, agents that leave,
agents that differ between episodes, and global states that are not methods or raise.

Each is named by an import reference (``tests.pz_toys:space_env``) so that ``marl run`` and
RLlib's env runners rebuild it by importing, as they do a user's env.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

S = gym.spaces

#: observation space kinds of :func:`space_env` (each its own flattening path)
OBS_KINDS: dict[str, gym.Space] = {
    "box": S.Box(-1.0, 1.0, (3,), np.float32),
    "discrete": S.Discrete(3),
    "discrete_start": S.Discrete(3, start=-1),
    "multidiscrete": S.MultiDiscrete([2, 3]),
    "multibinary": S.MultiBinary(4),
    "dict": S.Dict({"pos": S.Box(-1.0, 1.0, (2,)), "tag": S.Discrete(2)}),
    "tuple": S.Tuple((S.Discrete(2), S.Box(0, 1, (2, 2), np.float64))),
    "nested": S.Dict({"a": S.Tuple((S.MultiBinary(2), S.Discrete(2))), "b": S.Box(0, 5, (1,))}),
    "small_uint8": S.Box(0, 255, (6, 6, 3), np.uint8),  # too small to be an image
    "image": S.Box(0, 255, (100, 90, 3), np.uint8),  # pooled 2×2 to 50×45×3, scaled
    "int_box": S.Box(-5, 5, (2,), np.int32),
    "mask": S.Dict(
        {"observation": S.Box(0, 1, (3,), np.int8), "action_mask": S.Box(0, 1, (3,), np.int8)}
    ),
    "info_mask": S.Box(-1.0, 1.0, (3,), np.float32),
}
#: action space kinds of :func:`space_env`
ACT_KINDS: dict[str, gym.Space] = {
    "discrete": S.Discrete(3),
    "discrete_start": S.Discrete(3, start=1),
    "multidiscrete": S.MultiDiscrete([3, 2]),
    "multibinary": S.MultiBinary(3),
    "box": S.Box(-1.0, 1.0, (2,), np.float32),
}
#: spaces no network can read (refused with the agent's and the space's names)
REFUSED_OBS: dict[str, gym.Space] = {
    "text": S.Text(8),
    "graph": S.Graph(S.Box(0, 1, (2,)), S.Discrete(2)),
    "sequence": S.Sequence(S.Discrete(3)),
    "huge_discrete": S.Discrete(2**31 - 1),
    "tuple_with_text": S.Tuple((S.Discrete(2), S.Text(4))),
}
REFUSED_ACT: dict[str, gym.Space] = {
    "dict": S.Dict({"a": S.Discrete(2)}),
    "tuple": S.Tuple((S.Discrete(2), S.Discrete(2))),
    "text": S.Text(4),
    "int_box": S.Box(0, 3, (2,), np.int64),
}


def _space(table: dict[str, gym.Space], kind: str) -> gym.Space:
    import copy

    return copy.deepcopy(table[kind])


class SpaceEnv(ParallelEnv):
    """Two agents (``left_0``, ``right_0``) observing ``obs`` spaces and acting in ``act`` spaces;
    each step pays an agent 1 when its action's first component equals the step's parity
    (``t % 2``), which its observation shows (a learnable signal). ``mask`` observations allow
    every action but the last on odd steps; ``info_mask`` does the same through the infos."""

    metadata = {"name": "space_env", "render_modes": []}  # noqa: RUF012

    def __init__(self, obs: str = "box", act: str = "discrete", max_cycles: int = 6) -> None:
        self.possible_agents = ["left_0", "right_0"]
        self.agents: list[str] = []
        self.obs_kind, self.act_kind, self.max_cycles = obs, act, max_cycles
        table = REFUSED_OBS if obs in REFUSED_OBS else OBS_KINDS
        acts = REFUSED_ACT if act in REFUSED_ACT else ACT_KINDS
        self._obs = {a: _space(table, obs) for a in self.possible_agents}
        self._act = {a: _space(acts, act) for a in self.possible_agents}
        self.t = 0

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._act[agent]

    def _observe(self, agent: str) -> Any:
        space, odd = self._obs[agent], self.t % 2
        if self.obs_kind == "mask":
            mask = np.ones(3, np.int8)
            mask[2] = 0 if odd else 1
            return {"observation": np.array([odd, 1 - odd, 0], np.int8), "action_mask": mask}
        if isinstance(space, S.Box):
            x = np.full(space.shape, odd, space.dtype)
            return np.clip(x, space.low, space.high).astype(space.dtype)
        if isinstance(space, S.Discrete):
            return np.int64(space.start + odd)
        if isinstance(space, S.MultiDiscrete):
            return np.array([odd, 2 * odd], space.dtype)
        if isinstance(space, S.MultiBinary):
            return np.array([odd, 1 - odd, odd, 0], space.dtype)
        if self.obs_kind == "dict":
            return {"pos": np.full(2, odd, np.float32), "tag": np.int64(odd)}
        if self.obs_kind == "tuple":
            return (np.int64(odd), np.full((2, 2), odd, np.float64))
        if self.obs_kind == "nested":
            return {
                "a": (np.array([odd, 0], np.int8), np.int64(odd)),
                "b": np.full(1, odd, np.float32),
            }
        return space.sample()  # refused kinds never get here in a trainer

    def _infos(self) -> dict[str, dict[str, Any]]:
        if self.obs_kind != "info_mask":
            return {a: {} for a in self.agents}
        mask = np.array([1, 1, 0 if self.t % 2 else 1], np.int8)
        return {a: {"action_mask": mask.copy()} for a in self.agents}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents, self.t = list(self.possible_agents), 0
        return {a: self._observe(a) for a in self.agents}, self._infos()

    def _first(self, agent: str, action: Any) -> int:
        space = self._act[agent]
        if not space.contains(
            np.asarray(action, space.dtype) if not np.isscalar(action) else action
        ):
            raise ValueError(f"{agent}: action {action!r} is not in {space}")
        if isinstance(space, S.Box):
            return int(np.asarray(action).reshape(-1)[0] > 0)
        if isinstance(space, S.Discrete):
            return int(action) - int(space.start)
        return int(np.asarray(action).reshape(-1)[0]) - int(
            np.asarray(getattr(space, "start", 0)).reshape(-1)[0]
        )

    def step(self, actions: dict[str, Any]) -> tuple[dict, ...]:
        odd = self.t % 2
        rewards = {a: float(self._first(a, actions[a]) == odd) for a in self.agents}
        self.t += 1
        done = self.t >= self.max_cycles
        terms = dict.fromkeys(self.agents, False)
        truncs = dict.fromkeys(self.agents, done)
        obs = {a: self._observe(a) for a in self.agents}
        infos = self._infos()
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos


def space_env(obs: str = "box", act: str = "discrete", max_cycles: int = 6) -> SpaceEnv:
    """A :class:`SpaceEnv` (the factory ``marl run tests.pz_toys:space_env`` names)."""
    return SpaceEnv(obs, act, max_cycles)


class QuitterEnv(ParallelEnv):
    """``quitter`` terminates after ``quit_at`` steps, ``stayer`` goes on to ``max_cycles``
    (truncated). Rewards differ per agent and step (seeded), so paying one agent another's
    reward shows."""

    metadata = {"name": "quitter_env", "render_modes": []}  # noqa: RUF012

    def __init__(self, quit_at: int = 3, max_cycles: int = 8) -> None:
        self.possible_agents = ["quitter", "stayer"]
        self.agents: list[str] = []
        self.quit_at, self.max_cycles = quit_at, max_cycles
        self._rng = np.random.default_rng(0)
        self.t = 0

    def observation_space(self, agent: str) -> gym.Space:
        return S.Box(-10.0, 10.0, (2,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        return S.Discrete(2)

    def _obs(self) -> dict[str, np.ndarray]:
        return {a: np.array([self.t / 10, i], np.float32) for i, a in enumerate(self.agents)}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self._rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, ...]:
        base = {"quitter": -0.3, "stayer": 2.0}
        rewards = {
            a: base[a] + float(actions[a]) + float(self._rng.normal(0, 0.1)) for a in self.agents
        }
        self.t += 1
        terms = {a: a == "quitter" and self.t >= self.quit_at for a in self.agents}
        truncs = {a: not terms[a] and self.t >= self.max_cycles for a in self.agents}
        obs = self._obs()
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos


def quitter_env(quit_at: int = 3, max_cycles: int = 8) -> QuitterEnv:
    return QuitterEnv(quit_at, max_cycles)


class ChurnEnv(ParallelEnv):
    """``possible_agents`` are three; each episode has two of them (chosen by the seed), a
    ``state`` attribute that is a dict (as PettingZoo's rps keeps), no ``render_mode`` and no
    ``max_cycles`` argument; episodes last 4 steps (terminated)."""

    metadata = {"name": "churn_env", "render_modes": []}  # noqa: RUF012

    def __init__(self) -> None:
        self.possible_agents = ["a_0", "b_0", "c_0"]
        self.agents: list[str] = []
        self.state = {"note": "not a method"}
        self.t = 0

    def observation_space(self, agent: str) -> gym.Space:
        return S.Discrete(5)

    def action_space(self, agent: str) -> gym.Space:
        return S.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        rng = np.random.default_rng(seed)
        out = int(rng.integers(3))
        self.agents = [a for i, a in enumerate(self.possible_agents) if i != out]
        self.t = 0
        return dict.fromkeys(self.agents, 0), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, ...]:
        self.t += 1
        rewards = {a: float(actions[a]) for a in self.agents}
        done = self.t >= 4
        obs = dict.fromkeys(self.agents, self.t)
        terms, truncs = dict.fromkeys(self.agents, done), dict.fromkeys(self.agents, False)
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos


class BrokenStateEnv(QuitterEnv):
    """A :class:`QuitterEnv` whose ``state()`` raises (any exception)."""

    def state(self) -> np.ndarray:
        raise KeyError("no state here")


def broken_state_env() -> BrokenStateEnv:
    return BrokenStateEnv()
