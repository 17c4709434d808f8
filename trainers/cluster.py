"""Where Ray runs: a local Ray started here, or an existing cluster.

Contract of :func:`ensure_ray` (every command that starts Ray goes through it):

* The address is, in this order: the ``address`` argument, ``RAY_ADDRESS`` (the CLI's
  ``--address`` sets it), a cluster started with ``ray start`` on this machine (the address
  Ray records in ``<ray temp dir>/ray_current_cluster``, used only while its port answers),
  else none: a new local Ray with ``resources.num_cpus`` CPUs.
* Connecting never passes ``num_cpus``/``num_gpus`` (Ray refuses them for an existing
  cluster); a new local Ray is started with ``address="local"`` so a stale record of a dead
  cluster is not followed.
* An address whose port does not accept a connection within :data:`CONNECT_TIMEOUT_S`, or
  where no Ray GCS answers (:func:`gcs_error`: something else listens there, or the token is
  refused), raises :class:`ClusterError` naming it and the fix (``ray.init`` would retry for
  minutes); so does a failing ``ray.init`` (its connection attempts cut to the same bound).

:func:`trial_bundles` sizes one Tune trial's placement group as RLlib lays it out (driver,
env runners, learners) and :func:`concurrent_trials` how many such trials the cluster fits.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from trainers.configs.typed import ConfigError
from trainers.rllib_compat.ray_private import GCS_PROBE, driver_sys_path

#: seconds to wait for a cluster's GCS port to accept a TCP connection.
CONNECT_TIMEOUT_S = 5.0


AUTH_FIX = (
    "a cluster from `ray start` (Ray ≥ 2.60) checks a token: set RAY_AUTH_MODE=token and "
    "RAY_AUTH_TOKEN to `ray get-auth-token` of the head, or start every node with "
    "RAY_AUTH_MODE=disabled"
)


class ClusterError(ConfigError):
    """A cluster address that is malformed or does not answer; names the address and the fix."""


def check_address(address: str, source: str = "--address") -> str:
    """``address`` stripped, or :class:`ClusterError` when it is not ``auto``, ``local``,
    ``host:port`` or ``ray://host:port`` (``source`` names where it came from)."""
    text = address.strip()
    if text in ("auto", "local"):
        return text
    _host_port(text, source)
    return text


def _host_port(address: str, source: str) -> tuple[str, int]:
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    fix = "give host:port of the head node (e.g. 10.0.0.5:6379), ray://host:10001, or 'auto'"
    if not sep or not host or "/" in rest or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"{source}={address!r} is not a Ray address: {fix}")
    return host.strip("[]"), int(port)


def reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether ``host:port`` of ``address`` accepts a TCP connection within ``timeout_s``."""
    host, port = _host_port(address, "address")
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


#: addresses whose GCS answered in this process (asked once).
_ANSWERED: set[str] = set()


def gcs_error(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when a Ray GCS answers at ``address``, else why not (``Type: message``).

    Asked in a child process that is killed after ``3 × timeout_s``: a port that accepts
    connections but speaks no Ray (a proxy, another server) keeps Ray's client waiting ~40 s
    per attempt. The child inherits ``RAY_AUTH_MODE`` / ``RAY_AUTH_TOKEN``, so a token the
    cluster refuses is reported here too.
    """
    import subprocess
    import sys

    env = {**os.environ, "RAY_gcs_rpc_server_connect_timeout_s": str(int(timeout_s))}
    cmd = [sys.executable, "-c", GCS_PROBE, address, str(int(timeout_s * 1000))]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3 * timeout_s)
    except subprocess.TimeoutExpired:
        return f"no answer within {3 * timeout_s:.0f} s"
    if out.returncode == 0:
        return None
    return (out.stdout.strip().splitlines() or [f"exit code {out.returncode}"])[-1]


