"""Experiment configs: exact YAML round trip, conversion to RLlib, and every config error.

No test here starts Ray: ``ray.init`` is patched to fail, so each error is proven to be raised
before Ray would start.
"""

from __future__ import annotations

import textwrap

import pytest

from marl_agents.pools import (
    CheckpointModel,
    GRUModel,
    LLMModel,
    MLPModel,
    ModelConfig,
    PoolConfig,
    ScriptedModel,
)
from scenarios.base import ScriptedPolicy
from scenarios.relay import Relay
from trainers.algo import to_algorithm_config
from trainers.configs.algorithms import AlgoConfig, APPOAlgo, GRPOAlgo, IMPALAAlgo, PPOAlgo
from trainers.configs.credit import CreditConfig
from trainers.configs.experiment import BudgetConfig, ExperimentConfig, ResourcesConfig
from trainers.configs.typed import ConfigError
from trainers.plan import resolve

SCRIPTED_WORKER = ScriptedModel(policy="delegate.scripted_worker")


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("ray.init was called: config errors must come before Ray starts")

    monkeypatch.setattr(ray, "init", refuse)


def rich_config() -> ExperimentConfig:
    return ExperimentConfig(
        scenario="delegate",
        scenario_kwargs={"parts": 2, "types": 2, "latency_cost": 0.1},
        topology="star:2",
        sharing="agent",
        pools={
            "orchestrator": PoolConfig(model=MLPModel(hidden=[32], activation="relu")),
            "workers": PoolConfig(agents=["worker_0", "worker_1"], model=SCRIPTED_WORKER),
        },
        train=["orchestrator"],
        credit=CreditConfig(method="shapley", estimator="kernel", budget=12, normalize=True),
        algorithm=PPOAlgo(
            lr=3e-5, train_batch_size=400, minibatch_size=100, extra={"kl_coeff": 0.0}
        ),
        budget=BudgetConfig(iterations=None, env_steps=5000, time_s=60.5),
        seed=7,
        resources=ResourcesConfig(num_envs_per_env_runner=4, num_cpus=1),
    )


# ----- YAML round trip ----------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [ExperimentConfig(), rich_config()], ids=["defaults", "rich"])
def test_yaml_round_trip_is_exact(cfg: ExperimentConfig) -> None:
    text = cfg.to_yaml()
    back = ExperimentConfig.from_yaml(text)
    assert back == cfg
    assert back.to_yaml() == text
    assert ExperimentConfig.from_dict(cfg.to_dict()) == cfg


def test_yaml_file_round_trip(tmp_path) -> None:
    path = tmp_path / "exp.yaml"
    rich_config().to_yaml(path)
    assert ExperimentConfig.from_yaml(path) == rich_config()
    assert ExperimentConfig.from_yaml(str(path)) == rich_config()


def test_hand_written_yaml_with_shorthands() -> None:
    text = """
        scenario: delegate
        topology: star:3
        algorithm: PPO
        credit: loo
        train: [orchestrator]
        pools:
          worker: {model: {type: scripted, policy: delegate.scripted_worker}}
    """
    cfg = ExperimentConfig.from_yaml(textwrap.dedent(text))
    assert cfg.algorithm.name == "PPO" and cfg.credit.method == "loo"
    assert cfg.pools["worker"].model == SCRIPTED_WORKER
    # YAML 1.1 reads 1e-3 as a string: numbers are coerced for float fields
    assert ExperimentConfig.from_yaml("algorithm: {lr: 1e-3}").algorithm.lr == 1e-3


