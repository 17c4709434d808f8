"""The per-episode totals RLlib's ``MultiAgentEnvRunner.get_metrics`` logs, each agent's return
summed once.

Contract: :func:`episode_totals` returns exactly the arguments RLlib's ``get_metrics`` passes to
``_log_episode_metrics`` for a finished episode and its earlier chunks (the same sums in the
same order, so the same floats); RLlib calls ``SingleAgentEpisode.get_return`` three times
per agent (the episode's return, the agent's, the module's), this once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any


def episode_totals(episode: Any, chunks: Sequence[Any]) -> tuple:
    """``(length, return, duration_s, agent returns, module returns, agent steps)`` of a
    finished ``episode`` whose earlier chunks (already returned by ``sample()``) are
    ``chunks``, as RLlib's ``get_metrics`` computes them."""
    length = len(episode)
    agent_steps = defaultdict(int, {str(a): len(sa) for a, sa in episode.agent_episodes.items()})
    returns = [(sa, sa.get_return()) for sa in episode.agent_episodes.values()]
    ret = sum(r for _, r in returns)
    duration = episode.get_duration_s()
    agent_returns = defaultdict(float, {str(sa.agent_id): r for sa, r in returns})
    module_returns: defaultdict[str, float] = defaultdict(float)
    for sa, r in returns:
        module_returns[sa.module_id] += r
    for chunk in chunks:
        chunk_returns = [(sa, sa.get_return()) for sa in chunk.agent_episodes.values()]
        length += len(chunk)
        ret += sum(r for _, r in chunk_returns)
        duration += chunk.get_duration_s()
        for sa, r in chunk_returns:
            agent_steps[str(sa.agent_id)] += len(sa)
            agent_returns[str(sa.agent_id)] += r
            module_returns[sa.module_id] += r
    return length, ret, duration, agent_returns, module_returns, dict(agent_steps)