def recorded_cluster() -> str | None:
    """The address the last ``ray start --head`` on this machine recorded, if any: Ray 2.60
    writes it to ``$RAY_TMPDIR/ray/ray_current_cluster`` (else ``$TMPDIR/ray/…``, else
    ``/tmp/ray/…``; ``ray._common.utils.get_ray_address_file``), read here without importing
    Ray so that the CLI stays fast."""
    tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    try:
        with open(os.path.join(tmp, "ray", "ray_current_cluster")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def local_cluster() -> str | None:
    """The address of a ``ray start`` cluster on this machine whose GCS answers, else None."""
    recorded = recorded_cluster()
    if not recorded:
        return None
    try:
        return recorded if reachable(recorded, timeout_s=1.0) else None
    except ClusterError:
        return None


def joins_cluster() -> bool:
    """Whether :func:`ensure_ray` would join an existing cluster rather than start a local Ray
    (``RAY_ADDRESS`` other than ``local``, or a ``ray start`` cluster on this machine)."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        return env != "local"
    return local_cluster() is not None


def cluster_address(address: str | None = None) -> str | None:
    """The cluster to join (see the module docstring), or None for a new local Ray.

    Raises:
        ClusterError: a malformed address, one that does not answer, or ``auto`` with no
            ``ray start`` cluster on this machine.
    """
    source = "--address"
    if address is None and os.environ.get("RAY_ADDRESS", "").strip():
        address, source = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if address is None:
        return local_cluster()
    address = check_address(address, source)
    if address == "local":
        return None
    if address == "auto":
        found = local_cluster()
        if found is None:
            raise ClusterError(
                f"{source}='auto' but no `ray start` cluster answers on this machine: start "
                "one (ray start --head) or give its host:port"
            )
        return found
    if not reachable(address):
        raise ClusterError(
            f"{source}={address!r}: no Ray cluster answered within {CONNECT_TIMEOUT_S:.0f} s "
            "(is the head running and its port open?): check the address, or unset it to run "
            "on a local Ray"
        )
    reason = None if address.startswith("ray://") or address in _ANSWERED else gcs_error(address)
    if reason is not None and "Authentication" in reason:
        raise ClusterError(
            f"{source}={address!r}: the Ray head refused our token ({reason}); {AUTH_FIX}"
        )
    if reason is not None:
        raise ClusterError(
            f"{source}={address!r} accepts connections but no Ray head answered ({reason}): "
            f"give the head's GCS port (6379 unless `ray start --port` said otherwise); {AUTH_FIX}"
        )
    _ANSWERED.add(address)
    return address


def use_address(address: str | None) -> str | None:
    """The CLI's ``--address``: find the cluster now (a fast error before any work) and put it
    in ``RAY_ADDRESS``, so every check before Ray starts and every process started later
    (a re-executed CLI, Tune trials) sees the same cluster; ``local`` forces a new local Ray.

    Returns:
        The cluster joined, or None for a new local Ray.

    Raises:
        ClusterError: see :func:`cluster_address`.
    """
    target = cluster_address(address)
    if target is not None:
        os.environ["RAY_ADDRESS"] = target
    elif address is not None or os.environ.get("RAY_ADDRESS", "").strip():
        os.environ["RAY_ADDRESS"] = "local"
    return target


def ensure_ray(cfg: Any, address: str | None = None) -> bool:
    """Join a cluster or start a local Ray unless this process already runs one; True when
    this call started it (the caller then shuts it down).

    ``cfg`` is an :class:`~trainers.configs.experiment.ExperimentConfig` or a ``FinetuneJob`` (its
    ``resources.num_cpus`` sizes a new local Ray).

    Raises:
        ClusterError: see :func:`cluster_address`.
    """
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.ERROR,
        "log_to_driver": False,
    }
    target = cluster_address(address)
    if target is None:
        kwargs["address"] = "local"
        kwargs["num_cpus"] = cfg.resources.num_cpus or os.cpu_count() or 1

        share_sys_path()  # workers import what this process imports (scenario references)
        ray.init(**kwargs)
        return True
    # Ray turns on token auth (a token in ~/.ray/auth_token) only for a cluster it finds itself
    local = target == recorded_cluster() and address is None
    kwargs["address"] = "auto" if local else target
    wait = "RAY_gcs_server_port_wait_time_s"  # Ray's GCS connect attempts, ~1 s each (20)
    saved = os.environ.get(wait)
    os.environ.setdefault(wait, str(int(CONNECT_TIMEOUT_S)))
    try:
        ray.init(**kwargs)
    except Exception as exc:  # Ray's own error is a retry log and a chained traceback
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ClusterError(
            f"could not join the Ray cluster at {target!r} ({type(exc).__name__}: {first}): "
            f"check the address; {AUTH_FIX}"
        ) from None
    finally:
        if saved is None:
            os.environ.pop(wait, None)
    return True


# ----- Tune trials --------------------------------------------------------------------------
def trial_bundles(cfg: Any) -> list[dict[str, float]]:
    """The placement group of one trial training ``cfg``, in RLlib's layout: the driver (which
    also learns when ``num_learners`` is 0), one bundle per env runner, one per learner.

    RLlib places env runner ``i`` in bundle ``i + 1`` of the trial's group, so a group without
    those bundles fails with "placement group bundle index 1 is invalid".
    """
    res = cfg.resources
    gpus = float(res.num_gpus_per_learner)
    learner = {"CPU": 0.0 if gpus else 1.0, "GPU": gpus}
    driver = {"CPU": 1.0, "GPU": 0.0 if res.num_learners else gpus}
    runner = {"CPU": 1.0, "GPU": float(res.num_gpus_per_env_runner)}
    runners = [dict(runner) for _ in range(res.num_env_runners)]
    bundles = [driver, *runners, *([learner] * res.num_learners)]
    return [{k: v for k, v in b.items() if v} for b in bundles]


def total(bundles: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Resources of a placement group, summed over its bundles."""
    out: dict[str, float] = {}
    for bundle in bundles:
        for key, value in bundle.items():
            out[key] = out.get(key, 0.0) + value
    return out


def concurrent_trials(need: Mapping[str, float], have: Mapping[str, float]) -> int:
    """How many trials each needing ``need`` fit in a cluster with ``have`` resources.

    Raises:
        ClusterError: not even one fits (Tune would wait forever), naming what is missing.
    """
    fits = []
    for key, value in need.items():
        if value <= 0:
            continue
        available = float(have.get(key, 0.0))
        if available < value:
            raise ClusterError(
                f"a trial needs {value:g} {key} (driver + env runners + learners) but the Ray "
                f"cluster has {available:g}: lower resources.num_env_runners / num_learners / "
                "num_gpus_per_learner / num_gpus_per_env_runner, or add nodes"
            )
        fits.append(math.floor(available / value + 1e-9))
    return max(1, min(fits, default=1))


# ----- scenario references in Ray's worker processes ------------------------------------------
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
        found = driver_sys_path()  # a private API that may move: then what Ray 2.60 adds
        if found is not None:
            return found
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
