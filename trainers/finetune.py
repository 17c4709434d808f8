"""Orchestrator fine-tuning jobs: a preset of :func:`trainers.run.loop.train` for an LLM
orchestrator.

A :class:`FinetuneJob` names the orchestrator model (``tiny`` or a saved HF directory), the
frozen subagent pool (scripted, HF models, vLLM servers), the scenario, the GRPO knobs and the
run settings every experiment has (:class:`~trainers.configs.experiment.BudgetConfig`,
:class:`~trainers.configs.experiment.ResourcesConfig`,
:class:`~trainers.configs.experiment.LoggingConfig`,
:class:`~trainers.configs.experiment.OutputConfig`). It round-trips through YAML exactly
(``FinetuneJob.from_yaml(job.to_yaml()) == job``), and :meth:`FinetuneJob.check` rejects every
bad field with a :class:`~trainers.configs.typed.ConfigError` that names the fix, before Ray starts.

A job is an experiment: :meth:`FinetuneJob.to_experiment` is the
:class:`~trainers.configs.experiment.ExperimentConfig` with one trained LLM pool ``orchestrator``,
algorithm GRPO, the subagents in ``scenario_kwargs`` and ``output.export_hf`` on.
:func:`run_finetune` trains it with :func:`trainers.run.loop.train` (the one training loop: budget,
progress, wandb, periodic and best checkpoints, resume) and adds to the run directory:

* ``job.yaml`` — the job, written before training starts (``config.yaml`` is its experiment);
* ``model/orchestrator/`` — the trained orchestrator in Hugging Face format, with its
  tokenizer (``AutoModelForCausalLM.from_pretrained`` or a vLLM server loads it); each periodic
  checkpoint holds the same under ``model/orchestrator/``;
* ``summary.json`` — :func:`trainers.run.loop.train`'s summary plus the fine-tuning statistics
  (``reward_first``: the first iteration's mean episode reward, sampled before any update;
  ``reward_last``: the mean of the last three iterations; ``iteration_s_mean``;
  ``logprob_gap_fresh_max``: the sampler/learner logprob agreement; ``model_dir``).

Example:
    >>> job = FinetuneJob(budget=BudgetConfig(iterations=2))
    >>> FinetuneJob.from_yaml(job.to_yaml()) == job
    True
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from marl_agents.pools import LLMModel, LoRAConfig, PoolConfig, PoolError
from trainers.configs.algorithms import GRPOAlgo
from trainers.configs.experiment import (
    BudgetConfig,
    ExperimentConfig,
    LoggingConfig,
    OutputConfig,
    ResourcesConfig,
)
from trainers.configs.grpo import AsyncSampling, GRPOLoss, GRPOSettings
from trainers.configs.typed import ConfigError, dump_yaml, from_plain, load_yaml_mapping, to_plain
from trainers.run.metrics import RETURN_KEY
from trainers.run.outcome import TrainResult

#: the RL agent a fine-tuning job trains.
ORCHESTRATOR = "orchestrator"


@dataclasses.dataclass
class OrchestratorConfig:
    """The model being fine-tuned.

    Attributes:
        model: ``"tiny"`` (the 378k-parameter model built in code) or a directory saved with
            ``save_pretrained`` (model and tokenizer).
        tiny_seed: weight-init seed of the tiny model.
        dtype: parameter dtype (``float32``, ``bfloat16``, ``float16``).
        temperature: sampling temperature while exploring (> 0: GRPO needs distinct samples).
        top_p: nucleus sampling while exploring.
        sampler: ``"transformers"`` or ``"vllm"`` (:attr:`~marl_agents.pools.LLMModel.sampler`).
        lora: train a LoRA adapter on ``model`` instead of the whole model
            (:class:`~marl_agents.pools.LoRAConfig`: ``r``, ``alpha``, ``dropout``,
            ``target_modules``, ``export_merged``); exported as a peft adapter directory.
        adapter: a peft adapter directory to start from
            (:attr:`~marl_agents.pools.LLMModel.adapter`).
    """

    model: str = "tiny"
    tiny_seed: int = 0
    dtype: str = "float32"
    temperature: float = 1.0
    top_p: float = 1.0
    sampler: Literal["transformers", "vllm"] = "transformers"
    lora: LoRAConfig | None = None
    adapter: str | None = None


@dataclasses.dataclass
class SubagentConfig:
    """One frozen subagent (or, alone in the list, all of them).

    Attributes:
        type: ``"scripted"``, ``"hf"`` (transformers, in the environment's process) or
            ``"vllm"`` (an OpenAI-compatible vLLM server).
        path: ``hf``: a saved model directory, or ``"tiny"``.
        seed: ``hf`` with ``path: tiny``: its weight seed.
        url: ``vllm``: the server's base URL (``http://host:8000``).
        model: ``vllm``: the served model name.
        tokenizer: ``vllm``: tokenizer directory or hub name (default: ``model``).
        max_new_tokens: the subagent's answer budget.
    """

    type: Literal["scripted", "hf", "vllm"] = "scripted"
    path: str | None = None
    seed: int = 0
    url: str | None = None
    model: str | None = None
    tokenizer: str | None = None
    max_new_tokens: int = 48

    def to_spec(self) -> dict[str, Any]:
        """The ``subagents`` spec of :mod:`scenarios.text_delegate`."""
        if self.type == "scripted":
            return {"type": "scripted"}
        if self.type == "hf":
            return {
                "type": "hf",
                "path": self.path,
                "seed": self.seed,
                "max_new_tokens": self.max_new_tokens,
            }
        return {
            "type": "vllm",
            "url": self.url,
            "model": self.model,
            "tokenizer": self.tokenizer,
            "max_new_tokens": self.max_new_tokens,
        }


@dataclasses.dataclass
class TrainingConfig:
    """Sampling and optimisation around the GRPO loss.

    Attributes:
        group_size: ``G`` rollouts per task (the GRPO group; ≥ 2). Sampled side by side as
            ``G`` vector sub-envs sharing one task-seed stream.
        groups_per_iteration: tasks per iteration: ``G · groups`` episodes per iteration.
        groups_in_flight: groups an env runner samples side by side, each step's decisions
            of all of them in one batched ``generate``; the default is every GRPO
            experiment's (:attr:`~trainers.configs.grpo.GRPOSettings.groups_in_flight`:
            ``None``, the runner's share of an iteration). It sets only how fast: the
            learner gets the same rows at every value (issue #44).
        lr: Adam learning rate.
        num_epochs: passes over each iteration's batch.
        minibatch_size: rows per gradient step (``None``: the whole batch).
        grad_clip: gradient-norm clip (``None``: off).
        async_sampling: overlap sampling with learning
            (:class:`~trainers.configs.grpo.AsyncSampling`; off; needs ``num_env_runners ≥ 1``).
    """

    # one place holds the measured GRPO settings: every default but grad_clip is GRPO's
    group_size: int = GRPOSettings.group_size
    groups_per_iteration: int = GRPOSettings.groups_per_iteration
    groups_in_flight: int | None = GRPOSettings.groups_in_flight
    lr: float = GRPOAlgo.lr
    num_epochs: int = GRPOAlgo.num_epochs
    minibatch_size: int | None = GRPOSettings.minibatch_size
    grad_clip: float | None = 1.0
    async_sampling: AsyncSampling = dataclasses.field(default_factory=AsyncSampling)


@dataclasses.dataclass
class FinetuneJob:
    """An orchestrator fine-tuning job (see the module doc).

    Attributes:
        orchestrator: the model being trained.
        subagents: the frozen subagent pool: one entry for every worker, or exactly one per
            worker of the topology.
        scenario: a text scenario: a registered name (``text-delegate``) or an import
            reference ``package.module:attr`` to your own (see
            :attr:`~trainers.configs.experiment.ExperimentConfig.scenario`).
        topology: its topology (``star:N``: ``N`` subagents).
        scenario_kwargs: more scenario arguments (``level``, ``max_new_tokens``, …);
            ``tokenizer`` and ``subagents`` are set from the fields above.
        grpo: the GRPO loss knobs (:class:`~trainers.configs.grpo.GRPOLoss`).
        training: group sampling and optimiser settings.
        budget: when to stop (default: 60 iterations).
        resources: learners, GPUs, env runners, CPUs (``num_envs_per_env_runner`` is replaced
            by ``training.group_size · groups_in_flight``, as for every GRPO experiment).
        logging: wandb and progress.
        output: the run directory (default name ``finetune__{scenario}__{seed}__{time}``; a
            reference ``pkg.mod:attr`` is written ``mod.attr``), checkpoints, plots,
            transcripts and ``export_hf`` (on: the trained orchestrator is saved in Hugging
            Face format).
        seed: seeds the task stream, RLlib and torch.
    """

    orchestrator: OrchestratorConfig = dataclasses.field(default_factory=OrchestratorConfig)
    subagents: list[SubagentConfig] = dataclasses.field(default_factory=lambda: [SubagentConfig()])
    scenario: str = "text-delegate"
    topology: str = "star:8"
    scenario_kwargs: dict[str, Any] = dataclasses.field(default_factory=lambda: {"level": "easy"})
    grpo: GRPOLoss = dataclasses.field(default_factory=GRPOLoss)
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    budget: BudgetConfig = dataclasses.field(default_factory=lambda: BudgetConfig(iterations=60))
    resources: ResourcesConfig = dataclasses.field(default_factory=ResourcesConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    output: OutputConfig = dataclasses.field(default_factory=lambda: OutputConfig(export_hf=True))
    seed: int = 0

    # ----- YAML --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A plain, YAML-safe dict."""
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> FinetuneJob:
        """Build from :meth:`to_dict` output or hand-written YAML.

        Shorthands: ``orchestrator: tiny`` (or a path) sets just the model; a subagent given
        as a string is its type (``subagents: [scripted]``); one mapping is a list of one.

        Raises:
            ConfigError: an unknown key (the message lists the valid ones) or a wrong type.
        """
        data = dict(data or {})
        if isinstance(data.get("orchestrator"), str):
            data["orchestrator"] = {"model": data["orchestrator"]}
        subs = data.get("subagents")
        if isinstance(subs, (str, dict)):
            subs = [subs]
        if isinstance(subs, list):
            data["subagents"] = [{"type": s} if isinstance(s, str) else s for s in subs]
        return from_plain(cls, data, "job")

    def to_yaml(self, path: str | Path | None = None) -> str:
        """YAML text (field order kept); also written to ``path`` if given."""
        return dump_yaml(self.to_dict(), path)

    @classmethod
    def from_yaml(cls, source: str | Path) -> FinetuneJob:
        """Load from YAML text or a ``.yaml`` / ``.yml`` file.

        Raises:
            ConfigError: a missing file, invalid YAML or a bad field.
        """
        return cls.from_dict(load_yaml_mapping(source, "job", "orchestrator: ..., subagents: ..."))

    # ----- the experiment ------------------------------------------------------------------
    @property
    def episodes_per_iteration(self) -> int:
        """``group_size · groups_per_iteration``."""
        return self.training.group_size * self.training.groups_per_iteration

    def scenario_args(self) -> dict[str, Any]:
        """The scenario keyword arguments: ``scenario_kwargs`` + tokenizer + subagents."""
        return {
            **self.scenario_kwargs,
            "tokenizer": self.orchestrator.model,
            "subagents": [s.to_spec() for s in self.subagents],
        }

    def orchestrator_model(self) -> LLMModel:
        """The orchestrator as an LLM pool's model (:class:`~marl_agents.pools.LLMModel`)."""
        o = self.orchestrator
        return LLMModel(
            path=o.model,
            tiny_seed=o.tiny_seed,
            dtype=o.dtype,
            temperature=o.temperature,
            top_p=o.top_p,
            sampler=o.sampler,
            lora=o.lora,
            adapter=o.adapter,
        )

    def to_experiment(self) -> ExperimentConfig:
        """The job as an :class:`~trainers.configs.experiment.ExperimentConfig`: the orchestrator
        is the one
        trained LLM pool, the algorithm is GRPO, the subagents are ``scenario_kwargs``; the
        budget, resources, logging and output are the job's own.

        The job's own fields are checked here; the experiment's (scenario, subagent specs,
        budget, resources, …) by :func:`trainers.plan.resolve` (see :meth:`check`).

        Raises:
            ConfigError: a bad orchestrator, subagent list, training or GRPO field.
        """
        self._check_orchestrator()
        if not self.subagents:
            raise ConfigError("subagents is empty: give one spec for all workers, e.g. [scripted]")
        self._check_training()
        t = self.training
        try:
            grpo = GRPOSettings(
                group_size=t.group_size,
                groups_per_iteration=t.groups_per_iteration,
                groups_in_flight=t.groups_in_flight,
                minibatch_size=t.minibatch_size,
                async_sampling=dataclasses.replace(t.async_sampling),
                **dataclasses.asdict(self.grpo),
            )
        except ValueError as exc:
            raise ConfigError(f"grpo: {exc}") from exc
        return ExperimentConfig(
            scenario=self.scenario,
            scenario_kwargs=self.scenario_args(),
            topology=self.topology,
            pools={
                ORCHESTRATOR: PoolConfig(agents=[ORCHESTRATOR], model=self.orchestrator_model())
            },
            train=[ORCHESTRATOR],
            algorithm=GRPOAlgo(lr=t.lr, num_epochs=t.num_epochs, grad_clip=t.grad_clip, grpo=grpo),
            budget=dataclasses.replace(self.budget),
            seed=self.seed,
            resources=dataclasses.replace(self.resources),
            logging=dataclasses.replace(self.logging),
            output=dataclasses.replace(self.output),
        )

    # ----- checks ------------------------------------------------------------------------
    def check(self) -> FinetuneJob:
        """Validate every field (the scenario is built; nothing of Ray starts); returns ``self``.

        Raises:
            ConfigError: the first problem, naming the field and the fix.
        """
        self.plan()
        return self

    def plan(self) -> Any:
        """Check the job (see :meth:`check`) and return its resolved :class:`~trainers.plan.Plan`.

        Raises:
            ConfigError: the first problem, naming the field and the fix.
        """
        from trainers.plan import resolve

        return resolve(self.to_experiment())

    def _check_orchestrator(self) -> None:
        try:
            self.orchestrator_model().check("orchestrator", trained=True)
        except PoolError as exc:
            raise ConfigError(str(exc)) from exc
        for key in ("tokenizer", "subagents"):
            if key in self.scenario_kwargs:
                raise ConfigError(
                    f"scenario_kwargs.{key} is set by the job: remove it and set "
                    + ("orchestrator.model" if key == "tokenizer" else "subagents")
                )

    def _check_training(self) -> None:
        t = self.training
        group = GRPOSettings(
            group_size=t.group_size,
            groups_per_iteration=t.groups_per_iteration,
            groups_in_flight=t.groups_in_flight,
            minibatch_size=t.minibatch_size,
        )
        group.check("training")
        if not (t.lr > 0 and math.isfinite(t.lr)):
            raise ConfigError(f"training.lr must be a positive number, got {t.lr}")
        if t.num_epochs < 1:
            raise ConfigError("training.num_epochs must be ≥ 1")
        if t.grad_clip is not None and not t.grad_clip > 0:
            raise ConfigError("training.grad_clip must be > 0 or null")


# ----- running ------------------------------------------------------------------------------
@dataclasses.dataclass
class FinetuneResult(TrainResult):
    """:func:`trainers.run.loop.train`'s result of a job, with the job's summary.

    Attributes:
        summary: the content of ``summary.json`` (train()'s summary and the fine-tuning
            statistics of the module doc).
    """

    summary: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def model_dir(self) -> Path | None:
        """The trained orchestrator in Hugging Face format (``None``: ``export_hf`` off)."""
        return self.models.get(ORCHESTRATOR)


def run_finetune(
    job: FinetuneJob | None = None,
    *,
    resume: str | Path | None = None,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> FinetuneResult:
    """Train ``job`` with :func:`trainers.run.loop.train` (see the module doc for the outputs).

    Args:
        job: the job (``None`` with ``resume``: the run's own ``job.yaml``).
        resume: a fine-tuning run directory (or a checkpoint in one) to continue, as
            ``train(resume=...)`` does; the budget counts from the run's first iteration.
        report: called with each iteration's metrics.

    Returns:
        A :class:`FinetuneResult`.

    Raises:
        ConfigError: a bad job, before Ray starts.
    """
    from trainers.run.display import progress_console
    from trainers.run.loop import train
    from trainers.run.rundir import find_checkpoint, fresh_dir

    if resume is not None:
        run = find_checkpoint(resume)[1]
        job = job or FinetuneJob.from_yaml(run / "job.yaml")
    if job is None:
        raise ConfigError("run_finetune() needs a job (or resume=<run dir>)")
    job.check()  # before a run directory exists
    if resume is None:
        run = fresh_dir(job.output.dir, job.output.name or default_name(job))
    job.to_yaml(run / "job.yaml")  # on resume: the budget may have grown
    result = train(job.to_experiment(), resume=resume, report=report, run_dir=run)
    summary = {**json.loads((run / "summary.json").read_text()), **statistics(job, result)}
    (run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console = progress_console(job)
    if console is not None:
        _print_summary(console, summary)
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(TrainResult)}
    return FinetuneResult(**fields, summary=summary)


def default_name(job: FinetuneJob) -> str:
    """``finetune__{scenario}__{seed}__{time}``."""
    from scenarios.registry import label

    return f"finetune__{label(job.scenario)}__{job.seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return float(sum(values) / len(values)) if values else None


def statistics(job: FinetuneJob, result: TrainResult) -> dict[str, Any]:
    """The fine-tuning statistics a job adds to ``summary.json`` (see the module doc)."""
    history = result.history
    k = max(1, min(3, len(history) // 3)) if history else 0
    gap = f"losses/{ORCHESTRATOR}/grpo/logprob_gap_fresh"
    gaps = [h[gap] for h in history if gap in h]
    model_dir = result.models.get(ORCHESTRATOR)
    return {
        "episodes": len(history) * job.episodes_per_iteration,
        "iteration_s_mean": _mean(history, "charts/iteration_s"),
        "reward_first": _mean(history[:1], RETURN_KEY),  # the initial policy's episodes
        "reward_last": _mean(history[-k:], RETURN_KEY) if k else None,
        "reward_best": max((h[RETURN_KEY] for h in history if RETURN_KEY in h), default=None),
        "oracle": _mean(history, "charts/oracle"),
        "format_ok_first": _mean(history[:1], "charts/format_ok"),
        "format_ok_last": _mean(history[-k:], "charts/format_ok") if k else None,
        "logprob_gap_fresh_max": max(gaps) if gaps else None,
        "window": k,
        "model_dir": str(model_dir) if model_dir else None,
        "run_dir": str(result.run_dir),
    }


def _print_summary(console: Any, summary: dict[str, Any]) -> None:
    """The fine-tuning statistics (train() has printed the run summary above it)."""
    from rich.table import Table

    table = Table(title="finetune summary", show_header=False)
    for key in (
        "episodes",
        "iteration_s_mean",
        "reward_first",
        "reward_last",
        "oracle",
        "format_ok_first",
        "format_ok_last",
        "logprob_gap_fresh_max",
        "model_dir",
    ):
        value = summary.get(key)
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        table.add_row(key, text)
    console.print(table)
