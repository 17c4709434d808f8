"""The learnability curriculum (:mod:`trainers.signals.curriculum`) and the difficulty knob
(:mod:`scenarios.difficulty`): sampler math by hand, schedule draws, informative groups with
half the tasks unlearnable, and an exact resume on real Ray."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_faults import Stop, assert_same_weights, rows, tiny, untimed

from scenarios.base import ScenarioError
from scenarios.delegate import PENDING, SOLVED, Delegate
from scenarios.difficulty import LEVEL_STRIDE, level_seed
from scenarios.text_delegate import TextDelegate
from trainers.configs.curriculum import CurriculumConfig
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError
from trainers.sampling.grouped_env import GroupedEnv
from trainers.signals.curriculum import (
    SCHEDULE,
    LearnabilitySampler,
    TaskSchedule,
    informative_share,
)


# ----- sampler math (by hand) ---------------------------------------------------------------
def test_pass_rates_utilities_and_probabilities_by_hand() -> None:
    cfg = CurriculumConfig(mode="learnability", tasks=3, epsilon=0.1, prior=0.5, prior_weight=2)
    s = LearnabilitySampler(cfg, 3)
    s.update([(0, True)] * 4 + [(2, False)] * 4)
    # p̂ = (passes + 0.5·2) / (trials + 2): 5/6, 1/2 (unseen), 1/6
    assert np.allclose(s.pass_rates(), [5 / 6, 1 / 2, 1 / 6])
    u = math.sqrt(5 / 36)  # √(5/6 · 1/6)
    assert np.allclose(s.utilities(), [u, 0.5, u])
    total = 2 * u + 0.5
    want = [0.9 * u / total + 0.1 / 3, 0.9 * 0.5 / total + 0.1 / 3, 0.9 * u / total + 0.1 / 3]
    assert np.allclose(s.probabilities(), want)
    assert math.isclose(s.probabilities().sum(), 1.0)
    m = s.metrics()
    assert math.isclose(m["utility_mean"], float(np.dot(want, [u, 0.5, u])))
    assert m["learnable_share"] == 1.0  # 1/6 and 5/6 lie in [0.1, 0.9]
    uniform = LearnabilitySampler(CurriculumConfig(tasks=3), 3)
    uniform.update([(0, True)] * 4)
    assert np.allclose(uniform.probabilities(), [1 / 3] * 3)


def test_epsilon_floor_and_decay_by_hand() -> None:
    cfg = CurriculumConfig(mode="learnability", tasks=2, epsilon=0.2, prior_weight=1, decay=0.5)
    s = LearnabilitySampler(cfg, 2)
    s.update([(0, True)] * 20 + [(1, True), (1, False)])
    s.update([(1, True)])  # decay first: task 1 has 0.5 + 1 passes in 0.5·2 + 1 trials
    assert np.allclose(s.trials, [10, 2]) and np.allclose(s.passes, [10, 1.5])
    p = s.pass_rates()
    assert np.allclose(p, [10.5 / 11, 2 / 3])
    u = np.sqrt(p * (1 - p))
    assert np.allclose(s.probabilities(), 0.8 * u / u.sum() + 0.1)
    solved = LearnabilitySampler(CurriculumConfig(mode="learnability", tasks=2, epsilon=0.2), 2)
    solved.passes[:] = solved.trials[:] = 1e9  # p̂ → 1 everywhere: u → 0, ε keeps it uniform
    assert np.allclose(solved.probabilities(), [0.5, 0.5], atol=1e-3)
    assert solved.metrics()["learnable_share"] == 0.0


def test_state_round_trip_and_mismatch() -> None:
    cfg = CurriculumConfig(mode="learnability", tasks=4)
    a = LearnabilitySampler(cfg, 4)
    a.update([(1, True), (2, False), (1, False)])
    b = LearnabilitySampler(cfg, 4)
    b.set_state(a.get_state())
    assert np.array_equal(a.probabilities(), b.probabilities())
    with pytest.raises(ValueError, match="resume with the curriculum section"):
        LearnabilitySampler(cfg, 5).set_state(a.get_state())


def test_informative_share_counts_groups_with_both_outcomes() -> None:
    outcomes = [((0, 0, 0), 3, True), ((0, 0, 0), 3, False), ((0, 0, 1), 2, True)]
    outcomes += [((0, 0, 1), 2, True), ((0, 0, 2), 1, False)]
    assert informative_share(outcomes) == pytest.approx(1 / 3)


# ----- config --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"mode": "learnability"}, "needs a pool of tasks"),
        ({"tasks": 0}, "curriculum.tasks must be ≥ 1"),
        ({"tasks": [1, 1]}, "distinct seeds"),
        ({"tasks": 4, "epsilon": 1.5}, r"curriculum.epsilon must be in \[0, 1\], got 1.5"),
        ({"tasks": 4, "prior": 1.0}, "curriculum.prior must be in"),
        ({"tasks": 4, "decay": 0.0}, "curriculum.decay must be in"),
        ({"tasks": 4, "band": [0.9, 0.1]}, "curriculum.band must be"),
        ({"levels": []}, "curriculum.levels must list"),
    ],
)
def test_config_errors_name_the_field(section: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ExperimentConfig.from_dict({"curriculum": section}).check()


def test_levels_need_the_scenario_to_read_them_from_the_seed() -> None:
    from trainers.algo import to_algorithm_config

    cfg = ExperimentConfig.from_dict({"curriculum": {"levels": [0, 2], "tasks": 2}})
    with pytest.raises(ConfigError, match=r"scenario_kwargs\.difficulty: seed"):
        to_algorithm_config(cfg)
    cfg = cfg.replace(**{"scenario_kwargs.difficulty": "seed"})
    runner = to_algorithm_config(cfg).env_config["runner"]
    assert runner.curriculum["tasks"] == [
        LEVEL_STRIDE,
        LEVEL_STRIDE + 1,
        3 * LEVEL_STRIDE,
        3 * LEVEL_STRIDE + 1,
    ]


# ----- difficulty knob -------------------------------------------------------------------------
def test_delegate_active_parts_knob() -> None:
    s = Delegate("star:3", parts=3, difficulty="seed")
    assert Delegate.difficulty_knob == "active_parts" and s.difficulty_levels == (1, 2, 3)
    hard = Delegate("star:3", parts=3)  # default: the scenario as configured (hardest)
    for level, pending in ((0, 1), (1, 2), (2, 3)):
        state = s.initial_state(np.random.default_rng(level_seed(level, 7)))
        status = [state["status"][i] for i in range(3)]
        assert status == [PENDING] * pending + [SOLVED] * (3 - pending)
    same = np.random.default_rng(level_seed(2, 7))
    assert s.initial_state(same) == hard.initial_state(np.random.default_rng(level_seed(2, 7)))
    for plain in (7, 1_000_000, 9 * LEVEL_STRIDE):  # seeds level_seed did not make: hardest
        state = s.initial_state(np.random.default_rng(plain))
        assert state == hard.initial_state(np.random.default_rng(plain))
    easy = s.oracle_value(np.random.default_rng(level_seed(0, 7)))
    assert easy > hard.oracle_value(np.random.default_rng(level_seed(2, 7)))
    fixed = Delegate("star:3", parts=3, difficulty=0)  # level 0 whatever the seed
    for seed in (7, level_seed(0, 7), level_seed(2, 7)):
        state = fixed.initial_state(np.random.default_rng(seed))
        assert [state["status"][i] for i in range(3)] == [PENDING, SOLVED, SOLVED]
    with pytest.raises(ScenarioError, match=r"difficulty=5 is not a level"):
        Delegate("star:3", parts=3, difficulty=5)


def test_text_delegate_has_the_same_knob() -> None:
    t = TextDelegate("star:2", level="full", difficulty="seed")
    assert TextDelegate.difficulty_knob == "active_parts" and t.difficulty_levels == (1, 2, 3)
    state = t.initial_state(np.random.default_rng(level_seed(0, 3)))
    assert [state["status"][i] for i in range(3)] == [PENDING, SOLVED, SOLVED]


# ----- schedule ----------------------------------------------------------------------------------
def test_a_draw_keeps_its_task_when_the_distribution_changes() -> None:
    sched = TaskSchedule()
    sched.push([10, 11, 12, 13], np.array([0.25, 0.25, 0.25, 0.25]))
    first = [sched.draw((0, 1), k) for k in range(8)]
    sched.push([10, 11, 12, 13], np.array([0.0, 0.0, 0.0, 1.0]))
    assert [sched.draw((0, 1), k) for k in range(8)] == first  # memoised: groups stay whole
    assert {sched.draw((0, 1), k) for k in range(8, 20)} == {3}
    sched.record((0, 1), 0, 3, True)
    sched.push([10, 11, 12, 13], np.array([0.25, 0.25, 0.25, 0.25]), fresh=True)  # a new run
    assert sched.outbox == [] and [sched.draw((0, 1), k) for k in range(8)] == first


# ----- half the tasks unlearnable -------------------------------------------------------------
#: one part, two types; nobody can solve type 1, so tasks whose part has type 1 always fail
SKILLS = [[0.8, 0.0], [0.8, 0.0]]
GROUP = 4


def _tasks() -> tuple[list[int], int]:
    """16 seeds: 8 learnable (type 0), 8 unlearnable (type 1)."""
    s = Delegate("star:2", parts=1, types=2, skills=SKILLS)
    by_type: dict[int, list[int]] = {0: [], 1: []}
    seed = 0
    while min(len(v) for v in by_type.values()) < 8:
        t = s.initial_state(np.random.default_rng(seed))["types"][0]
        if len(by_type[t]) < 8:
            by_type[t].append(seed)
        seed += 1
    return by_type[0] + by_type[1], 8


def _informative_groups(mode: str, iterations: int = 16, groups: int = 8) -> list[float]:
    """Share of informative groups per iteration: ``GROUP`` real ``GroupedEnv``s sharing a
    task stream (as GRPO's sub-envs do), a uniformly random orchestrator with scripted workers
    (stands in for an untrained policy: fixed, so that only the sampling differs), the
    driver's sampler updated from the schedule's outcomes every iteration, as
    ``Curriculum.step`` does through the env runners."""
    from trainers.signals.curriculum import drain_outcomes, push_distribution

    tasks, _ = _tasks()
    cfg = CurriculumConfig(mode=mode, tasks=tasks, prior_weight=1.0)  # type: ignore[arg-type]
    sampler = LearnabilitySampler(cfg, len(tasks))
    env_config = {
        "scenario": "delegate",
        "topology": "star:2",
        "kwargs": {"parts": 1, "types": 2, "skills": SKILLS},
        "curriculum": {"tasks": tasks, "pass_threshold": None},
        "seed": 3,
    }
    SCHEDULE.__init__()  # type: ignore[misc]  (a fresh process's schedule)
    envs = [GroupedEnv(env_config) for _ in range(GROUP)]
    rng = np.random.default_rng(0)
    scripted = envs[0].env.scenario.scripted_worker

    def policy(agent: str, obs: Any) -> Any:
        if agent == "orchestrator":
            return rng.integers(3, size=1)  # nobody (ends the episode), worker_0 or worker_1
        return scripted(agent, obs)

    shares = []
    for _ in range(iterations):
        push_distribution(tasks=tasks, probs=sampler.probabilities())
        for _ in range(groups):
            for env in envs:
                obs, _ = env.reset()
                done = False
                while not done:
                    act = {a: policy(a, o) for a, o in obs.items()}
                    obs, _, terms, truncs, _ = env.step(act)
                    done = terms["__all__"] or truncs["__all__"]
        outcomes = drain_outcomes()
        assert len(outcomes) == GROUP * groups
        sampler.update((task, ok) for _, task, ok in outcomes)
        shares.append(informative_share(outcomes))
    return shares


def test_learnability_keeps_groups_informative_where_uniform_does_not() -> None:
    """Counted over the last 10 iterations (80 groups each way), once the sampler has seen every
    task a few times: uniform sampling wastes half its draws on tasks that always fail."""
    late = slice(6, None)
    uniform = round(sum(_informative_groups("uniform")[late]) * 8)
    learn = round(sum(_informative_groups("learnability")[late]) * 8)
    assert learn > 40  # most of the 80 groups carry signal
    assert uniform < 40
    assert learn >= uniform + 12


# ----- a real run, stopped and resumed ----------------------------------------------------------
def curriculum_run(tmp_path: Path, name: str) -> ExperimentConfig:
    section = {"curriculum": {"mode": "learnability", "tasks": 6, "pass_threshold": 0.5}}
    return tiny(tmp_path, **{"output.name": name}).replace(**section)


@pytest.mark.usefixtures("ray_session")
def test_curriculum_run_resumes_exactly(tmp_path: Path) -> None:
    """PPO on delegate with a learnability curriculum: the metrics carry ``curriculum/*``, and
    a run stopped after iteration 2 and resumed gives the uninterrupted run's metrics (the
    curriculum's included), final weights and pass-rate estimates."""
    from trainers.run.loop import train

    full = train(curriculum_run(tmp_path, "full"))
    row = rows(full.run_dir)[-1]
    for key in ("utility_mean", "learnable_share", "pass_rate_mean", "episodes"):
        assert f"curriculum/{key}" in row
    assert row["curriculum/episodes"] > 0

    def stop_after_two(r: dict[str, Any]) -> None:
        if r["charts/iteration"] == 2:
            raise Stop

    with pytest.raises(Stop):
        train(curriculum_run(tmp_path, "part"), report=stop_after_two)
    part = tmp_path / "runs" / "part"
    assert train(resume=part).status == "completed"
    assert untimed(rows(part)) == untimed(rows(full.run_dir))
    assert_same_weights(part, full.run_dir)
    summary = json.loads((part / "summary.json").read_text())
    assert summary["status"] == "completed"
