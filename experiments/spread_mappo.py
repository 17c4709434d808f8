"""simple_spread (mpe2, 3 agents, 25 steps, discrete, local ratio 0.5): IPPO and MAPPO learning
curves with greedy evaluation, in EPyMARL's team-return convention, next to published points.

Each run trains the experiment :func:`config` builds (the PettingZoo reference
``mpe2.simple_spread_v3:parallel_env``, one policy shared by the three agents, MAPPO's
published MPE hyperparameters where ours has the knob: lr 7e-4, 10 epochs over 3,200 env steps,
entropy 0.01, γ 0.99, λ 0.95, a [64, 64] MLP, value normalisation) with the algorithm that
:func:`trainers.algo.to_algorithm_config` builds (the same as ``train()``'s, in this process: no
run directory, so the greedy evaluations need no checkpoints), and every ``--eval-every`` env
steps plays ``--eval-episodes`` greedy episodes (argmax actions) on fixed seeds (10,000
onwards). The greedy team return is ``2·Σ_i R_i − 75`` per episode
(:func:`experiments.epymarl.team_return`); each row also holds the stochastic training return
of the last iteration's episodes (same convention) and the learner's KL, KL coefficient,
entropy and explained variance. ``minibatch_size`` 3,200 counts rows of the shared module's
batch (3 agents × 3,200 env steps + bootstrap rows), so an epoch is ~3.1 minibatches (~31 SGD
steps an update, where MAPPO's one minibatch makes 10).

Ablations: ``--set PATH=VALUE`` overrides the experiment (dotted path, JSON value, e.g.
``--set algorithm.extra.use_kl_loss=false``), ``--tag`` names the arm in the rows and the
report; ``--set scenario=experiments.spread_mappo:team_parallel_env`` trains every agent on
the team's mean reward, ``…:id_parallel_env`` appends each agent's one-hot id to its
observation (EPyMARL's ``obs_agent_id``), ``…:normed_parallel_env`` is the team reward with
each observation and ``state()`` standardised over its entries (MAPPO's input layer
normalisation, without its learned affine); ``--set pools.team.model.input_norm=true`` is
that normalisation as the pool's setting (a ``LayerNorm`` with its affine in front of the
actor and the critic, as MAPPO's implementation has it).
:mod:`experiments.spread_reference` is the plain-torch MAPPO on the same env these are
calibrated against. The best settings found at 500k (docs/results.md, 5 seeds greedy: IPPO
−163.6, MAPPO −151.8): ``--set
scenario=experiments.spread_mappo:team_parallel_env --set algorithm.entropy_coeff=0.03 --set
algorithm.lr=0.0028``; MAPPO with ``scenario=experiments.spread_mappo:normed_parallel_env``
instead: −149.9; with ``--set pools.team.model.input_norm=true`` added to the best settings:
−144.4.

Run: ``python -m experiments.spread_mappo --algos IPPO MAPPO --seeds 0 1 2 3 4
--steps 500000`` (one JSON line per evaluation to ``--out``, default
``experiments/results/spread_mappo/curves.jsonl``); ``--report`` prints the table of the rows
there (``--plot PNG`` also draws them, with the reference's rows when
``reference.jsonl`` sits next to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SPREAD = "mpe2.simple_spread_v3:parallel_env"
KW = {"N": 3, "max_cycles": 25, "local_ratio": 0.5, "continuous_actions": False}
OUT = Path(__file__).resolve().parent / "results" / "spread_mappo" / "curves.jsonl"
EVAL_SEED = 10_000
#: published points, EPyMARL's convention (see docs/results.md for the sources)
PUBLISHED = {
    "random": -230.0,
    "MAPPO-MLP 250k (figure)": -160.0,
    "MAPPO-MLP 500k (figure)": -145.0,
    "MAPPO-MLP 1M (figure)": -122.0,
    "EPyMARL MAPPO 20M": -133.5,
}


def team_parallel_env(**kwargs: Any) -> Any:
    """mpe2 ``simple_spread_v3.parallel_env(**kwargs)`` in which every agent receives the team
    reward, the mean of the agents' rewards (``(2·Σ_i r_i … ) / N``, an affine map of EPyMARL's
    per-step team reward): the objective MAPPO, EPyMARL and the MAPPO-MLP figure train on (their
    MPE gives every agent the shared reward). mpe2's own rewards with ``local_ratio`` 0.5 give
    agent ``i`` ``0.5·G − 0.5·c_i``: its own collisions weigh 3× more against the distance term
    than in the team's return, and the others' not at all (``--reward env``)."""
    from mpe2 import simple_spread_v3
    from pettingzoo.utils.wrappers import BaseParallelWrapper

    class TeamReward(BaseParallelWrapper):
        def step(self, actions: dict[str, Any]) -> Any:
            obs, rewards, terms, truncs, infos = self.env.step(actions)
            mean = float(np.mean(list(rewards.values()))) if rewards else 0.0
            return obs, dict.fromkeys(rewards, mean), terms, truncs, infos

    return TeamReward(simple_spread_v3.parallel_env(**kwargs))


def normed_parallel_env(**kwargs: Any) -> Any:
    """:func:`team_parallel_env` whose observations and ``state()`` are each standardised
    over their own entries (``(x − mean(x)) / std(x)``): the input layer normalisation of
    MAPPO's implementation (``use_feature_normalization``, a ``LayerNorm`` on the actor's and
    the critic's inputs) without its learned scale and shift."""
    from pettingzoo.utils.wrappers import BaseParallelWrapper

    def norm(x: Any) -> np.ndarray:
        x = np.asarray(x, np.float32)
        return ((x - x.mean()) / np.sqrt(x.var() + 1e-5)).astype(np.float32)

    class Normed(BaseParallelWrapper):
        def reset(self, seed: int | None = None, options: Any = None) -> Any:
            obs, infos = self.env.reset(seed=seed, options=options)
            return {a: norm(o) for a, o in obs.items()}, infos

        def step(self, actions: dict[str, Any]) -> Any:
            obs, rewards, terms, truncs, infos = self.env.step(actions)
            return {a: norm(o) for a, o in obs.items()}, rewards, terms, truncs, infos

        def state(self) -> np.ndarray:
            return norm(self.env.state())

    return Normed(team_parallel_env(**kwargs))


