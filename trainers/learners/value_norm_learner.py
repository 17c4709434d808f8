"""Value-target normalisation wired into PPO's learners (``algorithm.value_norm``, on by default).

Contract:

* :class:`ValueNormPPOLearner` (the base of :class:`~trainers.learners.credit_ppo.
  CreditPPOTorchLearner`, hence of the lean learner) holds one
  :class:`~trainers.learners.value_norm.
  ValueNorm` per module and, when ``learner_config_dict["value_norm"]`` is true, replaces RLlib's
  ``GeneralAdvantageEstimation`` in its learner pipeline with :class:`ValueNormGAE`. Off, the
  pipeline and every number are RLlib's.
* :class:`ValueNormGAE` computes what RLlib's piece computes — one value forward over each
  module's batch (its extra step per episode gives the bootstrap value of a cut episode), GAE
  value targets and standardised advantages — with the critic's outputs de-normalised first
  (:func:`advantages_and_targets`). Then, for modules that train, it folds the valid rows' value
  targets into the module's normaliser, and it writes the targets normalised: the critic learns
  ``(G − μ) / σ``. The value loss itself is unchanged (RLlib's and the lean learner's read
  ``Postprocessing.VALUE_TARGETS`` and ``compute_values``): with normalisation its
  ``vf_loss``/``vf_loss_unclipped`` are in units of σ², ``vf_clip_param`` clamps normalised
  squared errors, and ``vf_explained_var`` is the same as on de-normalised values (an affine map
  applied to both predictions and targets leaves it unchanged).
* Frozen modules (``should_module_be_updated`` false) get de-normalised values from a normaliser
  that never updates (the identity, or what a checkpoint restored): their weights and statistics
  stay as they are.
* The statistics are learner state: ``get_state()["value_norm"]`` (a component name, so
  ``components=``/``not_components=`` select it), restored by ``set_state`` and hence by
  ``Algorithm.from_checkpoint``.
* The array batch of the lean learner (:mod:`trainers.learners.batch`) calls
  :func:`advantages_and_targets` with the piece's normalisers: both pipelines give the same
  batch.
* Before its learner pipeline runs, agent episodes flagged both terminated and truncated (RLlib
  marks an all-truncated multi-agent episode terminated) are made truncations, so GAE
  bootstraps time limits from ``V(s_T)`` (:mod:`trainers.learners.time_limits`, issue #27).
* With several learners (``resources.num_learners > 1``) each one folds its own shard of the
  batch into its statistics; they are not averaged across learners.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.common.numpy_to_tensor import NumpyToTensor
from ray.rllib.connectors.learner import GeneralAdvantageEstimation
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.postprocessing.value_predictions import compute_value_targets
from ray.rllib.utils.postprocessing.zero_padding import (
    split_and_zero_pad_n_episodes,
    unpad_data_if_necessary,
)
from typing_extensions import override

from trainers.learners import critic_input
from trainers.learners.time_limits import BootstrapTimeLimits
from trainers.learners.value_norm import (
    BETA,
    VALUE_NORM_BETA_KEY,
    VALUE_NORM_KEY,
    ValueNorm,
)

__all__ = [
    "STATE_KEY",
    "ValueNormGAE",
    "ValueNormPPOLearner",
    "advantages_and_targets",
    "find_gae",
]

#: the learner-state key (and component name) of the normalisers' statistics
STATE_KEY = "value_norm"


def advantages_and_targets(
    values: np.ndarray,
    rewards: np.ndarray,
    terminateds: np.ndarray,
    truncateds: np.ndarray,
    *,
    gamma: float,
    lambda_: float,
    norm: ValueNorm | None = None,
    mask: np.ndarray | None = None,
    learn: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``(advantages, value targets)`` of one module's rows (episodes one after another, each
    extended by one step), as RLlib's GAE piece computes them, with value normalisation.

    Args:
        values: the critic's outputs (normalised when ``norm`` is given).
        rewards, terminateds, truncateds: the rows' columns.
        gamma, lambda_: GAE's discount and λ.
        norm: the module's normaliser; None: RLlib's computation exactly.
        mask: the loss mask (valid rows): which targets ``learn`` folds into ``norm``.
        learn: update ``norm`` with this batch's targets (before normalising them).

    Returns:
        Advantages standardised over the rows (as RLlib does) and the value targets: in return
        units without ``norm``, else normalised with the statistics after the update.
    """
    if norm is not None:
        values = norm.denormalize(values)
    targets = compute_value_targets(
        values=values,
        rewards=rewards,
        terminateds=terminateds,
        truncateds=truncateds,
        gamma=gamma,
        lambda_=lambda_,
    )
    advantages = targets - values
    advantages = (advantages - advantages.mean()) / max(1e-4, advantages.std())
    if norm is not None:
        if learn:
            norm.update(targets if mask is None else targets[np.asarray(mask, dtype=bool)])
        targets = norm.normalize(targets)
    return advantages, targets


