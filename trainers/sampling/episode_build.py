"""RLlib's ``MultiAgentEpisode.add_env_reset`` / ``add_env_step`` without their per-step cost.

The batched sampler (:mod:`trainers.sampling.batched_runner`) records every env step through
:func:`add_env_reset` and :func:`add_env_step`. Contract: applied to the same episode with the
same arguments they leave it in exactly the state RLlib's methods leave it in (every buffer,
``env_t_to_agent_t`` mapping, hanging action/reward/extra-output cache, agent-to-module
mapping, flag and the order of ``agent_episodes``), raise the same ``MultiAgentEnvError``\\ s,
and differ only in wall-clock stamps and random episode ids (``tests/test_episode_build.py``
compares them field by field). What they skip: building each agent's ``SingleAgentEpisode``
through its constructor (four ``InfiniteLookbackBuffer``\\ s, each computing its space's
structure, and a ``validate()``), the list-building ``set`` churn of the multi-agent step and
the per-item buffer methods. RLlib's private fields are written through
:mod:`trainers.rllib_compat.episodes` (pinned by ``tests/test_rllib_compat.py``). An episode
already turned into numpy goes through RLlib's own methods (RLlib then checks the spaces as
it appends).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.error import MultiAgentEnvError

from trainers.rllib_compat.episodes import (
    blank_agent_episode,
    del_hanging,
    hanging_end,
    hanging_rewards_begin,
    last_added,
    lookback_len,
    new_buffer,
    set_last_added,
    stamp_start,
    stamp_step,
)

SKIP = MultiAgentEpisode.SKIP_ENV_TS_TAG


def new_agent_episode(episode: MultiAgentEpisode, agent_id: Any) -> SingleAgentEpisode:
    """The empty ``SingleAgentEpisode`` RLlib's step creates for ``agent_id`` (module mapped
    through ``episode.module_for``, as RLlib does)."""
    return blank_agent_episode(
        agent_id,
        episode.module_for(agent_id),
        episode.id_,
        episode.observation_space.get(agent_id),
        episode.action_space.get(agent_id),
    )


def _append(buffer: InfiniteLookbackBuffer, item: Any) -> None:
    """``buffer.append(item)``."""
    if buffer.finalized:
        buffer.append(item)
    else:
        buffer.data.append(item)


def _is_numpy(sa: SingleAgentEpisode) -> bool:
    return sa.observations.finalized or sa.rewards.finalized or sa.actions.finalized


def add_env_reset(
    episode: MultiAgentEpisode, observations: Mapping[Any, Any], infos: Mapping | None = None
) -> None:
    """``episode.add_env_reset(observations=..., infos=...)`` (module doc)."""
    assert not episode.is_done
    assert episode.env_t == episode.env_t_started == 0
    infos = infos or {}
    for agent_id, obs in observations.items():
        episode.env_t_to_agent_t[agent_id].append(0)
        sa = episode.agent_episodes.get(agent_id)
        if sa is None:
            sa = episode.agent_episodes[agent_id] = new_agent_episode(episode, agent_id)
        if _is_numpy(sa):
            sa.add_env_reset(observation=obs, infos=infos.get(agent_id))
            continue
        assert len(sa.observations) == 0 and sa.t == sa.t_started == 0 and not sa.is_done
        info = infos.get(agent_id) or {}
        sa.observations.data.append(obs)
        sa.infos.data.append(info)
        set_last_added(sa, obs, info)
        stamp_start(sa)
    episode.validate()
    stamp_start(episode)


def add_env_step(
    episode: MultiAgentEpisode,
    observations: Mapping[Any, Any],
    actions: Mapping[Any, Any],
    rewards: Mapping[Any, Any],
    infos: Mapping | None = None,
    *,
    terminateds: Mapping | None = None,
    truncateds: Mapping | None = None,
    extra_model_outputs: Mapping | None = None,
) -> None:
    """``episode.add_env_step(...)`` with the same arguments (module doc)."""
    if episode.is_done:
        raise MultiAgentEnvError(
            "Cannot call `add_env_step` on a MultiAgentEpisode that is already done!"
        )
    infos = infos or {}
    terminateds = terminateds or {}
    truncateds = truncateds or {}
    extra_model_outputs = extra_model_outputs or {}
    episode.env_t += 1
    episode.is_terminated = terminateds.get("__all__", False)
    episode.is_truncated = truncateds.get("__all__", False)
    sa_episodes = episode.agent_episodes
    if all(  # RLlib: every agent done (in whatever mix of ways) terminates the episode
        sa.is_terminated or sa.is_truncated or terminateds.get(a) or truncateds.get(a)
        for a, sa in sa_episodes.items()
    ):
        episode.is_terminated = True
    for agent_id, mapping in episode.env_t_to_agent_t.items():
        if agent_id not in observations:
            _append(mapping, SKIP)
    # the same set expression as RLlib's: agents are visited (and created) in its order
    ending = terminateds.get("__all__") or truncateds.get("__all__")
    agent_ids = (
        set(observations.keys())
        | set(actions.keys())
        | set(rewards.keys())
        | set(terminateds.keys())
        | set(truncateds.keys())
        | set(sa_episodes.keys() if ending else set())
    ) - {"__all__"}
    for agent_id in agent_ids:
        _agent_step(
            episode,
            agent_id,
            observations,
            actions,
            rewards,
            infos.get(agent_id),
            terminateds.get(agent_id, False) or episode.is_terminated,
            truncateds.get(agent_id, False) or episode.is_truncated,
            extra_model_outputs.get(agent_id),
        )
    episode.validate()
    stamp_step(episode)


def _agent_step(
    episode: MultiAgentEpisode,
    agent_id: Any,
    observations: Mapping,
    actions: Mapping,
    rewards: Mapping,
    info: Any,
    terminated: bool,
    truncated: bool,
    extra: Any,
) -> None:
    """One agent's part of RLlib's ``add_env_step`` (its cases 1–4, in its order)."""
    sa = episode.agent_episodes.get(agent_id)
    if sa is None:
        sa = new_agent_episode(episode, agent_id)
    obs = observations.get(agent_id)
    action = actions.get(agent_id)
    reward = rewards.get(agent_id)
    if sa.is_done and any(v is not None for v in (obs, action, reward, info, extra)):
        raise MultiAgentEnvError(
            f"Agent {agent_id} already had its `SingleAgentEpisode.is_done` "
            f"set to True, but still received data in a following step! "
            f"obs={obs} act={action} rew={reward} info={info} "
            f"extra_model_outputs={extra}."
        )
    reward = reward or 0.0
    if obs is not None and action is not None:  # case 1: a complete agent step
        if agent_id not in rewards:
            raise MultiAgentEnvError(
                f"Agent {agent_id} acted (and received next obs), but did NOT "
                f"receive any reward from the env!"
            )
    elif obs is not None:  # case 2: a hanging action completes, or the first observation
        actions_end, rewards_end, extras_end = hanging_end(episode)
        action = actions_end.pop(agent_id, None)
        if action is not None:
            extra = extras_end.pop(agent_id, None)
            reward = rewards_end.pop(agent_id, 0.0) + reward
        elif terminated or truncated:
            del_hanging(episode, agent_id)
            return
        else:
            _first_observation(episode, sa, agent_id, obs, info, reward)
            return
    else:  # cases 3 and 4: no observation
        acted = agent_id not in observations and agent_id in actions
        done = (terminated, truncated)
        step = _no_observation(episode, sa, agent_id, acted, action, reward, extra, done)
        if step is None:
            return
        obs, info, action, reward, extra = step
    if obs is not None:
        _sa_step(sa, obs, action, reward, info, terminated, truncated, extra)
        agent_t = sa.t - sa.t_started + episode.agent_t_started[agent_id]  # len(sa) + start
        _append(episode.env_t_to_agent_t[agent_id], agent_t)
    if terminated or truncated:
        del_hanging(episode, agent_id)


def _no_observation(
    episode: MultiAgentEpisode,
    sa: SingleAgentEpisode,
    agent_id: Any,
    acted: bool,
    action: Any,
    reward: float,
    extra: Any,
    done: tuple[bool, bool],
) -> tuple | None:
    """RLlib's cases 3 (the agent acted in this step; its next observation is still to come)
    and 4 (rewards and done flags only) of an agent without an observation in the step;
    ``done``: its ``(terminated, truncated)``. Returns ``(obs, info, action, reward, extra)``
    of the agent's step (``obs`` None: nothing to add), or None when it drops out here."""
    terminated, truncated = done
    actions_end, rewards_end, extras_end = hanging_end(episode)
    if acted:  # case 3
        if truncated:
            raise _truncated_without_observation(agent_id)
        if terminated:
            return *last_added(sa), action, reward, extra
        assert agent_id not in actions_end
        actions_end[agent_id] = action
        rewards_end[agent_id] = reward
        extras_end[agent_id] = extra
        return None, None, action, reward, extra
    action = actions_end.get(agent_id)  # case 4
    if terminated or truncated:
        if action is None:
            del_hanging(episode, agent_id)
            return None
        if truncated:
            raise _truncated_without_observation(agent_id)
        extra = extras_end.pop(agent_id, None)
        reward = rewards_end.pop(agent_id, 0.0) + reward
        return *last_added(sa), action, reward, extra
    if agent_id not in episode.agent_episodes:
        hanging_rewards_begin(episode)[agent_id] += reward
    else:
        rewards_end[agent_id] += reward
    return None, None, action, reward, extra


