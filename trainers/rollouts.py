"""Rollout dumps (``output.rollouts``) and exact replay of learner updates from them.

Contract:

* :func:`record` wraps ``algo.learner_group.update``: before every call it writes what the call
  gets — the episodes (``get_state()``, taken before the learner connectors touch them), the
  keyword arguments (``timesteps``, ``num_epochs``, ``minibatch_size``, ``shuffle…``) and the
  driver's RNG states (minibatch shuffling draws from them) — to
  ``<run>/rollouts/iter_NNNNNN.npz`` (``np.savez_compressed``; ``NNNNNN`` is the iteration the
  update belongs to; several updates of one iteration are kept in order in the same file).
  Beside the ``episodes`` blob each file holds per-module arrays for inspection:
  ``<module>/obs``, ``/actions``, ``/action_logp``, ``/rewards``, ``/episode`` (index into
  ``episode_ids``); observations that are not fixed-shape numbers (text) are only in the blob.
* :func:`replay_updates` restores a checkpoint of the run and calls ``learner_group.update``
  again with each dumped call of the iterations after it, without sampling: the learner's
  weights come out bit-identical to the run's (exact where the learner runs in the driver,
  ``resources.num_learners: 0``; remote learners' RNGs are not captured).
* A missing, truncated or foreign dump file is a :class:`RolloutDumpError` naming the file.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trainers.run.rollout_dump import DUMP_DIR, FORMAT, RolloutDumpError, _from_state, dump_path

log = logging.getLogger(__name__)


def load_calls(path: Path) -> list[dict[str, Any]]:
    """The ``learner_group.update`` calls dumped in ``path``.

    Raises:
        RolloutDumpError: the file is missing, truncated or not a rollout dump.
    """
    from ray import cloudpickle

    if not path.is_file():
        raise RolloutDumpError(
            f"rollout dump {path} is missing: train with output.rollouts: true and replay only "
            f"iterations that were dumped"
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            blob = data["episodes"].tobytes()
        state = cloudpickle.loads(blob)
        calls = [cloudpickle.loads(c) for c in state["calls"]]
        if state.get("format") != FORMAT:
            raise ValueError(f"format {state.get('format')!r}, expected {FORMAT}")
    except Exception as exc:  # np.load and unpickling garbage raise anything
        raise RolloutDumpError(
            f"rollout dump {path} is corrupt ({type(exc).__name__}: {exc}): dump it again by "
            f"re-running the training iteration"
        ) from None
    return calls


def _checkpoint_iteration(ckpt: Path) -> int:
    from trainers.run.resume import checkpoint_iteration

    it = checkpoint_iteration(ckpt)
    if it is None:
        raise RolloutDumpError(
            f"checkpoint {ckpt} is missing or records no iteration (marl_state.json): pass a "
            f"checkpoint directory of the run (checkpoints/iter_NNNNNN)"
        )
    return int(it)


def replay_updates(
    run_dir: str | Path, checkpoint: str | Path | None = None, iterations: int | None = None
) -> Any:
    """Restore ``checkpoint`` of the run in ``run_dir`` and redo the learner updates of the
    ``iterations`` iterations after it from their dumps, without sampling.

    Args:
        run_dir: a run trained with ``output.rollouts: true``.
        checkpoint: a checkpoint of that run (default: its oldest periodic one).
        iterations: how many iterations to replay (default: every dump after the checkpoint).

    Returns:
        The restored ``Algorithm`` after the replayed updates (its learner holds the weights;
        call ``.stop()`` when done). Ray is started if it is not running (and left running).

    Raises:
        RolloutDumpError: a dump is missing or corrupt, or nothing to replay.
    """
    run, ckpt, start, iterations = resolve(run_dir, checkpoint, iterations)
    rollouts = run / DUMP_DIR
    plan = [load_calls(dump_path(rollouts, start + k)) for k in range(1, iterations + 1)]
    algo = _restore(run, ckpt)
    from trainers.run.resume import set_rng_state

    for calls in plan:
        for call in calls:
            episodes = [_from_state(*s) for s in call["episodes"]]
            set_rng_state(call["rng"])
            algo.learner_group.update(episodes=episodes, **call["kwargs"])
    return algo


def resolve(
    run_dir: str | Path, checkpoint: str | Path | None, iterations: int | None
) -> tuple[Path, Path, int, int]:
    """``(run dir, checkpoint, its iteration, iterations to replay)`` of a replay (defaults as
    :func:`replay_updates` says)."""
    run = Path(run_dir).expanduser()
    if iterations is not None and iterations < 1:
        raise RolloutDumpError(f"iterations={iterations}: replay at least 1 iteration")
    if not (run / "config.yaml").is_file():
        raise RolloutDumpError(f"{run} is not a run directory (no config.yaml): pass a run's")
    ckpt = Path(checkpoint).expanduser() if checkpoint else _oldest_checkpoint(run)
    start = _checkpoint_iteration(ckpt)
    rollouts = run / DUMP_DIR
    if iterations is None:
        later = sorted(int(p.stem[5:]) for p in rollouts.glob("iter_*.npz"))
        iterations = sum(1 for i in later if i > start)
    if iterations < 1:
        raise RolloutDumpError(f"no rollout dumps after iteration {start} under {rollouts}")
    return run, ckpt, start, iterations


def _oldest_checkpoint(run: Path) -> Path:
    found = sorted(run.glob("checkpoints/iter_[0-9]*[0-9]"))
    if not found:
        raise RolloutDumpError(f"no checkpoint under {run}/checkpoints: pass checkpoint=")
    return found[0]


def _restore(run: Path, ckpt: Path) -> Any:
    """The algorithm of ``ckpt``, built as ``train()`` builds it (same process set-up)."""
    from trainers.algo import to_algorithm_config
    from trainers.cluster import ensure_ray
    from trainers.configs.experiment import ExperimentConfig
    from trainers.plan import resolve
    from trainers.run.process import quiet_ray_logs, setup_process
    from trainers.run.rundir import restore_algorithm

    plan = resolve(ExperimentConfig.from_yaml(run / "config.yaml"), text_defaults=True)
    cfg = plan.cfg
    quiet_ray_logs()
    to_algorithm_config(cfg, plan)  # registers the run's env as train() does
    setup_process()
    ensure_ray(cfg)
    return restore_algorithm(ckpt)


def learner_weights(algo: Any) -> dict[str, dict[str, np.ndarray]]:
    """Module → parameter name → the learner's weights (NumPy copies)."""
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    state = algo.learner_group.get_state(components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}")
    modules = state[COMPONENT_LEARNER][COMPONENT_RL_MODULE]
    return {m: {k: np.array(v) for k, v in w.items()} for m, w in modules.items()}


