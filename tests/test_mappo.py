"""Centralised critics (CTDE; issue #27 item 2): the global-state contract, actors that never
read it, the critic column on both learner paths, and MAPPO with frozen pools, credit, GRU
actors, remote env runners, checkpoints/resume, evaluate, the CLI and sweeps (tiny budgets)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from configs import tiny_config
from test_learner_batch import _batches, assert_same_batch
from test_train_cli import MARL, TINY_YAML, cli_env, only_run

from marl_agents.critics import CRITIC_OBS
from scenarios.global_state import STATE_INFO
from trainers.configs.algorithms import ALGORITHMS, IPPOAlgo, MAPPOAlgo
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError

MAPPO = {"name": "MAPPO", "train_batch_size": 128, "minibatch_size": 64, "num_epochs": 1}
GRU = {"type": "gru", "gru_size": 8, "hidden": [16]}


def mappo(tmp_path: Path, **sections: Any) -> Any:
    algo = {**MAPPO, **sections.pop("algorithm", {})}
    return tiny_config(tmp_path, algorithm=algo, **sections)


# ----- the contract, no Ray ------------------------------------------------------------------
def test_spread_reports_mpe2_state_with_every_observation() -> None:
    from mpe2 import simple_spread_v3

    from scenarios.rllib_env import RLlibGraphEnv
    from scenarios.spread import env_seed

    env = RLlibGraphEnv({"scenario": "spread"})
    assert env.env.state_space.shape == (54,)
    ref = simple_spread_v3.parallel_env(**env.env.scenario.env_kwargs)
    ref.reset(seed=env_seed(np.random.default_rng(5)))
    obs, infos = env.reset(seed=5)
    rng = np.random.default_rng(0)
    for _ in range(6):
        assert set(infos) == set(obs)
        for info in infos.values():
            assert info[STATE_INFO].dtype == np.float32
            np.testing.assert_array_equal(info[STATE_INFO], ref.state())
        actions = {a: int(rng.integers(5)) for a in obs}
        obs, _, _, _, infos = env.step(actions)
        ref.step({env.env.scenario.mpe_ids[a]: v for a, v in actions.items()})


def test_default_state_concatenates_latest_observations_with_zeros_before_the_first() -> None:
    from scenarios.rllib_env import RLlibGraphEnv

    env = RLlibGraphEnv({"scenario": "delegate", "topology": "star:2"})
    scenario = env.env.scenario
    dims = [scenario.observation_space(a).shape[0] for a in scenario.possible_agents]
    assert env.env.state_space.shape == (sum(dims),)
    obs, infos = env.reset(seed=0)
    (first,) = obs  # the orchestrator acts alone first: the workers' parts are zeros
    state = infos[first][STATE_INFO]
    at = scenario.possible_agents.index(first)
    start = sum(dims[:at])
    np.testing.assert_array_equal(state[start : start + dims[at]], obs[first])
    assert not state[:start].any() and not state[start + dims[at] :].any()
    quiet = RLlibGraphEnv({"scenario": "delegate", "topology": "star:2", "global_state": False})
    assert STATE_INFO not in quiet.reset(seed=0)[1][first]


def test_presets_and_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scenarios import global_state
    from trainers.plan import resolve

    assert ALGORITHMS["MAPPO"] is MAPPOAlgo and ALGORITHMS["IPPO"] is IPPOAlgo
    cfg = mappo(tmp_path)
    assert cfg.algorithm.name == "MAPPO" and cfg.algorithm.critic == "state_obs"
    assert cfg.algorithm.value_norm
    assert tiny_config(tmp_path, algorithm="IPPO").algorithm.critic == "local"
    plan = resolve(cfg)
    # the default state: every agent's observation
    state = sum(p.observation_space.shape[0] * len(p.agents) for p in plan.pools.values())
    obs = {p: plan.pools[p].observation_space.shape[0] for p in plan.pools}
    n = len(plan.agents)
    assert plan.critic_dims == {p: state + obs[p] + n for p in plan.pools}
    state_only = resolve(cfg.replace(**{"algorithm.critic": "state"})).critic_dims
    assert state_only == dict.fromkeys(plan.pools, state)
    assert resolve(cfg.replace(**{"algorithm.critic": "local"})).critic_dims == {}
    with pytest.raises(ConfigError, match=r"algorithm\.critic=.global. is not one of"):
        cfg.replace(**{"algorithm.critic": "global"}).check()
    scripted = {"worker": {"model": {"type": "scripted", "policy": "delegate.scripted_worker"}}}
    ok = resolve(mappo(tmp_path, pools=scripted, train=["orchestrator"]))
    assert set(ok.critic_dims) == {"orchestrator"}  # a frozen scripted pool keeps none
    llm = {"orchestrator": {"model": {"type": "llm"}}}
    with pytest.raises(ConfigError, match="token-level GRPO"):
        resolve(mappo(tmp_path, scenario="text-delegate", pools=llm))
    # observations that are not all Boxes: no default state
    monkeypatch.setattr(global_state, "concat_state_space", lambda spaces: None)
    with pytest.raises(
        ConfigError, match=r"needs the scenario's global state, but delegate-v0 has none"
    ):
        resolve(cfg)


def test_sweep_over_the_critic_input_resolves(tmp_path: Path) -> None:
    from trainers.sweep import validate_space

    space = {"algorithm.critic": {"grid": ["local", "state", "state_obs"]}}
    assert validate_space(mappo(tmp_path), space, "grid") == 3


# ----- modules: actors never read the global state --------------------------------------------
@pytest.mark.parametrize("model", [{"type": "mlp"}, GRU, {"type": "mpnn"}], ids=lambda m: m["type"])
def test_actor_forward_ignores_the_critic_column_and_never_runs_the_critic(
    tmp_path: Path, model: dict[str, Any]
) -> None:
    from ray.rllib.core.columns import Columns

    from marl_agents.modules import module_spec
    from trainers.plan import resolve

    cfg = mappo(tmp_path, pools={"orchestrator": {"model": model}})
    plan = resolve(cfg)
    pool = plan.pools["orchestrator"]
    module = module_spec(pool, plan.env, plan.critic_dims["orchestrator"]).build()
    assert module.critic is not None and not hasattr(module, "vf")

    def boom(*args: Any) -> Any:
        raise AssertionError("the actor's forward ran the critic")

    module.critic.register_forward_pre_hook(boom)
    b, t = 4, 3
    obs = torch.randn(b, t, pool.observation_space.shape[0])
    batch: dict[str, Any] = {Columns.OBS: obs if module.is_stateful() else obs[:, 0]}
    if module.is_stateful():
        batch[Columns.STATE_IN] = {"h": torch.zeros(b, 8)}
    plain = module.forward_exploration(batch)[Columns.ACTION_DIST_INPUTS]
    shape = (b, t) if module.is_stateful() else (b,)
    for state in (torch.zeros(*shape, cfg_dim(plan)), torch.randn(*shape, cfg_dim(plan))):
        for forward in (module.forward_exploration, module.forward_inference):
            out = forward({**batch, CRITIC_OBS: state})[Columns.ACTION_DIST_INPUTS]
            assert torch.equal(out, plain)
    module.critic._forward_pre_hooks.clear()
    values = [module.compute_values({**batch, CRITIC_OBS: torch.randn(*shape, cfg_dim(plan))})
              for _ in range(2)]  # fmt: skip
    assert values[0].shape == shape and not torch.equal(values[0], values[1])
    with pytest.raises(KeyError, match="no 'critic_obs' column"):
        module.compute_values(batch)


def cfg_dim(plan: Any) -> int:
    return plan.critic_dims["orchestrator"]


# ----- the learner column ----------------------------------------------------------------------
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("kind", ["state", "state_obs"])
def test_critic_column_is_the_same_on_both_learner_paths(tmp_path: Path, kind: str) -> None:
    """The lean learner's array batch and RLlib's pieces give the same batch, critic column
    included; each row is the state reported with that observation (plus, for state_obs, the
    observation and a one-hot id); env runners' episodes carry no critic column."""
    from trainers.algo import to_algorithm_config
    from trainers.learners.batch import ArrayPPOPipeline
    from trainers.learners.critic_input import CriticInputs

    cfg = mappo(tmp_path, algorithm={"critic": kind})
    lean = to_algorithm_config(cfg).build_algo()
    ref = to_algorithm_config(cfg.replace(**{"algorithm.learner": "rllib"})).build_algo()
    try:
        pipe = lean.learner_group._learner._learner_connector
        pieces = [type(p) for p in ref.learner_group._learner._learner_connector.connectors]
        assert isinstance(pipe, ArrayPPOPipeline)
        assert pieces[pieces.index(CriticInputs) + 1].__name__ == "ValueNormGAE"
        episodes = lean.env_runner_group.local_env_runner.sample(num_timesteps=60)
        for ep in episodes:
            for sa in ep.agent_episodes.values():
                assert CRITIC_OBS not in sa.extra_model_outputs
        got, want = _batches(lean, ref, episodes)
        assert pipe.fallbacks == 0
        assert_same_batch(got, want)
        agents = lean.config.learner_config_dict["critic_agents"]
        for mid, cols in got.policy_batches.items():
            col, obs = cols[CRITIC_OBS].numpy(), cols["obs"].numpy()
            dim = lean.learner_group._learner.module[mid].model_config["critic_dim"]
            assert col.shape == (len(obs), dim)
            if kind == "state_obs":
                n = len(agents)
                np.testing.assert_array_equal(col[:, -n - obs.shape[1] : -n], obs)
                assert (col[:, -n:].sum(axis=1) == 1).all()
        # the first row of the first episode: the state the env reported with it
        sa = next(iter(episodes[0].agent_episodes.values()))
        first = got.policy_batches[sa.module_id][CRITIC_OBS].numpy()
        state = np.asarray(sa.get_infos(0)[STATE_INFO])
        np.testing.assert_array_equal(first[0, : len(state)], state)
    finally:
        lean.stop()
        ref.stop()


