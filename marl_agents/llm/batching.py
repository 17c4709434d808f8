"""Micro-batching: concurrent ``generate`` calls from parallel subagents become one batch.

LangGraph runs the tasks of one superstep (e.g. ``k`` workers reached by ``Send`` fan-out) in
a thread pool; each worker's chat model calls its backend separately. Wrapping the backend in
:class:`BatchingBackend` gathers the calls that arrive within ``max_wait_s`` of each other
(up to ``max_batch_size`` prompts) and serves them with one batched
:meth:`~marl_agents.llm.backend.LLMBackend.generate` — the "fan out in parallel" that
``bench/llm_rollout.py`` measures. Per-prompt seeds are kept, so with
:class:`~marl_agents.llm.hf_backend.HFBackend` the results equal unbatched calls.

LangGraph's default thread pool runs at most ``min(32, cpus + 4)`` tasks at once (6 on a
2-core machine): for a wider fan-out, invoke the graph with ``config={"max_concurrency": k}``
or the calls beyond the pool size come in a later, smaller batch.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

from marl_agents.llm.backend import (
    Generation,
    LLMBackend,
    Params,
    SamplingParams,
    per_prompt_params,
)
from scenarios.text_space import Prompt


@dataclasses.dataclass
class _Request:
    prompts: list[Prompt]
    params: list[SamplingParams]
    result: list[Generation] | None = None
    error: BaseException | None = None
    done: bool = False


class BatchingBackend:
    """Wrap a backend so that concurrent callers share batched generate calls.

    The first caller to find the backend idle becomes the leader: it waits until
    ``max_batch_size`` prompts are queued or ``max_wait_s`` has passed, takes the queued
    requests (whole requests, first come first served), runs one ``generate`` with the lock
    released, and hands each caller its slice. A lone caller pays at most ``max_wait_s``.

    Args:
        backend: the wrapped backend.
        max_batch_size: most prompts in one batch.
        max_wait_s: how long a leader waits for more callers.

    Attributes:
        batch_sizes: the size of every batch sent to ``backend`` (for tests and benchmarks).
    """

    def __init__(
        self, backend: LLMBackend, *, max_batch_size: int = 8, max_wait_s: float = 0.005
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.backend = backend
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.batch_sizes: list[int] = []
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._busy = False

    @property
    def tokenizer(self) -> Any:
        """The wrapped backend's tokenizer."""
        return self.backend.tokenizer

    def generate(self, prompts: Sequence[Prompt], params: Params = None) -> list[Generation]:
        """Queue ``prompts`` and return their generations once a batch has served them."""
        req = _Request(list(prompts), per_prompt_params(params, len(prompts)))
        if not req.prompts:
            return []
        with self._cond:
            self._queue.append(req)
            self._cond.notify_all()
            while not req.done:
                if self._busy:
                    self._cond.wait()
                    continue
                self._busy = True
                try:
                    self._lead()
                finally:
                    self._busy = False
                    self._cond.notify_all()
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def _queued(self) -> int:
        return sum(len(r.prompts) for r in self._queue)

    def _lead(self) -> None:
        """Gather, then run one batch with the lock released (called holding the lock)."""
        deadline = time.monotonic() + self.max_wait_s
        while self._queued() < self.max_batch_size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)
        batch: list[_Request] = []
        size = 0
        while self._queue and (
            not batch or size + len(self._queue[0].prompts) <= self.max_batch_size
        ):
            req = self._queue.pop(0)
            batch.append(req)
            size += len(req.prompts)
        prompts = [p for r in batch for p in r.prompts]
        params = [p for r in batch for p in r.params]
        self.batch_sizes.append(len(prompts))
        self._cond.release()
        try:
            result: list[Generation] | None = self.backend.generate(prompts, params)
            error: BaseException | None = None
        except BaseException as exc:  # handed to every caller of the batch
            result, error = None, exc
        finally:
            self._cond.acquire()
        start = 0
        for req in batch:
            if result is not None:
                req.result = result[start : start + len(req.prompts)]
            req.error = error
            req.done = True
            start += len(req.prompts)
