"""Token-level GRPO through RLlib's Learner API (new API stack), for LLM policies (and, one
"token" per step, for small-network policies).

The pieces, each an RLlib seam:

* :class:`GRPOLearner` (a ``TorchLearner``): ``compute_loss_for_module`` calls
  :func:`trainers.grpo.loss.grpo_loss` with every knob of
  :class:`~trainers.configs.grpo.GRPOLoss` on the
  module's teacher-forced token logprobs (``CausalLMModule.forward_train``) against those
  recorded at sampling. Both are under the distribution that drew the tokens: the sampler
  stores ``log softmax(logits / T)`` and the row's temperature ``T``
  (``SAMPLING_TEMPERATURE``), and the training forward divides its logits by that ``T``;
  a constrained reply's tokens are scored under the grammar masks they were drawn under
  (``TOKEN_MASK``, :mod:`marl_agents.llm.constraints`).
  Trained modules must sample with ``temperature > 0`` and ``top_p = 1``
  (``CausalLMModule.check_trainable``, checked when the learner is built). Only the module's
  own sampled tokens carry gradient: the observation (prompt, other agents' messages, tool
  outputs) is never scored, and padding is masked. It logs ``logprob_gap`` (largest
  ``|new − old|`` token logprob) and ``sampler_kl`` (k3 estimate of ``KL(sampler ‖ learner)``
  on the sampled tokens) per minibatch, their ``_fresh`` values on the first minibatch of an
  update (weights still equal to the samplers': the agreement check, ≈ 0 unless sampler and
  learner score different distributions), ``sampling_temperature`` (mean ``T`` of the rows),
  a frozen KL reference (scored at the same ``T``) when ``kl_coef > 0``, and the length
  dual's ``λ``. A module that is not a ``CausalLMModule`` (MLP, GRU, ...) gets the same
  clipped surrogate on its actions' logprobs (``_action_loss``; no value function, no KL).

The env side is :mod:`trainers.sampling.grouped_env`, the connector pieces
:mod:`trainers.grpo.connectors`, the algorithm :mod:`trainers.grpo.algorithm`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from ray.rllib.algorithms.ppo.ppo import LEARNER_RESULTS_KL_KEY
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import ENTROPY_KEY
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from typing_extensions import override

import marl_agents.llm.subagents  # noqa: F401  (registers the hf and vllm subagent backends)
import scenarios.text_delegate  # noqa: F401  (registers text-delegate in env-runner processes)
from marl_agents.llm.rl_module import TOKEN_ENTROPY, TOKEN_LOGP, CausalLMModule
from trainers.configs.grpo import GRPOLoss
from trainers.grpo.connectors import (
    ADVANTAGES,
    CONFIG_KEY,
    GRPO_KEEP,
    LEARNER_OLD_LOGP,
    GRPOAdvantages,
    LearnerOldLogprobs,
)
from trainers.grpo.loss import LengthDual, grpo_loss, kl_k3, sampler_kl
from trainers.signals.monitors import KL_TO_START


# ----- the learner ---------------------------------------------------------------------------
class GRPOLearner(TorchLearner):
    """Token-level GRPO for :class:`~marl_agents.llm.rl_module.CausalLMModule` modules, and
    step-level GRPO for other RLlib torch modules.

    Reads its knobs from ``config.learner_config_dict["grpo"]`` (the fields of
    :class:`~trainers.configs.grpo.GRPOLoss`). See the module doc for what each part does.
    """

    @override
    def build(self) -> None:
        super().build()
        fields = dict(self.config.learner_config_dict.get(CONFIG_KEY, {}))
        self.grpo = GRPOLoss(**fields)
        self.duals: dict[str, LengthDual] = {}
        self._refs: dict[str, Any] = {}
        self._fresh = False
        for mid in self.module.keys():  # noqa: SIM118 (MultiRLModule iterates by index)
            module = self.module[mid].unwrapped()
            if self.should_module_be_updated(mid) and isinstance(module, CausalLMModule):
                module.check_trainable(f"module {mid!r}")
        if self._learner_connector is not None:
            self._learner_connector.append(
                GRPOAdvantages(
                    grpo=self.grpo,
                    duals=self.duals,
                    trainable=lambda mid: self.should_module_be_updated(mid),
                )
            )
            self._learner_connector.append(LearnerOldLogprobs(active=self.tis_active))
        # a frozen copy of the starting weights: the KL penalty's reference, and the reference
        # of the kl_to_start metric (trainers.signals.monitors), also when kl_coef is 0
        if self.grpo.kl_coef or self.config.learner_config_dict.get(KL_TO_START, False):
            for mid in self.module.keys():  # noqa: SIM118 (MultiRLModule iterates by index)
                llm = isinstance(self.module[mid].unwrapped(), CausalLMModule)
                if self.should_module_be_updated(mid) and (llm or self.grpo.kl_coef):
                    if not llm:  # kl_to_start alone is only measured for LLM modules
                        raise ValueError(
                            f"GRPO kl_coef > 0 needs LLM modules (a reference model); module "
                            f"{mid!r} is {type(self.module[mid].unwrapped()).__name__}"
                        )
                    ref = copy.deepcopy(self.module[mid].unwrapped().model)
                    for p in ref.parameters():
                        p.requires_grad_(False)
                    self._refs[mid] = ref.eval()

    def tis_active(self, module_id: str) -> bool:
        """Whether ``module_id`` is trained with the TIS correction (``grpo.tis``)."""
        if not self.should_module_be_updated(module_id):
            return False
        module = self.module[module_id].unwrapped()
        sampler = getattr(module, "sampler", "transformers")
        return isinstance(module, CausalLMModule) and self.grpo.tis.active(sampler)

    @override
    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().before_gradient_based_update(timesteps=timesteps)
        self._fresh = True  # weights equal the samplers' until the first optimizer step

    @override
    def apply_gradients(self, gradients_dict: Any) -> None:
        super().apply_gradients(gradients_dict)
        self._fresh = False

    @override
    def compute_loss_for_module(
        self, *, module_id: str, config: Any, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        module = self.module[module_id].unwrapped()
        if not isinstance(module, CausalLMModule):
            return self._action_loss(module_id, module, batch, fwd_out)
        lp = fwd_out[TOKEN_LOGP]
        entropy = fwd_out.get(TOKEN_ENTROPY)
        old = batch[TOKEN_LOGP].float()  # the sampler's (behaviour) logprobs
        actions = batch[Columns.ACTIONS]
        mask = actions != module.pad_id  # the module's own sampled tokens only
        if GRPO_KEEP in batch:
            mask = mask & batch[GRPO_KEEP].bool()[:, None]
        adv = batch[ADVANTAGES].float()
        temps = module.batch_temperature(batch)  # the rows' sampling temperatures
        ref = None
        if self.grpo.kl_coef or (self._fresh and module_id in self._refs):
            with torch.no_grad():
                ref, _ = module.score(
                    batch[Columns.OBS],
                    actions,
                    model=self._refs[module_id],
                    temperature=temps,
                    token_mask=module.batch_token_mask(batch),
                )
        drift = kl_to_start(lp, ref, actions != module.pad_id) if self._fresh else None
        if not self.grpo.kl_coef:
            ref = None  # only measured: no penalty
        learner_old = batch.get(LEARNER_OLD_LOGP)
        if learner_old is not None:  # TIS: ratio against the learner, weights against the sampler
            loss, stats = grpo_loss(
                lp,
                learner_old.float(),
                adv,
                mask,
                self.grpo,
                ref_logprobs=ref,
                entropy=entropy,
                sampler_logprobs=old,
            )
        else:
            loss, stats = grpo_loss(
                lp, old, adv, mask, self.grpo, ref_logprobs=ref, entropy=entropy
            )
        with torch.no_grad():
            own = actions != module.pad_id
            gap = float(((lp - old).abs() * own).max()) if own.any() else 0.0
            stats["logprob_gap"] = gap
            stats["sampler_kl"] = sampler_kl(old, lp.detach(), own)
            if learner_old is None and self._fresh and own.any():
                # no recompute: at the sampler's weights the learner's logprobs are lp_old
                stats["mismatch_abs_logprob"] = float((lp - old).abs()[own].mean())
            stats["sampling_temperature"] = float(temps.mean()) if len(temps) else 0.0
            if entropy is not None and own.any():
                stats["entropy"] = float((entropy * own).sum() / own.sum())
            stats["advantage_abs_mean"] = float(adv.abs().mean()) if len(adv) else 0.0
        self.metrics.log_dict({f"grpo/{k}": v for k, v in stats.items()}, key=module_id, window=1)
        # also under RLlib's standard names, which train()'s metrics (losses/<pool>/…) report
        standard = {LEARNER_RESULTS_KL_KEY: stats["kl"]}
        if "entropy" in stats:
            standard[ENTROPY_KEY] = stats["entropy"]
        self.metrics.log_dict(standard, key=module_id, window=1)
        if drift is not None:
            self.metrics.log_value((module_id, "grpo/kl_to_start"), drift, window=1)
        if self._fresh:
            self.metrics.log_value((module_id, "grpo/logprob_gap_fresh"), gap, window=1)
            self.metrics.log_value(
                (module_id, "grpo/sampler_kl_fresh"), stats["sampler_kl"], window=1
            )
        return loss

    def _action_loss(
        self, module_id: str, module: Any, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        """GRPO for a plain RLlib torch module (MLP, GRU, ...): the clipped surrogate of
        :func:`~trainers.grpo.loss.grpo_loss` on each step's action logprob (one "token" per step)
        with the group advantages; no value function. Recurrent batches are ``[B, T]`` with
        RLlib's loss mask; flat batches become ``[N, 1]``."""
        dist = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        lp = dist.logp(batch[Columns.ACTIONS])
        old = batch[Columns.ACTION_LOGP].float()
        adv = batch[ADVANTAGES].float()
        real = batch[Columns.LOSS_MASK].bool() if Columns.LOSS_MASK in batch else None
        if real is None:
            real = torch.ones_like(adv, dtype=torch.bool)
        mask = real & batch[GRPO_KEEP].bool() if GRPO_KEEP in batch else real
        entropy = dist.entropy() if self.grpo.spurious_mask else None
        if lp.dim() == 1:  # one row per step: a sequence of one "token"
            lp, old, adv, mask = lp[:, None], old[:, None], adv[:, None], mask[:, None]
            entropy = entropy[:, None] if entropy is not None else None
        loss, stats = grpo_loss(lp, old, adv, mask, self.grpo, entropy=entropy)
        with torch.no_grad():  # entropy over every real step, kept or not
            ent = dist.entropy().reshape(real.shape)
            stats["entropy"] = float(ent[real].mean()) if real.any() else 0.0
            stats["advantage_abs_mean"] = float(adv[mask].abs().mean()) if mask.any() else 0.0
        self.metrics.log_dict({f"grpo/{k}": v for k, v in stats.items()}, key=module_id, window=1)
        self.metrics.log_dict(
            {LEARNER_RESULTS_KL_KEY: stats["kl"], ENTROPY_KEY: stats["entropy"]},
            key=module_id,
            window=1,
        )
        return loss

    @override
    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        if self.duals:
            state["grpo_duals"] = {mid: d.state_dict() for mid, d in self.duals.items()}
        return state

    @override
    def set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        for mid, d in (state.pop("grpo_duals", None) or {}).items():
            self.duals.setdefault(mid, LengthDual(1.0)).load_state_dict(d)
        super().set_state(state)


def kl_to_start(logp: torch.Tensor, ref: torch.Tensor | None, mask: torch.Tensor) -> float | None:
    """KL(π ‖ π_start) per sampled token (:func:`~trainers.grpo.loss.kl_k3`, unbiased when the
    tokens are drawn from π: the first minibatch of an update, before any optimizer step);
    None without a reference or tokens."""
    if ref is None or not mask.any():
        return None
    return float(kl_k3(logp.detach().double(), ref.double())[mask].mean())
