"""``sweep(cfg, param_space)``: Ray Tune over experiment configs, as many trials at once as fit.

Search dimensions are dotted paths into :class:`~trainers.configs.experiment.ExperimentConfig`, so
the
topology, the pool assignment and the credit method are searched exactly like a learning
rate::

    param_space = {
        "topology": ["star:2", "star:3"],
        "train": [["orchestrator"], None],
        "credit.method": ["team", "shapley"],
        "algorithm.lr": {"loguniform": [1e-4, 3e-3]},
    }

A value is a list (grid under ``search="grid"``, uniform choice under ``"random"``), or a
mapping ``{"grid": [...]}``, ``{"choice": [...]}``, ``{"uniform": [lo, hi]}``,
``{"loguniform": [lo, hi]}`` or ``{"randint": [lo, hi]}``. Before Ray starts, every
categorical combination (and both ends of each range) is resolved
(:func:`trainers.plan.resolve`), each range is checked (two numbers, ``lo < hi``, ``lo > 0`` for
``loguniform``) and the ranking ``metric`` is checked to be one every trial reports.

Each trial runs :func:`trainers.run.loop.train` in a Tune actor whose placement group holds the
trial's driver, env runners and learners (:func:`trainers.cluster.trial_bundles`); as many
trials run at once as the cluster's CPUs and GPUs fit (``max_concurrent_trials`` overrides).
Each trial gets its own offline wandb run (``WandbLoggerCallback``). A failed trial is listed
with its error (``SweepResult.failed``); ``marl sweep`` then exits 1.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError, load_yaml_mapping
from trainers.run.metrics import LOSS_KEYS, ORACLE_FRACTION_KEY, RETURN_KEY

DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "randint")
RANGES = ("uniform", "loguniform", "randint")
#: the ``charts/…`` keys every run reports (:func:`trainers.run.metrics.flatten_result`); a scenario
#: adds ``charts/<metric>`` for each of its outcome metrics.
CHART_KEYS = (
    "iteration", "env_steps", "time_s", "iteration_s", "env_steps_per_s", "episode_len",
    "episodes", "team_return", "success", "truncated", "error_rate", "timeout_rate", "limit_rate",
    "oracle", "oracle_fraction",
)  # fmt: skip


@dataclasses.dataclass
class SweepResult:
    """Trials of a sweep, best first.

    Attributes:
        trials: per trial: ``params`` (the searched values), ``metric`` (final), ``best``
            (best over iterations), ``iterations``, ``run_dir``, ``status``.
        metric: the metric trials are ranked by.
        path: the Tune experiment directory.
    """

    trials: list[dict[str, Any]]
    metric: str
    path: Path

    @property
    def best(self) -> dict[str, Any]:
        """The best trial."""
        return self.trials[0]

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The trials that ended with an error (``error``: its one-line description)."""
        return [t for t in self.trials if t["status"] == "error"]


@dataclasses.dataclass
class SweepSpec:
    """A sweep file (``marl sweep FILE.yaml``): the base experiment plus the search.

    Example file::

        name: delegate-credit
        base:
          scenario: delegate
          budget: {iterations: 20}
          output: {dir: runs}
        search: grid
        param_space:
          topology: [star:2, star:3]
          train: [[orchestrator], null]
          credit.method: [team, loo, shapley]
          algorithm.lr: {loguniform: [0.0003, 0.003]}

    Attributes:
        base: the experiment every trial starts from.
        param_space: dotted path → values or distribution (see the module docstring).
        search: ``"grid"`` or ``"random"``.
        num_samples: samples per grid point (``grid``) or trials (``random``).
        metric: the metric to rank trials by (final value).
        mode: ``"max"`` or ``"min"``.
        name: experiment name (a directory under ``base.output.dir``).
        max_concurrent_trials: trials run at once (``None``: as many as the cluster fits).
    """

    base: ExperimentConfig
    param_space: dict[str, Any]
    search: str = "grid"
    num_samples: int = 1
    metric: str = RETURN_KEY
    mode: str = "max"
    name: str | None = None
    max_concurrent_trials: int | None = None

    @classmethod
    def from_yaml(cls, source: str | Path) -> SweepSpec:
        """Load ``{base: {...}, param_space: {...}, search, num_samples, metric, mode, name}``."""
        data = load_yaml_mapping(source, "sweep", "base: {...}, param_space: {...}") or {}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"sweep file: unknown field(s) {unknown}; valid are {sorted(known)}")
        if "param_space" not in data:
            raise ConfigError("sweep file: param_space is missing (dotted path → values)")
        base = ExperimentConfig.from_dict(data.get("base") or {})
        return cls(base=base, **{k: v for k, v in data.items() if k != "base"})


