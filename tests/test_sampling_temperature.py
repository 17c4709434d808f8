"""The learner scores tokens under the distribution that sampled them (temperature, top-p).

At temperature ``T`` the sampler draws from ``softmax(logits / T)``; the GRPO ratio's old
and new logprobs must both be of that distribution. These tests sample with the tiny model
at ``T = 0.7`` and show the gap when the tokens are scored at ``T = 1`` (what the learner did
before) and its absence when scored at the sampling temperature (what it does now), then the
errors for what the learner cannot score (greedy rows, a top-p nucleus).

Tolerance: 1e-4 nats (the KV-cache sampling loop and the teacher-forced pass differ in float
rounding only; measured ~4e-6 at T = 1).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from llm_modules import build_learner, module_spec

from marl_agents.llm.backend import SamplingParams
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.llm.tiny import make_tiny_model
from scenarios.text_space import TextSpaces
from trainers.grpo.loss import sampler_kl

AGREEMENT_TOL = 1e-4
#: the bug's size on the tiny model at T = 0.7: scoring at T = 1 misses by up to ~1 nat.
GAP_BEFORE_MIN = 0.05
TEMPERATURE = 0.7
PROMPTS = ["hello", "assign part 1 to worker 2 please", list(range(40, 70))]


@pytest.fixture(scope="module")
def backend() -> HFBackend:
    tok, model = make_tiny_model(seed=0)
    return HFBackend(model, tok)


def test_backend_recomputes_sampling_logprobs_at_the_sampling_temperature(backend):
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=16, seed=5)
    gens = backend.generate(PROMPTS * 2, params)
    prompts, tokens = [g.prompt_ids for g in gens], [g.token_ids for g in gens]
    sampled = np.concatenate([g.sampling_logprobs for g in gens])
    at_t1 = np.concatenate(backend.logprobs(prompts, tokens))  # the old learner's view
    at_t = np.concatenate(backend.logprobs(prompts, tokens, temperature=TEMPERATURE))
    assert np.abs(at_t1 - np.concatenate([g.logprobs for g in gens])).max() < AGREEMENT_TOL
    assert np.abs(at_t1 - sampled).max() > GAP_BEFORE_MIN  # before: a different policy
    assert np.abs(at_t - sampled).max() < AGREEMENT_TOL  # after: the sampler's policy


def test_teacher_forcing_rejects_a_temperature_it_cannot_score(backend):
    with pytest.raises(ValueError, match="temperature > 0"):
        backend.logprobs([[1, 2]], [[3]], temperature=0.0)
    with pytest.raises(ValueError, match="2 temperatures for 1 sequences"):
        backend.logprobs([[1, 2]], [[3]], temperature=[0.5, 1.0])


# ----- the module ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spaces() -> TextSpaces:
    return TextSpaces(vocab_size=384, max_prompt_tokens=48, max_new_tokens=8)


@pytest.fixture(scope="module")
def module(spaces):
    return module_spec(spaces, temperature=TEMPERATURE, inference_temperature=1.3).build()


def obs_batch(module, spaces, n=6):
    from scenarios.text_space import encode_prompt

    rows = [spaces.encode_prompt(encode_prompt(module.tokenizer, p)) for p in PROMPTS]
    return torch.as_tensor(np.stack((rows * n)[:n]))


def explore(module, spaces, seed=0):
    from ray.rllib.core.columns import Columns

    obs = obs_batch(module, spaces)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = module.forward_exploration({Columns.OBS: obs})
    return {Columns.OBS: obs, **out}


def test_module_scores_at_the_sampling_temperature_and_t1_shows_the_gap(module, spaces):
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.rl_module import SAMPLING_TEMPERATURE, TOKEN_LOGP

    batch = explore(module, spaces)
    assert batch[SAMPLING_TEMPERATURE].tolist() == pytest.approx([TEMPERATURE] * 6)
    own = batch[Columns.ACTIONS] != spaces.pad_id
    behaviour = batch[TOKEN_LOGP]
    with torch.no_grad():
        train = module.forward_train(batch)[TOKEN_LOGP]
        at_t1, _ = module.score(batch[Columns.OBS], batch[Columns.ACTIONS], temperature=1.0)
    before = (at_t1 - behaviour).abs()[own].max()
    after = (train - behaviour).abs()[own].max()
    assert float(before) > GAP_BEFORE_MIN and float(after) < AGREEMENT_TOL
    assert sampler_kl(behaviour, at_t1, own) > 1e-3
    assert sampler_kl(behaviour, train, own) < 1e-6


def test_the_temperature_travels_with_the_batch(module, spaces):
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.rl_module import SAMPLING_TEMPERATURE, TOKEN_LOGP

    explored = explore(module, spaces, seed=1)
    torch.manual_seed(2)
    with torch.no_grad():  # evaluation samples at inference_temperature 1.3
        inferred = module.forward_inference({Columns.OBS: explored[Columns.OBS]})
    assert inferred[SAMPLING_TEMPERATURE].tolist() == pytest.approx([1.3] * 6)
    keys = (Columns.OBS, Columns.ACTIONS, TOKEN_LOGP, SAMPLING_TEMPERATURE)
    inferred[Columns.OBS] = explored[Columns.OBS]
    batch = {k: torch.cat([explored[k], inferred[k]]) for k in keys}
    with torch.no_grad():
        train = module.forward_train(batch)[TOKEN_LOGP]
    own = batch[Columns.ACTIONS] != spaces.pad_id
    assert float((train - batch[TOKEN_LOGP]).abs()[own].max()) < AGREEMENT_TOL
    # a batch without the column is scored at the module's exploration temperature
    del explored[SAMPLING_TEMPERATURE]
    with torch.no_grad():
        default = module.forward_train(explored)[TOKEN_LOGP]
    own = explored[Columns.ACTIONS] != spaces.pad_id
    assert float((default - explored[TOKEN_LOGP]).abs()[own].max()) < AGREEMENT_TOL


def test_greedy_rows_and_top_p_cannot_be_trained_on(module, spaces):
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.rl_module import SAMPLING_TEMPERATURE, SamplingConfigError

    batch = explore(module, spaces)
    batch[SAMPLING_TEMPERATURE] = torch.tensor([TEMPERATURE] * 4 + [0.0] * 2)
    with pytest.raises(SamplingConfigError, match="2 of 6 rows were sampled greedily"):
        module.forward_train(batch)
    greedy = module_spec(spaces, temperature=0.0).build()
    with torch.no_grad():
        out = greedy.forward_exploration({Columns.OBS: batch[Columns.OBS]})
    assert (out[SAMPLING_TEMPERATURE] == 0).all()  # frozen greedy pools still act
    with pytest.raises(SamplingConfigError, match=r"set model_config\['temperature'\] > 0"):
        greedy.check_trainable()
    nucleus = module_spec(spaces, temperature=TEMPERATURE, top_p=0.9).build()
    with pytest.raises(SamplingConfigError, match=r"top_p=0\.9 .* set top_p: 1"):
        nucleus.forward_train(explore(nucleus, spaces))


# ----- the learner ---------------------------------------------------------------------------


def test_learner_logs_sampler_kl_and_the_temperature(spaces):
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from trainers.grpo.connectors import ADVANTAGES, GRPO_KEEP

    learner = build_learner(
        spaces, trained={"temperature": TEMPERATURE}, frozen={"top_p": 0.5}, minibatch_size=3
    )
    batch = explore(learner.module["trained"].unwrapped(), spaces)
    batch[ADVANTAGES] = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    batch[GRPO_KEEP] = torch.ones(6, dtype=torch.bool)
    numpy_batch = {k: v.numpy() for k, v in batch.items()}
    results = learner.update(
        batch=MultiAgentBatch({"trained": SampleBatch(numpy_batch)}, env_steps=6)
    )
    stats = results["trained"]
    assert stats["grpo/sampling_temperature"].peek() == pytest.approx(TEMPERATURE)
    assert stats["grpo/logprob_gap_fresh"].peek() < AGREEMENT_TOL
    assert 0 <= stats["grpo/sampler_kl_fresh"].peek() < 1e-6
    assert stats["grpo/sampler_kl"].peek() >= 0


def test_learner_refuses_a_trained_nucleus_sampler(spaces):
    from marl_agents.llm.rl_module import SamplingConfigError

    with pytest.raises(SamplingConfigError, match=r"module 'trained' samples with top_p=0\.9"):
        build_learner(spaces, trained={"top_p": 0.9}, frozen={}, minibatch_size=3)


# ----- config validation ---------------------------------------------------------------------
def test_config_rejects_top_p_on_a_trained_llm_pool_only():
    from marl_agents.pools import LLMModel, PoolError
    from trainers.configs.typed import ConfigError
    from trainers.finetune import FinetuneJob

    with pytest.raises(ConfigError, match=r"top_p=0\.9 on a trained LLM.*set top_p: 1"):
        FinetuneJob.from_yaml("orchestrator:\n  top_p: 0.9\n").check()
    model = LLMModel(temperature=TEMPERATURE, top_p=0.9)
    model.check("pool 'frozen'")  # a frozen pool may sample from a nucleus
    with pytest.raises(PoolError, match=r"pool 'p': top_p=0\.9"):
        model.check("pool 'p'", trained=True)
    LLMModel(temperature=TEMPERATURE).check("pool 'p'", trained=True)
