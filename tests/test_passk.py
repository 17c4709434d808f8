"""pass@k by sampling: the estimators against brute force over every k-subset of synthetic
trials, and ``marl eval --k`` on a tiny trained run (trained and starting-point columns)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from configs import tiny_config

from trainers.passk import best_at_k, ks_up_to, pass_at_k, passk_table

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("n", "c"), [(1, 0), (1, 1), (5, 0), (5, 2), (6, 5), (8, 3), (8, 8)])
def test_pass_at_k_is_the_subset_average(n: int, c: int) -> None:
    outcomes = [1] * c + [0] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(outcomes, k))
        brute = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(brute)


def test_pass_at_k_hand_values_and_errors() -> None:
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 − C(3,2)/C(4,2) = 1 − 3/6
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 6, 5) == 1.0
    with pytest.raises(ValueError, match="1 ≤ k ≤ n"):
        pass_at_k(3, 1, 4)


def test_best_at_k_is_the_subset_average_of_maxima() -> None:
    returns = [0.3, -1.0, 2.0, 0.3, 0.5, 1.25]
    for k in range(1, len(returns) + 1):
        subsets = list(itertools.combinations(returns, k))
        assert best_at_k(returns, k) == pytest.approx(np.mean([max(s) for s in subsets]))


def test_passk_table_averages_tasks() -> None:
    assert ks_up_to(16) == [1, 2, 4, 8, 16] and ks_up_to(6) == [1, 2, 4, 6]
    trials = {
        0: [{"success": 1.0, "return": 1.0}, {"success": 0.0, "return": 0.0}] * 2,
        1: [{"success": 0.0, "return": -1.0}] * 4,
    }
    t = passk_table(trials)
    assert t["tasks"] == 2 and t["samples"] == 4
    # task 0: c = 2 of 4; task 1: c = 0
    assert t["pass@1"] == pytest.approx(0.25)
    assert t["pass@2"] == pytest.approx((1 - 1 / 6) / 2)
    assert t["pass@4"] == pytest.approx(0.5)
    assert t["mean@4"] == pytest.approx((0.5 - 1.0) / 2)
    assert t["best@4"] == pytest.approx(0.0)  # (1 + (−1)) / 2


def test_eval_k_cli_prints_trained_and_baseline(ray_session, tmp_path) -> None:
    from trainers.evaluate import EVAL_SEED, evaluate
    from trainers.run.loop import train

    cfg = tiny_config(tmp_path, scenario="tests.apps.exploits:Chatter", budget={"iterations": 1})
    run = train(cfg).run_dir
    first = evaluate(run, 3, k=4, show=False)
    a, b = first.passk, evaluate(run, 3, k=4, show=False).passk
    assert a == b and set(a) == {"trained", "baseline"}  # seeds fixed: the same trials
    solved = first.solved["trained"]
    assert set(solved) == {EVAL_SEED, EVAL_SEED + 1, EVAL_SEED + 2}
    assert a["trained"]["pass@4"] == pytest.approx(np.mean([c > 0 for c in solved.values()]))
    assert 0.0 <= a["trained"]["pass@1"] <= a["trained"]["pass@4"] <= 1.0
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), COLUMNS="160")
    out = subprocess.run(
        [sys.executable, "-m", "trainers.cli", "eval", str(run), "--episodes", "3", "--k", "4"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    assert "pass@k" in out and "trained" in out and "baseline (init)" in out
    for key in ("pass@1", "pass@2", "pass@4", "mean@4", "best@4"):
        assert key in out
    assert f"{a['trained']['pass@4']:.3f}" in out
