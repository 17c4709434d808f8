"""Constrained decoding from what the app declares (:mod:`marl_agents.llm.constraints`).

With the tiny model built in code: every sample parses for a ``Literal`` enum, nested
objects, arrays, JSON replies and tool calls with arguments; a free reply stays free; the
constrained logprobs are those of the masked, renormalised distribution (the mask recomputed
by hand on the 384-token vocabulary); the learner scores under the same masks (ratio 1 on the
first epoch); and LangGraph's supervisor tutorial (``with_structured_output(Router)``) runs
and trains as written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch
from episodes import play

pytest.importorskip("xgrammar")
pytest.importorskip("transformers")

from configs import supervisor_tutorial_config
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from marl_agents.llm.backend import SamplingParams
from marl_agents.llm.chat_model import PolicyChatModel
from marl_agents.llm.constraints import Constraint, constraint_keys, unpack_mask
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.llm.tiny import make_tiny_model

TEMPERATURE = 0.8
AGREEMENT_TOL = 1e-4


class Router(TypedDict):
    """Worker to route to next. If no workers needed, route to FINISH."""

    next: Literal["researcher", "coder", "FINISH"]


class Inner(BaseModel):
    level: Literal["low", "high"]
    ok: bool


class Plan(BaseModel):
    """A plan."""

    steps: list[Literal["search", "code", "ask"]] = Field(max_length=3)
    inner: Inner
    count: int = Field(ge=0, le=9)


class Add(BaseModel):
    """Add two numbers."""

    a: int = Field(ge=0, le=99)
    b: int = Field(ge=0, le=99)


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return make_tiny_model(seed=0)


@pytest.fixture(scope="module")
def chat(tiny) -> PolicyChatModel:
    tok, model = tiny
    return PolicyChatModel(
        backend=HFBackend(model, tok),
        params=SamplingParams(temperature=TEMPERATURE, max_new_tokens=128),  # a whole Plan fits
    )


N = 6  # samples per schema


def test_every_structured_output_sample_parses(chat):
    torch.manual_seed(0)
    for _ in range(N):
        routed = chat.with_structured_output(Router).invoke("route this")
        assert routed["next"] in ("researcher", "coder", "FINISH")
        plan = chat.with_structured_output(Plan).invoke("plan this")
        assert isinstance(plan, Plan) and len(plan.steps) <= 3  # nested object, array
        schema = chat.with_structured_output(Plan.model_json_schema()).invoke("as a dict")
        assert Plan.model_validate(schema)  # a JSON-schema dict


def test_every_forced_tool_call_has_its_declared_arguments(chat):
    torch.manual_seed(1)
    model = chat.bind_tools([Add], tool_choice="any")
    for _ in range(N):
        reply = model.invoke("add 1 and 2")
        assert reply.response_metadata["format_ok"]
        [call] = reply.tool_calls
        assert call["name"] == "Add" and set(call["args"]) == {"a", "b"}
        assert all(0 <= v <= 99 for v in call["args"].values())


def test_optional_tools_parse_and_free_replies_stay_free(chat, tiny):
    torch.manual_seed(2)
    optional = chat.bind_tools([Add])
    assert all(optional.invoke("maybe add").response_metadata["format_ok"] for _ in range(N))
    tok, _ = tiny
    before = len(chat.recorder)
    chat.invoke("just talk")  # nothing declared: no mask, the model's own distribution
    [step] = chat.recorder.steps()[before:]
    assert step.generation.token_masks is None


def test_a_json_response_format_parses(chat):
    torch.manual_seed(3)
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "Inner", "schema": Inner.model_json_schema()},
    }
    for _ in range(N):
        reply = chat.bind(response_format=fmt).invoke("json please")
        assert Inner.model_validate_json(reply.content)


def test_constrain_off_declares_nothing(tiny):
    tok, model = tiny
    free = PolicyChatModel(backend=HFBackend(model, tok), constrain="off")
    assert free.constraint_of([{"function": {"name": "x"}}], {"tool_choice": "any"}) is None


def test_a_constraint_travels_with_its_observation_not_its_prompt_ids():
    """The same prompt ids with a schema, with another and with none are three decisions:
    each observation carries its own call's constraint (nothing keyed by the ids)."""
    import pickle

    from langchain_core.utils.function_calling import convert_to_openai_tool

    from marl_agents.llm.constraints import constraint_of, keyed_constraint, with_constraint

    ids = np.arange(7, 19)
    router = Constraint.for_call([convert_to_openai_tool(Router)], "any")
    plan = Constraint.for_call(response_format=Plan)
    a, b, free = (
        with_constraint(ids, router),
        with_constraint(ids, plan),
        with_constraint(ids, None),
    )
    assert (constraint_of(a), constraint_of(b), constraint_of(free)) == (router, plan, None)
    assert np.array_equal(a, b) and np.array_equal(a, ids)
    keys = constraint_keys([a, free, b, a])
    assert [keyed_constraint(k) for k in keys] == [router, None, plan, router]
    assert constraint_keys([free, ids]) is None  # no column when no row is constrained
    assert constraint_of(a.copy()) == router  # a copy is still the call's (RLlib copies)
    # arrays of another shape and pickles carry none (a stacked batch is not one call's)
    assert constraint_of(np.stack([a, b])) is None and constraint_of(a[None]) is None
    assert constraint_of(pickle.loads(pickle.dumps(a))) is None


