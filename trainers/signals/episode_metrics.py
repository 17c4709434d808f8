"""Per-episode metrics and the journal of failed episodes, on the env runners.

:class:`EpisodeMetrics` (an RLlib callback) logs each finished episode's verified outcome under
``marl/…`` as per-iteration sums plus a count, so :mod:`trainers.run.loop` reports exact means.
Each env-runner process keeps a :data:`JOURNAL` of distinct error texts of failed episodes and a
few transcripts; the trainer drains every runner after an iteration (:func:`drain_journal`).

Contract: an exception inside the callback is never dropped. RLlib logs and discards errors
of remote env runners (it restarts them), so the callback records its own error in the journal
and :func:`raise_callback_errors` raises :class:`EpisodeMetricsError` in the driver when the
journals are drained; on the local env runner it is raised at once.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np
from ray.rllib.callbacks.callbacks import RLlibCallback

from topologies.errors import MarlError

#: env-runner metrics this package logs per episode (sums and counts, reduced per iteration).
EPISODE_METRICS = "marl"


#: distinct error texts an env-runner process remembers between two drains
MAX_DISTINCT_ERRORS = 50


class EpisodeJournal:
    """What this process's env runners saw since the trainer last drained it: the distinct
    error texts of failed episodes (with counts) and up to ``keep`` episode transcripts.

    One per process (:data:`JOURNAL`); :func:`drain_journal` is what the trainer runs on every
    env runner (``foreach_env_runner``) after an iteration, which also sets ``keep``.
    """

    def __init__(self) -> None:
        self.keep = 0
        self.transcripts: list[dict[str, Any]] = []
        self.errors: dict[tuple[str, str], dict[str, Any]] = {}
        #: errors raised inside :class:`EpisodeMetrics` itself (a bug, not a failed episode).
        self.callback_errors: list[str] = []

    def record_error(self, kind: str, text: str) -> None:
        """Count a failed episode's error; distinct texts (digits aside) are kept once."""
        key = (kind, error_key(text))
        entry = self.errors.get(key)
        if entry is not None:
            entry["count"] += 1
        elif len(self.errors) < MAX_DISTINCT_ERRORS:
            self.errors[key] = {"kind": kind, "error": text, "count": 1}

    def wants_transcript(self) -> bool:
        return len(self.transcripts) < self.keep

    def drain(self, keep: int) -> dict[str, Any]:
        """Everything recorded so far (then forgotten); keep ``keep`` transcripts from now on."""
        out = {
            "transcripts": self.transcripts,
            "errors": list(self.errors.values()),
            "callback_errors": self.callback_errors,
        }
        self.transcripts, self.errors, self.callback_errors, self.keep = [], {}, [], keep
        return out


#: this process's journal: process-wide because RLlib builds the env runner's callbacks and
#: envs from pickled configs, so no call path can hand them one object
JOURNAL = EpisodeJournal()


def drain_journal(env_runner: Any = None, keep: int = 0) -> dict[str, Any]:
    """``foreach_env_runner`` function: this process's :data:`JOURNAL`, drained."""
    return JOURNAL.drain(keep)


class EpisodeMetricsError(MarlError, RuntimeError):
    """The per-episode metrics callback raised on an env runner (the first error, with the
    line that raised it)."""


def raise_callback_errors(parts: Iterable[Mapping[str, Any]]) -> None:
    """Raise :class:`EpisodeMetricsError` if any drained journal holds a callback error."""
    for part in parts:
        if part.get("callback_errors"):
            raise EpisodeMetricsError(
                f"the episode metrics callback failed on an env runner: "
                f"{part['callback_errors'][0]}"
            )


def error_key(text: str) -> str:
    """An error text with its numbers masked: errors that differ only in numbers are one."""
    return re.sub(r"\d+", "#", text.split("\n", 1)[0])[:300]


