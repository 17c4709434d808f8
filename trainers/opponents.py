"""Two-player and team games against a fixed opponent: win / draw / loss rates per seat.

``evaluate_vs(checkpoint, opponent)`` plays the checkpoint's policy greedily in one seat and the
opponent in every other seat, for ``episodes`` games per seat, and reports each seat's win, draw
and loss rates (:func:`scenarios.pz_matches.result_of` on the seats' returns at the episode's
end) and their mean over seats. The opponent is

* ``"random"``: a uniformly random action, legal where the observation carries an action mask
  (``{"observations", "action_mask"}``, :mod:`scenarios.pz_spaces`), from a seeded generator;
* a run directory or checkpoint (a frozen earlier policy of the same scenario): it samples its
  own policy (``forward_exploration``) unless ``opponent_greedy`` — two greedy policies in a
  deterministic game would replay one game ``episodes`` times.

Seats are the scenario's roles where it has two or more (teams: ``red_*`` against ``blue_*``
in magent2's battle), else its agents (``player_1`` against ``player_2`` in tic-tac-toe, whose
players share one pool). Returns are the env's own per-agent returns
(``<agent>/return`` of the episode's metrics, as PettingZoo scenarios report them), summed per
seat.

Command line (the same as ``marl eval <checkpoint> --opponent ...``)::

    python -m trainers.opponents runs/<run> --opponent random --episodes 200
    python -m trainers.opponents runs/<run> --opponent runs/<run>/checkpoints/iter_000010
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scenarios.pz_matches import RESULTS, result_of
from trainers.configs.typed import ConfigError
from trainers.evaluate import EVAL_SEED, load_team

RANDOM = "random"


@dataclasses.dataclass
class VsResult:
    """Per-seat rates against one opponent.

    Attributes:
        opponent: ``"random"`` or the opponent checkpoint's path.
        seats: seat → its agents.
        rates: seat → ``{"win", "draw", "loss", "return", "failed", "episodes"}`` (the
            checkpoint playing that seat).
        summary: the mean of ``win``, ``draw``, ``loss``, ``win_or_draw`` and ``failed`` over
            seats.
        episodes: one dict per game: ``seat``, ``seed``, ``result``, ``returns`` (seat →
            return), ``failure`` and ``error`` (the env's: a node raised, e.g. an illegal
            action; such a game still counts by its returns, and ``failed`` counts it).
    """

    opponent: str
    seats: dict[str, list[str]]
    rates: dict[str, dict[str, float]]
    summary: dict[str, float]
    episodes: list[dict[str, Any]]


def seats_of(agents: Sequence[str], roles: Mapping[str, str]) -> dict[str, list[str]]:
    """Seat → agents: the roles where there are two or more, else one seat per agent.

    >>> seats_of(["player_1", "player_2"], {"player_1": "player", "player_2": "player"})
    {'player_1': ['player_1'], 'player_2': ['player_2']}
    >>> seats_of(["red_0", "red_1", "blue_0"], {"red_0": "red", "red_1": "red", "blue_0": "blue"})
    {'red': ['red_0', 'red_1'], 'blue': ['blue_0']}
    """
    by_role: dict[str, list[str]] = {}
    for a in agents:
        by_role.setdefault(roles.get(a, a), []).append(a)
    return by_role if len(by_role) >= 2 else {a: [a] for a in agents}


class RandomPolicy:
    """Uniformly random actions, legal ones where an observation carries an action mask."""

    def __init__(self, action_spaces: Mapping[str, Any], seed: int) -> None:
        self.spaces = dict(action_spaces)
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        """Nothing to forget (the same interface as :class:`~trainers.evaluate.TeamPolicy`)."""

    def act(self, observations: Mapping[str, Any], explore: bool = True) -> dict[str, Any]:
        from gymnasium import spaces

        from scenarios.pz_spaces import MASK_KEY

        out: dict[str, Any] = {}
        for agent, obs in observations.items():
            space = self.spaces[agent]
            mask = obs.get(MASK_KEY) if isinstance(obs, Mapping) else None
            if isinstance(space, spaces.Discrete):
                n = int(space.n)
                legal = np.arange(n) if mask is None else np.flatnonzero(np.asarray(mask) > 0)
                if legal.size == 0:
                    raise ValueError(f"{agent}: its action mask allows no action")
                out[agent] = int(space.start) + int(self.rng.choice(legal))
            else:  # no mask convention beyond Discrete: sample the space from our generator
                space.seed(int(self.rng.integers(2**31 - 1)))
                out[agent] = space.sample()
        return out


def evaluate_vs(
    checkpoint: str | Path,
    opponent: str | Path = RANDOM,
    episodes: int = 100,
    *,
    seed: int = EVAL_SEED,
    opponent_greedy: bool = False,
    show: bool = True,
) -> VsResult:
    """Play ``checkpoint`` greedily in each seat against ``opponent`` (see the module doc).

    Raises:
        ConfigError: fewer than 1 episode, a scenario with a single seat, or an opponent
            checkpoint whose pools do not cover the scenario's agents.
    """
    from trainers.run.process import setup_process

    if episodes < 1:
        raise ConfigError(f"episodes must be ≥ 1, got {episodes}")
    setup_process(hash_seed_matters=False)
    _, plan, policy = load_team(checkpoint)
    env = plan.env.replace(rewards=None).make_env()
    seats = seats_of(list(env.possible_agents), plan.agent_to_pool)
    if len(seats) < 2:
        raise ConfigError(
            f"{plan.scenario_id} has one agent: an opponent needs a game of two or more seats"
        )
    if str(opponent) == RANDOM:
        other: Any = RandomPolicy({a: env.action_space(a) for a in env.possible_agents}, seed)
    else:
        _, oplan, other = load_team(opponent)
        missing = [a for a in env.possible_agents if a not in oplan.agent_to_pool]
        if missing:
            raise ConfigError(
                f"opponent {opponent}: its run has no pool for {', '.join(missing)}: "
                "use a checkpoint of a run of the same scenario"
            )
    games = []
    for seat, mine in seats.items():
        for i in range(episodes):
            returns = _game(env, policy, other, set(mine), seed + i, opponent_greedy)
            by_seat = {s: sum(returns[a] for a in agents) for s, agents in seats.items()}
            res = result_of(by_seat[seat], [v for s, v in by_seat.items() if s != seat])
            games.append(
                {"seat": seat, "seed": seed + i, "result": res, "returns": by_seat,
                 "failure": env.failure, "error": env.error}
            )  # fmt: skip
    failed = {s: [g["failure"] is not None for g in games if g["seat"] == s] for s in seats}
    rates = {
        seat: {
            **{r: float(np.mean([g["result"] == r for g in games if g["seat"] == seat]))
               for r in RESULTS},
            "return": float(np.mean([g["returns"][seat] for g in games if g["seat"] == seat])),
            "failed": float(np.mean(failed[seat])),
            "episodes": float(episodes),
        }
        for seat in seats
    }  # fmt: skip
    summary = {r: float(np.mean([x[r] for x in rates.values()])) for r in RESULTS}
    summary["win_or_draw"] = summary["win"] + summary["draw"]
    summary["failed"] = float(np.mean([g["failure"] is not None for g in games]))
    result = VsResult(str(opponent), seats, rates, summary, games)
    if show:
        _print(result, plan.scenario_id, checkpoint)
    return result


def _game(
    env: Any, policy: Any, other: Any, mine: set[str], seed: int, opponent_greedy: bool
) -> dict[str, float]:
    """One episode: agents in ``mine`` act greedily by ``policy``, the rest by ``other``;
    each agent's own return."""
    policy.reset()
    other.reset()
    obs, infos = env.reset(seed=seed)
    while env.agents:
        acting = [a for a in env.agents if infos[a]["acting"]]
        actions = policy.act({a: obs[a] for a in acting if a in mine})
        theirs = {a: obs[a] for a in acting if a not in mine}
        if theirs:
            actions.update(other.act(theirs, explore=not opponent_greedy))
        obs, _, _, _, infos = env.step(actions)
    outcome = env.outcome
    metrics = outcome.metrics or {}
    local = outcome.local or {}
    return {
        a: float(metrics.get(f"{a}/return", local.get(a, outcome.reward)))
        for a in env.possible_agents
    }


