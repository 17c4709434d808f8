"""RLlib 2.60 learner, minibatch-iterator and RLModule internals (package doc:
:mod:`trainers.rllib_compat`).

The lean learner (:mod:`trainers.learners.lean`) overrides :data:`OVERRIDDEN` and uses
:data:`INHERITED` through ``self``; the credit/value-norm learners use the learner connector
and the ``_check_component`` checkpoint hook; modules override RLModule's ``_forward*`` hooks
(:data:`MODULE_HOOKS`, RLlib's documented way to write a module). Reads of other objects go
through the functions here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator

__all__ = [
    "INHERITED",
    "MODULE_HOOKS",
    "OVERRIDDEN",
    "MinibatchFields",
    "default_multi_forward_train",
    "fresh_cyclic_iterator",
    "module_hook",
    "rl_modules",
    "slices_sequences",
]

#: private learner methods our learners override (same signatures)
OVERRIDDEN: tuple[tuple[type, str], ...] = (
    (TorchLearner, "_set_optimizer_state"),  # loads optimiser state from a checkpoint
    (TorchLearner, "_uncompiled_update"),  # one minibatch: forward, loss, grads, step
    (Learner, "_create_iterator_if_necessary"),  # the minibatch iterator of an update
    (TorchLearner, "_compute_off_policyness"),  # logs the off-policyness metric
    (Learner, "_make_batch_if_necessary"),  # episodes → batch: time limits bootstrapped first
)
#: private members our learners, connectors and configs use through ``self`` (instance
#: attributes set by RLlib's ``build``/``__init__``, methods)
INHERITED: tuple[tuple[type, str], ...] = (
    (Learner, "_named_optimizers"),  # optimiser name → torch optimiser
    (Learner, "_module_optimizers"),  # module id → optimiser names
    (Learner, "_params"),  # param ref → parameter
    (Learner, "_module"),  # the MultiRLModule
    (Learner, "_learner_connector"),  # the learner connector pipeline (None: none)
    (TorchLearner, "_grad_scalers"),  # None unless mixed precision
    (TorchLearner, "_lr_scheduler_classes"),  # None unless torch LR schedulers
    (GeneralAdvantageEstimation, "_numpy_to_tensor_connector"),  # NumpyToTensor, None at first
    (Learner, "_check_component"),  # (name, components, not_components) -> bool
    (TorchLearner, "_compute_off_policyness"),  # called with the minibatch
    (AlgorithmConfig, "_value_error"),  # (errmsg): raise (or warn) as RLlib's validate does
    (
        Learner,
        "_make_batch_if_necessary",
    ),  # (training_data) -> batch, through the learner connector
)
#: RLModule's private forward hooks a module implements (RLlib's documented extension points:
#: ``forward_*`` call them)
MODULE_HOOKS: tuple[tuple[type, str], ...] = (
    (RLModule, "_forward"),
    (RLModule, "_forward_train"),
    (TorchRLModule, "_forward_exploration"),
    (TorchRLModule, "_forward_inference"),
)


def module_hook(module: Any, name: str) -> Any:
    """The private hook behind ``module.<name>`` (``name``: ``forward``,
    ``forward_exploration``, ``forward_inference``, ``forward_train``; on a module or a module
    class): what the public wrapper calls, without its per-call work. RLlib 2.60:
    ``RLModule._<name>``."""
    return getattr(module, f"_{name}")


def rl_modules(multi: MultiRLModule) -> dict[str, Any]:
    """A ``MultiRLModule``'s module id → RLModule dict (RLlib's own, not a copy). RLlib 2.60:
    ``MultiRLModule._rl_modules``."""
    return multi._rl_modules


def default_multi_forward_train(multi: MultiRLModule) -> bool:
    """Whether ``multi`` trains with ``MultiRLModule``'s own ``_forward_train`` (each module's
    ``forward_train`` on its batch)."""
    return type(multi)._forward_train is MultiRLModule._forward_train


@dataclasses.dataclass(frozen=True)
class MinibatchFields:
    """What a ``MiniBatchCyclicIterator`` iterates (its constructor arguments). RLlib 2.60:
    ``_batch``, ``_minibatch_size``, ``_num_epochs``, ``_shuffle_batch_per_epoch``,
    ``_num_total_minibatches``."""

    batch: Any  # the MultiAgentBatch
    minibatch_size: int
    num_epochs: int
    shuffle: bool
    num_total_minibatches: int


def fresh_cyclic_iterator(found: Any) -> MinibatchFields | None:
    """``found``'s fields when it is exactly RLlib's ``MiniBatchCyclicIterator`` and no
    minibatch of it was consumed, else None. RLlib 2.60: ``_minibatch_count`` counts the
    minibatches consumed (it grows when the one after is asked for)."""
    if type(found) is not MiniBatchCyclicIterator or found._minibatch_count:
        return None
    return MinibatchFields(
        batch=found._batch,
        minibatch_size=found._minibatch_size,
        num_epochs=found._num_epochs,
        shuffle=found._shuffle_batch_per_epoch,
        num_total_minibatches=found._num_total_minibatches,
    )


def slices_sequences(batch: Any) -> bool:
    """Whether a ``SampleBatch`` slices along ``seq_lens`` (a recurrent ``[B, T]`` batch).
    RLlib 2.60: ``SampleBatch._slice_seq_lens_in_B``."""
    return bool(batch._slice_seq_lens_in_B)