class EpisodeMetrics(RLlibCallback):
    """Logs each finished episode's verified outcome: team return, success, scenario metrics,
    failures (``error``: a node raised; ``timeout``: the wall-clock limit), and the oracle's
    expected return for the same task (where the scenario has one).

    Values are logged as per-iteration sums plus a count under ``marl/…`` so that
    :mod:`trainers.run.loop` reports exact per-iteration means; they are summed per ``sample()``
    call and logged once at its end (``on_sample_end``). Failed episodes' error texts and
    a few transcripts go to this process's :data:`JOURNAL`, which the trainer drains.
    """

    _scenarios: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        super().__init__()
        self._sums: dict[str, float] = {}  # this sample() call's episodes, summed

    def on_environment_created(self, *, env_runner: Any, **kwargs: Any) -> None:
        from trainers.signals.phase_timers import instrument_env_runner

        instrument_env_runner(env_runner)  # the runner-side timers/… (env, forward, sampling)

    def on_episode_start(self, *, episode: Any, **kwargs: Any) -> None:
        """Count the episodes the env's ``reset()`` lost before this one started (they failed
        before any agent acted: ``GraphEnv.lost_episodes``) as failed episodes."""
        try:
            self._log_lost(kwargs)
        except Exception as exc:
            self._callback_error(exc, kwargs)

    def on_episode_end(self, *, episode: Any, metrics_logger: Any = None, **kwargs: Any) -> None:
        try:
            self._log_episode(episode, metrics_logger, kwargs)
        except Exception as exc:
            self._callback_error(exc, kwargs)

    def _callback_error(self, exc: Exception, kwargs: Mapping[str, Any]) -> None:
        runner = kwargs.get("env_runner")
        if runner is None or getattr(runner, "worker_index", 0) == 0:
            raise exc  # the local env runner: the error surfaces from algo.train()
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{frame.filename}:{frame.lineno}"
        JOURNAL.callback_errors.append(f"{type(exc).__name__}: {exc} (at {where})")

    def _log_lost(self, kwargs: Mapping[str, Any]) -> None:
        env = _graph_env(kwargs.get("env"), kwargs.get("env_index"))
        if env is None or not env.lost_episodes:
            return
        lost, env.lost_episodes = env.lost_episodes, []
        sums = self._sums
        for episode in lost:
            JOURNAL.record_error(episode.failure, episode.error)
            values = outcome_values(episode.outcome.reward, False, True, episode.failure)
            sums["episodes"] = sums.get("episodes", 0) + 1
            for key, value in values.items():
                sums[key] = sums.get(key, 0.0) + value

    def _log_episode(self, episode: Any, metrics_logger: Any, kwargs: dict[str, Any]) -> None:
        info = _final_outcome(episode)
        if info is None:
            return
        outcome, seed, failure = info["outcome"], info.get("seed"), info.get("failure")
        truncated = bool(getattr(outcome, "truncated", False))
        values = outcome_values(outcome.reward, outcome.success, truncated, failure)
        if failure in ("error", "timeout"):
            JOURNAL.record_error(failure, str(info.get("error") or failure))
        if JOURNAL.wants_transcript():
            env = _graph_env(kwargs.get("env"), kwargs.get("env_index"))
            if env is not None and env.seed_used == seed and env.outcome is not None:
                # the raw actions let the trainer recompute credit by replaying the episode
                JOURNAL.transcripts.append({**env.transcript(), "_actions": env.episode_actions()})
        for key, value in (outcome.metrics or {}).items():
            values[f"metric/{key}"] = float(value)
        env_config = kwargs.get("env_runner").config.env_config if kwargs.get("env_runner") else {}
        values.update(monitor_values(episode, outcome, env_config, kwargs, seed, failure))
        oracle = self._oracle(env_config, seed)
        if oracle is not None:
            values["oracle"] = oracle
        sums = self._sums
        sums["episodes"] = sums.get("episodes", 0) + 1
        for key, value in values.items():
            sums[key] = sums.get(key, 0.0) + value

    def on_sample_end(self, *, metrics_logger: Any = None, **kwargs: Any) -> None:
        """Log the sums of this ``sample()`` call's episodes (one ``log_value`` per key, not
        per episode: the same per-iteration sums)."""
        sums, self._sums = self._sums, {}
        if not sums or metrics_logger is None:
            return
        for key, value in sums.items():
            metrics_logger.log_value((EPISODE_METRICS, key), value, reduce="sum")

    def _oracle(self, env_config: Mapping[str, Any], seed: int | None) -> float | None:
        if seed is None or not env_config:
            return None
        from scenarios.env_spec import EnvSpec

        try:
            spec = EnvSpec.of(env_config)
        except ValueError:  # no scenario in the config: nothing to score
            return None
        key = repr(spec.replace(built=None))
        if key not in self._scenarios:
            self._scenarios[key] = spec.replace(built=None).build_scenario()
        value = self._scenarios[key].oracle_value(np.random.default_rng(seed))
        return None if value is None else float(value)


