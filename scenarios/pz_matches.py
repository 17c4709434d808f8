"""Who won a game: win / draw / loss from the players' (or teams') returns at the episode's end.

Pure functions over returns (no env). A seat wins when its return is strictly above every other
seat's, draws when it ties for the top, and loses when another seat's return is higher: in a
two-player zero-sum game (PettingZoo's classic games: +1 / −1, or 0 / 0 for a draw) that is the
sign of its own return. :func:`match_metrics` is what a two-player PettingZoo scenario adds to
each episode's metrics (``<agent>/win``, ``<agent>/draw``, ``<agent>/loss``, each 1.0 or 0.0), so
training reports each seat's rates (``charts/<agent>/win``...); evaluation against a fixed
opponent (``trainers.opponents``) uses :func:`result_of` per seat.

Example:
    >>> result_of(1.0, [-1.0]), result_of(0.0, [0.0]), result_of(-3.0, [2.0, -5.0])
    ('win', 'draw', 'loss')
    >>> match_metrics({"player_1": 1.0, "player_2": -1.0})["player_2/loss"]
    1.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

RESULTS = ("win", "draw", "loss")


def result_of(mine: float, others: Sequence[float]) -> str:
    """``"win"``, ``"draw"`` or ``"loss"`` of a seat with return ``mine`` against the returns of
    the other seats (``"draw"`` when there is no other seat)."""
    best = max(others, default=mine)
    return "win" if mine > best else "draw" if mine == best else "loss"


def match_metrics(returns: Mapping[str, float]) -> dict[str, float]:
    """Each player's ``<agent>/win``, ``/draw`` and ``/loss`` (1.0 or 0.0) where ``returns``
    holds exactly two players (a two-player game); nothing otherwise."""
    if len(returns) != 2:
        return {}
    out: dict[str, float] = {}
    for agent, mine in returns.items():
        res = result_of(mine, [v for a, v in returns.items() if a != agent])
        out.update({f"{agent}/{r}": float(r == res) for r in RESULTS})
    return out
