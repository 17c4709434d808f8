"""Time limits stay truncations on the learner (issue #27).

RLlib's ``MultiAgentEpisode.add_env_step`` (and the batched sampler's copy of it,
:mod:`trainers.sampling.episode_build`) declares a multi-agent episode *terminated* as soon as
every agent is done, in whatever mix of ways — also when every agent was truncated by a time
limit — and hands that flag to each agent's episode: an agent cut by ``max_cycles`` ends with
``is_terminated`` **and** ``is_truncated``. RLlib's GAE (``compute_value_targets``) gates the
bootstrap with ``terminateds``, so the time limit's ``V(s_T)`` was dropped: the last steps'
value targets were their rewards alone, in states the critic cannot tell from mid-episode ones
(mpe2's observations hold no time), which biases every advantage of the episode's tail.

Our envs (:mod:`scenarios.rllib_env`) never report an agent both terminated and truncated (an
episode ends one way or the other), so on the learner an agent episode flagged both is a
truncation: :func:`bootstrap_time_limits` clears its ``is_terminated`` before the learner
connector pipeline reads the flags (RLlib's pieces and the lean learner's array batch alike).
:class:`BootstrapTimeLimits` does it in a learner's ``_make_batch_if_necessary`` (episodes →
batch): every PPO learner (:class:`~trainers.learners.value_norm_learner.ValueNormPPOLearner`
and its subclasses) and the APPO / IMPALA learners (:mod:`trainers.learners.async_learners`,
whose V-trace gates its bootstrap with the same ``terminateds``). GRPO has no critic.

An agent that terminated while others went on (:func:`scenarios.leave`: a PettingZoo agent
that is done before the episode is) ends with its own ``terminated`` in that step and is never
flagged truncated, so it stays terminated here; in the step where the last agents end, RLlib
again flags them all terminated, and the truncated ones among them are cleared as above
(``tests/test_pz_agents_leave.py`` pins both for PPO, APPO and IMPALA).

Why here and not where episodes are built: RLlib's own sampler (``episodes.sampler: rllib``)
records episodes with RLlib's ``MultiAgentEpisode.add_env_step``, and the batched sampler's
copy (:mod:`trainers.sampling.episode_build`) is held to leave every episode exactly as RLlib's
does (``tests/test_episode_build.py``); a fix there would cover one sampler and break that
contract. Every episode of every sampler reaches a learner through
``_make_batch_if_necessary`` (the trainer never sets ``num_aggregator_actors_per_learner``,
which would build batches before it), so that is the one place that covers all learners.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["BootstrapTimeLimits", "bootstrap_time_limits"]


def bootstrap_time_limits(episodes: Iterable[Any]) -> int:
    """Clear ``is_terminated`` on every single-agent episode (of multi-agent or single-agent
    ``episodes``) that is also truncated; returns how many were changed."""
    changed = 0
    for episode in episodes:
        agents = getattr(episode, "agent_episodes", None)
        for sa in agents.values() if agents is not None else (episode,):
            if sa.is_terminated and sa.is_truncated:
                sa.is_terminated = False
                changed += 1
    return changed


class BootstrapTimeLimits:
    """Learner mixin (before the RLlib learner class in the bases): time limits bootstrap from
    ``V(s_T)`` — :func:`bootstrap_time_limits` on the episodes before the learner connector."""

    def _make_batch_if_necessary(self, training_data: Any) -> Any:
        bootstrap_time_limits(training_data.episodes or ())
        return super()._make_batch_if_necessary(training_data)  # type: ignore[misc]
