"""``VLLMSampler``: a vLLM engine in this process that samples for a trained LLM module.

Contract (``model.sampler: vllm`` of an LLM pool, used by
:meth:`CausalLMModule.generate <marl_agents.llm.rl_module.CausalLMModule.generate>`):

* **Where.** One engine per module per process, started on the module's first sample in
  that process (an env runner: the driver with ``num_env_runners: 0``), with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core, its executor and the model run in
  this process, so weights move by reference, never over IPC. Start: ~30–65 s on CPU.
* **Weights.** The engine starts from the module's weights at the time (a model directory:
  loaded from it, then overwritten if the module's weights have changed since setup; the
  in-code tiny model: saved to a temp directory first). :meth:`sync` copies the module's
  state dict into the engine's model (vLLM's ``load_weights`` through ``collective_rpc``)
  and records the module's weights version; :meth:`generate` takes the version the caller
  holds and raises :class:`StaleWeightsError` if the engine holds another one.
* **Outputs.** Token ids exactly as vLLM sampled them; behaviour logprobs under
  ``softmax(logits / T)`` (``logprobs_mode="processed_logprobs"``, top-p 1), what the GRPO
  learner scores and what TIS (``grpo.tis``) compares against.
* **LoRA modules.** :func:`make_sampler` gives a module whose LM is an adapter on a shared
  base a :class:`~marl_agents.llm.vllm_lora.VLLMLoRASampler` instead (one multi-LoRA engine
  per base, adapter-only syncs: :mod:`marl_agents.llm.vllm_lora`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marl_agents.llm.backend import Generation, Params
from marl_agents.llm.vllm_backend import VLLMBackend, import_vllm
from topologies.errors import MarlError


class StaleWeightsError(MarlError, RuntimeError):
    """The engine holds other weights than the module asking it to sample."""


def _dtype_name(model: Any) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def engine_env(vllm: Any) -> None:
    """Environment for an in-process engine (core, executor and model in this process)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # an engine started earlier in this process froze vLLM's env cache: read it afresh
    getattr(vllm.envs, "disable_envs_cache", lambda: None)()


def save_for_engine(model: Any, tokenizer: Any, path: str | os.PathLike[str]) -> None:
    """Save an in-code model and its tokenizer where an engine can load them."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def check_version(held: int, asked: int) -> None:
    """Raise :class:`StaleWeightsError` unless the engine holds the caller's version."""
    if asked != held:
        raise StaleWeightsError(
            f"the vLLM engine holds weights version {held} but the module is at "
            f"{asked}: call sync(model, version) after every weight update"
        )


def make_sampler(model: Any, tokenizer: Any, **kwargs: Any) -> Any:
    """The vLLM sampler for a module's ``model``: a LoRA module's adapter
    (:class:`~marl_agents.llm.lora.AdapterModel`) is served by its base's multi-LoRA engine
    (:class:`~marl_agents.llm.vllm_lora.VLLMLoRASampler`), a full model by its own
    :class:`VLLMSampler` (``kwargs``: :class:`VLLMSampler`'s; ``path`` unused for LoRA)."""
    from marl_agents.llm.lora import AdapterModel

    if isinstance(model, AdapterModel):
        from marl_agents.llm.vllm_lora import VLLMLoRASampler

        kwargs.pop("path", None)  # the engine loads the shared base, not the module
        return VLLMLoRASampler(model, **kwargs)
    return VLLMSampler(model, tokenizer, **kwargs)


class VLLMSampler:
    """An in-process vLLM engine serving one module's current weights (module doc).

    Args:
        model: the module's Hugging Face LM (its weights seed the engine and are synced).
        tokenizer: its tokenizer.
        path: the directory the LM was loaded from (``None``: save ``model`` to a temp dir).
        version: the module's weights version that ``model`` holds now.
        max_model_len: context length to reserve KV cache for.
        seed: the engine's sampling seed.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        path: str | os.PathLike[str] | None = None,
        version: int = 0,
        max_model_len: int = 1024,
        seed: int = 0,
    ) -> None:
        engine_env(import_vllm())
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="marl-vllm-")
            path = Path(self._tmp.name) / "model"
            save_for_engine(model, tokenizer, path)
        extra: dict[str, Any] = {}
        if max_model_len > int(getattr(model.config, "max_position_embeddings", max_model_len)):
            # the text spaces allow longer rows than the config's positions: transformers
            # computes RoPE for any position, vLLM only up to its cache (beyond it the CPU
            # kernel aborts), so size the engine's positions to the rows
            extra["hf_overrides"] = {"max_position_embeddings": max_model_len}
        start = time.perf_counter()
        self.backend = VLLMBackend(
            path,
            tokenizer=tokenizer,
            dtype=_dtype_name(model),
            max_model_len=max_model_len,
            seed=seed,
            behaviour_logprobs=True,
            **extra,
        )
        #: seconds the engine took to start.
        self.start_s = time.perf_counter() - start
        client = type(self.backend.llm.llm_engine.engine_core).__name__
        if client != "InprocClient":
            raise RuntimeError(
                f"the vLLM engine core runs behind {client}, not in this process: weight syncs "
                "would cross process boundaries; unset VLLM_ENABLE_V1_MULTIPROCESSING overrides"
            )
        #: the module weights version the engine holds.
        self.version = version
        #: seconds the last :meth:`sync` took.
        self.sync_s = 0.0

    def sync(self, model: Any, version: int) -> None:
        """Load ``model``'s weights into the engine and record them as ``version``."""
        start = time.perf_counter()
        self.backend.load_weights((name, t.detach()) for name, t in model.state_dict().items())
        self.version = version
        self.sync_s = time.perf_counter() - start

    def generate(
        self, prompts: Sequence[Sequence[int]], params: Params, *, version: int
    ) -> list[Generation]:
        """Sample one completion per prompt with the engine's weights (``params``: one for all
        prompts or one per prompt; a prompt's ``seed`` becomes its vLLM request's seed).

        Raises:
            StaleWeightsError: the engine holds weights ``self.version``, not ``version``.
        """
        check_version(self.version, version)
        return self.backend.generate([list(p) for p in prompts], params)
