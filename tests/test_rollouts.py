"""Rollout dumps (``output.rollouts``): compressed per-iteration files, and replaying the
learner updates of iterations 2–3 from the iteration-1 checkpoint gives the run's
iteration-3 weights bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from configs import tiny_config

from trainers.config import ConfigError, OutputConfig


def _weights(ckpt: Path) -> dict[str, dict[str, object]]:
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule

    modules = MultiRLModule.from_checkpoint(str(ckpt / "learner_group" / "learner" / "rl_module"))
    return {mid: dict(m.state_dict()) for mid, m in modules.items()}


def _learner_weights(algo: object) -> dict[str, dict[str, object]]:
    learner = algo.learner_group._learner  # type: ignore[attr-defined]
    return {mid: dict(m.state_dict()) for mid, m in learner.module.items()}


def test_rollouts_option_is_a_typed_bool() -> None:
    assert OutputConfig().rollouts is False
    with pytest.raises(ConfigError, match="output.rollouts"):
        OutputConfig(rollouts="yes")  # type: ignore[arg-type]


@pytest.mark.usefixtures("ray_session")
def test_replayed_updates_give_the_runs_weights_bit_for_bit(tmp_path: Path) -> None:
    import torch

    from trainers.rollouts import RolloutDumpError, dump_path, read_arrays, replay_updates
    from trainers.run import train

    changes = {"budget.iterations": 3, "output.rollouts": True}
    cfg = tiny_config(tmp_path, checkpoint_every=1).replace(**changes)
    run = train(cfg).run_dir
    dumps = run / "rollouts"
    files = sorted(dumps.glob("iter_*.npz"))
    assert [f.name for f in files] == [f"iter_{i:06d}.npz" for i in (1, 2, 3)]
    arrays = read_arrays(files[0])
    logp = [k for k in arrays if k.endswith("/action_logp")]
    assert logp and all(np.isfinite(arrays[k]).all() for k in logp)
    steps = sum(len(arrays[k]) for k in arrays if k.endswith("/actions"))
    assert steps >= 128  # every agent step of the iteration's batch
    size, raw = files[0].stat().st_size, sum(a.nbytes for a in arrays.values())
    print(f"\nrollout dump {files[0].name}: {size} bytes on disk, {raw} bytes of arrays")
    with np.load(files[0]) as data:
        blob = data["episodes"].nbytes
    assert size < blob + raw  # compressed

    algo = replay_updates(run, run / "checkpoints" / "iter_000001", iterations=2)
    try:
        replayed = _learner_weights(algo)
    finally:
        algo.stop()
    expected = _weights(run / "checkpoints" / "iter_000003")
    before = _weights(run / "checkpoints" / "iter_000001")
    assert replayed.keys() == expected.keys()
    for mid, params in expected.items():
        assert params.keys() == replayed[mid].keys()
        for name, value in params.items():
            assert torch.equal(replayed[mid][name], value), (mid, name)
        assert any(not torch.equal(before[mid][n], v) for n, v in params.items()), mid

    dump_path(dumps, 3).unlink()
    with pytest.raises(RolloutDumpError, match="iter_000003.npz is missing"):
        replay_updates(run, run / "checkpoints" / "iter_000001", iterations=2)
    dump_path(dumps, 2).write_bytes(b"not a zip")
    with pytest.raises(RolloutDumpError, match="iter_000002.npz is corrupt"):
        replay_updates(run, run / "checkpoints" / "iter_000001", iterations=2)