def _truncated_without_observation(agent_id: Any) -> MultiAgentEnvError:
    return MultiAgentEnvError(
        f"Agent {agent_id} acted and then got truncated, but did NOT receive a last "
        "(truncation) observation, required for e.g. value function bootstrapping!"
    )


def _first_observation(
    episode: MultiAgentEpisode,
    sa: SingleAgentEpisode,
    agent_id: Any,
    obs: Any,
    info: Any,
    reward: float,
) -> None:
    """An agent's first observation after the reset (RLlib's case 2b)."""
    assert agent_id not in episode.env_t_to_agent_t
    mapping = episode.env_t_to_agent_t[agent_id]
    mapping.extend([SKIP] * episode.env_t + [0])
    mapping.lookback = lookback_len(episode)
    if _is_numpy(sa):
        sa.add_env_reset(observation=obs, infos=info)
    else:
        assert len(sa.observations) == 0 and sa.t == sa.t_started == 0 and not sa.is_done
        info = info or {}
        sa.observations.data.append(obs)
        sa.infos.data.append(info)
        set_last_added(sa, obs, info)
        stamp_start(sa)
    hanging_rewards_begin(episode)[agent_id] += reward
    episode.agent_episodes[agent_id] = sa


def _sa_step(
    sa: SingleAgentEpisode,
    obs: Any,
    action: Any,
    reward: Any,
    info: Any,
    terminated: bool,
    truncated: bool,
    extra: Any,
) -> None:
    """``SingleAgentEpisode.add_env_step`` on an episode whose buffers are lists."""
    if _is_numpy(sa):
        sa.add_env_step(
            observation=obs,
            action=action,
            reward=reward,
            infos=info,
            terminated=terminated,
            truncated=truncated,
            extra_model_outputs=extra,
        )
        return
    assert not sa.is_done, "The agent is already done: no data can be added to its episode."
    info = info or {}
    sa.observations.data.append(obs)
    sa.actions.data.append(action)
    sa.rewards.data.append(reward)
    sa.infos.data.append(info)
    sa.t += 1
    if extra is not None:
        outputs = sa.extra_model_outputs
        for k, v in extra.items():
            buf = outputs.get(k)
            if buf is None:
                outputs[k] = new_buffer(data=[v])
            else:
                _append(buf, v)
    sa.is_terminated = terminated
    sa.is_truncated = truncated
    set_last_added(sa, obs, info)
    stamp_step(sa)
