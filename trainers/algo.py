"""ExperimentConfig → RLlib ``AlgorithmConfig`` (new API stack), in exactly one function.

:func:`resolve` does every check that needs the scenario (agents, pools, credit support,
resources) in plain python; :func:`to_algorithm_config` turns the resolved plan into an
``AlgorithmConfig`` and calls ``.validate()``. Nothing here starts Ray: a bad config fails
before any process is spawned, with a :class:`~trainers.config.ConfigError` naming the fix.

LLM pools (``model.type: llm``) run with ``algorithm.name: GRPO``: the same conversion then
builds :class:`~trainers.grpo_learner.GRPO` (the GRPO learner, whole episodes, the group
schedule and loss knobs of ``algorithm.grpo``) over
:class:`~trainers.grpo_learner.GroupedEnv` (``G`` rollouts of a task side by side), with a
:class:`~marl_agents.llm.rl_module.CausalLMModule` per LLM pool. Fine-tuning jobs
(:mod:`trainers.finetune`) convert to an :class:`ExperimentConfig` and come through here too.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
from ray.rllib.callbacks.callbacks import RLlibCallback

from marl_agents.pools import AgentPool, ModelConfig, PoolError, resolve_pools
from trainers.cluster import joins_cluster
from trainers.config import ConfigError, ExperimentConfig
from trainers.credit_settings import check_credit_for

#: env-runner metrics this package logs per episode (sums and counts, reduced per iteration).
EPISODE_METRICS = "marl"


@dataclasses.dataclass
class Plan:
    """A validated experiment: what runs where, before any RLlib object exists.

    Attributes:
        cfg: the experiment config.
        scenario_id: the versioned id of a registered scenario (``delegate-v0``), or the import
            reference of a user's scenario as given (``myapp.team:scenario``).
        env_config: the ``RLlibGraphEnv`` config.
        agents: agent ids, in the topology's order.
        roles: agent id → role.
        pools: pool id → resolved :class:`~marl_agents.pools.AgentPool`.
        has_oracle: whether the scenario reports ``oracle_value``.
    """

    cfg: ExperimentConfig
    scenario_id: str
    env_config: dict[str, Any]
    agents: list[str]
    roles: dict[str, str]
    pools: dict[str, AgentPool]
    has_oracle: bool

    @property
    def agent_to_pool(self) -> dict[str, str]:
        """Agent id → pool id (the policy mapping)."""
        return {a: p.id for p in self.pools.values() for a in p.agents}

    @property
    def trainable(self) -> list[str]:
        """Pool ids that learn (``policies_to_train``)."""
        return [p.id for p in self.pools.values() if p.trainable]

    @property
    def frozen(self) -> list[str]:
        """Pool ids whose weights never change."""
        return [p.id for p in self.pools.values() if not p.trainable]


class PoolMapping:
    """A picklable ``policy_mapping_fn``: agent id → pool id."""

    def __init__(self, agent_to_pool: Mapping[str, str]) -> None:
        self.agent_to_pool = dict(agent_to_pool)

    def __call__(self, agent_id: str, episode: Any = None, **kwargs: Any) -> str:
        return self.agent_to_pool[agent_id]

    def __repr__(self) -> str:
        return f"PoolMapping({self.agent_to_pool})"


# ----- resolution (no Ray) -----------------------------------------------------------------
def resolve(cfg: ExperimentConfig, *, ray_workers: bool = True) -> Plan:
    """Check ``cfg`` against its scenario and resolve pools; nothing of Ray is started.

    ``cfg.scenario`` is a registered name or an import reference ``package.module:attr``
    (:mod:`scenarios.registry`): a reference is imported and built here and, with
    ``ray_workers`` (the default; ``False`` for work done in this process only, such as
    :func:`trainers.evaluate.evaluate`), checked to be importable by Ray's worker processes too
    (:func:`check_workers_import`), since every env runner, credit worker and Tune trial
    rebuilds the scenario by importing it.

    Raises:
        ConfigError: the first problem found, naming the field and the fix: bad fields, an
            unknown scenario, a scenario reference that cannot be imported here or in Ray's
            worker processes (``__main__``, a module off their path, a missing attribute, an
            object that is not a scenario) or that rejects its ``topology`` /
            ``scenario_kwargs``, an unknown topology, unknown agents or pools, a pool with no
            agents, an agent in no pool, an unknown scripted policy or missing checkpoint, an
            LLM pool on agents that do not act with text (or a trained non-LLM pool on agents
            that do), an LLM pool without algorithm GRPO or GRPO training a non-LLM pool, credit
            the scenario cannot support, GPUs or CPUs the machine does not have.

    For a text scenario (one declaring ``text_agents``) with LLM pools, the scenario's
    ``tokenizer`` defaults to the pools' model (``scenario_kwargs.tokenizer`` overrides it).
    """
    from scenarios.base import ScenarioError
    from scenarios.registry import build, is_reference, scenario_class
    from topologies import Topology, TopologyError

    cfg.check()
    where = f"scenario={cfg.scenario!r}"
    topology: Any = cfg.topology
    try:
        if isinstance(topology, dict):
            topology = Topology.from_dict(topology)
        kwargs = _text_kwargs(
            cfg, lambda: scenario_class(cfg.scenario, topology, **cfg.scenario_kwargs)
        )
        scenario = build(cfg.scenario, topology, **kwargs)
    except (ScenarioError, TopologyError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if ray_workers and is_reference(cfg.scenario):
        check_workers_import(cfg.scenario)
    topo = scenario.topology
    agents = list(scenario.possible_agents)
    roles = dict(topo.roles)
    spaces = {a: (scenario.observation_space(a), scenario.action_space(a)) for a in agents}
    try:
        pools = resolve_pools(
            agents,
            roles,
            topo.pools,
            spaces,
            cfg.pools,
            sharing=cfg.sharing,
            train=cfg.train,
            frozen_defaults=_frozen_defaults(type(scenario).name),
        )
    except PoolError as exc:
        raise ConfigError(str(exc)) from None
    if topology is None and not is_reference(cfg.scenario):
        topology = topo.spec or topo  # a reference keeps None: its own default, as built here
    env_config = {
        "scenario": cfg.scenario,
        "topology": topology,
        "kwargs": kwargs,
        "seed_once": True,  # RLlib re-passes its seed at every complete-episode sample
    }
    _check_models(cfg, pools, type(scenario).name)
    _check_text(cfg, scenario, pools)
    _check_algorithm(cfg, pools)
    check_credit_for(cfg.credit, scenario, agents, cfg.algorithm.name)
    _check_resources(cfg)
    has_oracle = type(scenario).oracle_value is not _base_oracle()
    if has_oracle:
        has_oracle = scenario.oracle_value(np.random.default_rng(0)) is not None
    scenario_id = cfg.scenario if is_reference(cfg.scenario) else scenario.id()
    return Plan(cfg, scenario_id, env_config, agents, roles, pools, has_oracle)


# ----- scenario references in Ray's processes --------------------------------------------------
def check_workers_import(ref: str) -> None:
    """Check that Ray's worker processes can import the scenario reference ``ref``.

    Workers rebuild the scenario by importing ``ref``. When this process will start Ray itself
    (no Ray running, no ``RAY_ADDRESS``), :func:`share_sys_path` gives the workers this
    process's ``sys.path``, so whatever imports here imports there. Otherwise the workers have
    what the running Ray gave them — installed packages, ``PYTHONPATH``, and the driver's script
    directory and working directory (Ray 2.60 adds those two) — and a fresh process with that
    path must find the module where this process found it. Inside a Ray worker (a Tune trial)
    there is nothing to check: this process is one of them.

    Raises:
        ConfigError: the module would not be found by the workers (or a different copy would),
            naming the directory and the fix.
    """
    from scenarios.registry import unreachable_reason

    ray = sys.modules.get("ray")
    running = ray is not None and ray.is_initialized()
    if running and ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
        return
    if not running and not joins_cluster():
        return
    reason = unreachable_reason(ref, _ray_driver_paths(running))
    if reason is not None:
        raise ConfigError(f"scenario={ref!r}: {reason}")


def _ray_driver_paths(running: bool) -> list[str]:
    """The directories Ray adds to its workers' ``sys.path`` for this driver."""
    if running:
        import ray

        try:  # a private API that may move: then fall back to what Ray 2.60 adds
            job = ray._private.worker.global_worker.core_worker.get_job_config()
            return list(job.py_driver_sys_path)
        except Exception:  # any failure means "unknown": use the fallback below
            running = False
    paths = [os.getcwd()]
    script = os.path.dirname(os.path.realpath(sys.argv[0])) if sys.argv and sys.argv[0] else ""
    if script and script in sys.path:
        paths.append(script)
    return paths