def _print(result: VsResult, scenario: str, checkpoint: str | Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{scenario} · checkpoint (greedy) against {result.opponent}", title_justify="left"
    )
    for col in ("seat", "agents", "games", "win", "draw", "loss", "failed", "mean return"):
        table.add_column(col, justify="left" if col in ("seat", "agents") else "right")
    for seat, r in result.rates.items():
        agents = result.seats[seat]
        table.add_row(
            seat,
            ", ".join(agents) if len(agents) <= 3 else f"{len(agents)} agents",
            f"{int(r['episodes'])}",
            *(f"{100 * r[k]:.1f}%" for k in (*RESULTS, "failed")),
            f"{r['return']:.3f}",
        )
    s = result.summary
    table.add_row("mean", "", "", *(f"{100 * s[k]:.1f}%" for k in (*RESULTS, "failed")), "")
    console = Console()
    console.print(f"checkpoint: {checkpoint}", overflow="fold")
    console.print(table)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a run directory or checkpoint")
    p.add_argument("--opponent", default=RANDOM, help="random, or a run directory / checkpoint")
    p.add_argument("--episodes", type=int, default=100, help="games per seat")
    p.add_argument("--seed", type=int, default=EVAL_SEED, help="first game's seed")
    p.add_argument("--opponent-greedy", action="store_true", help="the checkpoint opponent too")
    args = p.parse_args(argv)
    from trainers.cli_common import config_errors

    with config_errors():
        evaluate_vs(
            args.checkpoint,
            args.opponent,
            args.episodes,
            seed=args.seed,
            opponent_greedy=args.opponent_greedy,
        )


if __name__ == "__main__":
    main()
