"""The ``marl`` command line, assembled in the top layer from the commands of every package.

``marl topology`` (:mod:`topologies.cli`), ``marl scenarios`` (:mod:`scenarios.cli`),
``marl run | sweep | eval | serve | finetune | replay-updates`` (here).
Ray and torch are imported inside the commands only, so ``marl --help`` stays fast.
``python -m trainers.cli`` is the same app (the ``marl`` console script points here).

The training commands re-execute the process once with ``PYTHONHASHSEED=0`` when it is unset
(runs are bit-reproducible only then). A scenario may be an import reference to your own
module (``marl run myapp.team:scenario``): like ``python -m``, the commands import it from the
current directory as well, and Ray's workers get the same path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from scenarios.cli import register as register_scenarios
from topologies.cli import app as topology_app
from trainers.cli_common import (
    AddressOption,
    DumpOption,
    OutputOption,
    SeedOption,
    WandbOption,
    config_errors,
    cwd_on_path,
    fail,
    fixed_hash_seed,
    launch,
)
from trainers.cluster import use_address

SCENARIO_HELP = "Scenario: a registered name (marl scenarios) or package.module:attr naming your own Scenario subclass, instance or a function returning one (default: the config's, or delegate); an experiment YAML path works as --config."  # noqa: E501
TRAIN_HELP = "Agent or pool ids that learn, comma-separated (default: all). 'orchestrator' trains the orchestrator against frozen subagents."  # noqa: E501


def _split(text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    return None if items in ([], ["all"]) else items


def _experiment(config: Path | None, resume: Path | None, changes: dict[str, Any]) -> Any:
    """The experiment: the YAML's (or the resumed run's, or the defaults), with ``changes``."""
    from trainers.configs.experiment import ExperimentConfig
    from trainers.plan import with_text_defaults

    cfg = ExperimentConfig.from_yaml(config) if config else ExperimentConfig()
    if resume is not None and config is None:
        from trainers.run.rundir import find_checkpoint

        _, run_dir = find_checkpoint(resume)
        cfg = ExperimentConfig.from_yaml(run_dir / "config.yaml")
    return with_text_defaults(cfg.replace(**changes) if changes else cfg)


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
    seed: SeedOption = None,
    algo: Annotated[str | None, typer.Option(help="PPO, MAPPO, IPPO, APPO or IMPALA.")] = None,
    sharing: Annotated[
        str | None, typer.Option(help="Pooling: role (default), agent, team or explicit.")
    ] = None,
    output: OutputOption = None,
    wandb: WandbOption = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Experiment YAML; options override it.")
    ] = None,
    resume: Annotated[
        Path | None, typer.Option(help="Continue a run directory or checkpoint.")
    ] = None,
    rollouts: Annotated[
        bool | None,
        typer.Option(
            "--rollouts/--no-rollouts",
            help="Save every learner update's input for marl replay-updates (output.rollouts).",
        ),
    ] = None,
    dump: DumpOption = False,
    address: AddressOption = None,
) -> None:
    """Train a team on a scenario: progress bar, summary table, learning-curve PNG."""
    cwd_on_path()
    if scenario is not None and config is None and scenario.endswith((".yaml", ".yml")):
        config, scenario = Path(scenario), None  # `marl run experiment.yaml`
    changes: dict[str, Any] = {
        key: value
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
            ("output.rollouts", rollouts),
        )
        if value is not None
    }
    if train is not None:
        changes["train"] = _split(train)
    if env_steps is not None or time_s is not None:
        changes["budget.env_steps"] = env_steps
        changes["budget.time_s"] = time_s
        if iterations is None:
            changes["budget.iterations"] = None
    with config_errors():
        cfg = _experiment(config, resume, changes)

    def start(cfg: Any) -> Any:
        from trainers.run.loop import train

        return train(cfg, resume=resume)

    launch(cfg, start, dump=dump, address=address)


def sweep_command(
    file: Annotated[Path, typer.Argument(help="Sweep YAML: base, param_space, search, ...")],
    address: AddressOption = None,
) -> None:
    """Run a Ray Tune sweep (grid or random; topology, pools and credit can be dimensions);
    exits 1, listing their errors, when trials failed."""
    from trainers.sweep import SweepSpec

    cwd_on_path()
    with config_errors():
        try:
            spec = SweepSpec.from_yaml(file)
        except OSError as exc:
            fail(str(exc))
        use_address(address)
    fixed_hash_seed()
    from trainers.sweep import sweep

    with config_errors():
        result = sweep(
            spec.base,
            spec.param_space,
            search=spec.search,
            num_samples=spec.num_samples,
            metric=spec.metric,
            mode=spec.mode,
            name=spec.name,
            max_concurrent_trials=spec.max_concurrent_trials,
        )
    if result.failed:
        fail(f"{len(result.failed)} of {len(result.trials)} trials failed (errors above)", code=1)


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
    k: Annotated[
        int | None,
        typer.Option(
            "--k", help="Sample each of the --episodes tasks k times: pass@k, mean@k, best@k."
        ),
    ] = None,
    baseline: Annotated[
        str,
        typer.Option(
            help="With --k, compare with: init (the run's starting point), a checkpoint, none."
        ),
    ] = "init",
    opponent: Annotated[
        str | None,
        typer.Option(
            help="Games of two or more seats: play the checkpoint greedily in each seat against "
            "'random' (uniformly random legal moves) or a frozen run/checkpoint; win/draw/loss "
            "per seat."
        ),
    ] = None,
) -> None:
    """Evaluate a checkpoint greedily: success, return, fraction of oracle, credit, latency;
    with --k, pass@k of the trained team and its starting point side by side; with
    --opponent, win/draw/loss rates of each seat against a random or frozen opponent."""
    from trainers.evaluate import EVAL_SEED, evaluate
    from trainers.run.process import quiet_ray_logs

    cwd_on_path()
    import ray.rllib  # noqa: F401  (its import sets its loggers' levels: quiet them after it)

    quiet_ray_logs()  # RLlib's warnings as modules load, as `marl run` keeps them out
    first = EVAL_SEED if seed is None else seed
    if opponent is not None:
        from trainers.opponents import evaluate_vs

        with config_errors():
            evaluate_vs(checkpoint, opponent, episodes, seed=first)
        return
    with config_errors():
        evaluate(
            checkpoint,
            episodes,
            seed=first,
            credit=credit,
            transcripts=transcripts,
            k=k,
            baseline=baseline,
        )


def serve_command(
    checkpoint: Annotated[Path, typer.Argument(help="A run directory or checkpoint.")],
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on. Default: loopback only. Another address (e.g. 0.0.0.0) "
            "exposes every agent of the run to anyone who reaches the port with the key, over "
            "plain HTTP: use it on a trusted network only."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: a free one, printed).")] = 8000,
    key: Annotated[
        str | None,
        typer.Option(
            help="API key clients send (default: $MARL_SERVE_KEY, else a random one, printed)."
        ),
    ] = None,
    greedy: Annotated[
        bool, typer.Option(help="Greedy replies (default: sampled at each pool's temperature).")
    ] = False,
    truncate_prompts: Annotated[
        bool,
        typer.Option(
            help="Cut a prompt longer than the agent's max_prompt_tokens as the run trained "
            "on it (its system message and newest tokens, the default); "
            "--no-truncate-prompts refuses it (400 context_length_exceeded), as OpenAI does."
        ),
    ] = True,
) -> None:
    """Serve a trained run's agents on an OpenAI-compatible endpoint (/v1/chat/completions,
    /v1/completions, /v1/models): model = the agent, each answered by its pool's policy."""
    import os
    import threading

    from trainers.serve import KEY_VARIABLE, serve

    cwd_on_path()
    with config_errors():
        try:
            served = serve(
                checkpoint,
                host=host,
                port=port,
                key=key or os.environ.get(KEY_VARIABLE) or None,
                greedy=greedy,
                truncate_prompts=truncate_prompts,
            )
        except OSError as exc:
            fail(f"cannot listen on {host}:{port} ({exc}): pick another --port (0: a free one)")
    from marl_agents.gateway.server import is_loopback

    if not is_loopback(served.gateway.host):
        print(
            f"warning: listening on {served.gateway.host}, beyond this machine: anyone who "
            "reaches the port with the key can query every agent (plain HTTP)"
        )
    print(f"serving {checkpoint} ({'greedy' if greedy else 'sampled'} replies)")
    print(f"  OPENAI_BASE_URL={served.base_url}")
    print(f"  OPENAI_API_KEY={served.key}")
    print(f"  models: {', '.join(served.models)}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        served.stop()


def replay_updates_command(
    run: Annotated[Path, typer.Argument(help="A run directory trained with output.rollouts.")],
    from_checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint to start from (default: the run's oldest).")
    ] = None,
    iterations: Annotated[
        int | None, typer.Option(help="Iterations to replay (default: every later dump).")
    ] = None,
    save: Annotated[
        Path | None, typer.Option(help="Save the replayed algorithm as a checkpoint here.")
    ] = None,
) -> None:
    """Redo the learner updates dumped by output.rollouts from a checkpoint, without sampling,
    and compare the weights with the run's checkpoint of the last replayed iteration."""
    from trainers.rollouts import replay_command

    cwd_on_path()
    fixed_hash_seed()  # the run's learner saw the same module order
    with config_errors():
        replay_command(run, from_checkpoint, iterations, save)


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
    from trainers.configs.experiment import BudgetConfig

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
    from trainers.configs.typed import ConfigError
    from trainers.finetune import FinetuneJob

    if job is not None:
        return FinetuneJob.from_yaml(job)
    if resume is None:
        raise ConfigError("no job: give a job YAML (marl finetune JOB.yaml) or --resume RUN_DIR")
    from trainers.run.rundir import find_checkpoint

    return FinetuneJob.from_yaml(find_checkpoint(resume)[1] / "job.yaml")


app = typer.Typer(
    name="marl",
    help="Train teams of agents (LangGraph graphs) as Dec-POMDPs with Ray RLlib.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
register_scenarios(app)
app.add_typer(topology_app, name="topology")
app.command("run")(run_command)
app.command("sweep")(sweep_command)
app.command("eval")(eval_command)
app.command("serve")(serve_command)
app.command("finetune")(finetune_command)
app.command("replay-updates")(replay_updates_command)


if __name__ == "__main__":
    app()
