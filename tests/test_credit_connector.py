"""The credit learner connector on real ``delegate`` / ``relay`` episodes.

Episodes are sampled by stepping :class:`RLlibGraphEnv` with seeded policies and recorded in
RLlib's own ``MultiAgentEpisode`` (numpy'd, as env runners send them); the connector is called
directly, or inside a real PPO learner pipeline built without Ray (``config.build_learner``).
Every expected credit is recomputed independently through ``GraphEnv.value`` (plain cached
replays, no trie). No Ray, no wall-clock thresholds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from ray.rllib.connectors.learner import (
    AddOneTsToEpisodesAndTruncate,
    GeneralAdvantageEstimation,
)
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from trainers.configs.credit import CreditConfig
from trainers.configs.typed import ConfigError
from trainers.credit.connector import (
    VERIFY_EVERY,
    VERIFY_FIRST,
    CreditConnector,
    CreditConnectorFactory,
    make_credit_connector,
)
from trainers.credit.settings import CreditError
from trainers.credit.trie import EpisodeReplays
from trainers.credit.values import leave_one_out, shapley_exact
from trainers.learners.credit_ppo import CreditPPOTorchLearner, PerAgentAdvantageNormalization

scenarios = pytest.importorskip("scenarios")
from rllib_episodes import record_episode  # noqa: E402

from scenarios.rllib_env import RLlibGraphEnv  # noqa: E402

Policy = Callable[[str, Any], Any]
DELEGATE = {"scenario": "delegate", "topology": "star:3", "kwargs": {"parts": 3, "types": 3}}
#: worker_1 has no skill at all: whatever it does, its parts fail (a null player)
NULL_SKILLS = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.6, 0.6, 0.6]]
NULL_WORKER = {
    "scenario": "delegate",
    "topology": "star:3",
    "kwargs": {"parts": 3, "types": 3, "skills": NULL_SKILLS, "max_rounds": 3},
}


# ----- sampling real episodes -------------------------------------------------------------------
def random_policy(env: RLlibGraphEnv, seed: int) -> Policy:
    rng = np.random.default_rng(seed)

    def policy(agent: str, obs: Any) -> Any:
        space = env.action_spaces[agent]
        return rng.integers(space.nvec) if hasattr(space, "nvec") else rng.integers(space.n)

    return policy


def round_robin(env: RLlibGraphEnv) -> Policy:
    """Orchestrator: part i to worker i (every round); workers: the scripted right method."""
    scenario = env.env.scenario

    def policy(agent: str, obs: Any) -> Any:
        if agent == "orchestrator":
            return np.arange(1, scenario.parts + 1) % (scenario.n_workers + 1)
        return scenario.scripted_worker(agent, obs)

    return policy


def module_of(agent_id: str, episode: Any = None, **kwargs: Any) -> str:
    return "orchestrator" if agent_id == "orchestrator" else "worker"


def sample(
    env: RLlibGraphEnv,
    seed: int,
    policy: Policy,
    *,
    numpy: bool = True,
    strip: tuple[str, ...] = (),
) -> MultiAgentEpisode:
    """One finished episode of ``env`` under ``policy``, recorded as RLlib records it."""
    return record_episode(env, seed, policy, module_of=module_of, strip=strip, numpy=numpy)


def final(episode: MultiAgentEpisode) -> tuple[Any, int, dict[str, list[Any]]]:
    """The episode's Outcome, seed and each player's actions (read back from the episode)."""
    outcome = seed = None
    actions = {}
    for agent, sa in episode.agent_episodes.items():
        infos = sa.get_infos()
        k = next(i for i, info in enumerate(infos) if "outcome" in info)
        outcome, seed = infos[k]["outcome"], infos[0]["seed"]
        actions[agent] = [sa.get_actions(i) for i in range(k)]
    return outcome, seed, actions


def terminal_rewards(episode: MultiAgentEpisode) -> dict[str, float]:
    out = {}
    for agent, sa in episode.agent_episodes.items():
        infos = sa.get_infos()
        k = next(i for i, info in enumerate(infos) if "outcome" in info)
        out[agent] = float(sa.get_rewards(k - 1))
    return out


def connector(env_config: dict[str, Any], **credit: Any) -> CreditConnector:
    return make_credit_connector(CreditConfig(**credit), env_config)(None, None)


@pytest.fixture(scope="module")
def delegate_env() -> RLlibGraphEnv:
    return RLlibGraphEnv(DELEGATE)


@pytest.fixture(scope="module")
def null_env() -> RLlibGraphEnv:
    return RLlibGraphEnv(NULL_WORKER)


# ----- the factory ------------------------------------------------------------------------------
def test_factory_has_rllibs_learner_connector_form() -> None:
    from ray.rllib.algorithms.ppo import PPOConfig

    factory = make_credit_connector(CreditConfig(method="loo"), DELEGATE)
    assert isinstance(factory, CreditConnectorFactory)
    config = PPOConfig().learners(learner_connector=factory)
    pipeline = config.build_learner_connector(None, None)
    assert isinstance(pipeline.connectors[0], CreditConnector)
    assert pipeline.connectors[0].credit.method == "loo"
    import cloudpickle

    clone = cloudpickle.loads(cloudpickle.dumps(factory))  # shipped to remote learners
    assert isinstance(clone(None, None), CreditConnector)


@pytest.mark.parametrize(
    ("credit", "match"),
    [
        ({"method": "difference"}, "unknown credit method"),
        ({"method": "shapley", "estimator": "stratified"}, "unknown Shapley estimator"),
        ({"method": "shapley", "budget": 0}, "credit.budget"),
        ({"method": "shapley", "budget": 1}, "credit.budget"),
        ({"method": "shapley", "exact_max": -1}, "exact_max"),
        ({"method": "shapley", "exact_max": 17}, "exact_max"),
        ({"method": "shapley", "workers": 0}, "credit.workers"),
    ],
)
def test_bad_settings_are_refused_with_the_fix(credit: dict[str, Any], match: str) -> None:
    """The connector takes the CreditConfig as it is, checked by its own check()."""
    with pytest.raises(ConfigError, match=match):
        make_credit_connector(CreditConfig(**credit), DELEGATE)


# ----- each method rewrites the terminal reward ------------------------------------------------
def test_team_leaves_rewards_alone(delegate_env: RLlibGraphEnv) -> None:
    ep = sample(delegate_env, 1, random_policy(delegate_env, 1))
    before = terminal_rewards(ep)
    rec = connector(DELEGATE, method="team").assign(ep)
    assert terminal_rewards(ep) == pytest.approx(before)
    assert rec.credits == pytest.approx(dict.fromkeys(before, rec.team_return))
    assert rec.replays == 0


def test_local_gives_each_agent_its_outcome_local(delegate_env: RLlibGraphEnv) -> None:
    for seed in range(4):
        ep = sample(delegate_env, seed, random_policy(delegate_env, seed))
        outcome, _, _ = final(ep)
        connector(DELEGATE, method="local").assign(ep)
        assert terminal_rewards(ep) == pytest.approx({a: outcome.local[a] for a in ep.agent_ids})


def test_loo_is_v_full_minus_v_without_agent(delegate_env: RLlibGraphEnv) -> None:
    genv = delegate_env.env
    for seed in range(4):
        ep = sample(delegate_env, seed, random_policy(delegate_env, seed))
        outcome, s, actions = final(ep)
        players = list(actions)
        full = frozenset(players)
        expected = {
            a: genv.value(s, full, actions) - genv.value(s, full - {a}, actions) for a in players
        }
        connector(DELEGATE, method="loo").assign(ep)
        # the episode's terminal reward was the team return: it is replaced by the credit
        assert terminal_rewards(ep) == pytest.approx(expected)
        direct = leave_one_out(players, lambda c, s=s, a=actions: genv.value(s, c, a))
        assert expected == pytest.approx(direct)


def test_shapley_exact_matches_direct_replays(delegate_env: RLlibGraphEnv) -> None:
    genv = delegate_env.env
    for seed in range(3):
        ep = sample(delegate_env, seed, random_policy(delegate_env, seed))
        _, s, actions = final(ep)
        expected = shapley_exact(list(actions), lambda c, s=s, a=actions: genv.value(s, c, a))
        rec = connector(DELEGATE, method="shapley").assign(ep)
        assert rec.credits == pytest.approx(expected, abs=1e-12)
        assert terminal_rewards(ep) == pytest.approx(expected, abs=1e-12)


def test_unfinished_chunk_is_left_untouched(delegate_env: RLlibGraphEnv) -> None:
    env = delegate_env
    ep = record_episode(env, 5, random_policy(env, 5), steps=1)
    assert not ep.is_done
    conn = connector(DELEGATE, method="shapley")
    before = {a: list(sa.get_rewards()) for a, sa in ep.agent_episodes.items()}
    assert conn.assign(ep) is None
    assert {a: list(sa.get_rewards()) for a, sa in ep.agent_episodes.items()} == before
    assert conn.totals["skipped"] == 1


# ----- efficiency and the null player ----------------------------------------------------------
@pytest.mark.parametrize(
    "credit",
    [
        {"estimator": "exact"},
        {"estimator": "permutation", "exact_max": 0, "budget": 9},
        {"estimator": "antithetic", "exact_max": 0, "budget": 9},
        {"estimator": "kernel", "exact_max": 0, "budget": 9},
        {"estimator": "auto", "exact_max": 0, "budget": 9},
    ],
    ids=lambda c: c["estimator"],
)
def test_efficiency_on_rewritten_rewards(delegate_env: RLlibGraphEnv, credit: dict) -> None:
    genv = delegate_env.env
    conn = connector(DELEGATE, method="shapley", **credit)
    for seed in range(6):
        ep = sample(delegate_env, 10 + seed, random_policy(delegate_env, 10 + seed))
        outcome, s, actions = final(ep)
        before = terminal_rewards(ep)
        rec = conn.assign(ep)
        after = terminal_rewards(ep)
        v_empty = genv.value(s, frozenset(), actions)
        assert rec.v_empty == pytest.approx(v_empty)
        # the credits, and so the change of the summed terminal rewards, sum to v(N) − v(∅)
        assert sum(rec.credits.values()) == pytest.approx(outcome.reward - v_empty, abs=1e-9)
        n = len(after)
        assert sum(after.values()) - sum(before.values()) + n * outcome.reward == pytest.approx(
            outcome.reward - v_empty, abs=1e-9
        )


@pytest.mark.parametrize("method", ["shapley", "loo"])
def test_null_player_gets_zero(null_env: RLlibGraphEnv, method: str) -> None:
    conn = connector(NULL_WORKER, method=method)
    seen = 0
    for seed in range(4):
        ep = sample(null_env, seed, round_robin(null_env))
        assert "worker_1" in ep.agent_ids  # it acted (and always failed)
        rec = conn.assign(ep)
        assert rec.credits["worker_1"] == pytest.approx(0.0, abs=1e-12)
        assert terminal_rewards(ep)["worker_1"] == pytest.approx(0.0, abs=1e-12)
        seen += rec.credits["worker_0"] > 0  # a skilled worker that solved its part
    assert seen > 0


# ----- replays: the trie against GraphEnv.value, cache counts -----------------------------------
@pytest.mark.parametrize("absent", ["default", "skip", "placeholder"])
def test_replays_equal_graphenv_value_for_every_coalition(
    delegate_env: RLlibGraphEnv, absent: str
) -> None:
    genv = delegate_env.env
    for seed in range(2):
        ep = sample(delegate_env, seed, random_policy(delegate_env, seed))
        _, s, actions = final(ep)
        replays = EpisodeReplays(genv, s, actions, absent=absent)
        players = sorted(actions)
        for r in range(len(players) + 1):
            for c in itertools.combinations(players, r):
                assert replays(c) == pytest.approx(genv.value(s, c, actions, absent=absent))
        assert replays.lookups == 2 ** len(players)
        assert replays.replays < 2 ** len(players)


def test_coalitions_with_the_same_actions_share_one_replay(delegate_env: RLlibGraphEnv) -> None:
    """Absent orchestrator: nobody else is asked, so 2^(n−1) coalitions cost one replay."""
    ep = sample(delegate_env, 3, random_policy(delegate_env, 3))
    _, s, actions = final(ep)
    replays = EpisodeReplays(delegate_env.env, s, actions)
    workers = [a for a in actions if a != "orchestrator"]
    for r in range(len(workers) + 1):
        for c in itertools.combinations(workers, r):
            replays(c)
    assert replays.replays == 1
    assert replays.lookups == 2 ** len(workers)


def test_a_worker_that_only_passes_costs_no_replay(delegate_env: RLlibGraphEnv) -> None:
    """Present or absent, a worker whose recorded actions are all 'pass' feeds the same actions."""
    base = random_policy(delegate_env, 0)

    def policy(agent: str, obs: Any) -> Any:
        if agent == "worker_0":
            return np.zeros(3, dtype=np.int64)
        return np.array([1, 1, 2]) if agent == "orchestrator" else base(agent, obs)

    ep = sample(delegate_env, 0, policy)
    _, s, actions = final(ep)
    replays = EpisodeReplays(delegate_env.env, s, actions)
    full = frozenset(actions)
    replays(full)
    replays(full - {"worker_0"})
    assert replays.replays == 1


def test_cache_counts_of_exact_shapley(delegate_env: RLlibGraphEnv) -> None:
    conn = connector(DELEGATE, method="shapley")
    ep = sample(delegate_env, 7, random_policy(delegate_env, 7))
    n = len(ep.agent_ids)
    rec = conn.assign(ep)
    assert rec.coalitions == 2**n  # every coalition once
    assert rec.lookups == 2**n + 2  # plus the v(N) check and v(∅), served from the cache
    assert 1 <= rec.replays <= 2 ** (n - 1) + 1  # no-orchestrator coalitions share one replay
    assert {k: v for k, v in conn.totals.items() if k != "seconds"} == {
        "episodes": 1,
        "lookups": rec.lookups,
        "coalitions": 2**n,
        "replays": rec.replays,
        "skipped": 0,
        "verified": 1,  # the first episodes' v(N) is replayed and checked
    }


def test_v_full_is_replayed_only_to_verify(delegate_env: RLlibGraphEnv) -> None:
    """Past the first episodes, v(N) is the episode's return: same credits, one replay less."""
    env_config = {**DELEGATE, "topology": "star:1"}
    env = RLlibGraphEnv(env_config)
    eps = [sample(env, s, random_policy(env, s)) for s in range(VERIFY_FIRST + 2)]
    fresh = [connector(env_config, method="loo").assign(ep) for ep in eps]
    eps = [sample(env, s, random_policy(env, s)) for s in range(VERIFY_FIRST + 2)]
    conn = connector(env_config, method="loo")
    recs = [conn.assign(ep) for ep in eps]
    assert [r.verified for r in recs] == [
        i < VERIFY_FIRST or i % VERIFY_EVERY == 0 for i in range(len(recs))
    ]
    assert all(f.verified for f in fresh)
    for f, r in zip(fresh, recs, strict=True):
        assert r.credits == pytest.approx(f.credits, abs=1e-12)
        assert r.replays == f.replays - (not r.verified)  # N's path is shared by no coalition
    assert conn.totals["verified"] == VERIFY_FIRST


