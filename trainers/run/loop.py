"""``train(cfg)``: run an experiment to its budget, with metrics, checkpoints, plots and resume.

A run directory (``runs/{scenario}__{algo}__{seed}__{time}`` by default) holds, written in this
order so that a crash loses nothing already done:

* ``config.yaml`` — the experiment, written before anything runs;
* ``metrics.jsonl`` — one line per iteration, namespaced keys (``charts/…``,
  ``losses/<pool>/…``, ``<agent>/…``), flushed and fsynced every iteration;
* ``checkpoints/iter_NNNNNN`` — every ``output.checkpoint_every`` iterations (the latest and
  the best are kept), ``checkpoint`` — the final state; each written after its iteration's
  metrics line (a checkpoint never runs ahead of ``metrics.jsonl``), atomically (as
  ``*.partial``, then renamed), with the sampling state of :mod:`trainers.run.resume`;

* ``transcripts/iter_NNNNNN.{jsonl,md}`` — ``output.transcripts`` episodes of every
  iteration, readable (:mod:`trainers.run.transcripts`);
* ``model/<pool>`` — with ``output.export_hf``, each trained LLM pool in Hugging Face format
  at the end (and ``<checkpoint>/model/<pool>`` in each periodic checkpoint;
  :mod:`trainers.run.export`);
* ``summary.json`` (status, best/final checkpoints, totals, the distinct errors of failed
  episodes; ``discovered_agents``, agent id → model name, where the scenario found its agents
  on a dry run), ``curve.png``, ``wandb/``.

**Failures.** Episodes that end in a node error, the wall-clock limit
(``episodes.timeout_s``) or the step limit (the scenario's ``max_supersteps``) are truncated and
counted (``charts/truncated``, and ``charts/error_rate``, ``charts/timeout_rate``,
``charts/limit_rate``); an iteration whose every episode hit the step limit logs a warning
naming ``max_supersteps``; each distinct error text is logged once (Python logging) and listed
in ``summary.json``. When every finished episode failed in ``episodes.fail_after`` consecutive
iterations (default 1) the run stops with :class:`RunFailed` naming the first error; a graph
that cannot run at all fails at ``reset()`` and stops the run with that error.

**Faults.** A dead env runner is restarted by RLlib (``trainers.algo.FAULT_TOLERANCE``); the
iterations meanwhile sample nothing and still get their metrics line (missing or NaN counters
read as 0). The first Ctrl-C stops the run after the running iteration, with a checkpoint of
it; a second stops it at once, without one. An output directory that cannot be written is a
:class:`~trainers.configs.typed.ConfigError` before Ray starts; a disk that fills during the run
stops
it with :class:`OutputError` (one line), ``summary.json`` written when there is room.

``train(cfg, resume=<run dir or checkpoint>)`` restores the newest checkpoint (same weights,
iteration counter, sampling state and wall clock), drops metrics lines after it and continues
in the same run directory until the budget (counted from the first iteration) is reached, as
if never interrupted (not with remote learners: see docs/internals.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainers.cluster import ensure_ray
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError
from trainers.run.display import (
    plain_line,
    plot_curve,
    print_plan,
    print_summary,
    progress_bar,
    progress_console,
    wandb_init,
)
from trainers.run.episode_log import EpisodeLog
from trainers.run.export import export_pools, save_hf
from trainers.run.metrics import flatten_result
from trainers.run.outcome import (
    RunFailed,
    TrainResult,
    append_row,
    describe_error,
    interrupt_between_iterations,
    logged_os_error,
    output_error,
)
from trainers.run.process import quiet_ray_logs, setup_process
from trainers.run.rundir import (
    Checkpoints,
    find_checkpoint,
    load_history,
    open_run_dir,
    restore_algorithm,
    rewrite_history,
    save_checkpoint,
    write_summary,
)
from trainers.signals.curriculum import Curriculum
from trainers.signals.headline import finish_row
from trainers.signals.monitors import Alarm, Monitors, strongest

log = logging.getLogger(__name__)


class _Budget:
    def __init__(self, cfg: ExperimentConfig, start_time_s: float) -> None:
        self.b = cfg.budget
        self.start = time.monotonic() - start_time_s

    def done(self, iteration: int, env_steps: int) -> bool:
        b = self.b
        return (
            (b.iterations is not None and iteration >= b.iterations)
            or (b.env_steps is not None and env_steps >= b.env_steps)
            or (b.time_s is not None and time.monotonic() - self.start >= b.time_s)
        )

    def fraction(self, iteration: int, env_steps: int) -> float:
        parts = []
        if self.b.iterations:
            parts.append(iteration / self.b.iterations)
        if self.b.env_steps:
            parts.append(env_steps / self.b.env_steps)
        if self.b.time_s:
            parts.append((time.monotonic() - self.start) / self.b.time_s)
        return min(1.0, max(parts)) if parts else 0.0


def train(
    cfg: ExperimentConfig | None = None,
    *,
    resume: str | Path | None = None,
    report: Callable[[dict[str, Any]], None] | None = None,
    run_dir: str | Path | None = None,
) -> TrainResult:
    """Train ``cfg`` to its budget; see the module docstring for what the run directory holds.

    Args:
        cfg: the experiment (``None`` with ``resume``: the run's own ``config.yaml``).
        resume: a run directory or checkpoint to continue from (same weights and iteration
            counter; metrics of iterations after the checkpoint are dropped and redone).
        report: called with each iteration's metrics (Ray Tune uses this).
        run_dir: use this directory instead of a new ``runs/…`` one.

    Returns:
        A :class:`TrainResult`.

    Raises:
        ConfigError: a bad config, before Ray starts.
    """
    from trainers.algo import to_algorithm_config
    from trainers.plan import resolve

    cfg, ckpt, run_dir = _resume_target(cfg, resume, run_dir)
    quiet_ray_logs()
    # a chat app trains as it is (LLM pools, GRPO); its prompts' budget is tried first
    plan = resolve(cfg, text_defaults=True, check_prompts=True)
    cfg = plan.cfg
    algo_config = to_algorithm_config(cfg, plan)
    exports = export_pools(cfg, plan)  # every config error is raised by now
    setup_process(hash_seed_matters=not plan.batched)
    run = open_run_dir(cfg, run_dir)  # ConfigError for an unwritable output, before Ray
    started_ray = ensure_ray(cfg)
    console = progress_console(cfg)
    session = _Session(cfg, plan, run, exports, report, resumed=ckpt is not None)
    status = "completed"
    failure: BaseException | None = None
    try:
        session.start(algo_config, ckpt)
        if console is not None:
            print_plan(console, plan, run)
        session.loop(console)
        session.finish()
        status = session.stopped or status
    except BaseException as exc:
        unwritable = output_error(exc, run)  # a full disk: one line, not the OSError's chain
        failure = unwritable or exc
        status = f"failed: {describe_error(failure)}"
        if not isinstance(exc, RunFailed):  # resuming a run whose episodes all fail won't help
            exc.add_note(f"run directory: {run} (continue with: marl run --resume {run})")
        if unwritable is not None:
            raise unwritable from None
        session.save_after_failure(exc)
        raise
    finally:
        result = session.close(status, failure)
        if started_ray:
            import ray

            ray.shutdown()
    if console is not None:
        print_summary(console, result)
    return result


def _resume_target(
    cfg: ExperimentConfig | None, resume: str | Path | None, run_dir: str | Path | None
) -> tuple[ExperimentConfig, Path | None, str | Path | None]:
    """``(config, checkpoint to restore or None, run directory or None)`` of a train() call."""
    ckpt = None
    if resume is not None:
        ckpt, resume_dir = find_checkpoint(resume)
        if cfg is None:
            cfg = ExperimentConfig.from_yaml(resume_dir / "config.yaml")
        run_dir = run_dir or resume_dir
    if cfg is None:
        raise ConfigError("train() needs a config (or resume=<run dir>)")
    return cfg, ckpt, run_dir


class _Session:
    """One train() run after its config is checked: the algorithm, its history, checkpoints,
    episode log, wandb and Hugging Face exports, each step a method in the order train()
    calls them."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        plan: Any,
        run: Path,
        exports: list[str],
        report: Callable[[dict[str, Any]], None] | None,
        resumed: bool,
    ) -> None:
        self.cfg, self.plan, self.run, self.exports, self.report = cfg, plan, run, exports, report
        self.resumed = resumed
        self.history = load_history(run / "metrics.jsonl")
        self.tracker = Checkpoints(run)
        self.episodes = EpisodeLog(cfg, plan, run, resumed=resumed)
        self.algo: Any = None
        self.curriculum: Curriculum | None = None
        self.wb: Any = None
        self.final_ckpt: Path | None = None
        self.models: dict[str, Path] = {}
        self.in_iteration = False  # True while the algorithm is ahead of metrics.jsonl
        self.monitors = Monitors(cfg.monitors)
        self.stopped: str | None = None  # the status of a run a monitor stopped
        if resumed and (run / "summary.json").exists():
            alarms = json.loads((run / "summary.json").read_text()).get("alarms") or []
            self.monitors.replay(self.history, alarms)

    def start(self, algo_config: Any, ckpt: Path | None) -> None:
        """Build the algorithm, or restore it from ``ckpt`` (dropping later metrics)."""
        if ckpt is not None:
            self.algo = restore_algorithm(ckpt)  # with the sampling state: exact continuation
            self.history = [
                h for h in self.history if h.get("charts/iteration", 0) <= self.algo.iteration
            ]
            rewrite_history(self.run / "metrics.jsonl", self.history)
            self.tracker.restore(self.history)
        else:
            self.algo = algo_config.build_algo()
        from trainers.signals.phase_timers import instrument_algo

        self.clock = instrument_algo(self.algo)  # timers/learn_s, timers/sync_s
        if self.cfg.output.rollouts:
            from trainers.run.rollout_dump import DUMP_DIR, record

            record(self.algo, self.run / DUMP_DIR)  # after the timers: dumping is not learn_s
        self.episodes.drain(self.algo)  # tells the env runners how many transcripts to keep
        self.curriculum = Curriculum.start(self.cfg, self.algo)  # pushes the task distribution
        self.wb = wandb_init(self.cfg, self.run, resumed=self.resumed)

    def loop(self, console: Any) -> None:
        """Train until the budget (counted from the first iteration) is spent.

        On a terminal a progress bar; when stdout is not one (a file, a pipe, a job log) one
        plain line per iteration, flushed (:func:`plain_line`). After a new run's first
        iteration, where its time went and the knobs that set it when it was slow
        (:func:`trainers.run.cost.cost_lines`)."""
        history = self.history
        budget = _Budget(self.cfg, float(history[-1]["charts/time_s"]) if history else 0.0)
        plain = console is not None and not console.is_terminal
        with (
            progress_bar(None if plain else console, "train") as advance,
            open(self.run / "metrics.jsonl", "a") as metrics_file,
            interrupt_between_iterations() as interrupted,
        ):
            iteration = int(self.algo.iteration)
            first = not history  # a new run (a resumed one has its rows already)
            env_steps = int(history[-1]["charts/env_steps"]) if history else 0
            advance(budget.fraction(iteration, env_steps), history[-1] if history else {})
            while not budget.done(iteration, env_steps) and self.stopped is None:
                row = self.step(metrics_file)
                iteration, env_steps = row["charts/iteration"], row["charts/env_steps"]
                advance(budget.fraction(iteration, env_steps), row)
                if plain:
                    print(plain_line(row, self.cfg.budget), flush=True)
                if first:
                    self.show_cost(console, row)
                    first = False
                interrupted()  # a first Ctrl-C or SIGTERM stops here, after a whole iteration

    def show_cost(self, console: Any, row: dict[str, Any]) -> None:
        """Where the first iteration's time went; warnings naming the knobs when it was slow
        (to the log when the run shows nothing)."""
        from trainers.run.cost import cost_lines

        lines = cost_lines(row, self.cfg, self.plan)
        if console is None:
            for line in lines[1:]:
                log.warning("%s", line.removeprefix("warning: "))
            return
        for line in lines:
            if console.is_terminal:
                style = "yellow" if line.startswith("warning:") else "dim"
                console.print(line, style=style, highlight=False, markup=False)
            else:
                print(line, flush=True)

    def step(self, metrics_file: Any) -> dict[str, Any]:
        """One iteration: train, record its metrics and episodes, check, checkpoint."""
        self.in_iteration = True
        result = self.algo.train()
        row = flatten_result(result, self.plan.agent_to_pool, set(self.plan.frozen))
        finish_row(row, self.cfg, self.plan)  # success where defined, EPyMARL's return
        from trainers.signals.phase_timers import iteration_timers

        runners = self.cfg.resources.num_env_runners
        row.update(iteration_timers(result, self.clock.take(), runners))
        if self.curriculum is not None:  # learns from the iteration's outcomes, pushes tasks
            row.update(self.curriculum.step(self.algo))
        iteration = row["charts/iteration"]
        alarms = self.monitors.observe(row, result)  # adds monitor/* to the row
        drained = self.episodes.drain(self.algo)
        self.history.append(row)
        append_row(metrics_file, row)
        self.in_iteration = False  # the metrics are written: a checkpoint may follow
        self.episodes.record(drained, iteration)
        if self.wb is not None:
            self.wb.log(row, step=iteration)
        if self.report is not None:
            self.report(row)
        self.episodes.check(row, drained)  # raises RunFailed when every episode failed
        every = self.cfg.output.checkpoint_every
        if every and iteration % every == 0:
            path = self.tracker.save(self.algo, iteration, self.history)
            save_hf(self.algo, self.exports, path / "model")
        self.on_alarms(alarms, iteration)
        return row

    def on_alarms(self, alarms: list[Alarm], iteration: int) -> None:
        """Log the monitors' alarms; save a checkpoint or stop the run as their action says."""
        for alarm in alarms:
            log.warning("%s", alarm.message())
        action = strongest(alarms)
        if action == "checkpoint":
            path = self.run / "checkpoints" / f"alarm_iter_{iteration:06d}"
            path.parent.mkdir(exist_ok=True)
            save_checkpoint(self.algo, path)
        elif action == "stop":
            a = next(a for a in alarms if a.action == "stop")
            self.stopped = (
                f"stopped: monitor {a.monitor} ({a.metric} = {a.value:.4g}, threshold "
                f"{a.threshold:.4g}, at iteration {iteration})"
            )

    def finish(self) -> None:
        """The final checkpoint and the Hugging Face exports of a completed run."""
        self.final_ckpt = self.tracker.final(self.algo, self.history)
        self.models = save_hf(self.algo, self.exports, self.run / "model")

    def save_after_failure(self, exc: BaseException) -> None:
        """A final checkpoint of a failed or interrupted run, so that it can be resumed; none
        from inside an iteration: a checkpoint must not run ahead of metrics.jsonl (resume then
        starts from the latest one and redoes the iterations after it)."""
        if self.in_iteration:
            exc.add_note("the iteration in progress was not saved: a resumed run redoes it")
        elif self.algo is not None:
            with contextlib.suppress(Exception):
                self.final_ckpt = self.tracker.final(self.algo, self.history)
                exc.add_note("metrics and a checkpoint of the last iteration were saved")

    def close(self, status: str, failure: BaseException | None) -> TrainResult:
        """Curve, summary, wandb and the algorithm's processes; the run's :class:`TrainResult`."""
        curve = None
        if self.cfg.output.plot and self.history:
            with logged_os_error("curve.png"):
                curve = plot_curve(self.history, self.run / "curve.png", title=self.run.name)
        result = TrainResult(
            self.run,
            self.history,
            self.final_ckpt,
            self.tracker.best_path,
            self.tracker.best_value,
            status,
            curve,
            self.episodes.error_list(),
            self.models,
            [a.to_dict() for a in self.monitors.alarms],
            dict(getattr(self.plan.env.build_scenario(), "discovered", None) or {}),
        )
        with logged_os_error("summary.json"):
            write_summary(self.run, result)
        if isinstance(failure, RunFailed):
            failure.result = result
        if self.wb is not None:
            with contextlib.suppress(Exception):
                self.wb.finish(exit_code=0 if status == "completed" else 1)
        if self.algo is not None:
            with contextlib.suppress(Exception):
                self.algo.stop()
        return result
