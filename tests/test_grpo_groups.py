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

Issue #29: the batched sampler runs several groups side by side (``groups_in_flight``, by
default all ``B`` of the runner's share), each step's decisions of all ``k·G`` sub-envs in one
``generate``. Every check above runs at ``k = B`` (the default), ``k = 2`` (``B = 3`` groups:
one slot idles in the second round) and ``k = 1`` (one group at a time, as before); the
``q``-th group of a runner has the stream's ``q``-th task at every ``k``.

Issue #44: ``groups_in_flight`` changes only the batching, never what the learner gets. Each
rollout draws from its own stream (its group's place in the runner's schedule, its place in
the group) and episodes come back in schedule order, so the learner's rows are the same at
every ``k``, row by row (and, with ``--slow``, a training run's losses and returns). Before,
a group other than a runner's first drew from whichever sub-env ran it: one seed gave two
different runs at ``k = 1`` and ``k = B``, which had been read as a learning gap.
"""

from __future__ import annotations

import itertools
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
#: sampler variants: the batched sampler with all B groups in flight (the default), with 2 and
#: with 1 (one group at a time), and RLlib's sampler
SAMPLERS = ("batched", "batched_k2", "batched_k1", "rllib")
IN_FLIGHT = {"batched_k2": 2, "batched_k1": 1}
LLM = {"type": "llm", "path": "tiny"}


def config(variant: str, **algorithm: Any) -> ExperimentConfig:
    sampler = "rllib" if variant == "rllib" else "batched"
    if variant in IN_FLIGHT:
        algorithm = {"groups_in_flight": IN_FLIGHT[variant], **algorithm}
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


def runner(variant: str, **algorithm: Any) -> Any:
    cls = MultiAgentEnvRunner if variant == "rllib" else BatchedEnvRunner
    return cls(config=to_algorithm_config(config(variant, **algorithm)), worker_index=0)


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


def test_groups_are_whole_and_hold_the_same_tasks_on_every_sampler(sampled) -> None:
    tasks = {}
    for sampler, (_, iterations) in sampled.items():
        tasks[sampler] = []
        for episodes in iterations:
            sizes = Counter(episode_seed(sa) for sa in router_episodes(episodes))
            assert sorted(sizes.values()) == [G] * B, (sampler, sizes)
            tasks[sampler].append(sorted(sizes))
    for sampler in SAMPLERS:
        assert tasks[sampler] == tasks["rllib"], sampler
    assert [sampled[s][0].num_envs for s in SAMPLERS] == [G * B, G * 2, G, 1]
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


def test_all_samplers_sample_the_same_policy() -> None:
    """The same weights, many episodes: each task's success rate of every variant agrees with
    RLlib's sampler's within 4 binomial standard errors (the seeds are fixed: no flakiness);
    the batched sampler runs all 32 groups side by side (128 rows a ``generate``) and one at a
    time."""
    rates = {}
    for sampler in ("batched", "batched_k1", "rllib"):
        r = runner(sampler, groups_per_iteration=32)
        module = r.module["router"]
        rows = [(task_of(module, sa), float(np.sum(sa.get_rewards())))
                for sa in router_episodes(r.sample(num_episodes=G * 32, explore=True))]  # fmt: skip
        rates[sampler] = {t: [x for task, x in rows if task == t] for t in TASKS}
    for sampler, t in itertools.product(("batched", "batched_k1"), TASKS):
        a, b = rates[sampler][t], rates["rllib"][t]
        assert len(a) >= 16 and len(b) >= 16, (sampler, t, len(a), len(b))
        p = (sum(a) + sum(b)) / (len(a) + len(b))
        se = np.sqrt(p * (1 - p) * (1 / len(a) + 1 / len(b)))
        assert abs(np.mean(a) - np.mean(b)) <= 4 * se + 1e-9, (sampler, t, np.mean(a), np.mean(b))


def learner_rows(module: Any, episodes: list[Any]) -> list[tuple[Any, ...]]:
    """The router's rows as the GRPO learner gets them, in batch order: task seed, prompt,
    sampled tokens, behaviour log-probabilities, reward and advantage."""
    connector = GRPOAdvantages(grpo=GRPOLoss())
    mine = list(connector.single_agent_episode_iterator(episodes, agents_that_stepped_only=False))
    mine = [sa for sa in mine if sa.module_id == "router"]
    actions = torch.as_tensor(np.concatenate([np.asarray(sa.get_actions()) for sa in mine]))
    batch = connector(rl_module=module, batch={"router": {Columns.ACTIONS: actions}},
                      episodes=episodes)  # fmt: skip
    adv = iter(batch["router"][ADVANTAGES].numpy().tolist())
    return [
        (
            episode_seed(sa),
            np.asarray(sa.get_observations()[t]).tobytes(),
            np.asarray(sa.get_actions()[t]).tobytes(),
            np.asarray(sa.get_extra_model_outputs(TOKEN_LOGP)[t]),
            float(np.sum(sa.get_rewards())),
            next(adv),
        )
        for sa in mine
        for t in range(len(sa))
    ]


def test_the_learner_gets_the_same_rows_at_every_k(sampled) -> None:
    """Issue #44: ``groups_in_flight`` changes how groups are batched, never what the learner
    gets. Every group of both iterations (not only a runner's first) holds the same tokens at
    ``k = 1``, 2 and ``B``, in the same batch order, with the same behaviour log-probabilities,
    rewards and advantages: each rollout draws from its own stream (group, member), not its
    sub-env's, and ``sample()`` returns episodes in schedule order. Before, group ``q ≥ 1`` drew
    from whichever sub-env ran it (a different run at each ``k`` from the same seed) and rows
    came in finishing order, which is by outcome here (a right route is one step longer)."""
    rows = {}
    for sampler in ("batched", "batched_k2", "batched_k1"):
        r, iterations = sampled[sampler]
        rows[sampler] = [learner_rows(r.module, episodes) for episodes in iterations]
    for sampler in ("batched_k2", "batched_k1"):
        for got, want in zip(rows[sampler], rows["batched"], strict=True):
            assert [x[:3] for x in got] == [x[:3] for x in want], sampler
            np.testing.assert_allclose(
                np.stack([x[3] for x in got]), np.stack([x[3] for x in want]), atol=1e-5
            )
            assert [x[4] for x in got] == [x[4] for x in want], sampler
            np.testing.assert_allclose([x[5] for x in got], [x[5] for x in want], atol=1e-6)
    # rows in schedule order: the iteration's groups one after another, each whole
    seeds = [x[0] for x in rows["batched"][0]]
    assert seeds == sorted(seeds, key=seeds.index) and len(set(seeds)) == B


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_training_is_the_same_at_every_k(tmp_path) -> None:
    """Issue #44, end to end: three GRPO iterations (updates between samples) with all ``B``
    groups in flight and with one at a time log the same losses and returns (to float
    rounding: the two batch their ``generate`` calls differently)."""
    from configs import learning_rows

    from trainers.run.loop import train

    rows = {}
    for variant in ("batched", "batched_k1"):
        cfg = config(variant).replace(
            **{
                "budget.iterations": 3,
                "logging.wandb": "disabled",
                "logging.progress": False,
                "output.dir": str(tmp_path / "runs"),
                "output.name": variant,
                "output.checkpoint_every": 0,
                "output.plot": False,
            }
        )
        rows[variant] = learning_rows(train(cfg).run_dir)
    assert len(rows["batched"]) == 3
    for got, want in zip(rows["batched_k1"], rows["batched"], strict=True):
        assert got.keys() == want.keys()
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_marl_finetune_and_grpo_experiments_share_one_groups_in_flight_default() -> None:
    """One default (``GRPOSettings.groups_in_flight``): ``marl finetune``'s job resolves to all
    of a runner's groups in flight, as any GRPO experiment."""
    from trainers.configs.grpo import GRPOSettings
    from trainers.finetune import FinetuneJob, TrainingConfig
    from trainers.plan import groups_in_flight

    assert TrainingConfig().groups_in_flight == GRPOSettings().groups_in_flight
    experiment = FinetuneJob().to_experiment()
    grpo = experiment.algorithm.grpo
    assert grpo.groups_in_flight == GRPOSettings().groups_in_flight
    assert groups_in_flight(experiment) == grpo.groups_per_iteration  # one runner: all of them
    assert groups_in_flight(config("batched")) == B


@pytest.mark.parametrize(("sampler", "k"), [("batched", B), ("batched_k2", 2), ("batched_k1", 1)])
def test_one_generate_covers_every_group_in_flight(sampler: str, k: int) -> None:
    """The router acts once, at an episode's first step: with ``k`` groups in flight each of
    its ``generate`` calls covers the ``k·G`` sub-envs (counted at the module), so a sample of
    ``B`` groups takes ``ceil(B / k)`` calls; the worker's rows of a step share one call too."""
    r = runner(sampler)
    calls: dict[str, list[int]] = {"router": [], "worker": []}
    for mid, sizes in calls.items():
        module = r.module[mid]
        generate = module.generate

        def spy(prompts: list, *args: Any, _g: Any = generate, _s: list = sizes, **kw: Any):
            _s.append(len(prompts))
            return _g(prompts, *args, **kw)

        module.generate = spy
    episodes = r.sample(num_episodes=G * B, explore=True)
    rounds = [min(k, B - q) * G for q in range(0, B, k)]
    assert calls["router"] == rounds
    assert sum(calls["worker"]) == sum(len(e) == 2 for e in episodes)
    assert len(calls["worker"]) <= len(rounds)
    assert r.get_metrics()["marl"]["llm"]["rows_per_generate"] > 0


def test_a_built_in_text_scenario_keeps_whole_groups_at_every_k() -> None:
    """``text-delegate`` (a built-in text scenario, what ``marl finetune`` trains): with all
    groups in flight (one ``generate`` of ``B·G`` rows) and one at a time, every group whole
    and the same tasks per iteration."""
    from trainers.finetune import FinetuneJob, OrchestratorConfig, TrainingConfig

    tasks = {}
    for k in (None, 1):
        job = FinetuneJob(
            orchestrator=OrchestratorConfig(model="tiny"),
            topology="star:2",
            scenario_kwargs={"level": "easy", "max_new_tokens": 4},
            training=TrainingConfig(group_size=G, groups_per_iteration=B, groups_in_flight=k),
        )
        r = BatchedEnvRunner(config=to_algorithm_config(job.to_experiment()), worker_index=0)
        assert r.num_envs == G * (k or B)
        tasks[k] = []
        for _ in range(2):
            episodes = r.sample(num_episodes=G * B, explore=True)
            sizes = Counter(episode_seed(e.agent_episodes["orchestrator"]) for e in episodes)
            assert sorted(sizes.values()) == [G] * B, (k, sizes)
            tasks[k].append(sorted(sizes))
        if k is None:
            assert r.get_metrics()["marl"]["llm"]["rows_per_generate"] == G * B
    assert tasks[None] == tasks[1]
    with pytest.raises(ValueError, match="only moves forward"):  # a group index already used
        r.env.envs[0].unwrapped.seek(0)


@pytest.mark.usefixtures("ray_session")
def test_a_stopped_run_resumes_the_group_schedule_exactly(tmp_path) -> None:
    """Two groups in flight for ``B = 3`` (a slot idles in each sample's second round): a run
    stopped after iteration 2 and resumed samples the uninterrupted run's groups (the runner's
    ``groups_done`` is saved with its sampler state), so losses and returns agree."""
    from configs import learning_rows

    from trainers.run.loop import train

    class Stop(Exception):
        pass

    def stop_after_two(row: dict[str, Any]) -> None:
        if row["charts/iteration"] == 2:
            raise Stop

    def run(name: str) -> ExperimentConfig:
        return config("batched_k2").replace(
            **{
                "budget.iterations": 3,
                "logging.wandb": "disabled",
                "logging.progress": False,
                "output.dir": str(tmp_path / "runs"),
                "output.name": name,
                "output.checkpoint_every": 1,
                "output.plot": False,
            }
        )

    full = train(run("full"))
    with pytest.raises(Stop):
        train(run("part"), report=stop_after_two)
    resumed = train(resume=tmp_path / "runs" / "part")
    assert resumed.status == "completed"
    want = learning_rows(full.run_dir)
    assert len(want) == 3 and learning_rows(resumed.run_dir) == want
