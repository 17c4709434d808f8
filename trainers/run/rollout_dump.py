"""Rollout dumps (``output.rollouts``): :func:`record` wraps ``algo.learner_group.update`` and,
before every call, writes what the call gets — the episodes (``get_state()``, taken before the
learner connectors touch them), the keyword arguments (``timesteps``, ``num_epochs``,
``minibatch_size``, ``shuffle…``) and the driver's RNG states (minibatch shuffling draws from
them) — to ``<run>/rollouts/iter_NNNNNN.npz`` (``np.savez_compressed``; several updates of one
iteration are kept in order in the same file). Beside the ``episodes`` blob each file holds
per-module arrays for inspection: ``<module>/obs``, ``/actions``, ``/action_logp``,
``/rewards``, ``/episode`` (index into ``episode_ids``); observations that are not fixed-shape
numbers (text) are only in the blob. Reading them back and replaying the updates is
:mod:`trainers.rollouts`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from trainers.configs.typed import ConfigError

log = logging.getLogger(__name__)

DUMP_DIR = "rollouts"
FORMAT = 1
_MARK = "_marl_rollouts"


class RolloutDumpError(ConfigError):
    """A rollout dump that is missing, unreadable or not a dump of this format."""


def dump_path(rollouts: Path, iteration: int) -> Path:
    """The dump file of ``iteration`` under ``rollouts``."""
    return rollouts / f"iter_{iteration:06d}.npz"


def _episode_state(episode: Any) -> tuple[str, dict[str, Any]]:
    return type(episode).__name__, episode.get_state()


def _from_state(kind: str, state: dict[str, Any]) -> Any:
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from trainers.sampling.batched_runner import OrderedEpisode

    cls = {
        "MultiAgentEpisode": MultiAgentEpisode,
        "OrderedEpisode": OrderedEpisode,
        "SingleAgentEpisode": SingleAgentEpisode,
    }
    if kind not in cls:
        raise RolloutDumpError(f"rollout dump holds an episode of unknown type {kind!r}")
    return cls[kind].from_state(state)


def _agent_episodes(episode: Any) -> Iterable[Any]:
    return episode.agent_episodes.values() if hasattr(episode, "agent_episodes") else [episode]


def _numeric(values: list[Any]) -> np.ndarray | None:
    """``values`` as one numeric array, or None (text, ragged or nested observations)."""
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError):
        return None
    return arr if arr.dtype.kind in "biuf" else None


Rows = dict[str, dict[str, list[Any]]]


def _collect(episodes: list[Any], rows: Rows, ids: list[str]) -> None:
    """Append the steps of ``episodes`` to ``rows`` (module → key → values) and ``ids``."""
    for ep in episodes:
        ids.append(str(ep.id_))
        for sa in _agent_episodes(ep):
            n = len(sa)
            if n == 0:
                continue
            r = rows.setdefault(str(sa.module_id), {k: [] for k in _KEYS})
            r["obs"].extend(sa.get_observations(slice(0, n)))
            r["actions"].extend(sa.get_actions(slice(0, n)))
            r["rewards"].extend(sa.get_rewards(slice(0, n)))
            extra = sa.extra_model_outputs.get("action_logp")
            r["action_logp"].extend(extra[0:n] if extra is not None else [np.nan] * n)
            r["episode"].extend([len(ids) - 1] * n)


def _arrays(rows: Rows) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for module, r in rows.items():
        for key in _KEYS:
            arr = _numeric(r[key])
            if arr is not None:
                out[f"{module}/{key}"] = arr
    return out


_KEYS = ("obs", "actions", "action_logp", "rewards", "episode")


def _write(path: Path, calls: list[bytes], rows: Rows, ids: list[str]) -> None:
    from ray import cloudpickle

    blob = cloudpickle.dumps({"format": FORMAT, "calls": calls})
    arrays = _arrays(rows)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        np.savez_compressed(
            f,
            episodes=np.frombuffer(blob, dtype=np.uint8),
            episode_ids=np.asarray(ids, dtype=str),
            **arrays,
        )
    tmp.replace(path)
    size = path.stat().st_size
    log.info("%s: %.1f KiB (%.1f KiB uncompressed)", path, size / 1024, len(blob) / 1024)


def record(algo: Any, rollouts: Path) -> None:
    """Dump every ``learner_group.update`` call of ``algo`` under ``rollouts`` (idempotent)."""
    from ray import cloudpickle

    from trainers.run.resume import rng_state

    group = algo.learner_group
    update = group.update
    if getattr(update, _MARK, False):
        return
    rollouts.mkdir(parents=True, exist_ok=True)
    if int(getattr(algo.config, "num_learners", 0) or 0) > 0:
        log.warning(
            "output.rollouts with remote learners (resources.num_learners ≥ 1): their RNGs are "
            "not dumped, so replayed updates may differ from the run's"
        )
    pending: dict[int, tuple[list[bytes], Rows, list[str]]] = {}

    @functools.wraps(update)
    def dumping_update(*args: Any, **kwargs: Any) -> Any:
        if args or "episodes" not in kwargs:
            raise RolloutDumpError(
                f"output.rollouts: this algorithm's learner update takes "
                f"{sorted(kwargs) or 'positional arguments'}, not episodes: rollout dumps cover "
                f"PPO and GRPO; set output.rollouts: false"
            )
        episodes = list(kwargs.get("episodes") or [])
        iteration = int(algo.iteration) + 1  # train() counts the iteration after its update
        calls, rows, ids = pending.setdefault(iteration, ([], {}, []))
        for done in [i for i in pending if i != iteration]:
            del pending[done]
        rest = {k: v for k, v in kwargs.items() if k != "episodes"}
        states = [_episode_state(e) for e in episodes]
        call = {"episodes": states, "kwargs": rest, "rng": rng_state()}
        calls.append(cloudpickle.dumps(call))  # now: the learner edits the episodes in place
        _collect(episodes, rows, ids)  # before the learner connectors edit the episodes
        _write(dump_path(rollouts, iteration), calls, rows, ids)
        return update(*args, **kwargs)

    setattr(dumping_update, _MARK, True)
    group.update = dumping_update
