"""The lean learner step for GRPO (``algorithm.learner: lean``, the default): the loss and its
metrics are :class:`~trainers.grpo.learner.GRPOLearner`'s, the optimiser step is
:class:`~trainers.learners.lean.LeanTorchLearner`'s.
"""

from __future__ import annotations

from trainers.grpo.learner import GRPOLearner
from trainers.learners.lean import LeanTorchLearner


class LeanGRPOLearner(GRPOLearner, LeanTorchLearner):
    """GRPO (LLM and small-network pools) with the lean optimiser step; the loss and its
    metrics are :class:`~trainers.grpo.learner.GRPOLearner`'s."""
