"""Credit assignment inside RLlib: a learner connector piece that rewrites terminal rewards.

RLlib's new API stack runs the pieces given to ``config.learners(learner_connector=...)`` on the
learner, on the sampled ``MultiAgentEpisode`` objects, *before* ``GeneralAdvantageEstimation``
(PPO prepends ``AddOneTsToEpisodesAndTruncate`` and appends GAE around them). That is where
coupling logic between agents belongs: :class:`CreditConnector` replaces, in every finished
episode, each agent's terminal team reward by its credit, and GAE then computes advantages from
the credited rewards. Reported episode returns (computed on the env runners) stay the team's.

Per finished episode, with ``R`` = ``Outcome.reward`` (the team return, from the final infos),
``players`` = the agents that acted in it, and ``v(S)`` = the team return of a counterfactual
replay of the episode (same seed, the episode's own actions) in which only the agents of ``S``
act and every other agent is absent (:meth:`scenarios.engine.GraphEnv.value`):

* ``team``: ``R`` (nothing changes; useful only for the metrics);
* ``local``: ``Outcome.local[agent]``;
* ``loo``: ``v(N) − v(N ∖ {i})`` (difference rewards);
* ``shapley``: ``φ_i`` from :mod:`trainers.credit` — exact up to ``exact_max`` players (or with
  ``estimator="exact"``), else the chosen estimator with ``budget`` coalition evaluations
  (seeded by the episode seed, so credit is a deterministic function of the episode). Exact,
  permutation, antithetic and kernel Shapley are efficient: ``Σ_i φ_i = v(N) − v(∅)``.

The rewrite is ``r_T ← r_T − R + credit``: the team return inside the agent's terminal reward is
replaced by its credit, and everything else it received (per-agent rewards, penalties) is kept.
This is exact when the team return is paid at the end (``delegate``, ``relay``, ``toolchain``)
and for agents that act from the first step of scenarios that emit per-step team rewards
(``spread``); an agent that joins later never received the team rewards emitted before its first
decision, so it would be charged for them.

**Replays.** ``v`` is memoised per episode, and replays themselves are shared: replays are
deterministic, so two coalitions that feed the same action at every decision the graph asks for
have the same trajectory and value. :class:`EpisodeReplays` keeps a trie of the decisions seen
in earlier replays of the episode and answers a coalition from it without replaying when its
actions follow a known path (e.g. every coalition without the orchestrator in ``delegate``,
where an absent orchestrator assigns nothing and nobody else is ever asked; or a worker whose
recorded action equals its absent action). Only players are ever present; non-players are
absent in every replay, as in the episode. ``v(N)`` is the episode's own return ``R``; it is
replayed and checked against ``R`` for a connector's first :data:`VERIFY_FIRST` episodes and
every :data:`VERIFY_EVERY`-th after that (a mismatch means replays do not reproduce the episode
trained on, and raises), and taken from ``R`` without a replay otherwise.

**Actions** come from the ``SingleAgentEpisode`` objects (the module's actions), or, when the
env reports them in the final infos as ``infos["actions"]`` (``{agent: [actions]}``, e.g.
``GraphEnv.episode_actions()``), from there: those are the actions the graph executed, which
differ from the stored ones for Box spaces that RLlib unsquashes or clips.

**Episode chunks.** Credit needs the whole episode (every action since the reset) in the chunk
that carries the terminal reward, so run credit methods other than ``team`` with
``config.env_runners(batch_mode="complete_episodes")``. A finished chunk that does not start at
the episode's reset raises a :class:`CreditError` that says so; unfinished chunks (no terminal
reward yet) are passed through untouched.

**Normalisation.** ``credit.normalize`` standardises advantages per *agent* (after GAE, which
already standardises per *module*): it matters when several agents share one module. It needs a
piece after GAE, which a learner connector cannot add; :class:`CreditPPOTorchLearner` (a
``PPOTorchLearner``) appends :class:`PerAgentAdvantageNormalization` after GAE in ``build()``
whenever its pipeline holds a :class:`CreditConnector` with ``normalize=True``; set it with
``config.learners(learner_class=CreditPPOTorchLearner)``.

**Metrics** (logged to the learner's ``MetricsLogger``, reduced per training iteration, so they
show up in ``result["learners"]``): ``credit/<agent>`` (mean credit) and ``credit_cost/...``
(episodes credited, players credited, coalition values asked for, replays run, replays per
episode, and the seconds the piece took).

Example:
    >>> from trainers.config import CreditConfig
    >>> factory = make_credit_connector(CreditConfig(method="shapley"),
    ...                                 {"scenario": "delegate", "topology": "star:3"})
    >>> factory  # doctest: +ELLIPSIS
    CreditConnectorFactory(method='shapley', ...)
    >>> # config.learners(learner_connector=factory)  # plus batch_mode="complete_episodes"
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.connectors.learner import GeneralAdvantageEstimation
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.postprocessing.zero_padding import split_and_zero_pad_n_episodes

from scenarios.engine import action_in_space
from trainers.credit import CachedValue, leave_one_out, min_budget, shapley

if TYPE_CHECKING:
    from scenarios.engine import GraphEnv

__all__ = [
    "CreditConnector",
    "CreditConnectorFactory",
    "CreditError",
    "CreditPPOTorchLearner",
    "CreditWorker",
    "EpisodeCredit",
    "EpisodeReplays",
    "PerAgentAdvantageNormalization",
    "make_credit_connector",
]

METHODS = ("team", "local", "loo", "shapley")
ESTIMATORS = ("auto", "exact", "permutation", "antithetic", "kernel")
#: tolerance of the check ``v(N) == Outcome.reward`` (replays are exact; this absorbs float sums)
REPLAY_TOL = 1e-6
#: ``v(N)`` is the episode's own return; it is replayed (to check that replays reproduce the
#: episode) for the first ``VERIFY_FIRST`` episodes a connector credits and every
#: ``VERIFY_EVERY``-th after that, saving one replay on the other episodes.
VERIFY_FIRST = 8
VERIFY_EVERY = 16


class CreditError(ValueError):
    """A credit method cannot be applied to an episode or scenario; the message names the fix."""


# ----- the factory RLlib calls ----------------------------------------------------------------
def make_credit_connector(credit: Any, env_config: Mapping[str, Any]) -> CreditConnectorFactory:
    """The ``learner_connector`` callable for ``config.learners(learner_connector=...)``.

    RLlib calls it once per Learner as ``factory(input_observation_space,
    input_action_space)`` and inserts the returned piece at the front of the learner pipeline
    (after PPO's ``AddOneTsToEpisodesAndTruncate``, before GAE). The piece builds its own
    :class:`~scenarios.engine.GraphEnv` from ``env_config`` on first use, exactly as
    :class:`~scenarios.rllib_env.RLlibGraphEnv` does on the env runners.

    Args:
        credit: a :class:`trainers.config.CreditConfig` (or anything with its fields
            ``method``, ``estimator``, ``budget``, ``repeats``, ``exact_max``, ``normalize``).
        env_config: the env config given to ``RLlibGraphEnv``: ``{"scenario": NAME,
            "topology": SPEC, "kwargs": {...}}`` or ``{"env": GraphEnv}``. ``NAME`` may be an
            import reference ``package.module:attr``: the learner and every
            :class:`CreditWorker` actor rebuild the scenario by importing it
            (:func:`scenarios.registry.build`), as the env runners do.

    Returns:
        A picklable :class:`CreditConnectorFactory`.

    Raises:
        CreditError: an unknown method or estimator, ``repeats != 1`` (replays are
            deterministic), or a bad ``exact_max`` / ``budget``.
    """
    return CreditConnectorFactory(_CreditSettings.from_config(credit), dict(env_config))


@dataclasses.dataclass(frozen=True)
class _CreditSettings:
    method: str = "team"
    estimator: str = "auto"
    budget: int | None = None
    exact_max: int = 8
    normalize: bool = False
    workers: int = 1

    @classmethod
    def from_config(cls, credit: Any) -> _CreditSettings:
        method = getattr(credit, "method", "team")
        estimator = getattr(credit, "estimator", "auto")
        budget = getattr(credit, "budget", None)
        repeats = getattr(credit, "repeats", 1)
        exact_max = getattr(credit, "exact_max", 8)
        normalize = bool(getattr(credit, "normalize", False))
        workers = getattr(credit, "workers", None) or 1
        if method not in METHODS:
            raise CreditError(f"unknown credit method {method!r}; use one of {', '.join(METHODS)}")
        if estimator not in ESTIMATORS:
            raise CreditError(
                f"unknown Shapley estimator {estimator!r}; use one of {', '.join(ESTIMATORS)}"
            )
        if repeats != 1:
            raise CreditError(
                f"credit.repeats={repeats!r}: GraphEnv replays are deterministic given the "
                "episode seed (scenarios draw their randomness from it), so repeated replays are "
                "identical and averaging them changes nothing; set repeats=1"
            )
        if isinstance(exact_max, bool) or not isinstance(exact_max, int) or exact_max < 0:
            raise CreditError(f"credit.exact_max must be an integer ≥ 0, got {exact_max!r}")
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, int) or budget < 2
        ):
            raise CreditError(
                f"credit.budget must be None (the estimator's default, 8 per player) or an "
                f"integer number of coalition evaluations ≥ 2, got {budget!r}"
            )
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise CreditError(f"credit.workers must be an integer ≥ 1, got {workers!r}")
        return cls(method, estimator, budget, exact_max, normalize, workers)


class CreditConnectorFactory:
    """Builds one :class:`CreditConnector` per Learner (RLlib's ``learner_connector`` form).

    Args:
        settings: validated credit settings (see :func:`make_credit_connector`).
        env_config: the ``RLlibGraphEnv`` env config.
    """

    def __init__(self, settings: _CreditSettings, env_config: dict[str, Any]) -> None:
        self.settings = settings
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
            settings=self.settings,
            env_config=self.env_config,
        )

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"CreditConnectorFactory(method={s.method!r}, estimator={s.estimator!r}, "
            f"budget={s.budget!r}, exact_max={s.exact_max}, normalize={s.normalize}, "
            f"workers={s.workers})"
        )


# ----- replays of one episode -----------------------------------------------------------------
class _Node:
    """A trie node: the decision asked at this point of a replay, or the value at its end."""

    __slots__ = ("children", "decision", "value")

    def __init__(self) -> None:
        self.decision: tuple[str, int] | None = None
        self.children: dict[Any, _Node] = {}
        self.value: float | None = None


class EpisodeReplays:
    """Coalition values ``v(S)`` of one finished episode, by counterfactual replay.

    A replay runs the episode's graph again with the same seed; at each decision, an agent of
    the coalition takes its recorded action (its ``k``-th decision replays its ``k``-th action;
    past the recorded ones, the scenario's default action) and any other agent acts under the
    scenario's ``absent`` policy — the same rules as :meth:`GraphEnv.value`, which runs it.

    Replays that feed the same actions are shared: the graph is deterministic, so the agent
    asked for the next decision and the final value depend only on the actions fed so far. Every
    replay's decisions go into a trie (node = the ``(agent, k)`` asked, edge = the action fed);
    a coalition whose actions follow a known path to a leaf is answered without replaying.

    Args:
        env: the environment whose scenario replays the episode.
        seed: the episode's seed (``infos[agent]["seed"]``).
        actions: each player's actions in the episode, in order.
        absent: absent policy (default: the scenario's).

    Attributes:
        replays: replays actually run.
        lookups: coalitions asked for (hits and replays).

    Raises:
        CreditError: a coalition with an agent that did not act in the episode.
        RuntimeError: a replay that does not follow the decisions of an earlier one (the
            scenario is not deterministic given the seed).
    """

    def __init__(
        self,
        env: GraphEnv,
        seed: int,
        actions: Mapping[str, Sequence[Any]],
        absent: str | None = None,
    ) -> None:
        from scenarios.bridge import SkipNode

        self.env = env
        self.scenario = env.scenario
        self.seed = int(seed)
        self.actions = {a: [self._sanitize(a, x) for x in seq] for a, seq in actions.items()}
        self.players = frozenset(self.actions)
        self.mode = absent or self.scenario.absent
        self._skip = SkipNode
        self._root: _Node | None = None
        self._fed_cache: dict[tuple[str, int, bool], tuple[Any, Any]] = {}
        self.replays = 0
        self.lookups = 0

    def _sanitize(self, agent: str, action: Any) -> Any:
        """The action as the env executed it (mirrors ``GraphEnv._check_action``, no penalty)."""
        action, ok = action_in_space(self.env.action_space(agent), action)
        if not ok and self.scenario.invalid_action_penalty is not None:
            return self.scenario.default_action(agent)
        return action

    def fed(self, agent: str, k: int, present: bool) -> tuple[Any, Any]:
        """``(action, key)`` fed at ``agent``'s ``k``-th decision, present or absent."""
        cache_key = (agent, k, present)
        hit = self._fed_cache.get(cache_key)
        if hit is not None:
            return hit
        if present:
            seq = self.actions.get(agent, ())
            action = seq[k] if k < len(seq) else self.scenario.default_action(agent)
        elif self.mode == "skip":
            action = self._skip
        elif self.mode == "placeholder":
            action = self.scenario.placeholder_action(agent)
        else:
            action = self.scenario.default_action(agent)
        out = (action, ("skip",) if action is self._skip else _action_key(action))
        self._fed_cache[cache_key] = out
        return out

    def __call__(self, coalition: Iterable[str]) -> float:
        """``v(coalition)``: from the trie when a known path covers it, else one replay."""
        members = coalition if isinstance(coalition, frozenset) else frozenset(coalition)
        strangers = members - self.players
        if strangers:
            raise CreditError(
                f"agents {sorted(strangers)} did not act in episode seed={self.seed}: "
                f"coalitions are subsets of its players {sorted(self.players)}"
            )
        self.lookups += 1
        node = self._root
        while node is not None:
            if node.decision is None:
                assert node.value is not None
                return node.value
            agent, k = node.decision
            node = node.children.get(self.fed(agent, k, agent in members)[1])
        return self._replay(members)

    def _replay(self, members: frozenset[str]) -> float:
        path: list[tuple[str, int, Any]] = []
        counts: dict[str, int] = {}

        def policy(agent: str, obs: Any) -> Any:
            k = counts.get(agent, 0)
            counts[agent] = k + 1
            action, key = self.fed(agent, k, agent in members)
            path.append((agent, k, key))
            return action

        # Everyone is "present" for GraphEnv.value, so that every decision reaches `policy`,
        # which applies the absent policy itself (and records what it fed); `absent` still
        # tells GraphEnv which graph to run (agent nodes that may skip under "skip").
        value = float(self.env.value(self.seed, self.env.possible_agents, policy, absent=self.mode))
        self.replays += 1
        self._insert(path, value, members)
        return value

    def _insert(self, path: list[tuple[str, int, Any]], value: float, members: frozenset) -> None:
        if self._root is None:
            self._root = _Node()
            self._root.decision = (path[0][0], path[0][1]) if path else None
        node = self._root
        for j, (agent, k, key) in enumerate(path):
            if node.decision != (agent, k):
                raise RuntimeError(
                    f"replays of episode seed={self.seed} are not deterministic: with "
                    f"coalition {sorted(members)} decision {j} asked {agent!r} (its decision "
                    f"{k}) where an earlier replay with the same actions so far asked "
                    f"{node.decision}; a scenario must draw all randomness from the seed"
                )
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node()
                child.decision = (path[j + 1][0], path[j + 1][1]) if j + 1 < len(path) else None
            node = child
        if node.decision is not None:
            raise RuntimeError(
                f"replays of episode seed={self.seed} are not deterministic: coalition "
                f"{sorted(members)} ended where an earlier replay asked {node.decision}"
            )
        node.value = value


def _action_key(x: Any) -> Any:
    """A hashable key equal for actions that a scenario cannot tell apart."""
    if isinstance(x, np.ndarray):
        kind = "i" if x.dtype.kind in "biu" else x.dtype.kind
        return ("nd", kind, x.shape, tuple(x.ravel().tolist()))
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, list | tuple):
        return (type(x).__name__, tuple(_action_key(y) for y in x))
    if isinstance(x, dict):
        return ("dict", tuple(sorted((str(k), _action_key(v)) for k, v in x.items())))
    try:
        hash(x)
    except TypeError:
        return ("repr", repr(x))
    return (type(x).__name__, x)


# ----- the connector piece --------------------------------------------------------------------
@dataclasses.dataclass
class EpisodeCredit:
    """What :class:`CreditConnector` did to one finished episode.

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


class CreditConnector(ConnectorV2):
    """Learner connector piece: terminal team reward → per-agent credit, before GAE.

    See the module docstring for the methods, the rewrite and its requirements. Build it with
    :func:`make_credit_connector`; call it like any ``ConnectorV2`` piece (RLlib does), or use
    :meth:`assign` on one ``MultiAgentEpisode``.

    Args:
        input_observation_space: passed on to ``ConnectorV2``.
        input_action_space: passed on to ``ConnectorV2``.
        settings: validated credit settings.
        env_config: the ``RLlibGraphEnv`` env config (the env is built on first use).
        env: a ready ``GraphEnv`` to replay with instead of building one (tests, benches).

    Attributes:
        totals: running totals over the piece's life: ``episodes``, ``lookups``,
            ``coalitions``, ``replays``, ``skipped`` (unfinished chunks), ``verified`` (episodes
            whose ``v(N)`` was replayed and checked) and ``seconds`` (wall time spent in
            :meth:`__call__`).
        last: the :class:`EpisodeCredit` of every episode credited by the last call.
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        settings: _CreditSettings,
        env_config: Mapping[str, Any] | None = None,
        env: GraphEnv | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.settings = settings
        self.env_config = dict(env_config or {})
        self._env = env
        self.totals: dict[str, float] = dict.fromkeys(
            ("episodes", "lookups", "coalitions", "replays", "skipped", "verified"), 0
        )
        self.totals["seconds"] = 0.0
        self.last: list[EpisodeCredit] = []
        self._actors: list[Any] | None = None

    @property
    def normalize(self) -> bool:
        """Whether advantages are to be standardised per agent after GAE."""
        return self.settings.normalize

    @property
    def env(self) -> GraphEnv:
        """The ``GraphEnv`` used for replays (built from ``env_config`` on first use)."""
        if self._env is None:
            from scenarios.rllib_env import RLlibGraphEnv

            self._env = RLlibGraphEnv(self.env_config).env
        return self._env

    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[str, Any],
        episodes: list[Any],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: Any = None,
        **kwargs: Any,
    ) -> Any:
        start = time.perf_counter()
        self.last = self.assign_all(episodes)
        seconds = time.perf_counter() - start
        self.totals["seconds"] += seconds
        if metrics is not None and self.last:
            self._log(metrics, self.last)
            metrics.log_value(("credit_cost", "seconds"), seconds, reduce="sum")
        return batch

    # ----- episodes ------------------------------------------------------------------------
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
        """:meth:`assign` for many episodes; with ``settings.workers > 1`` (and Ray running)
        their replays are spread over that many processes (this one and Ray actors)."""
        found = [(ep, job) for ep in episodes if (job := self._job(ep)) is not None]
        jobs = []
        for i, (_, job) in enumerate(found):
            verify = self._should_verify(int(self.totals["episodes"]) + i)
            jobs.append((*job[1:], verify))
        records = self._run_jobs(jobs)
        for (_, job), record in zip(found, records, strict=True):
            ends, _, outcome, players, _ = job
            team_return = float(outcome.reward)
            for agent in players:
                sa, k, _ = ends[agent]
                old = float(sa.get_rewards(k - 1))
                _set_reward(sa, k - 1, old - team_return + record.credits[agent])
            self.totals["episodes"] += 1
            self.totals["verified"] += record.verified
            self.totals["lookups"] += record.lookups
            self.totals["coalitions"] += record.coalitions
            self.totals["replays"] += record.replays
        return records

    def _job(self, episode: MultiAgentEpisode) -> tuple[Any, ...] | None:
        """What crediting ``episode`` needs: ``(ends, seed, outcome, players, actions)``."""
        if not isinstance(episode, MultiAgentEpisode):
            raise CreditError(
                f"credit needs MultiAgentEpisodes (a multi-agent env such as "
                f"scenarios.rllib_env.RLlibGraphEnv), got {type(episode).__name__}"
            )
        ends: dict[str, tuple[Any, int, list[Any]]] = {}
        for agent, sa in episode.agent_episodes.items():
            infos = sa.get_infos()
            k = next((i for i, info in enumerate(infos) if "outcome" in (info or {})), None)
            if k is not None:
                ends[agent] = (sa, k, infos)
        if not ends:
            if episode.is_done:
                raise CreditError(
                    f"episode {episode.id_} ended without an 'outcome' in any agent's final "
                    "infos: credit needs an env that reports the verifier's Outcome at the end "
                    "(scenarios.rllib_env.RLlibGraphEnv over a GraphEnv does)"
                )
            self.totals["skipped"] += 1
            return None
        if episode.env_t_started != 0 or any(sa.t_started != 0 for sa, _, _ in ends.values()):
            raise CreditError(
                f"episode {episode.id_} reached the learner as a chunk that starts at env step "
                f"{episode.env_t_started}, so its earlier actions are in another chunk and the "
                f"episode cannot be replayed: set config.env_runners(batch_mode="
                f"'complete_episodes') for credit method {self.settings.method!r}"
            )
        _, first_k, first_infos = next(iter(ends.values()))
        outcome = first_infos[first_k]["outcome"]
        seed = _episode_seed(episode, first_infos)
        actions = _episode_actions(ends)
        players = [a for a in ends if a in actions]
        return ends, seed, outcome, players, actions

    def _run_jobs(self, jobs: list[tuple[Any, ...]]) -> list[EpisodeCredit]:
        """Credits of ``(seed, outcome, players, actions, verify)`` jobs, in order."""
        workers = self._workers()
        if len(workers) == 0 or len(jobs) < 2:
            return [self._credits(*job) for job in jobs]
        shares = _shares(jobs, len(workers) + 1)  # this process takes the first share
        import ray

        refs = [
            w.credits.remote([jobs[i] for i in share])
            for w, share in zip(workers, shares[1:], strict=True)
        ]
        out: list[EpisodeCredit | None] = [None] * len(jobs)
        for i in shares[0]:
            out[i] = self._credits(*jobs[i])
        for share, records in zip(shares[1:], ray.get(refs), strict=True):
            for i, record in zip(share, records, strict=True):
                out[i] = record
        return out  # type: ignore[return-value]

    def _workers(self) -> list[Any]:
        """The Ray actors replaying for this piece (none: replays stay in this process)."""
        want = self.settings.workers - 1
        if want < 1 or self.settings.method not in ("loo", "shapley") or "env" in self.env_config:
            return []
        if self._actors is None:
            import ray

            if not ray.is_initialized():
                return []
            actor = ray.remote(num_cpus=0)(CreditWorker)  # CPU is the idle cores', not Ray's
            settings = dataclasses.replace(self.settings, workers=1)
            self._actors = [actor.remote(settings, self.env_config) for _ in range(want)]
        return self._actors

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_actors"] = None  # actors and the env are rebuilt where the piece lands
        state["_env"] = None if "env" not in self.env_config else state["_env"]
        return state

    def _credits(
        self,
        seed: int,
        outcome: Any,
        players: list[str],
        actions: dict[str, list[Any]],
        verify: bool,
    ) -> EpisodeCredit:
        s = self.settings
        team_return = float(outcome.reward)
        if s.method == "team":
            return EpisodeCredit(seed, team_return, dict.fromkeys(players, team_return))
        if s.method == "local":
            return EpisodeCredit(seed, team_return, self._local(outcome, players, seed))
        replays = EpisodeReplays(self.env, seed, actions)
        full = frozenset(players)

        def value(coalition: frozenset[str]) -> float:
            # v(N) is the episode itself; replayed only to check that replays are faithful
            return team_return if coalition == full and not verify else replays(coalition)

        v = CachedValue(value)
        v_full = v(full)
        if verify and not math.isclose(v_full, team_return, rel_tol=0.0, abs_tol=REPLAY_TOL):
            raise CreditError(
                f"the replay of episode seed={seed} with its recorded actions returned "
                f"{v_full!r}, but the episode's outcome was {team_return!r}: the actions "
                "stored in the episode are not the ones the env executed (RLlib stores the "
                "module's Box actions before unsquashing/clipping them: set "
                "config.env_runners(normalize_actions=False, clip_actions=False), or have "
                "the env report its executed actions in the final infos['actions']), or "
                "the scenario is not deterministic given the seed"
            )
        if s.method == "loo":
            credits = leave_one_out(players, v)
            v_empty = None
        else:
            credits = self._shapley(players, v, seed)
            v_empty = v(frozenset())
        return EpisodeCredit(
            seed, team_return, credits, v_empty, v.lookups, len(v), replays.replays, verify
        )

    @staticmethod
    def _should_verify(i: int) -> bool:
        """Replay ``N`` for the first :data:`VERIFY_FIRST` episodes, then every
        :data:`VERIFY_EVERY`-th (counted over the episodes this piece credited)."""
        return i < VERIFY_FIRST or i % VERIFY_EVERY == 0

    def _local(self, outcome: Any, players: list[str], seed: int) -> dict[str, float]:
        local = getattr(outcome, "local", None) or {}
        missing = [a for a in players if a not in local]
        if missing:
            name = self.env.scenario.name
            raise CreditError(
                f"credit method 'local' needs Outcome.local for every agent that acted, but "
                f"scenario {name!r} gave none for {missing} (episode seed={seed}): fill "
                "Outcome.local in the scenario's score(), or use credit method 'loo' or "
                "'shapley', which need only the team reward"
            )
        return {a: float(local[a]) for a in players}

    def _shapley(self, players: list[str], v: CachedValue, seed: int) -> dict[str, float]:
        s = self.settings
        n = len(players)
        rng = np.random.default_rng([seed, 0x5A4E])  # deterministic per episode
        if s.estimator == "auto":
            method = "auto"
        elif s.estimator == "exact" or n <= s.exact_max:
            return shapley(players, v, "exact")
        else:
            method = s.estimator
        budget = s.budget
        if budget is not None and method != "auto":
            budget = max(budget, min_budget(method, n))  # n varies per episode
        elif budget is not None:
            budget = max(budget, n + 1)
        return shapley(players, v, method, budget=budget, rng=rng, exact_max=min(s.exact_max, 16))

    # ----- metrics -------------------------------------------------------------------------
    @staticmethod
    def _log(metrics: Any, records: list[EpisodeCredit]) -> None:
        per_agent: dict[str, list[float]] = {}
        for rec in records:
            for agent, c in rec.credits.items():
                per_agent.setdefault(agent, []).append(c)
        for agent, values in per_agent.items():
            metrics.log_value(("credit", agent), float(np.mean(values)), reduce="mean")
        n = len(records)
        metrics.log_value(("credit_cost", "episodes"), n, reduce="sum")
        metrics.log_value(("credit_cost", "replays"), sum(r.replays for r in records), reduce="sum")
        metrics.log_value(
            ("credit_cost", "coalitions"), sum(r.coalitions for r in records), reduce="sum"
        )
        metrics.log_value(
            ("credit_cost", "players"), sum(len(r.credits) for r in records), reduce="sum"
        )
        metrics.log_value(
            ("credit_cost", "replays_per_episode"),
            sum(r.replays for r in records) / n,
            reduce="mean",
        )


class CreditWorker:
    """A process that credits episodes for a :class:`CreditConnector` (run as a Ray actor)."""

    def __init__(self, settings: _CreditSettings, env_config: dict[str, Any]) -> None:
        self.piece = CreditConnector(settings=settings, env_config=env_config)

    def credits(self, jobs: list[tuple[Any, ...]]) -> list[EpisodeCredit]:
        return [self.piece._credits(*job) for job in jobs]


def _shares(jobs: list[tuple[Any, ...]], k: int) -> list[list[int]]:
    """Split job indices into ``k`` shares of about equal cost (``2**players`` replays each),
    largest first onto the least loaded share."""
    load = [0.0] * k
    shares: list[list[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(jobs)), key=lambda i: -len(jobs[i][2])):
        j = load.index(min(load))
        shares[j].append(i)
        load[j] += 2.0 ** len(jobs[i][2])
    return shares


def _episode_actions(ends: Mapping[str, tuple[Any, int, list[Any]]]) -> dict[str, list[Any]]:
    """Each player's actions: as executed, when the env reports them in the final infos
    (``infos["actions"]``, e.g. ``GraphEnv.episode_actions()``), else as the episode stores them
    (the module's actions, which RLlib may still unsquash or clip for Box spaces)."""
    for _, k, infos in ends.values():
        executed = infos[k].get("actions")
        if executed is not None:
            return {a: list(executed.get(a, ())) for a in ends if executed.get(a)}
    return {
        agent: [sa.get_actions(i) for i in range(k)] for agent, (sa, k, _) in ends.items() if k > 0
    }


def _set_reward(sa: Any, index: int, value: float) -> None:
    """Overwrite one reward, keeping its float64 precision.

    A numpy'd episode checks the value against the float32 reward ``Box``, and gymnasium warns
    about every Python float it casts for that check; the stored value is not cast.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Casting input x to numpy array")
        sa.set_rewards(new_data=value, at_indices=index)


def _episode_seed(episode: MultiAgentEpisode, infos: list[Any]) -> int:
    for info in infos:
        if info and "seed" in info and info["seed"] is not None:
            return int(info["seed"])
    raise CreditError(
        f"episode {episode.id_} has no 'seed' in its infos: counterfactual replays need the "
        "episode seed; use scenarios.rllib_env.RLlibGraphEnv (GraphEnv puts it in every info)"
    )


# ----- per-agent advantage normalisation (after GAE) -------------------------------------------
class PerAgentAdvantageNormalization(ConnectorV2):
    """Standardise advantages per agent within each module's batch (place it after GAE).

    GAE standardises advantages per module; with parameter sharing several agents feed one
    module, and an agent whose credits are large would dominate its module's update. This piece
    recovers each row's agent from the episodes (in the order GAE uses) and rescales each
    agent's advantages to zero mean and unit standard deviation over its valid (loss-mask)
    timesteps. With one agent per module it changes nothing that matters.
    """

    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[str, Any],
        episodes: list[Any],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: Any = None,
        **kwargs: Any,
    ) -> Any:
        import torch

        sa_episodes = list(
            self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False)
        )
        for module_id, module_batch in batch.items():
            if Postprocessing.ADVANTAGES not in module_batch:
                continue
            mine = [e for e in sa_episodes if e.module_id in (None, module_id)]
            agents = sorted({e.agent_id for e in mine}, key=str)
            index = {a: i + 1 for i, a in enumerate(agents)}  # 0 = padding
            ids = (
                np.concatenate([np.full(len(e), index[e.agent_id], dtype=np.int64) for e in mine])
                if mine
                else np.zeros(0, dtype=np.int64)
            )
            module = rl_module[module_id]
            if module.is_stateful():
                ids = np.stack(
                    split_and_zero_pad_n_episodes(
                        ids,
                        episode_lens=[len(e) for e in mine],
                        max_seq_len=module.model_config["max_seq_len"],
                    ),
                    axis=0,
                )
            adv = module_batch[Postprocessing.ADVANTAGES]
            if tuple(ids.shape) != tuple(adv.shape):
                raise RuntimeError(
                    f"per-agent normalisation: module {module_id!r} has advantages of shape "
                    f"{tuple(adv.shape)} but its episodes give {tuple(ids.shape)} rows; place "
                    "PerAgentAdvantageNormalization directly after GeneralAdvantageEstimation"
                )
            ids_t = torch.as_tensor(ids, device=adv.device)
            mask = module_batch.get(Columns.LOSS_MASK)
            valid = (
                torch.ones_like(ids_t, dtype=torch.bool)
                if mask is None
                else torch.as_tensor(mask, device=adv.device).bool()
            )
            out = adv.clone()
            for i in index.values():
                rows = ids_t == i
                pick = rows & valid
                if not bool(pick.any()):
                    continue
                sel = adv[pick]
                std = sel.std(unbiased=False) if sel.numel() > 1 else sel.new_tensor(0.0)
                out[rows] = (adv[rows] - sel.mean()) / torch.clamp(std, min=1e-4)
            module_batch[Postprocessing.ADVANTAGES] = out
        return batch


class CreditPPOTorchLearner(PPOTorchLearner):
    """``PPOTorchLearner`` that adds per-agent advantage normalisation after GAE when asked.

    In ``build()`` it looks for a :class:`CreditConnector` with ``normalize=True`` in its
    learner pipeline and, if there is one, inserts :class:`PerAgentAdvantageNormalization`
    right after ``GeneralAdvantageEstimation``. Otherwise it is a plain ``PPOTorchLearner``, so
    it is safe to set it whenever credit is on:
    ``config.learners(learner_class=CreditPPOTorchLearner)``.
    """

    def build(self) -> None:
        super().build()
        pipeline = self._learner_connector
        if pipeline is None:
            return
        pieces = list(pipeline.connectors)
        wants = any(isinstance(p, CreditConnector) and p.normalize for p in pieces)
        has = any(isinstance(p, PerAgentAdvantageNormalization) for p in pieces)
        if wants and not has:
            if any(isinstance(p, GeneralAdvantageEstimation) for p in pieces):
                pipeline.insert_after(GeneralAdvantageEstimation, PerAgentAdvantageNormalization())
            else:
                pipeline.append(PerAgentAdvantageNormalization())
