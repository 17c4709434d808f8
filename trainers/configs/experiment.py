"""Experiment configuration: small dataclasses per axis, with an exact YAML round trip.

An experiment is scenario × topology × pools × credit × algorithm × run settings (budget, seed,
resources, logging, output). Every axis is a small dataclass; :class:`ExperimentConfig` holds
them and converts to and from plain dicts and YAML exactly
(``ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg``). Models and algorithms are one class
per kind, selected by ``type:`` (:data:`marl_agents.pools.MODELS`) and ``name:``
(:data:`ALGORITHMS`). Field types are checked when an object is built, from YAML or Python,
and the YAML shorthands work in both (``algorithm="APPO"``, ``credit="shapley"``, a pool
given as its model type); value checks live in each class's ``check()`` (called by
:meth:`ExperimentConfig.check`); checks that need the scenario happen in
:func:`trainers.plan.resolve`, still before Ray starts. Every error is a one-line
:class:`ConfigError` naming the field, the value and the fix.

Example:
    >>> cfg = ExperimentConfig(scenario="delegate", topology="star:3", train=["orchestrator"])
    >>> ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg
    True
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from marl_agents.pools import MODELS, SHARING, ModelConfig, PoolConfig
from scenarios.engines import ENGINES
from scenarios.tool_latency import ToolLatency
from trainers.configs.algorithms import ALGORITHMS, AlgoConfig, PPOAlgo
from trainers.configs.credit import CreditConfig
from trainers.configs.curriculum import CurriculumConfig
from trainers.configs.monitors import MonitorsConfig
from trainers.configs.rewards import RewardsConfig
from trainers.configs.typed import (
    ConfigError,
    drop_default_fields,
    dump_yaml,
    from_plain,
    load_yaml_mapping,
    register_kinds,
    register_shorthand,
    set_path,
    to_plain,
    typed,
)

WANDB_MODES: tuple[str, ...] = ("offline", "online", "disabled")

register_kinds(ModelConfig, "type", MODELS, "mlp")  # type: ignore[arg-type]
register_shorthand(ModelConfig, lambda s: {"type": s})
register_shorthand(PoolConfig, lambda s: {"model": {"type": s}})

__all__ = [
    "BudgetConfig",
    "EpisodesConfig",
    "ExperimentConfig",
    "LoggingConfig",
    "OutputConfig",
    "ResourcesConfig",
]


def _check_async_runners(cfg: Any) -> None:
    """Asynchronous GRPO sampling overlaps remote env runners with the driver's learner."""
    grpo = getattr(cfg.algorithm, "grpo", None)
    runners = cfg.resources.num_env_runners
    if grpo is not None and grpo.async_sampling.enabled and runners < 1:
        raise ConfigError(
            f"algorithm.grpo.async_sampling.enabled=true with resources.num_env_runners="
            f"{runners}: asynchronous sampling runs on remote env runners; set "
            "resources.num_env_runners: 1 (or more), or enabled: false"
        )


def _check_rollouts(cfg: Any) -> None:
    """Rollout dumps record ``learner_group.update(episodes=...)``: PPO's and GRPO's."""
    name = cfg.algorithm.name
    if cfg.output.rollouts and not cfg.algorithm.records_rollouts:
        covered = [n for n, c in ALGORITHMS.items() if c.records_rollouts]
        raise ConfigError(
            f"output.rollouts=true with algorithm.name={name!r}: rollout dumps cover "
            f"{' and '.join(covered)} (their learner updates take episodes); use one of "
            "them or set output.rollouts: false"
        )


@dataclasses.dataclass
class BudgetConfig:
    """When training stops: the first of the limits that are set.

    Attributes:
        iterations: training iterations (one train batch each).
        env_steps: environment steps sampled.
        time_s: wall-clock seconds.
    """

    iterations: int | None = 40
    env_steps: int | None = None
    time_s: float | None = None

    def __post_init__(self) -> None:
        typed(self, "budget")

    def check(self) -> None:
        """At least one limit, every set limit positive."""
        limits = {"iterations": self.iterations, "env_steps": self.env_steps, "time_s": self.time_s}
        if all(v is None for v in limits.values()):
            raise ConfigError(
                "budget has no limit: set budget.iterations, budget.env_steps or budget.time_s"
            )
        for name, value in limits.items():
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ConfigError(
                    f"budget.{name} must be positive (or null to disable it), got {value!r}"
                )


