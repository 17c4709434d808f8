"""Many agents (issue 43, item 6): ``train()`` on magent2's ``battle_v4`` against the env alone.

For each map size (default 20, 30, 45: 24, 60 and 162 agents), prints

* **env alone**: the magent2 ``parallel_env`` stepped with uniformly random actions for
  ``--probe`` seconds (:func:`experiments.pettingzoo_catalogue.random_rate`): agent steps
  (actions taken) per wall-clock second and per CPU second of this process;
* **train()**: ``--iterations`` iterations of the default PPO config with
  ``train_batch_size`` ``--batch`` env steps, one epoch, minibatches of ``--minibatch`` rows,
  ``--envs`` sub-envs (default: the config's 16), in this process; steps and time are counted
  from the end of the first iteration (building the algorithm and the first iteration's
  warm-up left out). Agent steps are the actions the env received (a counting wrapper);
* the **ratio** train() / env alone of agent steps per second, wall-clock and CPU (goal:
  ≥ 0.5 at 100+ agents). On a shared machine use the CPU column: the wall-clock rates follow
  whatever else runs (``busy``: CPU seconds this process got per wall second);
* ``sample ratio``: the same without the learner's update (``timers/learn_s``); ``learn``: the
  agent steps per second of the learner's update alone; ``ceil``: the ratio train() would
  reach were sampling free but for the env's own steps (the learner's bound);
* where train()'s wall time goes: the iteration timers (``timers/env_s`` — the env's steps
  through ``GraphEnv`` —, ``forward_s``, ``sample_overhead_s``, ``learn_s``) and Python's
  garbage collector (``gc``, within the others).

``--compare`` adds a row per map with the sampler as it was before its many-agent fixes
(RLlib's ``MultiAgentEpisode.cut`` and the collector walking every object while sampling),
run in the same process, so the two rows share the machine's load.

Measured (2-core box shared with 3 other jobs, load 11–17; ``--iterations 4 --batch 200
--compare``), agent steps per CPU second, train() / env alone:

=======  ==========  ===================  ===================  ===================
agents   env alone   train() before       train() now          learner alone
=======  ==========  ===================  ===================  ===================
24       123,428     9,129 (0.074)        11,138 (0.090)       13k–29k /s (wall)
60       206,617     8,362 (0.040)        12,903 (0.062)       19k–25k /s (wall)
162      191,762     7,351 (0.038)        9,909 (0.052)        11k–13k /s (wall)
=======  ==========  ===================  ===================  ===================

The goal of 0.5 is not met, and is out of reach on a CPU with this model: at 162 agents the
env costs ~5.2 µs of CPU an agent step, while the default PPO module (845 → 64 → 64, separate
critic) costs 4.8 µs a row for the sampler's forward alone and 11.6 µs a row for the learner's
forward and backward, plus 2.3 µs for the values GAE needs — ~19 µs of arithmetic an agent
step before any framework cost, a ceiling of ~0.22. Where the sampler's time goes now (py-spy,
162 agents, 16 sub-envs): ~30% the env thread (``GraphEnv``'s per-agent graph nodes ~18%, the
magent2 step 12%), 18% acting (the forward 5%, stacking observations 7%, per-row Python 6%),
12% RLlib's ``to_numpy`` of the chunks, 5% recording steps, 3% cutting episodes (was 53% of
an older profile with the collector's walks counted into it; the collector alone took 33–45%
of train()'s wall time at 162 agents, 8–12% now).

Usage (from the repository root)::

    python bench/pettingzoo_many_agents.py [--maps 20 30 45] [--iterations 3] [--batch 200] \\
        [--envs N] [--compare]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):  # this checkout's packages; this file as `pettingzoo_many_agents`
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from pettingzoo.utils.wrappers import BaseParallelWrapper  # noqa: E402

#: actions the counted envs of this process received (the train() side of the ratio)
ACTIONS = [0]


class Counted(BaseParallelWrapper):
    """A ParallelEnv that counts the actions it receives into :data:`ACTIONS`."""

    def step(self, actions: dict[str, Any]) -> Any:
        ACTIONS[0] += len(actions)
        return super().step(actions)


def counted_battle(**kwargs: Any) -> Any:
    """``magent2.environments.battle_v4.parallel_env(**kwargs)``, counted (a scenario factory:
    ``pettingzoo_many_agents:counted_battle``)."""
    from magent2.environments import battle_v4

    return Counted(battle_v4.parallel_env(**kwargs))


def alone(map_size: int, seconds: float) -> dict[str, Any]:
    """The env alone (:func:`experiments.pettingzoo_catalogue.random_rate`), its rates per
    wall-clock and per CPU second of this process."""
    from magent2.environments import battle_v4

    from experiments.pettingzoo_catalogue import random_rate

    wall, cpu = time.perf_counter(), time.process_time()
    out = random_rate(lambda: battle_v4.parallel_env(map_size=map_size), seconds)
    busy = (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)
    out["agent_steps_per_cpu_s"] = out["agent_steps_per_s"] / max(busy, 1e-9)
    return out


class GcClock:
    """Wall time spent in Python's garbage collector (``gc.callbacks``) since it started."""

    def __init__(self) -> None:
        self.seconds, self._t = 0.0, 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t

    def close(self) -> None:
        gc.callbacks.remove(self._on)


@contextmanager
def sampler_before() -> Iterator[None]:
    """The batched sampler as it was before its many-agent fixes (``--compare``): RLlib's own
    ``MultiAgentEpisode.cut`` and the garbage collector walking every object while sampling."""
    from trainers.sampling import batched_runner as br

    saved = br.cut, br.young_objects_only
    br.cut = lambda episode, lookback: episode.cut(len_lookback_buffer=lookback)
    br.young_objects_only = nullcontext
    try:
        yield
    finally:
        br.cut, br.young_objects_only = saved


