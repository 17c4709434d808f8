"""``train(cfg)``: run an experiment to its budget, with metrics, checkpoints, plots and resume.

A run directory (``runs/{scenario}__{algo}__{seed}__{time}`` by default) holds, written in this
order so that a crash loses nothing already done:

* ``config.yaml`` — the experiment, written before anything runs;
* ``metrics.jsonl`` — one line per iteration, namespaced keys (``charts/…``,
  ``losses/<pool>/…``, ``<agent>/…``), flushed and fsynced every iteration;
* ``checkpoints/iter_NNNNNN`` — every ``output.checkpoint_every`` iterations (the latest and
  the best are kept), ``checkpoint`` — the final state; each written after its iteration's
  metrics line (a checkpoint never runs ahead of ``metrics.jsonl``), atomically (as
  ``*.partial``, then renamed), with the sampling state of :mod:`trainers.resume`;

* ``transcripts/iter_NNNNNN.{jsonl,md}`` — ``output.transcripts`` episodes of every
  iteration, readable (:mod:`trainers.transcripts`);
* ``model/<pool>`` — with ``output.export_hf``, each trained LLM pool in Hugging Face format
  at the end (and ``<checkpoint>/model/<pool>`` in each periodic checkpoint;
  :mod:`trainers.hf_export`);
* ``summary.json`` (status, best/final checkpoints, totals, the distinct errors of failed
  episodes), ``curve.png``, ``wandb/``.

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
:class:`~trainers.config.ConfigError` before Ray starts; a disk that fills during the run stops
it with :class:`OutputError` (one line), ``summary.json`` written when there is room.

``train(cfg, resume=<run dir or checkpoint>)`` restores the newest checkpoint (same weights,
iteration counter, sampling state and wall clock), drops metrics lines after it and continues
in the same run directory until the budget (counted from the first iteration) is reached, as
if never interrupted (not with remote learners: see docs/internals.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import logging
import math
import os
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from trainers.cluster import ensure_ray
from trainers.config import ConfigError, ExperimentConfig
from trainers.curriculum import Curriculum
from trainers.hf_export import export_pools, save_hf
from trainers.monitors import Alarm, Monitors, strongest

log = logging.getLogger(__name__)

#: the headline metric: mean verified team return per episode in an iteration.
RETURN_KEY = "charts/team_return"
ORACLE_FRACTION_KEY = "charts/oracle_fraction"
LOSS_KEYS = (
    "policy_loss",
    "vf_loss",
    "entropy",
    "mean_kl_loss",
    "vf_explained_var",
    "total_loss",
    "vf_loss_unclipped",
)


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` produced.

    Attributes:
        run_dir: the run directory.
        history: one metrics dict per iteration (the lines of ``metrics.jsonl``).
        final_checkpoint: the checkpoint saved at the end.
        best_checkpoint: the saved checkpoint with the highest smoothed team return.
        best_return: that smoothed team return.
        status: ``"completed"``, or ``"failed: <error>"``.
        curve: the learning-curve PNG (``None`` when plotting is off or failed).
        errors: the distinct errors of failed episodes: ``kind`` (``error`` or ``timeout``),
            ``error`` (the first text), ``count`` and ``first_iteration``.
        models: pool → its Hugging Face directory saved at the end (``output.export_hf``).
        alarms: the monitors' alarms (:class:`trainers.monitors.Alarm` as dicts), in order.
    """

    run_dir: Path
    history: list[dict[str, Any]]
    final_checkpoint: Path | None
    best_checkpoint: Path | None
    best_return: float | None
    status: str = "completed"
    curve: Path | None = None
    errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    models: dict[str, Path] = dataclasses.field(default_factory=dict)
    alarms: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def final(self) -> dict[str, Any]:
        """The last iteration's metrics ({} if none ran)."""
        return self.history[-1] if self.history else {}

    @property
    def iterations(self) -> int:
        """Iterations reached (the algorithm's counter)."""
        return int(self.final.get("charts/iteration", 0))

    @property
    def env_steps(self) -> int:
        """Environment steps sampled in total."""
        return int(self.final.get("charts/env_steps", 0))


class RunFailed(RuntimeError):
    """The run stopped because every episode failed (see ``episodes.fail_after``).

    Attributes:
        result: the run's :class:`TrainResult` (``status`` ``"failed: …"``), set once the run
            directory is written.
    """

    result: TrainResult | None = None


#: packages whose exceptions name the failing thing and the fix (preferred in run statuses)
OWN_PACKAGES = ("scenarios", "trainers", "marl_agents", "topologies")