def share_sys_path() -> None:
    """Give the processes of a local Ray started next this process's ``sys.path``.

    Prepends the directories of ``sys.path`` (the working directory for ``""``) to
    ``PYTHONPATH``, which the Ray processes started by ``ray.init()`` inherit, so env runners,
    credit workers and Tune trials import a user's modules (scenario references) exactly as the
    driver does — also ones found only through ``sys.path`` entries added at run time.
    """
    paths = [p or os.getcwd() for p in sys.path]
    old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, *old]))


def _base_oracle() -> Any:
    from scenarios.base import Scenario

    return Scenario.oracle_value


def _frozen_defaults(scenario: str) -> dict[str, ModelConfig]:
    """Scripted policies for frozen pools, by the scenario's ``name`` (``delegate``)."""
    from marl_agents.scripted import frozen_defaults

    return {
        role: ModelConfig(type="scripted", policy=name)
        for role, name in frozen_defaults(scenario).items()
    }


def _check_models(cfg: ExperimentConfig, pools: Mapping[str, AgentPool], scenario: str) -> None:
    """Scripted policies exist and belong to the scenario (its ``name``), checkpoints exist."""
    from marl_agents.modules import checkpoint_module_dir
    from marl_agents.scripted import SCRIPTED

    for pool in pools.values():
        m = pool.model
        if m.type == "scripted" and m.policy not in SCRIPTED:
            raise ConfigError(
                f"pool {pool.id!r}: unknown scripted policy {m.policy!r}; registered are "
                f"{', '.join(sorted(SCRIPTED))} (add yours with "
                "marl_agents.scripted.register_scripted)"
            )
        if m.type == "scripted":
            entry = SCRIPTED[m.policy]  # type: ignore[index]
            if entry.scenario not in (None, scenario):
                raise ConfigError(
                    f"pool {pool.id!r}: scripted policy {m.policy!r} belongs to scenario "
                    f"{entry.scenario!r}, not {scenario!r}"
                )
        if m.type == "checkpoint":
            try:
                checkpoint_module_dir(m.path or "", m.module or pool.id)
            except PoolError as exc:
                raise ConfigError(f"pool {pool.id!r}: {exc}") from None
        if m.type in ("gru", "mpnn") and cfg.algorithm.name == "APPO":
            raise ConfigError(
                f"pool {pool.id!r}: {m.type} modules run with PPO or IMPALA; APPO needs a "
                "target network (use model.type 'mlp' or algorithm PPO)"
            )