def id_parallel_env(**kwargs: Any) -> Any:
    """mpe2 ``simple_spread_v3.parallel_env(**kwargs)`` in which every agent's observation ends
    with a one-hot of its index (EPyMARL's ``obs_agent_id``, on by default there for every
    algorithm with parameter sharing): a shared actor can tell the agents apart without
    reading it off positions. Rewards and ``state()`` are mpe2's."""
    import gymnasium as gym
    from mpe2 import simple_spread_v3
    from pettingzoo.utils.wrappers import BaseParallelWrapper

    class AgentId(BaseParallelWrapper):
        def __init__(self, env: Any) -> None:
            super().__init__(env)
            n = len(env.possible_agents)
            self._ids = {
                a: np.eye(n, dtype=np.float32)[i] for i, a in enumerate(env.possible_agents)
            }
            self._spaces = {}
            for a in env.possible_agents:
                inner = env.observation_space(a)
                low = np.concatenate([inner.low, np.zeros(n, np.float32)])
                high = np.concatenate([inner.high, np.ones(n, np.float32)])
                self._spaces[a] = gym.spaces.Box(low, high, dtype=np.float32)

        def observation_space(self, agent: str) -> Any:
            return self._spaces[agent]

        def _with_ids(self, obs: dict[str, Any]) -> dict[str, Any]:
            return {a: np.concatenate([o, self._ids[a]], dtype=np.float32) for a, o in obs.items()}

        def reset(self, seed: int | None = None, options: Any = None) -> Any:
            obs, infos = self.env.reset(seed=seed, options=options)
            return self._with_ids(obs), infos

        def step(self, actions: dict[str, Any]) -> Any:
            obs, rewards, terms, truncs, infos = self.env.step(actions)
            return self._with_ids(obs), rewards, terms, truncs, infos

    return AgentId(simple_spread_v3.parallel_env(**kwargs))


