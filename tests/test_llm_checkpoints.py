"""Real checkpoints as LLM pools: Qwen2 and Llama directories built in code (random weights,
the tiny tokenizer saved next to them, no downloads) load, sample and score; the directory's
chat template renders the prompts; dtype is honoured; the memory estimate and bad directories
are one-line errors; a 2-iteration GRPO run trains a Qwen2-family orchestrator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from llm_modules import module_spec

from marl_agents.llm.checkpoints import (
    TINY_FIELDS,
    CheckpointError,
    LLMPoolNeed,
    MemoryBudgetError,
    check_memory,
    inspect_checkpoint,
    memory_estimate,
)
from scenarios.text_space import TextSpaces, chat_text, encode_prompt, make_tiny_tokenizer
from trainers.configs.typed import ConfigError

AGREEMENT_TOL = 1e-4  # as tests/test_llm_rllib.py
#: a Llama-2-style template, unlike the tiny tokenizer's ChatML one
INST_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}<|im_end|>"
    "{% else %}[INST] {{ m['role'] }}: {{ m['content'] }} [/INST]{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}[ANSWER]{% endif %}"
)
#: the tiny model's sizes, with grouped-query attention and an untied output head
SIZES = {k: v for k, v in TINY_FIELDS.items() if k not in ("model_type", "vocab_size")} | {
    "num_key_value_heads": 1,
    "tie_word_embeddings": False,
    "initializer_range": 0.1,
}


def save_family(path: Path, family: str, *, template: str | None = "keep", seed: int = 0) -> str:
    """A random-weight ``family`` model with the tiny tokenizer, saved to ``path``."""
    import transformers

    tok = make_tiny_tokenizer()
    if template != "keep":
        tok.chat_template = template
    prefix = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama", "mistral": "Mistral"}[family]
    config_cls = getattr(transformers, f"{prefix}Config")
    model_cls = getattr(transformers, f"{prefix}ForCausalLM")
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    config = config_cls(vocab_size=len(tok), bos_token_id=tok.pad_token_id, **ids, **SIZES)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "qwen2": save_family(root / "qwen2", "qwen2"),
        "llama": save_family(root / "llama", "llama", template=INST_TEMPLATE),
        "base": save_family(root / "base", "llama", template=None),
    }


@pytest.fixture(scope="module")
def spaces():
    return TextSpaces(vocab_size=384, max_prompt_tokens=64, max_new_tokens=8)


# ----- two families load, sample and score ----------------------------------------------------
@pytest.mark.parametrize(
    "family, cls", [("qwen2", "Qwen2ForCausalLM"), ("llama", "LlamaForCausalLM")]
)
def test_family_loads_samples_and_scores(dirs, spaces, family, cls):
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.rl_module import TOKEN_LOGP

    module = module_spec(spaces, model=dirs[family]).build()
    assert type(module.model).__name__ == cls
    messages = [[{"role": "user", "content": t}] for t in ("part 0: math", "worker 2", "x")]
    obs = torch.as_tensor(
        np.stack([spaces.encode_prompt(encode_prompt(module.tokenizer, m)) for m in messages * 2])
    )
    torch.manual_seed(0)
    with torch.no_grad():
        out = module.forward_exploration({Columns.OBS: obs})
    own = out[Columns.ACTIONS] != spaces.pad_id
    assert own.any() and (out[TOKEN_LOGP][own] < 0).all()
    train = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: out[Columns.ACTIONS]})
    gap = (train[TOKEN_LOGP].detach() - out[TOKEN_LOGP]).abs()[own].max()
    assert float(gap) < AGREEMENT_TOL


def test_parameter_count_read_without_loading_matches_the_model(dirs):
    from marl_agents.llm.checkpoints import config_parameters
    from marl_agents.llm.rl_module import load_causal_lm

    for path in (*dirs.values(), "tiny"):
        info = inspect_checkpoint(path)
        _, model = load_causal_lm(path)
        assert info.parameters == sum(p.numel() for p in model.parameters()), path
        assert info.family == model.config.model_type and info.vocab_size == 384
        config = json.loads(Path(path, "config.json").read_text()) if path != "tiny" else None
        assert config is None or config_parameters(config) == info.parameters


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_other_families_load_in_their_dtype(tmp_path, family):
    from marl_agents.llm.checkpoints import config_parameters
    from marl_agents.llm.rl_module import load_causal_lm

    path = save_family(tmp_path / family, family)
    info = inspect_checkpoint(path)
    _, model = load_causal_lm(path, dtype="bfloat16")
    assert model.config.model_type == info.family == family
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert info.parameters == sum(p.numel() for p in model.parameters())
    config = json.loads(Path(path, "config.json").read_text())
    assert config_parameters(config) == info.parameters  # the estimate without safetensors


# ----- chat templates -------------------------------------------------------------------------
def test_the_directory_chat_template_renders_the_prompt(dirs):
    from scenarios.text_delegate import TextDelegate

    tok = make_tiny_tokenizer()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    templated = "[INST] system: be brief [/INST][INST] user: hi [/INST][ANSWER]"
    assert chat_text(tok, messages).startswith("<|im_start|>system\nbe brief<|im_end|>")
    scenario = TextDelegate("star:2", tokenizer=dirs["llama"])
    assert chat_text(scenario.tokenizer, messages) == templated
    assert encode_prompt(scenario.tokenizer, messages) == tok(templated)["input_ids"]
    state = scenario.initial_state(np.random.default_rng(0))
    ids = scenario.prompt_ids(state)
    text = tok.decode(ids)
    assert text.startswith("[INST] system: You are the orchestrator") and "[ANSWER]" in text
    head = tok(chat_text(scenario.tokenizer, scenario.orchestrator_messages(state)))["input_ids"]
    assert ids[: len(head)] == head  # then the opened call of prefill mode (level easy)
    assert tok.decode(ids[len(head) :]) == scenario.prefill_text(0, state)


def test_a_tokenizer_without_template_gets_plain_role_lines(dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(dirs["base"])
    assert not tok.chat_template
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert chat_text(tok, messages) == "system: be brief\nuser: hi\nassistant:"
    assert tok.decode(encode_prompt(tok, messages)) == "system: be brief\nuser: hi\nassistant:"


# ----- dtype and memory -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype_is_applied_on_load(dirs, spaces, dtype):
    module = module_spec(spaces, model=dirs["qwen2"], dtype=dtype).build()
    assert {p.dtype for p in module.model.parameters()} == {getattr(torch, dtype)}
    tiny = module_spec(spaces, dtype=dtype).build()
    assert {p.dtype for p in tiny.model.parameters()} == {getattr(torch, dtype)}


def test_memory_estimate_and_the_budget_error(dirs):
    info = inspect_checkpoint(dirs["qwen2"])
    n = info.parameters
    assert memory_estimate(info, "bfloat16", trained=False) == 2 * n
    assert memory_estimate(info, "float32", trained=True) == 4 * n + 4 * n + 8 * n
    needs = [LLMPoolNeed("orchestrator", dirs["qwen2"], "float32", True)]
    check_memory(needs, available={"ram": 10**9})
    with pytest.raises(MemoryBudgetError) as err:
        check_memory(needs, available={"ram": 1000})
    msg = str(err.value)
    assert "\n" not in msg and "'orchestrator'" in msg and dirs["qwen2"] in msg
    assert "of RAM" in msg and "is available" in msg and "bfloat16" in msg and "GPU" in msg
    with pytest.raises(MemoryBudgetError, match=r"of GPU memory \(per learner\)"):
        check_memory(
            needs, num_learners=1, num_gpus_per_learner=1, available={"gpu": 1000, "ram": 10**9}
        )


def test_ram_counts_the_reference_and_no_sampling_copy_when_the_driver_does_both(dirs):
    """One process (no remote learners or env runners): the sampler runs on the learner's
    weights, so no sampling copy; a remote env runner holds its own. A KL reference (or the
    kl_to_start monitor's) is one more copy of the weights."""
    info = inspect_checkpoint(dirs["qwen2"])
    weights = memory_estimate(info, "float32", trained=False)
    learn = memory_estimate(info, "float32", trained=True)

    def fits(needs: list[LLMPoolNeed], ram: int, **resources: int) -> bool:
        try:
            check_memory(needs, available={"ram": ram}, **resources)
        except MemoryBudgetError:
            return False
        return True

    trained = [LLMPoolNeed("orchestrator", dirs["qwen2"], "float32", True)]
    with_ref = [LLMPoolNeed("orchestrator", dirs["qwen2"], "float32", True, reference=True)]
    frozen = [LLMPoolNeed("worker", dirs["qwen2"], "float32", False)]
    for needs, need in [(trained, learn), (with_ref, learn + weights), (frozen, weights)]:
        assert fits(needs, need) and not fits(needs, need - 1)
        runner = need + weights  # a remote env runner's copy
        assert fits(needs, runner, num_env_runners=1)
        assert not fits(needs, runner - 1, num_env_runners=1)
    with pytest.raises(MemoryBudgetError, match=r"monitors\.kl\.log: false"):
        check_memory(with_ref, available={"ram": learn})


def test_gpu_env_runners_count_their_copy_on_the_gpu(dirs):
    """A runner sharing the learner's GPU adds its sampling copy to the learner's estimate;
    on its own GPU it needs only the copy; RAM then holds just the driver's copy."""
    info = inspect_checkpoint(dirs["qwen2"])
    learn = memory_estimate(info, "float32", trained=True)
    copy = memory_estimate(info, "float32", trained=False)
    needs = [LLMPoolNeed("orchestrator", dirs["qwen2"], "float32", True)]
    gpus = {"num_learners": 1, "num_env_runners": 4}
    fits = {"gpu": learn + copy, "ram": copy}
    check_memory(needs, num_gpus_per_learner=0.5, num_gpus_per_env_runner=0.5, available=fits)
    with pytest.raises(MemoryBudgetError, match=r"per env runner and learner"):
        check_memory(
            needs,
            num_gpus_per_learner=0.5,
            num_gpus_per_env_runner=0.5,
            available={"gpu": learn + copy - 1, "ram": copy},
            **gpus,
        )
    own = {"gpu": learn, "ram": copy}  # separate GPUs: the larger of the two needs
    check_memory(needs, num_gpus_per_learner=1, num_gpus_per_env_runner=1, available=own, **gpus)


def test_resolve_checks_the_memory_before_ray_starts(dirs, monkeypatch):
    from marl_agents.llm import checkpoints
    from trainers.finetune import FinetuneJob, OrchestratorConfig

    job = FinetuneJob(orchestrator=OrchestratorConfig(model=dirs["qwen2"]))
    job.plan()  # fits this machine
    seen: list[Any] = []
    real = checkpoints.check_memory
    monkeypatch.setattr(checkpoints, "check_memory", lambda needs, **kw: seen.extend(needs))
    job.plan()  # GRPO's kl_to_start monitor (on by default) keeps a reference copy
    assert [(n.pool, n.trained, n.reference) for n in seen] == [("orchestrator", True, True)]
    monkeypatch.setattr(checkpoints, "check_memory", real)
    monkeypatch.setattr(checkpoints, "available_memory", lambda device: 1000)
    with pytest.raises(ConfigError, match=r"pool 'orchestrator'.* but 1000 bytes is available"):
        job.plan()


# ----- bad directories ------------------------------------------------------------------------
def write_config(path: Path, config: dict) -> str:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_bad_directories_are_named_errors(dirs, tmp_path):
    from marl_agents.pools import LLMModel, PoolError

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "weights.bin").write_text("")
    bert = write_config(tmp_path / "bert", {"model_type": "bert", "architectures": ["BertModel"]})
    no_tok = write_config(
        tmp_path / "no_tok", json.loads(Path(dirs["qwen2"], "config.json").read_text())
    )
    cases = [
        (str(tmp_path / "missing"), "no such directory"),
        (str(empty), r"no config\.json; found \['weights\.bin'\]"),
        (bert, r"model_type 'bert' \(architectures \['BertModel'\]\).*qwen2, qwen3, llama"),
        (no_tok, r"\(qwen2\) has no tokenizer files.*tokenizer\.save_pretrained"),
    ]
    for path, match in cases:
        with pytest.raises(PoolError, match=match) as err:
            LLMModel(path=path).check("pool 'orchestrator'", trained=True)
        assert "\n" not in str(err.value) and path in str(err.value)
        assert str(err.value).startswith("pool 'orchestrator': model")
        with pytest.raises(CheckpointError, match=match):
            module_spec(TextSpaces(384, 16, 4), model=path).build()


# ----- a GRPO run -----------------------------------------------------------------------------
def test_grpo_trains_a_qwen2_orchestrator_for_two_iterations(dirs, tmp_path, ray_session):
    from transformers import AutoModelForCausalLM

    from trainers.configs.experiment import BudgetConfig, OutputConfig
    from trainers.finetune import FinetuneJob, OrchestratorConfig, TrainingConfig, run_finetune

    job = FinetuneJob(
        orchestrator=OrchestratorConfig(model=dirs["qwen2"]),
        training=TrainingConfig(group_size=4, groups_per_iteration=2, lr=1e-3),
        budget=BudgetConfig(iterations=2),
        output=OutputConfig(dir=str(tmp_path), name="qwen2", export_hf=True),
    )
    job.logging.progress = False
    job.logging.wandb = "disabled"
    result = run_finetune(job)
    assert result.summary["status"] == "completed" and result.summary["iterations"] == 2
    assert result.summary["logprob_gap_fresh_max"] < AGREEMENT_TOL
    exported = AutoModelForCausalLM.from_pretrained(result.model_dir)
    assert exported.config.model_type == "qwen2"
