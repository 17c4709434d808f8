"""RLlib 2.60 episode internals the fast episode builder writes directly
(:mod:`trainers.sampling.episode_build`; package doc: :mod:`trainers.rllib_compat`).

The builder creates ``SingleAgentEpisode``\\ s and ``InfiniteLookbackBuffer``\\ s without their
constructors and keeps ``MultiAgentEpisode``'s hanging action/reward/extra-output caches as
RLlib's ``add_env_step`` keeps them. The primitives here are the only code that names those
private fields.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from typing import Any

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import _REWARDS_BOX_SPACE, SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space

__all__ = [
    "REWARDS_SPACE",
    "blank_agent_episode",
    "blank_multi_agent_episode",
    "del_hanging",
    "hanging_end",
    "hanging_rewards_begin",
    "last_added",
    "lookback_len",
    "new_buffer",
    "set_last_added",
    "stamp_start",
    "stamp_step",
]

#: the space of every agent episode's rewards buffer (a scalar float32 ``Box``).
#: RLlib 2.60: ``ray.rllib.env.single_agent_episode._REWARDS_BOX_SPACE``
REWARDS_SPACE = _REWARDS_BOX_SPACE

#: id(space) → (space, its base struct): the space is kept so that its id is never reused
_STRUCTS: dict[int, tuple[Any, Any]] = {}


def _struct(space: Any) -> Any:
    hit = _STRUCTS.get(id(space))
    if hit is None or hit[0] is not space:
        hit = _STRUCTS[id(space)] = (space, get_base_struct_from_space(space))
    return hit[1]


def new_buffer(space: Any = None, data: list | None = None) -> InfiniteLookbackBuffer:
    """``InfiniteLookbackBuffer(data, lookback=0, space=space)`` for a list ``data``, without
    its constructor's work (the space's struct is computed once per space). RLlib 2.60: the
    buffer's fields are ``data``, ``lookback``, ``finalized``, ``_space``, ``_space_struct``."""
    b = InfiniteLookbackBuffer.__new__(InfiniteLookbackBuffer)
    b.data = [] if data is None else data
    b.lookback = 0
    b.finalized = False
    b._space = space
    b._space_struct = _struct(space)
    return b


def blank_agent_episode(
    agent_id: Any, module_id: Any, episode_id: str, obs_space: Any, act_space: Any
) -> SingleAgentEpisode:
    """The empty ``SingleAgentEpisode`` ``MultiAgentEpisode.add_env_step`` creates for an agent
    (of multi-agent episode ``episode_id``), every field as its constructor sets it. RLlib
    2.60: besides the public fields, ``_observation_space``, ``_action_space``,
    ``_custom_data``, ``_start_time``, ``_last_step_time``, ``_last_added_observation``,
    ``_last_added_infos``."""
    sa = SingleAgentEpisode.__new__(SingleAgentEpisode)
    sa.id_ = uuid.uuid4().hex
    sa.agent_id = agent_id
    sa.module_id = module_id
    sa.multi_agent_episode_id = episode_id
    sa.observations = new_buffer(obs_space)
    sa._observation_space = obs_space
    sa.infos = new_buffer()
    sa.actions = new_buffer(act_space)
    sa._action_space = act_space
    sa.rewards = new_buffer(REWARDS_SPACE)
    sa.is_terminated = False
    sa.is_truncated = False
    sa.extra_model_outputs = {}
    sa.t_started = 0
    sa.t = 0
    sa._custom_data = {}
    sa._start_time = None
    sa._last_step_time = None
    sa._last_added_observation = None
    sa._last_added_infos = None
    return sa