def outcome_values(
    reward: float, success: bool, truncated: bool, failure: str | None
) -> dict[str, float]:
    """The per-episode outcome terms every finished (or lost) episode adds to ``marl/…``.

    A failed episode (``error``, ``timeout``, ``limit``: the step limit) ended truncated, so
    it counts in ``truncated`` whatever its scenario's ``failure_state`` outcome says.
    """
    return {
        "team_return": float(reward),
        "success": float(success),
        "truncated": float(truncated or failure is not None),
        "error": float(failure == "error"),
        "timeout": float(failure == "timeout"),
        "limit": float(failure == "limit"),
    }


def monitor_values(
    episode: Any,
    outcome: Any,
    env_config: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    seed: int | None,
    failure: str | None,
) -> dict[str, float]:
    """The per-episode terms :mod:`trainers.signals.monitors` sums: length moments, and the gold
    score (with ``gold_episodes``) when a scorer is configured and the episode's final state is
    still on its env (a failed episode scores its own reward: no gap)."""
    from trainers.configs.runner import RunnerSpec
    from trainers.signals.monitors import GOLD_SUM, episode_length, gold_scorer, length_values

    out = length_values(float(episode_length(episode)), outcome)
    ref = RunnerSpec.of(env_config).gold_scorer
    if not ref:
        return out
    env = _graph_env(kwargs.get("env"), kwargs.get("env_index"))
    if failure is not None:
        gold = float(outcome.reward)
    elif env is not None and env.seed_used == seed and env.final_state is not None:
        if ref not in _SCORERS:
            _SCORERS[ref] = gold_scorer(ref)
        gold = float(_SCORERS[ref](env.scenario, env.final_state))
    else:
        return out
    proxy = float(outcome.reward)
    return {**out, GOLD_SUM: gold, f"{GOLD_SUM}_proxy": proxy, f"{GOLD_SUM}_episodes": 1.0}


_SCORERS: dict[str, Any] = {}


def _final_outcome(episode: Any) -> dict[str, Any] | None:
    """The last infos of a finished multi-agent episode (``outcome``, ``seed``, ``failure``,
    ``error``...), or None when no agent's last infos carry an outcome."""
    for agent_episode in episode.agent_episodes.values():
        infos = agent_episode.get_infos()
        if len(infos) == 0:
            continue
        last = infos[-1]
        if isinstance(last, dict) and last.get("outcome") is not None:
            return last
    return None


def _graph_env(env: Any, index: int | None) -> Any:
    """The :class:`~scenarios.graph_env.GraphEnv` of sub-env ``index`` of an env runner's env."""
    from scenarios.graph_env import GraphEnv

    envs = getattr(env, "envs", None)
    obj = envs[index] if envs is not None and index is not None and index < len(envs) else env
    for _ in range(4):  # vector env → (wrappers) → RLlibGraphEnv → GraphEnv
        if isinstance(obj, GraphEnv):
            return obj
        obj = getattr(obj, "env", None) or getattr(obj, "unwrapped", None)
    return None