def config(algo: str, seed: int, steps: int, overrides: dict[str, Any] | None = None) -> Any:
    """The experiment of one run (checked here, before anything trains); ``overrides`` maps
    dotted paths of the experiment dict (``algorithm.num_epochs``) to values (``--set``)."""
    from trainers.configs.experiment import ExperimentConfig

    exp: dict[str, Any] = {
        "scenario": SPREAD,
        "scenario_kwargs": KW,
        "sharing": "team",
        "seed": seed,
        "pools": {"team": {"model": {"type": "mlp", "hidden": [64, 64]}}},
        "algorithm": {
            "name": algo,
            "lr": 7e-4,
            "num_epochs": 10,
            "train_batch_size": 3200,
            "minibatch_size": 3200,
            "entropy_coeff": 0.01,
            "gamma": 0.99,
            "gae_lambda": 0.95,
        },
        "resources": {"num_envs_per_env_runner": 8},
        "budget": {"iterations": None, "env_steps": steps},
        "logging": {"wandb": "disabled", "progress": False},
        "output": {"checkpoint_every": 0, "plot": False, "transcripts": 0},
    }
    for path, value in (overrides or {}).items():
        *parents, leaf = path.split(".")
        node = exp
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return ExperimentConfig.from_dict(exp)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set`` items ``path=value`` (a JSON value, else the string) as a dict."""
    out: dict[str, Any] = {}
    for item in items:
        path, sep, raw = item.partition("=")
        if not sep or not path:
            raise SystemExit(f"--set {item!r}: write path=value, e.g. algorithm.num_epochs=15")
        try:
            out[path] = json.loads(raw)
        except json.JSONDecodeError:
            out[path] = raw
    return out


def greedy_returns(algo: Any, plan: Any, episodes: int) -> list[float]:
    """Σ_i R_i of ``episodes`` greedy episodes on seeds ``EVAL_SEED…``."""
    import torch
    from ray.rllib.core.columns import Columns

    env = plan.env.replace(global_state=False).make_env()
    modules = {pid: algo.get_module(pid) for pid in plan.pools}
    sums = []
    for k in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED + k)
        total = 0.0
        while env.agents:
            actions = {}
            for agent, ob in obs.items():
                module = modules[plan.agent_to_pool[agent]]
                with torch.no_grad():
                    batch = {Columns.OBS: torch.as_tensor(np.asarray(ob, np.float32))[None]}
                    logits = module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS]
                actions[agent] = int(logits.argmax(-1)[0])
            obs, rewards, *_ = env.step(actions)
            total += float(sum(rewards.values()))
        sums.append(total)
    env.close()
    return sums


def run(
    algo_name: str,
    seed: int,
    steps: int,
    every: int,
    episodes: int,
    out: Path,
    overrides: dict[str, Any] | None = None,
    tag: str = "",
    make_config: Callable[..., Any] | None = None,
    convert: Callable[[float], float] | None = None,
) -> None:
    """Train one run to ``steps`` env steps, evaluating greedily every ``every``; each row also
    holds the stochastic training return (the sampled episodes of the last iteration, same
    convention) and the learner's KL, KL coefficient, entropy and explained variance.

    ``make_config`` (default :func:`config`) builds the experiment from ``(algo, seed, steps,
    overrides)``; ``convert`` (default :func:`experiments.epymarl.team_return`) maps Σ over
    agents of an episode's mpe2 returns to the row's ``team_return``."""
    from experiments.epymarl import team_return
    from trainers.algo import to_algorithm_config
    from trainers.plan import resolve

    convert = convert or team_return
    cfg = (make_config or config)(algo_name, seed, steps, overrides)
    plan = resolve(cfg)
    algo = to_algorithm_config(cfg, plan).build_algo()
    done, next_eval, start, result = 0, 0, time.perf_counter(), None
    try:
        while True:
            if done >= next_eval:
                sums = greedy_returns(algo, plan, episodes)
                row = {
                    "algo": algo_name,
                    "tag": tag,
                    "seed": seed,
                    "env_steps": done,
                    "team_return": float(np.mean([convert(s) for s in sums])),
                    **training_stats(result, convert),
                    "wall_s": time.perf_counter() - start,
                }
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(row, flush=True)
                next_eval += every
            if done >= steps:
                return
            result = algo.train()
            done = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
    finally:
        algo.stop()


#: learner metrics copied into each row (mean over the modules that report them)
LEARNER_STATS = (
    "mean_kl_loss",
    "curr_kl_coeff",
    "curr_entropy_coeff",
    "entropy",
    "vf_explained_var",
)


def training_stats(
    result: dict[str, Any] | None, convert: Callable[[float], float] | None = None
) -> dict[str, float]:
    """The stochastic training team return (``convert`` of the episodes' Σ over agents, default
    :func:`experiments.epymarl.team_return`) and :data:`LEARNER_STATS` of the last iteration's
    ``result`` (empty before the first)."""
    from experiments.epymarl import team_return

    if result is None:
        return {}
    convert = convert or team_return
    stats: dict[str, float] = {}
    ret = result.get("env_runners", {}).get("episode_return_mean")
    if ret is not None and np.isfinite(ret):
        stats["train_team_return"] = convert(float(ret))
    learners = [v for k, v in result.get("learners", {}).items() if k != "__all_modules__"]
    for key in LEARNER_STATS:
        vals = [float(m[key]) for m in learners if isinstance(m, dict) and key in m]
        if vals:
            stats[key] = float(np.mean(vals))
    return stats


def report(out: Path, published: dict[str, float] | None = None) -> None:
    """Mean (min, max over seeds) greedy team return at each evaluation point, per algorithm,
    then the ``published`` points (default :data:`PUBLISHED`)."""
    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    by: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        point = int(round(r["env_steps"] / 25_000) * 25_000)
        by.setdefault((arm(r), point), []).append(r["team_return"])
    print(f"{'arm':<16} {'env steps':>9}  {'mean':>7}  {'min':>7}  {'max':>7}  seeds")
    for (name, point), vals in sorted(by.items()):
        print(
            f"{name:<16} {point:>9}  {np.mean(vals):7.1f}  {min(vals):7.1f}  {max(vals):7.1f}"
            f"  {len(vals)}"
        )
    published = PUBLISHED if published is None else published
    print("published:", ", ".join(f"{k} {v}" for k, v in published.items()))


def arm(row: dict[str, Any]) -> str:
    """A row's arm: its algorithm, with its ``--tag`` in brackets when it has one."""
    return row["algo"] + (f"[{row['tag']}]" if row.get("tag") else "")


