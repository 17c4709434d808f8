"""LangGraph tutorials with the budgets a user sets (issue #42 item 5; slow).

The supervisor tutorial (``with_structured_output(Router)``, workers from
``create_react_agent``) with ``max_prompt_tokens`` 256 — where, cut, two agents' prompts can be
the same ids under different schemas — and a ``max_new_tokens`` its Router reply fits in at
its shortest (29 tokens of the tiny tokenizer), including 32, just over it; and
plan-and-execute (``with_structured_output(Plan)`` / ``(Act)``, shortest replies 28 and 32
tokens) at 256 / 40. Each trains 2 iterations with no failed episode: every structured reply
closes within its budget and parses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("transformers")

LLM = {"type": "llm", "path": "tiny", "temperature": 1.0}


def trains_without_errors(cfg: Any) -> None:
    from trainers.run.loop import train

    result = train(cfg)
    assert result.status == "completed", result.status
    assert [h["charts/iteration"] for h in result.history] == [1, 2]
    for h in result.history:
        assert h["charts/episodes"] > 0 and h["charts/error_rate"] == 0, h


@pytest.mark.slow
@pytest.mark.parametrize("max_new_tokens", [32, 48])
def test_supervisor_tutorial_trains_with_the_budgets_a_user_sets(
    ray_session, tmp_path: Path, max_new_tokens: int
):
    from configs import supervisor_tutorial_config

    trains_without_errors(
        supervisor_tutorial_config(
            tmp_path,
            LLM,
            {**LLM, "tiny_seed": 1},
            scenario_kwargs={"max_prompt_tokens": 256, "max_new_tokens": max_new_tokens},
        )
    )


@pytest.mark.slow
def test_plan_and_execute_trains_with_the_budgets_a_user_sets(ray_session, tmp_path: Path):
    from configs import grpo_app_config

    trains_without_errors(
        grpo_app_config(
            tmp_path,
            "tests.apps.plan_execute:scenario",
            {
                "planners": {"agents": ["planner", "replanner"], "model": LLM},
                "executor": {"agents": ["executor"], "model": {**LLM, "tiny_seed": 1}},
            },
            ["planners"],
            scenario_kwargs={"max_prompt_tokens": 256, "max_new_tokens": 40},
        )
    )
