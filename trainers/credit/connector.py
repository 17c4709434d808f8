"""Credit inside RLlib: a learner connector piece that rewrites terminal rewards before GAE.

:class:`CreditConnector` runs on the learner, on complete ``MultiAgentEpisode`` chunks (set
``config.env_runners(batch_mode="complete_episodes")``), before ``GeneralAdvantageEstimation``.
In every finished episode it replaces each player's terminal team reward ``R`` by its credit
(``r_T ← r_T − R + credit``; everything else the agent received is kept) under a
:class:`~trainers.configs.credit.CreditConfig`, which it takes as it is (validated by its
``check()``).
Credits come from :func:`trainers.credit.workers.credit_episode`; ``v(N)`` is replayed and
checked against ``R`` for the first :data:`VERIFY_FIRST` episodes and every
:data:`VERIFY_EVERY`-th after that. Unfinished chunks pass untouched; a finished chunk that
misses the reset, or episodes without ``seed`` / ``outcome`` infos, raise :class:`CreditError`.
Metrics: ``credit/<agent>`` and ``credit_cost/...`` in the learner's ``MetricsLogger``.
The design (rewrite, replays, workers) is in ``docs/internals.md``.

Example:
    >>> from trainers.configs.experiment import CreditConfig
    >>> factory = make_credit_connector(CreditConfig(method="shapley"),
    ...                                 {"scenario": "delegate", "topology": "star:3"})
    >>> factory  # doctest: +ELLIPSIS
    CreditConnectorFactory(CreditConfig(method='shapley', ...))
    >>> # config.learners(learner_connector=factory)  # plus batch_mode="complete_episodes"
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym
import numpy as np
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from trainers.credit.settings import CreditError
from trainers.credit.workers import CreditJob, CreditPool, EpisodeCredit, replay_env

if TYPE_CHECKING:
    from scenarios.graph_env import GraphEnv
    from trainers.configs.credit import CreditConfig

__all__ = ["CreditConnector", "CreditConnectorFactory", "make_credit_connector"]

#: ``v(N)`` is the episode's own return; it is replayed (to check that replays reproduce the
#: episode) for the first ``VERIFY_FIRST`` episodes a connector credits and every
#: ``VERIFY_EVERY``-th after that, saving one replay on the other episodes.
VERIFY_FIRST = 8
VERIFY_EVERY = 16


def make_credit_connector(
    credit: CreditConfig, env_config: Mapping[str, Any]
) -> CreditConnectorFactory:
    """The ``learner_connector`` callable for ``config.learners(learner_connector=...)``.

    Args:
        credit: the credit config, checked here with its own ``check()``.
        env_config: the env config given to ``RLlibGraphEnv`` (``{"scenario": NAME,
            "topology": SPEC, "kwargs": {...}}`` or ``{"env": GraphEnv}``); the learner and
            every credit worker rebuild the env from it.

    Raises:
        ConfigError: a credit config that its ``check()`` refuses.
    """
    credit.check()
    return CreditConnectorFactory(credit, dict(env_config))


class CreditConnectorFactory:
    """Builds one :class:`CreditConnector` per Learner (RLlib calls it with the spaces)."""

    def __init__(self, credit: CreditConfig, env_config: dict[str, Any]) -> None:
        self.credit = credit
        self.env_config = env_config

    def __call__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> CreditConnector:
        return CreditConnector(
            input_observation_space,
            input_action_space,
            credit=self.credit,
            env_config=self.env_config,
        )

    def __repr__(self) -> str:
        return f"CreditConnectorFactory({self.credit!r})"


class AgentEnd(NamedTuple):
    """Where one player's episode ends: the outcome sits in ``infos[k]`` after ``k`` actions."""

    episode: Any  # SingleAgentEpisode
    k: int
    infos: list[Any]


