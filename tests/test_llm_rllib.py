"""LLM policies through RLlib: text spaces, CausalLMModule, the GRPO learner and group sampling.

Tolerance of the logprob agreement checks: 1e-4 nats (measured ~4e-6 on the tiny model: the
KV-cache sampling loop and the teacher-forced pass differ only in float rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces as gym_spaces
from llm_modules import build_learner, module_spec

from scenarios.text_space import TextSpaces, lengths

AGREEMENT_TOL = 1e-4


# ----- text spaces ---------------------------------------------------------------------------
def test_text_space_encode_decode_and_padding():
    s = TextSpaces(vocab_size=10, max_prompt_tokens=4, max_new_tokens=3)
    assert s.pad_id == 10
    assert s.encode_prompt([1, 2]).tolist() == [1, 2, 10, 10]
    assert s.encode_prompt([1, 2, 3, 4, 5, 6]).tolist() == [3, 4, 5, 6]  # keeps the end
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        s.encode_prompt([1] * 5, truncate=False)
    with pytest.raises(ValueError, match="outside"):
        s.encode_action([10])  # the pad id is never a token
    with pytest.raises(ValueError, match="max_new_tokens"):
        s.encode_action([1, 2, 3, 4])
    with pytest.raises(ValueError, match="empty prompt"):
        s.encode_prompt([])
    assert s.decode_action(s.encode_action([])) == []
    assert s.decode_action([0, 0, 10]) == [0, 0]  # token 0 is a real token
    batch = np.stack([s.encode_action([1]), s.encode_action([1, 2, 3])])
    assert lengths(batch, 10).tolist() == [1, 3]
    assert lengths(torch.as_tensor(batch), 10).tolist() == [1, 3]
    assert isinstance(s.observation_space, gym_spaces.MultiDiscrete)
    assert s.action_space.contains(s.encode_action([9, 0]))


def test_rllib_leaves_multidiscrete_ids_alone_but_not_box():
    """Why the spaces are MultiDiscrete: RLlib's action post-processing rewrites Box actions."""
    from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action

    s = TextSpaces(vocab_size=384, max_prompt_tokens=4, max_new_tokens=3)
    action = s.encode_action([5, 300])
    assert unsquash_action(action, s.action_space).tolist() == action.tolist()
    assert clip_action(action, s.action_space).tolist() == action.tolist()
    box = gym_spaces.Box(0, 384, (3,), np.float32)  # a float Box is "unsquashed" from [-1, 1]
    assert unsquash_action(action.astype(np.float32), box).tolist() != action.tolist()


# ----- the module ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spaces():
    return TextSpaces(vocab_size=384, max_prompt_tokens=48, max_new_tokens=8)


@pytest.fixture(scope="module")
def module(spaces):
    return module_spec(spaces).build()


def prompt_batch(module, spaces, texts):
    tok = module.tokenizer
    rows = []
    for text in texts:
        chat = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        rows.append(spaces.encode_prompt(tok(chat, add_special_tokens=False)["input_ids"]))
    return torch.as_tensor(np.stack(rows))


TEXTS = ["part 0: math", "assign part 1 to worker 2 please", "x"]


def test_exploration_returns_sampled_ids_and_logprobs(module, spaces):
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.rl_module import TOKEN_LOGP

    obs = prompt_batch(module, spaces, TEXTS)
    torch.manual_seed(0)
    with torch.no_grad():
        out = module.forward_exploration({Columns.OBS: obs})
    actions, lp = out[Columns.ACTIONS], out[TOKEN_LOGP]
    assert actions.shape == (3, 8) and lp.shape == (3, 8)
    own = actions != spaces.pad_id
    assert (actions[own] < spaces.vocab_size).all()
    assert (lp[~own] == 0).all() and (lp[own] < 0).all()
    assert torch.allclose(out[Columns.ACTION_LOGP], lp.sum(-1))
    for row in actions:  # right-padded: nothing after the first pad
        ids = spaces.decode_action(row.numpy())
        assert row[: len(ids)].tolist() == ids and (row[len(ids) :] == spaces.pad_id).all()


def test_logprob_agreement_sampling_vs_teacher_forcing(module, spaces):
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.rl_module import TOKEN_ENTROPY, TOKEN_LOGP

    obs = prompt_batch(module, spaces, TEXTS * 2)
    torch.manual_seed(1)
    with torch.no_grad():
        out = module.forward_exploration({Columns.OBS: obs})
    train = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: out[Columns.ACTIONS]})
    own = out[Columns.ACTIONS] != spaces.pad_id
    gap = (train[TOKEN_LOGP].detach() - out[TOKEN_LOGP]).abs()[own].max()
    assert float(gap) < AGREEMENT_TOL
    assert (train[TOKEN_ENTROPY][own] > 0).all()
    train[TOKEN_LOGP][own].sum().backward()  # the train pass carries gradients
    grads = [p.grad for p in module.model.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)
    module.model.zero_grad(set_to_none=True)