class ReportsActions(RLlibGraphEnv):
    """An env that reports the executed actions in the final infos (``infos["actions"]``)."""

    def step(self, action_dict: Any) -> tuple[Any, ...]:
        out = super().step(action_dict)
        if out[2]["__all__"] or out[3]["__all__"]:
            executed = self.env.episode_actions()
            for info in out[4].values():
                info["actions"] = executed
        return out


def test_executed_actions_from_infos_win_over_stored_ones() -> None:
    env = ReportsActions(DELEGATE)
    ep = sample(env, 3, random_policy(env, 3))
    expected = (
        connector(DELEGATE, method="shapley").assign(sample(env, 3, random_policy(env, 3))).credits
    )
    # the stored action is not what the env executed (as for an unsquashed Box action)
    ep.agent_episodes["orchestrator"].set_actions(new_data=np.zeros(3, np.int64), at_indices=0)
    rec = connector(DELEGATE, method="shapley").assign(ep)
    assert rec.verified
    assert rec.credits == pytest.approx(expected, abs=1e-12)


# ----- errors that name the fix -----------------------------------------------------------------
def test_local_without_outcome_local_names_the_fix() -> None:
    relay = {"scenario": "relay", "topology": "star:2"}
    env = RLlibGraphEnv(relay)
    ep = sample(env, 0, random_policy(env, 0))
    with pytest.raises(CreditError, match=r"Outcome\.local.*'loo' or 'shapley'"):
        connector(relay, method="local").assign(ep)


