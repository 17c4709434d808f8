"""ExperimentConfig → RLlib ``AlgorithmConfig`` (new API stack), in exactly one function.

:func:`to_algorithm_config` turns a resolved :class:`~trainers.plan.Plan` into an
``AlgorithmConfig`` and calls ``.validate()``; nothing here starts Ray. The algorithm config
class gives the ``.training()`` keywords (``AlgoConfig.training_kwargs`` plus ``extra``), the
pools give one ``RLModuleSpec`` each (:func:`marl_agents.modules.module_spec`).

``algorithm.learner: lean`` (PPO, GRPO) sets the lean learner of :mod:`trainers.learners.lean`
(the same math; with credit normalisation it is also the credit learner). PPO's
``algorithm.value_norm`` goes to the learners as ``learner_config_dict["value_norm"]``; with
``learner: rllib`` it sets :class:`~trainers.learners.value_norm_learner.ValueNormPPOLearner`
(RLlib's
step with normalised value targets; the credit learner is one too). PPO's ``algorithm.critic``
(``state``/``state_obs``: MAPPO) gives ``mlp``/``gru``/``mpnn`` pools a centralised critic
(``plan.critic_dims``; :mod:`marl_agents.critics`), the learners the critic input piece
(``learner_config_dict["critic"]``; :mod:`trainers.learners.critic_input`) and the env the
global state in its infos (``env_config["global_state"]``).

``GRPO`` builds :class:`~trainers.grpo.algorithm.GRPO` (the GRPO learner, whole episodes, the
group schedule and loss knobs of ``algorithm.grpo``) over
:class:`~trainers.sampling.grouped_env.GroupedEnv` (``G`` rollouts of a task side by side, several
groups at once: ``RunnerSpec.groups_in_flight``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from trainers.configs.algorithms import GRPOAlgo, PPOAlgo
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.runner import RunnerSpec
from trainers.configs.typed import ConfigError
from trainers.learners.value_norm import VALUE_NORM_BETA_KEY, VALUE_NORM_KEY
from trainers.plan import Plan, resolve
from trainers.signals.episode_metrics import EpisodeMetrics
from trainers.signals.monitors import KL_TO_START


class PoolMapping:
    """A picklable ``policy_mapping_fn``: agent id → pool id."""

    def __init__(self, agent_to_pool: Mapping[str, str]) -> None:
        self.agent_to_pool = dict(agent_to_pool)

    def __call__(self, agent_id: str, episode: Any = None, **kwargs: Any) -> str:
        return self.agent_to_pool[agent_id]

    def __repr__(self) -> str:
        return f"PoolMapping({self.agent_to_pool})"


# ----- the one conversion ------------------------------------------------------------------
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

    from marl_agents.modules import module_spec
    from scenarios.env_spec import SPEC_KEY
    from scenarios.rllib_env import RLlibGraphEnv
    from trainers.configs.runner import RUNNER_KEY
    from trainers.learners.critic_input import AGENTS_KEY, CRITIC_KEY

    plan = plan or resolve(cfg)
    algo = cfg.algorithm
    config = algo.algorithm_class().get_default_config()
    env_config = {SPEC_KEY: plan.env, RUNNER_KEY: plan.runner}
    if plan.runner.grouped:  # tasks from a schedule (GRPO groups, a curriculum)
        from trainers.sampling.grouped_env import GroupedEnv

        # RLlib's env checker steps the first sub-env once; a one-step episode would finish
        # there and shift that env's task-seed schedule, splitting its groups
        config.environment(GroupedEnv, env_config=env_config, disable_env_checking=True)
    else:
        config.environment(RLlibGraphEnv, env_config=env_config)
    config.framework("torch")
    dims = plan.critic_dims  # centralised critics (algorithm.critic; marl_agents.critics)
    specs = {pid: module_spec(p, plan.env, dims.get(pid, 0)) for pid, p in plan.pools.items()}
    config.env_runners(**_env_runner_kwargs(cfg, specs, plan.runner))
    if plan.batched:
        from trainers.sampling.batched_runner import BatchedEnvRunner

        config.env_runners(env_runner_cls=BatchedEnvRunner)
    learners: dict[str, Any] = {
        "num_learners": cfg.resources.num_learners,
        "num_gpus_per_learner": cfg.resources.num_gpus_per_learner,
    }
    if cfg.credit.method != "team":
        learners["learner_connector"] = _credit_connector(cfg, plan)
    learner = learner_class(cfg)
    if learner is not None:
        learners["learner_class"] = learner
    config.learners(**learners)
    config.multi_agent(
        policies=list(plan.pools),
        policy_mapping_fn=PoolMapping(plan.agent_to_pool),
        policies_to_train=plan.trainable,
    )
    config.rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs=specs))
    config.training(**{**algo.training_kwargs(), **algo.extra})
    if isinstance(
        algo, PPOAlgo
    ):  # read by trainers.learners.value_norm_learner.ValueNormPPOLearner
        config.learner_config_dict = {
            **config.learner_config_dict,
            VALUE_NORM_KEY: algo.value_norm,
            VALUE_NORM_BETA_KEY: algo.value_norm_beta,
            # read by trainers.learners.critic_input
            CRITIC_KEY: algo.critic,
            AGENTS_KEY: list(plan.agents),
        }
    smoothing = 100
    if isinstance(algo, GRPOAlgo):
        g = algo.grpo
        config.grpo(
            group_size=g.group_size,
            groups_per_iteration=g.groups_per_iteration,
            async_sampling=g.async_sampling.enabled,
            max_staleness=g.async_sampling.max_staleness,
            **dataclasses.asdict(g.loss),
        )
        smoothing = g.episodes_per_iteration
        config.learner_config_dict = {
            **config.learner_config_dict,
            KL_TO_START: cfg.monitors.kl.log,
        }
    config.callbacks(EpisodeMetrics)
    config.fault_tolerance(**FAULT_TOLERANCE)  # faults-resume: dead env runners restart
    config.debugging(seed=cfg.seed, log_level="ERROR")
    config.reporting(metrics_num_episodes_for_smoothing=smoothing)
    try:
        config.validate()
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"RLlib rejected the config: {exc}") from exc
    return config


def _env_runner_kwargs(
    cfg: ExperimentConfig, specs: Mapping[str, Any], runner: RunnerSpec
) -> dict[str, Any]:
    """Sampling: whole episodes for credit (replays), recurrent pools (RLlib 2.60 fails to
    recover the state of an agent that skips env steps at the start of a cut continuation
    chunk) and GRPO (side by side: ``groups_in_flight`` groups of ``G`` sub-envs, scored as
    whole episodes; one after another: one env)."""
    from marl_agents.modules import GRUModule

    algo = cfg.algorithm
    grpo = isinstance(algo, GRPOAlgo)
    stateful = any(isinstance(s.module_class, type) and issubclass(s.module_class, GRUModule)
                   for s in specs.values())  # fmt: skip
    whole = grpo or stateful or cfg.credit.method != "team"
    return {
        "num_env_runners": cfg.resources.num_env_runners,
        "num_envs_per_env_runner": (
            (runner.group_size * runner.groups_in_flight if runner.whole_groups else 1)
            if grpo
            else cfg.resources.num_envs_per_env_runner
        ),
        "batch_mode": "complete_episodes" if whole else "truncate_episodes",
        "num_cpus_per_env_runner": 1,
        "num_gpus_per_env_runner": cfg.resources.num_gpus_per_env_runner,
        **_llm_env_to_module(specs),
    }


def _llm_env_to_module(specs: Mapping[str, Any]) -> dict[str, Any]:
    """LLM pools: RLlib's own env runner adds each call's constraint to the forward batch
    (:mod:`marl_agents.llm.constraint_connector`; the batched sampler adds it itself)."""
    from marl_agents.llm.constraint_connector import constraint_keys_connector
    from marl_agents.llm.rl_module import CausalLMModule

    llm = any(isinstance(s.module_class, type) and issubclass(s.module_class, CausalLMModule)
              for s in specs.values())  # fmt: skip
    return {"env_to_module_connector": constraint_keys_connector} if llm else {}


def learner_class(cfg: ExperimentConfig) -> type | None:
    """The learner class the algorithm config builds (:meth:`AlgoConfig.learner_class
    <trainers.configs.algorithms.AlgoConfig.learner_class>`: the lean learner, the credit
    learner, RLlib's PPO step with normalised targets), or None for RLlib's own."""
    return cfg.algorithm.learner_class(cfg.credit.method != "team" and cfg.credit.normalize)


def credit_workers(cfg: ExperimentConfig) -> int:
    """Replay processes for credit: ``credit.workers``, or the cores the trainer leaves idle."""
    if cfg.credit.workers is not None:
        return cfg.credit.workers
    res = cfg.resources
    cpus = res.num_cpus or os.cpu_count() or 1
    learners = res.num_learners if res.num_gpus_per_learner == 0 else 0
    return max(1, min(8, cpus - res.num_env_runners - learners))


def _credit_connector(cfg: ExperimentConfig, plan: Plan) -> Any:
    from scenarios.env_spec import SPEC_KEY
    from trainers.credit.connector import make_credit_connector

    credit = dataclasses.replace(cfg.credit, workers=credit_workers(cfg))
    # replays get the episodes' wall-clock limit: a hung tool must not stall the learner
    return make_credit_connector(credit, {SPEC_KEY: plan.env})
