"""Orchestrator fine-tuning jobs: an LLM orchestrator trained with token-level GRPO on RLlib.

A :class:`FinetuneJob` names the orchestrator model (``tiny`` or a saved HF directory), the
frozen subagent pool (scripted, HF models, vLLM servers), the scenario, the GRPO knobs, the
budget, the resources, the output directory and wandb. It round-trips through YAML exactly
(``FinetuneJob.from_yaml(job.to_yaml()) == job``) and :meth:`FinetuneJob.check` rejects every
bad field with a :class:`~trainers.config.ConfigError` that names the fix, before Ray starts.

:func:`run_finetune` builds the RLlib algorithm (:class:`~trainers.grpo_learner.GRPO`: the
orchestrator is a :class:`~marl_agents.llm.rl_module.CausalLMModule` in ``policies_to_train``,
the subagents run frozen inside the environment), trains to the budget with a progress bar and
writes a run directory. The algorithm is built by the one conversion of experiments,
:func:`trainers.algo.to_algorithm_config`, from :meth:`FinetuneJob.to_experiment`: a job is an
:class:`~trainers.config.ExperimentConfig` with one LLM pool and algorithm GRPO, so the same
training can also run through :func:`trainers.train` and :func:`trainers.sweep`. The run
directory:

* ``job.yaml`` — the job, written first;
* ``metrics.jsonl`` — one line per iteration (``charts/…`` from the episodes, e.g.
  ``charts/team_return``, ``charts/format_ok``, ``charts/oracle_fraction``;
  ``losses/orchestrator/grpo/…`` from the learner, e.g. ``logprob_gap_fresh``);
* ``model/`` — the trained orchestrator in Hugging Face format (``save_pretrained``, with its
  tokenizer): ``AutoModelForCausalLM.from_pretrained(run / "model")`` or a vLLM server loads it;
* ``checkpoint/`` — the RLlib algorithm checkpoint (``Algorithm.from_checkpoint``);
* ``summary.json`` (status; ``reward_first``: the first iteration's mean episode reward, sampled
  before any update; ``reward_last``: the mean of the last three iterations; time per
  iteration; ``logprob_gap_fresh_max``: the logprob agreement; paths),
  ``curve.png`` and ``wandb/`` (offline by default).

Example:
    >>> job = FinetuneJob(budget=FinetuneBudget(iterations=2))
    >>> FinetuneJob.from_yaml(job.to_yaml()) == job
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from marl_agents.pools import ModelConfig, PoolConfig, PoolError
from trainers.config import (
    AlgoConfig,
    BudgetConfig,
    ConfigError,
    ExperimentConfig,
    GRPOConfig,
    GRPOSettings,
    LoggingConfig,
    OutputConfig,
    ResourcesConfig,
    dump_yaml,
    from_plain,
    load_yaml_mapping,
    to_plain,
)

log = logging.getLogger(__name__)

SUBAGENT_TYPES: tuple[str, ...] = ("scripted", "hf", "vllm")
WANDB_MODES: tuple[str, ...] = ("offline", "online", "disabled")
#: the RL agent a fine-tuning job trains.
ORCHESTRATOR = "orchestrator"
RETURN_KEY = "charts/team_return"


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
    """

    model: str = "tiny"
    tiny_seed: int = 0
    dtype: str = "float32"
    temperature: float = 1.0
    top_p: float = 1.0


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
        lr: Adam learning rate.
        num_epochs: passes over each iteration's batch.
        minibatch_size: rows per gradient step (``None``: the whole batch).
        grad_clip: gradient-norm clip (``None``: off).
    """

    group_size: int = 8
    groups_per_iteration: int = 8
    lr: float = 3e-4
    num_epochs: int = 1
    minibatch_size: int | None = None
    grad_clip: float | None = 1.0


@dataclasses.dataclass
class FinetuneBudget:
    """When the job stops (the first limit reached).

    Attributes:
        iterations: training iterations.
        time_s: wall-clock seconds of training (checked after each iteration).
    """

    iterations: int | None = 60
    time_s: float | None = None


@dataclasses.dataclass
class FinetuneResources:
    """Where the work runs. Everything runs on CPU by default.

    Attributes:
        num_learners: remote learner processes (0: learn in the driver).
        num_gpus_per_learner: GPUs per learner (needs ``num_learners ≥ 1`` and GPUs).
        num_env_runners: remote env-runner processes (0: sample in the driver).
        num_cpus: CPUs for the local Ray (``None``: all of this machine's).
    """

    num_learners: int = 0
    num_gpus_per_learner: float = 0.0
    num_env_runners: int = 0
    num_cpus: int | None = None


@dataclasses.dataclass
class FinetuneLogging:
    """Tracking.

    Attributes:
        wandb: ``"offline"`` (default), ``"online"`` or ``"disabled"``.
        project: wandb project.
        progress: show a progress bar and a summary.
    """

    wandb: str = "offline"
    project: str = "marl-orchestra"
    progress: bool = True


@dataclasses.dataclass
class FinetuneJob:
    """An orchestrator fine-tuning job (see the module doc).

    Attributes:
        orchestrator: the model being trained.
        subagents: the frozen subagent pool: one entry for every worker, or exactly one per
            worker of the topology.
        scenario: a text scenario: a registered name (``text-delegate``) or an import
            reference ``package.module:attr`` to your own (see
            :attr:`~trainers.config.ExperimentConfig.scenario`).
        topology: its topology (``star:N``: ``N`` subagents).
        scenario_kwargs: more scenario arguments (``level``, ``max_new_tokens``, …);
            ``tokenizer`` and ``subagents`` are set from the fields above.
        grpo: the GRPO loss knobs (:class:`~trainers.grpo.GRPOConfig`).
        training: group sampling and optimiser settings.
        budget: when to stop.
        resources: learners, GPUs, env runners, CPUs.
        logging: wandb and progress.
        output_dir: parent of the run directory.
        name: run directory name (default ``finetune__{scenario}__{seed}__{time}``; a
            reference ``pkg.mod:attr`` is written ``mod.attr``).
        seed: seeds the task stream, RLlib and torch.
        save_checkpoint: also save the RLlib algorithm checkpoint.
    """

    orchestrator: OrchestratorConfig = dataclasses.field(default_factory=OrchestratorConfig)
    subagents: list[SubagentConfig] = dataclasses.field(default_factory=lambda: [SubagentConfig()])
    scenario: str = "text-delegate"
    topology: str = "star:8"
    scenario_kwargs: dict[str, Any] = dataclasses.field(default_factory=lambda: {"level": "easy"})
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    budget: FinetuneBudget = dataclasses.field(default_factory=FinetuneBudget)
    resources: FinetuneResources = dataclasses.field(default_factory=FinetuneResources)
    logging: FinetuneLogging = dataclasses.field(default_factory=FinetuneLogging)
    output_dir: str = "runs"
    name: str | None = None
    seed: int = 0
    save_checkpoint: bool = True

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

    # ----- checks ------------------------------------------------------------------------
    @property
    def episodes_per_iteration(self) -> int:
        """``group_size · groups_per_iteration``."""
        return self.training.group_size * self.training.groups_per_iteration

    def scenario_args(self) -> dict[str, Any]:
        """The scenario keyword arguments: ``scenario_kwargs`` + tokenizer + subagents."""
        tokenizer = self.orchestrator.model
        return {
            **self.scenario_kwargs,
            "tokenizer": tokenizer,
            "subagents": [s.to_spec() for s in self.subagents],
        }

    def orchestrator_model(self) -> ModelConfig:
        """The orchestrator as an LLM pool's model (:class:`~marl_agents.pools.ModelConfig`)."""
        o = self.orchestrator
        return ModelConfig(
            type="llm",
            path=o.model,
            tiny_seed=o.tiny_seed,
            dtype=o.dtype,
            temperature=o.temperature,
            top_p=o.top_p,
        )

    def to_experiment(self) -> ExperimentConfig:
        """The job as an :class:`~trainers.config.ExperimentConfig`: the orchestrator is the one
        trained LLM pool, the algorithm is GRPO, the subagents are ``scenario_kwargs``.

        :func:`algorithm_config` converts this with :func:`trainers.algo.to_algorithm_config`,
        so a job and the equivalent experiment build the same RLlib algorithm.

        Raises:
            ValueError: a GRPO knob the loss rejects (:meth:`check` names it).
        """
        t, b, r, lg = self.training, self.budget, self.resources, self.logging
        return ExperimentConfig(
            scenario=self.scenario,
            scenario_kwargs=self.scenario_args(),
            topology=self.topology,
            pools={
                ORCHESTRATOR: PoolConfig(agents=[ORCHESTRATOR], model=self.orchestrator_model())
            },
            train=[ORCHESTRATOR],
            algorithm=AlgoConfig(
                name="GRPO",
                lr=t.lr,
                num_epochs=t.num_epochs,
                grad_clip=t.grad_clip,
                grpo=GRPOSettings(
                    group_size=t.group_size,
                    groups_per_iteration=t.groups_per_iteration,
                    minibatch_size=t.minibatch_size,
                    **dataclasses.asdict(self.grpo),
                ),
            ),
            budget=BudgetConfig(iterations=b.iterations, time_s=b.time_s),
            seed=self.seed,
            resources=ResourcesConfig(
                num_env_runners=r.num_env_runners,
                num_envs_per_env_runner=t.group_size,
                num_learners=r.num_learners,
                num_gpus_per_learner=r.num_gpus_per_learner,
                num_cpus=r.num_cpus,
            ),
            logging=LoggingConfig(wandb=lg.wandb, project=lg.project, progress=lg.progress),
            output=OutputConfig(dir=self.output_dir, name=self.name, checkpoint_every=0),
        )

    def check(self) -> FinetuneJob:
        """Validate every field (the scenario is built; nothing of Ray starts); returns ``self``.

        The job's own fields are checked here (errors name them); the rest — scenario,
        subagent specs, budget, resources, logging, seed — by
        :func:`trainers.algo.resolve` on :meth:`to_experiment`.

        Raises:
            ConfigError: the first problem, naming the field and the fix.
        """
        self.plan()
        return self

    def plan(self) -> Any:
        """Check the job (see :meth:`check`) and return its resolved :class:`~trainers.algo.Plan`.

        Raises:
            ConfigError: the first problem, naming the field and the fix.
        """
        from trainers.algo import resolve

        self._check_orchestrator()
        self._check_subagents()
        self._check_training()
        try:
            experiment = self.to_experiment()
        except ValueError as exc:
            raise ConfigError(f"grpo: {exc}") from None
        return resolve(experiment)

    def _check_orchestrator(self) -> None:
        try:
            self.orchestrator_model().check("orchestrator", trained=True)
        except PoolError as exc:
            raise ConfigError(str(exc)) from None
        for key in ("tokenizer", "subagents"):
            if key in self.scenario_kwargs:
                raise ConfigError(
                    f"scenario_kwargs.{key} is set by the job: remove it and set "
                    + ("orchestrator.model" if key == "tokenizer" else "subagents")
                )

    def _check_subagents(self) -> None:
        # types here (the YAML loader checks them too); paths, urls, keys and counts are the
        # scenario's checks, run by resolve()
        if not self.subagents:
            raise ConfigError("subagents is empty: give one spec for all workers, e.g. [scripted]")
        for i, s in enumerate(self.subagents):
            if s.type not in SUBAGENT_TYPES:
                raise ConfigError(
                    f"subagents[{i}].type={s.type!r}: use one of {', '.join(SUBAGENT_TYPES)}"
                )

    def _check_training(self) -> None:
        t = self.training
        group = GRPOSettings(
            group_size=t.group_size,
            groups_per_iteration=t.groups_per_iteration,
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
class FinetuneResult:
    """What :func:`run_finetune` produced.

    Attributes:
        run_dir: the run directory.
        history: one metrics dict per iteration.
        model_dir: the trained orchestrator in Hugging Face format.
        checkpoint: the RLlib checkpoint (``None`` when not saved).
        summary: the content of ``summary.json``.
    """

    run_dir: Path
    history: list[dict[str, Any]]
    model_dir: Path | None
    checkpoint: Path | None
    summary: dict[str, Any]


def algorithm_config(job: FinetuneJob, plan: Any = None) -> Any:
    """The validated :class:`~trainers.grpo_learner.GRPOAlgorithmConfig` of ``job``.

    It is :func:`trainers.algo.to_algorithm_config` of :meth:`FinetuneJob.to_experiment`
    (``plan``: the job's :meth:`FinetuneJob.plan`, when already computed).
    """
    from trainers.algo import to_algorithm_config

    plan = plan or job.plan()
    return to_algorithm_config(plan.cfg, plan)


def run_finetune(
    job: FinetuneJob, *, report: Callable[[dict[str, Any]], None] | None = None
) -> FinetuneResult:
    """Run ``job`` to its budget on Ray via RLlib (see the module doc for the outputs).

    Args:
        job: the job.
        report: called with each iteration's metrics.

    Returns:
        A :class:`FinetuneResult`.

    Raises:
        ConfigError: a bad job, before Ray starts.
    """
    from scenarios.registry import label
    from trainers.run import (
        ensure_ray,
        flatten_result,
        fresh_dir,
        plot_curve,
        progress_bar,
        progress_console,
        quiet_ray_logs,
        setup_process,
    )

    plan = job.plan()
    quiet_ray_logs()
    config = algorithm_config(job, plan)
    setup_process()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = job.name or f"finetune__{label(job.scenario)}__{job.seed}__{stamp}"
    run = fresh_dir(job.output_dir, name)
    job.to_yaml(run / "job.yaml")
    started_ray = ensure_ray(job)
    console = progress_console(job)
    wb = _wandb_init(job, run)
    history: list[dict[str, Any]] = []
    status = "completed"
    model_dir: Path | None = None
    checkpoint: Path | None = None
    algo = None
    t0 = time.monotonic()
    try:
        algo = config.build_algo()
        build_s = time.monotonic() - t0
        with (
            (run / "metrics.jsonl").open("a") as out,
            progress_bar(console, "finetune", _row_info) as advance,
        ):
            it = 0
            while not _done(job, it, t0 + build_s):
                result = algo.train()
                it = int(result.get("training_iteration", it + 1))
                row = flatten_result(result, {ORCHESTRATOR: ORCHESTRATOR}, set())
                history.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
                if wb is not None:
                    wb.log(row, step=it)
                if report is not None:
                    report(row)
                advance(_fraction(job, it, t0 + build_s), row)
        model_dir = run / "model"
        _save_model(algo, model_dir)
        if job.save_checkpoint:
            checkpoint = Path(algo.save_to_path(str(run / "checkpoint")))
    except Exception as exc:
        status = f"failed: {type(exc).__name__}: {exc}"
        raise
    finally:
        summary = _summary(job, run, history, status, model_dir, checkpoint, time.monotonic() - t0)
        (run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        with contextlib.suppress(Exception):
            summary["curve"] = str(plot_curve(history, run / "curve.png", title=run.name) or "")
            (run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if wb is not None:
            with contextlib.suppress(Exception):
                wb.summary.update({k: v for k, v in summary.items() if not isinstance(v, dict)})
                wb.finish()
        if algo is not None:
            with contextlib.suppress(Exception):
                algo.stop()
        if started_ray:
            import ray

            ray.shutdown()
    if console is not None:
        _print_summary(console, summary)
    return FinetuneResult(run, history, model_dir, checkpoint, summary)


def _save_model(algo: Any, path: Path) -> None:
    """Save the learner's current orchestrator weights as a Hugging Face directory."""
    algo.env_runner_group.sync_weights(
        from_worker_or_learner_group=algo.learner_group, policies=[ORCHESTRATOR]
    )
    algo.get_module(ORCHESTRATOR).save_pretrained(str(path))


def _done(job: FinetuneJob, iteration: int, start: float) -> bool:
    b = job.budget
    return (b.iterations is not None and iteration >= b.iterations) or (
        b.time_s is not None and time.monotonic() - start >= b.time_s
    )


def _fraction(job: FinetuneJob, iteration: int, start: float) -> float:
    b = job.budget
    parts = []
    if b.iterations:
        parts.append(iteration / b.iterations)
    if b.time_s:
        parts.append((time.monotonic() - start) / b.time_s)
    return min(1.0, max(parts)) if parts else 0.0


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return float(sum(values) / len(values)) if values else None


def _summary(
    job: FinetuneJob,
    run: Path,
    history: list[dict[str, Any]],
    status: str,
    model_dir: Path | None,
    checkpoint: Path | None,
    total_s: float,
) -> dict[str, Any]:
    k = max(1, min(3, len(history) // 3)) if history else 0
    times = [h["charts/iteration_s"] for h in history if "charts/iteration_s" in h]
    gaps = [
        h[f"losses/{ORCHESTRATOR}/grpo/logprob_gap_fresh"]
        for h in history
        if f"losses/{ORCHESTRATOR}/grpo/logprob_gap_fresh" in h
    ]
    return {
        "status": status,
        "iterations": len(history),
        "episodes": len(history) * job.episodes_per_iteration,
        "time_s": round(total_s, 2),
        "iteration_s_mean": float(sum(times) / len(times)) if times else None,
        "reward_first": _mean(history[:1], RETURN_KEY),  # the initial policy's episodes
        "reward_last": _mean(history[-k:], RETURN_KEY) if k else None,
        "reward_best": max((h[RETURN_KEY] for h in history if RETURN_KEY in h), default=None),
        "oracle": _mean(history, "charts/oracle"),
        "format_ok_first": _mean(history[:1], "charts/format_ok"),
        "format_ok_last": _mean(history[-k:], "charts/format_ok") if k else None,
        "logprob_gap_fresh_max": max(gaps) if gaps else None,
        "window": k,
        "model_dir": str(model_dir) if model_dir else None,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "run_dir": str(run),
    }


# ----- process, run dir, wandb, display -------------------------------------------------------
def _wandb_init(job: FinetuneJob, run: Path) -> Any:
    mode = job.logging.wandb
    if mode == "disabled" or os.environ.get("WANDB_MODE") == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        import wandb

        return wandb.init(
            project=job.logging.project,
            name=run.name,
            dir=str(run),
            config=job.to_dict(),
            mode=mode,
            reinit="finish_previous",
        )
    except Exception as exc:  # tracking must never kill a run
        log.warning("wandb disabled for this run: %s", exc)
        return None


def _row_info(row: Mapping[str, Any]) -> str:
    parts = [f"it {row.get('charts/iteration', 0)}"]
    if RETURN_KEY in row:
        parts.append(f"reward {row[RETURN_KEY]:+.3f}")
    if "charts/format_ok" in row:
        parts.append(f"format ok {100 * row['charts/format_ok']:.0f}%")
    parts.append(f"{row.get('charts/iteration_s', 0):.1f} s/it")
    return " · ".join(parts)


def _print_summary(console: Any, summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="finetune summary", show_header=False)
    for key in (
        "status",
        "iterations",
        "episodes",
        "time_s",
        "iteration_s_mean",
        "reward_first",
        "reward_last",
        "oracle",
        "format_ok_first",
        "format_ok_last",
        "logprob_gap_fresh_max",
        "model_dir",
        "run_dir",
    ):
        value = summary.get(key)
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        table.add_row(key, text)
    console.print(table)