def test_chunk_that_misses_the_reset_names_complete_episodes(delegate_env: RLlibGraphEnv) -> None:
    env = delegate_env
    # cut after the first step, as truncate_episodes does at a batch boundary
    chunk = record_episode(env, 2, random_policy(env, 2), cut_after=1, numpy=False)
    assert chunk.env_t_started > 0
    with pytest.raises(CreditError, match="complete_episodes"):
        connector(DELEGATE, method="shapley").assign(chunk)


def test_missing_seed_names_the_env(delegate_env: RLlibGraphEnv) -> None:
    ep = sample(delegate_env, 0, random_policy(delegate_env, 0), strip=("seed",))
    with pytest.raises(CreditError, match=r"'seed'.*RLlibGraphEnv"):
        connector(DELEGATE, method="loo").assign(ep)


def test_finished_episode_without_outcome_names_the_env(delegate_env: RLlibGraphEnv) -> None:
    ep = sample(delegate_env, 0, random_policy(delegate_env, 0), strip=("outcome",))
    with pytest.raises(CreditError, match=r"'outcome'.*RLlibGraphEnv"):
        connector(DELEGATE, method="shapley").assign(ep)


def test_actions_that_do_not_replay_the_episode_are_caught(delegate_env: RLlibGraphEnv) -> None:
    ep = next(
        e
        for seed in range(20)
        if abs(final(e := sample(delegate_env, seed, random_policy(delegate_env, seed)))[0].reward)
        > 1e-6
    )
    # as if the env had reported other actions than it executed: the orchestrator assigns nothing
    for sa in ep.agent_episodes.values():
        sa.get_infos(-1)["actions"]["orchestrator"][0] = np.zeros(3, np.int64)
    with pytest.raises(CreditError, match="not the ones the env executed"):
        connector(DELEGATE, method="shapley").assign(ep)


