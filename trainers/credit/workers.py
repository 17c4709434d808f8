"""Crediting episodes, in this process or spread over Ray actors.

A :class:`CreditJob` is what crediting one finished episode needs; :func:`credit_episode` turns
it into an :class:`EpisodeCredit` under a :class:`~trainers.configs.credit.CreditConfig` (a pure
function of the job: the same credits in any process). :class:`CreditPool` splits a batch's
jobs by cost (``2**players`` replays each) between this process and ``credit.workers − 1``
:class:`CreditWorker` actors (``num_cpus=0``: they use the cores the trainer leaves idle and
never block scheduling), each with its own env built from the env config.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from trainers.credit.settings import CreditError, shapley_credit
from trainers.credit.trie import EpisodeReplays
from trainers.credit.values import CachedValue, leave_one_out

if TYPE_CHECKING:
    from scenarios.base import Outcome
    from scenarios.graph_env import GraphEnv
    from trainers.configs.credit import CreditConfig

__all__ = ["CreditJob", "CreditPool", "CreditWorker", "EpisodeCredit", "credit_episode"]

#: tolerance of the check ``v(N) == Outcome.reward`` (replays are exact; this absorbs float sums)
REPLAY_TOL = 1e-6


class CreditJob(NamedTuple):
    """One finished episode to credit."""

    seed: int
    outcome: Outcome
    players: list[str]
    actions: dict[str, list[Any]]
    #: replay ``v(N)`` and check it against ``outcome.reward`` (else ``v(N)`` is the reward)
    verify: bool


@dataclasses.dataclass
class EpisodeCredit:
    """What crediting one finished episode gave.

    Attributes:
        seed: the episode's seed.
        team_return: ``Outcome.reward``.
        credits: ``{player: credit}`` written into the terminal rewards.
        v_empty: ``v(∅)`` when the method evaluated it (Shapley), else ``None``.
        lookups: coalition values asked for by the method (with repeats of the same one).
        coalitions: distinct coalitions asked for.
        replays: replays actually run (the real cost).
        verified: whether ``v(N)`` was replayed and checked against ``team_return``.
    """

    seed: int
    team_return: float
    credits: dict[str, float]
    v_empty: float | None = None
    lookups: int = 0
    coalitions: int = 0
    replays: int = 0
    verified: bool = False


def replay_env(env_config: Mapping[str, Any]) -> GraphEnv:
    """The ``GraphEnv`` an ``RLlibGraphEnv`` env config builds (as on the env runners)."""
    from scenarios.rllib_env import RLlibGraphEnv

    return RLlibGraphEnv(dict(env_config)).env


def credit_episode(env: GraphEnv, credit: CreditConfig, job: CreditJob) -> EpisodeCredit:
    """Credit one episode: ``team``, ``local``, ``loo`` or ``shapley`` (see the connector).

    Raises:
        CreditError: ``local`` without ``Outcome.local`` for a player, or a replay of ``N``
            that differs from the episode's outcome.
    """
    team_return = float(job.outcome.reward)
    if credit.method == "team":
        return EpisodeCredit(job.seed, team_return, dict.fromkeys(job.players, team_return))
    if credit.method == "local":
        return EpisodeCredit(job.seed, team_return, _local(env, job))
    replays = EpisodeReplays(env, job.seed, job.actions)
    full = frozenset(job.players)

    def value(coalition: frozenset[str]) -> float:
        # v(N) is the episode itself; replayed only to check that replays are faithful
        return team_return if coalition == full and not job.verify else replays(coalition)

    v = CachedValue(value)
    v_full = v(full)
    if job.verify and not math.isclose(v_full, team_return, rel_tol=0.0, abs_tol=REPLAY_TOL):
        raise CreditError(
            f"the replay of episode seed={job.seed} with its recorded actions returned "
            f"{v_full!r}, but the episode's outcome was {team_return!r}: the actions "
            "stored in the episode are not the ones the env executed (RLlib stores the "
            "module's Box actions before unsquashing/clipping them: set "
            "config.env_runners(normalize_actions=False, clip_actions=False), or have "
            "the env report its executed actions in the final infos['actions']), or "
            "the scenario is not deterministic given the seed"
        )
    v_empty = None
    if credit.method == "loo":
        credits = leave_one_out(job.players, v)
    else:
        credits = shapley_credit(credit, job.players, v, job.seed)
        v_empty = v(frozenset())
    return EpisodeCredit(
        job.seed, team_return, credits, v_empty, v.lookups, len(v), replays.replays, job.verify
    )


def _local(env: GraphEnv, job: CreditJob) -> dict[str, float]:
    local = getattr(job.outcome, "local", None) or {}
    missing = [a for a in job.players if a not in local]
    if missing:
        raise CreditError(
            f"credit method 'local' needs Outcome.local for every agent that acted, but "
            f"scenario {env.scenario.name!r} gave none for {missing} (episode seed={job.seed}): "
            "fill Outcome.local in the scenario's score(), or use credit method 'loo' or "
            "'shapley', which need only the team reward"
        )
    return {a: float(local[a]) for a in job.players}


class CreditWorker:
    """A process that credits episodes (run as a Ray actor by :class:`CreditPool`)."""

    def __init__(self, credit: CreditConfig, env_config: Mapping[str, Any]) -> None:
        self.credit = credit
        self.env = replay_env(env_config)

    def credits(self, jobs: list[CreditJob]) -> list[EpisodeCredit]:
        return [credit_episode(self.env, self.credit, job) for job in jobs]


class CreditPool:
    """This process plus ``credit.workers − 1`` :class:`CreditWorker` actors, started on first
    use (none when Ray is not running, for ``team``/``local``, or for an env given as an
    object rather than a config)."""

    def __init__(self, credit: CreditConfig, env_config: Mapping[str, Any]) -> None:
        self.credit = credit
        self.env_config = dict(env_config)
        self.actors: list[Any] | None = None

    def run(self, env: GraphEnv, jobs: list[CreditJob]) -> list[EpisodeCredit]:
        """Credits of ``jobs``, in order (the same in any split)."""
        actors = self._actors()
        if not actors or len(jobs) < 2:
            return [credit_episode(env, self.credit, job) for job in jobs]
        import ray

        shares = _shares(jobs, len(actors) + 1)  # this process takes the first share
        refs = [
            a.credits.remote([jobs[i] for i in share])
            for a, share in zip(actors, shares[1:], strict=True)
        ]
        out: list[EpisodeCredit | None] = [None] * len(jobs)
        for i in shares[0]:
            out[i] = credit_episode(env, self.credit, jobs[i])
        for share, records in zip(shares[1:], ray.get(refs), strict=True):
            for i, record in zip(share, records, strict=True):
                out[i] = record
        return out  # type: ignore[return-value]

    def _actors(self) -> list[Any]:
        want = (self.credit.workers or 1) - 1
        if want < 1 or self.credit.method not in ("loo", "shapley") or "env" in self.env_config:
            return []
        if self.actors is None:
            import ray

            if not ray.is_initialized():
                return []
            actor = ray.remote(num_cpus=0)(CreditWorker)  # CPU is the idle cores', not Ray's
            one = dataclasses.replace(self.credit, workers=1)
            self.actors = [actor.remote(one, self.env_config) for _ in range(want)]
        return self.actors

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "actors": None}  # actors are restarted where the pool lands


def _shares(jobs: list[CreditJob], k: int) -> list[list[int]]:
    """Split job indices into ``k`` shares of about equal cost (``2**players`` replays each),
    largest first onto the least loaded share."""
    load = [0.0] * k
    shares: list[list[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(jobs)), key=lambda i: -len(jobs[i].players)):
        j = load.index(min(load))
        shares[j].append(i)
        load[j] += 2.0 ** len(jobs[i].players)
    return shares
