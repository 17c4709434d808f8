"""The GRPO algorithm.

* :class:`GRPO` (a ``PPO`` subclass) samples exactly ``episodes_per_iteration`` finished
  episodes per iteration (so groups are whole) and updates the learners like PPO;
  :class:`GRPOAlgorithmConfig` carries the knobs (``config.grpo(...)``).

Example:
    >>> cfg = GRPOAlgorithmConfig().grpo(group_size=4, groups_per_iteration=2, clip_high=0.3)
    >>> cfg.learner_config_dict["grpo"]["clip_high"], cfg.episodes_per_iteration
    (0.3, 8)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)
from typing_extensions import override

import marl_agents.llm.subagents  # noqa: F401  (registers the hf and vllm subagent backends)
import scenarios.text_delegate  # noqa: F401  (registers text-delegate in env-runner processes)
from trainers.configs.grpo import GRPOLoss
from trainers.grpo.async_sampling import SamplePipeline, shares
from trainers.grpo.connectors import CONFIG_KEY, SKIPPED_UPDATES
from trainers.grpo.learner import GRPOLearner
from trainers.ppo import PPO, trains


class GRPOAlgorithmConfig(PPOConfig):
    """``PPOConfig`` for :class:`GRPO`: the GRPO learner, whole episodes, group knobs.

    ``.grpo(group_size=G, groups_per_iteration=B, **GRPOLoss fields)`` sets the sampling
    schedule (``G·B`` finished episodes per iteration) and the loss knobs.
    """

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or GRPO)
        self.group_size = 4
        self.groups_per_iteration = 4
        self.batch_mode = "complete_episodes"
        self.learner_config_dict = {CONFIG_KEY: {}}
        self.async_sampling = False
        self.max_staleness = 1

    @property
    def episodes_per_iteration(self) -> int:
        """Finished episodes sampled per training iteration (``group_size · groups``)."""
        return int(self.group_size) * int(self.groups_per_iteration)

    def grpo(
        self,
        *,
        group_size: int | None = None,
        groups_per_iteration: int | None = None,
        async_sampling: bool | None = None,
        max_staleness: int | None = None,
        **knobs: Any,
    ) -> GRPOAlgorithmConfig:
        """Set the group schedule, asynchronous sampling (:mod:`trainers.grpo.async_sampling`) and
        :class:`~trainers.configs.grpo.GRPOLoss` knobs.

        Raises:
            ValueError: an unknown knob or a bad value (checked by ``GRPOLoss``).
        """
        if group_size is not None:
            self.group_size = int(group_size)
        if groups_per_iteration is not None:
            self.groups_per_iteration = int(groups_per_iteration)
        if async_sampling is not None:
            self.async_sampling = bool(async_sampling)
        if max_staleness is not None:
            self.max_staleness = int(max_staleness)
        names = {f.name for f in dataclasses.fields(GRPOLoss)}
        unknown = sorted(set(knobs) - names)
        if unknown:
            raise ValueError(f"unknown GRPO knob(s) {unknown}; known: {sorted(names)}")
        merged = {**self.learner_config_dict.get(CONFIG_KEY, {}), **knobs}
        GRPOLoss(**merged)  # validate now, not on the learner
        self.learner_config_dict = {**self.learner_config_dict, CONFIG_KEY: merged}
        return self

    @override
    def get_default_learner_class(self) -> type:
        return GRPOLearner

    @override
    def validate(self) -> None:
        super().validate()
        if self.group_size < 1 or self.groups_per_iteration < 1:
            self._value_error("group_size and groups_per_iteration must be >= 1")
        bad = self.num_env_runners < 1 or self.max_staleness < 1
        if self.async_sampling and not self.in_evaluation and bad:
            self._value_error(
                "async_sampling needs num_env_runners >= 1 (it overlaps remote env runners "
                "with the learner) and max_staleness >= 1"
            )


class GRPO(PPO):
    """PPO's loop with episode-count sampling: ``episodes_per_iteration`` finished episodes."""

    @classmethod
    @override
    def get_default_config(cls) -> GRPOAlgorithmConfig:
        return GRPOAlgorithmConfig(cls)

    @override
    def setup(self, config: Any) -> None:
        super().setup(config)
        cfg = self.config
        self.pipeline = (
            SamplePipeline(max_staleness=cfg.max_staleness) if cfg.async_sampling else None
        )

    @override
    def training_step(self) -> None:
        if self.pipeline is not None:
            self._training_step_async(self.pipeline)
            return
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            episodes, runner_metrics = sample_episodes(
                self.env_runner_group, self.config.episodes_per_iteration, self.config.group_size
            )
            if not episodes:
                return
            self.metrics.aggregate(runner_metrics, key=ENV_RUNNER_RESULTS)
        learner_results = self._update(episodes)
        if learner_results is not None:
            self._sync_weights(learner_results)

    def _training_step_async(self, pipe: SamplePipeline) -> None:
        """Learn from the batch sampled during the last iteration while the runners sample
        the next one (:mod:`trainers.grpo.async_sampling`)."""
        group, n = self.env_runner_group, self.config.episodes_per_iteration
        g = self.config.group_size
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            if pipe.pending is None:  # first iteration (or a lost sample): sample now
                pipe.wait(group, pipe.launch(group, n, g))
            episodes, runner_metrics = pipe.take() or ([], [])
            self.metrics.aggregate(runner_metrics, key=ENV_RUNNER_RESULTS)
        requests = pipe.launch(group, n, g)  # overlaps the update below
        episodes, stats = pipe.filter(episodes)
        learner_results = self._update(episodes) if episodes else None
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            pipe.wait(group, requests)
        if learner_results is None:
            return
        pipe.learner_version += 1
        for module_id in set(learner_results[0]) - {ALL_MODULES}:
            for key, value in stats.items():
                self.metrics.log_value((LEARNER_RESULTS, module_id, key), value, window=1)
        if pipe.needs_sync():
            self._sync_weights(learner_results)
            pipe.runner_version = pipe.learner_version

    def _update(self, episodes: list[Any]) -> Any:
        """One learner update on ``episodes`` (``None``: no trained module acted, skipped)."""
        cfg = self.config
        if not any(trains(cfg, m) for m in episode_modules(episodes)):
            # no trained agent acted (e.g. a frozen agent used up every turn): nothing to learn,
            # and RLlib's learner cannot update on a batch without a trained module
            self.metrics.log_value((LEARNER_RESULTS, ALL_MODULES, SKIPPED_UPDATES), 1, reduce="sum")
            return None
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            learner_results = self.learner_group.update(
                episodes=episodes,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                        (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME)
                    ),
                    NUM_MODULE_STEPS_TRAINED_LIFETIME: self.metrics.peek(
                        (LEARNER_RESULTS, ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME),
                        default=0,
                    ),
                },
                num_epochs=cfg.num_epochs,
                minibatch_size=cfg.minibatch_size,
                shuffle_batch_per_epoch=cfg.shuffle_batch_per_epoch,
            )
            self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        return learner_results

    def _sync_weights(self, learner_results: Any) -> None:
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            # frozen modules show in the learner's results too, but their weights never
            # change: a sync would only copy them again (and make a vLLM sampler reload them)
            self.sync_trained(
                self.env_runner_group.sync_weights,
                learner_results[0],
                from_worker_or_learner_group=self.learner_group,
                inference_only=True,
            )


def episode_modules(episodes: list[Any]) -> set[str]:
    """The module ids that acted (stepped at least once) in multi-agent ``episodes``."""
    return {
        sa.module_id
        for episode in episodes
        for sa in episode.agent_episodes.values()
        if sa.module_id is not None and len(sa) > 0
    }


def sample_episodes(group: Any, n: int, group_size: int = 1) -> tuple[list[Any], list[Any]]:
    """Sample ``n`` finished episodes: from the local runner, or split over remote runners in
    whole groups of ``group_size`` (:func:`trainers.grpo.async_sampling.shares`).

    Returns:
        ``(episodes, per-runner metrics)``.
    """
    remote = group.num_remote_env_runners()
    if remote == 0:
        runner = group.local_env_runner
        episodes = runner.sample(num_episodes=n, explore=True)
        return list(episodes), [runner.get_metrics()]
    share = shares(n, remote, group_size)

    def work(runner: Any) -> tuple[list[Any], Any]:
        k = share[(runner.worker_index - 1) % remote]
        return runner.sample(num_episodes=k, explore=True), runner.get_metrics()

    results = group.foreach_env_runner(work, local_env_runner=False)
    episodes = [e for eps, _ in results for e in eps]
    return episodes, [m for _, m in results]
