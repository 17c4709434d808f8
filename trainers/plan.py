"""Resolve an experiment against its scenario: every check that needs the scenario, no Ray.

:func:`resolve` imports and builds the scenario (a reference is also checked importable by
Ray's workers, :mod:`trainers.cluster`), resolves the pools
(:func:`marl_agents.pools.resolve_pools`) and checks models, text agents, the algorithm, credit
and resources, returning a :class:`Plan`; :func:`with_text_defaults` completes a config for a
scenario whose agents all act with text. Scenario capabilities are read from the class
attributes of :class:`scenarios.base.Scenario` (``has_text_agents``, ``has_oracle``,
``has_local_rewards``, ``scripted_policies``). Every problem is a one-line
:class:`~trainers.configs.typed.ConfigError` naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from marl_agents.pools import (
    AgentPool,
    LLMModel,
    ModelConfig,
    PoolError,
    ScriptedModel,
    resolve_pools,
)
from scenarios.env_spec import EnvSpec
from trainers.budgets import check_contexts, system_prompt_warnings
from trainers.cluster import check_workers_import, joins_cluster
from trainers.configs.algorithms import GRPOAlgo, PPOAlgo
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.runner import RunnerSpec
from trainers.configs.typed import ConfigError, to_plain
from trainers.credit.settings import check_credit_for
from trainers.signals.headline import has_success

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Plan:
    """A validated experiment: what runs where, before any RLlib object exists.

    Attributes:
        cfg: the experiment config.
        scenario_id: the versioned id of a registered scenario (``delegate-v0``), or the import
            reference of a user's scenario as given (``myapp.team:scenario``).
        env: the environment (:class:`~scenarios.env_spec.EnvSpec`, with the scenario built
            here): what every env runner, replay worker and evaluation builds.
        runner: what env runners are told besides (:class:`~trainers.configs.runner.RunnerSpec`).
        batched: env runners sample with the batched sampler (``episodes.sampler``).
        agents: agent ids, in the topology's order.
        roles: agent id → role.
        pools: pool id → resolved :class:`~marl_agents.pools.AgentPool`.
        has_oracle: whether the scenario reports ``oracle_value``.
        critic_dims: pool id → width of its centralised critic's input column
            (``algorithm.critic`` ``state``/``state_obs``; :mod:`marl_agents.critics`); empty
            for ``local`` critics.
        has_success: whether the scenario defines success (:func:`trainers.signals.headline.
            has_success`): rows and tables show a success rate only then.
        prompt_warnings: token-budget warnings (:mod:`trainers.budgets`): replies past a
            pool's context, agents whose system prompt truncation cuts (``check_prompts``).
    """

    cfg: ExperimentConfig
    scenario_id: str
    env: EnvSpec
    runner: RunnerSpec
    batched: bool
    agents: list[str]
    roles: dict[str, str]
    pools: dict[str, AgentPool]
    has_oracle: bool
    critic_dims: dict[str, int] = dataclasses.field(default_factory=dict)
    has_success: bool = True
    prompt_warnings: list[str] = dataclasses.field(default_factory=list)

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


def resolve(
    cfg: ExperimentConfig,
    *,
    ray_workers: bool = True,
    text_defaults: bool = False,
    check_prompts: bool = False,
) -> Plan:
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
            that do), an LLM pool without algorithm GRPO or GRPO's ``kl_coef`` on a trained
            non-LLM pool, credit
            the scenario cannot support, GPUs or CPUs the machine does not have, LLM pools whose
            memory estimate exceeds the configured devices.

    For a text scenario (``has_text_agents``) with LLM pools, the scenario's
    ``tokenizer`` defaults to the pools' model (``scenario_kwargs.tokenizer`` overrides it).
    With ``text_defaults`` the config is first completed by :func:`with_text_defaults` from the
    same scenario object (built once); the plan's ``cfg`` is the completed config.

    Token budgets (:mod:`trainers.budgets`): an LLM pool whose prompt budget exceeds its
    model's context is a ``ConfigError``, one whose prompt plus reply budget does a warning;
    with ``check_prompts`` (a training run) a chat app plays one trial episode with its default
    replies here, and each agent whose system prompt a too-long prompt would lose is a warning.
    Warnings are logged and kept in ``Plan.prompt_warnings``.
    """
    from scenarios.registry import is_reference

    cfg.check()
    scenario, topology, kwargs = _build_scenario(cfg)
    if text_defaults:
        completed = _complete_text(cfg, scenario)
        if completed is not cfg:
            cfg = completed
            cfg.check()
            if _text_kwargs(cfg, lambda: type(scenario)) != kwargs:  # its pools' tokenizer
                scenario, topology, kwargs = _build_scenario(cfg)
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
            frozen_defaults=_frozen_defaults(type(scenario)),
        )
    except PoolError as exc:
        raise ConfigError(str(exc)) from exc
    if topology is None and not is_reference(cfg.scenario):
        topology = topo.spec or topo  # a reference keeps None: its own default, as built here
    _check_models(cfg, pools, type(scenario))
    _check_text(cfg, scenario, pools)
    _check_algorithm(cfg, pools)
    if cfg.algorithm.extra:
        check_extra_keys(cfg)
    family = "PPO" if isinstance(cfg.algorithm, PPOAlgo) else cfg.algorithm.name  # presets
    check_credit_for(cfg.credit, scenario, agents, family)
    _check_credit_rewards(cfg)
    _check_resources(cfg)
    _check_memory(cfg, pools)
    prompt_warnings = check_contexts(pools)
    if check_prompts:
        prompt_warnings += system_prompt_warnings(scenario, cfg.seed)
    for line in prompt_warnings:
        log.warning("%s", line)
    has_oracle = type(scenario).has_oracle
    if has_oracle:
        has_oracle = scenario.oracle_value(np.random.default_rng(0)) is not None
    scenario_id = cfg.scenario if is_reference(cfg.scenario) else scenario.id()
    critic_dims = _critic_dims(cfg, scenario, agents, pools)
    runner = _runner_spec(cfg, pools)
    episodes = cfg.episodes
    env = EnvSpec(
        scenario=cfg.scenario,
        topology=topology,
        kwargs=kwargs,
        # RLlib re-passes its seed at every complete-episode sample; a group schedule draws
        # its own task seeds
        seed_once=not runner.grouped,
        episode_timeout_s=episodes.timeout_s,
        engine=episodes.engine,
        rewards=cfg.rewards.to_spec() if cfg.rewards.sources else None,
        tool_latency=to_plain(episodes.tool_latency),
        tool_timeout_s=episodes.tool_timeout_s,
        global_state=bool(critic_dims),  # reported only where a centralised critic reads it
        # a pool that turns its action mask off lets illegal actions reach the env's own rule
        check_action_masks=all(getattr(p.model, "action_mask", True) for p in pools.values()),
        built=scenario,
    )
    return Plan(
        cfg,
        scenario_id,
        env,
        runner,
        batched_sampler(cfg),
        agents,
        roles,
        pools,
        has_oracle,
        critic_dims,
        has_success(scenario),
        prompt_warnings,
    )


