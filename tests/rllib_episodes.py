"""Recording real episodes as RLlib's env runners do, without Ray (tests and benches).

:func:`record_episode` steps an ``RLlibGraphEnv`` under a policy and records every step in a
``MultiAgentEpisode`` (numpy'd when it finishes, as env runners send them to the learner).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

Policy = Callable[[str, Any], Any]


def record_episode(
    env: Any,
    seed: int,
    policy: Policy,
    *,
    module_of: Callable[..., str] | None = None,
    strip: tuple[str, ...] = (),
    steps: int | None = None,
    cut_after: int | None = None,
    numpy: bool = True,
) -> MultiAgentEpisode:
    """One episode of ``env`` (an ``RLlibGraphEnv``) under ``policy`` from ``reset(seed)``.

    Args:
        module_of: the episode's agent-to-module mapping function.
        strip: info keys left out of the recorded infos.
        steps: stop after this many env steps (an unfinished chunk), else at the episode's end.
        cut_after: cut the episode after this many steps, as ``truncate_episodes`` does at a
            batch boundary, and return the chunk that follows.
        numpy: numpy a finished episode, as env runners do.
    """
    episode = MultiAgentEpisode(
        observation_space=env.observation_spaces,
        action_space=env.action_spaces,
        agent_to_module_mapping_fn=module_of,
    )
    obs, infos = env.reset(seed=seed)
    episode.add_env_reset(observations=obs, infos=_strip(infos, strip))
    done, taken = False, 0
    while not done and taken != steps:
        actions = {a: policy(a, o) for a, o in obs.items()}
        obs, rewards, terms, truncs, infos = env.step(actions)
        episode.add_env_step(
            observations=obs,
            actions=actions,
            rewards=rewards,
            infos=_strip(infos, strip),
            terminateds=terms,
            truncateds=truncs,
        )
        taken += 1
        done = terms["__all__"] or truncs["__all__"]
        if taken == cut_after and not done:
            episode = episode.cut()
    return episode.to_numpy() if done and numpy else episode


def _strip(infos: dict[str, dict], keys: tuple[str, ...]) -> dict[str, dict]:
    if not keys:
        return infos
    return {a: {k: v for k, v in i.items() if k not in keys} for a, i in infos.items()}
