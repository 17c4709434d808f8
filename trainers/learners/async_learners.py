"""APPO's and IMPALA's torch learners with time limits treated as truncations.

V-trace gates its bootstrap with ``terminateds`` (``discount = γ·(1 − terminated)``), so the
all-truncated episodes RLlib flags terminated (:mod:`trainers.learners.time_limits`) lost
``V(s_T)`` there too; these learners clear the flag before the learner connector, as every
PPO learner does. (With ``num_aggregator_actors_per_learner > 0`` RLlib would run the learner
connector in aggregator actors instead; the trainer never sets it.)
"""

from __future__ import annotations

from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
from ray.rllib.algorithms.impala.torch.impala_torch_learner import IMPALATorchLearner

from trainers.learners.time_limits import BootstrapTimeLimits

__all__ = ["APPOLearner", "IMPALALearner"]


class APPOLearner(BootstrapTimeLimits, APPOTorchLearner):
    """RLlib's APPO torch learner; time limits bootstrap from ``V(s_T)``."""


class IMPALALearner(BootstrapTimeLimits, IMPALATorchLearner):
    """RLlib's IMPALA torch learner; time limits bootstrap from ``V(s_T)``."""
