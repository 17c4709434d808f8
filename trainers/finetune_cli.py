"""``marl finetune JOB.yaml``: run an orchestrator fine-tuning job.

:func:`register` adds the command to a Typer app (the ``marl`` app, wired in
``trainers/cli.py``). Torch, Ray and transformers load inside the command only, so
``marl --help`` stays fast. ``python -m trainers.finetune_cli JOB.yaml`` runs it standalone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainers.cli_common import (
    DumpOption,
    OutputOption,
    SeedOption,
    WandbOption,
    cwd_on_path,
    fail,
    fixed_hash_seed,
)


def finetune_command(
    job: Annotated[Path, typer.Argument(help="Job YAML (see examples/finetune_tiny.yaml).")],
    iterations: Annotated[
        int | None, typer.Option(help="Override budget.iterations (and drop budget.time_s).")
    ] = None,
    output: OutputOption = None,
    seed: SeedOption = None,
    wandb: WandbOption = None,
    dump: DumpOption = False,
) -> None:
    """Fine-tune an LLM orchestrator with token-level GRPO against frozen subagents."""
    from trainers.config import ConfigError
    from trainers.finetune import FinetuneJob

    cwd_on_path()
    try:
        spec = FinetuneJob.from_yaml(job)
        if iterations is not None:
            spec.budget.iterations, spec.budget.time_s = iterations, None
        if output is not None:
            spec.output_dir = str(output)
        if seed is not None:
            spec.seed = seed
        if wandb is not None:
            spec.logging.wandb = wandb
        if dump:
            typer.echo(spec.to_yaml(), nl=False)
            return
        spec.check()
    except ConfigError as exc:
        fail(str(exc))
    fixed_hash_seed()
    from trainers.finetune import run_finetune

    try:
        result = run_finetune(spec)
    except ConfigError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(code=130) from None
    if result.summary.get("status") != "completed":
        raise typer.Exit(code=1)


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