def _runner_spec(cfg: ExperimentConfig, pools: Mapping[str, AgentPool]) -> RunnerSpec:
    """The env runners' settings: the group schedule of GRPO (one task-seed stream from the
    experiment seed, each task once per sub-env, all sub-envs of a runner sharing the stream:
    the ``G`` rollouts of a group side by side, or ``repeat = G`` one after another), the
    curriculum's tasks (:mod:`trainers.signals.curriculum`), env threads and the gold
    scorer."""
    from trainers.signals import curriculum

    grpo = isinstance(cfg.algorithm, GRPOAlgo)
    side_by_side = grpo and grpo_side_by_side(cfg, pools)
    gold = cfg.monitors.gold
    return RunnerSpec(
        seed=cfg.seed,
        repeat=cfg.algorithm.grpo.group_size if grpo and not side_by_side else 1,
        shared_seeds=grpo,
        whole_groups=side_by_side,
        group_size=cfg.algorithm.grpo.group_size if side_by_side else 1,
        groups_in_flight=groups_in_flight(cfg) if side_by_side else 1,
        curriculum=curriculum.env_config(cfg).get("curriculum"),
        env_threads=cfg.episodes.env_threads,
        gold_scorer=gold.scorer if gold.scorer and gold.action != "off" else None,
        grouped=grpo or cfg.curriculum.active,
    )