def describe_error(exc: BaseException, limit: int = 4000) -> str:
    """``Type: message`` of the most telling exception in ``exc``'s chain of causes: the
    deepest one raised by this project (which names the thing and the fix), else the root
    cause; the exceptions it was raised through follow by type (``(through RuntimeError)``).
    RLlib re-raises env errors wrapped (``RuntimeError from e``, or a ``ValueError`` of its env
    checker about the gymnasium API), and those messages alone would hide what went wrong."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not x for x in chain) and len(chain) < 10:
        chain.append(e)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    own = [x for x in chain if type(x).__module__.split(".")[0] in OWN_PACKAGES]
    head = own[-1] if own else chain[-1]
    msg = str(head).strip()
    text = f"{type(head).__name__}: {msg}" if msg else type(head).__name__
    outer = [type(x).__name__ for x in chain[: chain.index(head)]]
    if outer:
        text += f" (through {' ← '.join(reversed(outer))})"
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ----- process setup ------------------------------------------------------------------------
_WARNED_HASH_SEED = False


def setup_process(hash_seed_matters: bool = True) -> None:
    """One thread for torch and OpenMP (on small CPU boxes extra threads only spin-wait); a
    warning when ``PYTHONHASHSEED`` is unset where it matters (RLlib's sampler: not the batched
    one, whose episodes order agents sorted)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    global _WARNED_HASH_SEED
    if hash_seed_matters and "PYTHONHASHSEED" not in os.environ and not _WARNED_HASH_SEED:
        _WARNED_HASH_SEED = True
        log.warning(
            "PYTHONHASHSEED is not set: runs with the same seed can differ across processes "
            "(RLlib's sampler orders agents through sets); the marl CLI sets it, and "
            "episodes.sampler: batched does not depend on it"
        )


def quiet_ray_logs() -> None:
    """Keep RLlib's start-up warnings out of the terminal."""
    for name in ("ray", "ray.rllib", "ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*new API stack.*")
    warnings.filterwarnings("ignore", message=".*Overriding environment.*")


# ----- run directories ----------------------------------------------------------------------
def run_name(cfg: ExperimentConfig, now: float | None = None) -> str:
    """``{scenario}__{algo}__{seed}__{time}`` (CleanRL style; a reference ``pkg.mod:attr``
    is written ``mod.attr``)."""
    from scenarios.registry import label

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{label(cfg.scenario)}__{cfg.algorithm.name}__{cfg.seed}__{stamp}"


def new_run_dir(cfg: ExperimentConfig) -> Path:
    """Create a fresh run directory under ``cfg.output.dir`` (suffix ``-2``… on a clash)."""
    return fresh_dir(cfg.output.dir, cfg.output.name or run_name(cfg))


def open_run_dir(cfg: ExperimentConfig, run_dir: str | Path | None = None) -> Path:
    """The run directory (``run_dir``, or a new one under ``output.dir``) with ``config.yaml``
    written in it (on resume: the budget may have grown).

    Raises:
        ConfigError: it cannot be created or written (a read-only or full file system, a file
            in the way), naming the directory and the fix.
    """
    where = f"run directory {run_dir}" if run_dir is not None else f"output.dir={cfg.output.dir!r}"
    parent = Path(cfg.output.dir).expanduser() if run_dir is None else Path(run_dir).expanduser()
    if parent.is_file():
        raise ConfigError(
            f"{where} is a file, not a directory: give a directory (--output / output.dir)"
        )
    try:
        run = Path(run_dir).expanduser().resolve() if run_dir is not None else new_run_dir(cfg)
        run.mkdir(parents=True, exist_ok=True)
        cfg.to_yaml(run / "config.yaml")
    except OSError as exc:
        raise ConfigError(
            f"{where}: cannot write a run there ({os_reason(exc)}): choose a writable directory "
            "(--output / output.dir) or free space"
        ) from None
    return run


def os_reason(exc: OSError) -> str:
    """``Read-only file system: /path`` (``str(OSError)`` without the errno)."""
    text = exc.strerror or type(exc).__name__
    return f"{text}: {exc.filename}" if exc.filename else text


def fresh_dir(parent: str | Path, name: str) -> Path:
    """Create ``parent/name`` (``name-2``, ``name-3``… on a clash) as an absolute path, which
    RLlib's checkpointing needs."""
    base = Path(parent).expanduser().resolve()
    path, k = base / name, 2
    while path.exists():
        path, k = base / f"{name}-{k}", k + 1
    path.mkdir(parents=True)
    return path