def _domains(param_space: Mapping[str, Any], search: str) -> dict[str, Any]:
    """Tune's search space (dimensions already checked by :func:`validate_space`)."""
    from ray import tune

    out: dict[str, Any] = {}
    for key, spec in param_space.items():
        if isinstance(spec, list):
            out[key] = tune.grid_search(spec) if search == "grid" else tune.choice(spec)
            continue
        ((kind, args),) = spec.items()
        if kind == "grid":
            out[key] = tune.grid_search(list(args))
        elif kind == "choice":
            out[key] = tune.choice(list(args))
        else:
            lo, hi = args
            out[key] = {"uniform": tune.uniform, "loguniform": tune.loguniform,
                        "randint": tune.randint}[kind](lo, hi)  # fmt: skip
    return out


def _values(key: str, spec: Any) -> list[Any]:
    """The values of one dimension to validate: its list, or both ends of a range.

    Raises:
        ConfigError: not a list or a one-key distribution mapping, an empty list, or a range
            that is not two numbers ``lo < hi`` (``lo > 0`` for ``loguniform``, integers for
            ``randint``).
    """
    where = f"param_space[{key!r}]"
    if isinstance(spec, list):
        values = spec
    elif isinstance(spec, Mapping) and len(spec) == 1 and next(iter(spec)) in DISTRIBUTIONS:
        ((kind, values),) = spec.items()
        if kind in RANGES:
            return _range_ends(where, kind, values)
    else:
        raise ConfigError(
            f"{where} must be a list or one of {{{', '.join(DISTRIBUTIONS)}: ...}}, got {spec!r}"
        )
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{where}: no values in {spec!r}: give a non-empty list")
    return values


def _range_ends(where: str, kind: str, args: Any) -> list[Any]:
    number = int if kind == "randint" else (int, float)
    example = {"uniform": "[0.0, 1.0]", "loguniform": "[0.0001, 0.01]", "randint": "[1, 10]"}
    fix = f"write {{{kind}: {example[kind]}}} (lo < hi)"
    ok = isinstance(args, list) and len(args) == 2
    ok = ok and all(isinstance(a, number) and not isinstance(a, bool) for a in args)
    if not ok or not all(math.isfinite(a) for a in args):
        raise ConfigError(f"{where}={{{kind}: {args!r}}} needs two numbers [lo, hi]: {fix}")
    lo, hi = args
    if lo >= hi:
        raise ConfigError(f"{where}={{{kind}: {args!r}}} has lo ≥ hi: {fix}")
    if kind == "loguniform" and lo <= 0:
        raise ConfigError(f"{where}={{{kind}: {args!r}}} needs lo > 0 (a log scale): {fix}")
    return [lo, hi - 1 if kind == "randint" else hi]  # Tune's randint excludes hi


def validate_space(
    base: ExperimentConfig,
    param_space: Mapping[str, Any],
    search: str,
    metric: str | None = None,
) -> int:
    """Resolve every categorical combination (and both ends of each range) without Ray, and
    check that each reports ``metric`` (when given).

    Returns:
        The number of combinations checked.

    Raises:
        ConfigError: a bad dimension, or a combination that cannot run or does not report
            ``metric``, naming its values.
    """
    from trainers.plan import resolve

    if search not in ("grid", "random"):
        raise ConfigError(f"search must be 'grid' or 'random', got {search!r}")
    if not param_space:
        raise ConfigError("param_space is empty: give at least one dimension to search")
    keys = list(param_space)
    values = [_values(key, spec) for key, spec in param_space.items()]
    count = 0
    for combo in itertools.product(*values):
        changes = dict(zip(keys, combo, strict=True))
        try:
            plan = resolve(base.replace(**changes))
            if metric is not None:
                check_metric(plan, metric)
        except ConfigError as exc:
            raise ConfigError(f"sweep point {changes}: {exc}") from exc
        count += 1
    return count