def with_text_defaults(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` completed for a scenario whose agents all act with text, when it leaves the
    algorithm at its defaults: the algorithm becomes GRPO and every pool without a configured
    model an LLM pool of the scenario's tokenizer (``"tiny"`` unless it names a directory), so
    ``marl run pkg.app:scenario --train supervisor`` trains a chat app as it is. Any other
    config is returned unchanged (and ``resolve`` names what to set).
    """
    from marl_agents.pools import PoolConfig, default_assignment
    from scenarios.base import ScenarioError
    from scenarios.registry import build
    from trainers.config import AlgoConfig, GRPOSettings

    if cfg.algorithm != AlgoConfig():
        return cfg
    try:
        scenario = build(cfg.scenario, cfg.topology, **cfg.scenario_kwargs)
    except (ScenarioError, TypeError, ValueError):
        return cfg  # resolve() reports it
    agents = list(scenario.possible_agents)
    if not agents or set(getattr(scenario, "text_agents", ())) != set(agents):
        return cfg
    topo = scenario.topology
    pools = default_assignment(agents, topo.roles, topo.pools, cfg.sharing).values()
    path = getattr(scenario, "tokenizer_name", None) or "tiny"
    missing = {pid: PoolConfig(model=ModelConfig(type="llm", path=path)) for pid in pools}
    return dataclasses.replace(
        cfg,
        algorithm=AlgoConfig(name="GRPO", grpo=GRPOSettings()),
        pools={**missing, **cfg.pools},
    )


def _text_kwargs(cfg: ExperimentConfig, scenario_cls: Callable[[], type]) -> dict[str, Any]:
    """The scenario kwargs; a text scenario gets its LLM pools' tokenizer unless one is given.

    ``scenario_cls`` returns the scenario's class (asked only when there are LLM pools).

    Raises:
        ConfigError: LLM pools on a scenario without text agents, or LLM pools of different
            models and no ``scenario_kwargs.tokenizer``.
    """
    kwargs = dict(cfg.scenario_kwargs)
    llm = {pid: p.model for pid, p in cfg.pools.items() if p.model.type == "llm"}
    if not llm:
        return kwargs
    if not hasattr(scenario_cls(), "text_agents"):
        pid = next(iter(llm))
        raise ConfigError(
            f"pools.{pid}.model.type is 'llm' but scenario {cfg.scenario!r} has no text agents "
            "(token-id observations and actions): use a text scenario (text-delegate, "
            "text-toolchain) or a non-LLM model type (mlp, gru, mpnn)"
        )
    models = sorted({m.llm_path for m in llm.values()})
    if "tokenizer" not in kwargs and models != ["tiny"]:
        if len(models) > 1:
            raise ConfigError(
                f"LLM pools use different models {models} and the scenario renders one prompt "
                "format: set scenario_kwargs.tokenizer to the tokenizer they share"
            )
        kwargs["tokenizer"] = models[0]  # prompts in the model's own tokens
    return kwargs


def _check_text(cfg: ExperimentConfig, scenario: Any, pools: Mapping[str, AgentPool]) -> None:
    """LLM pools serve exactly text agents (text spaces); trained text agents are LLMs."""
    text = set(getattr(scenario, "text_agents", ()))
    for pool in pools.values():
        m, where = pool.model, f"pool {pool.id!r}"
        if m.type != "llm":
            served = [a for a in pool.agents if a in text]
            if served and pool.trainable:
                raise ConfigError(
                    f"{where} trains a {m.type} model for {served}, which act with token ids in "
                    f"{scenario.id()}: set pools.{pool.id}.model.type: llm (and algorithm.name: "
                    "GRPO), or freeze it (leave it out of train)"
                )
            continue
        other = [a for a in pool.agents if a not in text]
        if other:
            raise ConfigError(
                f"{where} is an LLM (model.type 'llm') but serves {other}, which do not act "
                f"with text in {scenario.id()}: give them a pool of their own with another model"
            )
        from marl_agents.llm.rl_module import spaces_from

        try:
            spaces = spaces_from(pool.observation_space, pool.action_space)
        except TypeError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        vocab = _model_vocab(m.llm_path)
        if vocab is not None and vocab > spaces.vocab_size:
            raise ConfigError(
                f"{where}: model {m.llm_path!r} has {vocab} token ids but {scenario.id()}'s text "
                f"spaces allow {spaces.vocab_size}: set scenario_kwargs.tokenizer to the "
                "model's directory (or scenario_kwargs.vocab_size)"
            )


def _model_vocab(path: str) -> int | None:
    """``vocab_size`` in a saved model's ``config.json`` (``None`` for ``tiny``)."""
    if path == "tiny":
        return None
    import json
    from pathlib import Path

    config = json.loads((Path(path).expanduser() / "config.json").read_text())
    return int(config["vocab_size"]) if "vocab_size" in config else None


def _check_algorithm(cfg: ExperimentConfig, pools: Mapping[str, AgentPool]) -> None:
    """LLM pools run with GRPO, and GRPO trains nothing but LLM pools."""
    name = cfg.algorithm.name
    llm = [p.id for p in pools.values() if p.model.type == "llm"]
    if llm and name != "GRPO":
        raise ConfigError(
            f"pool(s) {llm} are LLMs (model.type 'llm'): they run with token-level GRPO; set "
            f"algorithm.name: GRPO ({name} needs a value function, which a causal LM has not)"
        )
    if name == "GRPO":
        other = [f"{p.id} ({p.model.type})" for p in pools.values()
                 if p.trainable and p.model.type != "llm"]  # fmt: skip
        if other:
            raise ConfigError(
                f"algorithm GRPO trains LLM pools only (token-level loss, no value function), "
                f"but {', '.join(other)} would train: give them model.type 'llm', leave them "
                "out of train (frozen), or use algorithm PPO"
            )


def _check_resources(cfg: ExperimentConfig) -> None:
    res = cfg.resources
    on_cluster = joins_cluster()
    if res.num_gpus_per_learner > 0 and res.num_learners < 1:
        raise ConfigError(
            "resources.num_gpus_per_learner > 0 needs resources.num_learners ≥ 1 (RLlib puts GPU "
            "learners in their own processes; with 0 it fails an assertion): set "
            "resources.num_learners=1"
        )
    if res.num_gpus_per_learner > 0 and not on_cluster:
        import torch

        if torch.cuda.device_count() == 0:
            raise ConfigError(
                f"resources.num_gpus_per_learner={res.num_gpus_per_learner} but this machine "
                "has no GPU (RLlib would wait for one forever): set "
                "resources.num_gpus_per_learner=0, or set RAY_ADDRESS to a cluster with GPUs"
            )
    if on_cluster:
        return
    machine = os.cpu_count() or 1
    if res.num_cpus is not None and res.num_cpus > machine:
        raise ConfigError(
            f"resources.num_cpus={res.num_cpus} but this machine has {machine} CPUs: set "
            f"resources.num_cpus ≤ {machine} (or null)"
        )
    available = res.num_cpus or machine
    learner_cpus = res.num_learners if res.num_gpus_per_learner == 0 else 0
    needed = 1 + res.num_env_runners + learner_cpus
    if needed > available:
        raise ConfigError(
            f"resources need {needed} CPUs (1 driver + {res.num_env_runners} env runners + "
            f"{learner_cpus} learners) but {available} are available: lower "
            "resources.num_env_runners / num_learners (0 runs them in the driver; "
            "raise num_envs_per_env_runner for throughput instead)"
        )


# ----- the one conversion ------------------------------------------------------------------
def algorithm_class(name: str) -> type:
    """The RLlib ``Algorithm`` class of ``name`` (imported directly, not by string)."""
    if name == "PPO":
        from ray.rllib.algorithms.ppo import PPO

        return PPO
    if name == "APPO":
        from ray.rllib.algorithms.appo import APPO

        return APPO
    if name == "IMPALA":
        from ray.rllib.algorithms.impala import IMPALA

        return IMPALA
    if name == "GRPO":
        from trainers.grpo_learner import GRPO

        return GRPO
    raise ConfigError(f"algorithm {name!r} is not supported: use PPO, APPO, IMPALA or GRPO")


#: faults-resume: a dead env runner is restarted (as an identical copy, weights synced) and the
#: iteration goes on without it; RLlib's 60 s pause between restarts is cut to 1 s, and a run
#: stops after 10 failed iterations in a row rather than 100.
FAULT_TOLERANCE: dict[str, Any] = {
    "restart_failed_env_runners": True,
    "max_num_env_runner_restarts": 100,
    "delay_between_env_runner_restarts_s": 1.0,
    "num_consecutive_env_runner_failures_tolerance": 10,
    "env_runner_health_probe_timeout_s": 30.0,
    "env_runner_restore_timeout_s": 300.0,
}


def to_algorithm_config(cfg: ExperimentConfig, plan: Plan | None = None) -> Any:
    """Convert ``cfg`` into a validated RLlib ``AlgorithmConfig`` (new API stack).

    Args:
        cfg: the experiment.
        plan: its :func:`resolve` result, when already computed.

    Returns:
        An ``AlgorithmConfig`` on which ``.validate()`` has passed; ``build_algo()`` builds it.

    Raises:
        ConfigError: see :func:`resolve`; also RLlib's own validation errors, re-raised.
    """
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec

    from marl_agents.modules import GRUModule, module_spec
    from scenarios.rllib_env import RLlibGraphEnv

    plan = plan or resolve(cfg)
    algo = cfg.algorithm
    res = cfg.resources
    grpo = algo.name == "GRPO"
    config = algorithm_class(algo.name).get_default_config()
    timeout = {"episode_timeout_s": cfg.episodes.timeout_s}  # the env's wall-clock limit
    if grpo:
        from trainers.grpo_learner import GroupedEnv

        config.environment(GroupedEnv, env_config={**grpo_env_config(cfg, plan), **timeout})
    else:
        config.environment(RLlibGraphEnv, env_config={**plan.env_config, **timeout})
    config.framework("torch")
    credit = cfg.credit.method != "team"
    # credit needs whole episodes; so do recurrent pools: RLlib 2.60 fails to recover the
    # state of an agent that skips env steps at the start of a cut continuation chunk; GRPO
    # scores whole episodes and samples a group as G sub-envs side by side
    specs = {pid: module_spec(p, plan.env_config) for pid, p in plan.pools.items()}
    stateful = any(isinstance(s.module_class, type) and issubclass(s.module_class, GRUModule)
                   for s in specs.values())  # fmt: skip
    config.env_runners(
        num_env_runners=res.num_env_runners,
        num_envs_per_env_runner=(
            algo.grpo_settings.group_size if grpo else res.num_envs_per_env_runner
        ),
        batch_mode="complete_episodes" if credit or stateful or grpo else "truncate_episodes",
        num_cpus_per_env_runner=1,
    )
    learners: dict[str, Any] = {
        "num_learners": res.num_learners,
        "num_gpus_per_learner": res.num_gpus_per_learner,
    }
    if credit:
        learners.update(_credit_learner(cfg, plan))
    config.learners(**learners)
    config.multi_agent(
        policies=list(plan.pools),
        policy_mapping_fn=PoolMapping(plan.agent_to_pool),
        policies_to_train=plan.trainable,
    )
    config.rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs=specs))
    config.training(**_training_kwargs(cfg))
    if grpo:
        g = algo.grpo_settings
        config.grpo(
            group_size=g.group_size,
            groups_per_iteration=g.groups_per_iteration,
            **dataclasses.asdict(g.loss),
        )
    config.callbacks(EpisodeMetrics)
    config.fault_tolerance(**FAULT_TOLERANCE)  # faults-resume: dead env runners restart
    config.debugging(seed=cfg.seed, log_level="ERROR")
    smoothing = algo.grpo_settings.episodes_per_iteration if grpo else 100
    config.reporting(metrics_num_episodes_for_smoothing=smoothing)
    try:
        config.validate()
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"RLlib rejected the config: {exc}") from exc
    return config


def grpo_env_config(cfg: ExperimentConfig, plan: Plan) -> dict[str, Any]:
    """The :class:`~trainers.grpo_learner.GroupedEnv` config: one task-seed stream from the
    experiment seed, each task once per sub-env, all sub-envs of a runner sharing the stream
    (the ``G`` rollouts of a group run side by side)."""
    env_config = {k: v for k, v in plan.env_config.items() if k != "seed_once"}
    return {**env_config, "seed": cfg.seed, "repeat": 1, "shared_seeds": True}


def _training_kwargs(cfg: ExperimentConfig) -> dict[str, Any]:
    a = cfg.algorithm
    if a.name == "GRPO":
        n = a.grpo_settings.episodes_per_iteration
        return {
            "lr": a.lr,
            "train_batch_size_per_learner": n,
            "minibatch_size": a.grpo_settings.minibatch_size or n,
            "num_epochs": a.num_epochs,
            "grad_clip": a.grad_clip,
            **a.extra,
        }
    kw: dict[str, Any] = {
        "lr": a.lr,
        "gamma": a.gamma,
        "train_batch_size_per_learner": a.train_batch_size,
        "minibatch_size": a.minibatch_size,
        "num_epochs": a.num_epochs,
        "entropy_coeff": a.entropy_coeff,
        "vf_loss_coeff": a.vf_loss_coeff,
        "grad_clip": a.grad_clip,
    }
    if a.name in ("PPO", "APPO"):
        kw.update(lambda_=a.gae_lambda, clip_param=a.clip_param)
    if a.name in ("APPO", "IMPALA"):
        # asynchronous learners consume whole rollout fragments: no PPO-style minibatches
        kw["minibatch_size"] = None
    if a.name == "PPO":
        kw["vf_clip_param"] = 10.0
    kw.update(a.extra)
    return kw


def credit_workers(cfg: ExperimentConfig) -> int:
    """Replay processes for credit: ``credit.workers``, or the cores the trainer leaves idle."""
    if cfg.credit.workers is not None:
        return cfg.credit.workers
    res = cfg.resources
    cpus = res.num_cpus or os.cpu_count() or 1
    learners = res.num_learners if res.num_gpus_per_learner == 0 else 0
    return max(1, min(8, cpus - res.num_env_runners - learners))


def _credit_learner(cfg: ExperimentConfig, plan: Plan) -> dict[str, Any]:
    from trainers.credit_connector import make_credit_connector

    credit = dataclasses.replace(cfg.credit, workers=credit_workers(cfg))
    # replays get the episodes' wall-clock limit: a hung tool must not stall the learner
    env_config = {**plan.env_config, "episode_timeout_s": cfg.episodes.timeout_s}
    out: dict[str, Any] = {"learner_connector": make_credit_connector(credit, env_config)}
    if cfg.credit.normalize:
        from trainers.credit_learner import CreditPPOTorchLearner

        out["learner_class"] = CreditPPOTorchLearner
    return out


# ----- per-episode metrics on the env runners ------------------------------------------------
#: distinct error texts an env-runner process remembers between two drains
MAX_DISTINCT_ERRORS = 50


class EpisodeJournal:
    """What this process's env runners saw since the trainer last drained it: the distinct
    error texts of failed episodes (with counts) and up to ``keep`` episode transcripts.

    One per process (:data:`JOURNAL`); :func:`drain_journal` is what the trainer runs on every
    env runner (``foreach_env_runner``) after an iteration, which also sets ``keep``.
    """

    def __init__(self) -> None:
        self.keep = 0
        self.transcripts: list[dict[str, Any]] = []
        self.errors: dict[tuple[str, str], dict[str, Any]] = {}

    def record_error(self, kind: str, text: str) -> None:
        """Count a failed episode's error; distinct texts (digits aside) are kept once."""
        key = (kind, error_key(text))
        entry = self.errors.get(key)
        if entry is not None:
            entry["count"] += 1
        elif len(self.errors) < MAX_DISTINCT_ERRORS:
            self.errors[key] = {"kind": kind, "error": text, "count": 1}

    def wants_transcript(self) -> bool:
        return len(self.transcripts) < self.keep

    def drain(self, keep: int) -> dict[str, Any]:
        """Everything recorded so far (then forgotten); keep ``keep`` transcripts from now on."""
        out = {"transcripts": self.transcripts, "errors": list(self.errors.values())}
        self.transcripts, self.errors, self.keep = [], {}, keep
        return out


JOURNAL = EpisodeJournal()


def drain_journal(env_runner: Any = None, keep: int = 0) -> dict[str, Any]:
    """``foreach_env_runner`` function: this process's :data:`JOURNAL`, drained."""
    return JOURNAL.drain(keep)


def error_key(text: str) -> str:
    """An error text with its numbers masked: errors that differ only in numbers are one."""
    return re.sub(r"\d+", "#", text.split("\n", 1)[0])[:300]


class EpisodeMetrics(RLlibCallback):
    """Logs each finished episode's verified outcome: team return, success, scenario metrics,
    failures (``error``: a node raised; ``timeout``: the wall-clock limit), and the oracle's
    expected return for the same task (where the scenario has one).

    Values are logged as per-iteration sums plus a count under ``marl/…`` so that
    :mod:`trainers.run` reports exact per-iteration means. Failed episodes' error texts and
    a few transcripts go to this process's :data:`JOURNAL`, which the trainer drains.
    """

    _scenarios: ClassVar[dict[str, Any]] = {}

    def on_episode_end(self, *, episode: Any, metrics_logger: Any = None, **kwargs: Any) -> None:
        if metrics_logger is None:
            return
        info = _final_outcome(episode)
        if info is None:
            return
        outcome, seed, failure = info["outcome"], info.get("seed"), info.get("failure")
        values = {
            "team_return": float(outcome.reward),
            "success": float(outcome.success),
            "truncated": float(bool(getattr(outcome, "truncated", False))),
            "error": float(failure == "error"),
            "timeout": float(failure == "timeout"),
        }
        if failure in ("error", "timeout"):
            JOURNAL.record_error(failure, str(info.get("error") or failure))
        if JOURNAL.wants_transcript():
            env = _graph_env(kwargs.get("env"), kwargs.get("env_index"))
            if env is not None and env.seed_used == seed and env.outcome is not None:
                # the raw actions let the trainer recompute credit by replaying the episode
                JOURNAL.transcripts.append({**env.transcript(), "_actions": env.episode_actions()})
        for key, value in (outcome.metrics or {}).items():
            values[f"metric/{key}"] = float(value)
        env_config = kwargs.get("env_runner").config.env_config if kwargs.get("env_runner") else {}
        oracle = self._oracle(env_config, seed)
        if oracle is not None:
            values["oracle"] = oracle
        metrics_logger.log_value((EPISODE_METRICS, "episodes"), 1, reduce="sum")
        for key, value in values.items():
            metrics_logger.log_value((EPISODE_METRICS, key), value, reduce="sum")

    def _oracle(self, env_config: Mapping[str, Any], seed: int | None) -> float | None:
        if seed is None or not env_config or "scenario" not in env_config:
            return None
        key = repr(sorted((k, repr(v)) for k, v in env_config.items()))
        if key not in self._scenarios:
            from scenarios.registry import build

            self._scenarios[key] = build(
                env_config["scenario"], env_config.get("topology"), **env_config.get("kwargs", {})
            )
        value = self._scenarios[key].oracle_value(np.random.default_rng(seed))
        return None if value is None else float(value)


def _final_outcome(episode: Any) -> dict[str, Any] | None:
    """The last infos of a finished multi-agent episode (``outcome``, ``seed``, ``failure``,
    ``error``...), or None when no agent's last infos carry an outcome."""
    for agent_episode in episode.agent_episodes.values():
        infos = agent_episode.get_infos()
        if len(infos) == 0:
            continue
        last = infos[-1]
        if isinstance(last, dict) and last.get("outcome") is not None:
            return last
    return None


def _graph_env(env: Any, index: int | None) -> Any:
    """The :class:`~scenarios.engine.GraphEnv` of sub-env ``index`` of an env runner's env."""
    from scenarios.engine import GraphEnv

    envs = getattr(env, "envs", None)
    obj = envs[index] if envs is not None and index is not None and index < len(envs) else env
    for _ in range(4):  # vector env → (wrappers) → RLlibGraphEnv → GraphEnv
        if isinstance(obj, GraphEnv):
            return obj
        obj = getattr(obj, "env", None) or getattr(obj, "unwrapped", None)
    return None