@pytest.mark.usefixtures("ray_session")
def test_frozen_pool_stays_bit_identical_and_credit_trains(tmp_path: Path) -> None:
    """MAPPO with a frozen pool and Shapley credit on one remote env runner: 2 iterations, the
    frozen pool's weights bit-identical on the learner and the runner."""
    from trainers.algo import to_algorithm_config

    cfg = mappo(
        tmp_path,
        train=["orchestrator"],
        credit={"method": "shapley", "workers": 1},
        resources={"num_env_runners": 1, "num_envs_per_env_runner": 2},
    )
    algo = to_algorithm_config(cfg).build_algo()
    try:
        before = {k: v.clone() for k, v in algo.get_module("worker").state_dict().items()}
        for _ in range(2):
            result = algo.train()
        learner = algo.learner_group._learner.module["worker"].state_dict()
        runner = algo.env_runner_group.foreach_env_runner(
            lambda r: {k: v.clone() for k, v in r.module["worker"].state_dict().items()},
            local_env_runner=False,
        )[0]
        for k, v in before.items():
            assert torch.equal(learner[k], v) and torch.equal(runner[k], v), k
        stats = result["learners"]["orchestrator"]
        assert np.isfinite(stats["vf_loss"]) and np.isfinite(stats["vf_explained_var"])
    finally:
        algo.stop()


