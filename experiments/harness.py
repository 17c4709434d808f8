"""The shared harness: one :class:`~trainers.configs.experiment.ExperimentConfig` per (condition,
seed),
trained with :func:`trainers.run.loop.train` and saved as one JSON file.

Every claim script builds a list of :class:`Condition` objects for a budget (``smoke``,
``default`` or ``full``) and calls :func:`run_claim`. For each condition and seed it

1. trains the config (wandb disabled, no progress bar, no curve PNG, only the final
   checkpoint) in a run directory under ``<out>/<claim>/<budget>/runs/`` (ignored by git);
2. keeps the per-iteration history: env steps, team return, fraction of the oracle where the
   scenario has one, success and the scenario's own metrics (``latency``, ``calls``…);
3. optionally evaluates the final checkpoint greedily (:func:`trainers.evaluate.evaluate`);
4. writes ``<out>/<claim>/<budget>/<condition>/seed<k>.json`` atomically.

A seed whose JSON exists with the same config is skipped, so an interrupted claim resumes where
it stopped (a changed config is trained again), and the report can be rebuilt from the JSON
files alone. One Ray instance serves every run of a process
(started here, before the first run, and shut down at the end; :func:`trainers.run.loop.train`
leaves a Ray it did not start running).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

# before torch is imported anywhere: extra OpenMP threads only spin-wait on a small CPU box
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `bench` (a plain folder) and this checkout's packages
    sys.path.insert(0, str(ROOT))

#: default parent of every claim's results.
RESULTS = ROOT / "experiments" / "results"
BUDGETS: tuple[str, ...] = ("smoke", "default", "full")
SCHEMA = 1

#: what ``--smoke`` changes in every config: a few hundred env steps an iteration, one epoch.
SMOKE_CONFIG: dict[str, Any] = {
    "algorithm": {"train_batch_size": 128, "minibatch_size": 64, "num_epochs": 1},
    "resources": {"num_envs_per_env_runner": 2},
}


@dataclasses.dataclass
class Condition:
    """One arm of an experiment: a config (without seed, logging and output) and its labels.

    Attributes:
        name: directory-safe id, unique within the claim (``"orchestrator"``, ``"n4-parallel"``).
        label: human label for tables and plots.
        config: :meth:`ExperimentConfig.from_dict` input; ``seed``, ``logging`` and ``output``
            are set by the harness.
        params: what distinguishes this arm, for grouping in the report (``{"n": 4}``).
        eval_episodes: greedy evaluation episodes of the final checkpoint (0: none).
        extra: anything the report needs besides the run (e.g. parameter counts).
    """

    name: str
    label: str
    config: dict[str, Any]
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    eval_episodes: int = 0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Context:
    """Where a claim's results go, and with which budget and command."""

    claim: str
    budget: str
    out: Path
    command: str
    quiet: bool = False

    @property
    def dir(self) -> Path:
        """``<out>/<claim>/<budget>``."""
        return self.out / self.claim / self.budget

    def record_path(self, condition: str, seed: int) -> Path:
        """The JSON file of one (condition, seed)."""
        return self.dir / condition / f"seed{seed}.json"

    def log(self, message: str) -> None:
        """One progress line (suppressed with ``quiet``)."""
        if not self.quiet:
            print(f"[{self.claim}/{self.budget}] {message}", flush=True)