def test_inference_is_greedy(module, spaces):
    from ray.rllib.core.columns import Columns

    obs = prompt_batch(module, spaces, TEXTS)
    with torch.no_grad():
        a = module.forward_inference({Columns.OBS: obs})[Columns.ACTIONS]
        b = module.forward_inference({Columns.OBS: obs})[Columns.ACTIONS]
    assert torch.equal(a, b)


def test_module_rejects_non_text_spaces_and_small_vocab(spaces):
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from marl_agents.llm.rl_module import CausalLMModule

    box = gym_spaces.Box(0, 1, (4,))
    with pytest.raises(TypeError, match="text spaces"):
        RLModuleSpec(module_class=CausalLMModule, observation_space=box, action_space=box).build()
    small = TextSpaces(vocab_size=100, max_prompt_tokens=8, max_new_tokens=2)
    with pytest.raises(ValueError, match="for_tokenizer"):
        module_spec(small).build()
    from marl_agents.llm.checkpoints import CheckpointError

    with pytest.raises(CheckpointError, match="save_pretrained"):
        module_spec(spaces, model="/nonexistent").build()


# ----- the learner ---------------------------------------------------------------------------


def hand_batch(module, spaces, advantages):
    from ray.rllib.core.columns import Columns

    from marl_agents.llm.rl_module import TOKEN_LOGP
    from trainers.grpo.connectors import ADVANTAGES, GRPO_KEEP

    obs = prompt_batch(module, spaces, TEXTS * 2)
    torch.manual_seed(2)
    with torch.no_grad():
        out = module.forward_exploration({Columns.OBS: obs})
    return {
        Columns.OBS: obs,
        Columns.ACTIONS: out[Columns.ACTIONS],
        TOKEN_LOGP: out[TOKEN_LOGP],
        ADVANTAGES: torch.as_tensor(advantages, dtype=torch.float32),
        GRPO_KEEP: torch.tensor([True, True, True, True, True, False]),
    }


def state_of(module):
    return {k: v.detach().clone() for k, v in module.model.state_dict().items()}


def test_learner_loss_is_grpo_loss_and_frozen_module_stays_bit_identical(spaces):
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from marl_agents.llm.rl_module import TOKEN_LOGP
    from trainers.configs.grpo import GRPOLoss
    from trainers.grpo.loss import grpo_loss

    knobs = dict(clip_low=0.2, clip_high=0.3, loss_agg="seq_mean_token_mean", spurious_mask=True)
    learner = build_learner(spaces, **knobs)
    assert type(learner).__name__ == "GRPOLearner"
    trained = learner.module["trained"].unwrapped()
    frozen = learner.module["frozen"].unwrapped()
    adv = [1.0, -1.0, 0.5, -0.5, 2.0, 3.0]
    batch = hand_batch(trained, spaces, adv)
    fwd = trained.forward_train(batch)
    loss = learner.compute_loss_for_module(
        module_id="trained", config=learner.config, batch=batch, fwd_out=fwd
    )
    mask = (batch["actions"] != spaces.pad_id) & batch["grpo_keep"][:, None]
    expect, stats = grpo_loss(
        fwd[TOKEN_LOGP],
        batch[TOKEN_LOGP],
        batch["advantages"][:, None],
        mask,
        GRPOLoss(**knobs),
        entropy=fwd["token_entropy"],
    )
    assert torch.allclose(loss, expect)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # same weights as the sampler
    before_t, before_f = state_of(trained), state_of(frozen)
    numpy_batch = {k: v.numpy() for k, v in batch.items()}
    learner.update(
        batch=MultiAgentBatch(
            {"trained": SampleBatch(numpy_batch), "frozen": SampleBatch(dict(numpy_batch))},
            env_steps=6,
        )
    )
    after_t, after_f = state_of(trained), state_of(frozen)
    assert any(not torch.equal(before_t[k], after_t[k]) for k in before_t)
    assert all(torch.equal(before_f[k], after_f[k]) for k in before_f)


