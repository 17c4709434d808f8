"""``sweep(cfg, param_space)``: Ray Tune over experiment configs, one trial at a time.

Search dimensions are dotted paths into :class:`~trainers.config.ExperimentConfig`, so the
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
``{"loguniform": [lo, hi]}`` or ``{"randint": [lo, hi]}``. Every categorical combination is
validated (:func:`trainers.algo.resolve`) before Ray starts. Each trial runs
:func:`trainers.run.train` inside one Tune actor with everything local to it (one CPU; no
remote env runners or learners), trials run sequentially, and each trial gets its own offline
wandb run (``WandbLoggerCallback``).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from trainers.config import ConfigError, ExperimentConfig
from trainers.run import ORACLE_FRACTION_KEY, RETURN_KEY

DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "randint")


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
    """

    base: ExperimentConfig
    param_space: dict[str, Any]
    search: str = "grid"
    num_samples: int = 1
    metric: str = RETURN_KEY
    mode: str = "max"
    name: str | None = None

    @classmethod
    def from_yaml(cls, source: str | Path) -> SweepSpec:
        """Load ``{base: {...}, param_space: {...}, search, num_samples, metric, mode, name}``."""
        text = str(source)
        if isinstance(source, Path) or ("\n" not in text and text.endswith((".yaml", ".yml"))):
            text = Path(source).read_text()
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"sweep file is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError("a sweep file must be a mapping with base: and param_space:")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"sweep file: unknown field(s) {unknown}; valid are {sorted(known)}")
        if "param_space" not in data:
            raise ConfigError("sweep file: param_space is missing (dotted path → values)")
        base = ExperimentConfig.from_dict(data.get("base") or {})
        return cls(base=base, **{k: v for k, v in data.items() if k != "base"})


def _domains(param_space: Mapping[str, Any], search: str) -> dict[str, Any]:
    from ray import tune

    out: dict[str, Any] = {}
    for key, spec in param_space.items():
        if isinstance(spec, list):
            out[key] = tune.grid_search(spec) if search == "grid" else tune.choice(spec)
            continue
        if not isinstance(spec, Mapping) or len(spec) != 1 or next(iter(spec)) not in DISTRIBUTIONS:
            raise ConfigError(
                f"param_space[{key!r}] must be a list or one of "
                f"{{{', '.join(DISTRIBUTIONS)}: ...}}, got {spec!r}"
            )
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


def _categorical(spec: Any) -> list[Any] | None:
    if isinstance(spec, list):
        return spec
    if isinstance(spec, Mapping) and len(spec) == 1:
        ((kind, args),) = spec.items()
        if kind in ("grid", "choice"):
            return list(args)
        if kind in ("uniform", "loguniform", "randint"):
            return list(args)  # check both ends
    return None


def validate_space(base: ExperimentConfig, param_space: Mapping[str, Any], search: str) -> int:
    """Resolve every categorical combination (and both ends of each range) without Ray.

    Returns:
        The number of combinations checked.

    Raises:
        ConfigError: a combination that cannot run, naming its values.
    """
    from trainers.algo import resolve

    if search not in ("grid", "random"):
        raise ConfigError(f"search must be 'grid' or 'random', got {search!r}")
    if not param_space:
        raise ConfigError("param_space is empty: give at least one dimension to search")
    keys, values = [], []
    for key, spec in param_space.items():
        cats = _categorical(spec)
        if cats is None or not cats:
            raise ConfigError(f"param_space[{key!r}]: no values in {spec!r}")
        keys.append(key)
        values.append(cats)
    count = 0
    for combo in itertools.product(*values):
        changes = dict(zip(keys, combo, strict=True))
        try:
            resolve(base.replace(**changes))
        except ConfigError as exc:
            raise ConfigError(f"sweep point {changes}: {exc}") from None
        count += 1
    return count


def _trial(config: dict[str, Any], base: dict[str, Any]) -> None:
    """One Tune trial: the base config with this trial's values, trained to its budget."""
    from ray import tune

    from trainers.run import train

    cfg = ExperimentConfig.from_dict(base).replace(**config)
    cfg.logging.wandb = "disabled"  # the WandbLoggerCallback logs each trial
    cfg.logging.progress = False
    run_dir = Path(tune.get_context().get_trial_dir()) / "run"
    train(cfg, report=lambda row: tune.report(dict(row)), run_dir=run_dir)


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
) -> SweepResult:
    """Run a Ray Tune sweep over ``param_space`` around ``cfg``; trials run one at a time.

    Args:
        cfg: the base experiment.
        param_space: dotted path → values or distribution (see the module docstring).
        search: ``"grid"`` (lists are grids) or ``"random"`` (lists are choices).
        num_samples: repeats per grid point / number of random trials.
        metric: trials are ranked by this metric's final value.
        mode: ``"max"`` or ``"min"``.
        name: the experiment directory name under ``cfg.output.dir``.
        show: print the best-trial summary table.

    Returns:
        A :class:`SweepResult`, best trial first.

    Raises:
        ConfigError: a bad dimension or a combination that cannot run (before Ray starts).
    """
    if mode not in ("max", "min"):
        raise ConfigError(f"mode must be 'max' or 'min', got {mode!r}")
    if num_samples < 1:
        raise ConfigError(f"num_samples must be ≥ 1, got {num_samples}")
    from trainers.algo import with_text_defaults

    cfg = with_text_defaults(cfg)  # a chat app's base trains as it is (GRPO, LLM pools)
    validate_space(cfg, param_space, search)
    from ray import tune

    from trainers.run import ensure_ray, quiet_ray_logs, run_name, setup_process

    quiet_ray_logs()
    setup_process()
    started = ensure_ray(cfg)
    storage = Path(cfg.output.dir).expanduser().resolve()
    storage.mkdir(parents=True, exist_ok=True)
    name = name or "sweep__" + run_name(cfg)
    callbacks = []
    if cfg.logging.wandb != "disabled":
        os.environ["WANDB_MODE"] = cfg.logging.wandb
        os.environ.setdefault("WANDB_SILENT", "true")
        from ray.air.integrations.wandb import WandbLoggerCallback

        callbacks.append(
            WandbLoggerCallback(
                project=cfg.logging.project, entity=cfg.logging.entity, mode=cfg.logging.wandb
            )
        )
    cpus = 1 + cfg.resources.num_env_runners + cfg.resources.num_learners
    trainable = tune.with_resources(tune.with_parameters(_trial, base=cfg.to_dict()), {"cpu": cpus})
    tuner = tune.Tuner(
        trainable,
        param_space=_domains(param_space, search),
        tune_config=tune.TuneConfig(
            num_samples=num_samples,
            max_concurrent_trials=1,
            trial_dirname_creator=lambda trial: f"trial_{trial.trial_id}",
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(storage),
            callbacks=callbacks,
            verbose=0,
            log_to_file=True,
        ),
    )
    try:
        grid = tuner.fit()
    finally:
        if started:
            import ray

            ray.shutdown()
    result = _collect(grid, list(param_space), metric, mode, storage / name)
    if show:
        print_sweep(result)
    return result


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
                "error": str(res.error) if res.error else None,
            }
        )

    def key(t: dict[str, Any]) -> float:
        v = t["metric"]
        return -sign * float(v) if v is not None else float("inf")

    trials.sort(key=key)
    return SweepResult(trials, metric, path)


def print_sweep(result: SweepResult) -> None:
    """The best-trial summary table (best first)."""
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