def blank_multi_agent_episode(
    id_: str,
    mapping_fn: Any,
    module_ids: dict[Any, Any],
    len_lookback_buffer: int,
    observation_space: Any,
    action_space: Any,
) -> MultiAgentEpisode:
    """The ``MultiAgentEpisode`` RLlib's constructor builds from these arguments and no data
    (``agent_module_ids=module_ids`` kept as the same dict, ``len_lookback_buffer``; ``env_t``
    and ``env_t_started`` 0), every field as it sets it, without its per-agent work (for
    :mod:`trainers.sampling.episode_cut`). RLlib 2.60: besides the public fields,
    ``_agent_to_module_mapping``, ``_len_lookback_buffers``, the four hanging caches,
    ``_custom_data``, ``_start_time``, ``_last_step_time``."""
    ep = MultiAgentEpisode.__new__(MultiAgentEpisode)
    ep.id_ = id_
    ep.agent_to_module_mapping_fn = mapping_fn
    ep._agent_to_module_mapping = module_ids
    ep._len_lookback_buffers = len_lookback_buffer
    ep.observation_space = observation_space or {}
    ep.action_space = action_space or {}
    ep.env_t_started = ep.env_t = 0
    ep.agent_t_started = defaultdict(int)
    ep.env_t_to_agent_t = defaultdict(InfiniteLookbackBuffer)
    ep._hanging_actions_end = {}
    ep._hanging_extra_model_outputs_end = defaultdict(dict)
    ep._hanging_rewards_end = defaultdict(float)
    ep._hanging_rewards_begin = defaultdict(float)
    ep.is_terminated = ep.is_truncated = False
    ep.agent_episodes = {}
    ep._custom_data = {}
    ep._start_time = None
    ep._last_step_time = None
    return ep


def last_added(sa: SingleAgentEpisode) -> tuple[Any, Any]:
    """``(observation, infos)`` last added to an agent's episode (what RLlib repeats as the
    final observation of an agent terminated without one). RLlib 2.60:
    ``SingleAgentEpisode._last_added_observation`` / ``_last_added_infos``."""
    return sa._last_added_observation, sa._last_added_infos


def set_last_added(sa: SingleAgentEpisode, obs: Any, info: Any) -> None:
    """Record ``(obs, info)`` as :func:`last_added`, as ``SingleAgentEpisode.add_env_*`` do."""
    sa._last_added_observation = obs
    sa._last_added_infos = info


def stamp_start(episode: Any) -> None:
    """Stamp an episode's (single- or multi-agent) start time now, as ``add_env_reset`` does.
    RLlib 2.60: ``_start_time`` (``time.perf_counter()``)."""
    episode._start_time = time.perf_counter()


def stamp_step(episode: Any) -> None:
    """Stamp an episode's last step time now (and its start time, when unset), as
    ``add_env_step`` does. RLlib 2.60: ``_last_step_time``, ``_start_time``."""
    episode._last_step_time = time.perf_counter()
    if episode._start_time is None:
        episode._start_time = episode._last_step_time


def hanging_end(episode: MultiAgentEpisode) -> tuple[dict, dict, dict]:
    """The caches of actions still waiting for their agent's next observation: ``(actions,
    rewards, extra model outputs)`` by agent id (rewards a ``defaultdict(float)``). RLlib
    2.60: ``MultiAgentEpisode._hanging_actions_end``, ``_hanging_rewards_end``,
    ``_hanging_extra_model_outputs_end``."""
    return (
        episode._hanging_actions_end,
        episode._hanging_rewards_end,
        episode._hanging_extra_model_outputs_end,
    )


def hanging_rewards_begin(episode: MultiAgentEpisode) -> Any:
    """Rewards of agents before their first observation (a ``defaultdict(float)``). RLlib
    2.60: ``MultiAgentEpisode._hanging_rewards_begin``."""
    return episode._hanging_rewards_begin


def del_hanging(episode: MultiAgentEpisode, agent_id: Any) -> None:
    """Drop every hanging value of ``agent_id``. RLlib 2.60: ``MultiAgentEpisode._del_hanging``."""
    episode._del_hanging(agent_id)


def lookback_len(episode: MultiAgentEpisode) -> int:
    """The episode's lookback length (for an agent's env-to-agent step mapping). RLlib 2.60:
    ``MultiAgentEpisode._len_lookback_buffers``."""
    return episode._len_lookback_buffers