#: the iteration timers (``timers/…``) summed into the table's time shares
SHARES = ("env", "forward", "sample_overhead", "learn")


def trained(
    map_size: int, iterations: int, batch: int, minibatch: int, envs: int | None
) -> dict[str, Any]:
    """Run train() here; rates over iterations 2…n (see the module doc)."""
    import pettingzoo_many_agents as me  # the module the scenario reference imports

    from trainers.configs.experiment import ExperimentConfig
    from trainers.run.loop import train

    marks: list[tuple[float, float, float, int, dict[str, Any]]] = []
    clock = GcClock()

    def report(metrics: dict[str, Any]) -> None:
        now = (time.perf_counter(), time.process_time(), clock.seconds, me.ACTIONS[0])
        marks.append((*now, dict(metrics)))

    resources = {} if envs is None else {"num_envs_per_env_runner": envs}
    with tempfile.TemporaryDirectory(prefix="pz_many_") as tmp:
        cfg = ExperimentConfig.from_dict(
            {
                "scenario": "pettingzoo_many_agents:counted_battle",
                "scenario_kwargs": {"map_size": map_size},
                "algorithm": {
                    "train_batch_size": batch,
                    "minibatch_size": minibatch,
                    "num_epochs": 1,
                },
                "budget": {"iterations": iterations},
                "resources": resources,
                "seed": 0,
                "logging": {"wandb": "disabled", "progress": False},
                "output": {"dir": tmp, "checkpoint_every": 0, "plot": False},
            }
        )
        try:
            train(cfg, report=report)
        finally:
            clock.close()
    (t0, c0, g0, a0, first), (t1, c1, g1, a1, last) = marks[0], marks[-1]
    rows = [m for *_, m in marks[1:]]
    env_steps = last["charts/env_steps"] - first["charts/env_steps"]
    dt, agents = t1 - t0, a1 - a0
    spent = {k: sum(float(m.get(f"timers/{k}_s", 0.0)) for m in rows) for k in SHARES}
    return {
        "env_steps_per_s": env_steps / dt,
        "agent_steps_per_s": agents / dt,
        "agent_steps_per_cpu_s": agents / max(c1 - c0, 1e-9),
        "sample_agent_steps_per_s": agents / max(dt - spent["learn"], 1e-9),
        "learn_agent_steps_per_s": agents / max(spent["learn"], 1e-9),
        "shares": {k: v / dt for k, v in spent.items()},
        "gc_share": (g1 - g0) / dt,
        "cpu_busy": (c1 - c0) / dt,
        "agents_per_step": agents / max(env_steps, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--maps", type=int, nargs="+", default=[20, 30, 45])
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--batch", type=int, default=200, help="env steps per iteration")
    p.add_argument(
        "--minibatch", type=int, help="rows per minibatch (default: --batch, the most allowed)"
    )
    p.add_argument("--envs", type=int, help="num_envs_per_env_runner (default: the config's)")
    p.add_argument("--probe", type=float, default=3.0, help="seconds of the env alone")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also train() with the sampler as before its many-agent fixes, side by side",
    )
    args = p.parse_args()
    print(f"{'map':>4} {'agents':>6} {'code':>6} | {'env alone':>17} | {'train()':>25} "
          f"| {'ratio':>11} | {'sample':>7} {'learn':>7} {'ceil':>5} "
          "| share of train() wall time")  # fmt: skip
    print(f"{'':>4} {'':>6} {'':>6} | {'agent/s':>8} {'/cpu s':>8} | {'steps/s':>7} {'agent/s':>8} "
          f"{'/cpu s':>8} | {'wall':>5} {'cpu':>5} | {'ratio':>7} {'agent/s':>7} "
          f"{'ratio':>5} | env fwd  over learn gc   busy")  # fmt: skip
    for m in args.maps:
        from magent2.environments import battle_v4

        n = len(battle_v4.parallel_env(map_size=m).possible_agents)
        a = alone(m, args.probe)
        for label in ("before", "now") if args.compare else ("now",):
            with sampler_before() if label == "before" else nullcontext():
                t = trained(m, args.iterations, args.batch, args.minibatch or args.batch, args.envs)
            print(row(m, n, label, a, t), flush=True)


def row(m: int, n: int, label: str, a: dict[str, Any], t: dict[str, Any]) -> str:
    """One line of the table."""
    env, env_cpu = a["agent_steps_per_s"], a["agent_steps_per_cpu_s"]
    # the most train() could make were sampling free of all but the env's own steps
    ceiling = (1 / env) / (1 / env + 1 / t["learn_agent_steps_per_s"])
    sh = t["shares"]
    return (
        f"{m:>4} {n:>6} {label:>6} | {env:>8.0f} {env_cpu:>8.0f} "
        f"| {t['env_steps_per_s']:>7.1f} {t['agent_steps_per_s']:>8.0f} "
        f"{t['agent_steps_per_cpu_s']:>8.0f} "
        f"| {t['agent_steps_per_s'] / env:>5.3f} {t['agent_steps_per_cpu_s'] / env_cpu:>5.3f} "
        f"| {t['sample_agent_steps_per_s'] / env:>7.3f} {t['learn_agent_steps_per_s']:>7.0f} "
        f"{ceiling:>5.2f} "
        f"| {sh['env']:.2f} {sh['forward']:.2f} {sh['sample_overhead']:.2f} "
        f"{sh['learn']:.2f}  {t['gc_share']:.2f} {t['cpu_busy']:.2f}"
    )


if __name__ == "__main__":
    main()
