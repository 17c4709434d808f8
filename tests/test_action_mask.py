"""Action masks (:mod:`marl_agents.action_mask`): a masked action is never sampled (the module's
exploration forward, both samplers), never picked greedily (evaluation), and the learner's
log-probabilities under the mask are the ones the sampler stored; ``model.action_mask: false``
turns it off."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

from marl_agents.action_mask import masked_logits, stack_observations, to_tensors
from marl_agents.modules import MLPModule, module_spec
from marl_agents.pools import AgentPool, GRUModel, MLPModel, PoolError
from scenarios.pz_spaces import MASK_KEY, OBS_KEY
from trainers.algo import to_algorithm_config
from trainers.configs.experiment import ExperimentConfig
from trainers.evaluate import TeamPolicy
from trainers.learners.categorical import Categoricals
from trainers.sampling.action_rows import _off_support, categorical_rows
from trainers.sampling.batched_runner import BatchedEnvRunner

TTT = "pettingzoo.classic.tictactoe_v3:env"
N = 9
SPACE = gym.spaces.Dict(
    {
        OBS_KEY: gym.spaces.Box(0.0, 1.0, (18,), np.float32),
        MASK_KEY: gym.spaces.Box(0.0, 1.0, (N,), np.float32),
    }
)


def module(action_mask: bool = True) -> Any:
    pool = AgentPool(
        "player",
        ["player_1"],
        MLPModel(action_mask=action_mask),
        SPACE,
        gym.spaces.Discrete(N),
        True,
    )
    spec = module_spec(pool, {"scenario": TTT})
    assert spec.module_class is MLPModule  # RLlib's default module takes no Dict
    m = spec.build()
    with torch.no_grad():  # the policy prefers the actions the masks below forbid
        m.pi.bias.copy_(torch.tensor([9.0, 9.0, 9.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0]))
    return m


def batch(rows: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    masks = (rng.random((rows, N)) < 0.4).astype(np.float32)
    masks[np.arange(rows), rng.integers(4, N, rows)] = 1.0  # at least one allowed action
    masks[: rows // 2, :4] = 0.0  # half the rows forbid every action the policy prefers
    obs = [{OBS_KEY: rng.random(18).astype(np.float32), MASK_KEY: m} for m in masks]
    return {Columns.OBS: to_tensors(stack_observations(obs))}


def test_a_masked_action_is_never_sampled_or_picked() -> None:
    m, b = module(), batch(4000)
    mask = b[Columns.OBS][MASK_KEY].numpy()
    with torch.no_grad():
        explore = m.forward_exploration(b)[Columns.ACTION_DIST_INPUTS]
        infer = m.forward_inference(b)[Columns.ACTION_DIST_INPUTS]
        train = m.forward_train(b)[Columns.ACTION_DIST_INPUTS]
    torch.testing.assert_close(explore, train)
    torch.testing.assert_close(infer, train)
    rows = np.arange(len(mask))
    for _ in range(5):  # RLlib's sampler: torch's categorical on the module's logits
        drawn = TorchCategorical.from_logits(explore).sample().numpy()
        assert mask[rows, drawn].all()
    rngs = [np.random.default_rng(i) for i in rows]  # the batched sampler's inverse CDF
    drawn, logp = categorical_rows(explore, [N], False, rngs)
    assert mask[rows, drawn].all() and torch.isfinite(logp).all()
    greedy, _ = categorical_rows(explore, [N], False, None)
    assert mask[rows, greedy].all()
    probs = torch.softmax(explore, -1).numpy()
    assert (probs[mask == 0] == 0).all()
    entropy = Categoricals(train, [N], False).entropy()
    assert torch.isfinite(entropy).all()


def test_without_the_mask_flag_the_module_reads_the_observation_only() -> None:
    m, b = module(action_mask=False), batch(64)
    with torch.no_grad():
        logits = m.forward_exploration(b)[Columns.ACTION_DIST_INPUTS]
        own = m.pi(m.actor(b[Columns.OBS][OBS_KEY]))
        values = m.compute_values(b)
    torch.testing.assert_close(logits, own)  # not masked
    assert values.shape == (64,)
    with pytest.raises(PoolError, match=r"model\.action_mask must be true or false"):
        MLPModel(action_mask="yes").check("pool 'player'")  # type: ignore[arg-type]


def test_a_draw_off_the_support_moves_to_the_nearest_allowed_action() -> None:
    probs = np.array([[[0.0, 0.5, 0.5, 0.0]], [[0.0, 0.5, 0.5, 0.0]], [[0.2, 0.0, 0.8, 0.0]]])
    act = np.array([[0], [3], [2]])  # u == 0 exactly; u past the float sum; on the support
    _off_support(probs, act)
    assert act.tolist() == [[1], [2], [2]]


def test_masked_logits_are_finite_and_zero_probability() -> None:
    logits = masked_logits(torch.zeros(2, 3), torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]))
    assert torch.isfinite(logits).all()
    assert torch.softmax(logits, -1).tolist() == [[0.5, 0.0, 0.5], [0.0, 0.0, 1.0]]


def runner(cls: type, sampler: str) -> Any:
    cfg = ExperimentConfig.from_dict(
        {
            "scenario": TTT,
            "resources": {"num_envs_per_env_runner": 4},
            "episodes": {"sampler": sampler},
        }
    )
    return cls(config=to_algorithm_config(cfg))


@pytest.mark.parametrize(
    ("cls", "sampler"), [(BatchedEnvRunner, "batched"), (MultiAgentEnvRunner, "rllib")]
)
def test_samplers_act_legally_and_the_learner_scores_their_logp(cls: type, sampler: str) -> None:
    """A real rollout: every stored action is allowed by the mask its agent saw, and the
    learner's forward (``forward_train``, the masked logits) gives the stored behaviour
    log-probability of every action — RLlib's distribution and the lean learner's alike."""
    r = runner(cls, sampler)
    m = r.module["player"]
    steps = 0
    for ep in r.sample(num_episodes=8, explore=True):
        for sa in ep.agent_episodes.values():
            obs = sa.get_observations()
            acts = torch.as_tensor(np.asarray(sa.get_actions()))
            seen = {k: np.asarray(v)[:-1] for k, v in obs.items()}  # the last one is final
            assert seen[MASK_KEY][np.arange(len(acts)), acts.numpy()].all()
            with torch.no_grad():
                logits = m.forward_train({Columns.OBS: to_tensors(seen)})[
                    Columns.ACTION_DIST_INPUTS
                ]
            stored = torch.as_tensor(sa.get_extra_model_outputs(Columns.ACTION_LOGP))
            torch.testing.assert_close(TorchCategorical.from_logits(logits).logp(acts), stored)
            torch.testing.assert_close(Categoricals(logits, [N], False).logp(acts), stored)
            steps += len(acts)
    assert steps >= 8 * 5  # a tic-tac-toe game lasts at least 5 moves


@pytest.mark.parametrize("kind", ["mlp", "gru"])
def test_greedy_evaluation_respects_the_mask(kind: str) -> None:
    if kind == "mlp":
        m = module()
    else:  # a recurrent pool: the observation gets its time axis, the state is carried
        model = GRUModel(gru_size=8)
        pool = AgentPool("player", ["player_1"], model, SPACE, gym.spaces.Discrete(N), True)
        m = module_spec(pool, {"scenario": TTT}).build()
        with torch.no_grad():
            m.pi.bias.copy_(torch.tensor([9.0] * 4 + [0.0] * 5))
    policy = TeamPolicy({"player": m}, {"player_1": "player"})
    b = batch(200, seed=1)
    mask = b[Columns.OBS][MASK_KEY].numpy()
    for i in range(len(mask)):
        obs = {k: v[i].numpy() for k, v in b[Columns.OBS].items()}
        assert mask[i, policy.act({"player_1": obs})["player_1"]] == 1.0


@pytest.mark.parametrize("on", [True, False])
def test_the_pool_flag_reaches_the_env_nodes_check(on: bool) -> None:
    """``model.action_mask: false``: the module leaves the logits as they are and the env lets
    an illegal move through to PettingZoo's own rule (the mover loses); on (default): the
    module masks and the env node would refuse one."""
    from trainers.plan import resolve

    pools = {"player": {"model": {"type": "mlp", "action_mask": on}}}
    plan = resolve(ExperimentConfig.from_dict({"scenario": TTT, "pools": pools}), ray_workers=False)
    assert plan.env.check_action_masks is on
    spec = module_spec(plan.pools["player"], plan.env)
    assert spec.model_config["action_mask"] is on
    env = plan.env.make_env()
    assert env.scenario.check_mask is on
    env.reset(seed=0)
    env.step({"player_1": 4})
    _, rewards, _, _, infos = env.step({"player_2": 4})  # the cell player_1 took
    if on:
        assert "IllegalActionError" in infos["player_2"]["error"]
    else:
        assert rewards["player_2"] == -1.0 and infos["player_2"]["failure"] is None


@pytest.mark.slow  # two algorithms built and trained on Ray
@pytest.mark.parametrize("name", ["APPO", "IMPALA"])
def test_v_trace_learners_train_on_masked_observations(ray_session: Any, name: str) -> None:
    """APPO (its target network, a masked copy of the actor: MLPModule's TargetNetworkAPI) and
    IMPALA train tic-tac-toe's masked pool: finite losses."""
    cfg = ExperimentConfig.from_dict(
        {
            "scenario": TTT,
            "algorithm": {"name": name, "train_batch_size": 64, "num_epochs": 1},
            "resources": {"num_envs_per_env_runner": 2},
            "logging": {"wandb": "disabled", "progress": False},
        }
    )
    algo = to_algorithm_config(cfg).build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        losses = result["learners"]["player"]
        assert np.isfinite(losses["total_loss"]) and np.isfinite(losses["entropy"])
    finally:
        algo.stop()
