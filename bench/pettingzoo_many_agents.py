"""Many agents (issue 43, item 6): ``train()`` on magent2's ``battle_v4`` against the env alone.

For each map size (default 20, 30, 45: 24, 60 and 162 agents), prints

* **env alone**: the magent2 ``parallel_env`` stepped with uniformly random actions for
  ``--probe`` seconds (:func:`experiments.pettingzoo_catalogue.random_rate`): env steps/s and
  agent steps/s (actions taken);
* **train()**: ``--iterations`` iterations of the default PPO config with
  ``train_batch_size`` ``--batch`` env steps, one epoch, minibatches of ``--minibatch`` rows,
  in this process; steps and time are counted from the end of the first iteration (building
  the algorithm and the first iteration's warm-up left out). Agent steps are the actions the
  env received (a counting wrapper around it). ``sample`` leaves out the learner's update
  (``timers/learn_s``), so it is the sampler's own rate;
* the **ratio** train() / env alone of agent steps/s (goal: ≥ 0.5 at 100+ agents).

Measured (2-core box shared with other jobs, ``--iterations 3``): ``--batch 100``: 24 agents
0.091 (sampler alone 0.140), 162 agents 0.044 (0.062); ``--batch 500``: 60 agents 0.037
(0.047), 162 agents 0.086 (0.109) — train() makes ~2,300–2,800 agent steps/s whatever the
agent count, where the env alone makes 20,000–60,000: about 0.35–0.45 ms an agent step, the
learner's update a fifth to a third of it. Where the sampler's time goes (py-spy, 162 agents,
``--batch 100``): 53% cutting the ongoing episodes at the end of each ``sample()``
(``BatchedEnvRunner._cut_ongoing`` → RLlib's ``MultiAgentEpisode.cut``, a new
``SingleAgentEpisode`` per agent whose ``InfiniteLookbackBuffer`` walks the observation space
with ``get_base_struct_from_space`` — 29% alone; it amortises over longer batches), 16%
the policy's forward and action rows, 14% ``GraphEnv.step``, 8% resets (the factory rebuilds
the magent2 env every episode), 9% ``to_numpy``.

Usage (from the repository root)::

    python bench/pettingzoo_many_agents.py [--maps 20 30 45] [--iterations 3] [--batch 200]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
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
    from magent2.environments import battle_v4

    from experiments.pettingzoo_catalogue import random_rate

    return random_rate(lambda: battle_v4.parallel_env(map_size=map_size), seconds)


def trained(map_size: int, iterations: int, batch: int, minibatch: int) -> dict[str, Any]:
    """Run train() here; rates over iterations 2…n (see the module doc)."""
    import pettingzoo_many_agents as me  # the module the scenario reference imports

    from trainers.configs.experiment import ExperimentConfig
    from trainers.run.loop import train

    marks: list[tuple[float, int, dict[str, Any]]] = []

    def report(metrics: dict[str, Any]) -> None:
        marks.append((time.perf_counter(), me.ACTIONS[0], dict(metrics)))

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
                "seed": 0,
                "logging": {"wandb": "disabled", "progress": False},
                "output": {"dir": tmp, "checkpoint_every": 0, "plot": False},
            }
        )
        train(cfg, report=report)
    (t0, a0, _), (t1, a1, last) = marks[0], marks[-1]
    rows = [m for _, _, m in marks[1:]]
    env_steps = last["charts/env_steps"] - marks[0][2]["charts/env_steps"]
    learn = sum(float(m.get("timers/learn_s", 0.0)) for m in rows)
    dt = t1 - t0
    return {
        "env_steps_per_s": env_steps / dt,
        "agent_steps_per_s": (a1 - a0) / dt,
        "sample_agent_steps_per_s": (a1 - a0) / max(dt - learn, 1e-9),
        "learn_share": learn / dt,
        "agents_per_step": (a1 - a0) / max(env_steps, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--maps", type=int, nargs="+", default=[20, 30, 45])
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--batch", type=int, default=200, help="env steps per iteration")
    p.add_argument(
        "--minibatch", type=int, help="rows per minibatch (default: --batch, the most allowed)"
    )
    p.add_argument("--probe", type=float, default=3.0, help="seconds of the env alone")
    args = p.parse_args()
    print(
        f"{'map':>4} {'agents':>6} | {'env alone':>21} | {'train()':>21} | {'sample':>9} "
        f"| {'ratio':>5} {'sample':>6} | learn"
    )
    print(f"{'':>4} {'':>6} | {'steps/s':>9} {'agent st/s':>11} | {'steps/s':>9} "
          f"{'agent st/s':>11} | {'agent/s':>9} | {'':>5} {'ratio':>6} | share")  # fmt: skip
    for m in args.maps:
        from magent2.environments import battle_v4

        n = len(battle_v4.parallel_env(map_size=m).possible_agents)
        a = alone(m, args.probe)
        t = trained(m, args.iterations, args.batch, args.minibatch or args.batch)
        print(
            f"{m:>4} {n:>6} | {a['env_steps_per_s']:>9.0f} {a['agent_steps_per_s']:>11.0f} "
            f"| {t['env_steps_per_s']:>9.1f} {t['agent_steps_per_s']:>11.0f} "
            f"| {t['sample_agent_steps_per_s']:>9.0f} "
            f"| {t['agent_steps_per_s'] / a['agent_steps_per_s']:>5.3f} "
            f"{t['sample_agent_steps_per_s'] / a['agent_steps_per_s']:>6.3f} "
            f"| {t['learn_share']:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
