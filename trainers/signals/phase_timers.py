"""Phase timers: where an iteration's wall time goes (``timers/…`` in ``metrics.jsonl``).

Contract: every value is seconds of one iteration, non-negative; the phases
(:data:`PHASE_KEYS`) ``env_s + forward_s + sample_overhead_s + learn_s + sync_s`` ≤ the
iteration's wall time (``charts/iteration_s``), with or without ``episodes.env_threads``.

* On each env runner (:func:`instrument_env_runner`, from the metrics callback's
  ``on_environment_created``) ``sample()`` is timed, and inside it the env time
  (:data:`scenarios.clocks.ENV_CLOCK`: the sampler's thread inside ``GraphEnv.reset``/``step``,
  or with env threads blocked waiting for them, :mod:`scenarios.in_flight`), the RL module's
  forward passes and the tool wait; they are logged per ``sample()`` as sums under
  ``marl/timers/…``. With several env runners sampling side by side, the sums are divided by
  their number (per-runner seconds, comparable with the driver's).
* ``tool_wait_s`` (:data:`TOOL_WAIT_KEY`, not a phase: it lies inside sampling) is the wall time
  during which at least one tool call of the runner's episodes was running
  (:data:`scenarios.clocks.TOOL_CLOCK`; the latency of ``episodes.tool_latency`` plus the tools'
  own run time, timed only where ``tool_latency`` or ``tool_timeout_s`` is set). Overlapping
  calls of envs in flight count once, so it is ≤ the sampling time; without env threads it is
  part of ``env_s``, with them it may overlap forward passes and bookkeeping.
* In the driver (:func:`instrument_algo`) the learner update and the weight sync are timed
  around ``learner_group.update`` and ``env_runner_group.sync_weights``.
* ``sample_overhead_s`` = sampling time minus env and forward time: RLlib's connectors,
  episode bookkeeping and callbacks.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

from scenarios.clocks import ENV_CLOCK, TOOL_CLOCK, Clock

#: the runner-side timers, logged under ``marl/timers``
RUNNER_KEYS = ("sample_s", "env_s", "forward_s", "tool_wait_s")
#: the disjoint phases of an iteration (their sum ≤ ``charts/iteration_s``)
PHASE_KEYS = tuple(f"timers/{p}_s" for p in ("env", "forward", "sample_overhead", "learn", "sync"))
#: seconds with a tool call running, inside the sampling phases (see the module doc)
TOOL_WAIT_KEY = "timers/tool_wait_s"
#: the keys :func:`iteration_timers` adds to each metrics row
TIMER_KEYS = (*PHASE_KEYS, TOOL_WAIT_KEY)
_MARK = "_marl_timed"
#: forward-pass seconds of this process: process-wide like scenarios.clocks' clocks (RLlib
#: calls the module's forward; no call path reaches the runner's metrics)
FORWARD_CLOCK = Clock()


def _timed(fn: Callable[..., Any], clock: Any) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock.add(time.perf_counter() - start)

    setattr(call, _MARK, True)
    return call


def _time_module(module: Any) -> None:
    """Time the module's forward passes (instance attributes over its methods, once)."""
    for name in ("forward_exploration", "forward_inference"):
        fn = getattr(module, name, None)
        if fn is not None and not getattr(fn, _MARK, False):
            setattr(module, name, _timed(fn, FORWARD_CLOCK))


def instrument_env_runner(env_runner: Any) -> None:
    """Time ``env_runner.sample()`` and the env and forward time inside it (idempotent)."""
    sample = getattr(env_runner, "sample", None)
    if sample is None or getattr(sample, _MARK, False):
        return

    @functools.wraps(sample)
    def timed_sample(*args: Any, **kwargs: Any) -> Any:
        module = getattr(env_runner, "module", None)
        if module is not None:
            _time_module(module)
        env0, fwd0, tool0 = ENV_CLOCK.seconds, FORWARD_CLOCK.seconds, TOOL_CLOCK.seconds
        start = time.perf_counter()
        out = sample(*args, **kwargs)
        values = {
            "sample_s": time.perf_counter() - start,
            "env_s": ENV_CLOCK.seconds - env0,
            "forward_s": FORWARD_CLOCK.seconds - fwd0,
            "tool_wait_s": TOOL_CLOCK.seconds - tool0,
        }
        metrics = getattr(env_runner, "metrics", None)
        if metrics is not None:  # read by get_metrics() right after sample()
            for key, value in values.items():
                metrics.log_value(("marl", "timers", key), value, reduce="sum")
        return out

    setattr(timed_sample, _MARK, True)
    env_runner.sample = timed_sample


class AlgoClock:
    """The driver's learner-update and weight-sync seconds since the last :meth:`take`."""

    def __init__(self) -> None:
        self.learn = Clock()
        self.sync = Clock()

    def take(self) -> dict[str, float]:
        out = {"learn_s": self.learn.seconds, "sync_s": self.sync.seconds}
        self.learn.seconds = self.sync.seconds = 0.0
        return out


def instrument_algo(algo: Any) -> AlgoClock:
    """Time ``algo``'s learner updates and weight syncs (wrappers on the instances)."""
    clock = AlgoClock()
    for owner, name, c in (
        (getattr(algo, "learner_group", None), "update", clock.learn),
        (getattr(algo, "env_runner_group", None), "sync_weights", clock.sync),
    ):
        fn = getattr(owner, name, None)
        if fn is not None:
            setattr(owner, name, _timed(fn, c))
    return clock


def iteration_timers(
    result: Mapping[str, Any], driver: Mapping[str, float], runners: int
) -> dict[str, float]:
    """The ``timers/…`` of one iteration: ``result`` is ``algo.train()``'s, ``driver`` the
    :meth:`AlgoClock.take` of the same iteration, ``runners`` the env runners sampling side by
    side (0: the driver's own)."""
    timers = ((result.get("env_runners") or {}).get("marl") or {}).get("timers") or {}
    n = max(1, runners)
    sample, env, forward, tool = (float(timers.get(k, 0.0) or 0.0) / n for k in RUNNER_KEYS)
    return {
        "timers/env_s": env,
        "timers/forward_s": forward,
        "timers/sample_overhead_s": max(0.0, sample - env - forward),
        "timers/learn_s": float(driver.get("learn_s", 0.0)),
        "timers/sync_s": float(driver.get("sync_s", 0.0)),
        TOOL_WAIT_KEY: tool,
    }
