"""A constraint belongs to its call, not to its prompt ids (issue #42 item 1).

One agent asked twice with the same messages, forcing a different tool each time
(``tests/apps/two_tools.py``; its prompt is cut to 48 tokens, so the bound tools' descriptions
are not even in it): GRPO trains on it with no failed episode, on both samplers, and every
reply calls the tool its own call forced. The run is then served (``marl serve``) and the
official ``openai`` client sends the same messages forcing one tool, then the other, then a
``response_format`` whose shortest reply does not fit the agent's ``max_new_tokens`` (a 400
naming the agent, the schema, its shortest length and the budget to set).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("transformers")
pytest.importorskip("openai")

import openai

from tests.apps.two_tools import GoLeft, GoRight


def two_tools_config(tmp: Path, sampler: str) -> Any:
    from configs import grpo_app_config

    llm = {"type": "llm", "path": "tiny", "temperature": 1.0}
    return grpo_app_config(
        tmp,
        "tests.apps.two_tools:scenario",
        {"picker": {"agents": ["picker"], "model": llm}},
        ["picker"],
        episodes={"sampler": sampler},
        budget={"iterations": 1},
        output={"dir": str(tmp / "runs"), "checkpoint_every": 1, "plot": False},
    )


@pytest.fixture(scope="module")
def run_dir(ray_session: Any, tmp_path_factory: Any) -> Path:
    """The two-tools app trained one GRPO iteration with the batched sampler."""
    from trainers.run.loop import train

    result = train(two_tools_config(tmp_path_factory.mktemp("two_tools"), "batched"))
    assert result.status == "completed", result.status
    [row] = result.history
    assert row["charts/episodes"] > 0 and row["charts/error_rate"] == 0
    assert row["charts/success"] == 1.0  # every call is the tool it forced
    return Path(result.run_dir)


def test_same_messages_forcing_two_tools_train_on_the_batched_sampler(run_dir):
    assert (run_dir / "metrics.jsonl").exists()


def test_same_messages_forcing_two_tools_train_on_rllibs_sampler(ray_session, tmp_path):
    from trainers.run.loop import train

    result = train(two_tools_config(tmp_path, "rllib"))
    assert result.status == "completed", result.status
    [row] = result.history
    assert row["charts/error_rate"] == 0 and row["charts/success"] == 1.0


@pytest.fixture(scope="module")
def served(run_dir: Path) -> Any:
    from trainers.serve import serve

    s = serve(run_dir, greedy=False)
    yield s
    s.stop()


def tool(model: type) -> dict[str, Any]:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    return convert_to_openai_tool(model)


def test_the_endpoint_answers_the_same_messages_under_each_forced_tool(served):
    client = openai.OpenAI(base_url=served.base_url, api_key=served.key, max_retries=0)
    messages = [{"role": "user", "content": "step once"}]
    tools = [tool(GoLeft), tool(GoRight)]
    for _ in range(3):  # alternating, on one server: no call inherits another's constraint
        for name in ("GoLeft", "GoRight"):
            reply = client.chat.completions.create(
                model="picker",
                messages=messages,
                tools=tools,
                tool_choice={"type": "function", "function": {"name": name}},
            )
            [call] = reply.choices[0].message.tool_calls
            assert call.function.name == name
            assert reply.choices[0].finish_reason == "tool_calls"
    free = client.chat.completions.create(model="picker", messages=messages)
    assert not free.choices[0].message.tool_calls  # the same prompt, free: no grammar


def test_a_schema_that_cannot_close_in_the_budget_is_a_400_naming_the_fix(served):
    client = openai.OpenAI(base_url=served.base_url, api_key=served.key, max_retries=0)
    wide = {
        "type": "object",
        "properties": {f"field_{i}": {"type": "boolean"} for i in range(8)},
        "required": [f"field_{i}" for i in range(8)],
    }
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="picker",
            messages=[{"role": "user", "content": "fill it"}],
            response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": wide}},
        )
    text = str(err.value)
    assert "agent 'picker'" in text and '"field_0":{"type":"boolean"' in text  # the schema
    found = re.search(r"needs (\d+) tokens of this tokenizer", text)
    assert found and int(found.group(1)) > 40, text  # its shortest length
    assert f"max_new_tokens=40: set the agent's max_new_tokens >= {found.group(1)}" in text


def test_evaluation_samples_each_call_under_its_own_constraint(run_dir):
    """``marl eval``'s policy (``TeamPolicy``) reads the constraint off the observation too."""
    from marl_agents.llm.constraints import Constraint, with_constraint
    from scenarios.toolcalls import parse_tool_calls
    from trainers.evaluate import load_team

    _, _, policy = load_team(run_dir)
    module = policy.modules[policy.agent_to_pool["picker"]]
    ids = module.tokenizer("step once")["input_ids"]
    obs = module.spaces.encode_prompt(ids)
    tools = [tool(GoLeft), tool(GoRight)]
    for name in ("GoRight", "GoLeft"):
        call = with_constraint(obs, Constraint.for_call(tools, name))
        action = policy.act({"picker": call})["picker"]
        ids = module.spaces.decode_action(action)
        text = module.tokenizer.decode(ids, skip_special_tokens=True)
        [parsed] = parse_tool_calls(text, ["GoLeft", "GoRight"]).tool_calls
        assert parsed.name == name