def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """``(checkpoint dir, run dir)`` for a run directory (its newest checkpoint: ``checkpoint``
    or a periodic ``checkpoints/iter_NNNNNN``, by the iteration each holds) or any checkpoint
    inside one.

    Raises:
        ConfigError: no checkpoint there.
    """
    p = Path(path).expanduser().resolve()
    if (p / "algorithm_state.pkl").exists():
        run = p.parent.parent if p.parent.name == "checkpoints" else p.parent
        return p, run
    candidates = [p / "checkpoint", p / f"checkpoint{OLD}", *sorted(p.glob("checkpoints/iter_*"))]
    found = [c for c in candidates if _complete(c)]
    if found:
        return max(found, key=_checkpoint_rank), p
    raise ConfigError(f"no algorithm checkpoint at {p}: pass a run directory or a checkpoint")


def _complete(ckpt: Path) -> bool:
    return (ckpt / "algorithm_state.pkl").exists() and not ckpt.name.endswith(PARTIAL)


def _checkpoint_rank(ckpt: Path) -> tuple[float, bool]:
    """Newest first by recorded iteration; a final ``checkpoint`` of an older version (no
    record) counts as the newest, as it was always written last."""
    from trainers.resume import checkpoint_iteration

    final = ckpt.name == "checkpoint"
    it = checkpoint_iteration(ckpt)
    if it is not None:
        return float(it), final
    digits = ckpt.name.removeprefix("iter_")
    return (math.inf if final else float(digits) if digits.isdigit() else -1.0), final


#: suffixes of a checkpoint being written (never resumed from) and of the one it replaces
PARTIAL, OLD = ".partial", ".old"


