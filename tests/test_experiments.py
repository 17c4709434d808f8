"""The experiment pipeline of issue #6: a claim script's ``--smoke`` path end to end on a real
local Ray, resuming, and the report built from smoke results and from synthetic records of
every claim. No wall-clock thresholds: every assertion is about what was produced.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `experiments` and `bench` are folders of the checkout
    sys.path.insert(0, str(ROOT))

from experiments import CLAIMS, analysis, harness, report  # noqa: E402


# ----- a claim's smoke path, for real ---------------------------------------------------------
@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """``python -m experiments.orchestrator_only --smoke --seeds 1`` through its entry point."""
    pytest.importorskip("ray")
    from experiments import orchestrator_only

    out = tmp_path_factory.mktemp("results")
    return out, orchestrator_only.main(["--smoke", "--seeds", "1", "--out", str(out), "--quiet"])


@pytest.mark.usefixtures("ray_session")
def test_smoke_writes_one_record_per_condition_and_seed(smoke: Any) -> None:
    out, records = smoke
    assert sorted(r["condition"] for r in records) == ["joint-star3", "orchestrator-star3"]
    for r in records:
        path = out / "orchestrator_only" / "smoke" / r["condition"] / "seed0.json"
        saved = json.loads(path.read_text())
        assert saved["status"] == "completed" and saved["budget"] == "smoke"
        assert saved["iterations"] == 2 and len(saved["history"]) == 2
        row = saved["history"][-1]
        assert {"env_steps", "team_return", "oracle_fraction", "latency"} <= row.keys()
        assert saved["eval"]["summary"]["episodes"] == 3
        assert "solved_fraction" in saved["eval"]["metrics"]
        assert saved["config"]["logging"]["wandb"] == "disabled"
        assert saved["config"]["seed"] == 0
    frozen = next(r for r in records if r["condition"].startswith("orchestrator"))
    assert frozen["config"]["train"] == ["orchestrator"]
    # no curve PNG next to the run: plots are the report's job
    assert not list((out / "orchestrator_only").rglob("curve.png"))


@pytest.mark.usefixtures("ray_session")
def test_smoke_resumes_without_retraining(smoke: Any) -> None:
    from experiments import orchestrator_only

    out, records = smoke
    paths = sorted((out / "orchestrator_only" / "smoke").glob("*/seed0.json"))
    before = {p: p.stat().st_mtime_ns for p in paths}
    again = orchestrator_only.main(["--smoke", "--seeds", "1", "--out", str(out), "--quiet"])
    assert {p: p.stat().st_mtime_ns for p in paths} == before
    assert sorted(r["created"] for r in again) == sorted(r["created"] for r in records)
    # a run saved with another config (say, an older budget) is trained again, not mixed in
    joint = out / "orchestrator_only" / "smoke" / "joint-star3" / "seed0.json"
    stale = json.loads(joint.read_text())
    stale["config"]["budget"]["iterations"] = 99
    joint.write_text(json.dumps(stale))
    orchestrator_only.main(["--smoke", "--seeds", "1", "--out", str(out), "--quiet"])
    redone = json.loads(joint.read_text())
    assert redone["config"]["budget"]["iterations"] == 2 and redone["iterations"] == 2
    assert redone["created"] >= stale["created"]
    others = [p for p in paths if p != joint]
    assert {p: p.stat().st_mtime_ns for p in others} == {p: before[p] for p in others}


@pytest.mark.usefixtures("ray_session")
def test_report_from_smoke_results_keeps_interpretations(smoke: Any, tmp_path: Path) -> None:
    out, _ = smoke
    doc, img = tmp_path / "results.md", tmp_path / "img"
    report.main(["--results", str(out), "--budget", "smoke", "--out", str(doc), "--img", str(img)])
    text = doc.read_text()
    assert "## 1. Orchestrator-only training with frozen subagents (PARL)" in text
    assert "| orchestrator only (frozen scripted workers) · star:3 | 1 |" in text
    assert "python -m experiments.orchestrator_only --smoke --seeds 1" in text
    assert (img / "orchestrator_only_curves.png").exists()
    assert "![fraction of oracle and return vs env steps](img/orchestrator_only_curves.png)" in text
    assert text.count("**No results yet.**") == len(CLAIMS) - 1
    # a human interpretation survives a rebuild
    edited = text.replace(report.PLACEHOLDER, "Frozen workers help here.", 1)
    doc.write_text(edited)
    report.build(out, doc, img, budget="smoke")
    rebuilt = doc.read_text()
    assert "Frozen workers help here." in rebuilt
    assert rebuilt.count(report.PLACEHOLDER) == len(CLAIMS) - 1


# ----- the report on synthetic records of every claim ----------------------------------------
def run_record(
    claim: str, condition: str, seed: int, params: dict[str, Any], **curve: Any
) -> dict[str, Any]:
    """A run record as the harness writes it, with a made-up learning curve."""
    n = 6
    history = []
    for i in range(1, n + 1):
        row: dict[str, Any] = {"iteration": i, "env_steps": 1000 * i, "iteration_s": 1.5}
        for key, (start, end) in curve.items():
            row[key] = start + (end - start) * i / n + 0.01 * seed
        row["episodes"] = 100
        history.append(row)
    last = history[-1]
    return {
        "schema": harness.SCHEMA,
        "kind": "run",
        "claim": claim,
        "budget": "default",
        "condition": condition,
        "label": condition.replace("-", " "),
        "params": params,
        "seed": seed,
        "status": "completed",
        "command": f"python -m experiments.{claim}",
        "iterations": n,
        "env_steps": 1000 * n,
        "train_s": 10.0,
        "wall_s": 12.0,
        "history": history,
        "eval": {
            "summary": {
                "episodes": 10,
                "return": last.get("team_return", 0.0),
                "success": 0.5,
                "oracle_fraction": last.get("oracle_fraction", 0.5),
                "latency": last.get("latency", 2.0),
            },
            "metrics": {
                k: last[k] for k in ("solved_fraction", "min_dist", "collisions") if k in last
            },
        },
        "extra": {},
        "environment": {"python": "3.x", "cpus": 2},
    }


def judge_voting_records() -> list[dict[str, Any]]:
    """Synthetic records of the judge-voting claim."""
    return [
        run_record(
            "judge_voting",
            name,
            s,
            {"judges": 1},
            team_return=(0.1, end),
            success=(0.1, end),
            solved_fraction=(0.5, 0.9),
            **{"reward/judge_disagreement": (0.2, 0.1)},
        )
        for name, end in (("exact", 0.6), ("noisy-1", 0.3), ("majority-5", 0.58))
        for s in range(3)
    ]


def turn_credit_records() -> list[dict[str, Any]]:
    """Synthetic ``turn_credit`` records: step groups ahead on every seed."""
    out = []
    for mode, end in (("episode", 0.4), ("reward_to_go", 0.5), ("step_groups", 0.8)):
        for s in range(3):
            record = run_record(
                "turn_credit",
                mode,
                s,
                {"turn_credit": mode},
                success=(0.0, end - 0.3),
                team_return=(0.1, end),
                episode_len=(2.0, 4.0),
            )
            if mode == "step_groups":
                record["extra_metrics"] = {"anchor_hit_rate": 0.4}
            out.append(record)
    return out


def curriculum_records() -> list[dict[str, Any]]:
    """Synthetic records of the curriculum claim."""
    arms = (("uniform", 0.3), ("learnability", 0.6), ("learnability-levels", 0.5))
    curves = {"curriculum/utility_mean": (0.5, 0.4), "curriculum/difficulty": (1, 3)}
    return [
        run_record(
            "curriculum", name, s, {"arm": name}, team_return=(0, end), success=(0, end), **curves
        )
        for name, end in arms
        for s in range(3)
    ]


def passk_records() -> list[dict[str, Any]]:
    """GRPO runs and their pass@k records: pass@1 up, pass@16 down (RL narrowed)."""
    seeds = range(3)
    out = [run_record("passk", "grpo", s, {}, team_return=(-0.1, 0.5)) for s in seeds]
    table = {"pass@1": 0.2, "pass@16": 0.9, "mean@1": 0.1, "mean@16": 0.1}
    table |= {"best@1": 0.1, "best@16": 0.8}
    after = {**table, "pass@1": 0.6, "pass@16": 0.8}
    for s in seeds:
        out.append(
            {"kind": "passk", "seed": s, "tasks": 4, "k": 16, "trained": after, "baseline": table}
        )
    return out


def sampler_curves_records() -> list[dict[str, Any]]:
    """Both samplers on every scenario, with phase timers: batched samples twice as fast;
    on relay the batched arm ends above every RLlib seed."""
    out = []
    for scenario in ("delegate", "relay", "spread"):
        for sampler, end, sample_s in (("rllib", 0.6, 1.0), ("batched", 0.6, 0.5)):
            end += 0.3 if (scenario, sampler) == ("relay", "batched") else 0.0
            for s in range(3):
                r = run_record(
                    "sampler_curves",
                    f"{scenario}-{sampler}",
                    s,
                    {"scenario": scenario, "sampler": sampler},
                    team_return=(0.0, end),
                )
                for row in r["history"]:
                    row |= {"timers/env_s": sample_s / 2, "timers/forward_s": sample_s / 4}
                    row["timers/sample_overhead_s"] = sample_s / 4
                out.append(r)
    return out


def critics_records() -> list[dict[str, Any]]:
    from experiments import critics

    return [
        run_record(
            "critics",
            cond.name,
            s,
            cond.params,
            team_return=(0.1, end := 0.9 if cond.params["algo"] == "MAPPO" else 0.6),
            oracle_fraction=(0.1, end),
        )
        for cond in critics.conditions("default")
        for s in range(3)
    ]


#: claims whose synthetic records come from their own function
SYNTHETIC = {
    "critics": critics_records,
    "judge_voting": judge_voting_records,
    "turn_credit": turn_credit_records,
    "curriculum": curriculum_records,
    "passk": passk_records,
    "sampler_curves": sampler_curves_records,
}


def synthetic(claim: str) -> list[dict[str, Any]]:
    """Records for every arm of ``claim`` over 3 seeds (and its extra records)."""
    out: list[dict[str, Any]] = list(SYNTHETIC.get(claim, list)())
    seeds = range(3)
    if claim == "orchestrator_only":
        for name, end in (("orchestrator-star3", 0.95), ("joint-star3", 0.7)):
            out += [
                run_record(
                    claim,
                    name,
                    s,
                    {"topology": "star:3"},
                    team_return=(0.1, end),
                    oracle_fraction=(0.1, end),
                )
                for s in seeds
            ]
    elif claim == "fanout_latency":
        for n in (2, 4):
            for mode, lat in (("parallel", 1.5), ("sequential", 1.5 * n)):
                out += [
                    run_record(
                        claim,
                        f"n{n}-{mode}",
                        s,
                        {"n": n, "mode": mode},
                        latency=(5, lat),
                        solved_fraction=(0.3, 0.9),
                        team_return=(0, 0.6),
                    )
                    for s in seeds
                ]
                out.append(
                    {
                        "kind": "reference",
                        "n": n,
                        "mode": mode,
                        "means": {"latency": lat * 0.9, "success": 1.0},
                    }
                )
    elif claim == "credit":
        from experiments import credit

        for scenario in ("relay", "delegate"):
            for method in ("team", "loo", "shapley") + (
                ("local",) if scenario == "delegate" else ()
            ):
                out += [
                    run_record(
                        claim,
                        f"{scenario}-{method}",
                        s,
                        {"scenario": scenario, "method": method},
                        team_return=(0.1, 0.95),
                        oracle_fraction=(0.1, 0.95),
                    )
                    for s in seeds
                ]
        out.append({"kind": "unsupported", "condition": "relay-local", "reason": "no local"})
        out.append(credit.estimators(credit.BUDGETS["smoke"]["estimators"]))  # real, no Ray
    elif claim == "heterogeneous":
        params = {
            "heterogeneous": {"orchestrator": 10, "worker_0": 5, "worker_1": 5},
            "homogeneous": {"orchestrator": 10, "worker": 10},
            "width": 8,
        }
        for name in ("heterogeneous", "homogeneous"):
            for s in seeds:
                r = run_record(
                    claim, name, s, {"arm": name}, team_return=(0, 0.5), oracle_fraction=(0, 0.6)
                )
                r["extra"] = {"parameters": params}
                out.append(r)
    elif claim == "single_vs_team":
        for name, oracle in (("single", 0.3), ("team-star3", 0.84)):
            out += [
                run_record(
                    claim,
                    name,
                    s,
                    {"arm": name},
                    team_return=(0, oracle * 0.8),
                    oracle=(oracle, oracle),
                    oracle_fraction=(0, 0.8),
                )
                for s in seeds
            ]
    elif claim == "spread_benchmark":
        out += [
            run_record(
                claim,
                "ippo-shared",
                s,
                {},
                **{"return": (-28, -20)},
                min_dist=(2.2, 1.5),
                collisions=(1.4, 1.0),
            )
            for s in seeds
        ]
        out.append(
            {
                "kind": "reference",
                "episodes": 5,
                "means": {
                    "return": -28.4,
                    "min_dist": 2.2,
                    "collisions": 1.4,
                    "epymarl_return": -245.0,
                },
            }
        )
    return out


def test_report_covers_every_claim_on_synthetic_results(tmp_path: Path) -> None:
    results = tmp_path / "results"
    for claim in CLAIMS:
        for i, record in enumerate(synthetic(claim)):
            name = record.get("condition", f"extra{i}")
            seed = record.get("seed", i)
            path = results / claim / "default" / name / f"seed{seed}.json"
            if record["kind"] != "run":
                path = results / claim / "default" / f"{record['kind']}-{i}.json"
            harness.write_json(path, record)
    doc = report.build(results, tmp_path / "results.md", tmp_path / "img")
    text = doc.read_text()
    assert "**No results yet.**" not in text
    for claim in CLAIMS:
        assert f"<!-- interpretation:{claim} -->" in text
        assert list((tmp_path / "img").glob(f"{claim}_*.png")), claim
    # computed findings follow the data
    assert "orchestrator-only is higher than joint on every seed" in text
    assert "N=4: latency — sequential is higher than parallel on every seed" in text
    assert "relay · local did not run: no local" in text
    assert "Shapley estimator error vs coalition budget" in text
    assert "| homogeneous | orchestrator: 10, worker: 10 | 10 | 20 |" in text
    assert "team is higher than single on every seed" in text
    assert "-133.54 ± 3.08" in text
    assert "majority-5 is higher than noisy-1 on every seed" in text
    assert "step groups (GiGPO) is higher than episode credit on every seed" in text
    assert "final training success: learnability is higher than uniform on every seed" in text
    assert "RL **narrowed** what the team solves (pass@16 fell)" in text
    assert "| delegate | **batched ÷ RLlib** |  |  |  | 2.00× | 1.00× |" in text
    assert "| 100% | 6.0k | 0.510 (0.500–0.520) | 0.510 (0.500–0.520) | inside | inside |" in text
    relay = "| 100% | 6.0k | 0.510 (0.500–0.520) | 0.760 (0.750–0.770) | **outside** (above by 0.24"
    assert relay in text
    assert "relay · shapley, final return: MAPPO is higher than IPPO on every seed" in text


# ----- the numbers behind the tables ---------------------------------------------------------
def test_steps_to_target_uses_a_moving_average() -> None:
    record = {
        "history": [
            {"env_steps": 1000 * (i + 1), "x": v}
            for i, v in enumerate([0.0, 1.0, 0.2, 0.9, 0.9, 0.9])
        ]
    }
    assert analysis.steps_to(record, "x", 0.8) == 6000.0  # the spike at 2000 does not count
    assert analysis.steps_to(record, "x", 0.95) is None
    assert analysis.final(record, "x") == pytest.approx(0.9)
    assert analysis.best(record, "x") == pytest.approx(0.9)


def test_compare_calls_a_difference_only_without_overlap() -> None:
    assert "a is higher than b" in analysis.compare([3, 4, 5], [1, 2, 2.5], "a", "b")
    assert "no clear difference" in analysis.compare([3, 4, 5], [1, 2, 3.5], "a", "b")
    assert "fewer than 2 seeds" in analysis.compare([3], [1], "a", "b")
    assert analysis.fmt([1.0, 2.0, 3.0]) == "2.000 ± 1.000 (1.000–3.000)"
    assert analysis.fmt_steps([1000.0, None, 3000.0]) == "2.0k ± 1.4k (2/3 reached)"


def test_epymarl_conversion_formula() -> None:
    from experiments.spread_benchmark import epymarl_return

    # -N·T·min_dist − 2·collisions − N·T for N=3, T=25
    assert epymarl_return(2.0, 1.0) == pytest.approx(-150 - 2 - 75)


def test_credit_records_unsupported_arms_without_training(tmp_path: Path) -> None:
    from experiments import credit

    ctx = harness.Context("credit", "smoke", tmp_path, "test", quiet=True)
    kept = credit.supported(ctx, credit.conditions("smoke"))
    names = [c.name for c in kept]
    assert "relay-local" not in names and "delegate-local" in names
    saved = json.loads((tmp_path / "credit" / "smoke" / "unsupported-relay-local.json").read_text())
    assert saved["kind"] == "unsupported" and "Outcome.local" in saved["reason"]