class CreditConnector(ConnectorV2):
    """Learner connector piece: terminal team reward → per-agent credit, before GAE.

    Args:
        input_observation_space: passed on to ``ConnectorV2``.
        input_action_space: passed on to ``ConnectorV2``.
        credit: the (checked) credit config.
        env_config: the ``RLlibGraphEnv`` env config (the env is built on first use).
        env: a ready ``GraphEnv`` to replay with instead of building one (tests, benches).

    Attributes:
        totals: running totals over the piece's life: ``episodes``, ``lookups``,
            ``coalitions``, ``replays``, ``skipped`` (unfinished chunks), ``verified`` and
            ``seconds`` (wall time spent in ``__call__``).
        last: the :class:`EpisodeCredit` of every episode credited by the last call.
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        credit: CreditConfig,
        env_config: Mapping[str, Any] | None = None,
        env: GraphEnv | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.credit = credit
        self.env_config = dict(env_config or {})
        self._env = env
        self.pool = CreditPool(credit, self.env_config)
        self.totals: dict[str, float] = dict.fromkeys(
            ("episodes", "lookups", "coalitions", "replays", "skipped", "verified"), 0
        )
        self.totals["seconds"] = 0.0
        self.last: list[EpisodeCredit] = []

    @property
    def env(self) -> GraphEnv:
        """The ``GraphEnv`` used for replays (built from ``env_config`` on first use)."""
        if self._env is None:
            self._env = replay_env(self.env_config)
        return self._env

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if "env" not in self.env_config:
            state["_env"] = None  # rebuilt where the piece lands
        return state

    def __call__(self, *, batch: dict[str, Any], episodes: list[Any], **kwargs: Any) -> Any:
        start = time.perf_counter()
        self.last = self.assign_all(episodes)
        seconds = time.perf_counter() - start
        self.totals["seconds"] += seconds
        metrics = kwargs.get("metrics")
        if metrics is not None and self.last:
            _log(metrics, self.last, seconds)
        return batch

    def assign(self, episode: MultiAgentEpisode) -> EpisodeCredit | None:
        """Rewrite the terminal rewards of one finished episode in place.

        Returns:
            What was done, or ``None`` for a chunk without the terminal step (left untouched).

        Raises:
            CreditError: a single-agent episode, a finished chunk that does not start at the
                reset, missing ``seed`` / ``outcome`` infos, ``local`` without
                ``Outcome.local`` for a player, or a replay of ``N`` that differs from the
                episode's outcome.
        """
        records = self.assign_all([episode])
        return records[0] if records else None

    def assign_all(self, episodes: Sequence[MultiAgentEpisode]) -> list[EpisodeCredit]:
        """:meth:`assign` for many episodes; with ``credit.workers > 1`` (and Ray running)
        their replays are spread over that many processes (this one and Ray actors)."""
        found: list[tuple[dict[str, AgentEnd], CreditJob]] = []
        for episode in episodes:
            ends = self._ends(episode)
            if ends is not None:
                verify = _should_verify(int(self.totals["episodes"]) + len(found))
                found.append((ends, _job(episode, ends, verify)))
        records = self.pool.run(self.env, [job for _, job in found])
        for (ends, job), record in zip(found, records, strict=True):
            team_return = float(job.outcome.reward)
            for agent in job.players:
                end = ends[agent]
                old = float(end.episode.get_rewards(end.k - 1))
                _set_reward(end.episode, end.k - 1, old - team_return + record.credits[agent])
            self.totals["episodes"] += 1
            self.totals["verified"] += record.verified
            self.totals["lookups"] += record.lookups
            self.totals["coalitions"] += record.coalitions
            self.totals["replays"] += record.replays
        return records

    def _ends(self, episode: MultiAgentEpisode) -> dict[str, AgentEnd] | None:
        """Each agent's end of a finished episode; ``None`` for an unfinished chunk."""
        if not isinstance(episode, MultiAgentEpisode):
            raise CreditError(
                f"credit needs MultiAgentEpisodes (a multi-agent env such as "
                f"scenarios.rllib_env.RLlibGraphEnv), got {type(episode).__name__}"
            )
        ends: dict[str, AgentEnd] = {}
        for agent, sa in episode.agent_episodes.items():
            infos = sa.get_infos()
            k = next((i for i, info in enumerate(infos) if "outcome" in (info or {})), None)
            if k is not None:
                ends[agent] = AgentEnd(sa, k, infos)
        if not ends:
            if episode.is_done:
                raise CreditError(
                    f"episode {episode.id_} ended without an 'outcome' in any agent's final "
                    "infos: credit needs an env that reports the verifier's Outcome at the end "
                    "(scenarios.rllib_env.RLlibGraphEnv over a GraphEnv does)"
                )
            self.totals["skipped"] += 1
            return None
        if episode.env_t_started != 0 or any(e.episode.t_started != 0 for e in ends.values()):
            raise CreditError(
                f"episode {episode.id_} reached the learner as a chunk that starts at env step "
                f"{episode.env_t_started}, so its earlier actions are in another chunk and the "
                f"episode cannot be replayed: set config.env_runners(batch_mode="
                f"'complete_episodes') for credit method {self.credit.method!r}"
            )
        return ends