def test_single_agent_episodes_are_refused() -> None:
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    with pytest.raises(CreditError, match="MultiAgentEpisode"):
        connector(DELEGATE, method="loo").assign(SingleAgentEpisode())


# ----- inside RLlib: metrics, PPO's extra timestep, the learner pipeline ------------------------
def test_metrics_are_logged_per_agent_and_per_iteration(delegate_env: RLlibGraphEnv) -> None:
    conn = connector(DELEGATE, method="shapley")
    eps = [sample(delegate_env, s, random_policy(delegate_env, s)) for s in range(3)]
    metrics = MetricsLogger(root=True)
    conn(rl_module=None, batch={}, episodes=eps, metrics=metrics)
    out = metrics.reduce()
    credit = {a: stats.peek() for a, stats in out["credit"].items()}
    expected: dict[str, list[float]] = {}
    for rec in conn.last:
        for a, c in rec.credits.items():
            expected.setdefault(a, []).append(c)
    assert credit == pytest.approx({a: np.mean(v) for a, v in expected.items()})
    assert out["credit_cost"]["episodes"].peek() == 3
    assert out["credit_cost"]["replays"].peek() == sum(r.replays for r in conn.last)


def test_rewrite_hits_the_real_terminal_step_after_ppos_extra_timestep(
    delegate_env: RLlibGraphEnv,
) -> None:
    ep = sample(delegate_env, 4, random_policy(delegate_env, 4))
    expected = (
        connector(DELEGATE, method="loo")
        .assign(sample(delegate_env, 4, random_policy(delegate_env, 4)))
        .credits
    )
    AddOneTsToEpisodesAndTruncate()(rl_module=None, batch={}, episodes=[ep], shared_data={})
    connector(DELEGATE, method="loo").assign(ep)
    for agent, sa in ep.agent_episodes.items():
        rewards = sa.get_rewards()
        assert rewards[-2] == pytest.approx(expected[agent])  # the real terminal step
        assert rewards[-1] == 0.0  # PPO's bootstrap step stays empty


