"""RLlib 2.60 distribution internals (package doc: :mod:`trainers.rllib_compat`): the torch
objects inside RLlib's ``TorchCategorical``, ``TorchDiagGaussian`` and ``TorchMultiCategorical``,
which the batched sampler draws from and the lean learner's categorical math recognises.
"""

from __future__ import annotations

from typing import Any

__all__ = ["categorical_parts", "torch_dist"]


def categorical_parts(dist: Any) -> list[Any]:
    """A ``TorchMultiCategorical``'s parts (``TorchCategorical``\\ s, in action order). RLlib
    2.60: ``TorchMultiCategorical._cats``."""
    return dist._cats


def torch_dist(dist: Any) -> Any:
    """The ``torch.distributions`` object an RLlib torch distribution wraps (``Categorical``
    for ``TorchCategorical``, ``Normal`` for ``TorchDiagGaussian``). RLlib 2.60:
    ``TorchDistribution._dist``."""
    return dist._dist
