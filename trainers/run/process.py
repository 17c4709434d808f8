"""Process setup for a driver or worker that trains: one thread for torch and OpenMP, a fixed
hash seed where results depend on it, and quiet Ray logs.
"""

from __future__ import annotations

import logging
import os
import warnings

log = logging.getLogger(__name__)

_WARNED_HASH_SEED = False


def setup_process(hash_seed_matters: bool = True) -> None:
    """One thread for torch and OpenMP (on small CPU boxes extra threads only spin-wait); a
    warning when ``PYTHONHASHSEED`` is unset where it matters (RLlib's sampler: not the batched
    one, whose episodes order agents sorted)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    global _WARNED_HASH_SEED
    if hash_seed_matters and "PYTHONHASHSEED" not in os.environ and not _WARNED_HASH_SEED:
        _WARNED_HASH_SEED = True
        log.warning(
            "PYTHONHASHSEED is not set: runs with the same seed can differ across processes "
            "(RLlib's sampler orders agents through sets); the marl CLI sets it, and "
            "episodes.sampler: batched does not depend on it"
        )


def quiet_ray_logs() -> None:
    """Keep RLlib's start-up warnings out of the terminal."""
    for name in ("ray", "ray.rllib", "ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*new API stack.*")
    warnings.filterwarnings("ignore", message=".*Overriding environment.*")


# ----- the training loop --------------------------------------------------------------------
