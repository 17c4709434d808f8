"""Run directories and checkpoints: names, fresh and resumed run directories, finding,
saving (atomically, as ``*.partial`` then renamed) and restoring checkpoints, the kept
latest/best checkpoints, the metrics history and ``summary.json``.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError
from trainers.run.metrics import ORACLE_FRACTION_KEY, RETURN_KEY
from trainers.run.outcome import TrainResult, os_reason

log = logging.getLogger(__name__)


# ----- run directories ----------------------------------------------------------------------
def run_name(cfg: ExperimentConfig, now: float | None = None) -> str:
    """``{scenario}__{algo}__{seed}__{time}`` (CleanRL style; a reference ``pkg.mod:attr``
    is written ``mod.attr``)."""
    from scenarios.registry import label

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{label(cfg.scenario)}__{cfg.algorithm.name}__{cfg.seed}__{stamp}"


def new_run_dir(cfg: ExperimentConfig) -> Path:
    """Create a fresh run directory under ``cfg.output.dir`` (suffix ``-2``… on a clash)."""
    return fresh_dir(cfg.output.dir, cfg.output.name or run_name(cfg))


def open_run_dir(cfg: ExperimentConfig, run_dir: str | Path | None = None) -> Path:
    """The run directory (``run_dir``, or a new one under ``output.dir``) with ``config.yaml``
    written in it (on resume: the budget may have grown).

    Raises:
        ConfigError: it cannot be created or written (a read-only or full file system, a file
            in the way), naming the directory and the fix.
    """
    where = f"run directory {run_dir}" if run_dir is not None else f"output.dir={cfg.output.dir!r}"
    parent = Path(cfg.output.dir).expanduser() if run_dir is None else Path(run_dir).expanduser()
    if parent.is_file():
        raise ConfigError(
            f"{where} is a file, not a directory: give a directory (--output / output.dir)"
        )
    try:
        run = Path(run_dir).expanduser().resolve() if run_dir is not None else new_run_dir(cfg)
        run.mkdir(parents=True, exist_ok=True)
        cfg.to_yaml(run / "config.yaml")
    except OSError as exc:
        raise ConfigError(
            f"{where}: cannot write a run there ({os_reason(exc)}): choose a writable directory "
            "(--output / output.dir) or free space"
        ) from None
    return run


def fresh_dir(parent: str | Path, name: str) -> Path:
    """Create ``parent/name`` (``name-2``, ``name-3``… on a clash) as an absolute path, which
    RLlib's checkpointing needs."""
    base = Path(parent).expanduser().resolve()
    path, k = base / name, 2
    while path.exists():
        path, k = base / f"{name}-{k}", k + 1
    path.mkdir(parents=True)
    return path


def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """``(checkpoint dir, run dir)`` for a run directory (its newest checkpoint: ``checkpoint``
    or a periodic ``checkpoints/iter_NNNNNN``, by the iteration each holds) or any checkpoint
    inside one.

    Raises:
        ConfigError: no checkpoint there.
    """
    p = Path(path).expanduser().resolve()
    if (p / "algorithm_state.pkl").exists():
        run = p.parent.parent if p.parent.name == "checkpoints" else p.parent
        return p, run
    candidates = [p / "checkpoint", p / f"checkpoint{OLD}", *sorted(p.glob("checkpoints/iter_*"))]
    found = [c for c in candidates if _complete(c)]
    if found:
        return max(found, key=_checkpoint_rank), p
    raise ConfigError(f"no algorithm checkpoint at {p}: pass a run directory or a checkpoint")


def _complete(ckpt: Path) -> bool:
    return (ckpt / "algorithm_state.pkl").exists() and not ckpt.name.endswith(PARTIAL)


def _checkpoint_rank(ckpt: Path) -> tuple[float, bool]:
    """Newest first by recorded iteration; a final ``checkpoint`` of an older version (no
    record) counts as the newest, as it was always written last."""
    from trainers.run.resume import checkpoint_iteration

    final = ckpt.name == "checkpoint"
    it = checkpoint_iteration(ckpt)
    if it is not None:
        return float(it), final
    digits = ckpt.name.removeprefix("iter_")
    return (math.inf if final else float(digits) if digits.isdigit() else -1.0), final


#: suffixes of a checkpoint being written (never resumed from) and of the one it replaces
PARTIAL, OLD = ".partial", ".old"