# ----- log-probabilities ---------------------------------------------------------------------
ROUTER_PREFIX = '<tool>{"name": "Router", "arguments": {"next": "'


def hand_mask(tok: Any, vocab: int, continuations: list[str]) -> torch.Tensor:
    """Tokens whose text starts one of ``continuations`` (no special tokens): by hand."""
    allowed = torch.zeros(vocab, dtype=torch.bool)
    for t in range(vocab):
        if t in tok.all_special_ids:
            continue
        text = tok.decode([t])
        allowed[t] = bool(text) and any(c.startswith(text) for c in continuations)
    return allowed


def test_constrained_logprobs_are_the_masked_distributions(tiny):
    from langchain_core.utils.function_calling import convert_to_openai_tool

    tok, model = tiny
    vocab = int(model.config.vocab_size)
    tools = [convert_to_openai_tool(Router)]
    constraint = Constraint.for_call(tools, "any", prefix=ROUTER_PREFIX)
    prompt = tok("Route: ", add_special_tokens=False)["input_ids"]
    params = SamplingParams(
        temperature=TEMPERATURE, max_new_tokens=40, seed=5, constraint=constraint
    )
    [gen] = HFBackend(model, tok).generate([prompt], params)
    text = ROUTER_PREFIX + gen.text
    assert json.loads(text[len("<tool>") : -len("</tool>")])["arguments"]["next"] in (
        "researcher",
        "coder",
        "FINISH",
    )
    masks = unpack_mask(torch.as_tensor(gen.token_masks), vocab)
    # the first token's mask, by hand: what starts a value of the Literal and its closing text
    ends = [f'{v}"}}}}</tool>' for v in ("researcher", "coder", "FINISH")]
    assert torch.equal(masks[0], hand_mask(tok, vocab, ends))
    # every token's logprob: log softmax(logits / T) over the allowed tokens only, by hand
    with torch.no_grad():
        logits = model(torch.tensor([prompt + gen.token_ids])).logits[0].float()
    steps = logits[len(prompt) - 1 : len(prompt) + len(gen.token_ids) - 1] / TEMPERATURE
    for k, token in enumerate(gen.token_ids):
        allowed = masks[k]
        assert allowed[token]
        z = steps[k][allowed]
        want = float(steps[k][token] - torch.logsumexp(z, dim=0))
        assert gen.sampling_logprobs[k] == pytest.approx(want, abs=1e-5)
    # and the teacher-forced recompute with the recorded masks agrees
    again = HFBackend(model, tok).logprobs(
        [prompt], [gen.token_ids], temperature=TEMPERATURE, token_masks=[gen.token_masks]
    )[0]
    np.testing.assert_allclose(again, gen.sampling_logprobs, atol=1e-5)


def engine_constraints() -> list[Constraint]:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    tools = [convert_to_openai_tool(t) for t in (Router, Add)]
    return [
        Constraint.for_call(tools[:1], "any"),  # a Literal router (forced call)
        Constraint.for_call(tools, "any"),  # one of two calls
        Constraint.for_call(tools[1:], None),  # optional call in free text
        Constraint.for_call(response_format=Plan),  # nested object, array
    ]


