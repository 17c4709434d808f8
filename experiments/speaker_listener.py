"""simple_speaker_listener (mpe2, 25 steps, discrete): a communication task, MAPPO and IPPO with
greedy evaluation in EPyMARL's return convention, against a uniform random policy.

Two heterogeneous agents: ``speaker_0`` sees only the goal landmark's colour (obs 3) and can
only say one of 3 words; ``listener_0`` sees its velocity, the landmarks and the word (obs 11)
and moves (5 actions). Both receive ``−d²`` each step (``d`` the listener's distance to the goal
landmark), so the speaker can only earn reward by learning to name the goal and the listener
by learning what the words mean. The scenario is the PettingZoo reference
``mpe2.simple_speaker_listener_v4:parallel_env``; agents map to pools by name (``speaker``,
``listener``, one MLP [64, 64] each); MAPPO's critic reads mpe2's ``state()`` (14), the agent's
own observation and its id (``critic: state_obs``), IPPO's its own observation. Every other
setting is :mod:`experiments.spread_mappo`'s (MAPPO's published MPE hyperparameters where ours
has the knob), and so are the loop, greedy evaluation (argmax, fixed seeds 10,000…), rows,
``--set``/``--tag`` and the report: this module only swaps the scenario, the pools, the return
convention (:func:`experiments.epymarl.speaker_listener_return`: EPyMARL reports the sum over
agents of mpe2's returns, ``Σ_t 2·(−d²_t)``) and the published points.

``--baselines`` also writes, on the same evaluation seeds (rows at 0 env steps), the uniform
random policy (``random``, per seed) and two scripted listeners that are not learned policies
(:func:`scripted_returns`): ``scripted-goal`` steers to the goal landmark read from the world
(what perfect communication allows a simple controller) and ``scripted-centroid`` to the
landmarks' centroid (what a listener can do without the word).

Run: ``python -m experiments.speaker_listener --algos MAPPO IPPO --seeds 0 1 2 --steps 200000
--baselines`` (one JSON line per evaluation to ``--out``, default
``experiments/results/speaker_listener/curves.jsonl``); ``--report`` prints the table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from experiments import spread_mappo
from experiments.epymarl import speaker_listener_return

SPEAKER_LISTENER = "mpe2.simple_speaker_listener_v4:parallel_env"
KW = {"max_cycles": 25, "continuous_actions": False}
OUT = Path(__file__).resolve().parent / "results" / "speaker_listener" / "curves.jsonl"
#: published points in EPyMARL's convention (see the results README for the source and what
#: could be verified); empty where nothing was verified
PUBLISHED: dict[str, float] = {}
#: the pools (roles of ``speaker_0`` and ``listener_0``)
ROLES = ("speaker", "listener")


def config(algo: str, seed: int, steps: int, overrides: dict[str, Any] | None = None) -> Any:
    """:func:`experiments.spread_mappo.config` on speaker-listener: the scenario, its kwargs, a
    pool per role (``speaker``, ``listener``; ``sharing: role``); ``overrides`` as there."""
    pools = {role: {"model": {"type": "mlp", "hidden": [64, 64]}} for role in ROLES}
    base = {
        "scenario": SPEAKER_LISTENER,
        "scenario_kwargs": dict(KW),
        "sharing": "role",
        "pools": pools,
    }
    return spread_mappo.config(algo, seed, steps, {**base, **(overrides or {})})


def random_returns(episodes: int, seed: int = 0) -> list[float]:
    """Σ over agents of mpe2 returns of ``episodes`` uniform random episodes on the evaluation
    seeds (:data:`experiments.spread_mappo.EVAL_SEED`…); ``seed`` seeds the actions."""
    from mpe2 import simple_speaker_listener_v4

    env = simple_speaker_listener_v4.parallel_env(**KW)
    rng = np.random.default_rng(seed)
    sums = []
    for k in range(episodes):
        env.reset(seed=spread_mappo.EVAL_SEED + k)
        total = 0.0
        while env.agents:
            actions = {a: int(rng.integers(env.action_space(a).n)) for a in env.agents}
            _, rewards, *_ = env.step(actions)
            total += float(sum(rewards.values()))
        sums.append(total)
    env.close()
    return sums


#: the listener's discrete moves (mpe2: no action, left, right, down, up)
MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], dtype=float)
#: scripted listeners: to the goal landmark (read from the world: what perfect communication
#: allows a simple controller) or to the landmarks' centroid (what it can do without the word)
TARGETS = ("goal", "centroid")


def scripted_returns(episodes: int, target: str, damping: float = 0.3) -> list[float]:
    """Σ over agents of mpe2 returns of ``episodes`` episodes on the evaluation seeds with a
    scripted listener steering to ``target`` (:data:`TARGETS`): each step it takes the move
    closest in direction to ``target − position − damping·velocity`` (none within 0.02); the
    speaker always says word 0. Not a learned policy: reference points for the table."""
    from mpe2 import simple_speaker_listener_v4

    if target not in TARGETS:
        raise ValueError(f"target {target!r}: use one of {', '.join(TARGETS)}")
    env = simple_speaker_listener_v4.parallel_env(**KW)
    sums = []
    for k in range(episodes):
        env.reset(seed=spread_mappo.EVAL_SEED + k)
        world, total = env.unwrapped.world, 0.0
        while env.agents:
            listener = world.agents[1]
            if target == "goal":
                goal = world.agents[0].goal_b.state.p_pos
            else:
                goal = np.mean([m.state.p_pos for m in world.landmarks], axis=0)
            d = goal - listener.state.p_pos - damping * listener.state.p_vel
            move = int(np.argmax(MOVES @ d)) if np.linalg.norm(d) > 0.02 else 0
            _, rewards, *_ = env.step({"speaker_0": 0, "listener_0": move})
            total += float(sum(rewards.values()))
        sums.append(total)
    env.close()
    return sums


def baseline_row(name: str, sums: list[float], seed: int = 0) -> dict[str, Any]:
    """A reference row (``algo: name``, 0 env steps), in EPyMARL's convention."""
    return {
        "algo": name,
        "tag": "",
        "seed": seed,
        "env_steps": 0,
        "team_return": float(np.mean([speaker_listener_return(s) for s in sums])),
    }


def random_row(episodes: int, seed: int) -> dict[str, Any]:
    """The random policy's row (``algo: random``, 0 env steps), in EPyMARL's convention."""
    return baseline_row("random", random_returns(episodes, seed), seed)


def baseline_rows(episodes: int, seeds: list[int]) -> list[dict[str, Any]]:
    """The random policy's row per seed and one row per scripted listener
    (``scripted-goal``, ``scripted-centroid``)."""
    rows = [random_row(episodes, seed) for seed in seeds]
    for target in TARGETS:
        rows.append(baseline_row(f"scripted-{target}", scripted_returns(episodes, target)))
    return rows


def main() -> None:
    p = spread_mappo.parser(__doc__.split("\n")[0], 200_000, OUT)
    p.add_argument(
        "--baselines",
        action="store_true",
        help="also write the random policy's and the scripted listeners' rows",
    )
    args = p.parse_args()
    if args.report:
        spread_mappo.report(args.out, PUBLISHED)
        return
    overrides = spread_mappo.checked_overrides(args, config)
    if args.baselines:
        with args.out.open("a") as f:
            for row in baseline_rows(args.eval_episodes, args.seeds):
                f.write(json.dumps(row) + "\n")
                print(row, flush=True)
    spread_mappo.train_arms(args, overrides, config, speaker_listener_return)
    spread_mappo.report(args.out, PUBLISHED)


if __name__ == "__main__":
    main()
