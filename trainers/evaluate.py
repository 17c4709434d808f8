"""``evaluate(checkpoint)``: greedy episodes of a trained team, with a rich summary table.

The modules are loaded straight from the checkpoint (no Ray, no env runners) and act greedily
on the scenario's :class:`~scenarios.graph_env.GraphEnv` on fresh seeds (a scenario with a task
list plays its tasks round-robin, :func:`episode_seeds`, and gets a row per task). Reported:
success rate (where the scenario defines success), team return (and EPyMARL's convention for
simple_spread, :mod:`trainers.signals.headline`), the fraction of the oracle's expected return on
the same tasks (where the scenario has ``oracle_value``), per-agent credit (the run's credit
method; ``team`` shows none), the scenario's latency metric, the wall time per decision, and
failed episodes (node errors, wall-clock timeouts, limits) with the tool calls that ran into
``episodes.tool_timeout_s``. With ``transcripts=N`` the first ``N`` episodes are also kept as
transcripts (:mod:`trainers.run.transcripts`) and printed.

Episodes run with the run's ``episodes`` settings: ``timeout_s``, ``engine``, and the same
``tool_latency`` and ``tool_timeout_s`` as training (:mod:`scenarios.tool_latency`), so an
evaluation measures the app that was trained and a hung tool ends its episode as a counted
failure instead of hanging the evaluation.

With ``k``, each of the ``episodes`` tasks is instead sampled ``k`` times with the team's
exploration policy (seeds fixed) and pass@k, mean@k and best@k (:mod:`trainers.passk`) are
reported for the checkpoint and, side by side, for its ``baseline`` (default ``"init"``: the
run's starting point; a checkpoint path; ``"none"``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trainers.configs.credit import CREDIT_METHODS
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError

#: evaluation seeds start here, away from the small seeds training episodes tend to use.
EVAL_SEED = 1_000_000


@dataclasses.dataclass
class EvalResult:
    """Per-episode records and their means.

    Attributes:
        episodes: one dict per episode: ``return``, ``success``, ``oracle`` (or None),
            ``decisions``, ``seconds``, ``metrics``, ``credit`` (agent → credit), ``failure``
            (None, ``"error"``, ``"timeout"`` or ``"limit"``), ``error`` and ``tool_timeouts``
            (the episode's tool calls that timed out).
        summary: the means shown in the table (``success``, ``return``, ``oracle_fraction``...),
            and the counts ``failures`` (failed episodes) and ``tool_timeouts`` (timed-out calls).
        credit: agent → mean credit (empty for ``team``).
        transcripts: the first ``transcripts`` episodes as
            :meth:`~scenarios.graph_env.GraphEnv.transcript` data (with ``credit``).
        passk: with ``k``: ``"trained"`` (and ``"baseline"``) → :func:`trainers.passk.passk_table`.
        solved: with ``k``: the same keys → task seed → how many of its ``k`` samples succeeded.
        per_task: for a scenario with a task list, one row per task (in the list's order):
            ``task`` (a short label), ``episodes``, ``return`` and ``success`` (where the
            scenario defines it).
    """

    episodes: list[dict[str, Any]]
    summary: dict[str, float]
    credit: dict[str, float]
    transcripts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    passk: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    solved: dict[str, dict[int, int]] = dataclasses.field(default_factory=dict)
    per_task: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class TeamPolicy:
    """Greedy actions of every agent from a checkpoint's modules (handles recurrent state)."""

    def __init__(self, modules: Any, agent_to_pool: Mapping[str, str]) -> None:
        self.modules = modules
        self.agent_to_pool = dict(agent_to_pool)
        self.state: dict[str, Any] = {}

    def reset(self) -> None:
        """Forget recurrent state (call at every episode start)."""
        self.state = {}

    def act(self, observations: Mapping[str, Any], explore: bool = False) -> dict[str, Any]:
        """Greedy actions for ``observations`` (agent id → observation); with ``explore``,
        actions sampled as in training (``forward_exploration``, torch's global RNG)."""
        import torch
        from ray.rllib.core.columns import Columns

        from marl_agents.action_mask import stack_observations, to_tensors
        from marl_agents.llm.rl_module import add_constraint_keys

        actions = {}
        with torch.no_grad():
            for agent, obs in observations.items():
                module = self.modules[self.agent_to_pool[agent]]
                stateful = module.is_stateful()
                # a masked observation is a dict: the module masks its logits, so the greedy
                # action (and a sampled one) is always allowed (marl_agents.action_mask)
                x = to_tensors(stack_observations([obs]), time_axis=stateful)
                batch: dict[str, Any] = {Columns.OBS: x}
                add_constraint_keys(batch, [obs])  # an LLM call's constraint rides on its obs
                if stateful:
                    init = self.state.get(agent)
                    if init is None:
                        init = {k: v[None] for k, v in module.get_initial_state().items()}
                    batch[Columns.STATE_IN] = init
                out = (module.forward_exploration if explore else module.forward_inference)(batch)
                if stateful:
                    self.state[agent] = out[Columns.STATE_OUT]
                if Columns.ACTIONS in out:
                    action = out[Columns.ACTIONS]
                else:
                    logits = out[Columns.ACTION_DIST_INPUTS]
                    if explore:
                        dist = module.get_exploration_action_dist_cls().from_logits(logits)
                        action = dist.sample()
                    else:
                        dist = module.get_inference_action_dist_cls().from_logits(logits)
                        action = dist.to_deterministic().sample()
                action = np.asarray(
                    action.detach().cpu().numpy() if hasattr(action, "detach") else action
                )
                actions[agent] = action.reshape(action.shape[2:] if stateful else action.shape[1:])
        return {a: (int(v) if v.ndim == 0 else v) for a, v in actions.items()}


def load_team(checkpoint: str | Path) -> tuple[ExperimentConfig, Any, TeamPolicy]:
    """``(config, plan, policy)`` for a run directory or checkpoint.

    Raises:
        ConfigError: no checkpoint, or no ``config.yaml`` in its run directory.
    """
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule

    from trainers.plan import resolve
    from trainers.run.rundir import find_checkpoint

    ckpt, run = find_checkpoint(checkpoint)
    cfg_path = run / "config.yaml"
    if not cfg_path.exists():
        raise ConfigError(
            f"no config.yaml in {run}: evaluate checkpoints written by trainers.run.loop.train"
        )
    cfg = ExperimentConfig.from_yaml(cfg_path)
    plan = resolve(cfg, ray_workers=False)  # evaluation runs in this process only
    modules = MultiRLModule.from_checkpoint(str(ckpt / "learner_group" / "learner" / "rl_module"))
    return cfg, plan, TeamPolicy(modules, plan.agent_to_pool)


def evaluate(
    checkpoint: str | Path,
    episodes: int = 100,
    *,
    seed: int = EVAL_SEED,
    credit: str | None = None,
    show: bool = True,
    make_env: Callable[[Mapping[str, Any]], Any] | None = None,
    transcripts: int = 0,
    k: int | None = None,
    baseline: str | Path = "init",
) -> EvalResult:
    """Run ``episodes`` greedy episodes of the team in ``checkpoint`` and print a table.

    Args:
        checkpoint: a run directory or a checkpoint inside one.
        episodes: number of episodes (seeds ``seed … seed + episodes − 1``).
        seed: first episode seed.
        credit: credit method to report (default: the run's; ``"team"``: none).
        show: print the rich table.
        make_env: builds the ``GraphEnv`` from the run's env config (e.g. one that reuses an
            environment across the seeds of an experiment, so oracle tables are built once);
            default: a new environment with the run's ``episodes.timeout_s``. Either way the
            run's ``tool_latency`` and ``tool_timeout_s`` are applied to it.
        transcripts: keep (and with ``show``, print) the first this many episodes as readable
            transcripts.
        k: sample each of the ``episodes`` tasks this many times and report pass@k (see the
            module doc) instead of greedy episodes.
        baseline: with ``k``: ``"init"`` (the run's starting point), a checkpoint, or
            ``"none"``.

    Returns:
        An :class:`EvalResult`.
    """
    from trainers.run.process import setup_process

    if episodes < 1:
        raise ConfigError(f"episodes must be ≥ 1, got {episodes}")
    if transcripts < 0:
        raise ConfigError(f"transcripts must be ≥ 0, got {transcripts}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be an integer ≥ 0 (the first episode's seed), got {seed!r}")
    if credit is not None and credit not in CREDIT_METHODS:
        raise ConfigError(f"credit={credit!r} is unknown: use one of {', '.join(CREDIT_METHODS)}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ConfigError(f"k must be an integer ≥ 1 (samples per task), got {k!r}")
    setup_process(hash_seed_matters=False)  # no RLlib sampler here: agents act one by one
    cfg, plan, policy = load_team(checkpoint)
    if make_env is not None:
        env = make_env(plan.env.plain())
        env.tools = tool_settings(cfg)  # as the run's spec gives its envs
    else:
        env = plan.env.replace(rewards=None).make_env()  # rewards: the verifier's
    if k is not None:
        return evaluate_passk(
            cfg, plan, policy, env, range(seed, seed + episodes), k, baseline, show
        )
    method = credit or cfg.credit.method
    records, kept = [], []
    scenario = plan.env.build_scenario()
    for i, (s, task) in enumerate(episode_seeds(scenario, seed, episodes)):
        records.append(_episode(env, policy, s, method, cfg))
        records[-1]["task"] = task
        if i < transcripts:
            t = env.transcript()
            if records[-1]["credit"]:
                t.update(credit=records[-1]["credit"], credit_method=method)
            kept.append(t)
    result = _summarise(records, plan.agents)
    result.transcripts = kept
    _headline(result, cfg, plan, scenario)
    if show:
        _print(result, plan, checkpoint, method)
    return result


def episode_seeds(scenario: Any, first: int, episodes: int) -> list[tuple[int, int | None]]:
    """``(seed, task index)`` of each evaluation episode: for a scenario with a task list
    (``task_list`` and ``task_index(seed)``, e.g. a chat app given a list of tasks) the tasks
    round-robin — episode ``i`` plays task ``i mod n``, on the first seed from ``first`` on
    (not yet used) that draws it — so ``n·m`` episodes play each task ``m`` times; any other
    scenario gets the seeds ``first … first + episodes − 1`` and no task index."""
    tasks = getattr(scenario, "task_list", None)
    index_of = getattr(scenario, "task_index", None)
    if not tasks or index_of is None:
        return [(first + i, None) for i in range(episodes)]
    n = len(tasks)
    unused: dict[int, list[int]] = {t: [] for t in range(n)}  # seeds drawn, not yet used
    cursor, out = first, []
    for i in range(episodes):
        want = i % n
        while not unused[want]:
            unused[index_of(cursor)].append(cursor)
            cursor += 1
        out.append((unused[want].pop(0), want))
    return out


def task_label(task: Any, width: int = 60) -> str:
    """A task as one short line (a chat app's string, or its input dict)."""
    text = " ".join(str(task).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _headline(result: EvalResult, cfg: ExperimentConfig, plan: Any, scenario: Any) -> None:
    """Per-scenario headline numbers (:mod:`trainers.signals.headline`): no success where the
    scenario defines none, EPyMARL's team return for simple_spread, per task where the
    scenario has a task list."""
    from trainers.signals.headline import epymarl_return, reports_epymarl

    records = result.episodes
    if not plan.has_success:
        result.summary.pop("success", None)
    if reports_epymarl(cfg) and all(
        "sum_return" in r["metrics"] and "steps" in r["metrics"] for r in records
    ):
        values = [epymarl_return(r["metrics"], len(plan.agents)) for r in records]
        result.summary["epymarl_return"] = float(np.mean(values))
        result.summary["epymarl_return_std"] = float(np.std(values))
    tasks = getattr(scenario, "task_list", None)
    if tasks and all(r.get("task") is not None for r in records):
        for t, task in enumerate(tasks):
            mine = [r for r in records if r["task"] == t]
            row: dict[str, Any] = {"task": task_label(task), "episodes": len(mine)}
            if mine:
                row["return"] = float(np.mean([r["return"] for r in mine]))
                if plan.has_success:
                    row["success"] = float(np.mean([r["success"] for r in mine]))
            result.per_task.append(row)


def evaluate_passk(
    cfg: ExperimentConfig,
    plan: Any,
    policy: TeamPolicy,
    env: Any,
    tasks: range,
    k: int,
    baseline: str | Path,
    show: bool,
) -> EvalResult:
    """pass@k of ``policy`` and of its ``baseline`` on ``tasks`` (see :func:`evaluate`)."""
    from trainers.passk import initial_modules, passk_table, sample_trials

    env.episode_timeout_s = cfg.episodes.timeout_s
    policies = {"trained": policy}
    if str(baseline) == "init":
        policies["baseline"] = TeamPolicy(initial_modules(cfg, plan), plan.agent_to_pool)
    elif str(baseline) != "none":
        policies["baseline"] = load_team(baseline)[2]
    trials = {arm: sample_trials(env, p, tasks, k, cfg.seed) for arm, p in policies.items()}
    tables = {arm: passk_table(t) for arm, t in trials.items()}
    solved = {
        arm: {task: sum(int(x["success"] > 0.5) for x in runs) for task, runs in t.items()}
        for arm, t in trials.items()
    }
    result = EvalResult([], tables["trained"], {}, passk=tables, solved=solved)
    if show:
        _print_passk(tables, plan, baseline)
    return result


def _print_passk(tables: Mapping[str, Mapping[str, float]], plan: Any, baseline: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    trained = tables["trained"]
    table = Table(
        title=f"pass@k · {plan.scenario_id} · {int(trained['tasks'])} tasks × "
        f"{int(trained['samples'])} samples",
        title_justify="left",
    )
    table.add_column("metric", style="bold")
    table.add_column("trained", justify="right")
    if "baseline" in tables:
        table.add_column(f"baseline ({baseline})", justify="right")
    for key in trained:
        if "@" in key:
            table.add_row(key, *(f"{t[key]:.3f}" for t in tables.values()))
    Console().print(table)


def tool_settings(cfg: ExperimentConfig) -> Any:
    """The run's ``ToolSettings`` (``episodes.tool_latency`` / ``tool_timeout_s``; None: none),
    as training gives its envs (``scenarios.rllib_env``)."""
    from scenarios.tool_latency import ToolSettings

    return ToolSettings.of(cfg.episodes.tool_latency, cfg.episodes.tool_timeout_s)


def _episode(
    env: Any, policy: TeamPolicy, seed: int, method: str, cfg: ExperimentConfig
) -> dict[str, Any]:
    policy.reset()
    obs, infos = env.reset(seed=seed)
    decisions = 0
    start = time.perf_counter()
    while env.agents:
        acting = {a: obs[a] for a in env.agents if infos[a]["acting"]}
        actions = policy.act(acting)
        decisions += len(actions)
        obs, _, _, _, infos = env.step(actions)
    seconds = time.perf_counter() - start
    outcome = env.outcome
    oracle = env.scenario.oracle_value(np.random.default_rng(seed))
    tools = env.tool_episode
    return {
        "seed": seed,
        "return": float(outcome.reward),
        "success": float(outcome.success),
        "oracle": None if oracle is None else float(oracle),
        "decisions": decisions,
        "seconds": seconds,
        "metrics": dict(outcome.metrics or {}),
        "credit": _credit(env, seed, method, outcome, cfg),
        "failure": env.failure,
        "error": env.error,
        "tool_timeouts": 0 if tools is None else tools.timeouts,
    }


def _credit(
    env: Any, seed: int, method: str, outcome: Any, cfg: ExperimentConfig
) -> dict[str, float]:
    from trainers.run.transcripts import episode_credit

    if method == "team":
        return {}
    credit = dataclasses.replace(cfg.credit, method=method)
    return episode_credit(env, seed, env.episode_actions(), outcome.local, credit)


def _summarise(records: list[dict[str, Any]], agents: list[str]) -> EvalResult:
    returns = np.array([r["return"] for r in records])
    summary: dict[str, float] = {
        "episodes": float(len(records)),
        "success": float(np.mean([r["success"] for r in records])),
        "return": float(returns.mean()),
        "return_std": float(returns.std()),
        "decision_ms": 1000
        * sum(r["seconds"] for r in records)
        / max(1, sum(r["decisions"] for r in records)),
        "episode_ms": 1000 * float(np.mean([r["seconds"] for r in records])),
        "failures": float(sum(r["failure"] is not None for r in records)),
        "tool_timeouts": float(sum(r["tool_timeouts"] for r in records)),
    }
    oracles = [r["oracle"] for r in records]
    if all(o is not None for o in oracles):
        summary["oracle"] = float(np.mean(oracles))
        if abs(summary["oracle"]) > 1e-9:
            summary["oracle_fraction"] = summary["return"] / summary["oracle"]
    if all("latency" in r["metrics"] for r in records):
        summary["latency"] = float(np.mean([r["metrics"]["latency"] for r in records]))
    credit: dict[str, float] = {}
    for agent in agents:
        values = [r["credit"][agent] for r in records if agent in r["credit"]]
        if values:
            credit[agent] = float(np.mean(values))
    return EvalResult(records, summary, credit)


def _print(result: EvalResult, plan: Any, checkpoint: str | Path, method: str) -> None:
    from rich.console import Console
    from rich.table import Table

    s = result.summary
    table = Table(title=f"evaluation · {plan.scenario_id}", title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_row("episodes", f"{int(s['episodes'])}")
    if "success" in s:
        table.add_row("success", f"{100 * s['success']:.1f}%")
    table.add_row("team return", f"{s['return']:.3f} ± {s['return_std']:.3f}")
    if "epymarl_return" in s:
        table.add_row(
            "team return, EPyMARL's 2·Σ_i R_i − N·T",
            f"{s['epymarl_return']:.1f} ± {s['epymarl_return_std']:.1f}",
        )
    if "oracle" in s:
        table.add_row("oracle return", f"{s['oracle']:.3f}")
    if "oracle_fraction" in s:
        table.add_row("fraction of oracle", f"{100 * s['oracle_fraction']:.1f}%")
    if "latency" in s:
        table.add_row("latency (scenario rounds)", f"{s['latency']:.2f}")
    table.add_row("latency per decision", f"{s['decision_ms']:.2f} ms")
    table.add_row("latency per episode", f"{s['episode_ms']:.1f} ms")
    if s.get("failures") or s.get("tool_timeouts"):
        table.add_row("failed episodes", f"{int(s['failures'])}")
        table.add_row("tool calls timed out", f"{int(s['tool_timeouts'])}")
    console = Console()
    console.print(f"checkpoint: {checkpoint}", soft_wrap=True, markup=False, highlight=False)
    console.print(table)
    if result.per_task:
        ttable = Table(title="per task (round-robin over the task list)", title_justify="left")
        ttable.add_column("#", justify="right")
        ttable.add_column("task")
        ttable.add_column("episodes", justify="right")
        ttable.add_column("team return", justify="right")
        if "success" in s:
            ttable.add_column("success", justify="right")
        for i, row in enumerate(result.per_task):
            cells = [str(i), row["task"], str(row["episodes"]), f"{row.get('return', 0):.3f}"]
            if "success" in s:
                cells.append(f"{100 * row.get('success', 0.0):.1f}%")
            ttable.add_row(*cells)
        console.print(ttable)
    if result.credit:
        ctable = Table(title=f"per-agent credit ({method})", title_justify="left")
        ctable.add_column("agent", style="bold")
        ctable.add_column("pool")
        ctable.add_column("mean credit", justify="right")
        a2p = plan.agent_to_pool
        for agent, value in result.credit.items():
            ctable.add_row(agent, a2p.get(agent, "?"), f"{value:.3f}")
        console.print(ctable)
    if result.transcripts:
        from trainers.run.transcripts import render

        for t in result.transcripts:
            console.print()
            console.print(render(t), markup=False, highlight=False, soft_wrap=True)