def test_learner_pipeline_credits_before_gae_and_normalises_after() -> None:
    """A real PPO learner (no Ray): rewards are credited before GAE, advantages per agent after."""
    from ray.rllib.algorithms.ppo import PPOConfig

    env_config = {**DELEGATE, "topology": "star:2"}
    env = RLlibGraphEnv(env_config)
    factory = make_credit_connector(CreditConfig(method="shapley", normalize=True), env_config)
    config = (
        PPOConfig()
        .environment(RLlibGraphEnv, env_config=env_config)
        .multi_agent(policies={"orchestrator", "worker"}, policy_mapping_fn=module_of)
        .learners(learner_connector=factory, learner_class=CreditPPOTorchLearner)
        .training(gamma=1.0, lambda_=1.0)
    )
    learner = config.build_learner(env=env)
    names = [type(p).__name__ for p in learner._learner_connector.connectors]
    assert names.index("CreditConnector") < names.index("GeneralAdvantageEstimation")
    assert names[names.index("GeneralAdvantageEstimation") + 1] == (
        "PerAgentAdvantageNormalization"
    )
    eps = [sample(env, s, random_policy(env, s)) for s in range(8)]
    batch = learner._learner_connector(
        rl_module=learner.module, batch={}, episodes=eps, shared_data={}, metrics=learner.metrics
    )
    credit = learner._learner_connector.connectors[names.index("CreditConnector")].last
    # gamma = lambda = 1 and only a terminal reward: every value target of an agent's episode
    # is that agent's credit, so GAE saw the credited rewards
    targets = np.asarray(batch["orchestrator"][Postprocessing.VALUE_TARGETS])
    mask = np.asarray(batch["orchestrator"][Columns.LOSS_MASK]).astype(bool)
    expected = np.concatenate(
        [
            np.full(len(ep.agent_episodes["orchestrator"]), rec.credits["orchestrator"])
            for ep, rec in zip(eps, credit, strict=True)
        ]
    )
    assert not mask.all()  # PPO's extra timestep is in the batch, masked out
    assert targets[mask] == pytest.approx(expected[mask], abs=1e-6)
    # the shared worker module: each worker's advantages standardised on its own
    adv = np.asarray(batch["worker"][Postprocessing.ADVANTAGES])
    wmask = np.asarray(batch["worker"][Columns.LOSS_MASK]).astype(bool)
    workers = [
        ep.agent_episodes[a]
        for ep in eps
        for a in ep.agent_ids  # RLlib's batch order (GAE relies on it too)
        if ep.agent_episodes[a].module_id == "worker"
    ]
    # the order is checked, not assumed: the batch's observations are the episodes' in it
    obs = np.concatenate([sa.get_observations(slice(0, len(sa))) for sa in workers])
    assert np.asarray(batch["worker"][Columns.OBS]) == pytest.approx(obs)
    rows = np.concatenate([np.full(len(sa), sa.agent_id, dtype=object) for sa in workers])
    checked = 0
    for agent in ("worker_0", "worker_1"):
        pick = (rows == agent) & wmask
        if np.ptp(adv[pick]) > 1e-6:
            assert adv[pick].mean() == pytest.approx(0.0, abs=1e-5)
            assert adv[pick].std() == pytest.approx(1.0, abs=1e-3)
            checked += 1
    assert checked >= 1


