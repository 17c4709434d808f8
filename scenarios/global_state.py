"""The global state of a Dec-POMDP, for centralised critics (CTDE): the one contract.

An environment that trains with a centralised critic reports, with every observation it
returns, the global state under ``infos[agent][STATE_INFO]``: a flat ``float32`` numpy array
of the shape of the scenario's ``state_space`` (a ``Box``). Actors never read it; only the
learner builds critic inputs from it (``trainers.learners.critic_input``).

* A LangGraph scenario's state is :meth:`scenarios.base.Scenario.global_state`: by default the
  concatenation, in ``possible_agents`` order, of every agent's latest observation (flattened;
  zeros before its first), which the env computes from observations alone
  (:func:`concat_state`, :func:`concat_state_space`). A scenario may declare its own projection
  by overriding ``global_state`` (and setting ``state_space`` to its space where the width
  differs; ``spread`` gives mpe2's ``state()``). :func:`state_space_of` is the space in
  force: the declared one, else the default's; ``None`` for scenarios whose agents act with
  text or whose observations are not all ``Box``es: centralised critics are refused there.
* A PettingZoo env brought in as a scenario reports its own ``env.state()`` under the same key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

#: the infos key under which an env reports the global state with each agent's observation
STATE_INFO = "marl_state"


def concat_state_space(spaces: Mapping[str, gym.Space]) -> gym.spaces.Box | None:
    """The space of :func:`concat_state` over ``spaces`` (agent → observation space, in order),
    or None when one of them is not a ``Box``."""
    if not spaces or not all(isinstance(s, gym.spaces.Box) for s in spaces.values()):
        return None
    dim = sum(int(gym.spaces.flatdim(s)) for s in spaces.values())
    return gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)


def concat_state(
    observations: Mapping[str, Any], agents: Sequence[str], spaces: Mapping[str, gym.Space]
) -> np.ndarray:
    """Every agent's latest observation in ``agents`` order, flattened to ``float32`` and
    concatenated; zeros for an agent without one yet."""
    parts = [
        np.asarray(observations[a], np.float32).ravel()
        if a in observations
        else np.zeros(int(gym.spaces.flatdim(spaces[a])), np.float32)
        for a in agents
    ]
    return np.concatenate(parts)


def state_space_of(scenario: Any) -> gym.spaces.Box | None:
    """The space of ``scenario``'s global state: its declared ``state_space``, else the default
    concatenation's (None for text agents or observations that are not all ``Box``es)."""
    declared = getattr(scenario, "state_space", None)
    if declared is not None:
        return declared  # type: ignore[no-any-return]
    if getattr(scenario, "has_text_agents", False):
        return None
    agents = scenario.possible_agents
    return concat_state_space({a: scenario.observation_space(a) for a in agents})
