"""vLLM multi-LoRA serving: one engine per shared base per process, one adapter per module.

Contract (``model.sampler: vllm`` of a LoRA pool; :func:`~marl_agents.llm.vllm_sampler.
make_sampler` picks :class:`VLLMLoRASampler` for a module whose ``model`` is an
:class:`~marl_agents.llm.lora.AdapterModel`):

* **One engine per base.** :data:`ENGINES` maps a :func:`~marl_agents.llm.lora.base_key`
  (and the context length: modules of other text spaces get their own) to a
  :class:`LoRAEngine`: a :class:`~marl_agents.llm.vllm_backend.VLLMBackend` on the base's
  weights (never synced) started with ``enable_lora=True``, ``max_lora_rank`` the smallest
  vLLM rank ≥ the largest adapter rank on the base at start, ``max_loras`` the number of live
  adapters on the base then (vLLM swaps adapters LRU beyond it: slower, still correct).
* **Adapter sync.** :meth:`VLLMLoRASampler.sync` writes the module's adapter as a peft
  directory (``<tmp>/<adapter>/v<version>``), removes the previous version from the engine
  and its directory, and adds the new one under a **new** lora int id and name (vLLM caches
  adapters, and prefix-cache blocks, by id): only adapter weights move, the base never.
* **Never stale.** :meth:`VLLMLoRASampler.generate` takes the version the caller holds and
  raises :class:`~marl_agents.llm.vllm_sampler.StaleWeightsError` if the engine holds another
  adapter version of this module; each request carries the module's own ``LoRARequest``.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marl_agents.llm.backend import Generation, SamplingParams
from marl_agents.llm.vllm_backend import VLLMBackend, import_vllm

#: (base key, max_model_len) → the LoRA engine of this process.
ENGINES: dict[tuple[tuple[str, str, int], int], LoRAEngine] = {}
#: vLLM's accepted ``max_lora_rank`` values (``vllm.config.lora.MaxLoRARanks``).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _rank(shared: Any, name: str) -> int:
    return int(shared.model.peft_config[name].r)


def engine_rank(ranks: Sequence[int]) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds every rank in ``ranks``."""
    top = max(ranks, default=1)
    for r in VLLM_LORA_RANKS:
        if r >= top:
            return r
    raise ValueError(f"LoRA rank {top} exceeds vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")


class LoRAEngine:
    """One in-process vLLM engine serving the adapters of one shared base (module doc).

    Args:
        shared: the base's :class:`~marl_agents.llm.lora.SharedBase`.
        max_model_len: context length to reserve KV cache for.
        seed: the engine's sampling seed.
    """

    def __init__(self, shared: Any, *, max_model_len: int = 1024, seed: int = 0) -> None:
        from marl_agents.llm.vllm_sampler import engine_env, save_for_engine

        engine_env(import_vllm())
        self.shared = shared
        self.tmp = tempfile.TemporaryDirectory(prefix="marl-vllm-lora-")
        path, dtype, tiny_seed = shared.key
        if path == "tiny":  # the in-code base: a fresh copy (the shared one holds LoRA layers)
            from marl_agents.llm.rl_module import load_causal_lm

            tok, base = load_causal_lm("tiny", tiny_seed=tiny_seed, dtype=dtype)
            path = str(Path(self.tmp.name) / "base")
            save_for_engine(base, tok, path)
        live = [n for n in shared._trainable if n not in shared._dead]
        #: the engine's ``max_lora_rank`` and ``max_loras``.
        self.max_rank = engine_rank([_rank(shared, n) for n in live])
        self.max_loras = max(1, len(live))
        start = time.perf_counter()
        self.backend = VLLMBackend(
            path,
            tokenizer=shared.tokenizer,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            behaviour_logprobs=True,
            enable_lora=True,
            max_lora_rank=self.max_rank,
            max_loras=self.max_loras,
            **_positions(shared.inner, max_model_len),
        )
        #: seconds the engine took to start.
        self.start_s = time.perf_counter() - start
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        """A lora int id never used on this engine."""
        return next(self._ids)


def _positions(model: Any, max_model_len: int) -> dict[str, Any]:
    limit = int(getattr(model.config, "max_position_embeddings", max_model_len))
    if max_model_len > limit:  # as VLLMSampler: size the engine's positions to the rows
        return {"hf_overrides": {"max_position_embeddings": max_model_len}}
    return {}


def lora_engine(shared: Any, *, max_model_len: int = 1024, seed: int = 0) -> LoRAEngine:
    """This process's engine for ``shared``'s base and ``max_model_len`` (started on first
    use)."""
    key = (shared.key, max_model_len)
    engine = ENGINES.get(key)
    if engine is None or engine.shared is not shared:
        engine = ENGINES[key] = LoRAEngine(shared, max_model_len=max_model_len, seed=seed)
    return engine


class VLLMLoRASampler:
    """One module's adapter served by its base's :class:`LoRAEngine` (module doc).

    Same interface as :class:`~marl_agents.llm.vllm_sampler.VLLMSampler`: ``version``,
    :meth:`sync`, :meth:`generate`, ``start_s``, ``sync_s``.

    Args:
        model: the module's :class:`~marl_agents.llm.lora.AdapterModel`.
        version: the module's weights version that ``model`` holds now (loaded at once).
        max_model_len: context length (used when this module starts the engine).
        seed: the engine's sampling seed (idem).

    Raises:
        RuntimeError: the adapter's rank exceeds the engine's ``max_lora_rank`` (an adapter
            added to the base after its engine started).
    """

    def __init__(
        self, model: Any, *, version: int = 0, max_model_len: int = 1024, seed: int = 0
    ) -> None:
        self.engine = lora_engine(model.shared, max_model_len=max_model_len, seed=seed)
        self.start_s = self.engine.start_s
        self.backend = self.engine.backend
        rank = _rank(model.shared, model.name)
        if rank > self.engine.max_rank:
            raise RuntimeError(
                f"adapter {model.name!r} has rank {rank} but its base's vLLM engine started "
                f"with max_lora_rank={self.engine.max_rank}: build every LoRA module of the "
                "base before the first sample"
            )
        self.request: Any = None
        self.sync_s = 0.0
        self.sync(model, version)

    def sync(self, model: Any, version: int) -> None:
        """Load ``model``'s adapter into the engine as ``version`` (new lora id; old removed)."""
        from vllm.lora.request import LoRARequest

        from marl_agents.llm.lora import save_adapter

        start = time.perf_counter()
        root = Path(self.engine.tmp.name) / model.name.replace("#", "_")
        out = save_adapter(model, root / f"v{version}")
        engine = self.backend.llm.llm_engine
        if self.request is not None:
            engine.remove_lora(self.request.lora_int_id)
            shutil.rmtree(self.request.lora_path, ignore_errors=True)
        lora_id = self.engine.next_id()
        self.request = LoRARequest(f"{model.name}@v{version}/{lora_id}", lora_id, str(out))
        engine.add_lora(self.request)
        #: the module weights version the engine holds for this adapter.
        self.version = version
        self.sync_s = time.perf_counter() - start

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, *, version: int
    ) -> list[Generation]:
        """As :meth:`VLLMSampler.generate <marl_agents.llm.vllm_sampler.VLLMSampler.generate>`,
        with this module's adapter (its ``LoRARequest``)."""
        from marl_agents.llm.vllm_sampler import check_version

        check_version(self.version, version)
        return self.backend.generate([list(p) for p in prompts], params, lora_request=self.request)