def save_checkpoint(algo: Any, path: Path) -> Path:
    """Save ``algo`` (RLlib's checkpoint plus :mod:`trainers.resume`'s sampling state) to
    ``path`` atomically: written beside it, then renamed over it, so a crash leaves either the
    old checkpoint or the new one, never a half-written one."""
    from trainers import resume

    tmp, old = path.with_name(path.name + PARTIAL), path.with_name(path.name + OLD)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        algo.save_to_path(str(tmp))
        resume.save(algo, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # frees the space a full disk needs for summary
        raise
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def restore_algorithm(ckpt: Path) -> Any:
    """``Algorithm.from_checkpoint`` plus the sampling state (exact continuation)."""
    from ray.rllib.algorithms.algorithm import Algorithm

    from trainers import resume

    algo = Algorithm.from_checkpoint(str(ckpt))
    resume.restore(algo, ckpt)
    return algo


def load_history(path: Path) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl`` (missing file: empty)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ----- metrics ------------------------------------------------------------------------------
def flatten_result(
    result: Mapping[str, Any], agent_to_pool: Mapping[str, str], frozen: set[str]
) -> dict[str, Any]:
    """Namespaced metrics of one ``algo.train()`` result.

    ``charts/…``: iteration, env steps, throughput, team return, success, oracle fraction,
    failed episodes (``error_rate``: a node raised; ``timeout_rate``: the wall-clock limit;
    ``limit_rate``: the step limit; all three also count in ``truncated``),
    ``rows_per_generate`` (LLM pools on the batched sampler: mean rows per ``generate``) and
    the scenario's metrics; ``losses/<pool>/…`` for learning pools (PPO's losses, and GRPO's
    ``grpo/…`` statistics such as ``logprob_gap_fresh``); ``<agent>/return`` and
    ``<agent>/credit`` per agent.
    """
    out: dict[str, Any] = {}
    runners = result.get("env_runners", {}) or {}
    dt = float(result.get("time_this_iter_s", 0.0) or 0.0)
    steps = _num(runners.get("num_env_steps_sampled"))
    out["charts/iteration"] = _count(result.get("training_iteration"))
    out["charts/env_steps"] = _count(result.get("num_env_steps_sampled_lifetime")) or _count(
        runners.get("num_env_steps_sampled_lifetime")
    )
    out["charts/time_s"] = _num(result.get("time_total_s"))
    out["charts/iteration_s"] = dt
    out["charts/env_steps_per_s"] = steps / dt if dt > 0 else 0.0
    out["charts/episode_len"] = _num(runners.get("episode_len_mean"))
    marl = runners.get("marl", {}) or {}
    n = _count(marl.get("episodes"))  # 0 when no runner reported (one died mid-iteration)
    out["charts/episodes"] = n
    if n > 0:
        out[RETURN_KEY] = _num(marl.get("team_return")) / n
        out["charts/success"] = _num(marl.get("success")) / n
        out["charts/truncated"] = _num(marl.get("truncated")) / n
        out["charts/error_rate"] = _num(marl.get("error")) / n
        out["charts/timeout_rate"] = _num(marl.get("timeout")) / n
        out["charts/limit_rate"] = _num(marl.get("limit")) / n
        if "oracle" in marl:
            oracle = _num(marl["oracle"])
            out["charts/oracle"] = oracle / n
            if abs(oracle) > 1e-9:
                out[ORACLE_FRACTION_KEY] = _num(marl.get("team_return")) / oracle
        llm = marl.get("llm") or {}  # the batched sampler's LLM generate calls
        if "rows_per_generate" in llm:
            out["charts/rows_per_generate"] = _num(llm["rows_per_generate"])
        for key, value in marl.items():
            if key.startswith("metric/"):
                out[f"charts/{key.removeprefix('metric/')}"] = _num(value) / n
    for agent, value in (runners.get("agent_episode_returns_mean") or {}).items():
        out[f"{agent}/return"] = _num(value)
    learners = result.get("learners", {}) or {}
    for pool, stats in learners.items():
        if not isinstance(stats, Mapping) or pool in frozen:
            continue
        for key, value in stats.items():
            if key in LOSS_KEYS or (isinstance(key, str) and key.startswith("grpo/")):
                out[f"losses/{pool}/{key}"] = _num(value)
    for key, value in _walk(learners):
        parts = key.split("/")
        if "credit" in parts[:-1] and parts[-1] in agent_to_pool:
            out[f"{parts[-1]}/credit"] = _num(value)
    return {k: v for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}


def _walk(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        path = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            yield from _walk(value, path)
        else:
            yield path, value


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan") if value is not None else 0.0


def _count(value: Any) -> int:
    """A counter from RLlib's results: 0 when missing, NaN or infinite."""
    x = _num(value)
    return int(x) if math.isfinite(x) else 0


# ----- the training loop --------------------------------------------------------------------
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


# ----- faults: interrupts, metrics rows, unwritable output -----------------------------------
class OutputError(RunFailed):
    """The run directory could not be written (full disk, read-only file system, quota)."""


#: errnos of a full disk (wherever they come from) and of an unwritable file (in the run dir)
FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
DENIED_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}


def output_error(exc: BaseException, run: Path) -> OutputError | None:
    """An :class:`OutputError` (one line: what, where, the fix) when ``exc`` or one of its
    causes is an ``OSError`` of a full disk, or of a file in ``run`` that cannot be written;
    else None."""
    e: BaseException | None = exc
    for _ in range(10):
        if e is None:
            return None
        if isinstance(e, OSError) and (
            e.errno in FULL_ERRNOS
            or (e.errno in DENIED_ERRNOS and run in Path(str(e.filename or "/")).parents)
        ):
            return OutputError(
                f"cannot write the run directory {run} ({os_reason(e)}): free space or choose "
                f"a writable output.dir (--output); the run continues from its last checkpoint "
                f"with: marl run --resume {run}"
            )
        e = e.__cause__ or e.__context__
    return None


@contextlib.contextmanager
def _logged_os_error(what: str) -> Iterator[None]:
    """Writing ``what`` at the end of a run: an ``OSError`` is one warning, never a traceback
    hiding the run's own error."""
    try:
        yield
    except OSError as exc:
        log.warning("could not write %s: %s", what, os_reason(exc))


def append_row(file: Any, row: Mapping[str, Any]) -> None:
    """Append one iteration's metrics and make them durable before any checkpoint of it."""
    file.write(json.dumps(row) + "\n")
    file.flush()
    os.fsync(file.fileno())


@contextlib.contextmanager
def interrupt_between_iterations() -> Iterator[Callable[[], None]]:
    """Defer Ctrl-C to the end of the running iteration; yields ``check()``, which raises
    ``KeyboardInterrupt`` once one arrived. A second Ctrl-C interrupts at once (no checkpoint of
    that iteration then). Only in the main thread (Tune trials run in others)."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    arrived: list[bool] = []

    def handler(signum: int, frame: Any) -> None:
        if arrived:
            raise KeyboardInterrupt("interrupted twice: stopped mid-iteration")
        arrived.append(True)
        log.warning(
            "interrupted: stopping after this iteration with a checkpoint (Ctrl-C again to stop "
            "now; the run then continues from its last checkpoint)"
        )

    def check() -> None:
        if arrived:
            raise KeyboardInterrupt("interrupted between iterations")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)


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
    from trainers.algo import batched_sampler, to_algorithm_config
    from trainers.plan import resolve, with_text_defaults

    cfg, ckpt, run_dir = _resume_target(cfg, resume, run_dir)
    quiet_ray_logs()
    cfg = with_text_defaults(cfg)  # a chat app trains as it is: LLM pools, GRPO
    plan = resolve(cfg)
    algo_config = to_algorithm_config(cfg, plan)
    exports = export_pools(cfg, plan)  # every config error is raised by now
    setup_process(hash_seed_matters=not batched_sampler(cfg))
    run = open_run_dir(cfg, run_dir)  # ConfigError for an unwritable output, before Ray
    started_ray = ensure_ray(cfg)
    console = progress_console(cfg)
    session = _Session(cfg, plan, run, exports, report, resumed=ckpt is not None)
    status = "completed"
    failure: BaseException | None = None
    try:
        session.start(algo_config, ckpt)
        if console is not None:
            _print_plan(console, plan, run)
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
        self.tracker = _Checkpoints(run)
        self.episodes = _EpisodeLog(cfg, plan, run, resumed=resumed)
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
            _rewrite(self.run / "metrics.jsonl", self.history)
            self.tracker.restore(self.history)
        else:
            self.algo = algo_config.build_algo()
        from trainers.phase_timers import instrument_algo

        self.clock = instrument_algo(self.algo)  # timers/learn_s, timers/sync_s
        if self.cfg.output.rollouts:
            from trainers.rollouts import DUMP_DIR, record

            record(self.algo, self.run / DUMP_DIR)  # after the timers: dumping is not learn_s
        self.episodes.drain(self.algo)  # tells the env runners how many transcripts to keep
        self.curriculum = Curriculum.start(self.cfg, self.algo)  # pushes the task distribution
        self.wb = _wandb_init(self.cfg, self.run, resumed=self.resumed)

    def loop(self, console: Any) -> None:
        """Train until the budget (counted from the first iteration) is spent."""
        history = self.history
        budget = _Budget(self.cfg, float(history[-1]["charts/time_s"]) if history else 0.0)
        with (
            progress_bar(console, "train") as advance,
            open(self.run / "metrics.jsonl", "a") as metrics_file,
            interrupt_between_iterations() as interrupted,
        ):
            iteration = int(self.algo.iteration)
            env_steps = int(history[-1]["charts/env_steps"]) if history else 0
            advance(budget.fraction(iteration, env_steps), history[-1] if history else {})
            while not budget.done(iteration, env_steps) and self.stopped is None:
                row = self.step(metrics_file)
                iteration, env_steps = row["charts/iteration"], row["charts/env_steps"]
                advance(budget.fraction(iteration, env_steps), row)
                interrupted()  # a first Ctrl-C stops here, after a whole iteration

    def step(self, metrics_file: Any) -> dict[str, Any]:
        """One iteration: train, record its metrics and episodes, check, checkpoint."""
        self.in_iteration = True
        result = self.algo.train()
        row = flatten_result(result, self.plan.agent_to_pool, set(self.plan.frozen))
        from trainers.phase_timers import iteration_timers

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
            with _logged_os_error("curve.png"):
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
        )
        with _logged_os_error("summary.json"):
            _write_summary(self.run, result)
        if isinstance(failure, RunFailed):
            failure.result = result
        if self.wb is not None:
            with contextlib.suppress(Exception):
                self.wb.finish(exit_code=0 if status == "completed" else 1)
        if self.algo is not None:
            with contextlib.suppress(Exception):
                self.algo.stop()
        return result


class _EpisodeLog:
    """A run's failed episodes and transcripts, drained from the env runners' journals
    (:class:`trainers.episode_metrics.EpisodeJournal`) after every iteration."""

    def __init__(self, cfg: ExperimentConfig, plan: Any, run: Path, resumed: bool) -> None:
        self.cfg, self.plan, self.run = cfg, plan, run
        self.errors: dict[tuple[str, str], dict[str, Any]] = {}
        self.streak = 0  # consecutive iterations in which every finished episode failed
        self._env: Any = None  # replays credit for transcripts (built on first use)
        summary = run / "summary.json"
        if resumed and summary.exists():
            from trainers.episode_metrics import error_key

            for e in json.loads(summary.read_text()).get("errors") or []:
                self.errors[(e["kind"], error_key(e["error"]))] = e

    def drain(self, algo: Any) -> dict[str, Any]:
        """Every env runner's journal, merged; they keep ``output.transcripts`` from now on."""
        from trainers.episode_metrics import drain_journal, error_key, raise_callback_errors

        keep = self.cfg.output.transcripts
        group = getattr(algo, "env_runner_group", None)
        if group is None:
            parts = [drain_journal(keep=keep)]
        else:
            parts = group.foreach_env_runner(
                functools.partial(drain_journal, keep=keep), local_env_runner=True
            )
        raise_callback_errors(parts)
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        transcripts: list[dict[str, Any]] = []
        for part in parts:
            transcripts += part["transcripts"]
            for e in part["errors"]:
                key = (e["kind"], error_key(e["error"]))
                if key in merged:
                    merged[key]["count"] += e["count"]
                else:
                    merged[key] = dict(e)
        return {"transcripts": transcripts[:keep], "errors": list(merged.values())}

    def record(self, drained: Mapping[str, Any], iteration: int) -> None:
        """Log each new distinct error once; write the iteration's transcripts."""
        from trainers.episode_metrics import error_key

        for e in drained["errors"]:
            key = (e["kind"], error_key(e["error"]))
            if key in self.errors:
                self.errors[key]["count"] += e["count"]
                continue
            self.errors[key] = {**e, "first_iteration": iteration}
            what = "timed out" if e["kind"] == "timeout" else "failed"
            log.warning(
                "%d episode(s) %s in iteration %d (logged once; later ones are counted in "
                "charts/%s_rate and %s): %s",
                e["count"],
                what,
                iteration,
                e["kind"],
                self.run / "summary.json",
                e["error"],
            )
        if drained["transcripts"]:
            from trainers.transcripts import write_iteration

            transcripts = [self._credited(t, iteration) for t in drained["transcripts"]]
            write_iteration(self.run, iteration, transcripts)

    def _credited(self, t: dict[str, Any], iteration: int) -> dict[str, Any]:
        t = {**t, "iteration": iteration}
        actions = t.pop("_actions", None)
        credit = self.cfg.credit
        if credit.method == "team" or actions is None or t.get("failure") == "timeout":
            return t
        from trainers.transcripts import episode_credit

        if self._env is None:
            from scenarios.rllib_env import RLlibGraphEnv

            timeout = {"episode_timeout_s": self.cfg.episodes.timeout_s}
            self._env = RLlibGraphEnv({**self.plan.env_config, **timeout}).env
        local = (t.get("outcome") or {}).get("local")
        t["credit"] = episode_credit(self._env, int(t["seed"]), actions, local, credit)
        t["credit_method"] = credit.method
        return t

    def check(self, row: Mapping[str, Any], drained: Mapping[str, Any]) -> None:
        """Raise :class:`RunFailed` once every episode failed in ``fail_after`` iterations."""
        n = int(row.get("charts/episodes", 0))
        if n == 0:
            if "charts/episode_len" not in row:  # nothing sampled at all
                log.warning(
                    "iteration %s sampled nothing: every env runner is down (RLlib restarts "
                    "them; resources.num_env_runners: 0 samples in this process)",
                    row.get("charts/iteration"),
                )
            return  # no episode finished: nothing to judge
        if round(row.get("charts/limit_rate", 0.0) * n) >= n:
            log.warning(
                "every episode of iteration %s (%d) hit the step limit (the scenario's "
                "max_supersteps, LangGraph's recursion limit): nothing reached the verifier. "
                "Raise max_supersteps (scenario_kwargs.max_supersteps) if episodes only run "
                "long, or fix the loop that never reaches END (transcripts are in %s)",
                row.get("charts/iteration"),
                n,
                self.run,
            )
        errors = round(row.get("charts/error_rate", 0.0) * n)
        timeouts = round(row.get("charts/timeout_rate", 0.0) * n)
        self.streak = self.streak + 1 if errors + timeouts >= n else 0
        after = self.cfg.episodes.fail_after
        if not after or self.streak < after:
            return
        first = (drained["errors"] or self.error_list() or [{"error": "unknown"}])[0]["error"]
        span = "" if after == 1 else f" (and the {after - 1} before it)"
        raise RunFailed(
            f"every episode of iteration {row['charts/iteration']}{span} failed ({n} episodes: "
            f"{errors} node errors, {timeouts} timeouts), so the run stopped instead of "
            f"training on nothing. First error: {first}. Fix the failing node (transcripts "
            f"and errors are in {self.run}), raise episodes.timeout_s if episodes only run "
            "long, or set episodes.fail_after: 0 to train on regardless"
        )

    def error_list(self) -> list[dict[str, Any]]:
        """The distinct errors so far, most frequent first."""
        return sorted(self.errors.values(), key=lambda e: -e["count"])


def _rewrite(path: Path, history: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(h) + "\n" for h in history))