def checkpoint_weights(ckpt: Path) -> dict[str, dict[str, np.ndarray]]:
    """The learner's weights in checkpoint ``ckpt``, as :func:`learner_weights` gives them."""
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule

    modules = MultiRLModule.from_checkpoint(str(ckpt / "learner_group" / "learner" / "rl_module"))
    return {m: {k: np.array(v) for k, v in mod.get_state().items()} for m, mod in modules.items()}


def differences(a: Mapping[str, Mapping[str, np.ndarray]], b: Mapping[str, Any]) -> list[str]:
    """``module/param`` names whose weights in ``a`` and ``b`` are not bit-identical."""
    names = {(m, k) for m, w in a.items() for k in w} | {(m, k) for m, w in b.items() for k in w}
    out = []
    for m, k in sorted(names):
        x, y = a.get(m, {}).get(k), b.get(m, {}).get(k)
        if x is None or y is None or x.shape != y.shape or x.tobytes() != y.tobytes():
            out.append(f"{m}/{k}")
    return out


def read_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """The inspection arrays of one dump (everything but the ``episodes`` blob)."""
    path = Path(path)
    load_calls(path)  # the named error for a missing or corrupt file
    with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as data:
        return {k: data[k] for k in data.files if k != "episodes"}


def replay_command(
    run_dir: Path, checkpoint: Path | None, iterations: int | None, save: Path | None
) -> bool:
    """``marl replay-updates``: replay, print which checkpoint the weights match (the run's of
    the last replayed iteration, when kept), save with ``save``; True when they match."""
    import typer

    from trainers.run.resume import checkpoint_iteration
    from trainers.run.rundir import save_checkpoint

    run, ckpt, start, n = resolve(run_dir, checkpoint, iterations)
    algo = replay_updates(run, ckpt, n)
    try:
        weights = learner_weights(algo)
        if save is not None:
            save_checkpoint(algo, save.expanduser())
            typer.echo(f"saved the replayed state to {save}")
    finally:
        algo.stop()
    end = start + n
    typer.echo(f"replayed iterations {start + 1}–{end} from {ckpt}")
    kept = [p for p in (run / "checkpoints" / f"iter_{end:06d}", run / "checkpoint") if p.is_dir()]
    kept = [p for p in kept if checkpoint_iteration(p) == end]
    if not kept:
        typer.echo(f"the run kept no checkpoint of iteration {end} to compare with")
        return False
    diff = differences(weights, checkpoint_weights(kept[0]))
    if diff:
        typer.echo(f"weights differ from {kept[0]} in {len(diff)} tensors: {', '.join(diff[:5])}")
    else:
        typer.echo(f"weights equal {kept[0]} bit for bit")
    return not diff
