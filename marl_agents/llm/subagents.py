"""Frozen LLM subagents for text scenarios: the ``hf`` and ``vllm`` backends of ``text-delegate``.

Importing this module registers both with
:func:`scenarios.text_delegate_subagents.register_subagent_backend` (``scenarios`` never imports
``marl_agents``; the trainers and :mod:`trainers.grpo.learner`'s environment import this
module, so env-runner processes have the backends too).

* ``{"type": "hf", "path": DIR_or_"tiny", "seed": 0}``: a transformers model in the process
  running the environment (:class:`~marl_agents.llm.hf_backend.HFBackend`), loaded once per
  process and model (:data:`HF_CACHE`), gradients off.
* ``{"type": "vllm", "url": ..., "model": NAME, "tokenizer": DIR}``: a vLLM OpenAI-compatible
  server (:class:`~marl_agents.llm.vllm_backend.OpenAIServerBackend`).

Either answers greedily with a fixed seed, so subagents are deterministic and replays exact.

Example:
    >>> import marl_agents.llm.subagents  # noqa: F401  (registers hf and vllm)
    >>> from scenarios.text_delegate_subagents import SUBAGENT_BACKENDS
    >>> sorted(SUBAGENT_BACKENDS)
    ['hf', 'vllm']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from marl_agents.llm.backend import SamplingParams
from scenarios.text_delegate_subagents import register_subagent_backend
from scenarios.text_space import load_tokenizer

#: ``(path, seed)`` → the :class:`~marl_agents.llm.hf_backend.HFBackend` serving it here.
HF_CACHE: dict[tuple[str, int], Any] = {}


class BackendSubagent:
    """An LLM subagent: chat prompts through an ``LLMBackend``, greedy and seeded."""

    def __init__(self, backend: Any, max_new_tokens: int = 48) -> None:
        self.backend = backend
        self.max_new_tokens = max_new_tokens

    def respond(self, prompts: Sequence[str], types: Sequence[str]) -> list[str]:
        """One answer per prompt, generated in one batch."""
        params = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens, seed=0)
        messages = [[{"role": "user", "content": p}] for p in prompts]
        return [g.text for g in self.backend.generate(messages, params)]


def hf_subagent(spec: Mapping[str, Any]) -> BackendSubagent:
    """A transformers subagent (frozen; one model per ``(path, seed)`` and process)."""
    key = (str(spec["path"]), int(spec.get("seed", 0)))
    if key not in HF_CACHE:
        from marl_agents.llm.hf_backend import HFBackend
        from marl_agents.llm.rl_module import load_causal_lm

        tok, model = load_causal_lm(key[0], tiny_seed=key[1])
        for p in model.parameters():
            p.requires_grad_(False)
        HF_CACHE[key] = HFBackend(model, tok)
    return BackendSubagent(HF_CACHE[key], int(spec.get("max_new_tokens", 48)))


def vllm_subagent(spec: Mapping[str, Any]) -> BackendSubagent:
    """A subagent served by a vLLM OpenAI-compatible server."""
    from marl_agents.llm.vllm_backend import OpenAIServerBackend

    tok = load_tokenizer(str(spec.get("tokenizer") or spec["model"]))
    backend = OpenAIServerBackend(spec["url"], spec["model"], tok)
    return BackendSubagent(backend, int(spec.get("max_new_tokens", 48)))


register_subagent_backend("hf", hf_subagent)
register_subagent_backend("vllm", vllm_subagent)
