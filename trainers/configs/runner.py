"""What env runners are told besides the environment (:class:`RunnerSpec`).

``trainers.plan.resolve`` builds it once with the :class:`~scenarios.env_spec.EnvSpec`; RLlib
carries both in its env config (``{"spec": ..., "runner": ...}``) to every env runner, where
the group schedule (:mod:`trainers.sampling.grouped_env`), the batched sampler and the episode
callback read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: the env-config key holding the :class:`RunnerSpec`
RUNNER_KEY = "runner"


@dataclasses.dataclass(frozen=True)
class RunnerSpec:
    """Env-runner settings of an experiment.

    Attributes:
        seed: base of the task-seed stream of the group schedule.
        repeat: finished episodes per task seed and env (GRPO groups sampled one after
            another: ``G``; side by side: 1).
        shared_seeds: all sub-envs of a runner draw the same task seeds (GRPO).
        whole_groups: the batched sampler holds a finished sub-env until its whole group has
            finished (GRPO side by side).
        group_size: ``G``, the sub-envs of one group (with ``whole_groups``).
        groups_in_flight: groups a runner samples side by side (with ``whole_groups``: the
            runner holds ``groups_in_flight · group_size`` sub-envs).
        curriculum: the curriculum's tasks, ``{"tasks": [seeds], "pass_threshold": x}``
            (None: an open seed stream).
        env_threads: the batched sampler steps each sub-env on its own thread.
        gold_scorer: the gold monitor's scorer, scored by the episode callback (None: off).
        grouped: episodes follow the group schedule (GRPO, or a curriculum).
    """

    seed: int = 0
    repeat: int = 1
    shared_seeds: bool = True
    whole_groups: bool = False
    group_size: int = 1
    groups_in_flight: int = 1
    curriculum: Mapping[str, Any] | None = None
    env_threads: bool = False
    gold_scorer: str | None = None
    grouped: bool = False

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> RunnerSpec:
        """The spec under ``"runner"`` of an env config, else one of its plain keys (the
        spec's field names; others are ignored)."""
        config = config or {}
        spec = config.get(RUNNER_KEY)
        if spec is not None:
            return spec  # type: ignore[no-any-return]
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in names})


__all__ = ["RUNNER_KEY", "RunnerSpec"]