def check_metric(plan: Any, metric: str) -> None:
    """``metric`` is a key a run of ``plan`` reports (:func:`trainers.run.metrics.flatten_result`):
    ``charts/<key>`` (:data:`CHART_KEYS`, or one of the scenario's outcome metrics, learnt
    from one random episode), ``losses/<trained pool>/<loss>`` or ``<agent>/return`` /
    ``<agent>/credit``.

    Raises:
        ConfigError: a metric the runs do not report, with the valid forms.
    """
    credit = plan.cfg.credit.method != "team"
    if not isinstance(metric, str):
        ok, known = False, []
    elif metric.startswith("charts/"):
        known = [k for k in CHART_KEYS if plan.has_oracle or not k.startswith("oracle")]
        name = metric.removeprefix("charts/")
        if name not in known:
            known += _outcome_metrics(plan)
        ok = name in known
        known = [f"charts/{k}" for k in known]
    elif metric.startswith("losses/"):
        pool, _, key = metric.removeprefix("losses/").partition("/")
        ok = pool in plan.trainable and (key in LOSS_KEYS or key.startswith("grpo/"))
        known = [f"losses/{p}/{k}" for p in plan.trainable for k in LOSS_KEYS[:1]]
    else:
        agent, _, key = metric.rpartition("/")
        ok = agent in plan.agents and key in (("return", "credit") if credit else ("return",))
        known = [f"{a}/return" for a in plan.agents[:2]]
    if not ok:
        shown = ", ".join(known[:12]) + (", …" if len(known) > 12 else "")
        raise ConfigError(
            f"metric={metric!r} is not reported by these runs: rank by one that is, e.g. "
            f"{RETURN_KEY} (the default); here: {shown}; also losses/<pool>/<loss>, "
            "<agent>/return"
        )


def _outcome_metrics(plan: Any) -> list[str]:
    """The scenario's outcome metric names (one episode of random actions)."""
    from scenarios.testing import random_episode

    try:
        graph_env = plan.env.replace(rewards=None, tool_latency=None).make_env()
        random_episode(graph_env, seed=0)
        outcome = graph_env.outcome
    except Exception as exc:  # the user's scenario: say what went wrong, do not guess
        raise ConfigError(
            f"could not run one episode to learn the scenario's metrics ({exc}): rank by a "
            f"charts/ key every run reports, e.g. {RETURN_KEY}"
        ) from None
    return sorted((outcome.metrics or {}) if outcome is not None else {})


def _trial(config: dict[str, Any], base: dict[str, Any]) -> None:
    """One Tune trial: the base config with this trial's values, trained to its budget."""
    from ray import tune

    from trainers.run.loop import train

    cfg = ExperimentConfig.from_dict(base).replace(**config)
    cfg.logging.wandb = "disabled"  # the WandbLoggerCallback logs each trial
    cfg.logging.progress = False
    train(cfg, report=lambda row: tune.report(dict(row)), run_dir=_trial_run_dir())


def _trial_run_dir() -> Path:
    """``run/`` in the trial's working directory on whichever node runs it: Tune uploads that
    directory to the trial's storage directory (``SyncConfig(sync_artifacts=True)``), while
    ``get_trial_dir()`` is a staging directory only the driver's node uploads."""
    from ray import tune

    from trainers.rllib_compat.ray_private import trial_working_directory

    found = trial_working_directory()
    if found is not None:
        return found / "run"
    return Path(tune.get_context().get_trial_dir()) / "run"