def test_normalisation_piece_only_when_asked() -> None:
    from ray.rllib.algorithms.ppo import PPOConfig

    env_config = {**DELEGATE, "topology": "star:2"}
    config = (
        PPOConfig()
        .environment(RLlibGraphEnv, env_config=env_config)
        .multi_agent(policies={"orchestrator", "worker"}, policy_mapping_fn=module_of)
        .learners(
            learner_connector=make_credit_connector(CreditConfig(method="loo"), env_config),
            learner_class=CreditPPOTorchLearner,
        )
    )
    learner = config.build_learner(env=RLlibGraphEnv(env_config))
    pieces = learner._learner_connector.connectors
    assert isinstance(pieces[-1], GeneralAdvantageEstimation)
    assert not any(isinstance(p, PerAgentAdvantageNormalization) for p in pieces)


def test_one_ppo_iteration_with_shapley_credit(ray_session: Any) -> None:
    """The real training path (trainers.algo → RLlib PPO, one local env runner) credits episodes."""
    from trainers.algo import to_algorithm_config
    from trainers.configs.experiment import ExperimentConfig

    cfg = ExperimentConfig.from_dict(
        {
            "scenario": "delegate",
            "topology": "star:2",
            "credit": {"method": "shapley", "normalize": True},
            "algorithm": {"train_batch_size": 128, "minibatch_size": 64, "num_epochs": 1},
            "resources": {"num_env_runners": 0, "num_envs_per_env_runner": 2},
        }
    )
    config = to_algorithm_config(cfg)
    assert config.batch_mode == "complete_episodes"
    algo = config.build_algo()
    try:
        learners = algo.train()["learners"]
        learner = algo.learner_group._learner
        pieces = [type(p).__name__ for p in learner._learner_connector.connectors]
    finally:
        algo.stop()
    # the GAE piece: value-normalising by default (algorithm.value_norm, issue #27)
    assert pieces.index("CreditConnector") < pieces.index("ValueNormGAE")
    assert pieces[-1] == "PerAgentAdvantageNormalization"
    cost = {k: v.peek() if hasattr(v, "peek") else v for k, v in learners["credit_cost"].items()}
    assert cost["episodes"] > 0 and cost["coalitions"] >= cost["episodes"]
    assert "orchestrator" in learners["credit"]