class _Checkpoints:
    """Periodic checkpoints: keeps the latest and the best (by smoothed team return)."""

    def __init__(self, run: Path) -> None:
        self.run = run
        self.best_path: Path | None = None
        self.best_value: float | None = None
        self.latest: Path | None = None

    @staticmethod
    def smoothed(history: list[dict[str, Any]], k: int = 3) -> float | None:
        values = [h[RETURN_KEY] for h in history[-k:] if RETURN_KEY in h]
        return sum(values) / len(values) if values else None

    def restore(self, history: list[dict[str, Any]]) -> None:
        summary = self.run / "summary.json"
        if summary.exists():
            data = json.loads(summary.read_text())
            best = data.get("best_checkpoint")
            # only a checkpoint of this run: a copied run directory's summary names the
            # original's, which this run must never delete
            if best and Path(best).exists() and self.run in Path(best).parents:
                self.best_path, self.best_value = Path(best), data.get("best_return")

    def save(self, algo: Any, iteration: int, history: list[dict[str, Any]]) -> Path:
        path = self.run / "checkpoints" / f"iter_{iteration:06d}"
        path.parent.mkdir(exist_ok=True)
        save_checkpoint(algo, path)
        value = self.smoothed(history)
        previous = self.latest
        self.latest = path
        if value is not None and (self.best_value is None or value > self.best_value):
            old_best = self.best_path
            self.best_path, self.best_value = path, value
            if old_best is not None and old_best != previous:
                shutil.rmtree(old_best, ignore_errors=True)
        if previous is not None and previous != self.best_path:
            shutil.rmtree(previous, ignore_errors=True)
        return path

    def final(self, algo: Any, history: list[dict[str, Any]]) -> Path:
        path = save_checkpoint(algo, self.run / "checkpoint")
        value = self.smoothed(history)
        if value is not None and (self.best_value is None or value >= self.best_value):
            self.best_path, self.best_value = path, value
        if self.best_path is None:
            self.best_path = path
        return path


