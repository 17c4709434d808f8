"""The tiny model factory and the HF backend: build / save / reload, generation, logprobs."""

from __future__ import annotations

import math
import threading

import pytest
import torch

pytest.importorskip("transformers")

from marl_agents.llm.backend import Generation, LLMBackend, SamplingParams
from marl_agents.llm.batching import BatchingBackend
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.llm.tiny import make_tiny_model
from scenarios.text_space import IM_END, encode_prompt, make_tiny_tokenizer

#: Logprobs recorded while sampling vs a teacher-forced recompute (float32, CPU). The two use
#: different batch shapes / padding and a KV cache, so they differ in float rounding only;
#: measured up to ~4e-6.
LOGPROB_ATOL = 1e-5

PROMPTS = [
    "hello",
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "add 1 and 2"}],
    list(range(40, 70)),
]


@pytest.fixture(scope="module")
def tiny() -> tuple[object, object]:
    return make_tiny_model(seed=0)


@pytest.fixture(scope="module")
def backend(tiny: tuple[object, object]) -> HFBackend:
    tok, model = tiny
    return HFBackend(model, tok)


# ----- factory ----------------------------------------------------------------------------
def test_tokenizer_byte_level_round_trip_and_chat_template() -> None:
    tok = make_tiny_tokenizer()
    assert 300 <= len(tok) <= 512
    for text in ["hello world", "héllo 日本 🙂 <tool>{}</tool>", "\x00\t\n", ""]:
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = encode_prompt(tok, [{"role": "user", "content": "hi"}])
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.convert_tokens_to_ids(IM_END) == tok.eos_token_id
    assert make_tiny_tokenizer().get_vocab() == tok.get_vocab()  # deterministic training


def test_model_shape(tiny: tuple[object, object]) -> None:
    tok, model = tiny
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (128, 2, 2)
    assert cfg.hidden_size // cfg.num_attention_heads == 64
    assert cfg.vocab_size == len(tok)
    assert cfg.eos_token_id == tok.eos_token_id


def test_factory_saves_and_reloads_identically(tmp_path, tiny: tuple[object, object]) -> None:
    tok, model = make_tiny_model(tmp_path / "m", seed=0)
    assert (tmp_path / "m" / "config.json").exists()
    tok2, model2 = make_tiny_model(tmp_path / "m", seed=123)  # loads: the seed is not used
    sd, sd2 = model.state_dict(), model2.state_dict()
    assert sd.keys() == sd2.keys()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
    assert tok2.get_vocab() == tok.get_vocab()
    assert tok2.chat_template == tok.chat_template
    assert (tok2.eos_token_id, tok2.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    # same seed, built in memory: the same weights as the saved one
    _, model3 = tiny
    assert all(torch.equal(sd[k], model3.state_dict()[k]) for k in sd)
    _, other = make_tiny_model(seed=1)
    assert not torch.equal(other.state_dict()["lm_head.weight"], sd["lm_head.weight"])
    # a saved directory loads as a plain HF model too
    loaded = HFBackend.from_pretrained(tmp_path / "m")
    p = SamplingParams(temperature=0, max_new_tokens=6)
    assert (
        loaded.generate(["abc"], p)[0].token_ids
        == HFBackend(model, tok).generate(["abc"], p)[0].token_ids
    )


# ----- generation -------------------------------------------------------------------------
def test_generation_fields_consistent(backend: HFBackend) -> None:
    assert isinstance(backend, LLMBackend)
    gens = backend.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=12, seed=0))
    tok = backend.tokenizer
    for prompt, g in zip(PROMPTS, gens, strict=True):
        assert isinstance(g, Generation)
        assert g.prompt_ids == encode_prompt(tok, prompt)
        assert 1 <= len(g.token_ids) == len(g.logprobs) == len(g.sampling_logprobs) <= 12
        assert g.text == tok.decode(g.token_ids, skip_special_tokens=True)
        assert all(lp <= 0 and math.isfinite(lp) for lp in g.logprobs)
        # temperature 1, top_p 1: the sampling distribution is the model's
        assert g.sampling_logprobs == pytest.approx(g.logprobs, abs=1e-6)
        if g.finish_reason == "stop":
            assert g.token_ids[-1] == tok.eos_token_id
        else:
            assert len(g.token_ids) == 12 and tok.eos_token_id not in g.token_ids


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_new_tokens=24),
        SamplingParams(temperature=1.0, max_new_tokens=24, seed=7),
        SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=24, seed=7),
    ],
    ids=["greedy", "t1", "t0.7-top_p0.9"],
)
def test_logprob_agreement_with_teacher_forcing(backend: HFBackend, params: SamplingParams) -> None:
    gens = backend.generate(PROMPTS, params)
    recomputed = backend.logprobs([g.prompt_ids for g in gens], [g.token_ids for g in gens])
    for g, r in zip(gens, recomputed, strict=True):
        assert g.logprobs == pytest.approx(r, abs=LOGPROB_ATOL)