def sweep(
    cfg: ExperimentConfig,
    param_space: Mapping[str, Any],
    *,
    search: str = "grid",
    num_samples: int = 1,
    metric: str = RETURN_KEY,
    mode: str = "max",
    name: str | None = None,
    show: bool = True,
    max_concurrent_trials: int | None = None,
    address: str | None = None,
) -> SweepResult:
    """Run a Ray Tune sweep over ``param_space`` around ``cfg``, as many trials at once as the
    cluster fits.

    Args:
        cfg: the base experiment.
        param_space: dotted path → values or distribution (see the module docstring).
        search: ``"grid"`` (lists are grids) or ``"random"`` (lists are choices).
        num_samples: repeats per grid point / number of random trials.
        metric: trials are ranked by this metric's final value.
        mode: ``"max"`` or ``"min"``.
        name: the experiment directory name under ``cfg.output.dir``.
        show: print the best-trial summary table and the failed trials' errors.
        max_concurrent_trials: trials run at once (``None``: as many as the cluster's CPUs
            and GPUs fit, each trial's placement group counted whole).
        address: the Ray cluster to join (:func:`trainers.cluster.use_address`: it goes into
            ``RAY_ADDRESS``); default ``RAY_ADDRESS``, a ``ray start`` cluster here, or local.

    Returns:
        A :class:`SweepResult`, best trial first (failed trials last, in ``.failed``).

    Raises:
        ConfigError: a bad dimension, range or metric, or a combination that cannot run
            (before Ray starts); a trial larger than the whole cluster (``ClusterError``).
    """
    if mode not in ("max", "min"):
        raise ConfigError(f"mode must be 'max' or 'min', got {mode!r}")
    counts = {"num_samples": num_samples, "max_concurrent_trials": max_concurrent_trials}
    for field, value in counts.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigError(f"{field} must be an integer ≥ 1, got {value!r}")
    from trainers.cluster import concurrent_trials, ensure_ray, use_address
    from trainers.plan import with_text_defaults

    if address is not None:
        use_address(address)  # the checks below then know the workers are the cluster's
    cfg = with_text_defaults(cfg)  # a chat app's base trains as it is (GRPO, LLM pools)
    validate_space(cfg, param_space, search, metric)
    from ray import tune

    from trainers.run.process import quiet_ray_logs, setup_process
    from trainers.run.rundir import run_name

    quiet_ray_logs()
    setup_process()
    started = ensure_ray(cfg)
    try:
        import ray

        fits = concurrent_trials(_largest_trial(cfg, param_space), ray.cluster_resources())
        storage = Path(cfg.output.dir).expanduser().resolve()
        storage.mkdir(parents=True, exist_ok=True)
        name = name or "sweep__" + run_name(cfg)
        tuner = tune.Tuner(
            tune.with_resources(
                tune.with_parameters(_trial, base=cfg.to_dict()), _trial_resources(cfg, param_space)
            ),
            param_space=_domains(param_space, search),
            tune_config=tune.TuneConfig(
                num_samples=num_samples,
                max_concurrent_trials=max_concurrent_trials or fits,
                trial_dirname_creator=lambda trial: f"trial_{trial.trial_id}",
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=str(storage),
                callbacks=_wandb_callbacks(cfg),
                sync_config=tune.SyncConfig(sync_artifacts=True),  # run/ of every node
                verbose=0,
                log_to_file=True,
            ),
        )
        grid = tuner.fit()
    finally:
        if started:
            ray.shutdown()
    result = _collect(grid, list(param_space), metric, mode, storage / name)
    if show:
        print_sweep(result)
    return result


def _wandb_callbacks(cfg: ExperimentConfig) -> list[Any]:
    if cfg.logging.wandb == "disabled":
        return []
    os.environ["WANDB_MODE"] = cfg.logging.wandb
    os.environ.setdefault("WANDB_SILENT", "true")
    from ray.air.integrations.wandb import WandbLoggerCallback

    return [
        WandbLoggerCallback(
            project=cfg.logging.project, entity=cfg.logging.entity, mode=cfg.logging.wandb
        )
    ]


def _resource_points(cfg: ExperimentConfig, param_space: Mapping[str, Any]) -> list[Any]:
    """The configs of every combination of the ``resources.*`` dimensions (just ``cfg`` when
    none is searched)."""
    keys = [k for k in param_space if k.startswith("resources.")]
    values = [_values(k, param_space[k]) for k in keys]
    return [cfg.replace(**dict(zip(keys, c, strict=True))) for c in itertools.product(*values)]