def _write_summary(run: Path, result: TrainResult) -> None:
    final = result.final
    data = {
        "status": result.status,
        "iterations": result.iterations,
        "env_steps": result.env_steps,
        "time_s": final.get("charts/time_s"),
        "team_return": final.get(RETURN_KEY),
        "oracle_fraction": final.get(ORACLE_FRACTION_KEY),
        "final_checkpoint": str(result.final_checkpoint) if result.final_checkpoint else None,
        "best_checkpoint": str(result.best_checkpoint) if result.best_checkpoint else None,
        "best_return": result.best_return,
        "curve": str(result.curve) if result.curve else None,
        "errors": result.errors,
        "models": {pool: str(path) for pool, path in result.models.items()},
        "alarms": result.alarms,
    }
    (run / "summary.json").write_text(json.dumps(data, indent=2) + "\n")


# ----- wandb --------------------------------------------------------------------------------
def _wandb_init(cfg: ExperimentConfig, run: Path, resumed: bool) -> Any:
    mode = cfg.logging.wandb
    if mode == "disabled":
        return None
    os.environ["WANDB_MODE"] = mode
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        import wandb

        return wandb.init(
            project=cfg.logging.project,
            entity=cfg.logging.entity,
            name=run.name,
            id=run.name.replace(":", "-"),
            dir=str(run),
            config=cfg.to_dict(),
            mode=mode,
            resume="allow" if resumed else None,
            reinit="finish_previous",
        )
    except Exception as exc:  # tracking must never kill a run
        log.warning("wandb disabled for this run: %s", exc)
        return None