def test_replace_dotted_paths() -> None:
    cfg = ExperimentConfig().replace(**{"algorithm.lr": 0.01, "topology": "star:2"})
    assert cfg.algorithm.lr == 0.01 and cfg.topology == "star:2"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("scenaro: delegate", r"unknown field\(s\) \['scenaro'\]"),
        ("algorithm: {name: PPO, learning_rate: 1}", "learning_rate"),
        ("seed: one", "seed must be an integer"),
        ("pools: {worker: {model: {type: transformer}}}", "type='transformer' is not one of"),
        ("train: orchestrator", "train must be a list"),
        ("- a\n- b", "must be a mapping"),
    ],
)
def test_bad_yaml_names_the_field(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ExperimentConfig.from_yaml(text)


# ----- conversion ---------------------------------------------------------------------------
def test_frozen_subagent_orchestrator_config() -> None:
    cfg = ExperimentConfig(topology="star:3", train=["orchestrator"])
    plan = resolve(cfg)
    assert plan.trainable == ["orchestrator"] and plan.frozen == ["worker"]
    # a frozen pool with no configured model gets the scenario's scripted policy for its role
    assert plan.pools["worker"].model == SCRIPTED_WORKER
    algo_config = to_algorithm_config(cfg, plan)
    assert algo_config.is_multi_agent
    assert set(algo_config.policies) == {"orchestrator", "worker"}
    assert list(algo_config.policies_to_train) == ["orchestrator"]
    mapping = algo_config.policy_mapping_fn
    assert [mapping(a, None) for a in plan.agents] == ["orchestrator"] + ["worker"] * 3
    specs = algo_config.rl_module_spec.rl_module_specs
    assert specs["worker"].module_class.__name__ == "ScriptedModule"
    assert specs["orchestrator"].model_config.fcnet_hiddens == [64, 64]


def test_parameter_sharing_choices() -> None:
    role = resolve(ExperimentConfig(topology="star:3"))
    assert {p: v.agents for p, v in role.pools.items()} == {
        "orchestrator": ["orchestrator"],
        "worker": ["worker_0", "worker_1", "worker_2"],
    }
    agent = resolve(ExperimentConfig(topology="star:3", sharing="agent"))
    assert list(agent.pools) == ["orchestrator", "worker_0", "worker_1", "worker_2"]
    single = resolve(ExperimentConfig(topology="single"))
    assert list(single.pools) == ["agent"] and single.trainable == ["agent"]


def test_heterogeneous_pools_resolve() -> None:
    cfg = ExperimentConfig(
        topology="star:2",
        sharing="agent",
        pools={
            "worker_0": PoolConfig(model=GRUModel(hidden=[16], gru_size=8)),
            "worker_1": PoolConfig(model=MLPModel(hidden=[128, 128])),
        },
    )
    specs = to_algorithm_config(cfg).rl_module_spec.rl_module_specs
    assert specs["worker_0"].module_class.__name__ == "GRUModule"
    assert specs["worker_1"].model_config.fcnet_hiddens == [128, 128]


# ----- every config error, before Ray -------------------------------------------------------
CASES = {
    "unknown scenario": (dict(scenario="nope"), "unknown scenario 'nope'"),
    "bad topology": (dict(topology="chain:3"), "delegate runs on single or star:N"),
    "unknown agent in a pool": (
        dict(pools={"w": PoolConfig(agents=["worker_9"])}),
        "pool 'w' lists unknown agent 'worker_9'",
    ),
    "agent in two pools": (
        dict(
            sharing="explicit",
            pools={
                "a": PoolConfig(agents=["orchestrator", "worker_0"]),
                "b": PoolConfig(agents=["worker_0"]),
            },
        ),
        "agent 'worker_0' is listed in pools 'a' and 'b'",
    ),
    "pool with no agents": (
        dict(pools={"spare": PoolConfig()}),
        "pool 'spare' has no agents: list them with pools.spare.agents",
    ),
    "agent in no pool": (
        dict(sharing="explicit", pools={"o": PoolConfig(agents=["orchestrator"])}),
        r"agents \['worker_0', 'worker_1', 'worker_2'\] are in no pool",
    ),
    "pool mixing spaces": (dict(sharing="team"), "pool 'team' shares one module"),
    "unknown agent or pool in train": (
        dict(train=["boss"]),
        "train lists 'boss', which is neither",
    ),
    "training one agent of a shared pool": (
        dict(train=["worker_0"]),
        "pool 'worker' also serves",
    ),
    "training a frozen pool": (
        dict(pools={"worker": PoolConfig(model=SCRIPTED_WORKER)}, train=["worker"]),
        "frozen by construction",
    ),
    "nothing to train": (
        dict(
            topology="single",
            pools={"agent": PoolConfig(model=ScriptedModel(policy="default"))},
        ),
        "nothing to train",
    ),
    "unknown scripted policy": (
        dict(pools={"worker": PoolConfig(model=ScriptedModel(policy="nope"))}),
        "unknown scripted policy 'nope'",
    ),
    "scripted policy of another scenario": (
        dict(pools={"worker": PoolConfig(model=ScriptedModel(policy="relay.optimal"))}),
        "belongs to scenario 'relay'",
    ),
    "missing checkpoint": (
        dict(pools={"worker": PoolConfig(model=CheckpointModel(path="/nonexistent"))}),
        "no algorithm checkpoint at /nonexistent",
    ),
    "bad model sizes": (
        dict(pools={"worker": PoolConfig(model=MLPModel(hidden=[0]))}),
        "model.hidden must be a list of positive layer sizes",
    ),
    "gru with APPO": (
        dict(
            algorithm=APPOAlgo(),
            pools={"worker": PoolConfig(model=GRUModel())},
        ),
        "APPO needs a target network",
    ),
    "local credit without Outcome.local": (
        dict(scenario="relay", topology="star:2", credit=CreditConfig(method="local")),
        "credit 'local' needs Outcome.local",
    ),
    "shapley budget below the estimator's minimum": (
        dict(credit=CreditConfig(method="shapley", estimator="kernel", budget=3)),
        r"set credit.budget ≥ 10",
    ),
    "normalized credit without PPO": (
        dict(algorithm=IMPALAAlgo(), credit=CreditConfig(method="loo", normalize=True)),
        "credit.normalize needs the PPO credit learner",
    ),
    "unknown credit method": (
        dict(credit=CreditConfig(method="banzhaf")),
        "credit.method='banzhaf'",
    ),
    "unknown algorithm": (dict(algorithm="DQN"), "use one of PPO, APPO, IMPALA"),
    "minibatch above batch": (
        dict(algorithm=PPOAlgo(train_batch_size=100, minibatch_size=200)),
        "minibatch_size=200 exceeds.*rows of a module's batch.*counts env steps",
    ),
    "no budget": (
        dict(budget=BudgetConfig(iterations=None)),
        "budget has no limit",
    ),
    "negative budget": (
        dict(budget=BudgetConfig(iterations=-3)),
        "budget.iterations must be positive",
    ),
    "zero time budget": (dict(budget=BudgetConfig(time_s=0.0)), "budget.time_s must be positive"),
    "more CPUs than the machine": (
        dict(resources=ResourcesConfig(num_cpus=10_000)),
        "this machine has",
    ),
    "runners that do not fit": (
        dict(resources=ResourcesConfig(num_env_runners=10_000)),
        "lower resources.num_env_runners",
    ),
    "unknown sharing": (dict(sharing="some"), "sharing='some' is unknown"),
    "unknown wandb mode": (dict(logging={"wandb": "cloud"}), "logging.wandb='cloud'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_config_error_names_the_fix(case: str) -> None:
    fields, match = CASES[case]
    data = {k: v for k, v in fields.items() if k != "logging"}
    with pytest.raises(ConfigError, match=match):  # when built (types) or resolved (values)
        cfg = ExperimentConfig(**data)
        if "logging" in fields:
            cfg.logging.wandb = fields["logging"]["wandb"]
        to_algorithm_config(cfg)


def test_credit_repeats_is_gone() -> None:
    """Replays are deterministic given the episode seed: there is no repeats knob to set."""
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['repeats'\]"):
        ExperimentConfig.from_dict({"credit": {"method": "loo", "repeats": 3}})


@pytest.mark.parametrize(
    ("credit", "match"),
    [
        ({"budget": 1}, r"credit.budget=1 is too small: use null .* or an integer ≥ 2"),
        ({"budget": True}, "credit.budget=True"),
        ({"exact_max": 17}, r"credit.exact_max=17 is out of range: use an integer in 0…16"),
        ({"workers": 0}, r"credit.workers=0 is out of range"),
        ({"estimator": "stratified"}, "credit.estimator='stratified' is an unknown"),
    ],
)
def test_credit_config_check_is_the_one_place(credit: dict, match: str) -> None:
    """Field-level credit rules live in CreditConfig.check(); the connector and resolve agree."""
    cfg = CreditConfig(method="shapley", **credit)
    with pytest.raises(ConfigError, match=match):
        cfg.check()
    with pytest.raises(ConfigError, match=match):
        to_algorithm_config(ExperimentConfig(credit=cfg))


def test_gpu_request_on_a_machine_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    cfg = ExperimentConfig(resources=ResourcesConfig(num_learners=1, num_gpus_per_learner=1))
    with pytest.raises(ConfigError, match="this machine has no GPU"):
        to_algorithm_config(cfg)


def test_env_runner_gpus_need_a_remote_runner_and_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    local = ExperimentConfig(resources=ResourcesConfig(num_gpus_per_env_runner=1))
    with pytest.raises(ConfigError, match=r"num_env_runners ≥ 1.*num_env_runners=1"):
        to_algorithm_config(local)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    remote = ExperimentConfig(
        resources=ResourcesConfig(num_env_runners=1, num_gpus_per_env_runner=1)
    )
    with pytest.raises(ConfigError, match=r"no GPU.*num_gpus_per_env_runner=0"):
        to_algorithm_config(remote)
    with pytest.raises(ConfigError, match="≥ 0"):
        ResourcesConfig(num_gpus_per_env_runner=-1).check()


def test_train_rejects_a_bad_config_before_creating_anything(tmp_path) -> None:
    from trainers.run.loop import train

    cfg = ExperimentConfig(train=["boss"])
    cfg.output.dir = str(tmp_path / "runs")
    with pytest.raises(ConfigError, match="boss"):
        train(cfg)
    assert not (tmp_path / "runs").exists()


def test_credit_methods_build_the_credit_learner() -> None:
    cfg = ExperimentConfig(credit=CreditConfig(method="shapley", normalize=True))
    algo_config = to_algorithm_config(cfg)
    assert algo_config.batch_mode == "complete_episodes"
    # the lean learner (the default) is a CreditPPOTorchLearner; RLlib's step builds the class
    from trainers.learners.credit_ppo import CreditPPOTorchLearner

    assert issubclass(algo_config.learner_class, CreditPPOTorchLearner)
    rllib = cfg.replace(**{"algorithm.learner": "rllib"})
    assert to_algorithm_config(rllib).learner_class.__name__ == "CreditPPOTorchLearner"


# ----- typed configs per kind ---------------------------------------------------------------
def test_model_type_selects_its_config_class() -> None:
    cfg = ExperimentConfig.from_yaml(
        textwrap.dedent("""
        pools:
          orchestrator: {model: {type: gru, gru_size: 8}}
          worker: {model: {type: checkpoint, path: /some/run, module: w}}
        """)
    )
    assert cfg.pools["orchestrator"].model == GRUModel(gru_size=8)
    assert cfg.pools["worker"].model == CheckpointModel(path="/some/run", module="w")
    assert ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg
    # each kind has only its own fields: path means one thing per class
    with pytest.raises(ConfigError, match=r"model.gru_size is set but .*model.type is 'mlp'"):
        ExperimentConfig.from_yaml("pools: {worker: {model: {gru_size: 8}}}")
    with pytest.raises(ConfigError, match=r"\['hidden'\]"):
        ExperimentConfig.from_yaml("pools: {worker: {model: {type: llm, hidden: [8]}}}")


def test_algorithm_name_selects_its_config_class() -> None:
    assert ExperimentConfig.from_yaml("algorithm: APPO").algorithm == APPOAlgo()
    assert ExperimentConfig.from_yaml("algorithm: {name: GRPO}").algorithm == GRPOAlgo()
    assert ExperimentConfig().algorithm == PPOAlgo()
    with pytest.raises(ConfigError, match=r"algorithm.gamma is set but .*name is 'GRPO'"):
        ExperimentConfig.from_yaml("algorithm: {name: GRPO, gamma: 0.9}")
    with pytest.raises(ConfigError, match=r"algorithm.minibatch_size is set but .*'IMPALA'"):
        ExperimentConfig.from_yaml("algorithm: {name: IMPALA, minibatch_size: 10}")
    with pytest.raises(ConfigError, match="AlgoConfig is a base class: use PPOAlgo"):
        ExperimentConfig(algorithm=AlgoConfig())
    with pytest.raises(ConfigError, match="ModelConfig is a base class: use MLPModel"):
        ExperimentConfig(pools={"worker": PoolConfig(model=ModelConfig())})


def test_switching_kinds_keeps_shared_fields_and_names_leftovers() -> None:
    cfg = ExperimentConfig().replace(**{"algorithm.lr": 0.01})
    appo = cfg.replace(**{"algorithm.name": "APPO"})  # PPO's default minibatch_size is dropped
    assert appo.algorithm == APPOAlgo(lr=0.01)
    tuned = ExperimentConfig(algorithm=PPOAlgo(train_batch_size=128, minibatch_size=64))
    with pytest.raises(ConfigError, match=r"algorithm\.minibatch_size is set but"):
        tuned.replace(**{"algorithm.name": "IMPALA"})  # a tuned PPO-only field is not dropped
    gru = ExperimentConfig(pools={"worker": "mlp"}).replace(**{"pools.worker.model.type": "gru"})
    assert gru.pools["worker"].model == GRUModel()


# ----- Python-API configs: the YAML shorthands and type checks --------------------------------
def test_python_api_accepts_the_yaml_shorthands() -> None:
    cfg = ExperimentConfig(
        credit="shapley",  # type: ignore[arg-type]
        algorithm="APPO",  # type: ignore[arg-type]
        topology="star:3",
        pools={"worker": "mlp", "orchestrator": {"model": {"type": "gru"}}},  # type: ignore[dict-item]
    )
    assert cfg.credit == CreditConfig(method="shapley") and cfg.algorithm == APPOAlgo()
    assert cfg.pools["worker"] == PoolConfig(model=MLPModel())
    assert cfg.pools["orchestrator"].model == GRUModel()
    text = "credit: shapley\nalgorithm: APPO\ntopology: star:3\n"
    text += "pools: {worker: mlp, orchestrator: {model: {type: gru}}}"
    assert ExperimentConfig.from_yaml(text) == cfg
    assert PoolConfig(model=LLMModel()).model.path == "tiny"


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: ExperimentConfig(topology=3), r"topology must be .*got 3"),
        (lambda: BudgetConfig(iterations=2.5), "budget.iterations must be an integer, got 2.5"),
        (lambda: ResourcesConfig(num_env_runners=True), "must be an integer, got True"),
        (lambda: ExperimentConfig(seed=True), "seed must be an integer, got True"),
        (lambda: PPOAlgo(lr="fast"), "algorithm.lr must be a number, got 'fast'"),
        (lambda: ExperimentConfig(credit="banzhaf"), "credit.method='banzhaf'"),
        (lambda: ExperimentConfig(pools={"w": "transformer"}), "type='transformer' is not one"),
        (lambda: ExperimentConfig(pools={"w": PoolConfig(model=MLPModel(hidden=4))}), "a list"),
    ],
)
def test_python_api_types_are_checked_when_built(build, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        build()
    assert "\n" not in str(info.value)


def test_unknown_rllib_key_in_extra_fails_before_ray() -> None:
    cfg = ExperimentConfig(algorithm=PPOAlgo(extra={"kl_coef": 0.1}))
    with pytest.raises(ConfigError, match=r"algorithm.extra has 'kl_coef'.*did you mean kl_coeff"):
        resolve(cfg)
    assert to_algorithm_config(ExperimentConfig(algorithm=PPOAlgo(extra={"kl_coeff": 0.1})))


# ----- scenario capabilities ------------------------------------------------------------------
def test_scenario_capabilities_are_class_attributes() -> None:
    from scenarios.delegate import Delegate
    from scenarios.relay import Relay
    from scenarios.spread import Spread

    assert Delegate.has_oracle and Delegate.has_local_rewards and not Delegate.has_text_agents
    assert Relay.has_oracle and not Relay.has_local_rewards
    assert not Spread.has_oracle
    assert {p.name for p in Delegate.scripted_policies} == {"scripted_worker", "oracle"}
    assert resolve(ExperimentConfig(scenario="spread", topology="mesh:2")).has_oracle is False


def test_an_oracle_must_be_declared() -> None:
    from scenarios.base import Scenario

    with pytest.raises(TypeError, match="does not declare has_oracle = True"):

        class Undeclared(Scenario):  # an oracle the trainers would never read
            name = "undeclared"

            def oracle_value(self, rng: object) -> float:
                return 1.0


class DeclaringRelay(Relay):
    """A user's scenario declaring its own scripted policy as the frozen workers' default."""

    name = "declaring-relay"
    scripted_policies = (
        ScriptedPolicy("optimal", lambda s: s.optimal_policy(), default_for=("worker",)),
    )


def test_scripted_policies_come_from_the_scenario_class() -> None:
    plan = resolve(
        ExperimentConfig(
            scenario="tests.test_config:DeclaringRelay", topology="star:2", train=["orchestrator"]
        )
    )
    assert plan.pools["worker"].model == ScriptedModel(policy="declaring-relay.optimal")
    with pytest.raises(ConfigError, match="belongs to scenario 'relay', not 'declaring-relay'"):
        resolve(
            ExperimentConfig(
                scenario="tests.test_config:DeclaringRelay",
                topology="star:2",
                pools={"worker": PoolConfig(model=ScriptedModel(policy="relay.optimal"))},
            )
        )


def test_sampler_is_batched_or_rllib_and_auto_reads_as_batched() -> None:
    from trainers.configs.experiment import SAMPLERS, EpisodesConfig

    assert SAMPLERS == ("batched", "rllib") and EpisodesConfig().sampler == "batched"
    assert EpisodesConfig(sampler="auto").sampler == "batched"  # the older name of the default
    cfg = ExperimentConfig.from_dict({"episodes": {"sampler": "auto"}})
    assert cfg.episodes.sampler == "batched" and "sampler: auto" not in cfg.to_yaml()
    with pytest.raises(ConfigError, match=r"episodes\.sampler must be one of batched, rllib"):
        ExperimentConfig.from_dict({"episodes": {"sampler": "fast"}}).check()
