"""Phase timers (``timers/…`` in ``metrics.jsonl``): present, non-negative, within the
iteration's wall time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from configs import tiny_config

from trainers.phase_timers import TIMER_KEYS


@pytest.mark.usefixtures("ray_session")
def test_phase_timers_are_in_the_metrics_and_sum_within_the_iteration(tmp_path: Path) -> None:
    from trainers.run import _row_info, train

    result = train(tiny_config(tmp_path))
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        timers = [row[k] for k in TIMER_KEYS]
        assert all(t >= 0.0 for t in timers), row
        assert sum(timers) <= row["charts/iteration_s"], row
        assert row["timers/env_s"] > 0 and row["timers/forward_s"] > 0
        assert row["timers/learn_s"] > 0
    assert "env " in _row_info(rows[-1]) and "learn " in _row_info(rows[-1])