# ----- display ------------------------------------------------------------------------------
def progress_console(cfg: Any) -> Any:
    """A rich console when ``cfg.logging.progress`` (ExperimentConfig or FinetuneJob), else None."""
    if not cfg.logging.progress:
        return None
    from rich.console import Console

    return Console()


@contextlib.contextmanager
def progress_bar(
    console: Any, label: str, info: Callable[[Mapping[str, Any]], str] | None = None
) -> Iterator[Callable[[float, dict[str, Any]], None]]:
    """A rich progress bar for long work; yields ``advance(fraction, metrics_row)``.

    ``info`` turns the latest metrics row into the text beside the bar. No console, no bar.
    """
    if console is None:
        yield lambda fraction, row: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    describe = info or _row_info
    progress = Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
    )
    task = progress.add_task(label, total=1.0, info="")

    def advance(fraction: float, row: dict[str, Any]) -> None:
        progress.update(task, completed=fraction, info=describe(row) if row else "")

    with progress:
        yield advance


def _row_info(row: Mapping[str, Any]) -> str:
    if not row:
        return ""
    parts = [f"it {row.get('charts/iteration', 0)}", f"steps {row.get('charts/env_steps', 0)}"]
    if RETURN_KEY in row:
        parts.append(f"return {row[RETURN_KEY]:.3f}")
    if ORACLE_FRACTION_KEY in row:
        parts.append(f"oracle {100 * row[ORACLE_FRACTION_KEY]:.0f}%")
    if "charts/success" in row:
        parts.append(f"success {100 * row['charts/success']:.0f}%")
    parts.append(f"{row.get('charts/env_steps_per_s', 0):.0f} steps/s")
    if "timers/env_s" in row:
        phases = ("env", "forward", "sample_overhead", "learn", "sync")
        parts.append(" ".join(f"{p} {row[f'timers/{p}_s']:.2f}s" for p in phases))
    if row.get("timers/tool_wait_s"):  # slow tools: wall time with a tool call running
        parts.append(f"tool wait {row['timers/tool_wait_s']:.2f}s")
    if row.get("monitor/alarms"):
        parts.append(f"[red]{row['monitor/alarms']} alarm(s), see log[/red]")
    return " · ".join(parts)