@dataclasses.dataclass
class ResourcesConfig:
    """Where the work runs (defaults: everything in one process, tuned for a small CPU box).

    Attributes:
        num_env_runners: remote env-runner processes (0: sample in the driver; on 2 cores a
            second process buys almost nothing).
        num_envs_per_env_runner: environments stepped together per runner (batched inference).
        num_learners: remote learner processes (0: learn in the driver).
        num_gpus_per_learner: GPUs per learner (needs a GPU on the machine or cluster).
        num_gpus_per_env_runner: GPUs per remote env runner: its module (an LLM pool's
            sampling copy) generates on the GPU (needs ``num_env_runners ≥ 1``; fractions let
            the runner share one GPU with the learner, e.g. 0.5 each).
        num_cpus: CPUs Ray may use (``None``: all of this machine's).
    """

    num_env_runners: int = 0
    num_envs_per_env_runner: int = 16
    num_learners: int = 0
    num_gpus_per_learner: float = 0.0
    num_gpus_per_env_runner: float = 0.0
    num_cpus: int | None = None

    def __post_init__(self) -> None:
        typed(self, "resources")

    def check(self) -> None:
        """Non-negative counts."""
        counts = (self.num_env_runners, self.num_learners, self.num_gpus_per_learner,
                  self.num_gpus_per_env_runner)  # fmt: skip
        if any(c < 0 for c in counts):
            raise ConfigError("resources: counts must be ≥ 0")
        if self.num_envs_per_env_runner < 1:
            raise ConfigError("resources.num_envs_per_env_runner must be ≥ 1")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError("resources.num_cpus must be ≥ 1 or null")


@dataclasses.dataclass
class LoggingConfig:
    """Experiment tracking.

    Attributes:
        wandb: ``"offline"`` (default: files under the run dir, no account), ``"online"`` or
            ``"disabled"``.
        project: wandb project.
        entity: wandb entity (team or user), online only.
        progress: show a progress bar and summary tables.
    """

    wandb: str = "offline"
    project: str = "marl-orchestra"
    entity: str | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        typed(self, "logging")

    def check(self) -> None:
        """Known wandb mode."""
        if self.wandb not in WANDB_MODES:
            raise ConfigError(
                f"logging.wandb={self.wandb!r} is unknown: use one of {', '.join(WANDB_MODES)}"
            )


@dataclasses.dataclass
class OutputConfig:
    """Where results go.

    Attributes:
        dir: parent directory of run directories.
        name: run directory name (default ``{scenario}__{algo}__{seed}__{time}``).
        checkpoint_every: save a checkpoint every this many iterations (0: only at the end).
        plot: write a learning-curve PNG at the end.
        transcripts: episodes of each iteration saved as readable transcripts under
            ``<run>/transcripts/`` (0: none).
        export_hf: also save every trained LLM pool in Hugging Face format (model and
            tokenizer, ``save_pretrained``): ``<checkpoint>/model/<pool>`` with each periodic
            checkpoint and ``<run>/model/<pool>`` at the end.
        rollouts: save what every learner update consumed (episodes, behaviour log-probs,
            update arguments, RNG state), compressed, as ``<run>/rollouts/iter_NNNNNN.npz``;
            ``trainers.rollouts.replay_updates`` redoes the updates from a checkpoint.
    """

    dir: str = "runs"
    name: str | None = None
    checkpoint_every: int = 10
    plot: bool = True
    transcripts: int = 2
    export_hf: bool = False
    rollouts: bool = False

    def __post_init__(self) -> None:
        typed(self, "output")

    def check(self) -> None:
        """Non-negative checkpoint interval and transcript count."""
        if self.checkpoint_every < 0:
            raise ConfigError("output.checkpoint_every must be ≥ 0 (0: only at the end)")
        if not 0 <= self.transcripts <= 100:
            raise ConfigError(
                f"output.transcripts must be in 0…100 episodes per iteration, got "
                f"{self.transcripts}"
            )


