"""``marl finetune JOB.yaml``: run an orchestrator fine-tuning job.

:func:`register` adds the command to a Typer app (the ``marl`` app, wired in
``trainers/cli.py``). Torch, Ray and transformers load inside the command only, so
``marl --help`` stays fast. ``python -m trainers.finetune_cli JOB.yaml`` runs it standalone.
``--resume RUN_DIR`` continues a run (its own ``job.yaml`` unless a job is given) until the
budget, counted from the run's first iteration, is spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from trainers.cli_common import (
    AddressOption,
    DumpOption,
    OutputOption,
    SeedOption,
    WandbOption,
    config_errors,
    cwd_on_path,
    launch,
)


def finetune_command(
    job: Annotated[
        Path | None,
        typer.Argument(help="Job YAML (see examples/finetune_tiny.yaml); --resume: the run's."),
    ] = None,
    iterations: Annotated[
        int | None, typer.Option(help="Override budget.iterations (and drop the other limits).")
    ] = None,
    output: OutputOption = None,
    seed: SeedOption = None,
    wandb: WandbOption = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Continue a fine-tuning run directory (or a checkpoint in one)."),
    ] = None,
    dump: DumpOption = False,
    address: AddressOption = None,
) -> None:
    """Fine-tune an LLM orchestrator with token-level GRPO against frozen subagents."""
    from trainers.config import BudgetConfig

    cwd_on_path()
    with config_errors():
        spec = _load_job(job, resume)
        if iterations is not None:
            spec.budget = BudgetConfig(iterations=iterations)
        if output is not None:
            spec.output.dir = str(output)
        if seed is not None:
            spec.seed = seed
        if wandb is not None:
            spec.logging.wandb = wandb

    def start(job: Any) -> Any:
        from trainers.finetune import run_finetune

        return run_finetune(job, resume=resume)

    launch(spec, start, dump=dump, address=address)


def _load_job(job: Path | None, resume: Path | None) -> Any:
    """The job YAML given, else the job of the run being resumed.

    Raises:
        ConfigError: neither given, or a bad file.
    """
    from trainers.config import ConfigError
    from trainers.finetune import FinetuneJob

    if job is not None:
        return FinetuneJob.from_yaml(job)
    if resume is None:
        raise ConfigError("no job: give a job YAML (marl finetune JOB.yaml) or --resume RUN_DIR")
    from trainers.run import find_checkpoint

    return FinetuneJob.from_yaml(find_checkpoint(resume)[1] / "job.yaml")


def register(app: typer.Typer) -> None:
    """Add ``finetune`` to ``app`` (the ``marl`` app)."""
    app.command("finetune")(finetune_command)


app = typer.Typer(
    name="marl-finetune",
    help="Orchestrator fine-tuning (also available as `marl finetune`).",
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(finetune_command)


if __name__ == "__main__":
    app()