def test_the_vllm_grammar_is_the_transformers_language(tiny):
    """What the vLLM sampler hands its engine (EBNF text) compiles to the grammar the
    transformers sampler applies: equal masks along random walks through each grammar."""
    import xgrammar as xgr

    from marl_agents.llm.vllm_backend import engine_grammar

    tok, model = tiny
    info = xgr.TokenizerInfo.from_huggingface(
        tok, vocab_size=int(model.config.vocab_size), stop_token_ids=[tok.eos_token_id]
    )
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    rng = np.random.default_rng(0)
    for c in engine_constraints():
        for _ in range(4):
            ours = xgr.GrammarMatcher(compiler.compile_grammar(c.grammar()))
            engine = xgr.GrammarMatcher(compiler.compile_grammar(engine_grammar(c)))
            masks = xgr.allocate_token_bitmask(2, info.vocab_size)
            for _ in range(60):
                if ours.is_terminated():
                    break
                ours.fill_next_token_bitmask(masks, 0)
                engine.fill_next_token_bitmask(masks, 1)
                assert torch.equal(masks[0], masks[1]), c
                token = int(rng.choice(np.flatnonzero(unpack_mask(masks[0], info.vocab_size))))
                assert ours.accept_token(token) and engine.accept_token(token)
            assert engine.is_terminated() == ours.is_terminated()


# ----- the module and the learner ------------------------------------------------------------
@pytest.fixture(scope="module")
def spaces(tiny):
    from scenarios.text_space import TextSpaces

    tok, _ = tiny
    # room for a whole Router call (truncated ones fail to parse)
    return TextSpaces.for_tokenizer(tok, max_prompt_tokens=32, max_new_tokens=72)


def constrained_batch(module: Any, spaces: Any, tok: Any) -> dict[str, torch.Tensor]:
    """Six rows: four declare the Router call (two prompts), two are free."""
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from ray.rllib.core.columns import Columns

    constraint = Constraint.for_call([convert_to_openai_tool(Router)], "any")
    texts = ["route a", "route b", "route a", "route b", "talk c", "talk d"]
    from marl_agents.llm.constraints import with_constraint
    from marl_agents.llm.rl_module import CONSTRAINT_KEY

    rows = [spaces.encode_prompt(tok(t)["input_ids"]) for t in texts]
    rows = [with_constraint(r, constraint) for r in rows[:4]] + rows[4:]
    obs = np.stack(rows)
    keys = torch.from_numpy(constraint_keys(rows))
    torch.manual_seed(0)
    with torch.no_grad():
        out = module.forward_exploration({Columns.OBS: torch.as_tensor(obs), CONSTRAINT_KEY: keys})
    return {Columns.OBS: torch.as_tensor(obs), **out}


def test_module_samples_declared_rows_under_the_mask_and_the_learner_scores_them(spaces, tiny):
    from llm_modules import build_learner
    from ray.rllib.core.columns import Columns
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from marl_agents.llm.rl_module import TOKEN_LOGP, TOKEN_MASK
    from scenarios.toolcalls import parse_tool_calls
    from trainers.grpo.connectors import ADVANTAGES, GRPO_KEEP

    tok, _ = tiny
    learner = build_learner(spaces, trained={"temperature": TEMPERATURE})
    module = learner.module["trained"].unwrapped()
    batch = constrained_batch(module, spaces, tok)
    masks = batch[TOKEN_MASK]
    assert masks.shape == (
        6,
        spaces.max_new_tokens,
        (int(module.model.config.vocab_size) + 31) // 32,
    )
    assert (masks[4:] == -1).all()  # free rows: no mask
    for ids in module.completions(batch[Columns.ACTIONS])[:4]:
        parsed = parse_tool_calls(tok.decode(ids, skip_special_tokens=True), ["Router"])
        assert parsed.format_ok and len(parsed.tool_calls) == 1
    # the training forward scores under the masks: equal to the behaviour logprobs
    own = batch[Columns.ACTIONS] != module.pad_id
    train = module.forward_train(dict(batch))[TOKEN_LOGP].detach()
    assert float((train - batch[TOKEN_LOGP]).abs()[own].max()) < AGREEMENT_TOL
    unmasked = {k: v for k, v in batch.items() if k != TOKEN_MASK}
    loose = module.forward_train(unmasked)[TOKEN_LOGP].detach()
    assert float((loose - batch[TOKEN_LOGP]).abs()[own].max()) > 0.1  # the mask matters
    # the GRPO learner: ratio 1 on the first epoch (no off-policy gap)
    batch[ADVANTAGES] = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    batch[GRPO_KEEP] = torch.ones(6, dtype=torch.bool)
    numpy_batch = {k: v.numpy() for k, v in batch.items()}
    results = learner.update(
        batch=MultiAgentBatch({"trained": SampleBatch(numpy_batch)}, env_steps=6)
    )
    assert results["trained"]["grpo/logprob_gap_fresh"].peek() < AGREEMENT_TOL


