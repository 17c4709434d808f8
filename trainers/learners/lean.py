"""A lean learner step: RLlib's PPO and GRPO learners with the same math and less work per
minibatch (``algorithm.learner: lean``, the default; ``rllib`` keeps RLlib's own step).

Contract:

* :class:`LeanPPOLearner` (a :class:`~trainers.learners.credit_ppo.CreditPPOTorchLearner`, so credit
  normalisation composes) and :class:`LeanGRPOLearner` (a
  :class:`~trainers.grpo.learner.GRPOLearner`: LLM pools, TIS, KL-to-start) compute the same
  losses, gradients and metric values as the learners they extend, from the same batch built by
  the same learner connector pipeline (credit, GAE, GRPO advantages are unchanged).
* Optimiser: Adam with torch's fused kernel where the device has one (CPU and CUDA), else the
  foreach kernel; same hyperparameters. Fused Adam differs from RLlib's single-tensor Adam only
  in the last bits of float32 (it orders the arithmetic differently); ``fused = False`` (class
  attribute) gives foreach Adam, bit-identical to RLlib's on CPU. Optimiser state round-trips
  through checkpoints; a state saved by the other learner loads, keeping this learner's kernel.
* Per minibatch: one finiteness check over all gradients (one host sync; RLlib checks every
  parameter twice), falling back to RLlib's per-parameter handling when a gradient is not
  finite; minibatches gathered by index with RLlib's rows and shuffle draws
  (:class:`IndexMinibatches`); PPO's categorical log-probs, entropy and KL computed on the
  logits with the ops ``torch.distributions`` uses (no distribution objects; other
  distributions go through RLlib's classes); PPO's loss metrics and the off-policyness metric
  computed and logged once per update from the last minibatch that held the module (window-1
  metrics: RLlib reports that minibatch's value too).
* Frozen modules (not in ``policies_to_train``) get no batch and no step, as with RLlib.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from ray.rllib.algorithms.ppo.ppo import (
    LEARNER_RESULTS_KL_KEY,
    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY,
)
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY, VF_LOSS_KEY
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.torch_utils import explained_variance
from typing_extensions import override

from trainers.learners.categorical import categorical_lens, categoricals
from trainers.learners.credit_ppo import CreditPPOTorchLearner
from trainers.rllib_compat.learner import (
    MinibatchFields,
    default_multi_forward_train,
    fresh_cyclic_iterator,
    rl_modules,
    slices_sequences,
)

__all__ = ["LEARNERS", "LeanPPOLearner", "LeanTorchLearner", "make_adam"]

#: ``algorithm.learner`` values.
LEARNERS = ("lean", "rllib")


def make_adam(params: list[Any], fused: bool = True) -> torch.optim.Adam:
    """Adam over ``params`` with the fused kernel when ``fused`` and the device has it, else
    the foreach kernel (bit-identical to the single-tensor one RLlib uses on CPU)."""
    if fused:
        try:
            return torch.optim.Adam(params, fused=True)
        except (RuntimeError, ValueError):  # a device or dtype without a fused kernel
            pass
    return torch.optim.Adam(params, foreach=True)


def all_finite(grads: list[torch.Tensor]) -> bool:
    """Whether every element of ``grads`` is finite (one host sync: a norm is finite only if
    every element is; an overflowing norm only sends the caller to the exact check)."""
    norms = torch._foreach_norm(grads)
    return bool(torch.isfinite(torch.stack([n.float() for n in norms])).all())


class LeanTorchLearner(TorchLearner):
    """The algorithm-independent part: fused Adam, one finiteness check, deferred window-1
    metrics. Put it after the algorithm's learner in the bases (``class X(PPOLearnerClass,
    LeanTorchLearner)``) so the algorithm's overrides wrap these."""

    #: fused Adam (False: foreach Adam, bit-identical to RLlib's).
    fused: bool = True

    @override
    def build(self) -> None:
        self._lean_offp: dict[str, Any] = {}
        self._lean_stash: dict[str, Callable[[], dict[str, Any]]] = {}
        self._lean_training = False
        super().build()

    @override
    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        params = self.get_parameters(self._module[module_id])
        self.register_optimizer(
            module_id=module_id,
            optimizer=make_adam(params, fused=self.fused),
            params=params,
            lr_or_lr_schedule=config.lr,
        )

    @override
    def _set_optimizer_state(self, state: Any) -> None:
        built = {
            name: [(g.get("fused"), g.get("foreach")) for g in optim.param_groups]
            for name, optim in self._named_optimizers.items()
        }
        super()._set_optimizer_state(state)
        optims = self._named_optimizers
        for name, kernels in built.items():  # a saved param group brings its saver's kernel
            for group, (fused, foreach) in zip(optims[name].param_groups, kernels, strict=True):
                group["fused"], group["foreach"] = fused, foreach

    @override
    def apply_gradients(self, gradients_dict: Any) -> None:
        cfg = self.config
        special = self._grad_scalers is not None or self._lr_scheduler_classes is not None
        grads = list(gradients_dict.values())
        if cfg.torch_skip_nan_gradients or special or (grads and not all_finite(grads)):
            super().apply_gradients(gradients_dict)  # RLlib's per-parameter handling
            return
        params = self._params
        for pid, grad in gradients_dict.items():
            param = params[pid]
            if param.grad is not grad:
                param.grad = grad
        for module_id, names in self._module_optimizers.items():
            for name in names:
                self.get_optimizer(module_id, name).step()

    @override
    def _uncompiled_update(self, batch: dict[str, Any], **kwargs: Any) -> Any:
        if self.config.num_learners > 1 or not self._lean_plain_forward(batch):
            return super()._uncompiled_update(batch, **kwargs)  # DDP's no_sync, custom forwards
        self._compute_off_policyness(batch)
        fwd_out = self._lean_forward_train(batch)
        loss_per_module = self.compute_losses(fwd_out=fwd_out, batch=batch)
        gradients = self.compute_gradients(loss_per_module)
        self.apply_gradients(self.postprocess_gradients(gradients))
        return fwd_out, loss_per_module, {}

    def _lean_plain_forward(self, batch: dict[str, Any]) -> bool:
        """Whether the modules in ``batch`` train with RLlib's own ``forward_train``."""
        from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

        multi = self.module
        if not default_multi_forward_train(multi):
            return False
        mods = rl_modules(multi)
        return all(type(mods[m]).forward_train is TorchRLModule.forward_train
                   for m in batch if m in mods)  # fmt: skip

    def _lean_forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``MultiRLModule.forward_train``: RLlib's call (with its recursive ``train()`` walk
        over every submodule) on an update's first minibatch, then each module's
        ``RLModule.forward_train`` (the same forward, no walk: nothing between minibatches
        leaves training mode)."""
        from ray.rllib.core.rl_module.rl_module import RLModule

        multi = self.module
        if not self._lean_training:
            self._lean_training = True
            return multi.forward_train(batch)
        mods = rl_modules(multi)
        return {m: RLModule.forward_train(mods[m], batch[m]) for m in batch if m in mods}

    @override
    def _create_iterator_if_necessary(self, **kwargs: Any) -> Any:
        found = super()._create_iterator_if_necessary(**kwargs)
        return IndexMinibatches.replacing(found) or found

    @override
    def _compute_off_policyness(self, batch: Any) -> None:
        self._lean_offp.update(batch)  # logged once per update (window 1: the last value)

    @override
    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        self._lean_offp, self._lean_stash = {}, {}  # nothing left from a failed update
        self._lean_training = False  # modules put in training mode by the first minibatch
        super().before_gradient_based_update(timesteps=timesteps)

    @override
    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        self.flush_metrics()
        super().after_gradient_based_update(timesteps=timesteps)

    def flush_metrics(self) -> None:
        """Log the deferred metrics of the update's last minibatch per module."""
        if self._lean_offp:
            super()._compute_off_policyness(self._lean_offp)
            self._lean_offp = {}
        for module_id, stats in self._lean_stash.items():
            self.metrics.log_dict(stats(), key=module_id, window=1)
        self._lean_stash = {}