@pytest.mark.usefixtures("ray_session")
def test_loo_credit_with_a_gru_actor_trains(tmp_path: Path) -> None:
    """A GRU actor under MAPPO (RLlib's pieces: the column padded to [B, T, D]) with LOO
    credit and per-agent normalisation, 2 iterations."""
    from trainers.algo import to_algorithm_config

    credit = {"method": "loo", "normalize": True, "workers": 1}
    cfg = mappo(tmp_path, pools={"worker": {"model": GRU}}, credit=credit)
    algo = to_algorithm_config(cfg).build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        for mid in ("orchestrator", "worker"):
            assert np.isfinite(result["learners"][mid]["vf_loss"]), mid
    finally:
        algo.stop()


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("input_norm", [False, True], ids=["plain", "input_norm"])
def test_checkpoint_resume_and_evaluate(tmp_path: Path, input_norm: bool) -> None:
    """Trains, a resumed run repeats the first one's rows exactly, the run evaluates (the
    module class rebuilt from the checkpoint); also with the pool's ``model.input_norm``."""
    from trainers.evaluate import evaluate
    from trainers.run.loop import train

    cfg = mappo(tmp_path, scenario="spread", algorithm={"critic": "state"})
    cfg = cfg.replace(**{"logging.wandb": "disabled"})
    if input_norm:
        model = {"type": "mlp", "hidden": [16], "input_norm": True}
        cfg = cfg.replace(sharing="team", pools={"team": {"model": model}})
    result = train(cfg)
    run = tmp_path / "copy"
    shutil.copytree(result.run_dir, run)
    resumed = train(cfg.replace(**{"budget.iterations": 3}), resume=run)
    assert [h["charts/iteration"] for h in resumed.history] == [1, 2, 3]
    assert resumed.history[:2] == result.history
    assert evaluate(run, episodes=2, show=False).summary["episodes"] == 2


