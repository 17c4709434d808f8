"""Policy versions on sampled episodes, and the one-step-ahead sample of asynchronous GRPO.

Contracts:

* The *policy version* is the number of learner updates behind the weights a runner samples
  with. :func:`sample_on_runner` stamps every episode it returns with the version of its
  **oldest** step in ``episode.custom_data[POLICY_VERSION]`` (an episode still running when a
  ``sample()`` call ends was begun under the previous call's weights and keeps that stamp).
  Behaviour logprobs (``TOKEN_LOGP``) are left as the sampler stored them.
* :class:`SamplePipeline` (``algorithm.grpo.async_sampling.enabled``): iteration ``k`` takes
  the batch sampled during iteration ``k−1``, launches the next sample on the remote runners
  (``foreach_env_runner_async``) *before* the learner update, waits for it *after* the update
  and syncs weights only when the next batch would otherwise exceed ``max_staleness``. So
  nothing is in flight between iterations: the pending batch is driver memory, saved in
  checkpoints by :mod:`trainers.run.resume` (exact resume). Episodes over the bound are dropped and
  counted (``grpo/stale_dropped``); ``grpo/staleness_mean`` / ``_max`` are logged per update.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from trainers.rllib_compat.runner import ongoing_episodes

log = logging.getLogger(__name__)

#: ``episode.custom_data`` key: policy version of the episode's oldest step.
POLICY_VERSION = "policy_version"
#: env-runner attribute: the policy version of the runner's current weights.
RUNNER_VERSION = "_marl_policy_version"
#: ``foreach_env_runner_async`` tag of the pipeline's samples.
TAG = "grpo_async_sample"


def shares(n: int, remote: int, group_size: int = 1) -> list[int]:
    """``n`` episodes split over ``remote`` runners in whole GRPO groups of ``group_size``
    (the first runners take the remainder), so no group is split between runners."""
    groups = n // group_size
    return [(groups // remote + (1 if i < groups % remote else 0)) * group_size
            for i in range(remote)]  # fmt: skip


def sample_on_runner(runner: Any, num_episodes: int, version: int) -> tuple[list[Any], Any]:
    """``runner.sample(num_episodes)`` with the runner's weights at ``version``; stamps episodes.

    Episodes still running from the previous call keep the version they began under.
    """
    previous = getattr(runner, RUNNER_VERSION, version)
    for episode in _ongoing(runner):
        episode.custom_data.setdefault(POLICY_VERSION, previous)
    setattr(runner, RUNNER_VERSION, version)
    episodes = runner.sample(num_episodes=num_episodes, explore=True)
    for episode in episodes:
        episode.custom_data.setdefault(POLICY_VERSION, version)
    return list(episodes), runner.get_metrics()


def _ongoing(runner: Any) -> list[Any]:
    """The runner's episodes in progress that have stepped (a fresh one has no old step)."""
    ongoing = ongoing_episodes(runner)
    return [e for e in ongoing if e is not None and hasattr(e, "custom_data") and len(e) > 0]


def staleness(episodes: list[Any], learner_version: int) -> list[int]:
    """Updates between each episode's oldest step and ``learner_version``."""
    return [
        learner_version - int(e.custom_data.get(POLICY_VERSION, learner_version)) for e in episodes
    ]


@dataclasses.dataclass
class SamplePipeline:
    """The pipeline state of asynchronous GRPO sampling (see the module doc).

    Attributes:
        max_staleness: the bound (``≥ 1``).
        learner_version: learner updates so far.
        runner_version: version of the weights the runners hold.
        pending: ``(episodes, runner metrics)`` sampled ahead, learnt from next iteration.
        dropped: episodes dropped for exceeding ``max_staleness`` (lifetime).
    """

    max_staleness: int = 1
    learner_version: int = 0
    runner_version: int = 0
    pending: tuple[list[Any], list[Any]] | None = None
    dropped: int = 0

    def launch(self, group: Any, n: int, group_size: int = 1) -> int:
        """Start sampling ``n`` episodes (whole groups of ``group_size``) on the remote runners;
        returns the requests made."""
        remote = group.num_remote_env_runners()
        share, version = shares(n, remote, group_size), self.runner_version

        def work(runner: Any) -> tuple[list[Any], Any]:
            k = share[(runner.worker_index - 1) % remote]
            return sample_on_runner(runner, k, version)

        return group.foreach_env_runner_async(work, tag=TAG)

    def wait(self, group: Any, requests: int) -> None:
        """Collect the launched sample into :attr:`pending` (a lost runner is a warning)."""
        results = group.fetch_ready_async_reqs(tags=TAG, timeout_seconds=None)
        if len(results) < requests:
            log.warning(
                "async GRPO sample: %d of %d env runners answered (the others failed and are "
                "restarted); the next batch has fewer episodes",
                len(results),
                requests,
            )
        self.pending = (
            [e for _, (eps, _) in results for e in eps],
            [m for _, (_, m) in results],
        )

    def take(self) -> tuple[list[Any], list[Any]] | None:
        """The pending batch (``None`` before the first launch), emptying it."""
        out, self.pending = self.pending, None
        return out

    def filter(self, episodes: list[Any]) -> tuple[list[Any], dict[str, float]]:
        """Episodes within ``max_staleness`` of the learner, and the staleness statistics."""
        ages = staleness(episodes, self.learner_version)
        kept = [e for e, a in zip(episodes, ages, strict=True) if a <= self.max_staleness]
        self.dropped += len(episodes) - len(kept)
        stats = {
            "grpo/staleness_mean": sum(ages) / len(ages) if ages else 0.0,
            "grpo/staleness_max": float(max(ages, default=0)),
            "grpo/stale_dropped": float(self.dropped),
        }
        return kept, stats

    def needs_sync(self) -> bool:
        """Whether the runners need the learner's weights now: the sample launched next is
        learnt from one update later, ``learner_version + 1 − runner_version`` updates stale."""
        return self.learner_version + 1 - self.runner_version > self.max_staleness

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (pending episodes included: nothing is lost)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def set_state(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
