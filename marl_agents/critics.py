"""Centralised critics (CTDE): the critic-input column, its width, and the value network.

A pool's module gets a centralised critic when its model config has ``critic_dim > 0``
(``trainers`` sets it from ``algorithm.critic``): a separate value network
(:func:`central_critic`, an MLP of the pool's ``hidden`` sizes) over the batch column
:data:`CRITIC_OBS`, which only the learner builds (``trainers.learners.critic_input``: the
global state, optionally with the agent's own observation and a one-hot agent id). The actor's
forward never reads that column and never runs the critic, so env runners (which hold no
``CRITIC_OBS``) act from each agent's own observation only.

Critic inputs (``algorithm.critic``):

* ``local``: the module's own critic over the agent's observation (IPPO; no column).
* ``state``: the global state (``scenarios.global_state``).
* ``state_obs``: the global state, the agent's own observation (flattened) and a one-hot id of
  the agent among the team's agents (MAPPO's agent-specific global state).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

#: the batch column of a module's critic features (learner side only)
CRITIC_OBS = "critic_obs"
#: ``algorithm.critic`` values
CRITIC_INPUTS = ("local", "state", "state_obs")


def critic_input_dim(kind: str, state_dim: int, obs_dim: int, n_agents: int) -> int:
    """The width of :data:`CRITIC_OBS` for critic input ``kind`` (0 for ``local``)."""
    if kind == "local":
        return 0
    if kind == "state":
        return state_dim
    if kind == "state_obs":
        return state_dim + obs_dim + n_agents
    raise ValueError(f"critic input {kind!r} is unknown: use one of {', '.join(CRITIC_INPUTS)}")


def central_critic(net: nn.Module, width: int) -> nn.Sequential:
    """The value network: ``net`` (features → ``width``) and a linear value head."""
    return nn.Sequential(net, nn.Linear(width, 1))


def central_values(critic: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """The centralised critic's values of ``batch`` (``[B]`` or ``[B, T]``).

    Raises:
        KeyError: the batch has no :data:`CRITIC_OBS` (the learner pipeline lacks the critic
            input piece, e.g. a module trained with a centralised critic loaded into a run with
            ``algorithm.critic: local``).
    """
    if CRITIC_OBS not in batch:
        raise KeyError(
            f"this module has a centralised critic but the batch has no {CRITIC_OBS!r} column: "
            "train it with algorithm.critic state or state_obs (the learner adds the column)"
        )
    return critic(batch[CRITIC_OBS].float()).squeeze(-1)
