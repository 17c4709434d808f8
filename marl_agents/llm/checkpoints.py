"""Local Hugging Face checkpoints as LLM pool models: what a directory holds, what it needs.

* :func:`inspect_checkpoint` reads ``config.json`` and the safetensors headers only (no
  weights, no torch): a directory is a pool model when its ``model_type`` is one of
  :data:`FAMILIES` and a tokenizer is saved next to it; anything else is a one-line
  :class:`CheckpointError` naming the path, what was found and the fix. A named pretrained
  model (``gemma3-270m``) or a ``.gguf`` file is first resolved to its converted directory
  (:mod:`scenarios.pretrained`: converted once, on first use).
* :func:`memory_estimate`: parameters × bytes of the dtype; a trained pool adds gradients (in
  the dtype) and Adam's two moments (2 × fp32). A LoRA pool counts its adapter so, and its
  shared base once per base (:mod:`marl_agents.llm.lora`).
* :func:`check_memory`: the LLM pools' estimates against the configured devices (free GPU
  memory of one GPU learner, else ``MemAvailable`` of ``/proc/meminfo``), before Ray starts;
  too much is a :class:`MemoryBudgetError` naming the pools, the estimate, what is available
  and the fix. torch is imported only to ask CUDA for its free memory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from marl_agents.pools import PoolError

#: ``config.json`` ``model_type`` values that load as pool models (decoder-only causal LMs).
FAMILIES: tuple[str, ...] = ("qwen2", "qwen3", "llama", "mistral", "gemma3_text")
#: bytes per parameter of each ``LLMModel.dtype``.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
#: the in-code tiny model's ``Qwen2Config`` fields (besides the tokenizer's ids).
TINY_FIELDS: dict[str, Any] = dict(
    model_type="qwen2",
    vocab_size=384,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


class CheckpointError(PoolError):
    """A directory that is not a loadable Hugging Face causal LM of a supported family."""


class MemoryBudgetError(PoolError):
    """LLM pools whose estimated memory exceeds what the configured devices have."""


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What a model directory (or ``tiny``) holds, read without loading weights.

    Attributes:
        path: the directory (``"tiny"`` for the in-code model).
        family: ``config.json``'s ``model_type`` (one of :data:`FAMILIES`).
        parameters: parameter count (safetensors headers, else estimated from the config).
        vocab_size: ``config.json``'s ``vocab_size``.
    """

    path: str
    family: str
    parameters: int
    vocab_size: int


def inspect_checkpoint(path: str) -> CheckpointInfo:
    """Family, size and vocabulary of ``"tiny"`` or a saved HF directory.

    Raises:
        CheckpointError: no such directory, no ``config.json``, an unreadable config, a
            ``model_type`` outside :data:`FAMILIES`, or no tokenizer files.
    """
    if path == "tiny":
        return CheckpointInfo("tiny", "qwen2", config_parameters(TINY_FIELDS), 384)
    from scenarios.pretrained import PretrainedError, resolve

    try:
        root = Path(resolve(path)).expanduser()  # a named model / .gguf: its converted directory
    except PretrainedError as exc:
        raise CheckpointError(str(exc)) from None
    fix = (
        "save one with model.save_pretrained(dir) and tokenizer.save_pretrained(dir), or use 'tiny'"
    )
    if not root.is_dir():
        raise CheckpointError(f"model {path!r}: no such directory: {fix}")
    if not (root / "config.json").exists():
        found = sorted(p.name for p in root.iterdir())[:6]
        raise CheckpointError(
            f"model {path!r} is not a Hugging Face model directory (no config.json; found "
            f"{found or 'nothing'}): {fix}"
        )
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"model {path!r}: config.json is unreadable ({exc}): {fix}") from None
    family = str(config.get("model_type", "")) if isinstance(config, dict) else ""
    if family not in FAMILIES:
        arch = config.get("architectures") if isinstance(config, dict) else None
        raise CheckpointError(
            f"model {path!r} is of model_type {family or 'missing'!r} (architectures {arch}), "
            f"not a supported decoder family: use a {', '.join(FAMILIES)} checkpoint"
        )
    if not any((root / name).exists() for name in _TOKENIZER_FILES):
        raise CheckpointError(
            f"model {path!r} ({family}) has no tokenizer files ({', '.join(_TOKENIZER_FILES)}): "
            "save the tokenizer next to the model with tokenizer.save_pretrained(dir)"
        )
    params = _safetensors_parameters(root) or config_parameters(config)
    return CheckpointInfo(str(path), family, params, int(config.get("vocab_size", 0)))


