"""Hugging Face export of trained LLM pools (``output.export_hf``), used by
:func:`trainers.run.loop.train`.

Contract: with ``output.export_hf`` on, every trained pool whose model is an LLM is saved with
``save_pretrained`` (model and tokenizer) as ``<dir>/<pool>``: ``<checkpoint>/model/<pool>``
with each periodic checkpoint and ``<run>/model/<pool>`` at the end of a run. The weights are
the learner's, pushed to the env runners first. ``AutoModelForCausalLM.from_pretrained`` or a
vLLM server loads the directory. A LoRA pool (``model.lora``/``model.adapter``) is saved as a
peft adapter directory (``adapter_config.json`` + ``adapter_model.safetensors`` + tokenizer;
``PeftModel.from_pretrained(base, dir)`` loads it), and with ``lora.export_merged`` also as
``<dir>/<pool>-merged``: the base with the adapter merged in, a plain HF model directory.
Turning it on for an experiment without a trained LLM pool is a
:class:`~trainers.configs.typed.ConfigError` before Ray starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError


def export_pools(cfg: ExperimentConfig, plan: Any) -> list[str]:
    """The pools ``cfg.output.export_hf`` saves (``[]`` when it is off).

    Args:
        cfg: the experiment.
        plan: its resolved :class:`~trainers.plan.Plan`.

    Raises:
        ConfigError: ``export_hf`` is on and no trained pool is an LLM.
    """
    if not cfg.output.export_hf:
        return []
    pools = [p for p in plan.trainable if plan.pools[p].model.type == "llm"]
    if not pools:
        trained = ", ".join(plan.trainable) or "none"
        raise ConfigError(
            f"output.export_hf=true but no trained pool is an LLM (trained: {trained}): "
            "set output.export_hf: false, or train a pool with model type llm"
        )
    return pools


def save_hf(algo: Any, pools: list[str], parent: Path) -> dict[str, Path]:
    """Save the learner's current weights of ``pools`` as ``parent/<pool>``; pool → directory."""
    if not pools:
        return {}
    algo.env_runner_group.sync_weights(
        from_worker_or_learner_group=algo.learner_group, policies=pools
    )
    saved = {}
    with _no_transformers_bar():  # the run has its own progress bar
        for pool in pools:
            saved[pool] = parent / pool
            module = algo.get_module(pool)
            module.save_pretrained(str(saved[pool]))
            if getattr(module, "lora", False) and _export_merged(module.model_config):
                saved[f"{pool}-merged"] = parent / f"{pool}-merged"
                module.save_merged(str(saved[f"{pool}-merged"]))
    return saved


def _export_merged(model_config: Any) -> bool:
    lora = (model_config or {}).get("lora") or {}
    return bool(lora.get("export_merged", False))


@contextlib.contextmanager
def _no_transformers_bar() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
