"""The GRPO group schedule (env side): :class:`GroupedEnv` is an
:class:`~scenarios.rllib_env.RLlibGraphEnv` whose task
seeds come from a **group schedule**, so that ``G`` rollouts share one task. Every env
repeats each task seed ``repeat`` times (counted in *finished* episodes: an episode cut off
by a reset is re-run with the same seed), and with ``shared_seeds`` all vector sub-envs of
an env runner draw the same seed stream, so the ``k``-th finished episode of each sub-env has
the same task. With ``num_envs_per_env_runner = G``, ``repeat = 1`` and ``shared_seeds`` the
``G`` rollouts of a task are sampled side by side, in one batched generation per step. With
several groups side by side (``RunnerSpec.groups_in_flight``) the runner tells each group's
sub-envs which group of its schedule they run (the reset option :data:`GROUP_OPTION`): the
env skips forward to that task of the stream (:meth:`GroupedEnv.seek`), so the ``q``-th group
a runner samples has the stream's ``q``-th task whatever the number of groups in flight.
(The seed RLlib passes to ``reset()`` is ignored: it passes the same config seed at every
forced reset, which would replay the same tasks every iteration.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from typing_extensions import override

import marl_agents.llm.subagents  # noqa: F401  (registers the hf and vllm subagent backends)
import scenarios.text_delegate  # noqa: F401  (registers text-delegate in env-runner processes)
from scenarios.rllib_env import RLlibGraphEnv
from trainers.configs.runner import RunnerSpec
from trainers.signals.curriculum import SCHEDULE, passed

#: the infos key where ``GroupedEnv`` records a scenario's own anchor key for an observation.
ANCHOR_INFO = "anchor"
#: the reset option naming the group (its index in the runner's group schedule) whose task
#: the episode runs (:meth:`GroupedEnv.seek`; set by the batched sampler for whole groups)
GROUP_OPTION = "group"


class GroupedEnv(RLlibGraphEnv):
    """An RLlib view of a scenario whose task seeds follow a group schedule (module doc).

    Args:
        config: the :class:`~scenarios.rllib_env.RLlibGraphEnv` config plus a
            :class:`~trainers.configs.runner.RunnerSpec` under ``"runner"`` (or its fields as
            plain keys): ``seed`` (base of the seed stream, default 0), ``repeat`` (finished
            episodes per task seed and env, default 1), ``shared_seeds`` (all sub-envs of a
            runner share the stream, default True) and ``curriculum``
            (``{"tasks": [seeds], "pass_threshold": x}``:
            tasks come from this process's :data:`trainers.signals.curriculum.SCHEDULE`, which also
            gets every finished episode's pass/fail). An RLlib ``EnvContext`` supplies
            ``worker_index`` (and ``vector_index``, used when ``shared_seeds`` is False).
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        cfg = config or {}
        runner = RunnerSpec.of(cfg)
        self.repeat = int(runner.repeat)
        if self.repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {self.repeat}")
        stream = [int(runner.seed), int(getattr(cfg, "worker_index", 0))]
        if not runner.shared_seeds:
            stream.append(int(getattr(cfg, "vector_index", 0)))
        self._stream = tuple(stream)
        self._curriculum: Mapping[str, Any] | None = runner.curriculum
        if self._curriculum is not None:
            SCHEDULE.ensure(self._curriculum["tasks"])
        self._seeds = np.random.default_rng(stream)
        self._k = 0  # tasks drawn before the current one
        self._task_index = 0  # the current task's index in the curriculum's pool
        self._task_seed = self._next_task()
        self._finished = 0  # finished episodes of the current task seed

    def _next_task(self) -> int:
        if self._curriculum is None:
            return int(self._seeds.integers(2**31))
        self._task_index = SCHEDULE.draw(self._stream, self._k)
        return int(self._curriculum["tasks"][self._task_index])

    @property
    def task_seed(self) -> int:
        """The task seed the next (or current) episode runs."""
        return self._task_seed

    @override
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if options and GROUP_OPTION in options:
            options = dict(options)
            self.seek(int(options.pop(GROUP_OPTION)))
        obs, infos = super().reset(seed=self._task_seed, options=options or None)
        return obs, self._anchors(obs, infos)

    def seek(self, k: int) -> None:
        """Make the stream's ``k``-th task (0-based) the current one. The stream only moves
        forward: the tasks in between are skipped (in the runner, groups on other slots run
        them). A no-op at the current task.

        Raises:
            ValueError: ``k`` is before the current task, or an episode of it has finished
                while ``repeat > 1`` (a task's rollouts are then counted in this env).
        """
        if k < self._k or (k > self._k and self._finished):
            raise ValueError(
                f"GroupedEnv.seek({k}): the task schedule is at task {self._k} with "
                f"{self._finished} of {self.repeat} episodes finished; it only moves forward to "
                "a task not yet started (a group index the runner already used?)"
            )
        while self._k < k:
            self._k += 1
            self._task_seed = self._next_task()

    @override
    def step(self, action_dict: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
        obs, rewards, terms, truncs, infos = super().step(action_dict)
        if terms.get("__all__") or truncs.get("__all__"):
            if self._curriculum is not None and self.env.outcome is not None:
                ok = passed(self.env.outcome, self._curriculum.get("pass_threshold"))
                SCHEDULE.record(self._stream, self._k, self._task_index, ok)
            self._finished += 1
            if self._finished >= self.repeat:
                self._finished = 0
                self._k += 1
                self._task_seed = self._next_task()
        return obs, rewards, terms, truncs, self._anchors(obs, infos)

    def _anchors(self, obs: Mapping[str, Any], infos: dict[str, Any]) -> dict[str, Any]:
        """``infos`` with the scenario's anchor key of each observation (``Scenario.anchor_key``;
        nothing added where it returns ``None``: the observation itself is the anchor)."""
        scenario = self.env.scenario
        for agent, ob in obs.items():
            key = scenario.anchor_key(agent, ob)
            if key is not None:
                infos[agent] = {**infos.get(agent, {}), ANCHOR_INFO: key}
        return infos

    def schedule_state(self) -> dict[str, Any]:
        """Where this env is in its task schedule (saved by :mod:`trainers.run.resume`)."""
        return {
            "rng": self._seeds.bit_generator.state,
            "k": self._k,
            "task_index": self._task_index,
            "task_seed": self._task_seed,
            "finished": self._finished,
        }

    def set_schedule_state(self, state: Mapping[str, Any]) -> None:
        """Set what :meth:`schedule_state` returned."""
        self._seeds.bit_generator.state = state["rng"]
        self._k, self._task_index = int(state["k"]), int(state["task_index"])
        self._task_seed, self._finished = int(state["task_seed"]), int(state["finished"])
