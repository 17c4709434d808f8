"""One ``generate`` for the rows of several LoRA pools on one base.

The batched sampler (``trainers.sampling.batched_runner``) gathers each step's decisions by
module and calls each module's forward once. LoRA pools on one shared base
(:mod:`marl_agents.llm.lora`) sampled by transformers can share that call: :func:`batch_key`
says which modules can (those on the same base in this process, transformers sampler), and
:func:`act_together` samples all their rows in one :class:`~marl_agents.llm.hf_backend.HFBackend`
batch, each row with its own module's adapter (:class:`~marl_agents.llm.lora.MixedAdapters`),
sampling settings, seed and constraint, and returns per module what its own exploration (or
inference) forward returns: the same tokens for the same seeds, logprobs up to float rounding
between batch shapes. vLLM-sampled pools keep one call per module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ray.rllib.core.columns import Columns


def batch_key(module: Any) -> Any | None:
    """The shared base whose modules' rows may share one ``generate``, or ``None`` for a
    module that samples on its own (not a LoRA pool, or sampled by vLLM)."""
    if not getattr(module, "lora", False) or getattr(module, "sampler", None) != "transformers":
        return None
    return module.model.shared


def act_together(
    modules: Sequence[Any], batches: Sequence[Mapping[str, Any]], explore: bool
) -> list[dict[str, Any]]:
    """Each module's ``forward_exploration(batch)`` (``forward_inference`` when not
    ``explore``), all rows sampled in one batch on the modules' shared base.

    Raises:
        ValueError: modules that do not share a base (:func:`batch_key`).
    """
    from marl_agents.llm.hf_backend import HFBackend
    from marl_agents.llm.lora import MixedAdapters

    shared = batch_key(modules[0])
    if shared is None or any(batch_key(m) is not shared for m in modules):
        raise ValueError("act_together needs LoRA modules on one base, sampled by transformers")
    prompts: list[list[int]] = []
    params: list[Any] = []
    names: list[str] = []
    plans: list[tuple[float, Any, int]] = []
    for module, batch in zip(modules, batches, strict=True):
        temperature = module.temperature if explore else module.inference_temperature
        seeds, constraints = module.row_settings(batch)
        rows = module.prompts(batch[Columns.OBS])
        settings = module.sampling_params(len(rows), temperature, seeds, constraints)
        prompts += rows
        params += settings if isinstance(settings, list) else [settings] * len(rows)
        names += [module.model.name] * len(rows)
        plans.append((temperature, constraints, len(rows)))
    gens = HFBackend(MixedAdapters(shared), modules[0].tokenizer).generate(prompts, params, names)
    out, start = [], 0
    for module, batch, (temperature, constraints, n) in zip(modules, batches, plans, strict=True):
        out.append(module.act_outputs(batch, gens[start : start + n], temperature, constraints))
        start += n
    return out