def batched_sampler(cfg: ExperimentConfig) -> bool:
    """Whether env runners sample with :class:`~trainers.sampling.batched_runner.BatchedEnvRunner`:
    ``episodes.sampler: batched``, the default (small-network and LLM pools alike); RLlib's
    own sampler with ``rllib``."""
    return cfg.episodes.sampler != "rllib"


def groups_in_flight(cfg: ExperimentConfig) -> int:
    """GRPO groups an env runner samples side by side (``algorithm.grpo.groups_in_flight``;
    by default the runner's share of an iteration: every group it samples in one
    ``sample()`` runs at once, so each step's decisions of all ``k · G`` sub-envs go into one
    batched ``generate`` per pool, as TRL generates ``G · B`` rows at once)."""
    g = cfg.algorithm.grpo
    if g.groups_in_flight is not None:
        return g.groups_in_flight
    return -(-g.groups_per_iteration // max(1, cfg.resources.num_env_runners))


def grpo_side_by_side(cfg: ExperimentConfig, pools: Mapping[str, AgentPool]) -> bool:
    """Whether GRPO samples a group's ``G`` rollouts side by side (``G`` sub-envs per group,
    :func:`groups_in_flight` groups at once, one batched generation per step: teams with an
    LLM pool on the batched sampler, which holds a sub-env whose episode ended until its whole
    group has ended: ``RunnerSpec.whole_groups``) or one after another in one env
    (``repeat = G``: small-network teams, and any team on RLlib's sampler, whose loop starts
    a sub-env's next task as soon as its episode ends). Either way every group is whole when
    episode lengths vary."""
    from marl_agents.pools import LLMModel

    llm = any(isinstance(p.model, LLMModel) for p in pools.values())
    return llm and batched_sampler(cfg)


def _critic_dims(
    cfg: ExperimentConfig, scenario: Any, agents: list[str], pools: Mapping[str, AgentPool]
) -> dict[str, int]:
    """Pool id → critic input width under ``algorithm.critic`` (empty for ``local``): every
    ``mlp``/``gru``/``mpnn`` pool; the scenario must have a global state and no pool that
    trains may be of another kind."""
    from marl_agents.critics import critic_input_dim
    from marl_agents.pools import GRUModel, MLPModel, MPNNModel
    from scenarios.global_state import state_space_of

    kind = getattr(cfg.algorithm, "critic", "local")
    if kind == "local":
        return {}
    space = state_space_of(scenario)
    if space is None:
        raise ConfigError(
            f"algorithm.critic={kind!r} needs the scenario's global state, but {scenario.id()} "
            "has none (text agents or non-Box observations): declare Scenario.state_space and "
            "global_state (scenarios.global_state), or use algorithm.critic: local"
        )
    state_dim = int(np.prod(space.shape))
    dims = {}
    for pid, pool in pools.items():
        if isinstance(pool.model, (MLPModel, GRUModel, MPNNModel)):
            obs = int(np.prod(pool.observation_space.shape))
            dims[pid] = critic_input_dim(kind, state_dim, obs, len(agents))
        elif pool.trainable:
            raise ConfigError(
                f"pool {pid!r} trains a {pool.model.type} model, which cannot take a "
                f"centralised critic (algorithm.critic={kind!r}): use an mlp, gru or mpnn "
                "model for it, freeze it, or use algorithm.critic: local"
            )
    return dims


def _build_scenario(cfg: ExperimentConfig) -> tuple[Any, Any, dict[str, Any]]:
    """The scenario, the topology as given (a mapping becomes a ``Topology``) and the kwargs
    it was built with (a text scenario's tokenizer added)."""
    from scenarios.base import ScenarioError
    from scenarios.registry import build, scenario_class
    from topologies import Topology, TopologyError

    topology: Any = cfg.topology
    try:
        if isinstance(topology, dict):
            topology = Topology.from_dict(topology)
        kwargs = _text_kwargs(
            cfg, lambda: scenario_class(cfg.scenario, topology, **cfg.scenario_kwargs)
        )
        scenario = build(cfg.scenario, topology, **kwargs)
    except (ScenarioError, TopologyError, TypeError) as exc:
        raise ConfigError(f"scenario={cfg.scenario!r}: {exc}") from exc
    return scenario, topology, kwargs


def _frozen_defaults(scenario_cls: type) -> dict[str, ModelConfig]:
    """Role → the scripted model a frozen, unconfigured pool of that role gets (the policies
    the scenario declares with ``default_for``)."""
    from marl_agents.scripted import frozen_defaults

    return {
        role: ScriptedModel(policy=name) for role, name in frozen_defaults(scenario_cls).items()
    }


def _check_models(
    cfg: ExperimentConfig, pools: Mapping[str, AgentPool], scenario_cls: type
) -> None:
    """Scripted policies exist for this scenario, checkpoints exist, APPO has no recurrent,
    message-passing or input-normed pool (no target network)."""
    from marl_agents.modules import checkpoint_module_dir
    from marl_agents.pools import CheckpointModel, GRUModel, MLPModel, MPNNModel
    from marl_agents.scripted import scripted_factory

    for pool in pools.values():
        m = pool.model
        try:
            if isinstance(m, ScriptedModel):
                scripted_factory(m.policy, scenario_cls)
            if isinstance(m, CheckpointModel):
                checkpoint_module_dir(m.path, m.module or pool.id)
        except PoolError as exc:
            raise ConfigError(f"pool {pool.id!r}: {exc}") from exc
        if isinstance(m, (GRUModel, MPNNModel)) and cfg.algorithm.name == "APPO":
            raise ConfigError(
                f"pool {pool.id!r}: {m.type} modules run with PPO or IMPALA; APPO needs a "
                "target network (use model.type 'mlp' or algorithm PPO)"
            )
        if isinstance(m, MLPModel) and m.input_norm and cfg.algorithm.name == "APPO":
            raise ConfigError(
                f"pool {pool.id!r}: model.input_norm builds its own module, which has no target "
                "network for APPO: use algorithm PPO or IMPALA, or drop input_norm"
            )


def with_text_defaults(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` completed for a scenario whose agents all act with text, when it leaves the
    algorithm at its defaults: the algorithm becomes GRPO and every pool without a configured
    model an LLM pool of the scenario's tokenizer (``"tiny"`` unless it names a directory; with
    several such pools of a real model, each a LoRA adapter on one shared base), so
    ``marl run pkg.app:scenario --train supervisor`` trains a chat app as it is. Any other
    config is returned unchanged (and ``resolve`` names what to set).
    """
    from scenarios.base import ScenarioError
    from scenarios.registry import build

    if cfg.algorithm != PPOAlgo():
        return cfg
    try:
        scenario = build(cfg.scenario, cfg.topology, **cfg.scenario_kwargs)
    except (ScenarioError, TypeError, ValueError):
        return cfg  # resolve() reports it
    return _complete_text(cfg, scenario)


def _complete_text(cfg: ExperimentConfig, scenario: Any) -> ExperimentConfig:
    """:func:`with_text_defaults` given the scenario already built."""
    from marl_agents.pools import LoRAConfig, PoolConfig, default_assignment

    if cfg.algorithm != PPOAlgo():
        return cfg
    agents = list(scenario.possible_agents)
    if not agents or set(scenario.text_agents) != set(agents):
        return cfg
    topo = scenario.topology
    pools = dict.fromkeys(default_assignment(agents, topo.roles, topo.pools, cfg.sharing).values())
    path = scenario.tokenizer_name or "tiny"
    # several pools of a real model: LoRA adapters on one base (one copy of its weights per
    # process, not one per pool); the tiny model (~1.5 MB) keeps whole models
    lora = len(pools) > 1 and path != "tiny"
    missing = {
        pid: PoolConfig(model=LLMModel(path=path, lora=LoRAConfig() if lora else None))
        for pid in pools
    }
    return dataclasses.replace(cfg, algorithm=GRPOAlgo(), pools={**missing, **cfg.pools})


def _text_kwargs(cfg: ExperimentConfig, scenario_cls: Callable[[], type]) -> dict[str, Any]:
    """The scenario kwargs; a text scenario gets its LLM pools' tokenizer unless one is given.

    ``scenario_cls`` returns the scenario's class (asked only when there are LLM pools).

    Raises:
        ConfigError: LLM pools on a scenario without text agents, or LLM pools of different
            models and no ``scenario_kwargs.tokenizer``.
    """
    kwargs = dict(cfg.scenario_kwargs)
    llm = {pid: p.model for pid, p in cfg.pools.items() if isinstance(p.model, LLMModel)}
    if not llm:
        return kwargs
    if not scenario_cls().has_text_agents:
        pid = next(iter(llm))
        raise ConfigError(
            f"pools.{pid}.model.type is 'llm' but scenario {cfg.scenario!r} has no text agents "
            "(token-id observations and actions): use a text scenario (text-delegate, "
            "text-toolchain) or a non-LLM model type (mlp, gru, mpnn)"
        )
    models = sorted({m.path for m in llm.values()})
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
    text = set(scenario.text_agents)
    for pool in pools.values():
        m, where = pool.model, f"pool {pool.id!r}"
        if not isinstance(m, LLMModel):
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
            raise ConfigError(f"{where}: {exc}") from exc
        vocab = _model_vocab(m.path)
        if vocab is not None and vocab > spaces.vocab_size:
            raise ConfigError(
                f"{where}: model {m.path!r} has {vocab} token ids but {scenario.id()}'s text "
                f"spaces allow {spaces.vocab_size}: set scenario_kwargs.tokenizer to the "
                "model's directory (or scenario_kwargs.vocab_size)"
            )


def _model_vocab(path: str) -> int | None:
    """``vocab_size`` in a saved model's ``config.json`` (``None`` for ``tiny``)."""
    if path == "tiny":
        return None
    from marl_agents.llm.checkpoints import inspect_checkpoint

    return inspect_checkpoint(path).vocab_size or None  # resolves named models / .gguf files


def _check_algorithm(cfg: ExperimentConfig, pools: Mapping[str, AgentPool]) -> None:
    """LLM pools run with GRPO; GRPO trains small-network pools without a KL reference."""
    from trainers.configs.algorithms import GRPOAlgo

    name = cfg.algorithm.name
    llm = [p.id for p in pools.values() if isinstance(p.model, LLMModel)]
    if llm and name != "GRPO":
        raise ConfigError(
            f"pool(s) {llm} are LLMs (model.type 'llm'): they run with token-level GRPO; set "
            f"algorithm.name: GRPO ({name} needs a value function, which a causal LM has not)"
        )
    if cfg.episodes.env_threads and cfg.episodes.sampler == "rllib":
        raise ConfigError(
            "episodes.env_threads needs the batched sampler: set episodes.sampler: batched, "
            "or remove env_threads"
        )
    if isinstance(cfg.algorithm, GRPOAlgo) and cfg.algorithm.grpo.kl_coef:
        other = [f"{p.id} ({p.model.type})" for p in pools.values()
                 if p.trainable and not isinstance(p.model, LLMModel)]  # fmt: skip
        if other:
            raise ConfigError(
                f"algorithm.grpo.kl_coef={cfg.algorithm.grpo.kl_coef} keeps a reference copy of "
                f"LLM pools only, but {', '.join(other)} would train: set "
                "algorithm.grpo.kl_coef: 0, or freeze them (leave them out of train)"
            )


def _check_memory(cfg: ExperimentConfig, pools: Mapping[str, AgentPool]) -> None:
    """The LLM pools' memory estimates fit the configured devices (before Ray starts)."""
    from marl_agents.llm.checkpoints import LLMPoolNeed, check_memory

    grpo = getattr(cfg.algorithm, "grpo", None)  # GRPO learners keep a reference copy
    reference = grpo is not None and bool(cfg.monitors.kl.log or grpo.loss.kl_coef)
    needs = [
        LLMPoolNeed(
            p.id,
            p.model.path,
            p.model.dtype,
            p.trainable,
            *_lora_need(p.model),
            reference=p.trainable and reference,
        )
        for p in pools.values()
        if isinstance(p.model, LLMModel)
    ]
    res = cfg.resources
    try:
        check_memory(
            needs,
            num_learners=res.num_learners,
            num_gpus_per_learner=res.num_gpus_per_learner,
            num_env_runners=res.num_env_runners,
            num_gpus_per_env_runner=res.num_gpus_per_env_runner,
        )
    except PoolError as exc:
        raise ConfigError(str(exc)) from exc


def _lora_need(m: LLMModel) -> tuple[str | None, int]:
    """A LoRA pool's shared-base key and adapter size for the memory check; ``(None, 0)``."""
    if not m.is_lora:
        return None, 0
    from marl_agents.llm.lora import adapter_parameters, base_key

    return "/".join(map(str, base_key(m.path, m.dtype, m.tiny_seed))), adapter_parameters(m)


def _check_credit_rewards(cfg: ExperimentConfig) -> None:
    """Counterfactual and local credit score with the scenario's verifier alone, so they refuse
    reward sources that would pay something else."""
    if cfg.credit.method == "team":
        return
    other = [
        s.name
        for s in cfg.rewards.sources
        if (s.kind, s.when, s.weight) != ("verifier", "end", 1.0)
    ]
    if other:
        raise ConfigError(
            f"credit {cfg.credit.method!r} values agents by the scenario's verifier (replays or "
            f"Outcome.local), but rewards.sources {other} pay other rewards that this credit "
            "would not see: use credit.method 'team' (turn credit still applies), or drop "
            "those sources"
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
    if res.num_gpus_per_env_runner > 0 and res.num_env_runners < 1:
        raise ConfigError(
            "resources.num_gpus_per_env_runner > 0 needs resources.num_env_runners ≥ 1 (RLlib "
            "gives GPUs to remote env runners only; the driver's runner samples on the CPU): "
            "set resources.num_env_runners=1"
        )
    for name in ("num_gpus_per_learner", "num_gpus_per_env_runner"):
        gpus = getattr(res, name)
        if gpus > 0 and not on_cluster:
            import torch

            if torch.cuda.device_count() == 0:
                raise ConfigError(
                    f"resources.{name}={gpus} but this machine has no GPU (RLlib would wait for "
                    f"one forever): set resources.{name}=0, or set RAY_ADDRESS to a cluster "
                    "with GPUs"
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


def check_extra_keys(cfg: ExperimentConfig) -> None:
    """``algorithm.extra`` names only keywords of the algorithm's RLlib ``.training()``.

    Raises:
        ConfigError: an unknown key, named with the closest valid ones.
    """
    import difflib
    import inspect

    if not cfg.algorithm.extra:
        return
    config_cls = type(cfg.algorithm.algorithm_class().get_default_config())
    valid: set[str] = set()
    for cls in config_cls.__mro__:
        method = cls.__dict__.get("training")
        if method is not None:
            params = inspect.signature(method).parameters.values()
            valid |= {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    for key in cfg.algorithm.extra:
        if key not in valid:
            close = difflib.get_close_matches(key, sorted(valid), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(
                f"algorithm.extra has {key!r}, which {cfg.algorithm.name}'s RLlib "
                f"AlgorithmConfig.training() does not take{hint}: remove it or use an RLlib "
                "training() keyword"
            )
