"""Scenario references in Ray's worker processes: share this process's ``sys.path`` with a
local Ray it starts, and check that an already running Ray's workers can import a reference.

Every env runner, credit worker and Tune trial rebuilds a scenario by importing its reference
(``package.module:attr``), so a module found only here must be found there too.
"""

from __future__ import annotations

import os
import sys

from trainers.cluster import joins_cluster
from trainers.config import ConfigError


def check_workers_import(ref: str) -> None:
    """Check that Ray's worker processes can import the scenario reference ``ref``.

    Workers rebuild the scenario by importing ``ref``. When this process will start Ray itself
    (no Ray running, no ``RAY_ADDRESS``), :func:`share_sys_path` gives the workers this
    process's ``sys.path``, so whatever imports here imports there. Otherwise the workers have
    what the running Ray gave them — installed packages, ``PYTHONPATH``, and the driver's script
    directory and working directory (Ray 2.60 adds those two) — and a fresh process with that
    path must find the module where this process found it. Inside a Ray worker (a Tune trial)
    there is nothing to check: this process is one of them.

    Raises:
        ConfigError: the module would not be found by the workers (or a different copy would),
            naming the directory and the fix.
    """
    from scenarios.registry import unreachable_reason

    ray = sys.modules.get("ray")
    running = ray is not None and ray.is_initialized()
    if running and ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
        return
    if not running and not joins_cluster():
        return
    reason = unreachable_reason(ref, _ray_driver_paths(running))
    if reason is not None:
        raise ConfigError(f"scenario={ref!r}: {reason}")


def _ray_driver_paths(running: bool) -> list[str]:
    """The directories Ray adds to its workers' ``sys.path`` for this driver."""
    if running:
        import ray

        try:  # a private API that may move: then fall back to what Ray 2.60 adds
            job = ray._private.worker.global_worker.core_worker.get_job_config()
            return list(job.py_driver_sys_path)
        except Exception:  # any failure means "unknown": use the fallback below
            running = False
    paths = [os.getcwd()]
    script = os.path.dirname(os.path.realpath(sys.argv[0])) if sys.argv and sys.argv[0] else ""
    if script and script in sys.path:
        paths.append(script)
    return paths


def share_sys_path() -> None:
    """Give the processes of a local Ray started next this process's ``sys.path``.

    Prepends the directories of ``sys.path`` (the working directory for ``""``) to
    ``PYTHONPATH``, which the Ray processes started by ``ray.init()`` inherit, so env runners,
    credit workers and Tune trials import a user's modules (scenario references) exactly as the
    driver does — also ones found only through ``sys.path`` entries added at run time.
    """
    paths = [p or os.getcwd() for p in sys.path]
    old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, *old]))