def test_learner_kl_reference_stays_fixed(spaces):
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    learner = build_learner(spaces, kl_coef=0.1)
    trained = learner.module["trained"].unwrapped()
    ref = learner._refs["trained"]
    assert "frozen" not in learner._refs
    before = state_of(trained)
    batch = {k: v.numpy() for k, v in hand_batch(trained, spaces, [1, -1, 1, -1, 1, -1]).items()}
    for _ in range(2):
        learner.update(batch=MultiAgentBatch({"trained": SampleBatch(batch)}, env_steps=6))
    assert all(torch.equal(before[k], v) for k, v in ref.state_dict().items())
    assert any(not torch.equal(before[k], v) for k, v in trained.model.state_dict().items())


# ----- advantages from episodes --------------------------------------------------------------
class FakeEpisode:
    """The parts of a SingleAgentEpisode the advantage connector reads."""

    def __init__(self, agent, seed, reward, n_tokens, format_errors=0, steps=1, pad=384):
        from scenarios.base import Outcome

        self.agent_id, self.module_id = agent, "m"
        self._rewards = [0.0] * (steps - 1) + [reward]
        outcome = Outcome(reward, metrics={"format_errors": float(format_errors)})
        self._infos = [{"seed": seed}] * steps + [{"seed": seed, "outcome": outcome}]
        action = np.full(8, pad)
        action[:n_tokens] = 1
        self._actions = np.stack([action] * steps)

    def __len__(self):
        return len(self._rewards)

    def get_rewards(self):
        return self._rewards

    def get_infos(self):
        return self._infos

    def get_actions(self):
        return self._actions


class FakeModule:
    pad_id = 384


def test_advantages_group_by_task_seed_and_agent():
    from trainers.configs.grpo import GRPOLoss
    from trainers.grpo.connectors import GRPOAdvantages
    from trainers.grpo.loss import group_advantages

    eps = [
        FakeEpisode("o", 1, 1.0, 2),
        FakeEpisode("o", 1, 0.0, 2, steps=2),
        FakeEpisode("o", 2, 0.5, 3),
        FakeEpisode("o", 2, 0.5, 3),  # a group of equal rewards: dropped
        FakeEpisode("w", 1, 3.0, 4),  # same seed, other agent: its own group (of one)
    ]
    piece = GRPOAdvantages(grpo=GRPOLoss())
    adv, keep, stats = piece.advantages("m", FakeModule(), eps)
    assert keep.tolist() == [True, True, False, False, False]
    want = group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    assert adv[:2] == pytest.approx(want.numpy()) and adv[2:] == pytest.approx([0, 0, 0])
    assert stats["groups"] == 3 and stats["completion_tokens_mean"] == pytest.approx(3.2)


def test_advantages_format_penalty_and_length_dual():
    from trainers.configs.grpo import GRPOLoss
    from trainers.grpo.connectors import GRPOAdvantages

    eps = [FakeEpisode("o", 1, 1.0, 8, format_errors=1), FakeEpisode("o", 1, 1.0, 2)]
    cfg = GRPOLoss(format_penalty=0.5, length_budget=4.0, dual_init=0.0, dual_lr=1.0)
    duals = {}
    piece = GRPOAdvantages(grpo=cfg, duals=duals)
    adv, keep, stats = piece.advantages("m", FakeModule(), eps)
    assert keep.all() and adv[0] < 0 < adv[1]  # the malformed one is penalised
    assert stats["length_dual"] == pytest.approx(0.25)  # mean length 5 vs budget 4
    assert duals["m"].lam == pytest.approx(0.25)


# ----- group sampling ------------------------------------------------------------------------
def env(**cfg):
    from trainers.sampling.grouped_env import GroupedEnv

    return GroupedEnv(
        {"scenario": "text-delegate", "topology": "star:2", "kwargs": {}, "seed": 7, **cfg}
    )


def finish_episode(e, seed_arg=None):
    obs, infos = e.reset(seed=seed_arg)
    seed = infos["orchestrator"]["seed"]
    done = False
    while not done:
        action = e.env.scenario.spaces.encode_action([19])
        obs, _, terms, truncs, _ = e.step({"orchestrator": action})
        done = terms["__all__"] or truncs["__all__"]
    return seed


def test_grouped_env_shares_seeds_and_ignores_rllib_reset_seed():
    a, b = env(), env()
    seeds_a = [finish_episode(a, seed_arg=123) for _ in range(3)]
    seeds_b = [finish_episode(b) for _ in range(3)]
    assert seeds_a == seeds_b and len(set(seeds_a)) == 3
    c = env(repeat=2)
    seeds_c = [finish_episode(c) for _ in range(4)]
    assert seeds_c[0] == seeds_c[1] != seeds_c[2] == seeds_c[3]
    d = env()
    d.reset()  # abandoned (a forced reset): the task is run again
    assert finish_episode(d) == seeds_a[0]
