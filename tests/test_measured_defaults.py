"""Issue #44: defaults that are the measured settings, token budgets checked before training,
the cost of an iteration shown, outputs a user can compare.

* ``marl run <app>`` with no YAML resolves to the measured example's algorithm, and the
  shipped simple_spread config is the experiment behind docs/results.md's headline with
  MAPPO's defaults (its YAML says only what is special).
* Prompt budgets: the system prompt is kept when a prompt is cut; a system prompt that a cut
  removes is a warning naming the agent and the lengths; prompt + reply over a pool's context
  is an error before Ray starts.
* ``cost_lines`` names the knobs of a slow iteration; evaluation covers a task list
  round-robin with a row per task; simple_spread reports EPyMARL's return and no success.
* One real CLI run (subprocess, not a terminal): a plain line per iteration, SIGTERM after the
  first one leaves a checkpoint, ``summary.json``'s best and final returns agree.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainers.configs.algorithms import GRPOAlgo, MAPPOAlgo
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.grpo import GRPOSettings
from trainers.configs.typed import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SPREAD_HEADLINE = {  # experiments/spread_mappo.py's settings of the −144.4 arm
    "scenario": "experiments.spread_mappo:team_parallel_env",
    "algorithm.entropy_coeff": 0.03,
    "algorithm.lr": 0.0028,
    "pools.team.model.input_norm": True,
}


# ----- defaults ------------------------------------------------------------------------------
def test_chat_app_without_yaml_resolves_to_the_measured_example() -> None:
    """``marl run examples.supervisor_app:scenario --train supervisor`` (no YAML) gets the
    algorithm the example was measured with (its YAML before #44 spelled it out)."""
    pytest.importorskip("transformers")
    from trainers.cli import _experiment

    bare = _experiment(None, None, {"scenario": "examples.supervisor_app:scenario",
                                    "train": ["supervisor"]})  # fmt: skip
    example = _experiment(EXAMPLES / "supervisor_app.yaml", None, {})
    schedule = GRPOSettings(group_size=8, groups_per_iteration=8)
    measured = GRPOAlgo(lr=3e-4, num_epochs=1, grpo=schedule)
    assert bare.algorithm == example.algorithm == measured
    assert bare.credit != example.credit  # what the example adds: Shapley credit, its pools


def test_spread_config_is_the_headline_experiment() -> None:
    """``examples/spread_mappo.yaml`` is the experiment of the −144.4 arm, and MAPPO's defaults
    are its algorithm (the YAML names only ``MAPPO``)."""
    from experiments.spread_mappo import config

    shipped = ExperimentConfig.from_yaml(EXAMPLES / "spread_mappo.yaml")
    headline = config("MAPPO", 0, 500_000, SPREAD_HEADLINE)
    for field in ("scenario", "scenario_kwargs", "sharing", "pools", "algorithm", "credit",
                  "resources", "budget", "seed", "episodes", "rewards"):  # fmt: skip
        assert getattr(shipped, field) == getattr(headline, field), field
    assert shipped.algorithm == MAPPOAlgo()
    assert "algorithm: MAPPO\n" in (EXAMPLES / "spread_mappo.yaml").read_text()


# ----- prompt budgets ------------------------------------------------------------------------
def test_fit_prompt_keeps_the_system_prompt() -> None:
    from marl_agents.llm.prompt_fit import fit_prompt

    ids = list(range(20))
    assert fit_prompt(ids, 20, head=5) == ids  # fits: whole
    assert fit_prompt(ids, 10, head=5) == [0, 1, 2, 3, 4, 15, 16, 17, 18, 19]
    assert fit_prompt(ids, 10, head=0) == ids[10:]  # no system message: the newest
    assert fit_prompt(ids, 10, head=8) == ids[10:]  # over 3/4 of the budget: the newest


def _tutorial(**kwargs: object) -> object:
    """LangGraph's supervisor tutorial as written, at ChatAppScenario's defaults."""
    from marl_agents.llm.chat_app import ChatAppScenario
    from tests.apps import supervisor_tutorial as st

    return ChatAppScenario(st.build, tasks=st.TASKS, verifier=st.first_route_right, **kwargs)


def test_system_prompt_cut_is_a_warning_naming_agent_and_lengths() -> None:
    """The tutorial's system prompt (instructions + the Router schema, 384 tiny tokens) fits
    the default budget; at 256 tokens a cut would remove it: a warning names it (the trial
    episode stops at the app's error on the empty default reply, after the first call)."""
    pytest.importorskip("transformers")
    from trainers.budgets import system_prompt_warnings

    assert system_prompt_warnings(_tutorial()) == []
    (line,) = system_prompt_warnings(_tutorial(max_prompt_tokens=256))
    assert line.startswith("agent 'supervisor': its system prompt is 384 tokens, more than 75% "
                           "of max_prompt_tokens=256, and a prompt 415 tokens"), line  # fmt: skip
    assert "raise max_prompt_tokens to ≥ 415" in line


def test_chat_prompt_keeps_system_message_and_last_turn() -> None:
    """A chat cut by the rule: the system message's tokens, then the newest tokens; the
    dropped ones are the oldest turn's."""
    pytest.importorskip("transformers")
    from marl_agents.llm.prompt_fit import fit_chat_prompt
    from scenarios.text_space import encode_prompt, make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    chat = [
        {"role": "system", "content": "Route the task."},
        {"role": "user", "content": "x" * 80},
        {"role": "user", "content": "Write a sort function."},
    ]
    ids = encode_prompt(tok, chat)
    kept = fit_chat_prompt(tok, chat, ids, len(ids) - 60, agent="a")
    text = tok.decode(kept)
    assert len(kept) == len(ids) - 60
    assert text.startswith("<|im_start|>system\nRoute the task.") and text.endswith(
        "Write a sort function.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_prompt_over_the_pools_context_is_an_error_before_ray() -> None:
    """A prompt budget over the tiny model's 1,024 tokens is an error; prompt + reply over it
    a warning."""
    pytest.importorskip("transformers")
    from trainers.plan import resolve

    def plan(prompt: int) -> object:
        kwargs = {"max_prompt_tokens": prompt, "max_new_tokens": 64}
        cfg = ExperimentConfig(scenario="tests.apps.router:app", scenario_kwargs=kwargs)
        return resolve(cfg, ray_workers=False, text_defaults=True)

    with pytest.raises(ConfigError, match=r"pool 'orchestrator': model 'tiny' has a context of "
                       r"1024 tokens, but prompts may be 2000 tokens: lower max_prompt_tokens to "
                       r"≤ 960 \(scenario_kwargs.max_prompt_tokens"):  # fmt: skip
        plan(2000)
    lines = plan(1000).prompt_warnings  # type: ignore[attr-defined]
    assert [ln.split(":")[0] for ln in lines] == ["pool 'orchestrator'", "pool 'worker'"]
    assert "a 1000-token prompt plus a 64-token reply is 1064" in lines[0], lines
    assert plan(512).prompt_warnings == []  # type: ignore[attr-defined]


# ----- cost ----------------------------------------------------------------------------------
def test_cost_lines_name_the_knobs_of_a_slow_iteration() -> None:
    """The issue's first iteration: 505 s, 425 s of it learning, GRPO at 6 epochs."""
    from types import SimpleNamespace

    from trainers.run.cost import cost_lines

    row = {"charts/iteration": 1, "charts/iteration_s": 505.0, "timers/learn_s": 425.0,
           "timers/env_s": 30.0, "timers/forward_s": 40.0}  # fmt: skip
    cfg = ExperimentConfig(algorithm=GRPOAlgo(num_epochs=6))
    plan = SimpleNamespace(pools={})
    lines = cost_lines(row, cfg, plan)
    assert lines[0].startswith("iteration 1: 505.0 s — learn 425.0 s (84%), forward 40.0 s")
    assert any("algorithm.num_epochs=6" in ln and "GRPO's default: 1" in ln for ln in lines)
    assert any("64 episodes an iteration (algorithm.grpo.group_size=8" in ln for ln in lines)
    assert not any("max_supersteps" in ln for ln in lines)
    limited = cost_lines({**row, "charts/limit_rate": 0.33, "charts/episode_len": 32.5}, cfg, plan)
    assert any(ln.endswith("caps what such an episode costs") and "33% of the episodes" in ln
               for ln in limited)  # fmt: skip
    fast = {**row, "charts/iteration_s": 5.0, "timers/learn_s": 4.0}
    assert len(cost_lines(fast, cfg, plan)) == 1  # not slow: where the time went, no warning


# ----- outputs -------------------------------------------------------------------------------
def test_eval_covers_a_task_list_round_robin() -> None:
    pytest.importorskip("transformers")
    from tests.apps.router import TASKS, app
    from trainers.evaluate import episode_seeds

    scenario = app()
    picked = episode_seeds(scenario, 1_000_000, 7)
    assert [t for _, t in picked] == [0, 1, 0, 1, 0, 1, 0]
    seeds = [s for s, _ in picked]
    assert len(set(seeds)) == 7 and min(seeds) >= 1_000_000
    assert all(scenario.task_index(s) == t for s, t in picked)
    assert len(TASKS) == 2


def test_eval_breaks_results_down_per_task() -> None:
    pytest.importorskip("transformers")
    from trainers.evaluate import EvalResult, _headline
    from trainers.plan import resolve

    plan = resolve(ExperimentConfig(scenario="tests.apps.router:app"), ray_workers=False,
                   text_defaults=True)  # fmt: skip
    records = [{"task": t, "return": r, "success": float(r > 0), "metrics": {}}
               for t, r in ((0, 1.0), (1, 0.0), (0, 0.0), (1, 0.0))]  # fmt: skip
    result = EvalResult(records, {"success": 0.25, "return": 0.25}, {})
    _headline(result, plan.cfg, plan, plan.env.build_scenario())
    assert [(r["task"], r["episodes"], r["return"], r["success"]) for r in result.per_task] == [
        ("write in small letters", 2, 0.5, 0.5),
        ("WRITE IN CAPITALS!", 2, 0.0, 0.0),
    ]


def test_simple_spread_rows_have_epymarl_return_and_no_success() -> None:
    from trainers.plan import resolve
    from trainers.signals.headline import EPYMARL_KEY, finish_row

    cfg = ExperimentConfig.from_yaml(EXAMPLES / "spread_mappo.yaml")
    plan = resolve(cfg, ray_workers=False)
    assert not plan.has_success
    row = {"charts/team_return": -33.3, "charts/success": 0.0, "charts/sum_return": -100.0,
           "charts/steps": 25.0}  # fmt: skip
    finish_row(row, cfg, plan)
    assert "charts/success" not in row and row[EPYMARL_KEY] == -275.0


# ----- the real CLI, not a terminal ----------------------------------------------------------
TINY = """\
topology: star:2
algorithm: {train_batch_size: 128, minibatch_size: 64, num_epochs: 1}
resources: {num_envs_per_env_runner: 2}
output: {checkpoint_every: 0, plot: false}
"""


def test_cli_plain_lines_and_sigterm_checkpoint(tmp_path: Path) -> None:
    """``marl run`` into a pipe prints one plain line per iteration (flushed); SIGTERM after
    the first stops it after an iteration with a checkpoint; best and final agree."""
    import os
    import threading

    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env.update(PYTHONPATH=str(ROOT), PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    args = [sys.executable, "-m", "trainers.cli", "run", "delegate", "--config", str(config)]
    args += ["--iterations", "200", "--output", str(tmp_path / "out"), "--wandb", "disabled"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "".join(lines)
        lines.append(line)
        if line.startswith("iteration 1/200 · env steps "):
            break
    proc.send_signal(signal.SIGTERM)
    # read the rest from the same buffered pipe: communicate(timeout=...) reads the raw fd and
    # would lose what readline() already buffered (the cost line right after iteration 1's)
    watchdog = threading.Timer(300, proc.kill)  # a run that ignores SIGTERM fails, not hangs
    watchdog.start()
    try:
        rest = proc.stdout.read()
    finally:
        watchdog.cancel()
    proc.wait(timeout=30)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out[-3000:]
    plain = [ln for ln in out.splitlines() if ln.startswith("iteration ") and "/200 · " in ln]
    assert plain and plain[0].endswith("s/iteration") and "return " in plain[0], out[-3000:]
    assert any(ln.startswith("iteration 1: ") for ln in out.splitlines()), out[-3000:]
    (run,) = list((tmp_path / "out").iterdir())
    rows = (run / "metrics.jsonl").read_text().splitlines()
    assert (run / "checkpoint" / "algorithm_state.pkl").exists()
    assert 1 <= len(rows) < 200 and len(plain) == len(rows)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_checkpoint"] == summary["final_checkpoint"]
    assert summary["best_return"] == summary["final_return"] is not None