class ValueNormGAE(GeneralAdvantageEstimation):
    """RLlib's GAE learner piece with value normalisation (see the module doc).

    Args:
        gamma, lambda_: GAE's discount and λ.
        norms: module id → normaliser; shared with the learner (it checkpoints them). A module
            without one gets a fresh normaliser on first use.
        learns: whether a module's normaliser updates (the learner's
            ``should_module_be_updated``); None: every module's.
        beta: the ``beta`` of the normalisers it makes (``algorithm.value_norm_beta``).
    """

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        gamma: float,
        lambda_: float,
        norms: dict[str, ValueNorm] | None = None,
        learns: Callable[[str], bool] | None = None,
        beta: float = BETA,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, gamma=gamma, lambda_=lambda_)
        self.norms: dict[str, ValueNorm] = {} if norms is None else norms
        self.learns = learns
        self.beta = beta

    def norm(self, module_id: str) -> ValueNorm:
        """The normaliser of ``module_id`` (made on first use)."""
        if module_id not in self.norms:
            self.norms[module_id] = ValueNorm(beta=self.beta)
        return self.norms[module_id]

    def updates(self, module_id: str) -> bool:
        """Whether this batch's targets update ``module_id``'s normaliser."""
        return self.learns is None or bool(self.learns(module_id))

    @override
    def __call__(
        self, *, rl_module: Any, episodes: list[Any], batch: dict[str, Any], **kwargs: Any
    ) -> Any:
        sa_episodes = list(
            self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False)
        )
        device = None
        results: dict[str, dict[str, np.ndarray]] = {}
        for module_id, wrapped in rl_module.items():
            module = wrapped.unwrapped()
            if module_id not in batch or not isinstance(module, ValueFunctionAPI):
                continue
            cols = batch[module_id]
            values = module.compute_values(cols)
            device = values.device
            lens = [len(e) for e in sa_episodes if e.module_id in (None, module_id)]

            def flat(data: Any, lens: list[int] = lens) -> np.ndarray:
                return unpad_data_if_necessary(lens, convert_to_numpy(data))

            mask = cols.get(Columns.LOSS_MASK)
            advantages, targets = advantages_and_targets(
                flat(values),
                flat(cols[Columns.REWARDS]),
                flat(cols[Columns.TERMINATEDS]),
                flat(cols[Columns.TRUNCATEDS]),
                gamma=self.gamma,
                lambda_=self.lambda_,
                norm=self.norm(module_id),
                mask=None if mask is None else flat(mask),
                learn=self.updates(module_id),
            )
            assert targets.shape[0] == sum(lens)
            if module.is_stateful():
                seq = module.model_config["max_seq_len"]
                advantages, targets = (
                    np.stack(split_and_zero_pad_n_episodes(x, episode_lens=lens, max_seq_len=seq))
                    for x in (advantages, targets)
                )
            results[module_id] = {
                Postprocessing.ADVANTAGES: advantages,
                Postprocessing.VALUE_TARGETS: targets,
            }
        if self._numpy_to_tensor_connector is None:
            self._numpy_to_tensor_connector = NumpyToTensor(
                as_learner_connector=True, device=device
            )
        tensors = self._numpy_to_tensor_connector(
            rl_module=rl_module, batch=results, episodes=episodes
        )
        for module_id, module_batch in tensors.items():
            batch[module_id].update(module_batch)
        return batch


def find_gae(pipeline: Any) -> Any:
    """The GAE piece of a learner pipeline (RLlib's or :class:`ValueNormGAE`), or None."""
    pieces = [] if pipeline is None else pipeline.connectors
    return next((p for p in pieces if isinstance(p, GeneralAdvantageEstimation)), None)


class ValueNormPPOLearner(BootstrapTimeLimits, PPOTorchLearner):
    """``PPOTorchLearner`` with value-target normalisation when the config asks for it
    (``learner_config_dict["value_norm"]``; ``algorithm.value_norm`` sets it) and the
    centralised critic's input column (``learner_config_dict["critic"]``;
    :mod:`trainers.learners.critic_input`). Off, it is a plain ``PPOTorchLearner``."""

    @override
    def build(self) -> None:
        self.value_norms: dict[str, ValueNorm] = {}
        super().build()
        pipeline = self._learner_connector
        gae = find_gae(pipeline)
        if gae is None:
            return
        settings = self.config.learner_config_dict
        if settings.get(VALUE_NORM_KEY) and type(gae) is GeneralAdvantageEstimation:
            piece = ValueNormGAE(
                gamma=gae.gamma,
                lambda_=gae.lambda_,
                norms=self.value_norms,
                learns=self.should_module_be_updated,
                beta=float(settings.get(VALUE_NORM_BETA_KEY, BETA)),
            )
            pipeline.insert_after(GeneralAdvantageEstimation, piece)
            pipeline.remove(GeneralAdvantageEstimation)
        # the centralised critic's input column, right before GAE (algorithm.critic)
        critic_input.install(pipeline, settings, type(find_gae(pipeline)))

    @override
    def get_state(
        self, components: Any = None, *, not_components: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)
        if self.value_norms and self._check_component(STATE_KEY, components, not_components):
            state[STATE_KEY] = {mid: n.get_state() for mid, n in self.value_norms.items()}
        return state

    @override
    def set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        for mid, saved in (state.pop(STATE_KEY, None) or {}).items():
            self.value_norms.setdefault(mid, ValueNorm()).set_state(saved)
        super().set_state(state)
