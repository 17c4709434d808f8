"""A frozen LLM as a judge reward source (``scenarios.reward_sources``).

``llm_judge(...)`` returns a judge ``JudgeRequest -> score``: the rubric and the transcript go to
a frozen language model (in process with transformers, or a vLLM OpenAI-compatible server: the
same backends as text scenarios' subagents, greedy and seeded), and the first number of its
reply, clipped to ``[low, high]``, is the score. A reply without a number raises
:class:`ValueError` (a judge failure: raised or counted by the source, never read as 0).

Use it as ``{ref: marl_agents.llm.judges:llm_judge, kwargs: {path: /models/Qwen2.5-1.5B}}`` or
``kwargs: {url: http://host:8000/v1, model: NAME, tokenizer: DIR}``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from marl_agents.llm.subagents import hf_subagent, vllm_subagent

PROMPT = (
    "{rubric}\n\nTranscript:\n{transcript}\n\n"
    "Reply with one number from {low:g} (worst) to {high:g} (best).\nScore:"
)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def parse_score(reply: str, low: float = 0.0, high: float = 1.0) -> float:
    """The first number in ``reply``, clipped to ``[low, high]``.

    Raises:
        ValueError: the reply holds no number.

    Example:
        >>> parse_score("Score: 0.8 because..."), parse_score("7/5", 0, 1)
        (0.8, 1.0)
    """
    match = _NUMBER.search(reply)
    if match is None:
        raise ValueError(f"the judge's reply holds no score: {reply[:80]!r}")
    return min(high, max(low, float(match.group())))


def llm_judge(
    path: str | None = "tiny",
    *,
    url: str | None = None,
    model: str | None = None,
    tokenizer: str | None = None,
    seed: int = 0,
    max_new_tokens: int = 16,
    low: float = 0.0,
    high: float = 1.0,
    prompt: str = PROMPT,
) -> Callable[[Any], float]:
    """A frozen LLM judge (module doc): ``url`` (and ``model``) for a vLLM server, else the
    transformers model at ``path`` (``tiny``: the built-in tiny model)."""
    if url is not None:
        spec = {
            "url": url,
            "model": model,
            "tokenizer": tokenizer,
            "max_new_tokens": max_new_tokens,
        }
        subagent = vllm_subagent(spec)
    else:
        subagent = hf_subagent({"path": path, "seed": seed, "max_new_tokens": max_new_tokens})

    def judge(request: Any) -> float:
        text = prompt.format(
            rubric=request.rubric, transcript=request.transcript, low=low, high=high
        )
        return parse_score(subagent.respond([text], [""])[0], low, high)

    return judge