def _should_verify(i: int) -> bool:
    """Replay ``N`` for the first :data:`VERIFY_FIRST` episodes, then every
    :data:`VERIFY_EVERY`-th (counted over the episodes a piece credited)."""
    return i < VERIFY_FIRST or i % VERIFY_EVERY == 0


def _job(episode: MultiAgentEpisode, ends: dict[str, AgentEnd], verify: bool) -> CreditJob:
    first = next(iter(ends.values()))
    actions = _episode_actions(ends)
    players = [a for a in ends if a in actions]
    seed = _episode_seed(episode, first.infos)
    return CreditJob(seed, first.infos[first.k]["outcome"], players, actions, verify)


def _episode_actions(ends: Mapping[str, AgentEnd]) -> dict[str, list[Any]]:
    """Each player's actions: as executed, when the env reports them in the final infos
    (``infos["actions"]``, e.g. ``GraphEnv.episode_actions()``), else as the episode stores them
    (the module's actions, which RLlib may still unsquash or clip for Box spaces)."""
    for end in ends.values():
        executed = end.infos[end.k].get("actions")
        if executed is not None:
            return {a: list(executed.get(a, ())) for a in ends if executed.get(a)}
    return {
        agent: [end.episode.get_actions(i) for i in range(end.k)]
        for agent, end in ends.items()
        if end.k > 0
    }


def _episode_seed(episode: MultiAgentEpisode, infos: list[Any]) -> int:
    for info in infos:
        if info and "seed" in info and info["seed"] is not None:
            return int(info["seed"])
    raise CreditError(
        f"episode {episode.id_} has no 'seed' in its infos: counterfactual replays need the "
        "episode seed; use scenarios.rllib_env.RLlibGraphEnv (GraphEnv puts it in every info)"
    )


def _set_reward(sa: Any, index: int, value: float) -> None:
    """Overwrite one reward, keeping its float64 precision.

    A numpy'd episode checks the value against the float32 reward ``Box``, and gymnasium warns
    about every Python float it casts for that check; the stored value is not cast. Episodes
    from remote env runners hold read-only arrays (Ray's zero-copy numpy): those are copied
    first.
    """
    data = sa.rewards.data
    if isinstance(data, np.ndarray) and not data.flags.writeable:
        sa.rewards.data = data.copy()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Casting input x to numpy array")
        sa.set_rewards(new_data=value, at_indices=index)


def _log(metrics: Any, records: list[EpisodeCredit], seconds: float) -> None:
    """``credit/<agent>`` (mean credit) and ``credit_cost/...`` for one call's episodes."""
    per_agent: dict[str, list[float]] = {}
    for rec in records:
        for agent, c in rec.credits.items():
            per_agent.setdefault(agent, []).append(c)
    for agent, values in per_agent.items():
        metrics.log_value(("credit", agent), float(np.mean(values)), reduce="mean")
    replays = sum(r.replays for r in records)
    sums = {
        "episodes": len(records),
        "replays": replays,
        "coalitions": sum(r.coalitions for r in records),
        "players": sum(len(r.credits) for r in records),
        "seconds": seconds,
    }
    for key, value in sums.items():
        metrics.log_value(("credit_cost", key), value, reduce="sum")
    metrics.log_value(("credit_cost", "replays_per_episode"), replays / len(records), reduce="mean")