# ----- command line -------------------------------------------------------------------------
def parser(claim: str, description: str) -> argparse.ArgumentParser:
    """The options every claim script takes; a script may add its own before parsing."""
    p = argparse.ArgumentParser(prog=f"python -m experiments.{claim}", description=description)
    p.add_argument("--seeds", type=int, default=3, help="seeds per condition (default 3)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="the bigger budget (slower)")
    size.add_argument("--smoke", action="store_true", help="a tiny budget, to test the pipeline")
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help=f"results root (default {RESULTS.relative_to(ROOT)}); files go to "
        "<out>/<claim>/<budget>/",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def context(claim: str, args: argparse.Namespace, argv: Sequence[str] | None) -> Context:
    """The run context of parsed ``args`` (``argv``: the arguments given, for the record)."""
    if args.seeds < 1:
        raise SystemExit(f"--seeds must be ≥ 1, got {args.seeds}")
    budget = "smoke" if args.smoke else "full" if args.full else "default"
    given = list(sys.argv[1:] if argv is None else argv)
    command = " ".join(["python", "-m", f"experiments.{claim}", *given]).strip()
    return Context(claim, budget, Path(args.out).expanduser().resolve(), command, args.quiet)


# ----- running ------------------------------------------------------------------------------
def deep_merge(base: Mapping[str, Any], *updates: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``base`` with ``updates`` merged in (nested dicts merge, others replace)."""
    out = copy.deepcopy(dict(base))
    for update in updates:
        for key, value in update.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), dict):
                out[key] = deep_merge(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


def make_config(ctx: Context, cond: Condition, seed: int) -> Any:
    """The :class:`ExperimentConfig` of ``cond`` for ``seed``: quiet, no plots, one checkpoint."""
    from trainers.configs.experiment import ExperimentConfig

    grpo = cond.config.get("algorithm", {}).get("name") == "GRPO"  # no batch-size fields
    base = SMOKE_CONFIG if ctx.budget == "smoke" and not grpo else {}
    fixed = {
        "seed": seed,
        "logging": {"wandb": "disabled", "progress": False},
        "output": {
            "dir": str(ctx.dir / "runs"),
            "name": f"{cond.name}__seed{seed}",
            "checkpoint_every": 0,
            "plot": False,
        },
    }
    return ExperimentConfig.from_dict(deep_merge(base, cond.config, fixed))


def compact_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a ``metrics.jsonl`` row the report uses: ``charts/…`` without the prefix,
    ``curriculum/…`` and ``timers/…`` as they are, and per-agent credit as ``credit/<agent>``."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key.startswith("charts/"):
            out[key.removeprefix("charts/")] = value
        elif key.startswith(("curriculum/", "timers/")):  # curriculum metrics, phase timers
            out[key] = value
        elif key.endswith("/credit") and key.count("/") == 1:
            out[f"credit/{key.split('/')[0]}"] = value
    return out


#: environments by (scenario, topology, kwargs), kept for the whole process (see scenario_env).
_ENVS: dict[str, Any] = {}


def scenario_env(scenario: str, topology: Any, kwargs: Mapping[str, Any]) -> Any:
    """One :class:`~scenarios.graph_env.GraphEnv` per scenario setting for the whole process.

    Evaluations of several seeds (and oracle references) then share one scenario instance and
    whatever it caches: ``delegate``'s exact oracle fills its dynamic-programming tables lazily,
    which took about 80 s for ``star:8`` with 8 parts in sequential mode.
    """
    key = json.dumps([scenario, topology, dict(kwargs)], sort_keys=True, default=str)
    if key not in _ENVS:
        from scenarios.registry import make

        _ENVS[key] = make(scenario, topology=topology, **dict(kwargs))
    return _ENVS[key]


def evaluation(checkpoint: Path, episodes: int) -> dict[str, Any]:
    """Greedy evaluation of ``checkpoint`` as :func:`trainers.evaluate.evaluate` does it (same
    episode runner, seeds and summary, no per-agent credit), on the process-wide environment of
    its scenario; plus the mean of every scenario metric over the episodes (``metrics``)."""
    import numpy as np

    from trainers.evaluate import evaluate

    def make_env(ec: Mapping[str, Any]) -> Any:
        return scenario_env(ec["scenario"], ec.get("topology"), ec.get("kwargs", {}))

    result = evaluate(checkpoint, episodes, credit="team", show=False, make_env=make_env)
    keys = sorted({k for ep in result.episodes for k in ep["metrics"]})
    metrics = {
        k: float(np.mean([ep["metrics"][k] for ep in result.episodes if k in ep["metrics"]]))
        for k in keys
    }
    return {"summary": dict(result.summary), "metrics": metrics}


def run_seed(ctx: Context, cond: Condition, seed: int) -> dict[str, Any]:
    """Train (and evaluate) one condition for one seed; write and return its record."""
    from trainers.run.loop import train

    cfg = make_config(ctx, cond, seed)
    started = time.time()
    result = train(cfg)
    train_s = time.time() - started
    ev = None
    if cond.eval_episodes > 0 and result.final_checkpoint is not None:
        ev = evaluation(result.final_checkpoint, cond.eval_episodes)
    record = {
        "schema": SCHEMA,
        "kind": "run",
        "claim": ctx.claim,
        "budget": ctx.budget,
        "condition": cond.name,
        "label": cond.label,
        "params": cond.params,
        "seed": seed,
        "status": result.status,
        "command": ctx.command,
        "config": cfg.to_dict(),
        "run_dir": str(result.run_dir),
        "iterations": result.iterations,
        "env_steps": result.env_steps,
        "train_s": train_s,
        "wall_s": time.time() - started,
        "history": [compact_row(h) for h in result.history],
        "eval": ev,
        "extra": cond.extra,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
    }
    write_json(ctx.record_path(cond.name, seed), record)
    return record


def run_claim(
    ctx: Context,
    conditions: Sequence[Condition],
    seeds: int,
    *,
    describe: Callable[[dict[str, Any]], str] | None = None,
) -> list[dict[str, Any]]:
    """Run every condition for seeds ``0 … seeds-1``, skipping those already saved with the
    same config (a saved run whose config differs, e.g. after a budget change, is redone and
    overwritten, so one budget directory never mixes settings).

    Conditions are interleaved by seed (seed 0 of every condition first), so a claim stopped
    early still has comparable arms. Returns the records (loaded for skipped seeds).

    Raises:
        SystemExit: some runs failed (after trying every other run); rerun to retry them.
    """
    records, failed = [], []
    total = len(conditions) * seeds
    done = 0
    with ray_for():
        for seed in range(seeds):
            for cond in conditions:
                done += 1
                path = ctx.record_path(cond.name, seed)
                if path.exists():
                    saved = read_json(path)
                    if saved.get("config") == plain(make_config(ctx, cond, seed).to_dict()):
                        records.append(saved)
                        ctx.log(f"({done}/{total}) {cond.name} seed {seed}: saved, skipped")
                        continue
                    ctx.log(
                        f"({done}/{total}) {cond.name} seed {seed}: saved with another config "
                        "(the script's budget or settings changed): training again"
                    )
                ctx.log(f"({done}/{total}) {cond.name} seed {seed}: training…")
                try:
                    record = run_seed(ctx, cond, seed)
                except Exception as exc:  # keep going: the other arms are still worth having
                    failed.append(f"{cond.name} seed {seed}: {type(exc).__name__}: {exc}")
                    ctx.log(f"FAILED {failed[-1]}")
                    continue
                records.append(record)
                ctx.log(f"({done}/{total}) {cond.name} seed {seed}: {summary_line(record)}")
                if describe is not None:
                    ctx.log("    " + describe(record))
    if failed:
        raise SystemExit(
            f"{len(failed)} run(s) failed (rerun the same command to retry only those):\n  "
            + "\n  ".join(failed)
        )
    ctx.log(f"results in {ctx.dir}")
    return records


@contextlib.contextmanager
def ray_for() -> Iterator[None]:
    """One local Ray for every run of this process (left alone when one is already running)."""
    import ray

    from trainers.cluster import ensure_ray
    from trainers.configs.experiment import ExperimentConfig
    from trainers.run.process import quiet_ray_logs

    quiet_ray_logs()
    started = ensure_ray(ExperimentConfig())
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def summary_line(record: Mapping[str, Any]) -> str:
    """``it 40 · 40.3k steps · return 0.71 · oracle 88% · eval … · 95 s`` for a progress line."""
    last = record["history"][-1] if record["history"] else {}
    parts = [f"it {record['iterations']}", f"{record['env_steps'] / 1000:.1f}k steps"]
    if "team_return" in last:
        parts.append(f"return {last['team_return']:.3f}")
    if "oracle_fraction" in last:
        parts.append(f"oracle {100 * last['oracle_fraction']:.0f}%")
    ev = (record.get("eval") or {}).get("summary") or {}
    if ev:
        text = f"eval return {ev.get('return', float('nan')):.3f}"
        if "oracle_fraction" in ev:
            text += f", oracle {100 * ev['oracle_fraction']:.0f}%"
        if "latency" in ev:
            text += f", latency {ev['latency']:.2f}"
        parts.append(text)
    parts.append(f"{record['wall_s']:.0f} s")
    return " · ".join(parts)


# ----- files --------------------------------------------------------------------------------
def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (a half-written file is never left behind)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=_json_default) + "\n")
    os.replace(tmp, path)


def plain(data: Any) -> Any:
    """``data`` as it reads back from JSON (tuples become lists…), for comparisons."""
    return json.loads(json.dumps(data, default=_json_default))


def read_json(path: Path) -> Any:
    """Read one JSON file."""
    return json.loads(Path(path).read_text())


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def save_extra(ctx: Context, name: str, data: Mapping[str, Any]) -> Path:
    """Save a non-run record (a reference measurement, an unsupported arm…) as
    ``<out>/<claim>/<budget>/<name>.json``; ``data`` should carry a ``kind``."""
    path = ctx.dir / f"{name}.json"
    payload = {
        "schema": SCHEMA,
        "claim": ctx.claim,
        "budget": ctx.budget,
        "command": ctx.command,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **data,
    }
    write_json(path, payload)
    return path


def load_records(out: Path, claim: str, budget: str) -> list[dict[str, Any]]:
    """Every JSON record of a claim and budget (runs and extras), in a stable order."""
    base = Path(out) / claim / budget
    if not base.is_dir():
        return []
    files = sorted(p for p in base.rglob("*.json") if "runs" not in p.relative_to(base).parts)
    return [read_json(p) for p in files]


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded next to every run."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
    }
    for name in ("ray", "torch", "numpy", "mpe2"):
        with contextlib.suppress(Exception):
            info[name] = __import__(name).__version__
    with contextlib.suppress(Exception):
        info["git"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    return info


def iteration_budgets(default: int, full: int = 100) -> dict[str, dict[str, Any]]:
    """A claim's budgets in training iterations, with greedy evaluation episodes."""
    return {
        "smoke": {"iterations": 2, "eval": 3},
        "default": {"iterations": default, "eval": 100},
        "full": {"iterations": full, "eval": 200},
    }


def run_as_script(main: Callable[[], Any]) -> None:
    """``python -m experiments.<claim>``: fix ``PYTHONHASHSEED`` (see :func:`fixed_hash_seed`),
    then run the claim's ``main``."""
    fixed_hash_seed()
    main()


def fixed_hash_seed() -> None:
    """Re-exec with ``PYTHONHASHSEED=0`` when unset, like the ``marl`` CLI (RLlib orders agents
    through sets: without it, runs with the same seed differ across processes)."""
    from trainers.cli_common import fixed_hash_seed as _fixed

    _fixed()
