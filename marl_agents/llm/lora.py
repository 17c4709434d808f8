"""LoRA pools: one shared base model per process, one peft adapter per module.

Contract:

* :data:`BASES` maps a base (:func:`base_key`: ``path``, ``dtype``, ``tiny_seed``) to its
  :class:`SharedBase`: the tokenizer and the base model, wrapped once by peft, holding one
  named adapter per live module (learner and env-runner modules in one process each have
  their own). The base's parameters never require gradients and are never written.
* :func:`attach` adds an adapter (fresh from a :class:`~marl_agents.pools.LoRAConfig`, seeded
  by the pool id, or loaded from a peft adapter directory) and returns an
  :class:`AdapterModel`: what a LoRA :class:`~marl_agents.llm.rl_module.CausalLMModule` holds
  as its ``model``. Its ``parameters()`` are the adapter's only, so the learner's optimizer,
  the module's ``state_dict`` (weight sync, checkpoints) and the KL reference see nothing else.
* **Active adapter.** Every call of an :class:`AdapterModel` takes the base's lock and sets its
  adapter active on each LoRA layer (``_active_adapter``, not peft's ``set_adapter``, which
  also flips ``requires_grad``), so modules in one process never run with another's adapter;
  the autograd graph of a forward keeps the adapter it ran with.
* **Mixed batches.** :class:`MixedAdapters` runs the base with one adapter per row (peft's
  mixed-batch LoRA forward, ``adapter_names``): the batched sampler samples the rows of
  several LoRA pools on one base in one ``generate``
  (:func:`marl_agents.llm.shared_batch.act_together`).
* An adapter is dropped when its :class:`AdapterModel` is garbage collected (at the next
  :func:`attach`), and the base with its last adapter.
* :func:`save_adapter` writes a peft adapter directory (``adapter_config.json`` +
  ``adapter_model.safetensors``; ``PeftModel.from_pretrained`` loads it), :func:`save_merged`
  a base copy with the adapter merged in. :func:`check_lora` checks a pool's adapter against
  its base before Ray starts (:class:`~marl_agents.pools.PoolError` naming the fix).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import json
import threading
import warnings
import weakref
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from marl_agents.pools import LLMModel, LoRAConfig, PoolError

#: base key → the shared base of this process.
BASES: dict[tuple[str, str, int], SharedBase] = {}
_NAMES = itertools.count()
_ADAPTER_CONFIG = "adapter_config.json"


#: ``model_type`` → the modules an adapter targets when ``lora.target_modules`` is not given.
DEFAULT_TARGETS: dict[str, list[str]] = {
    "gemma3_text": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
#: the default targets of the other families.
FALLBACK_TARGETS: list[str] = ["q_proj", "v_proj"]


def target_modules(lora: LoRAConfig, path: str) -> list[str]:
    """``lora``'s target modules, or base ``path``'s family default (:data:`DEFAULT_TARGETS`)."""
    if lora.target_modules is not None:
        return list(lora.target_modules)
    from marl_agents.llm.checkpoints import inspect_checkpoint

    return list(DEFAULT_TARGETS.get(inspect_checkpoint(path).family, FALLBACK_TARGETS))


def base_key(path: str, dtype: str, tiny_seed: int = 0) -> tuple[str, str, int]:
    """The registry key of a base: pools with equal keys share one copy of its weights."""
    from scenarios.pretrained import is_pretrained

    if path == "tiny":
        return ("tiny", str(dtype), int(tiny_seed))
    if is_pretrained(path) and not Path(path).suffix:  # a named model: its name
        return (path, str(dtype), 0)
    return (str(Path(path).expanduser().resolve()), str(dtype), 0)


def peft_config(lora: LoRAConfig | None, adapter: str | None, base_path: str) -> Any:
    """The peft ``LoraConfig`` of a pool: from its adapter directory, else from ``lora``."""
    from peft import LoraConfig

    if adapter is not None:
        cfg = LoraConfig.from_pretrained(str(Path(adapter).expanduser()))
        cfg.inference_mode = False
        return cfg
    assert lora is not None
    targets = target_modules(lora, base_path)
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules="all-linear" if targets == ["all-linear"] else list(targets),
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_path,
    )


class SharedBase:
    """One base model and its adapters in this process (see the module doc).

    Attributes:
        key: its :func:`base_key`.
        tokenizer: the base's tokenizer.
        model: the peft-wrapped base (``None`` until the first adapter).
        lock: held while a module's adapter is active.
    """

    def __init__(self, key: tuple[str, str, int], path: str, tokenizer: Any, base: Any) -> None:
        self.key, self.path = key, path
        self.tokenizer = tokenizer
        self._base = base
        self.model: Any = None
        self.lock = threading.RLock()
        self._trainable: dict[str, bool] = {}
        self._dead: list[str] = []
        self._layers: list[Any] = []
        if not base.__dict__.get("name_or_path"):  # the in-code tiny model: name it for peft
            base.name_or_path = path
        for p in base.parameters():
            p.requires_grad_(False)

    @property
    def inner(self) -> Any:
        """The base's own (transformers) model with the LoRA layers injected."""
        return self._base

    def base_parameters(self) -> dict[str, torch.nn.Parameter]:
        """The base's parameters (no adapter's), by name."""
        return {n: p for n, p in self._base.named_parameters() if "lora_" not in n}

    def add(self, name: str, config: Any, state: dict[str, torch.Tensor] | None, *,
            seed: int = 0, trainable: bool = True) -> dict[str, torch.nn.Parameter]:  # fmt: skip
        """Add adapter ``name`` (weights ``state`` in peft's saved format, else a fresh init
        seeded by ``seed``); its parameters by stable name (the adapter name left out)."""
        from peft import get_peft_model, set_peft_model_state_dict
        from peft.tuners.tuners_utils import BaseTunerLayer

        with self.lock:
            self._collect()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                if self.model is None:
                    self.model = get_peft_model(self._base, copy.deepcopy(config), name)
                else:
                    self.model.add_adapter(name, copy.deepcopy(config))
            if state is not None:
                set_peft_model_state_dict(self.model, state, adapter_name=name)
            self._layers = [m for m in self._base.modules() if isinstance(m, BaseTunerLayer)]
            self._trainable[name] = trainable
            self._fix_grads()
            return self.adapter_parameters(name)

    def adapter_parameters(self, name: str) -> dict[str, torch.nn.Parameter]:
        """Adapter ``name``'s parameters keyed by their module path (``.`` → ``/``)."""
        part = f".{name}."
        return {
            n.replace(part, ".").replace(".", "/"): p
            for n, p in self._base.named_parameters()
            if part in n
        }

    def _fix_grads(self) -> None:
        # peft's add/delete toggle requires_grad; ours: base never, each adapter as registered
        for p in self._base.parameters():
            p.requires_grad_(False)
        for name, trainable in self._trainable.items():
            for p in self.adapter_parameters(name).values():
                p.requires_grad_(trainable)

    @contextlib.contextmanager
    def active(self, name: str) -> Iterator[None]:
        """Run the base with adapter ``name`` (and no other) active, under the lock."""
        with self.lock:
            for layer in self._layers:
                layer._active_adapter = [name]
            yield

    def release(self, name: str) -> None:
        """Mark adapter ``name`` dead (its module was collected); dropped at the next add."""
        self._dead.append(name)
        if len(self._dead) >= len(self._trainable) and BASES.get(self.key) is self:
            del BASES[self.key]  # no live adapter: the next attach loads the base afresh

    def _collect(self) -> None:
        dead, self._dead = self._dead, []
        for name in dead:
            if name in self._trainable and len(self._trainable) > 1:
                with warnings.catch_warnings():  # "adapter … was active": we set it per call
                    warnings.simplefilter("ignore")
                    self.model.delete_adapter(name)
                del self._trainable[name]
        if dead:
            self._fix_grads()

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter ``name``'s weights in peft's saved format (CPU copies)."""
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(
            self.model, adapter_name=name, save_embedding_layers=False
        )
        return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}


class AdapterModel:
    """The shared base run with one adapter: a LoRA module's ``model`` (module doc).

    Calls (``model(input_ids=...)``) run under the base's lock with this adapter active;
    ``parameters()`` yields the adapter's only; other attributes (``config``, …) are the base's.
    ``copy.deepcopy`` gives a frozen snapshot: a new adapter with the current weights on the
    same base (what the GRPO learner's KL reference gets).
    """

    def __init__(self, shared: SharedBase, name: str, params: dict[str, torch.nn.Parameter]):
        self.shared, self.name = shared, name
        self.params = params
        weakref.finalize(self, shared.release, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.shared.active(self.name):
            return self.shared.inner(*args, **kwargs)

    forward = __call__

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The adapter's parameters."""
        return iter(self.params.values())

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The adapter's parameters by stable name."""
        return iter(self.params.items())

    def eval(self) -> AdapterModel:
        """Eval mode (no dropout) on the shared base; it never leaves it."""
        self.shared.inner.eval()
        return self

    def __getattr__(self, attr: str) -> Any:
        if attr in ("shared", "name", "params"):
            raise AttributeError(attr)
        return getattr(self.shared.inner, attr)

    def __deepcopy__(self, memo: dict[int, Any]) -> AdapterModel:
        shared = self.shared
        config = shared.model.peft_config[self.name]
        name = f"{self.name.split('#')[0]}#{next(_NAMES)}"
        state = shared.adapter_state(self.name)
        params = shared.add(name, config, state, trainable=False)
        return AdapterModel(shared, name, params)


class MixedAdapters:
    """The shared base run with one adapter per row: inside :meth:`rows`, a call runs row
    ``r`` with adapter ``names[r]`` (peft's mixed-batch LoRA forward, under the base's lock;
    the model must be in eval mode, as samplers keep it). What
    :class:`~marl_agents.llm.hf_backend.HFBackend` calls to sample several LoRA pools' rows in
    one batch."""

    def __init__(self, shared: SharedBase) -> None:
        self.shared = shared

    @contextlib.contextmanager
    def rows(self, names: list[str]) -> Iterator[None]:
        """Calls inside run row ``r`` with adapter ``names[r]``."""
        peft = self.shared.model
        with self.shared.lock:
            peft.eval()  # peft refuses adapter_names in train mode; dropout stays off anyway
            with peft.base_model._enable_peft_forward_hooks(adapter_names=list(names)):
                yield

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.shared.inner(*args, **kwargs)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The base's parameters (where it lives)."""
        return self.shared.inner.parameters()

    def __getattr__(self, attr: str) -> Any:
        if attr == "shared":
            raise AttributeError(attr)
        return getattr(self.shared.inner, attr)


def attach(model: LLMModel | dict[str, Any], pool: str = "adapter") -> tuple[Any, AdapterModel]:
    """``(tokenizer, AdapterModel)``: a new adapter for ``pool`` on the shared base.

    Args:
        model: the pool's :class:`~marl_agents.pools.LLMModel` (or its RLModule
            ``model_config``: ``model``, ``dtype``, ``tiny_seed``, ``lora``, ``adapter``).
        pool: the pool id (names the adapter and seeds a fresh one).
    """
    from marl_agents.llm.rl_module import load_causal_lm

    if isinstance(model, dict):
        lora = model.get("lora")
        model = LLMModel(
            path=str(model.get("model", "tiny")),
            tiny_seed=int(model.get("tiny_seed", 0)),
            dtype=str(model.get("dtype", "float32")),
            lora=LoRAConfig(**lora) if isinstance(lora, dict) else lora,
            adapter=model.get("adapter"),
        )
    key = base_key(model.path, model.dtype, model.tiny_seed)
    shared = BASES.get(key)
    if shared is None:
        tok, lm = load_causal_lm(model.path, tiny_seed=model.tiny_seed, dtype=model.dtype)
        shared = BASES[key] = SharedBase(key, model.path, tok, lm.eval())
    state = None
    if model.adapter is not None:
        from peft.utils import load_peft_weights

        state = load_peft_weights(str(Path(model.adapter).expanduser()), device="cpu")
    name = f"{pool}#{next(_NAMES)}".replace(".", "_")
    seed = zlib.crc32(f"{pool}/{model.tiny_seed}".encode())
    config = peft_config(model.lora, model.adapter, model.path)
    params = shared.add(name, config, state, seed=seed)
    # the first adapter's peft wrap may have moved nothing, but keep the base in eval mode
    shared.inner.eval()
    return shared.tokenizer, AdapterModel(shared, name, params)


def save_adapter(model: AdapterModel, path: str | Path) -> Path:
    """Write ``model``'s adapter as a peft directory (config + safetensors) at ``path``."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.shared.model.peft_config[model.name])
    config.inference_mode = True
    config.save_pretrained(str(out))
    save_file(model.shared.adapter_state(model.name), str(out / "adapter_model.safetensors"))
    return out


def save_merged(model: AdapterModel, path: str | Path) -> Path:
    """Write a fresh copy of the base with ``model``'s adapter merged in (``save_pretrained``,
    with the tokenizer) at ``path``; the shared base is not touched."""
    from peft import get_peft_model, set_peft_model_state_dict

    from marl_agents.llm.rl_module import load_causal_lm

    shared = model.shared
    _path, dtype, seed = shared.key
    tok, fresh = load_causal_lm(shared.path, tiny_seed=seed, dtype=dtype)
    fresh.name_or_path = shared.path
    config = copy.deepcopy(shared.model.peft_config[model.name])
    wrapped = get_peft_model(fresh, config, "default")
    set_peft_model_state_dict(wrapped, shared.adapter_state(model.name), adapter_name="default")
    merged = wrapped.merge_and_unload()
    out = Path(path)
    merged.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


# ----- checks before Ray ------------------------------------------------------------------


def check_lora(model: LLMModel, where: str) -> None:
    """Raise :class:`PoolError` unless ``model``'s adapter fits its base.

    Checks: an ``adapter`` directory is a peft LoRA adapter of this base whose rank and targets
    agree with ``lora`` (when given); every target module exists in the base (read from a
    weightless copy on torch's ``meta`` device).
    """
    targets = target_modules(model.lora, model.path) if model.lora is not None else None
    if model.adapter is not None:
        targets = _check_adapter_dir(model, where)
    if targets is None or targets == ["all-linear"] or targets == "all-linear":
        return
    names = _module_names(model.path)
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n in names if "layers." in n})
        raise PoolError(
            f"{where}: lora.target_modules {missing} are not modules of base {model.path!r}: "
            f"use some of {leaves} (or [all-linear])"
        )


#: what vLLM's multi-LoRA serving adapts (its packed linear layers); ``sampler: vllm`` only.
VLLM_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def check_vllm_lora(model: LLMModel, where: str) -> None:
    """Raise :class:`PoolError` unless vLLM can serve ``model``'s adapter (``sampler: vllm``):
    its targets are linear projections vLLM adapts (no embeddings / ``lm_head``) and its rank
    fits vLLM's largest ``max_lora_rank``."""
    r, targets = _adapter_settings(model)
    if r > 512:
        raise PoolError(f"{where}: LoRA r={r} exceeds vLLM's max_lora_rank 512: use r ≤ 512")
    listed = [targets] if isinstance(targets, str) else list(targets)
    bad = [t for t in listed if t != "all-linear" and t not in VLLM_LORA_TARGETS]
    if bad:
        raise PoolError(
            f"{where}: lora.target_modules {bad} cannot be served by vLLM (sampler: vllm adapts "
            f"only {list(VLLM_LORA_TARGETS)}): drop them, or use sampler: transformers"
        )


def _check_adapter_dir(model: LLMModel, where: str) -> list[str]:
    root = Path(str(model.adapter)).expanduser()
    config_file = root / _ADAPTER_CONFIG
    if not config_file.is_file():
        raise PoolError(
            f"{where}: adapter={model.adapter!r} is not a peft adapter directory (no "
            f"{_ADAPTER_CONFIG}): save one with PeftModel.save_pretrained or output.export_hf"
        )
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise PoolError(f"{where}: adapter {model.adapter!r}: unreadable config ({exc})") from None
    if config.get("peft_type") != "LORA":
        raise PoolError(
            f"{where}: adapter {model.adapter!r} is a {config.get('peft_type')!r} adapter, not "
            "LORA: use a LoRA adapter directory"
        )
    base = config.get("base_model_name_or_path")
    if base and not _same_base(str(base), model.path):
        raise PoolError(
            f"{where}: adapter {model.adapter!r} was trained on base {base!r} but the pool's "
            f"path is {model.path!r}: set path: {base}"
        )
    _check_adapter_tokenizer(model, root, where)
    raw = config.get("target_modules") or []
    targets = sorted(raw) if isinstance(raw, list) else [str(raw)]
    lora = model.lora
    listed = sorted(target_modules(lora, model.path)) if lora is not None else targets
    if lora is not None and (lora.r != config.get("r") or listed != targets):
        raise PoolError(
            f"{where}: lora (r={lora.r}, target_modules={listed}) disagrees with "
            f"adapter {model.adapter!r} (r={config.get('r')}, target_modules={targets}): "
            "remove lora (the adapter's own settings are used) or match them"
        )
    return targets


def _check_adapter_tokenizer(model: LLMModel, root: Path, where: str) -> None:
    """A tokenizer saved with the adapter is the base's (the pool prompts with the base's)."""
    if not (root / "tokenizer.json").exists() and not (root / "tokenizer_config.json").exists():
        return
    from scenarios.text_space import load_tokenizer

    saved, base = load_tokenizer(str(root)).get_vocab(), load_tokenizer(model.path).get_vocab()
    if saved != base:
        raise PoolError(
            f"{where}: adapter {model.adapter!r} was saved with a different tokenizer "
            f"({len(saved)} tokens) from base {model.path!r}'s ({len(base)}), which the pool "
            "prompts and samples with: train the adapter on this base and tokenizer"
        )


def _same_base(saved: str, path: str) -> bool:
    if saved == path:
        return True
    a, b = Path(saved).expanduser(), Path(path).expanduser()
    return a.exists() and b.exists() and a.resolve() == b.resolve()


@functools.lru_cache(maxsize=8)
def _meta_model(path: str) -> torch.nn.Module:
    """Base ``path`` built without weights on torch's meta device (module names, shapes)."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    from marl_agents.llm.checkpoints import TINY_FIELDS

    if path == "tiny":
        config = Qwen2Config(**{k: v for k, v in TINY_FIELDS.items() if k != "model_type"})
    else:
        from scenarios.pretrained import resolve

        config = AutoConfig.from_pretrained(str(Path(resolve(path)).expanduser()))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _module_names(path: str) -> tuple[str, ...]:
    return tuple(n for n, _ in _meta_model(path).named_modules() if n)


def _adapter_settings(model: LLMModel) -> tuple[int, list[str] | str]:
    """``(r, target_modules)`` of a pool's adapter (its directory's, else ``lora``'s)."""
    if model.adapter is not None:
        config = json.loads((Path(model.adapter).expanduser() / _ADAPTER_CONFIG).read_text())
        raw = config.get("target_modules") or []
        return int(config.get("r", 8)), raw if isinstance(raw, list) else str(raw)
    assert model.lora is not None
    return model.lora.r, target_modules(model.lora, model.path)


def adapter_parameters(model: LLMModel) -> int:
    """Parameters of ``model``'s adapter: ``r × (in + out)`` per targeted linear layer."""
    r, targets = _adapter_settings(model)
    every = targets in (["all-linear"], "all-linear")
    total = 0
    for n, m in _meta_model(model.path).named_modules():
        linear = isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")
        if linear and (every or n.rsplit(".", 1)[-1] in targets):
            total += r * (m.in_features + m.out_features)
    return total