# ----- minibatches by index ------------------------------------------------------------------
class IndexMinibatches:
    """RLlib's ``MiniBatchCyclicIterator`` (per module: cycle through the batch, reshuffle with
    ``np.random.permutation`` at every wrap) over index arrays: each minibatch column is one
    gather of the original column, where RLlib slices ``SampleBatch``es, concatenates them and
    permutes every column at each shuffle (``index_select``: ``v[index]``'s copy with less
    indexing overhead). Same RNG draws, same rows in the same order."""

    def __init__(self, fields: MinibatchFields, columns: dict[str, Any]) -> None:
        self.batch = fields.batch
        self.size = fields.minibatch_size
        self.epochs = fields.num_epochs
        self.shuffle = fields.shuffle
        self.total = fields.num_total_minibatches
        self.columns = columns

    @classmethod
    def replacing(cls, found: Any) -> IndexMinibatches | None:
        """The index iterator for a fresh flat ``MiniBatchCyclicIterator``, else None (a
        recurrent module's ``[B, T]`` batch, a column that is not a tensor, another iterator)."""
        fields = fresh_cyclic_iterator(found)
        if fields is None:
            return None
        columns = {}
        for mid, module_batch in fields.batch.policy_batches.items():
            seqs = slices_sequences(module_batch) or module_batch.get("seq_lens") is not None
            cols = dict(module_batch)
            if seqs or not cols or not all(isinstance(v, torch.Tensor) for v in cols.values()):
                return None
            if len(module_batch) == 0:
                return None  # RLlib's iterator raises its own error
            columns[mid] = cols
        return cls(fields, columns)

    def __iter__(self) -> Any:
        import numpy as np
        from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

        counts = {mid: len(b) for mid, b in self.batch.policy_batches.items()}
        perms = {mid: np.arange(n) for mid, n in counts.items()}
        start = dict.fromkeys(counts, 0)
        covered = dict.fromkeys(counts, 0)
        made = 0
        while (self.total == 0 and min(covered.values()) < self.epochs) or (
            self.total > 0 and made < self.total
        ):
            minibatch = {}
            for mid, n in counts.items():
                s, want, parts = start[mid], self.size, []
                while s + want >= n:
                    parts.append(perms[mid][s:])
                    want -= n - s
                    s = 0
                    covered[mid] += 1
                    if self.shuffle:
                        perms[mid] = perms[mid][np.random.permutation(n)]
                if s + want > s:
                    parts.append(perms[mid][s : s + want])
                start[mid] = s + want
                rows = np.concatenate(parts)
                cols = self.columns[mid]
                index = torch.as_tensor(rows, device=next(iter(cols.values())).device)
                minibatch[mid] = SampleBatch({k: v.index_select(0, index) for k, v in cols.items()})
            made += 1
            yield MultiAgentBatch(minibatch, len(self.batch))


