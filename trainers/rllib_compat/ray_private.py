"""Ray 2.60's private modules the project uses (package doc: :mod:`trainers.rllib_compat`):
the GCS probe of :mod:`trainers.cluster`, the driver's ``sys.path`` that Ray hands its
workers, and the Tune trial session of :mod:`trainers.sweep`. Each access degrades to
``None`` when the private API moved (the callers have a public fallback).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["GCS_PROBE", "driver_sys_path", "trial_working_directory"]

#: a script (``python -c GCS_PROBE host port``) that connects to a GCS at ``host:port`` and
#: exits 0, or prints the error's first line and exits 1. Ray 2.60:
#: ``ray._raylet.InnerGcsClient.standalone(address, cluster_id, timeout_ms)``
GCS_PROBE = """
import sys
from ray._raylet import InnerGcsClient
try:
    InnerGcsClient.standalone(sys.argv[1], None, int(sys.argv[2]))
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}".splitlines()[0])
    sys.exit(1)
"""


def driver_sys_path() -> list[str] | None:
    """The directories Ray adds to its workers' ``sys.path`` for this (connected) driver;
    None when unknown. Ray 2.60: ``ray._private.worker.global_worker.core_worker.
    get_job_config().py_driver_sys_path``."""
    import ray

    try:
        job = ray._private.worker.global_worker.core_worker.get_job_config()
        return list(job.py_driver_sys_path)
    except Exception:  # any failure means "unknown": the caller falls back
        return None


def trial_working_directory() -> Path | None:
    """The Tune trial's working directory on the node that runs it; None outside a trial or
    when the private API moved. Ray 2.60: ``ray.train._internal.session.get_session().
    storage.trial_working_directory``."""
    try:
        from ray.train._internal.session import get_session

        return Path(get_session().storage.trial_working_directory)
    except (ImportError, AttributeError):
        return None