#: ``episodes.sampler`` values (``auto``, an older name of ``batched``, is read as ``batched``)
SAMPLERS = ("batched", "rllib")


@dataclasses.dataclass
class EpisodesConfig:
    """How episodes may fail, and when failures stop a run.

    Attributes:
        timeout_s: wall-clock seconds the graph may run in one episode (the time inside the
            env's ``reset``/``step``; the policy's time between decisions does not count). A
            longer episode is truncated and counted in ``charts/timeout_rate``; a node that
            blocks is interrupted where the env runs in a process's main thread (see
            :mod:`scenarios.alarm`). ``None``: no limit.
        fail_after: stop the run, with the first error, once every finished episode failed (a
            node error or a timeout) in this many consecutive iterations; 0: never stop.
        engine: how episodes run: ``auto`` (the stepped fast path where the graph compiles for
            it, else LangGraph), ``langgraph``, ``fast`` (the fast path, or an error naming why
            not) or ``check`` (both, compared at every step: slow, for tests); the same
            episodes either way (:class:`scenarios.graph_env.GraphEnv`).
        sampler: how env runners sample: ``batched`` (the default;
            :mod:`trainers.sampling.batched_runner`: one forward per module per step over all
            acting agents, for an LLM pool one batched ``generate``; per-env RNG streams) or
            ``rllib`` (RLlib's own ``MultiAgentEnvRunner``, for comparison); ``auto``, an older
            name of ``batched``, is read as ``batched``.
        env_threads: with the batched sampler, step each env of a runner on its own thread,
            so episodes waiting on slow tools or remote model calls do not hold the others
            (raise ``resources.num_envs_per_env_runner`` to keep more episodes in flight); a
            call running past ``timeout_s`` loses its episode (counted as a timeout) and its
            env is replaced. Off: envs step one after another in the sampler's thread.
            With threads each env's episodes are the same as without, but which envs' steps
            fill a ``sample()`` depends on when their calls return: runs (and resumes) are not
            bit-reproducible.
        tool_latency: ``{seconds: L, jitter: J}``: every tool call of a live episode first
            waits ``L`` s, or ``L ± J`` uniform from an RNG of its own (the episodes stay the
            same), for benchmarks and tests of slow tools (:mod:`scenarios.tool_latency`);
            ``None``: no latency.
        tool_timeout_s: a tool call longer than this raises ``ToolTimeout`` inside the tool
            (by default the episode fails with that error); ``None``: no limit.
    """

    timeout_s: float | None = 300.0
    fail_after: int = 1
    engine: str = "auto"
    sampler: str = "batched"
    env_threads: bool = False
    tool_latency: ToolLatency | None = None
    tool_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.sampler == "auto":  # the older name of the default
            self.sampler = "batched"
        typed(self, "episodes")

    def check(self) -> None:
        """A positive timeout (or null) and a non-negative iteration count."""
        if self.timeout_s is not None and not (
            self.timeout_s > 0 and math.isfinite(self.timeout_s)
        ):
            raise ConfigError(
                f"episodes.timeout_s must be a positive number of seconds, or null for no "
                f"limit, got {self.timeout_s!r}"
            )
        if self.fail_after < 0:
            raise ConfigError(
                f"episodes.fail_after must be ≥ 0 iterations (0: never stop), got {self.fail_after}"
            )
        if self.engine not in ENGINES:
            raise ConfigError(
                f"episodes.engine must be one of {', '.join(ENGINES)}, got {self.engine!r}"
            )
        if self.sampler not in SAMPLERS:
            raise ConfigError(
                f"episodes.sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}"
            )
        if self.tool_timeout_s is not None and not (
            self.tool_timeout_s > 0 and math.isfinite(self.tool_timeout_s)
        ):
            raise ConfigError(
                f"episodes.tool_timeout_s must be a positive number of seconds, or null for no "
                f"limit, got {self.tool_timeout_s!r}"
            )


