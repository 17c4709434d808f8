"""Replies that always close (issue #42 item 2; :mod:`marl_agents.llm.closing`).

With the tiny model built in code: a constrained reply ends as a complete, parseable value
within ``max_new_tokens`` even where a byte-by-byte tokenisation of the same value would not
fit the budget (many sampled replies, each parses); a budget below the schema's shortest reply
is refused naming the agent, the schema, its shortest length and the ``max_new_tokens`` to
set; a token forced by the budget (its mask the closing mask, narrower than the grammar's) is
scored by the learner as the sampler drew it; a structured reply cut anyway names the cause.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import numpy as np
import pytest
import torch

pytest.importorskip("xgrammar")
pytest.importorskip("transformers")

from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from marl_agents.llm.backend import SamplingParams
from marl_agents.llm.constraints import (
    Constraint,
    ReplyBudgetError,
    check_reply_budget,
    shortest_reply_tokens,
)
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.llm.tiny import make_tiny_model
from scenarios.toolcalls import parse_tool_calls

AGREEMENT_TOL = 1e-4
ROWS = 24


class Router(TypedDict):
    """Worker to route to next. If no workers needed, route to FINISH."""

    next: Literal["researcher", "coder", "FINISH"]


class Query(BaseModel):
    """Search the web."""

    query: str


class Plan(BaseModel):
    """A plan."""

    steps: list[Literal["search", "code", "ask"]] = Field(max_length=3)
    count: int = Field(ge=0, le=9)


CONSTRAINTS = {
    "forced enum call": Constraint.for_call([convert_to_openai_tool(Router)], "any"),
    "forced string call": Constraint.for_call([convert_to_openai_tool(Query)], "any"),
    "JSON plan": Constraint.for_call(response_format=Plan),
    "any JSON object": Constraint.for_call(response_format={"type": "json_object"}),
}


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return make_tiny_model(seed=0)


def shortest(tiny: Any, constraint: Constraint) -> int:
    tok, model = tiny
    n = shortest_reply_tokens(tok, model.config.vocab_size, constraint, [tok.eos_token_id])
    assert n is not None
    return n


def parses(constraint: Constraint, text: str) -> bool:
    if constraint.kind == "json":
        try:
            json.loads(text)
        except ValueError:
            return False
        return True
    names = [s["name"] for s in json.loads(constraint.spec)]
    parsed = parse_tool_calls(text, names)
    return parsed.format_ok and len(parsed.tool_calls) == 1 and not parsed.content.strip()


@pytest.mark.parametrize("name", list(CONSTRAINTS))
@pytest.mark.parametrize("slack", [0, 3])
def test_every_sampled_reply_closes_within_the_budget(tiny, name, slack):
    tok, model = tiny
    constraint = CONSTRAINTS[name]
    budget = shortest(tiny, constraint) + slack
    torch.manual_seed(slack)
    prompts = [tok(f"Task {i}: answer.")["input_ids"] for i in range(ROWS)]
    params = SamplingParams(temperature=1.0, max_new_tokens=budget, constraint=constraint)
    gens = HFBackend(model, tok).generate(prompts, params)
    for g in gens:
        assert len(g.token_ids) <= budget
        assert parses(constraint, g.text), (name, budget, g.text)
    if name == "forced enum call":  # the same value, one byte a token, would not fit
        assert min(len(g.text.encode()) for g in gens) > budget


def test_the_shortest_reply_is_the_fewest_tokens_of_this_tokenizer(tiny):
    tok, _ = tiny
    constraint = CONSTRAINTS["forced enum call"]
    n = shortest(tiny, constraint)
    # the shortest reply is one of the three routes, tokenised as the tokenizer would at best
    routes = [f'<tool>{{"name": "Router", "arguments": {{"next": "{r}"}}}}</tool>' for r in
              ("researcher", "coder", "FINISH")]  # fmt: skip
    assert n <= min(len(tok(r, add_special_tokens=False)["input_ids"]) for r in routes)
    assert n > 1
    assert shortest(tiny, CONSTRAINTS["any JSON object"]) == len(tok("{}")["input_ids"])


def test_a_budget_below_the_shortest_reply_is_refused_naming_the_fix(tiny):
    tok, model = tiny
    constraint = CONSTRAINTS["forced enum call"]
    n = shortest(tiny, constraint)
    args = (tok, model.config.vocab_size, [tok.eos_token_id])
    check_reply_budget("supervisor", constraint, args[0], args[1], args[2], n)  # fits
    with pytest.raises(ReplyBudgetError) as err:
        check_reply_budget("supervisor", constraint, args[0], args[1], args[2], n - 1)
    text = str(err.value)
    assert text.startswith("agent 'supervisor': its forced call of tool Router (schema ")
    assert f"needs {n} tokens of this tokenizer at its shortest" in text
    assert f"max_new_tokens={n - 1}: set the agent's max_new_tokens >= {n}" in text


def test_a_budget_forced_token_is_scored_by_the_learner_as_the_sampler_drew_it(tiny):
    """With the budget at the shortest reply, some tokens are drawn under the closing mask
    (narrower than the grammar's); the learner's logprob of each equals the sampler's."""
    from llm_modules import module_spec
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.constraints import constraint_keys, replay_masks, with_constraint
    from marl_agents.llm.rl_module import CONSTRAINT_KEY, TOKEN_LOGP, TOKEN_MASK
    from scenarios.text_space import TextSpaces

    tok, _ = tiny
    constraint = CONSTRAINTS["forced enum call"]
    n = shortest(tiny, constraint)
    spaces = TextSpaces.for_tokenizer(tok, max_prompt_tokens=16, max_new_tokens=n)
    module = module_spec(spaces, temperature=0.8).build()
    rows = [with_constraint(spaces.encode_prompt(tok(f"go {i}")["input_ids"]), constraint)
            for i in range(8)]  # fmt: skip
    batch = {
        Columns.OBS: torch.as_tensor(np.stack(rows)),
        CONSTRAINT_KEY: torch.from_numpy(constraint_keys(rows)),
    }
    torch.manual_seed(0)
    with torch.no_grad():
        batch.update(module.forward_exploration(batch))
    vocab = int(module.model.config.vocab_size)
    forced = torch.zeros(batch[TOKEN_MASK].shape[:2], dtype=torch.bool)
    for r, ids in enumerate(module.completions(batch[Columns.ACTIONS])):
        assert parses(constraint, tok.decode(ids, skip_special_tokens=True))
        grammar = replay_masks(tok, vocab, constraint, ids, [tok.eos_token_id])
        sampled = batch[TOKEN_MASK][r, : len(ids)].numpy()
        forced[r, : len(ids)] = torch.from_numpy((grammar != sampled).any(-1))
    assert forced.any()  # the budget narrowed some masks
    train = module.forward_train(dict(batch))[TOKEN_LOGP].detach()
    gap = (train - batch[TOKEN_LOGP]).abs()[forced]
    assert float(gap.max()) < AGREEMENT_TOL
    # under the grammar's mask alone those tokens would score otherwise: the closing mask counts
    loose = dict(batch)
    loose[TOKEN_MASK] = batch[TOKEN_MASK].clone()
    for r, ids in enumerate(module.completions(batch[Columns.ACTIONS])):
        grammar = replay_masks(tok, vocab, constraint, ids, [tok.eos_token_id])
        loose[TOKEN_MASK][r, : len(ids)] = torch.from_numpy(grammar)
    other = module.forward_train(loose)[TOKEN_LOGP].detach()
    assert float((other - batch[TOKEN_LOGP]).abs()[forced].max()) > 1e-3


def test_a_structured_reply_cut_at_the_budget_names_the_cause(tiny):
    from marl_agents.llm.backend import Generation
    from marl_agents.llm.chat_model import LLMStep
    from marl_agents.llm.env_chat_model import EnvChatModel
    from scenarios.text_space import TextSpaces

    tok, _ = tiny
    chat = EnvChatModel(tokenizer=tok, spaces=TextSpaces.for_tokenizer(tok, 16, 24))

    def step(text: str, reason: str = "length") -> LLMStep:
        gen = Generation([1], [2] * 24, [0.0] * 24, text, finish_reason=reason)
        parsed = parse_tool_calls(text, ["Router"])
        return LLMStep("a", gen, parsed.tool_calls, parsed.format_ok, parsed.errors, [])

    forced = CONSTRAINTS["forced enum call"]
    cut = '<tool>{"name": "Router", "arguments": {"next": "FI'
    why = chat.cut_reply(forced, step(cut), cut)
    assert why is not None and why.startswith("reply cut at max_new_tokens=24 before its ")
    assert "forced call of tool Router" in why and "raise the agent's max_new_tokens" in why
    assert chat.cut_reply(CONSTRAINTS["JSON plan"], step('{"steps": ['), '{"steps": [') is not None
    assert chat.cut_reply(forced, step(cut, "stop"), cut) is None  # not cut by the budget
    assert chat.cut_reply(None, step("free text"), "free text") is None  # free stays free
    optional = Constraint.for_call([convert_to_openai_tool(Router)], "auto")
    assert chat.cut_reply(optional, step(cut), cut) is None  # optional calls: a free reply


def test_a_budget_below_the_shortest_reply_is_refused_before_ray_starts(tmp_path):
    """The plan's trial episode (default replies, no Ray) meets the supervisor's
    ``with_structured_output(Router)`` call: a ``max_new_tokens`` under its shortest reply is a
    ``ConfigError`` naming the agent, the schema, its length and the setting."""
    from configs import supervisor_tutorial_config

    from trainers.configs.typed import ConfigError
    from trainers.plan import resolve

    llm = {"type": "llm", "path": "tiny"}
    cfg = supervisor_tutorial_config(
        tmp_path, llm, {**llm, "tiny_seed": 1}, scenario_kwargs={"max_new_tokens": 16}
    )
    with pytest.raises(ConfigError, match=r"agent 'supervisor': its forced call of tool Router"):
        resolve(cfg, check_prompts=True)
    with pytest.raises(ConfigError, match=r"max_new_tokens=16: set the agent's max_new_tokens >= "):
        resolve(cfg, check_prompts=True)


def test_a_cut_structured_reply_fails_its_episode_naming_the_cause():
    """An engine that does not see the budget (or a policy replayed from elsewhere) may still
    cut a forced call: the episode's error says so (what RunFailed and the transcripts show),
    not the app's ``'NoneType' object is not subscriptable``; each observation carried its own
    call's constraint (GoLeft, then GoRight, on the same prompt ids)."""
    from episodes import play

    from marl_agents.llm.constraints import constraint_of
    from scenarios.graph_env import GraphEnv
    from tests.apps.two_tools import app

    sc = app()
    seen = []

    def cut(agent: str, observation: Any) -> Any:  # a call's first 40 tokens, no EOS
        seen.append(constraint_of(observation))
        text = '<tool>{"name": "GoLeft", "arguments": {"steps": 1' + " " * 80
        return sc.spaces.encode_action(sc.tokenizer(text)["input_ids"][:40])

    env = GraphEnv(sc)
    play(env, 0, cut)
    assert env.failure == "error"
    assert "reply cut at max_new_tokens=40 before its forced call of tool GoLeft" in env.error
    names = [json.loads(c.spec)[0]["name"] for c in seen]
    assert names == ["GoLeft"]  # the episode stopped at the cut call
    full = '<tool>{"name": "GoLeft", "arguments": {"steps": 1}}</tool>'
    replies = iter([full, full.replace("GoLeft", "GoRight")])
    seen.clear()

    observed = []

    def whole(agent: str, observation: Any) -> Any:
        seen.append(constraint_of(observation))
        observed.append(np.asarray(observation).copy())
        ids = sc.tokenizer(next(replies))["input_ids"] + [sc.tokenizer.eos_token_id]
        return sc.spaces.encode_action(ids)

    play(env, 0, whole)
    assert env.failure is None and env.outcome.success
    assert [json.loads(c.spec)[0]["name"] for c in seen] == ["GoLeft", "GoRight"]
    assert np.array_equal(*observed)  # the same prompt ids, two constraints


def test_the_endpoint_returns_a_cut_forced_call_as_length_without_markup():
    """Through the gateway a cut structured reply is OpenAI's ``finish_reason: "length"``
    with no ``tool_calls`` and no internal ``<tool>`` markup in its content, not an error."""
    from marl_agents.gateway.protocol import chat_response, parse_chat
    from marl_agents.gateway.standalone import ServedTeam
    from tests.apps.two_tools import GoRight, app

    sc = app()

    def cut(agent: str, observation: Any) -> Any:  # a call's first 40 tokens, no EOS
        text = '<tool>{"name": "GoRight", "arguments": {"steps": 1' + " " * 80
        return sc.spaces.encode_action(sc.tokenizer(text)["input_ids"][:40])

    team = ServedTeam({"picker": sc.models["picker"]}, cut, truncate_prompts=True)
    go_right = convert_to_openai_tool(GoRight)
    request = parse_chat(
        {
            "model": "picker",
            "messages": [{"role": "user", "content": "step once"}],
            "tools": [go_right],
            "tool_choice": {"type": "function", "function": {"name": "GoRight"}},
        }
    )
    body = chat_response(request, team.ask(request))
    [choice] = body["choices"]
    assert choice["finish_reason"] == "length"
    assert not choice["message"].get("tool_calls")
    assert "<tool>" not in (choice["message"]["content"] or "")