def test_sampling_logprobs_follow_temperature_and_top_p(backend: HFBackend) -> None:
    params = SamplingParams(temperature=0.5, top_p=0.5, max_new_tokens=8, seed=3)
    [g] = backend.generate(["the quick"], params)
    model = backend.model
    ids = torch.tensor([g.prompt_ids + g.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(g.prompt_ids) - 1 : -1].float()
    for k, tok in enumerate(g.token_ids):
        lp = torch.log_softmax(logits[k] / 0.5, -1)
        order = torch.argsort(lp, descending=True)
        probs = lp[order].exp()
        keep = order[(probs.cumsum(0) - probs) < 0.5]
        assert tok in keep.tolist()  # top-p respected
        want = lp[tok] - torch.logsumexp(lp[keep], 0)
        assert g.sampling_logprobs[k] == pytest.approx(float(want), abs=1e-5)


def test_batched_equals_one_by_one(backend: HFBackend) -> None:
    greedy = SamplingParams(temperature=0, max_new_tokens=20)
    batched = backend.generate(PROMPTS, greedy)
    for prompt, b in zip(PROMPTS, batched, strict=True):
        [one] = backend.generate([prompt], greedy)
        assert one.token_ids == b.token_ids
        assert one.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_ATOL)
    # per-prompt seeds: sampling is also batch-independent (each row has its own generator)
    seeded = [SamplingParams(temperature=1.0, max_new_tokens=20, seed=s) for s in (1, 2, 3)]
    batched = backend.generate(PROMPTS, seeded)
    singles = [backend.generate([p], s)[0] for p, s in zip(PROMPTS, seeded, strict=True)]
    assert [g.token_ids for g in batched] == [g.token_ids for g in singles]
    # and chunked batches equal one batch
    chunked = HFBackend(backend.model, backend.tokenizer, max_batch_size=2)
    assert [g.token_ids for g in chunked.generate(PROMPTS, seeded)] == [
        g.token_ids for g in batched
    ]


