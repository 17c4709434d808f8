"""RLlib's ``MultiAgentEpisode.cut`` without its per-agent cost, for the batched sampler.

At the end of every ``sample()`` the batched sampler (:mod:`trainers.sampling.batched_runner`)
cuts each running episode: the chunk goes to the learner, its continuation (same ids, a
lookback of the last steps) goes on sampling. RLlib's ``cut`` reads the lookback window through
its generic multi-agent getters, then rebuilds every agent's ``SingleAgentEpisode`` through the
``MultiAgentEpisode`` and ``SingleAgentEpisode`` constructors (four lookback buffers per agent,
each computing its space's structure, a ``validate()`` per agent): with 100+ agents and short
chunks (many sub-envs, few env steps each per ``sample()``) that was most of the sampler's time.

:func:`cut` gives the continuation RLlib's ``cut`` gives — every buffer with its lookback, the
env-to-agent step mappings, hanging caches, module mapping, flags, the order of
``agent_episodes``, and the side effect RLlib's getters have on the cut episode (its
``agent_t_started`` gains an entry for each agent read) — for the regular case of a parallel
env: every agent still running observed at each step of the window (the last ``lookback + 1``
env steps, all inside the chunk) and has no hanging action; every agent done has no step in the
window. Any other episode (an agent that ended or arrived inside the window, hanging actions,
an episode already in numpy, a window reaching before the chunk) goes through RLlib's own
``cut``. ``tests/test_many_agents_speed.py`` compares the two field by field.
"""

from __future__ import annotations

import copy
from typing import Any

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

from trainers.rllib_compat.episodes import (
    blank_agent_episode,
    blank_multi_agent_episode,
    hanging_end,
    hanging_rewards_begin,
    new_buffer,
)

SKIP = MultiAgentEpisode.SKIP_ENV_TS_TAG


def cut(episode: MultiAgentEpisode, len_lookback_buffer: int = 0) -> MultiAgentEpisode:
    """``episode.cut(len_lookback_buffer=...)`` (module doc)."""
    plan = _plan(episode, len_lookback_buffer)
    if plan is None:
        return episode.cut(len_lookback_buffer=len_lookback_buffer)
    return _successor(episode, len_lookback_buffer, *plan)


def _plan(episode: MultiAgentEpisode, lb: int) -> tuple[list, list] | None:
    """``(running, gone)`` of the fast path: per running agent ``(id, its episode, the buffer
    index of the window's first observation)``; the ids of the agents done before the window.
    ``None``: the episode is not the regular case (module doc)."""
    if episode.is_done or lb < 0 or episode.env_t - episode.env_t_started < lb:
        return None
    actions_end, rewards_end, extras_end = hanging_end(episode)
    if actions_end:
        return None
    hanging = rewards_end.keys() | extras_end.keys()
    started = episode.agent_t_started
    mappings = episode.env_t_to_agent_t
    running: list[tuple[Any, SingleAgentEpisode, int]] = []
    gone: list[Any] = []
    for aid, sa in episode.agent_episodes.items():
        mapping = mappings.get(aid)
        if mapping is None or mapping.finalized or sa.observations.finalized:
            return None
        data = mapping.data
        if len(data) - mapping.lookback < lb + 1:
            return None
        window = data[len(data) - lb - 1 :]
        if sa.is_terminated or sa.is_truncated:
            if any(m != SKIP for m in window):
                return None  # it ended inside the window
            gone.append(aid)
            continue
        first = window[0]
        if first == SKIP or aid in hanging or window != list(range(first, first + lb + 1)):
            return None  # not observed at every step of the window
        pos = first - started.get(aid, 0) + sa.observations.lookback
        n = len(sa.actions.data)
        if (
            pos < 0
            or pos + lb + 1 != len(sa.observations.data)
            or pos + lb != n
            or len(sa.rewards.data) != n
            or len(sa.infos.data) != n + 1
            or any(len(b.data) != n or b.finalized for b in sa.extra_model_outputs.values())
        ):
            return None
        running.append((aid, sa, pos))
    if not running:
        return None
    for aid, _, _ in running:  # RLlib's getters read agent_t_started, a defaultdict
        started[aid]
    return running, gone


def _successor(
    episode: MultiAgentEpisode,
    lb: int,
    running: list[tuple[Any, SingleAgentEpisode, int]],
    gone: list[Any],
) -> MultiAgentEpisode:
    """The continuation RLlib's ``cut`` builds for the plan ``(running, gone)``."""
    sas = episode.agent_episodes
    new = blank_multi_agent_episode(
        episode.id_,
        episode.agent_to_module_mapping_fn,
        {aid: sas[aid].module_id for aid in episode.agent_ids},
        lb,
        episode.observation_space,
        episode.action_space,
    )
    new.env_t_started = new.env_t = episode.env_t
    new.agent_t_started.update(
        {aid: sas[aid].t for aid in episode.agent_ids if not sas[aid].is_done}
    )
    rewards_end = hanging_end(new)[1]
    for aid in gone:  # RLlib adds each absent agent's (missing) window rewards: 0.0
        rewards_end[aid] += 0.0
    hanging_rewards_begin(new).update(hanging_end(episode)[1])
    new.is_terminated = new.is_truncated = episode.is_terminated  # sic: RLlib's cut says so
    for aid, sa, pos in running:
        mapping = new.env_t_to_agent_t[aid] = new_buffer(None, list(range(sa.t - lb, sa.t + 1)))
        mapping.lookback = lb
        new.agent_episodes[aid] = _agent_successor(new, sa, pos, lb)
    new.custom_data.update(copy.deepcopy(episode.custom_data))
    return new


def _fill(buffer: InfiniteLookbackBuffer, data: list, lookback: int) -> None:
    """Make ``buffer`` hold ``data`` with a lookback of ``lookback`` (at most all of it), as
    ``InfiniteLookbackBuffer(data, lookback=lookback)`` would."""
    buffer.data = data
    buffer.lookback = min(lookback, len(data))


def _agent_successor(
    new: MultiAgentEpisode, sa: SingleAgentEpisode, pos: int, lb: int
) -> SingleAgentEpisode:
    """A running agent's episode in the continuation: the window's ``lb + 1`` observations and
    ``lb`` actions, rewards and extra model outputs, all lookback (what RLlib's constructors
    build from them)."""
    end = pos + lb
    aid = sa.agent_id
    out = blank_agent_episode(
        aid, sa.module_id, new.id_, new.observation_space.get(aid), new.action_space.get(aid)
    )
    out.id_ = sa.id_
    _fill(out.observations, sa.observations.data[pos : end + 1], lb)
    _fill(out.infos, sa.infos.data[pos : end + 1], lb)
    _fill(out.actions, sa.actions.data[pos:end], lb)
    # RLlib sums each window reward into a fresh hanging-reward cache (0.0 + r) first
    _fill(out.rewards, [0.0 + r for r in sa.rewards.data[pos:end]], lb)
    if lb:
        for k, b in sa.extra_model_outputs.items():
            out.extra_model_outputs[k] = buf = new_buffer(None, b.data[pos:end])
            buf.lookback = min(lb, len(buf.data))
    out.t_started = out.t = sa.t
    return out
