"""Scripted judges of known behaviour, for reward-source tests and experiments.

Each function is a factory (reference it as ``ref: experiments.judges:<name>`` with
``kwargs``) returning a judge ``JudgeRequest -> score`` (:mod:`scenarios.reward_sources`):

* :func:`noisy_verifier` — the exact verdict (the scenario's ``Outcome.success`` on the final
  state), flipped with probability ``flip``. The flip is a deterministic function of the judge's
  ``seed``, the episode seed and the transcript (a judge at temperature 0 gives one verdict per
  transcript), independent across judges with different seeds.
* :func:`length_biased` — the exact verdict plus ``bias`` × the messages' length (characters,
  capped at ``scale``) / ``scale``: it rewards longer messages (what a length monitor must
  catch).
* :func:`hanging` and :func:`failing` — a judge that sleeps past any timeout, and one that
  raises: the failure paths.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np


def exact_verdict(request: Any) -> float:
    """1.0 when the scenario's verifier calls the final state a success, else 0.0."""
    return float(bool(request.scenario.score(request.state).success))


def noisy_verifier(flip: float = 0.2, seed: int = 0) -> Callable[[Any], float]:
    """The exact verdict, flipped with probability ``flip`` (module doc)."""
    if not 0.0 <= flip <= 1.0:
        raise ValueError(f"flip={flip!r}: use a probability in [0, 1]")

    def judge(request: Any) -> float:
        verdict = exact_verdict(request)
        key = [int(seed), int(request.seed or 0), zlib.crc32(request.transcript.encode())]
        if np.random.default_rng(key).random() < flip:
            verdict = 1.0 - verdict
        return verdict

    return judge


def length_biased(bias: float = 1.0, scale: int = 64) -> Callable[[Any], float]:
    """The exact verdict plus ``bias · min(chars, scale) / scale`` of the messages' text
    (a text agent's decoded reply; otherwise the action's repr)."""
    if scale <= 0:
        raise ValueError(f"scale={scale!r}: use a positive number of characters")

    def judge(request: Any) -> float:
        chars = sum(len(t.text if t.text is not None else repr(t.action)) for t in request.turns)
        return exact_verdict(request) + bias * min(chars, scale) / scale

    return judge


def hanging(seconds: float = 3600.0) -> Callable[[Any], float]:
    """A judge that sleeps ``seconds`` before answering 1.0 (a hung remote judge)."""

    def judge(request: Any) -> float:
        time.sleep(seconds)
        return 1.0

    return judge


def failing(message: str = "judge backend unavailable") -> Callable[[Any], float]:
    """A judge that raises ``RuntimeError(message)``."""

    def judge(request: Any) -> float:
        raise RuntimeError(message)

    return judge