def memory_estimate(
    info: CheckpointInfo, dtype: str, *, trained: bool, adapter: int | None = None
) -> int:
    """Bytes a pool of this model needs on its learner: weights in ``dtype``, and for a
    trained pool also gradients in ``dtype`` and Adam's two fp32 moments.

    A LoRA pool (``adapter``: its adapter's parameter count) counts its adapter only, the same
    way; :func:`check_memory` adds its shared base once per base.
    """
    n = info.parameters if adapter is None else adapter
    weights = n * DTYPE_BYTES[dtype]
    return weights + (weights + 2 * 4 * n if trained else 0)


@dataclasses.dataclass(frozen=True)
class LLMPoolNeed:
    """One LLM pool to place: its id, model path, dtype and whether it trains.

    ``base`` (a LoRA pool: the key of its shared base, :func:`marl_agents.llm.lora.base_key`)
    and ``adapter_parameters``: pools with one base count its weights once. ``reference``: the
    learner also keeps a frozen copy of the pool's starting weights (a LoRA pool: of its
    adapter) — GRPO's KL reference or the ``kl_to_start`` monitor's.
    """

    pool: str
    path: str
    dtype: str
    trained: bool
    base: str | None = None
    adapter_parameters: int = 0
    reference: bool = False


def check_memory(
    pools: Sequence[LLMPoolNeed],
    *,
    num_learners: int = 0,
    num_gpus_per_learner: float = 0.0,
    num_env_runners: int = 0,
    num_gpus_per_env_runner: float = 0.0,
    available: Mapping[str, int] | None = None,
) -> None:
    """Raise unless the LLM pools fit the configured devices.

    GPU learners (``num_gpus_per_learner > 0``): each GPU holds every pool's learner estimate
    and system RAM the sampling copies (weights, one per env runner). CPU: RAM holds the
    learner estimate on each learner process (at least one, the driver's) plus the sampling
    copies — none when the driver both learns and samples (no remote learners or env
    runners): its sampler runs on the learner's weights (:func:`trainers.ppo.share_local_weights`).
    GPU env runners (``num_gpus_per_env_runner > 0``): each runner's copy is on a GPU
    (shared with the learner's when the two fractions add up to at most one) and RAM keeps
    only the driver's copy. ``available`` (``{"gpu": bytes, "ram": bytes}``) replaces the
    measured amounts; a device whose amount cannot be measured is not checked.

    Raises:
        MemoryBudgetError: one line: the pools with their estimates, the total, what the
            device has, the fix.
    """
    if not pools:
        return
    measured = dict(available) if available is not None else {}
    gpu = num_gpus_per_learner > 0
    rows = []
    bases: set[str] = set()
    for need in pools:
        info = inspect_checkpoint(need.path)
        adapter = need.adapter_parameters if need.base is not None else None
        learn = memory_estimate(info, need.dtype, trained=need.trained, adapter=adapter)
        sample = memory_estimate(info, need.dtype, trained=False, adapter=adapter)
        learn += sample if need.reference else 0  # the frozen reference: weights only
        if need.base is not None and need.base not in bases:  # one shared base per process
            bases.add(need.base)
            base = memory_estimate(info, need.dtype, trained=False)
            learn, sample = learn + base, sample + base
        rows.append((need, info, learn, sample))
    gpu_sampling = num_gpus_per_env_runner > 0
    samplers = 1 if gpu_sampling else max(1, num_env_runners)  # on GPUs: the driver's copy
    copy = sum(r[3] for r in rows)
    one_process = not (gpu or gpu_sampling or num_learners or num_env_runners)
    sampling = 0 if one_process else copy * samplers
    learning = sum(r[2] for r in rows)
    copies = (
        "sampling on the learner's weights"
        if one_process
        else f"{samplers} sampling cop{'y' if samplers == 1 else 'ies'} ~{_size(sampling)}"
    )
    if gpu:
        checks = [
            ("gpu", learning, "GPU memory (per learner)", ""),
            ("ram", sampling, "RAM", copies),
        ]
    else:
        learners = max(1, num_learners)
        learning *= learners
        checks = [("ram", learning + sampling, "RAM", f"× {learners} learner(s) + {copies}")]
    if gpu_sampling:
        shared = gpu and num_gpus_per_learner + num_gpus_per_env_runner <= 1
        what = "GPU memory (per env runner" + (" and learner)" if shared else ")")
        if shared:
            checks = [c for c in checks if c[0] != "gpu"]
        checks.append(("gpu", copy + (learning if shared else 0), what, ""))
    for device, need_bytes, what, extra in checks:
        have = measured[device] if device in measured else available_memory(device)
        if have is None or need_bytes <= have:
            continue
        parts = "; ".join(
            f"pool {n.pool!r}: {i.path} ({i.family}, {i.parameters / 1e6:.1f}M parameters, "
            f"{n.dtype}{', trained' if n.trained else ''}) ~{_size(learn)}"
            for n, i, learn, _ in rows
        )
        fixes = ["fewer or frozen LLM pools"]
        if any(n.dtype == "float32" for n in pools):
            fixes.insert(0, "dtype bfloat16")
        fixes.append("fewer env runners" if device == "ram" and samplers > 1 else "")
        if any(n.reference for n in pools):
            fixes.append("monitors.kl.log: false with kl_coef 0 (no reference copy)")
        fixes.append(
            "a GPU (resources.num_learners: 1, num_gpus_per_learner: 1)"
            if not gpu
            else ("a GPU with more memory" if device == "gpu" else "")
        )
        raise MemoryBudgetError(
            f"LLM pools need ~{_size(need_bytes)} of {what} ({parts}{' ' if extra else ''}"
            f"{extra}) but {_size(have)} is available: use {', '.join(f for f in fixes if f)}"
        )