def _print_plan(console: Any, plan: Any, run: Path) -> None:
    from rich.table import Table

    from marl_agents.pools import describe

    table = Table(title=f"{plan.scenario_id} · {run.name}", title_justify="left")
    for col in ("pool", "agents", "model", "trained"):
        table.add_column(col)
    for row in describe(plan.pools):
        table.add_row(
            row["pool"],
            ", ".join(row["agents"]),
            row["model"],
            "yes" if row["trained"] else "frozen",
        )
    console.print(table)


def print_summary(console: Any, result: TrainResult) -> None:
    """The final summary table of a run."""
    from rich.table import Table

    final = result.final
    table = Table(title="run summary", title_justify="left", show_header=False)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    steps_per_s = [h.get("charts/env_steps_per_s", 0.0) for h in result.history]
    rows = [
        ("status", result.status),
        ("iterations", str(result.iterations)),
        ("env steps", str(result.env_steps)),
        ("time", f"{final.get('charts/time_s', 0.0):.0f} s"),
        ("env steps/s", f"{sum(steps_per_s) / max(1, len(steps_per_s)):.0f}"),
    ]
    if RETURN_KEY in final:
        first = next((h[RETURN_KEY] for h in result.history if RETURN_KEY in h), None)
        rows.append(("team return", f"{first:.3f} → {final[RETURN_KEY]:.3f}"))
    if "charts/oracle" in final:
        rows.append(("oracle return", f"{final['charts/oracle']:.3f}"))
    if ORACLE_FRACTION_KEY in final:
        rows.append(("fraction of oracle", f"{100 * final[ORACLE_FRACTION_KEY]:.1f}%"))
    if "charts/success" in final:
        rows.append(("success", f"{100 * final['charts/success']:.1f}%"))
    if result.errors:
        total = sum(e["count"] for e in result.errors)
        top = result.errors[0]
        rows.append(
            (
                "failed episodes",
                f"{total} ({len(result.errors)} distinct errors, in summary.json); most "
                f"frequent ({top['kind']}, {top['count']}×): {top['error']}",
            )
        )
    if result.alarms:
        first = result.alarms[0]
        rows.append(
            (
                "monitor alarms",
                f"{len(result.alarms)} (in summary.json); first: {first['monitor']} "
                f"({first['metric']} = {first['value']:.4g}) at iteration {first['iteration']}",
            )
        )
    rows += [
        ("best checkpoint", str(result.best_checkpoint)),
        ("final checkpoint", str(result.final_checkpoint)),
        ("learning curve", str(result.curve)),
        ("run dir", str(result.run_dir)),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


def plot_curve(history: list[dict[str, Any]], path: Path, title: str = "") -> Path | None:
    """Team return (and the oracle, when known) against env steps, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return None
    rows = [h for h in history if RETURN_KEY in h]
    if not rows:
        return None
    x = [h["charts/env_steps"] for h in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [h[RETURN_KEY] for h in rows], label="team return")
    if all("charts/oracle" in h for h in rows):
        ax.plot(x, [h["charts/oracle"] for h in rows], "--", label="oracle (same tasks)")
    if all("charts/success" in h for h in rows):
        ax.plot(x, [h["charts/success"] for h in rows], ":", label="success rate")
    ax.set_xlabel("env steps")
    ax.set_ylabel("per episode")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