def test_cli_runs_spread_with_mappo(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_YAML.replace("topology: star:2\n", ""))
    out = tmp_path / "out"
    args = [*MARL, "run", "spread", "--algo", "MAPPO", "--config", str(config)]
    args += ["--iterations", "2", "--output", str(out), "--wandb", "disabled"]
    env = {**cli_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # this tree
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = only_run(out)
    assert run.name.startswith("spread__MAPPO__")
    saved = ExperimentConfig.from_yaml(run / "config.yaml").algorithm
    assert (saved.name, saved.critic) == ("MAPPO", "state_obs")
    assert (run / "checkpoint").is_dir() or (run / "metrics.jsonl").read_text().count("\n") == 2


def test_state_obs_reads_the_observation_part_of_a_masked_observation() -> None:
    """A PettingZoo env with action masks and a ``state()`` (observations ``{observations,
    action_mask}``): the centralised critic's row is the state, the observation part (the
    width ``obs_dim`` counts, not the mask) and the one-hot id."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from scenarios.pz_spaces import MASK_KEY, OBS_KEY
    from trainers.learners.critic_input import CriticInputs

    obs = [
        {OBS_KEY: np.array([t, t + 0.5], np.float32), MASK_KEY: np.array([1, 0, 1], np.int8)}
        for t in range(3)
    ]
    infos = [{STATE_INFO: np.full(4, 10.0 + t, np.float32)} for t in range(3)]
    space = gym.spaces.Dict(
        {OBS_KEY: gym.spaces.Box(0, 9, (2,)), MASK_KEY: gym.spaces.Box(0, 1, (3,), np.int8)}
    )
    ep = SingleAgentEpisode(
        agent_id="q",
        observations=obs,
        infos=infos,
        actions=[0, 2],
        rewards=[0.0, 1.0],
        observation_space=space,
        len_lookback_buffer=0,
    ).to_numpy()  # as the learner gets it from a runner (a dict of arrays)
    rows = CriticInputs(kind="state_obs", agents=["p", "q"]).features(ep, 3)
    assert rows.shape == (3, 4 + 2 + 2) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows[1], [11, 11, 11, 11, 1, 1.5, 0, 1])