def available_memory(device: str) -> int | None:
    """Free bytes on ``"gpu"`` (CUDA device 0) or ``"ram"`` (``MemAvailable``); ``None`` when
    it cannot be measured here."""
    if device == "gpu":
        import torch

        if not torch.cuda.is_available():
            return None
        free, _total = torch.cuda.mem_get_info(0)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} bytes"


def _safetensors_parameters(root: Path) -> int:
    """Parameter count from the safetensors headers (0 when there are none)."""
    total = 0
    for file in sorted(root.glob("*.safetensors")):
        try:
            with file.open("rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(size))
        except (OSError, ValueError, struct.error):
            return 0
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def config_parameters(config: Mapping[str, Any]) -> int:
    """Parameters of a Llama-style decoder from its config (embeddings, attention, MLP, norms)."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    hd = int(config.get("head_dim") or h // heads)
    vocab, layers = int(config["vocab_size"]), int(config["num_hidden_layers"])
    bias = heads * hd + 2 * kv * hd if config.get("model_type") == "qwen2" else 0
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + bias
    family = config.get("model_type")
    attn += 2 * hd if family in ("qwen3", "gemma3_text") else 0  # q_norm, k_norm
    mlp = 3 * h * int(config["intermediate_size"])
    head = 0 if config.get("tie_word_embeddings", False) else vocab * h
    norms = (4 if family == "gemma3_text" else 2) * h  # Gemma-3: pre/post attention and MLP
    return vocab * h + head + layers * (attn + mlp + norms) + h
