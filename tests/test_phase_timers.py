"""Phase timers (``timers/…`` in ``metrics.jsonl``): present, non-negative, the phases within
the iteration's wall time (with env threads too), and the tool wait within the sampling time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from configs import tiny_config

from trainers.signals.phase_timers import PHASE_KEYS, TIMER_KEYS, TOOL_WAIT_KEY

SAMPLING = ("timers/env_s", "timers/forward_s", "timers/sample_overhead_s")


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def check_phases(row: dict[str, Any]) -> None:
    assert all(row[k] >= 0.0 for k in TIMER_KEYS), row
    assert sum(row[k] for k in PHASE_KEYS) <= row["charts/iteration_s"], row
    assert row["timers/env_s"] > 0 and row["timers/forward_s"] > 0
    assert row["timers/learn_s"] > 0


@pytest.mark.usefixtures("ray_session")
def test_phase_timers_are_in_the_metrics_and_sum_within_the_iteration(tmp_path: Path) -> None:
    from trainers.run.display import row_info
    from trainers.run.loop import train

    result = train(tiny_config(tmp_path))
    rows = rows_of(result.run_dir)
    assert len(rows) == 2
    for row in rows:
        check_phases(row)
        assert row[TOOL_WAIT_KEY] == 0.0  # no tool settings: tools are not timed
    assert "env " in row_info(rows[-1]) and "learn " in row_info(rows[-1])
    assert "tool wait" not in row_info(rows[-1])


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.usefixtures("ray_session")
def test_tool_wait_lies_within_sampling_and_env_threads_keep_the_contract(
    tmp_path: Path, threads: bool
) -> None:
    """With slow tools on 4 envs stepped side by side (``env_threads``) the envs' own
    reset/step seconds overlap; the phases still sum within the iteration, and the tool wait
    (wall time with a tool call running) within the sampling time."""
    from trainers.run.display import row_info
    from trainers.run.loop import train

    episodes = {"tool_latency": {"seconds": 0.01}, "env_threads": threads}
    cfg = tiny_config(
        tmp_path, scenario="toolchain", episodes=episodes, resources={"num_envs_per_env_runner": 4}
    )
    rows = rows_of(train(cfg).run_dir)
    for row in rows:
        check_phases(row)
        sampling = sum(row[k] for k in SAMPLING)
        assert 0 < row[TOOL_WAIT_KEY] <= sampling, row
        if not threads:  # tool calls run inside reset/step, in the sampler's thread
            assert row[TOOL_WAIT_KEY] <= row["timers/env_s"], row
    assert "tool wait " in row_info(rows[-1])