def test_generation_uses_the_installed_transformers_cache_argument(backend: HFBackend) -> None:
    """The KV cache goes back to the model under the name the installed transformers reads
    (``cache`` from 5.24, ``past_key_values`` before): no deprecation warning on a user's
    terminal, and nothing that breaks once the old name is removed."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        [g] = backend.generate(PROMPTS[:1], SamplingParams(temperature=0, max_new_tokens=4))
    assert len(g.token_ids) >= 1


def test_seeds_reproducible_and_distinct(backend: HFBackend) -> None:
    def run(seed: int | None) -> list[int]:
        return backend.generate(["x"], SamplingParams(max_new_tokens=16, seed=seed))[0].token_ids

    assert run(5) == run(5)
    assert run(5) != run(6)
    torch.manual_seed(0)
    a = run(None)
    torch.manual_seed(0)
    assert run(None) == a  # seed=None follows torch's global RNG


def test_stop_tokens_and_lengths(backend: HFBackend) -> None:
    [free] = backend.generate(["hello"], SamplingParams(temperature=0, max_new_tokens=10))
    stop = free.token_ids[2]
    first = free.token_ids.index(stop)
    params = SamplingParams(temperature=0, max_new_tokens=10, stop_token_ids=(stop,))
    [g] = backend.generate(["hello"], params)
    assert g.token_ids == free.token_ids[: first + 1]
    assert g.finish_reason == "stop"
    # different max_new_tokens in one batch
    gens = backend.generate(
        ["a", "b"],
        [
            SamplingParams(temperature=0, max_new_tokens=3),
            SamplingParams(temperature=0, max_new_tokens=9),
        ],
    )
    assert [len(g.token_ids) for g in gens] == [3, 9]
    assert backend.generate([], None) == []


def test_prompt_and_param_errors(backend: HFBackend) -> None:
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        backend.generate(PROMPTS, [SamplingParams(), SamplingParams()])
    with pytest.raises(TypeError, match="chat message"):
        backend.generate([[1.5, 2.5]])
    with pytest.raises(ValueError, match="empty prompt"):
        backend.generate([[]])
    with pytest.raises(ValueError, match="logprobs"):
        Generation([1], [2, 3], [0.0], "")


# ----- micro-batching ---------------------------------------------------------------------
def test_batching_backend_turns_concurrent_calls_into_one_batch(backend: HFBackend) -> None:
    k = 4
    batching = BatchingBackend(backend, max_batch_size=k, max_wait_s=30.0)
    params = [SamplingParams(temperature=1.0, max_new_tokens=6, seed=s) for s in range(k)]
    results: dict[int, Generation] = {}

    def call(i: int) -> None:
        [results[i]] = batching.generate([f"task {i}"], params[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert batching.batch_sizes == [k]  # full batch: the leader did not wait for the timeout
    for i in range(k):
        [alone] = backend.generate([f"task {i}"], params[i])
        assert results[i].token_ids == alone.token_ids
    # a lone caller waits at most max_wait_s and is served alone
    solo = BatchingBackend(backend, max_wait_s=0.0)
    assert len(solo.generate(["a", "b"], SamplingParams(max_new_tokens=2))) == 2
    assert solo.batch_sizes == [2]
    assert solo.tokenizer is backend.tokenizer


def test_batching_backend_propagates_errors(backend: HFBackend) -> None:
    class Boom:
        tokenizer = backend.tokenizer

        def generate(self, prompts, params=None):
            raise RuntimeError("backend down")

    with pytest.raises(RuntimeError, match="backend down"):
        BatchingBackend(Boom(), max_wait_s=0.0).generate(["x"])


def test_one_grpo_step_on_recorded_generations(backend: HFBackend) -> None:
    """Recorded logprobs are the learner's ``old_logprobs``: the first ratio is 1."""
    from marl_agents.llm.hf_backend import teacher_forced_logprobs
    from trainers.configs.grpo import GRPOLoss
    from trainers.grpo.loss import compute_advantages, grpo_loss

    params = [SamplingParams(max_new_tokens=8, seed=s) for s in range(4)]
    gens = backend.generate(["2 + 3 ="] * 4, params)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv, keep = compute_advantages(rewards, torch.zeros(4, dtype=torch.long), GRPOLoss())
    model = backend.model
    lp, ent = teacher_forced_logprobs(
        model, [g.prompt_ids for g in gens], [g.token_ids for g in gens], with_entropy=True
    )
    width = lp.shape[1]
    old = torch.tensor([g.logprobs + [0.0] * (width - len(g.logprobs)) for g in gens])
    mask = torch.tensor([[k < len(g.token_ids) for k in range(width)] for g in gens])
    assert torch.allclose(lp.detach()[mask], old[mask], atol=LOGPROB_ATOL)
    assert ((ent >= 0) & (ent <= math.log(len(backend.tokenizer)) + 1e-4)).all()
    loss, metrics = grpo_loss(lp, old, adv, mask & keep[:, None], GRPOLoss(), entropy=ent)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["clip_frac_low"] == metrics["clip_frac_high"] == 0.0
    model.zero_grad()
    loss.backward()
    assert model.model.embed_tokens.weight.grad is not None
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    model.zero_grad()
