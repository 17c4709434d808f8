"""What the GRPO learner receives for an LLM pool, on the batched sampler and on RLlib's
(issue #25): the same tasks in each group, every group whole (``group_size`` rollouts of one
task, whatever the episode lengths), each row's reward the one its own tokens earned, the
advantages those rewards normalised within their group, behaviour log-probabilities those of
the learner under the sampling temperature, and the same policy sampled.

The app (``tests/apps/router.py``): a right route (the first character of the trained
router's reply) hands over to a frozen worker, so successful episodes are one step longer.
Before the fix the batched sampler started a sub-env's next task as soon as its episode ended
and returned the first ``G·B`` episodes to finish: groups came in pieces sorted by finishing
time, i.e. by outcome (the first test failed there: group sizes 1–7). Runners are built
directly (no Ray); the two samplers draw different random numbers, so rows are compared with
what their own tokens earned, and the policies by their sampled success rates.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from apps.router import TASKS, right_reply
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

from marl_agents.llm.rl_module import SAMPLING_TEMPERATURE, TOKEN_LOGP
from trainers.algo import to_algorithm_config
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.grpo import GRPOLoss
from trainers.grpo.connectors import ADVANTAGES, GRPOAdvantages, episode_seed
from trainers.sampling.batched_runner import BatchedEnvRunner

G, B = 4, 3  # rollouts per group, groups per iteration
SAMPLERS = ("batched", "rllib")
LLM = {"type": "llm", "path": "tiny"}


def config(sampler: str, **algorithm: Any) -> ExperimentConfig:
    return ExperimentConfig.from_dict(
        {
            "scenario": "tests.apps.router:app",
            "sharing": "explicit",
            "seed": 0,
            "pools": {
                "router": {"agents": ["router"], "model": LLM},
                "worker": {"agents": ["worker"], "model": {**LLM, "tiny_seed": 1}},
            },
            "train": ["router"],
            "algorithm": {
                "name": "GRPO",
                "num_epochs": 1,
                "grpo": {"group_size": G, "groups_per_iteration": B, **algorithm},
            },
            "episodes": {"sampler": sampler},
        }
    )


def runner(sampler: str, **algorithm: Any) -> Any:
    cls = MultiAgentEnvRunner if sampler == "rllib" else BatchedEnvRunner
    return cls(config=to_algorithm_config(config(sampler, **algorithm)), worker_index=0)


def router_episodes(episodes: list[Any]) -> list[Any]:
    return [e.agent_episodes["router"] for e in episodes]


def reply(module: Any, sa: Any) -> str:
    """The router's reply as the app read it: its sampled tokens, decoded."""
    ids = np.asarray(sa.get_actions())[0].tolist()
    pad = module.spaces.pad_id
    ids = ids[: ids.index(pad)] if pad in ids else ids
    return module.tokenizer.decode(ids, skip_special_tokens=True)


def task_of(module: Any, sa: Any) -> str:
    prompt = module.tokenizer.decode(np.asarray(sa.get_observations()[0]).tolist())
    (task,) = [t for t in TASKS if t in prompt]
    return task


@pytest.fixture(scope="module")
def sampled() -> dict[str, tuple[Any, list[list[Any]]]]:
    """Per sampler: the runner and two iterations of ``G·B`` episodes."""
    out = {}
    for sampler in SAMPLERS:
        r = runner(sampler)
        out[sampler] = (r, [r.sample(num_episodes=G * B, explore=True) for _ in range(2)])
    return out


def test_groups_are_whole_and_hold_the_same_tasks_on_both_samplers(sampled) -> None:
    tasks = {}
    for sampler, (_, iterations) in sampled.items():
        tasks[sampler] = []
        for episodes in iterations:
            sizes = Counter(episode_seed(sa) for sa in router_episodes(episodes))
            assert sorted(sizes.values()) == [G] * B, (sampler, sizes)
            tasks[sampler].append(sorted(sizes))
    assert tasks["batched"] == tasks["rllib"]
    # the case that used to split: episode lengths differ inside a group
    _, iterations = sampled["batched"]
    lengths: dict[int, set[int]] = {}
    for e in iterations[0]:
        lengths.setdefault(episode_seed(e.agent_episodes["router"]), set()).add(len(e))
    assert any(len(v) > 1 for v in lengths.values()), lengths


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_each_rows_reward_and_advantage_come_from_its_own_tokens(sampled, sampler) -> None:
    """Per row: the reward is what the router's decoded reply earns on its task; the advantage
    is that reward centred and scaled within its group (population std, hand-computed)."""
    r, iterations = sampled[sampler]
    module = r.module["router"]
    episodes = iterations[0]
    connector = GRPOAdvantages(grpo=GRPOLoss(dynamic_sampling=False))
    mine = list(connector.single_agent_episode_iterator(episodes, agents_that_stepped_only=False))
    mine = [sa for sa in mine if sa.module_id == "router"]
    actions = torch.as_tensor(np.concatenate([np.asarray(sa.get_actions()) for sa in mine]))
    batch = connector(rl_module=r.module, batch={"router": {Columns.ACTIONS: actions}},
                      episodes=episodes)  # fmt: skip
    adv = batch["router"][ADVANTAGES].numpy()
    rewards = np.array([float(np.sum(sa.get_rewards())) for sa in mine])
    for sa, reward in zip(mine, rewards, strict=True):
        text, task = reply(module, sa), task_of(module, sa)
        assert reward == float(right_reply(task, text)), (text, task, reward)
    seeds = np.array([episode_seed(sa) for sa in mine])
    for seed in set(seeds):
        g = rewards[seeds == seed]
        want = (g - g.mean()) / (g.std() + 1e-6)
        np.testing.assert_allclose(adv[seeds == seed], want, atol=1e-5)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_behaviour_logprobs_are_the_learners_at_the_sampling_temperature(sampled, sampler):
    r, iterations = sampled[sampler]
    module = r.module["router"]
    for sa in router_episodes(iterations[1]):
        obs = torch.as_tensor(np.asarray(sa.get_observations()[:-1]))
        actions = torch.as_tensor(np.asarray(sa.get_actions()))
        temps = torch.as_tensor(sa.get_extra_model_outputs(SAMPLING_TEMPERATURE))
        with torch.no_grad():
            want, _ = module.score(obs, actions, temperature=temps)
        np.testing.assert_allclose(sa.get_extra_model_outputs(TOKEN_LOGP), want.numpy(), atol=1e-4)


def test_both_samplers_sample_the_same_policy() -> None:
    """The same weights, many episodes: each task's success rate agrees between the samplers
    within 4 binomial standard errors (the seeds are fixed: no flakiness)."""
    rates = {}
    for sampler in SAMPLERS:
        r = runner(sampler, groups_per_iteration=32)
        module = r.module["router"]
        rows = [(task_of(module, sa), float(np.sum(sa.get_rewards())))
                for sa in router_episodes(r.sample(num_episodes=G * 32, explore=True))]  # fmt: skip
        rates[sampler] = {t: [x for task, x in rows if task == t] for t in TASKS}
    for t in TASKS:
        a, b = rates["batched"][t], rates["rllib"][t]
        assert len(a) >= 16 and len(b) >= 16, (t, len(a), len(b))
        p = (sum(a) + sum(b)) / (len(a) + len(b))
        se = np.sqrt(p * (1 - p) * (1 / len(a) + 1 / len(b)))
        assert abs(np.mean(a) - np.mean(b)) <= 4 * se + 1e-9, (t, np.mean(a), np.mean(b))