# ----- PPO -----------------------------------------------------------------------------------
class LeanPPOLearner(CreditPPOTorchLearner, LeanTorchLearner):
    """PPO (with credit normalisation when asked): RLlib's clipped surrogate, value and KL
    terms on :class:`Categoricals`, loss metrics deferred to the end of the update."""

    #: build PPO's learner batch with array ops (:mod:`trainers.learners.batch`; False: RLlib's
    #: connector pieces, the same batch).
    array_batch: bool = True

    @override
    def build(self) -> None:
        self._lean_lens: dict[tuple[str, str], Any] = {}
        super().build()
        if self.array_batch:
            from trainers.learners.batch import install

            self._learner_connector = install(self._learner_connector) or self._learner_connector

    def _lens(self, module_id: str, which: str, module: Any, logits: torch.Tensor) -> Any:
        key = (module_id, which)
        if key not in self._lean_lens:
            cls = (
                module.get_train_action_dist_cls()
                if which == "train"
                else module.get_exploration_action_dist_cls()
            )
            self._lean_lens[key] = categorical_lens(cls, logits)
        return self._lean_lens[key]

    @override
    def compute_loss_for_module(
        self, *, module_id: str, config: Any, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> Any:
        module = self.module[module_id].unwrapped()
        logits = fwd_out[Columns.ACTION_DIST_INPUTS]
        lens = self._lens(module_id, "train", module, logits)
        prev_lens = self._lens(module_id, "explore", module, batch[Columns.ACTION_DIST_INPUTS])
        if lens is None or prev_lens is None or lens != prev_lens:  # RLlib's own loss
            return super().compute_loss_for_module(
                module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
            )
        masked_mean = _masked_mean(batch.get(Columns.LOSS_MASK))
        curr = categoricals(logits, *lens)
        logp_ratio = torch.exp(curr.logp(batch[Columns.ACTIONS]) - batch[Columns.ACTION_LOGP])
        if config.use_kl_loss:
            prev = categoricals(batch[Columns.ACTION_DIST_INPUTS], *prev_lens)
            mean_kl_loss = masked_mean(prev.kl(curr))
        else:
            mean_kl_loss = torch.tensor(0.0, device=logp_ratio.device)
        curr_entropy = curr.entropy()
        adv = batch[Postprocessing.ADVANTAGES]
        surrogate = torch.min(
            adv * logp_ratio,
            adv * torch.clamp(logp_ratio, 1 - config.clip_param, 1 + config.clip_param),
        )
        targets = batch[Postprocessing.VALUE_TARGETS]
        if config.use_critic:
            values = module.compute_values(batch, embeddings=fwd_out.get(Columns.EMBEDDINGS))
            vf_loss = torch.pow(values - targets, 2.0)
            vf_loss_clipped = torch.clamp(vf_loss, 0, config.vf_clip_param)
            mean_vf_loss = masked_mean(vf_loss_clipped)
        else:
            values = vf_loss = vf_loss_clipped = mean_vf_loss = torch.tensor(
                0.0, device=surrogate.device
            )
        coeff = self.entropy_coeff_schedulers_per_module[module_id].get_current_value()
        total = masked_mean(
            -surrogate + config.vf_loss_coeff * vf_loss_clipped - (coeff * curr_entropy)
        )
        if config.use_kl_loss:
            total += self.curr_kl_coeffs_per_module[module_id] * mean_kl_loss
        critic = config.use_critic
        detached = [t.detach() for t in (surrogate, mean_vf_loss, vf_loss, values, curr_entropy)]
        kl = mean_kl_loss.detach()

        def stats() -> dict[str, Any]:
            sur, mvf, vf, val, ent = detached
            return {
                POLICY_LOSS_KEY: -masked_mean(sur),
                VF_LOSS_KEY: mvf,
                LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY: masked_mean(vf) if critic else vf,
                LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY: explained_variance(targets, val),
                ENTROPY_KEY: masked_mean(ent),
                LEARNER_RESULTS_KL_KEY: kl,
            }

        self._lean_stash[module_id] = stats
        return total


def _masked_mean(mask: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """PPO's ``possibly_masked_mean``: the mean over the loss mask's rows, or over all."""
    if mask is None:
        return torch.mean
    num_valid = torch.sum(mask)
    flat = mask.reshape(-1).nonzero().squeeze(-1)  # once, not once per term

    def mean(data: torch.Tensor) -> torch.Tensor:
        if data.shape != mask.shape:
            return torch.sum(data[mask]) / num_valid
        return torch.sum(data.reshape(-1).index_select(0, flat)) / num_valid  # data[mask]'s

    return mean
