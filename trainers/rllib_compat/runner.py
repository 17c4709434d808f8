"""RLlib 2.60 env-runner and algorithm internals (package doc: :mod:`trainers.rllib_compat`).

``BatchedEnvRunner`` (:mod:`trainers.sampling.batched_runner`) is a ``MultiAgentEnvRunner``
with its sampling loop replaced: it overrides :data:`OVERRIDDEN` and uses :data:`INHERITED`
through ``self``. Everything read or written on a runner, metrics logger, vector env or
algorithm from outside goes through the functions here.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

__all__ = [
    "INHERITED",
    "OVERRIDDEN",
    "SAMPLING_STATE",
    "autoreset_envs",
    "log_env_steps_sampled",
    "metrics_lock",
    "ongoing_episodes",
    "set_autoreset_envs",
    "set_episode_class",
    "set_time_total",
    "time_total",
]

#: private ``MultiAgentEnvRunner`` methods ``BatchedEnvRunner`` overrides (same signatures)
OVERRIDDEN: tuple[tuple[type, str], ...] = (
    (MultiAgentEnvRunner, "_sample"),  # the sampling loop behind sample()
    (MultiAgentEnvRunner, "_new_episode"),  # a fresh episode into episodes[env_index]
    (MultiAgentEnvRunner, "_log_episode_metrics"),  # per-episode metrics, from get_metrics()
)
#: private ``MultiAgentEnvRunner`` members ``BatchedEnvRunner`` reads, writes or calls on
#: ``self`` (instance attributes set by RLlib's ``__init__``, methods)
INHERITED: tuple[tuple[type, str], ...] = (
    (MultiAgentEnvRunner, "_ongoing_episodes"),  # list: one episode (or None) per sub-env
    (MultiAgentEnvRunner, "_ongoing_episodes_for_metrics"),  # id → chunks, defaultdict(list)
    (MultiAgentEnvRunner, "_done_episodes_for_metrics"),  # list, reduced by get_metrics()
    (MultiAgentEnvRunner, "_needs_initial_reset"),  # bool: the next sample() resets all envs
    (MultiAgentEnvRunner, "_shared_data"),  # dict shared with the connectors
    (MultiAgentEnvRunner, "_cached_to_module"),  # env-to-module output kept across calls
    (MultiAgentEnvRunner, "_seed"),  # the runner's env seed (None: unseeded)
    (MultiAgentEnvRunner, "_callbacks"),  # list of RLlibCallback instances
    (MultiAgentEnvRunner, "_weights_seq_no"),  # int: the weights' sequence number
    (MultiAgentEnvRunner, "_device"),  # where its modules live (a GPU: num_gpus_per_env_runner)
    (MultiAgentEnvRunner, "_make_on_episode_callback"),  # (which, env index, episodes)
    (MultiAgentEnvRunner, "_prune_zero_len_sa_episodes"),  # static: drops empty agents
)
#: the runner attributes that carry sampling across ``sample()`` calls: exact resume saves
#: and restores them (:mod:`trainers.run.resume`)
SAMPLING_STATE = (
    "_needs_initial_reset",
    "_ongoing_episodes",
    "_ongoing_episodes_for_metrics",
    "_done_episodes_for_metrics",
    "_cached_to_module",
    "_shared_data",
    "_weights_seq_no",
)


def ongoing_episodes(runner: Any) -> list[Any]:
    """The runner's episodes in progress, one per sub-env (``None`` before its first reset);
    ``[]`` for a runner without them. RLlib 2.60: ``MultiAgentEnvRunner._ongoing_episodes``."""
    return getattr(runner, "_ongoing_episodes", None) or []


def metrics_lock(metrics: MetricsLogger) -> Any:
    """The lock ``MetricsLogger.log_dict`` holds while it logs (a dummy lock unless a learner
    made it a real ``RLock``). RLlib 2.60: ``MetricsLogger._threading_lock``."""
    return metrics._threading_lock


def log_env_steps_sampled(runner: EnvRunner, num_steps: int) -> None:
    """Count ``num_steps`` sampled env steps in the runner's Prometheus counter, as RLlib's
    sampling loop does. RLlib 2.60: ``EnvRunner._log_env_steps(metric=
    self._metrics_num_env_steps_sampled, num_steps=...)``."""
    runner._log_env_steps(metric=runner._metrics_num_env_steps_sampled, num_steps=num_steps)


def set_episode_class(episode: Any, cls: type) -> Any:
    """Make ``episode`` an instance of ``cls``, a slot-less subclass of its class (RLlib builds
    ``MultiAgentEpisode``s in ``_new_episode``, ``cut`` and ``from_state``). Returns it."""
    if not issubclass(cls, type(episode)) or cls.__dict__.get("__slots__") != ():
        raise TypeError(
            f"set_episode_class: {cls.__qualname__} must subclass {type(episode).__qualname__} "
            "and add no fields (``__slots__ = ()``), or the swapped episode is corrupt"
        )
    episode.__class__ = cls
    return episode


def autoreset_envs(vector_env: Any) -> Any:
    """Which sub-envs reset at their next step (a bool array; ``[]`` for a vector env without
    them). RLlib 2.60: ``SyncVectorMultiAgentEnv._autoreset_envs``."""
    return getattr(vector_env, "_autoreset_envs", [])


def set_autoreset_envs(vector_env: Any, flags: Any) -> None:
    """Put back what :func:`autoreset_envs` returned."""
    vector_env._autoreset_envs = flags


def time_total(algo: Algorithm) -> float:
    """The algorithm's accumulated training time (``time_total_s``). Ray 2.60:
    ``Trainable._time_total``."""
    return float(getattr(algo, "_time_total", 0.0))


def set_time_total(algo: Algorithm, seconds: float) -> None:
    """Set what :func:`time_total` reads (a resumed run continues its clock)."""
    algo._time_total = seconds