def curve(rows: list[dict[str, Any]]) -> tuple[list[int], list[float], int]:
    """Evaluation points (rounded to 25k), mean greedy team return over seeds, seed count."""
    by: dict[int, list[float]] = {}
    for r in rows:
        by.setdefault(int(round(r["env_steps"] / 25_000) * 25_000), []).append(r["team_return"])
    xs = sorted(by)
    return xs, [float(np.mean(by[x])) for x in xs], len({r["seed"] for r in rows})


def plot(out: Path, png: Path, reference: Path | None = None) -> Path:
    """Greedy team return against env steps, one line per arm (mean over seeds), the plain-torch
    reference (:mod:`experiments.spread_reference`, ``reference`` rows with ``reward: env``)
    when given, and the published points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    fig, ax = plt.subplots(figsize=(9.6, 4.2))
    colours = plt.get_cmap("tab20").colors  # one per arm: the default cycle repeats after 10
    for i, name in enumerate(sorted({arm(r) for r in rows})):
        xs, ys, seeds = curve([r for r in rows if arm(r) == name])
        label = f"ours {name} ({seeds} seed{'s' if seeds > 1 else ''})"
        ax.plot(xs, ys, marker=".", color=colours[i % len(colours)], label=label)
    if reference is not None and reference.exists():
        ref = [json.loads(x) for x in reference.read_text().splitlines() if x.strip()]
        ref = [r for r in ref if r.get("reward") == "env" and not r.get("tag")]
        if ref:
            xs, ys, _ = curve(ref)
            runs: dict[int, int] = {}
            for r in ref:
                point = int(round(r["env_steps"] / 25_000) * 25_000)
                runs[point] = runs.get(point, 0) + 1
            lo, hi = min(runs.values()), max(runs.values())
            label = f"plain-torch MAPPO, same env ({lo}–{hi} runs a point)"
            ax.plot(xs, ys, ls="--", color="grey", label=label)
    points = [(250_000, -160.0), (500_000, -145.0)]
    ax.scatter(*zip(*points, strict=True), color="k", zorder=3, label="MAPPO-MLP (figure)")
    ax.axhline(-230.0, color="grey", ls=":", label="random")
    ax.set_xlabel("env steps")
    ax.set_ylabel("greedy team return (EPyMARL)")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the curves
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    return png


def parser(description: str, steps: int, out: Path) -> argparse.ArgumentParser:
    """The options of a curve experiment on an mpe2 task (this one, speaker-listener)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--algos", nargs="*", default=["IPPO", "MAPPO"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--eval-every", type=int, default=25_000)
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument("--out", type=Path, default=out)
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override the experiment (dotted path, JSON value), e.g. algorithm.num_epochs=15",
    )
    p.add_argument("--tag", default="", help="a label for this arm in the rows and report")
    p.add_argument("--report", action="store_true", help="print the table of --out and exit")
    return p


