"""``marl run``, ``marl sweep`` and ``marl eval``: training commands for the ``marl`` app.

:func:`register` adds the commands to the main app (``scenarios/cli.py``). Ray and torch are
imported inside the commands only, so ``marl --help`` stays fast. ``python -m trainers.cli``
runs the same commands standalone.

Runs are bit-reproducible only with a fixed ``PYTHONHASHSEED`` (RLlib orders agents through
sets): when it is unset, the commands re-execute the process once with ``PYTHONHASHSEED=0``.

A scenario may be an import reference to your own module (``marl run myapp.team:scenario``):
like ``python -m``, the commands import it from the current directory as well (a console script
does not put it on ``sys.path``), and Ray's workers get the same path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

SCENARIO_HELP = "Scenario: a registered name (marl scenarios) or package.module:attr naming your own Scenario subclass, instance or a function returning one (default: the config's, or delegate); an experiment YAML path works as --config."  # noqa: E501
TRAIN_HELP = "Agent or pool ids that learn, comma-separated (default: all). 'orchestrator' trains the orchestrator against frozen subagents."  # noqa: E501


def fixed_hash_seed() -> None:
    """Re-exec with ``PYTHONHASHSEED=0`` when unset (not under pytest's in-process runner)."""
    if "PYTHONHASHSEED" in os.environ or "PYTEST_CURRENT_TEST" in os.environ:
        return
    os.environ["PYTHONHASHSEED"] = "0"
    argv = list(getattr(sys, "orig_argv", [])) or [sys.executable, *sys.argv]
    try:
        os.execv(sys.executable, [sys.executable, *argv[1:]])
    except OSError:  # cannot re-exec: carry on, reproducible within this process only
        return


def cwd_on_path() -> None:
    """Put the working directory on ``sys.path`` (a console script does not), so scenario
    references to modules next to the user import as they would under ``python -m``."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _split(text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    return None if items in ([], ["all"]) else items


def fail(message: str, code: int = 2) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    raise typer.Exit(code=code)


def run_command(
    scenario: Annotated[str | None, typer.Argument(help=SCENARIO_HELP)] = None,
    topology: Annotated[
        str | None, typer.Option(help="Topology spec, e.g. star:3 or single.")
    ] = None,
    train: Annotated[str | None, typer.Option(help=TRAIN_HELP)] = None,
    credit: Annotated[str | None, typer.Option(help="Credit: team, local, loo or shapley.")] = None,
    iterations: Annotated[int | None, typer.Option(help="Training iterations.")] = None,
    env_steps: Annotated[int | None, typer.Option(help="Stop after this many env steps.")] = None,
    time_s: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
    seed: Annotated[int | None, typer.Option(help="Experiment seed.")] = None,
    algo: Annotated[str | None, typer.Option(help="PPO, APPO or IMPALA.")] = None,
    sharing: Annotated[
        str | None, typer.Option(help="Pooling: role (default), agent, team or explicit.")
    ] = None,
    output: Annotated[
        Path | None, typer.Option(help="Parent directory of run directories (default runs/).")
    ] = None,
    wandb: Annotated[
        str | None, typer.Option(help="wandb mode: offline (default), online or disabled.")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Experiment YAML; options override it.")
    ] = None,
    resume: Annotated[
        Path | None, typer.Option(help="Continue a run directory or checkpoint.")
    ] = None,
    dump: Annotated[
        bool, typer.Option("--dump", help="Print the resolved config YAML and exit.")
    ] = False,
) -> None:
    """Train a team on a scenario: progress bar, summary table, learning-curve PNG."""
    from trainers.config import ConfigError, ExperimentConfig

    cwd_on_path()
    if scenario is not None and config is None and scenario.endswith((".yaml", ".yml")):
        config, scenario = Path(scenario), None  # `marl run experiment.yaml`
    try:
        cfg = ExperimentConfig.from_yaml(config) if config else ExperimentConfig()
        if resume is not None and config is None:
            from trainers.run import find_checkpoint

            _, run_dir = find_checkpoint(resume)
            cfg = ExperimentConfig.from_yaml(run_dir / "config.yaml")
        changes: dict[str, Any] = {}
        for key, value in (
            ("scenario", scenario),
            ("topology", topology),
            ("credit.method", credit),
            ("budget.iterations", iterations),
            ("seed", seed),
            ("algorithm.name", algo),
            ("sharing", sharing),
            ("output.dir", str(output) if output else None),
            ("logging.wandb", wandb),
        ):
            if value is not None:
                changes[key] = value
        if train is not None:
            changes["train"] = _split(train)
        if env_steps is not None or time_s is not None:
            changes["budget.env_steps"] = env_steps
            changes["budget.time_s"] = time_s
            if iterations is None:
                changes["budget.iterations"] = None
        cfg = cfg.replace(**changes) if changes else cfg
        from trainers.algo import with_text_defaults

        cfg = with_text_defaults(cfg)
        if dump:
            typer.echo(cfg.to_yaml(), nl=False)
            return
        cfg.check()
    except ConfigError as exc:
        fail(str(exc))
    fixed_hash_seed()
    from trainers.run import RunFailed
    from trainers.run import train as run_train

    try:
        result = run_train(cfg, resume=resume)
    except ConfigError as exc:
        fail(str(exc))
    except RunFailed as exc:  # every episode failed: the error, not a traceback
        where = f" (run directory: {exc.result.run_dir})" if exc.result is not None else ""
        fail(f"{exc}{where}", code=1)
    except KeyboardInterrupt as exc:
        notes = " ".join(getattr(exc, "__notes__", []))
        typer.echo(f"interrupted; metrics and a checkpoint were saved. {notes}", err=True)
        raise typer.Exit(code=130) from None
    if result.status != "completed":
        raise typer.Exit(code=1)


def sweep_command(
    file: Annotated[Path, typer.Argument(help="Sweep YAML: base, param_space, search, ...")],
) -> None:
    """Run a Ray Tune sweep (grid or random; topology, pools and credit can be dimensions)."""
    from trainers.config import ConfigError
    from trainers.sweep import SweepSpec

    cwd_on_path()
    try:
        spec = SweepSpec.from_yaml(file)
    except (ConfigError, OSError) as exc:
        fail(str(exc))
    fixed_hash_seed()
    from trainers.sweep import sweep

    try:
        sweep(
            spec.base,
            spec.param_space,
            search=spec.search,
            num_samples=spec.num_samples,
            metric=spec.metric,
            mode=spec.mode,
            name=spec.name,
        )
    except ConfigError as exc:
        fail(str(exc))


def eval_command(
    checkpoint: Annotated[Path, typer.Argument(help="A run directory or checkpoint.")],
    episodes: Annotated[int, typer.Option(help="Episodes to run.")] = 100,
    seed: Annotated[int | None, typer.Option(help="First episode seed.")] = None,
    credit: Annotated[
        str | None, typer.Option(help="Credit to report (default: the run's method).")
    ] = None,
    transcripts: Annotated[
        int, typer.Option(help="Print this many episodes as transcripts: who saw and did what.")
    ] = 0,
) -> None:
    """Evaluate a checkpoint greedily: success, return, fraction of oracle, credit, latency."""
    from trainers.config import ConfigError
    from trainers.evaluate import EVAL_SEED, evaluate

    cwd_on_path()
    try:
        evaluate(
            checkpoint,
            episodes,
            seed=EVAL_SEED if seed is None else seed,
            credit=credit,
            transcripts=transcripts,
        )
    except ConfigError as exc:
        fail(str(exc))


def register(app: typer.Typer) -> None:
    """Add ``run``, ``sweep`` and ``eval`` to the main ``marl`` app."""
    app.command("run")(run_command)
    app.command("sweep")(sweep_command)
    app.command("eval")(eval_command)


app = typer.Typer(
    name="marl-train",
    help="Training commands (also available as `marl run|sweep|eval`).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
register(app)


if __name__ == "__main__":
    app()