def _largest_trial(cfg: ExperimentConfig, param_space: Mapping[str, Any]) -> dict[str, float]:
    """The most of each resource one trial may need (its whole placement group)."""
    from trainers.cluster import total, trial_bundles

    need: dict[str, float] = {}
    for point in _resource_points(cfg, param_space):
        for key, value in total(trial_bundles(point)).items():
            need[key] = max(need.get(key, 0.0), value)
    return need


def _trial_resources(cfg: ExperimentConfig, param_space: Mapping[str, Any]) -> Any:
    """Each trial's placement group (a function of its config when resources are searched)."""
    from ray.tune import PlacementGroupFactory

    from trainers.cluster import trial_bundles

    if not any(k.startswith("resources.") for k in param_space):
        return PlacementGroupFactory(trial_bundles(cfg))
    base = cfg.to_dict()

    def resources(config: dict[str, Any]) -> Any:
        return PlacementGroupFactory(
            trial_bundles(ExperimentConfig.from_dict(base).replace(**config))
        )

    return resources


def _collect(grid: Any, keys: list[str], metric: str, mode: str, path: Path) -> SweepResult:
    trials = []
    sign = 1.0 if mode == "max" else -1.0
    for res in grid:
        config = dict(res.config or {})
        history = res.metrics_dataframe
        best = None
        if history is not None and metric in history:
            col = history[metric].dropna()
            if len(col):
                best = float(col.max() if mode == "max" else col.min())
        metrics = res.metrics or {}
        trials.append(
            {
                "params": {k: config.get(k) for k in keys},
                "metric": metrics.get(metric),
                "best": best,
                "oracle_fraction": metrics.get(ORACLE_FRACTION_KEY),
                "iterations": metrics.get("charts/iteration"),
                "run_dir": str(Path(res.path) / "run") if res.path else None,
                "status": "error" if res.error else "ok",
                "error": error_line(res.error) if res.error else None,
            }
        )

    def key(t: dict[str, Any]) -> float:
        v = t["metric"]
        return -sign * float(v) if v is not None else float("inf")

    trials.sort(key=key)
    return SweepResult(trials, metric, path)


def error_line(error: BaseException) -> str:
    """One line for a failed trial: the trial's own exception (Ray wraps it in a
    ``RayTaskError`` whose text is a remote traceback), described as
    :func:`trainers.run.outcome.describe_error` does."""
    from trainers.run.outcome import describe_error

    cause = getattr(error, "cause", None)
    text = describe_error(cause if isinstance(cause, BaseException) else error, limit=600)
    return " ".join(text.split())


def print_sweep(result: SweepResult) -> None:
    """The best-trial summary table (best first), then each failed trial's error."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sweep · ranked by final {result.metric}", title_justify="left")
    table.add_column("#", justify="right")
    keys = list(result.trials[0]["params"]) if result.trials else []
    for k in keys:
        table.add_column(k)
    table.add_column("final", justify="right")
    table.add_column("best", justify="right")
    table.add_column("oracle", justify="right")
    table.add_column("status")
    for i, t in enumerate(result.trials):
        style = "bold green" if i == 0 and t["status"] == "ok" else None
        table.add_row(
            str(i + 1),
            *[_short(t["params"][k]) for k in keys],
            _fmt(t["metric"]),
            _fmt(t["best"]),
            f"{100 * t['oracle_fraction']:.0f}%" if t["oracle_fraction"] is not None else "—",
            t["status"],
            style=style,
        )
    console = Console()
    console.print(table)
    console.print(f"sweep directory: {result.path}", overflow="fold")
    if result.trials and result.trials[0]["run_dir"]:
        console.print(f"best trial run: {result.trials[0]['run_dir']}")
    for t in result.failed:
        params = ", ".join(f"{k}={_short(v)}" for k, v in t["params"].items())
        console.print(f"failed trial ({params}): {t['error']}", markup=False, soft_wrap=True)


def _fmt(value: Any) -> str:
    return "—" if value is None else f"{float(value):.3f}"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = (
        yaml.safe_dump(value, default_flow_style=True).strip()
        if not isinstance(value, str)
        else value
    )
    text = text.removesuffix("...").strip()
    return text if len(text) <= 40 else text[:37] + "..."