@dataclasses.dataclass
class ExperimentConfig:
    """One experiment: scenario × topology × pools × credit × algorithm × run settings.

    Attributes:
        scenario: a registered scenario name (``marl scenarios`` lists them), or an import
            reference ``package.module:attr`` to your own scenario: a ``Scenario`` subclass,
            a ``Scenario`` instance or a function returning one. Every process (env runners,
            credit workers, Tune trials) rebuilds it by importing the reference; a class or
            function gets ``scenario_kwargs`` and, when set, ``topology`` as keyword arguments
            (see :mod:`scenarios.registry`).
        scenario_kwargs: keyword arguments of the scenario (none for a ``Scenario`` instance).
        topology: topology spec (``"star:3"``), a ``Topology.to_dict()`` mapping, or ``None``
            for the scenario's default.
        sharing: how agents not listed in ``pools`` are pooled: ``"role"`` (parameter sharing
            by role, default), ``"agent"`` (no sharing), ``"team"`` (one module) or
            ``"explicit"`` (only the listed pools).
        pools: pool id → :class:`PoolConfig` (its model; optionally the agents it serves).
        train: agent or pool ids that learn (``None``: all learnable pools).
            ``["orchestrator"]`` trains the orchestrator against frozen subagents: frozen pools
            with no configured model get the scenario's registered scripted policy for their
            role (e.g. ``delegate.scripted_worker``).
        credit: credit assignment (or its method: ``credit="shapley"``).
        algorithm: algorithm and hyperparameters: one of :data:`ALGORITHMS` (or its name:
            ``algorithm="APPO"``).
        budget: when to stop.
        seed: experiment seed (also set ``PYTHONHASHSEED`` for bit-identical reruns; the CLI
            does).
        resources: processes, environments, GPUs.
        logging: wandb and progress display.
        output: run directory, checkpoints, plots, transcripts.
        episodes: the wall-clock limit per episode, and when failing episodes stop the run.
        rewards: reward sources composing the reward (:mod:`trainers.signals.rewards`; empty:
            the scenario's verifier reward as it is).
        curriculum: which tasks episodes play
        (:class:`~trainers.configs.curriculum.CurriculumConfig`).
        monitors: the reward-hacking and collapse monitors (:mod:`trainers.signals.monitors`).
    """

    scenario: str = "delegate"
    scenario_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    topology: str | dict[str, Any] | None = None
    sharing: str = "role"
    pools: dict[str, PoolConfig] = dataclasses.field(default_factory=dict)
    train: list[str] | None = None
    credit: CreditConfig = dataclasses.field(default_factory=CreditConfig)
    algorithm: AlgoConfig = dataclasses.field(default_factory=PPOAlgo)
    budget: BudgetConfig = dataclasses.field(default_factory=BudgetConfig)
    seed: int = 0
    resources: ResourcesConfig = dataclasses.field(default_factory=ResourcesConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    output: OutputConfig = dataclasses.field(default_factory=OutputConfig)
    episodes: EpisodesConfig = dataclasses.field(default_factory=EpisodesConfig)
    rewards: RewardsConfig = dataclasses.field(default_factory=RewardsConfig)
    curriculum: CurriculumConfig = dataclasses.field(default_factory=CurriculumConfig)
    monitors: MonitorsConfig = dataclasses.field(default_factory=MonitorsConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.scenario, str):
            _check_scenario_name(self.scenario)  # names the reference to use instead
        typed(self, "")

    # ----- validation ----------------------------------------------------------------------
    def check(self) -> ExperimentConfig:
        """Field-level validation (no scenario built); returns ``self``.

        Raises:
            ConfigError: the first bad field, named with the fix.
        """
        _check_scenario_name(self.scenario)
        if self.sharing not in SHARING:
            raise ConfigError(
                f"sharing={self.sharing!r} is unknown: use one of {', '.join(SHARING)}"
            )
        if self.train is not None and (
            isinstance(self.train, str) or not all(isinstance(t, str) for t in self.train)
        ):
            raise ConfigError(f"train must be a list of agent or pool ids, got {self.train!r}")
        if self.train is not None and not self.train:
            raise ConfigError("train is empty: list agent or pool ids, or null to train all")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be an integer ≥ 0, got {self.seed!r}")
        for part in (
            self.credit,
            self.algorithm,
            self.budget,
            self.resources,
            self.logging,
            self.output,
            self.episodes,
            self.rewards,
            self.curriculum,
            self.monitors,
        ):
            part.check()
        _check_async_runners(self)
        _check_rollouts(self)
        return self

    # ----- conversions ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A plain, YAML-safe dict (nested dataclasses become dicts)."""
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentConfig:
        """Build from :meth:`to_dict` output or hand-written YAML.

        Shorthands: ``algorithm: PPO`` and ``credit: shapley`` set just the name / method;
        a pool or a model given as a string is its model type (``worker: scripted`` is
        rejected without a policy, so ``worker: {model: {type: scripted, policy: ...}}``).

        Raises:
            ConfigError: an unknown key (the message lists the valid ones) or a wrong type.
        """
        return from_plain(cls, dict(data or {}), "config")

    def to_yaml(self, path: str | Path | None = None) -> str:
        """YAML text of :meth:`to_dict` (field order kept); also written to ``path`` if given."""
        return dump_yaml(self.to_dict(), path)

    @classmethod
    def from_yaml(cls, source: str | Path) -> ExperimentConfig:
        """Load from YAML text or a ``.yaml``/``.yml`` file path."""
        data = load_yaml_mapping(source, "config", "scenario: ..., ...")
        return cls.from_dict(data or {})

    def replace(self, **changes: Any) -> ExperimentConfig:
        """A copy with dotted-path changes, e.g. ``replace(**{"algorithm.lr": 1e-3})``.

        Changing a kind (``algorithm.name``, ``pools.<id>.model.type``) keeps the fields the
        new kind has and drops the old kind's others where they hold their default (or null);
        one set to anything else is an error naming it.
        """
        data = self.to_dict()
        for key, value in changes.items():
            set_path(data, key, value)

        def changed(prefix: str) -> set[str]:
            return {k[len(prefix) :].split(".")[0] for k in changes if k.startswith(prefix)}

        algo = data.get("algorithm")
        drop_default_fields(algo, self.algorithm, "name", ALGORITHMS, changed("algorithm."))
        for pid, pool in self.pools.items():
            new = data.get("pools", {}).get(pid)
            if isinstance(new, dict):
                model = changed(f"pools.{pid}.model.")
                drop_default_fields(new.get("model"), pool.model, "type", MODELS, model)
        return ExperimentConfig.from_dict(data)


def _check_scenario_name(value: Any) -> None:
    """``scenario`` is a non-empty name or a well-formed ``package.module:attr`` reference."""
    from scenarios.base import ScenarioError
    from scenarios.registry import REF_HELP, is_reference, parse_reference

    if isinstance(value, str) and value.strip():
        if is_reference(value):
            try:
                parse_reference(value)
            except ScenarioError as exc:
                raise ConfigError(f"scenario={value!r}: {exc}") from None
        return
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None) or getattr(type(value), "__qualname__", "")
    if not isinstance(value, type) and not callable(value):
        qualname = ""  # an instance: the module names its variable, not its class
    if module and module != "__main__" and qualname:
        fix = f"scenario='{module}:{qualname}'"
    elif module and module != "__main__":
        fix = f"scenario='{module}:<the variable holding it>'"
    else:
        fix = "a reference to a module that defines it (not __main__: Ray's workers import it)"
    raise ConfigError(
        f"scenario must be {REF_HELP}, got {type(value).__name__} {value!r:.60}: use {fix}"
    )