def main() -> None:
    p = parser(__doc__.split("\n")[0], 500_000, OUT)
    p.add_argument("--plot", type=Path, help="with --report: also write the curve PNG here")
    args = p.parse_args()
    if args.report:
        report(args.out)
        if args.plot:
            print("wrote", plot(args.out, args.plot, args.out.parent / "reference.jsonl"))
        return
    overrides = checked_overrides(args)
    train_arms(args, overrides)
    report(args.out)


def checked_overrides(
    args: argparse.Namespace, make_config: Callable[..., Any] | None = None
) -> dict[str, Any]:
    """The ``--set`` overrides of parsed :func:`parser` options, after every ``--algos``
    experiment (``make_config``, default :func:`config`) was checked (config errors before
    anything trains); creates ``--out``'s folder."""
    overrides = parse_sets(args.sets)
    for algo in args.algos:
        (make_config or config)(algo, args.seeds[0], args.steps, overrides).check()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    return overrides


def train_arms(
    args: argparse.Namespace,
    overrides: dict[str, Any],
    make_config: Callable[..., Any] | None = None,
    convert: Callable[[float], float] | None = None,
) -> None:
    """:func:`run` for every seed × ``--algos`` of parsed :func:`parser` options, on one local
    Ray (``make_config`` and ``convert`` as in :func:`run`)."""
    if not args.algos:
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for seed in args.seeds:
        for algo in args.algos:
            run(
                algo,
                seed,
                args.steps,
                args.eval_every,
                args.eval_episodes,
                args.out,
                overrides,
                args.tag,
                make_config=make_config,
                convert=convert,
            )


if __name__ == "__main__":
    main()