def test_constrain_off_samples_free_and_adds_no_column(spaces, tiny):
    from llm_modules import module_spec

    from marl_agents.llm.rl_module import TOKEN_MASK

    tok, _ = tiny
    module = module_spec(spaces, constrain="off").build()
    assert TOKEN_MASK not in constrained_batch(module, spaces, tok)
    with pytest.raises(ValueError, match=r"constrain.*'auto'.*'off'"):
        module_spec(spaces, constrain="maybe").build()


# ----- LangGraph's supervisor tutorial, as written -------------------------------------------
def test_supervisor_tutorial_episodes_parse_on_every_decision_and_reach_the_verifier(tiny):
    """A random tiny router under the Router schema: no routing reply fails to parse (the node
    never raises), episodes that say FINISH reach the verifier; one that loops to the step
    limit is scored on the state it reached (``score_limit``), its routes all valid."""
    from marl_agents.llm.env_chat_model import backend_policy
    from scenarios.graph_env import GraphEnv
    from tests.apps.supervisor_tutorial import MEMBERS, scenario

    tok, model = tiny
    states: list[dict[str, Any]] = []
    sc = scenario(score_limit=True, verifier=lambda state: states.append(state) or True)
    policy = backend_policy(HFBackend(model, tok), sc.spaces, SamplingParams(max_new_tokens=64))
    env = GraphEnv(sc)
    torch.manual_seed(0)
    for seed in range(3):
        play(env, seed, policy)
        assert env.failure in (None, "limit"), env.error  # never "error": every reply parsed
    assert len(states) == 3
    for state in states:
        assert state["routes"] and set(state["routes"]) <= {*MEMBERS, "FINISH"}
    assert any(state["routes"][-1] == "FINISH" for state in states)  # reached the verifier


# RLlib's sampler behind --slow (36 s): the batched default stays in the default suite
@pytest.mark.parametrize("sampler", ["batched", pytest.param("rllib", marks=pytest.mark.slow)])
def test_supervisor_tutorial_trains_two_iterations(ray_session, tmp_path: Path, sampler: str):
    """Constrained routing replies train on both samplers, with no sampler-learner gap."""
    from trainers.run.loop import train

    llm = {"type": "llm", "path": "tiny", "temperature": 1.0}
    cfg = supervisor_tutorial_config(
        tmp_path, llm, {**llm, "tiny_seed": 1}, episodes={"sampler": sampler}
    )
    result = train(cfg)
    assert result.status == "completed", result.status
    assert [h["charts/iteration"] for h in result.history] == [1, 2]
    assert all(h["charts/episodes"] > 0 and h["charts/error_rate"] == 0 for h in result.history)
    gaps = [v for h in result.history for k, v in h.items() if k.endswith("logprob_gap_fresh")]
    assert gaps and max(gaps) < AGREEMENT_TOL, gaps


def test_sampled_strings_stay_well_formed_utf8(tiny):
    """xgrammar lets a JSON string hold any byte sequence of UTF-8's shape; a byte-level
    tokenizer decodes a surrogate (``ED A3 B7``: one character to the grammar) as three
    U+FFFD, so a ``maxLength`` checked after decoding failed (seen in the plan-and-execute
    app). The sampler's masks keep the reply well-formed; a replay of another engine's tokens
    records the grammar's masks alone."""
    from marl_agents.llm.constraints import RowMatchers
    from marl_agents.llm.utf8_rule import malformed

    assert malformed(b"\xed\xa3") and malformed(b"a\xc0") and malformed(b"\xe0\x80")
    assert not malformed(b"\xed\x9f\xbf") and not malformed("é€😀".encode())
    tok, _ = tiny
    vocab = 384
    import xgrammar as xgr

    decoded = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab).decoded_vocab
    byte = {data: i for i, data in enumerate(decoded) if len(data) == 1}
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    c = Constraint.for_call(response_format=schema, prefix='{"s": "')
    stops = [tok.eos_token_id]
    rows = RowMatchers(tok, vocab, [c], stops)
    loose = RowMatchers(tok, vocab, [c], stops, strict_utf8=False)
    # a lead byte 0xED, then 0xA3 (a surrogate: dropped) or 0x80 (U+D000..: kept)
    lead, surrogate, fine = byte[b"\xed"], byte[b"\xa3"], byte[b"\x80"]
    for m in (rows, loose):
        m.accept(0, lead)
    strict_next = unpack_mask(rows.next_masks([False])[0], vocab)
    loose_next = unpack_mask(loose.next_masks([False])[0], vocab)
    assert loose_next[surrogate] and not strict_next[surrogate]
    assert strict_next[fine] and loose_next[fine]
    assert strict_next.sum() > 0
