"""EPyMARL's team-return convention for MPE ``simple_spread`` (and ``simple_speaker_listener``,
at the end), from mpe2's per-agent returns.

EPyMARL (and the MAPPO code) run the old MPE reward: every agent receives ``G − C_i`` each step,
with ``G`` minus the summed nearest-agent landmark distances and ``C_i`` counting agent ``i``'s
collisions *including one with itself*; the reported return is the shared return summed over
agents and divided by their number, i.e. per episode ``Σ_t (N·G_t − 2·P_t − N)`` (``P_t`` the
colliding pairs). mpe2 with ``local_ratio=0.5`` gives ``r_i = 0.5·G − 0.5·c_i`` (``c_i``
collisions with others), so ``Σ_i r_i = 0.5·N·G − P`` per step and

    R_team = 2·Σ_i R_i − N·T      (N agents, T steps; 2·Σ_i R_i − 75 for N=3, T=25).

``tests/test_pettingzoo_env.py`` checks this against distances and collisions computed from the
env's world state.
"""

from __future__ import annotations

#: mpe2 simple_spread as the benchmarks run it
N_AGENTS, STEPS, LOCAL_RATIO = 3, 25, 0.5


def team_return(sum_return: float, n_agents: int = N_AGENTS, steps: int = STEPS) -> float:
    """EPyMARL's episode team return from Σ over agents of mpe2 returns (``local_ratio=0.5``).

    >>> team_return(-100.0)
    -275.0
    """
    return 2.0 * sum_return - n_agents * steps


def team_return_from_world(
    distance_sum: float, collision_pairs: float, n_agents: int = N_AGENTS, steps: int = STEPS
) -> float:
    """The same from the world: Σ_t Σ_landmarks nearest-agent distance, Σ_t colliding pairs."""
    return -n_agents * distance_sum - 2.0 * collision_pairs - n_agents * steps


# ----- simple_speaker_listener --------------------------------------------------------------
#: EPyMARL's MPE fork marks speaker-listener's world ``collaborative``, so every agent receives
#: the sum of the agents' rewards, ``2·(−d²)`` (``d`` the listener's distance to the goal
#: landmark, both agents' own reward being ``−d²``); the benchmark paper reports that shared
#: return summed over agents and divided by their number, i.e. ``Σ_t 2·(−d²_t)``. mpe2 gives each
#: of the two agents ``−d²``, so EPyMARL's return is exactly Σ over agents of mpe2's returns.
SL_AGENTS = 2


def speaker_listener_return(sum_return: float) -> float:
    """EPyMARL's speaker-listener episode return from Σ over agents of mpe2 returns (itself).

    >>> speaker_listener_return(-30.0)
    -30.0
    """
    return float(sum_return)


def speaker_listener_return_from_world(dist2_sum: float) -> float:
    """The same from the world: ``dist2_sum`` = Σ_t of the listener's squared distance to the
    goal landmark after each step."""
    return -SL_AGENTS * dist2_sum