def test_workers_spread_episodes_over_ray_actors_with_the_same_credits(ray_session) -> None:
    """credit.workers=2 replays part of a batch in a Ray actor: same credits, same counts."""
    env_config = {**DELEGATE, "topology": "star:2"}
    env = RLlibGraphEnv(env_config)
    batch = [sample(env, s, random_policy(env, s)) for s in range(12)]
    serial = connector(env_config, method="shapley").assign_all(batch)
    batch = [sample(env, s, random_policy(env, s)) for s in range(12)]
    parallel = connector(env_config, method="shapley", workers=2)
    records = parallel.assign_all(batch)
    assert parallel.pool.actors is not None and len(parallel.pool.actors) == 1
    assert [r.seed for r in records] == [r.seed for r in serial]
    for s, p in zip(serial, records, strict=True):
        assert p.credits == s.credits
        assert (p.replays, p.verified) == (s.replays, s.verified)
    assert parallel.totals["episodes"] == 12
    # the rewrite reached the episodes: terminal rewards are the credits
    for ep, rec in zip(batch, records, strict=True):
        for agent, credit in rec.credits.items():
            rewards = ep.agent_episodes[agent].get_rewards()
            assert rewards[-1] == pytest.approx(credit + (sum(rewards[:-1]) * 0))