def save_checkpoint(algo: Any, path: Path) -> Path:
    """Save ``algo`` (RLlib's checkpoint plus :mod:`trainers.run.resume`'s sampling state) to
    ``path`` atomically: written beside it, then renamed over it, so a crash leaves either the
    old checkpoint or the new one, never a half-written one."""
    from trainers.run import resume

    tmp, old = path.with_name(path.name + PARTIAL), path.with_name(path.name + OLD)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        algo.save_to_path(str(tmp))
        resume.save(algo, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # frees the space a full disk needs for summary
        raise
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def restore_algorithm(ckpt: Path) -> Any:
    """``Algorithm.from_checkpoint`` plus the sampling state (exact continuation)."""
    from ray.rllib.algorithms.algorithm import Algorithm

    from trainers.run import resume

    algo = Algorithm.from_checkpoint(str(ckpt))
    resume.restore(algo, ckpt)
    return algo


def load_history(path: Path) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl`` (missing file: empty)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rewrite_history(path: Path, history: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(h) + "\n" for h in history))


#: iterations whose mean team return scores a checkpoint (best and final alike)
SMOOTHING = 3


class Checkpoints:
    """Periodic checkpoints: keeps the latest and the best (by smoothed team return)."""

    def __init__(self, run: Path) -> None:
        self.run = run
        self.best_path: Path | None = None
        self.best_value: float | None = None
        self.latest: Path | None = None

    @staticmethod
    def smoothed(history: list[dict[str, Any]], k: int | None = None) -> float | None:
        """The mean team return of the last ``k`` iterations (:data:`SMOOTHING`)."""
        k = SMOOTHING if k is None else k
        values = [h[RETURN_KEY] for h in history[-k:] if RETURN_KEY in h]
        return sum(values) / len(values) if values else None

    def restore(self, history: list[dict[str, Any]]) -> None:
        summary = self.run / "summary.json"
        if summary.exists():
            data = json.loads(summary.read_text())
            best = data.get("best_checkpoint")
            # only a checkpoint of this run: a copied run directory's summary names the
            # original's, which this run must never delete
            if best and Path(best).exists() and self.run in Path(best).parents:
                self.best_path, self.best_value = Path(best), data.get("best_return")

    def save(self, algo: Any, iteration: int, history: list[dict[str, Any]]) -> Path:
        path = self.run / "checkpoints" / f"iter_{iteration:06d}"
        path.parent.mkdir(exist_ok=True)
        save_checkpoint(algo, path)
        value = self.smoothed(history)
        previous = self.latest
        self.latest = path
        if value is not None and (self.best_value is None or value > self.best_value):
            old_best = self.best_path
            self.best_path, self.best_value = path, value
            if old_best is not None and old_best != previous:
                shutil.rmtree(old_best, ignore_errors=True)
        if previous is not None and previous != self.best_path:
            shutil.rmtree(previous, ignore_errors=True)
        return path

    def final(self, algo: Any, history: list[dict[str, Any]]) -> Path:
        """The final checkpoint; it is also the best unless a periodic one scored higher, by
        the same measure (:meth:`smoothed`), so ``best_return`` and ``final_return`` of
        ``summary.json`` are equal whenever both name this checkpoint."""
        path = save_checkpoint(algo, self.run / "checkpoint")
        value = self.smoothed(history)
        if self.best_path is None or (
            value is not None and (self.best_value is None or value >= self.best_value)
        ):
            self.best_path, self.best_value = path, value
        return path


def write_summary(run: Path, result: TrainResult) -> None:
    final = result.final
    data = {
        "status": result.status,
        "iterations": result.iterations,
        "env_steps": result.env_steps,
        "time_s": final.get("charts/time_s"),
        "team_return": final.get(RETURN_KEY),
        "oracle_fraction": final.get(ORACLE_FRACTION_KEY),
        "final_checkpoint": str(result.final_checkpoint) if result.final_checkpoint else None,
        "best_checkpoint": str(result.best_checkpoint) if result.best_checkpoint else None,
        # both checkpoints' returns by the same measure: the mean team return of the last
        # SMOOTHING iterations up to each (team_return above is the last iteration's alone)
        "best_return": result.best_return,
        "final_return": Checkpoints.smoothed(result.history) if result.final_checkpoint else None,
        "return_smoothing": SMOOTHING,
        "curve": str(result.curve) if result.curve else None,
        "errors": result.errors,
        "models": {pool: str(path) for pool, path in result.models.items()},
        "alarms": result.alarms,
    }
    if result.discovered_agents:
        data["discovered_agents"] = result.discovered_agents
    (run / "summary.json").write_text(json.dumps(data, indent=2) + "\n")
