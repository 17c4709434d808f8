"""The batched multi-agent sampler (``episodes.sampler: batched``, the default for every team:
small networks, scripted pools and LLM pools).

:class:`BatchedEnvRunner` is RLlib's ``MultiAgentEnvRunner`` with its sampling loop replaced;
everything around the loop is RLlib's own (weights sync, metrics reduction, checkpoints,
fault tolerance, remote runners), and it still hands the learner ``MultiAgentEpisode``s, so the
learner connectors (GAE, credit, GRPO groups, GRU sequences) are unchanged. Per step it

* gathers the acting agents of every sub-env and runs **one forward pass per module** on their
  stacked observations (``forward_exploration``, or ``forward_inference`` with
  ``explore=False``; for a torch module in eval mode what those wrappers call, without their
  per-call ``eval()`` walk: :func:`forward_fn`), with GRU states carried per ``(env, agent)``;
* samples every row from the module's action distribution by inverse CDF with uniforms (or
  normals) drawn from **that sub-env's own generator** (``SeedSequence([seed, worker, env])``):
  an episode's actions depend on its env's stream only, not on which other agents shared the
  batch, set iteration order or ``PYTHONHASHSEED`` (:mod:`trainers.sampling.action_rows`);
  log-probabilities are those of RLlib's distribution (``dist.logp``), as in RLlib's sampler;
* writes each env step once into the episode (:mod:`trainers.sampling.episode_build`: RLlib's
  ``add_env_step`` bookkeeping without its per-step object churn, same result) and turns an
  episode into numpy once, when it ends; per-agent step counts are logged once per
  ``sample()`` call, per-episode RLlib metrics without ``log_dict``'s tree walk and each
  agent's return summed once (:mod:`trainers.sampling.runner_metrics`);
* at a ``sample()``'s end cuts the running episodes as RLlib's ``cut`` does, without its
  per-agent constructors (:mod:`trainers.sampling.episode_cut`), and while sampling keeps the
  garbage collector off the runner's long-lived objects (:mod:`trainers.sampling.gc_pause`):
  with 100+ agents these were most of the sampler's time.

**LLM pools** (modules with ``acts_with_token_ids``: ``CausalLMModule``) sample their tokens
themselves: their rows (token-id observations, in the obs space's integer dtype) go into
**one** forward, i.e. one batched ``generate``, per module per step — with
``episodes.env_threads``, over whichever envs are ready while others wait on tools — each row
with a sampling seed drawn from its env's generator (``SAMPLING_SEEDS``), so a row's tokens
depend on its env's stream only (not for vLLM-sampled modules: :func:`seeds_rows`); their
outputs (``action_logp``, ``token_logp``,
``sampling_temperature``) are stored as the module returns them. ``marl/llm/rows_per_generate``
(the runner's metrics) is the mean number of rows per such call.

**Whole GRPO groups** (``RunnerSpec.whole_groups``): the sub-envs are ``groups_in_flight``
slots of ``G``; a slot's sub-envs start one task together and a finished one waits for the
rest of its group, so a step's ``generate`` covers the decisions of every group in flight
(:meth:`BatchedEnvRunner._start_group` assigns a sample's groups to slots in a fixed order).
Each rollout of a group draws from its own stream, keyed by the group's place in the runner's
schedule and the rollout's place in the group (:func:`rollout_rng`), not by the sub-env that
runs it, and ``sample()`` returns the episodes in schedule order, not finishing order: the
learner gets the same rows, in the same order, whatever ``groups_in_flight`` is.

Actions, log-probabilities, distribution inputs, GRU ``state_out`` and ``weights_seq_no`` land
in the episodes under RLlib's column names, so the two samplers are interchangeable; the same
policy gives the same action distribution (tested). Not covered (RLlib's loop runs them):
``random_actions``, custom env-to-module / module-to-env connectors (there are none in an
experiment config). The RLlib sampler remains behind ``episodes.sampler: rllib``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import (
    EPISODE_AGENT_RETURN_MEAN,
    EPISODE_AGENT_STEPS,
    EPISODE_DURATION_SEC_MEAN,
    EPISODE_LEN_MAX,
    EPISODE_LEN_MEAN,
    EPISODE_LEN_MIN,
    EPISODE_MODULE_RETURN_MEAN,
    EPISODE_RETURN_MAX,
    EPISODE_RETURN_MEAN,
    EPISODE_RETURN_MIN,
    NUM_AGENT_STEPS_SAMPLED,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES,
    NUM_EPISODES_LIFETIME,
    NUM_MODULE_STEPS_SAMPLED,
    NUM_MODULE_STEPS_SAMPLED_LIFETIME,
    WEIGHTS_SEQ_NO,
)
from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action

from marl_agents.action_mask import stack_observations, to_tensors
from marl_agents.llm.rl_module import SAMPLING_SEEDS, add_constraint_keys
from marl_agents.llm.shared_batch import batch_key
from scenarios.env_spec import EnvSpec
from scenarios.in_flight import RESET, CallTimeout, Done, Stepper
from trainers.configs.runner import RunnerSpec
from trainers.learners.categorical import categorical_lens
from trainers.rllib_compat.runner import log_env_steps_sampled, metrics_lock, set_episode_class
from trainers.sampling.action_rows import categorical_rows, sample_rows
from trainers.sampling.episode_build import add_env_reset, add_env_step
from trainers.sampling.episode_cut import cut
from trainers.sampling.forward import forward, forward_together, seeds_rows, to_numpy
from trainers.sampling.gc_pause import young_objects_only
from trainers.sampling.runner_metrics import episode_totals

#: the runner attribute holding the sampler's state across ``sample()`` calls (saved by
#: :mod:`trainers.run.resume` with RLlib's own)
STATE_ATTR = "_batched"
#: LLM rows' sampling seeds are drawn uniformly below this (a vLLM / torch seed fits it)
SEED_BOUND = 2**31 - 1
#: module outputs that are not stored as extra model outputs
_NOT_EXTRAS = frozenset({Columns.ACTIONS, Columns.ACTIONS_FOR_ENV, Columns.STATE_OUT})
#: runner metric: rows per LLM ``generate`` call (one forward of an LLM module), the mean
#: over the forwards since the last ``get_metrics()``
ROWS_PER_GENERATE = ("marl", "llm", "rows_per_generate")


def _acted(out: dict[str, Any]) -> tuple[np.ndarray, dict[str, np.ndarray], None]:
    """An LLM module's forward outputs as the runner stores them: the actions, every other
    output as a column under its own name, no recurrent state."""
    columns = {k: to_numpy(v) for k, v in out.items() if k not in _NOT_EXTRAS}
    return to_numpy(out[Columns.ACTIONS]), columns, None


class OrderedEpisode(MultiAgentEpisode):
    """A ``MultiAgentEpisode`` whose agent ids iterate sorted. RLlib's are ``set``s of strings
    (``agent_ids``, and ``add_env_step`` creates agents' episodes in set order), whose order
    follows ``PYTHONHASHSEED``; the learner connectors build each module's batch in that
    order, so without this a run's updates differ between processes."""

    __slots__ = ()
    #: while the batched sampler fills episodes, ``validate()`` (which RLlib runs over every
    #: agent at every ``add_env_step``) is deferred to the episode's end or cut
    deferred_validation = False

    def validate(self) -> None:
        if not OrderedEpisode.deferred_validation:
            super().validate()

    @property
    def agent_ids(self) -> Any:  # a set-like keys view: ``in``, ``|``, ``&`` work as on a set
        return dict.fromkeys(sorted(self.agent_episodes)).keys()

    def get_agents_that_stepped(self) -> Any:
        return dict.fromkeys(sorted(self.get_observations(-1))).keys()

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> OrderedEpisode:
        episode = MultiAgentEpisode.from_state(state)  # RLlib's builds a MultiAgentEpisode
        return set_episode_class(episode, cls)


@dataclasses.dataclass
class SamplerState:
    """Per sub-env: the observations of the agents to act next, GRU states, the RNG."""

    pending: list[dict[str, Any] | None]
    states: list[dict[str, Any]]
    rngs: list[np.random.Generator]
    #: env index → (actions, extra model outputs) of the step in flight
    acted: dict[int, tuple[dict, dict]] = dataclasses.field(default_factory=dict)
    #: sub-envs whose episode ended and that wait for the rest of their group
    #: (``RunnerSpec.whole_groups``), in the order they ended
    waiting: list[int] = dataclasses.field(default_factory=list)
    #: whole groups: groups of the runner's schedule taken by ``sample()`` calls before the last
    groups_done: int = 0
    #: whole groups: groups the current (or last) ``sample()`` runs
    groups_wanted: int = 0
    #: whole groups: per slot (``G`` consecutive sub-envs), groups it started in this sample
    slot_runs: list[int] = dataclasses.field(default_factory=list)
    #: whole groups: episode id → its place in this sample (``q · G + member`` for rollout
    #: ``member`` of the sample's group ``q``), the order ``sample()`` returns them in
    rollout: dict[str, int] = dataclasses.field(default_factory=dict)


def env_rngs(seed: int | None, worker_index: int, num_envs: int) -> list[np.random.Generator]:
    """One generator per sub-env, from ``(seed, worker, env)`` alone."""
    base = 0 if seed is None else int(seed)
    return [np.random.default_rng([base, int(worker_index), i]) for i in range(num_envs)]


#: the entropy word that keeps a rollout's stream (:func:`rollout_rng`) apart from a sub-env's
ROLLOUT_STREAM = 0x67726F7570  # "group"


def rollout_rng(
    seed: int | None, worker_index: int, group: int, member: int
) -> np.random.Generator:
    """Whole GRPO groups: the generator of rollout ``member`` of the runner's ``group``-th
    group, from ``(seed, worker, group, member)`` alone, so that a group draws the same numbers
    whichever slot runs it and however many groups are in flight (``groups_in_flight``): the
    learner gets the same rows at every ``k``."""
    base = 0 if seed is None else int(seed)
    return np.random.default_rng([base, int(worker_index), ROLLOUT_STREAM, int(group), int(member)])


@dataclasses.dataclass
class _Rows:
    """The agents one module acts for in this step: ``(env index, agent id)`` and observations."""

    keys: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    obs: list[Any] = dataclasses.field(default_factory=list)


class BatchedEnvRunner(MultiAgentEnvRunner):
    """``MultiAgentEnvRunner`` whose sampling loop batches every acting agent (module doc)."""

    def __init__(self, config: Any, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        n = self.num_envs
        setattr(
            self,
            STATE_ATTR,
            SamplerState(
                pending=[None] * n,
                states=[{} for _ in range(n)],
                rngs=env_rngs(self.config.seed, self.worker_index or 0, n),
            ),
        )
        self._stepper: Stepper | None = None  # built on the first sample() (_get_stepper)
        self._lens: dict[Any, Any] = {}  # dist class → categorical_lens, probed once
        self._lost = 0  # episodes lost to hung calls in the current sample()
        # whole GRPO groups (RunnerSpec.whole_groups): the runner's sub-envs are slots of G
        # consecutive sub-envs, each running one group side by side; a sub-env whose episode
        # ended waits until the rest of its slot's episodes have ended, then the slot starts
        # its next group together, so every sample() of a multiple of G episodes returns
        # whole groups, whatever the episode lengths (otherwise a group would be split over
        # two iterations by finishing time, i.e. by length, often by outcome)
        spec = RunnerSpec.of(self.config.env_config)
        self._whole_groups = spec.whole_groups
        self._group_size = spec.group_size if spec.whole_groups else 1
        if self._whole_groups and (self._group_size < 1 or n % self._group_size):
            raise ValueError(
                f"env runner {self.worker_index}: {n} sub-envs do not hold whole GRPO groups of "
                f"{self._group_size} (RunnerSpec.group_size): num_envs_per_env_runner must be "
                "group_size · groups_in_flight"
            )
        self._step_callbacks = bool(self.config.callbacks_on_episode_step) or any(
            "on_episode_step" in type(c).__dict__ for c in self._callbacks
        )

    @property
    def sampler_state(self) -> SamplerState:
        return getattr(self, STATE_ATTR)

    # ----- the loop ---------------------------------------------------------------------
    def _sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[Any]:
        if random_actions or self.module is None:
            return super()._sample(
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                explore=explore,
                random_actions=random_actions,
                force_reset=force_reset,
            )
        for m in self.module.values():  # once here, not on every forward (forward_fn)
            if isinstance(m, torch.nn.Module):
                m.eval()
        OrderedEpisode.deferred_validation = True
        try:
            with young_objects_only():  # collections skip the runner's long-lived objects
                return self._sample_batched(num_timesteps, num_episodes, explore, force_reset)
        finally:
            OrderedEpisode.deferred_validation = False

    def _sample_batched(
        self, num_timesteps: int | None, num_episodes: int | None, explore: bool, force_reset: bool
    ) -> list[Any]:
        stepper = self._get_stepper()
        if self._whole_groups and num_episodes is None:
            raise ValueError(
                f"env runner {self.worker_index}: whole GRPO groups (whole_groups) are sampled "
                "by episodes: call sample(num_episodes=...) with a multiple of the group size "
                f"{self._group_size}, not num_timesteps"
            )
        if self._whole_groups and num_episodes % self._group_size:
            raise ValueError(
                f"env runner {self.worker_index}: sample(num_episodes={num_episodes}) with whole "
                f"GRPO groups of {self._group_size} (whole_groups): ask for a multiple of "
                f"{self._group_size} episodes (whole groups), or an episode would be cut from "
                "its group"
            )
        if force_reset or num_episodes is not None or self._needs_initial_reset:
            self._reset_all(num_episodes)
        if num_episodes is not None:
            self._needs_initial_reset = True
        state = self.sampler_state
        done: list[Any] = []
        counts = _Counts()
        target = (
            (lambda: len(done) >= num_episodes)
            if num_timesteps is None
            else (lambda: counts.env >= num_timesteps)
        )
        self._lost = 0
        while not target():
            if self._lost >= max(8, 2 * self.num_envs) and counts.env == 0:
                raise RuntimeError(
                    f"env runner {self.worker_index}: {self._lost} episodes in a row hung "
                    f"in a reset/step call past episodes.timeout_s="
                    f"{EnvSpec.of(self.config.env_config).episode_timeout_s} s and none "
                    "stepped: fix "
                    "the tool or node that hangs (episodes.tool_timeout_s bounds each tool "
                    "call), or raise the limit if it is only slow"
                )
            ready = [i for i, p in enumerate(state.pending) if p is not None]
            if ready:
                actions, for_env, extras = self._act(ready, explore)
                for i in ready:
                    self._step_env(i, actions[i], for_env[i], extras[i])
            calls = stepper.wait()
            while calls:
                for call in calls:
                    late = num_episodes is not None and target()  # RLlib's loop stops here too
                    self._on_done(call, counts, None if late else done)
                # without threads a reset started above has already run: take it now
                calls = [] if stepper.threads or not stepper.in_flight else stepper.wait()
        while stepper.in_flight:  # calls still running (threads): their steps are kept
            for call in stepper.wait():
                self._on_done(call, counts, done if num_episodes is None else None)
        counts.log(self)
        if self._whole_groups:  # schedule order, not finishing order (which varies with k);
            # a rollout re-run after a hung call (a new episode) goes last
            done.sort(key=lambda e: state.rollout.get(e.id_, math.inf))
        self._done_episodes_for_metrics.extend(done)
        if num_timesteps is None:
            return done
        return done + self._cut_ongoing()

    def stop(self) -> None:
        stepper = getattr(self, "_stepper", None)
        if stepper is not None:
            self._stepper = None
            stepper.close()  # each env closed in its own thread
        super().stop()

    def _get_stepper(self) -> Stepper:
        """The sub-envs' :class:`~scenarios.in_flight.Stepper` (built on first use; with
        ``env_threads`` each env moves to its own thread, which starts it afresh)."""
        stepper = self._stepper
        if stepper is None:
            threads = RunnerSpec.of(self.config.env_config).env_threads
            timeout = EnvSpec.of(self.config.env_config).episode_timeout_s if threads else None
            stepper = self._stepper = Stepper(
                list(self.env.envs), threads=threads, call_timeout_s=timeout
            )
            if threads:  # an episode in progress cannot move into a thread
                self._needs_initial_reset = True
        return stepper

    def _reset_all(self, num_episodes: int | None = None) -> None:
        """Fresh episodes on every sub-env (seeded on the runner's first reset only); with
        whole groups, the first group of every slot that runs one in this sample of
        ``num_episodes``."""
        self._ongoing_episodes = [None] * self.num_envs
        state = self.sampler_state
        state.waiting.clear()
        self._shared_data = {}
        self._cached_to_module = None
        self._ongoing_episodes_for_metrics.clear()
        seed = self._seed if self._needs_initial_reset else None
        self._needs_initial_reset = False
        if not self._whole_groups:
            for i in range(self.num_envs):
                self._reset_env(i, None if seed is None else seed + i)
            return
        # the last sample's groups are done (or, had it been interrupted, skipped: a slot's
        # schedule only moves forward); never behind a sub-env's schedule (a runner state
        # saved before issue #29 has no groups_done, its sub-envs are at the next task)
        schedules = [e.unwrapped for e in self.env.envs if hasattr(e.unwrapped, "schedule_state")]
        state.groups_done = max(
            [state.groups_done + state.groups_wanted, *(e.schedule_state()["k"] for e in schedules)]
        )
        state.groups_wanted = (num_episodes or 0) // self._group_size
        slots = self.num_envs // self._group_size
        state.slot_runs = [0] * slots
        state.rollout = {}  # (a sampler state saved before issue #44 has none)
        state.pending = [None] * self.num_envs  # slots without a group this sample stay idle
        for slot in range(slots):
            self._start_group(slot, seed)

    def _start_group(self, slot: int, seed: int | None = None) -> None:
        """Start ``slot``'s next group of this sample, if it has one: its ``G`` sub-envs reset
        to one task together. Slot ``j`` of ``S`` runs the sample's groups ``j, j + S, …``
        (fixed, whatever finishes first), group ``q`` of the sample being group
        ``groups_done + q`` of the runner's schedule, whose task its sub-envs seek
        (:data:`~trainers.sampling.grouped_env.GROUP_OPTION`): with ``S = 1`` the groups run
        one after another on the same tasks as with any ``S``."""
        from trainers.sampling.grouped_env import GROUP_OPTION

        state = self.sampler_state
        slots = len(state.slot_runs)
        q = slot + state.slot_runs[slot] * slots
        if q >= state.groups_wanted:
            return
        state.slot_runs[slot] += 1
        group = state.groups_done + q
        options = {GROUP_OPTION: group}
        g = self._group_size
        for member, i in enumerate(range(slot * g, (slot + 1) * g)):
            # the rollout's own stream, not the slot's: the same draws at every k
            state.rngs[i] = rollout_rng(self.config.seed, self.worker_index or 0, group, member)
            self._reset_env(i, None if seed is None else seed + i, options)
            state.rollout[self._ongoing_episodes[i].id_] = q * g + member

    def _new_episode(self, env_index: int, episodes: list[Any] | None = None) -> None:
        episodes = episodes if episodes is not None else self._ongoing_episodes
        super()._new_episode(env_index, episodes)
        set_episode_class(episodes[env_index], OrderedEpisode)

    def _reset_env(self, i: int, seed: int | None, options: dict[str, Any] | None = None) -> None:
        """Start env ``i``'s next episode (its reset runs on the stepper)."""
        self._new_episode(i, self._ongoing_episodes)
        state = self.sampler_state
        state.pending[i] = None
        state.states[i] = {}
        self._stepper.start_reset(i, seed, options)

    def _step_env(
        self, i: int, actions: dict[str, Any], for_env: dict[str, Any], extras: dict[str, Any]
    ) -> None:
        """Start env ``i``'s step; what was acted is recorded when it returns."""
        state = self.sampler_state
        state.pending[i] = None
        state.acted[i] = (actions, extras)
        self._stepper.start_step(i, for_env)

    def _on_done(self, call: Done, counts: _Counts, done: list[Any] | None) -> None:
        """Record a finished call. ``done`` gets the episodes it ends (None: the sample has
        enough, so an episode ending here is left unfinished, as RLlib's loop leaves it)."""
        if call.error is not None:
            if isinstance(call.error, CallTimeout):
                self._lost_episode(call.index, call.error)
                return
            raise call.error
        i = call.index
        if call.kind == RESET:
            obs, infos = call.result
            add_env_reset(self._ongoing_episodes[i], obs, infos)
            self.sampler_state.pending[i] = obs
            self._make_on_episode_callback("on_episode_start", i, self._ongoing_episodes)
        else:
            self._on_step(i, call.result, counts, done)

    def _on_step(self, i: int, result: tuple, counts: _Counts, done: list[Any] | None) -> None:
        obs, rewards, terms, truncs, infos = result
        actions, extras = self.sampler_state.acted.pop(i)
        episode = self._ongoing_episodes[i]
        add_env_step(
            episode,
            obs,
            actions,
            rewards,
            infos,
            terminateds=terms,
            truncateds=truncs,
            extra_model_outputs=extras,
        )
        counts.add(obs, episode)
        if self._step_callbacks:
            self._make_on_episode_callback("on_episode_step", i, self._ongoing_episodes)
        if not episode.is_done:  # the agents to act next: not those that ended here
            ended = {a for a, done in (*terms.items(), *truncs.items()) if done}
            self.sampler_state.pending[i] = (
                {a: o for a, o in obs.items() if a not in ended} if ended else obs
            )
            return
        if done is None:
            return
        counts.episodes += 1
        MultiAgentEpisode.validate(episode)  # deferred while sampling
        self._make_on_episode_callback("on_episode_end", i, self._ongoing_episodes)
        self._prune_zero_len_sa_episodes(episode)
        done.append(episode.to_numpy() if self.episodes_to_numpy else episode)
        if not self._whole_groups:
            self._reset_env(i, None)
            return
        waiting = self.sampler_state.waiting
        waiting.append(i)
        slot = i // self._group_size
        mine = [j for j in waiting if j // self._group_size == slot]
        if len(mine) < self._group_size:
            return  # the group still running
        waiting[:] = [j for j in waiting if j // self._group_size != slot]
        # the group is whole: the slot starts its next group of this sample, if any (else it
        # waits for the next sample(), which restarts every slot anyway)
        self._start_group(slot)

    def get_metrics(self) -> Any:
        """RLlib's ``get_metrics``, each agent's return summed once per episode
        (:func:`~trainers.sampling.runner_metrics.episode_totals`: the same values)."""
        ongoing = self._ongoing_episodes_for_metrics
        for episode in self._done_episodes_for_metrics:
            assert episode.is_done
            self._log_episode_metrics(*episode_totals(episode, ongoing.pop(episode.id_, ())))
        self._done_episodes_for_metrics.clear()
        return self.metrics.reduce()

    def _log_episode_metrics(
        self,
        length: Any,
        ret: Any,
        sec: Any,
        agents: Any = None,
        modules: Any = None,
        agent_steps: Any = None,
    ) -> None:
        """RLlib's per-episode metrics (``get_metrics`` calls this once per finished episode)
        with one ``log_value`` per leaf instead of ``log_dict``, whose tree walk cost more than
        the logging: the same keys in the same (sorted) order, reductions and window."""
        cfg = self.config
        win = max(1, math.ceil(cfg.metrics_num_episodes_for_smoothing / (cfg.num_env_runners or 1)))
        mean = {EPISODE_LEN_MEAN: length, EPISODE_RETURN_MEAN: ret, EPISODE_DURATION_SEC_MEAN: sec}
        if agents is not None:
            mean[EPISODE_AGENT_RETURN_MEAN] = agents
            mean[EPISODE_AGENT_STEPS] = agent_steps
            mean[EPISODE_MODULE_RETURN_MEAN] = modules
        log = self.metrics.log_value
        parts = (
            ("mean", mean),
            ("min", {EPISODE_LEN_MIN: length, EPISODE_RETURN_MIN: ret}),
            ("max", {EPISODE_LEN_MAX: length, EPISODE_RETURN_MAX: ret}),
        )
        with metrics_lock(self.metrics):  # as log_dict holds it
            for reduce, values in parts:
                for key in sorted(values):
                    value = values[key]
                    if not isinstance(value, Mapping):
                        log((key,), value, reduce=reduce, window=win)
                        continue
                    for sub in sorted(value):
                        log((key, sub), value[sub], reduce=reduce, window=win)

    def _lost_episode(self, i: int, error: BaseException) -> None:
        """Env ``i``'s call hung past ``episodes.timeout_s`` (threads only): its episode is
        counted as a timeout failure (with the scenario's failure reward) and dropped, and the
        slot gets a fresh env."""
        from trainers.signals.episode_metrics import EPISODE_METRICS, JOURNAL, outcome_values

        graph_env = getattr(self.env.envs[i].unwrapped, "env", None)
        reward = 0.0
        if graph_env is not None:
            reward = float(graph_env.scenario.failure_state(None).reward)
        values = {"episodes": 1, **outcome_values(reward, False, True, "timeout")}
        for key, value in values.items():
            self.metrics.log_value((EPISODE_METRICS, key), value, reduce="sum")
        JOURNAL.record_error("timeout", str(error))
        self._lost += 1
        self.sampler_state.acted.pop(i, None)
        new = self._make_sub_env(i)
        old = self.env.envs[i].unwrapped
        if hasattr(old, "schedule_state"):  # a GroupedEnv: the new env re-runs the same task
            new.unwrapped.set_schedule_state(old.schedule_state())
        self.env.envs[i] = new
        self._stepper.replace(i, new)
        self._reset_env(i, None)

    def _make_sub_env(self, i: int) -> Any:
        """A fresh sub-env ``i``, built as RLlib builds the runner's envs."""
        from ray.rllib.env.env_context import EnvContext

        ctx = EnvContext(
            self.config.env_config,
            worker_index=self.worker_index or 0,
            vector_index=i,
            num_workers=self.config.num_env_runners,
        )
        return self.config.env(ctx)

    def _cut_ongoing(self) -> list[Any]:
        """The chunks of the episodes still running (RLlib's ``truncate_episodes``); sampling
        continues in their continuations (:func:`~trainers.sampling.episode_cut.cut`: RLlib's
        ``cut``, without its per-agent constructors where the episode allows)."""
        out = []
        lookback = self.config.episode_lookback_horizon
        continuations = [cut(e, lookback) for e in self._ongoing_episodes]
        for e in continuations:
            set_episode_class(e, OrderedEpisode)
        for episode in self._ongoing_episodes:
            if episode.env_t == 0:
                continue
            MultiAgentEpisode.validate(episode)  # deferred while sampling
            self._ongoing_episodes_for_metrics[episode.id_].append(episode)
            self._prune_zero_len_sa_episodes(episode)
            out.append(episode.to_numpy() if self.episodes_to_numpy else episode)
        self._ongoing_episodes = continuations
        return out

    # ----- acting -----------------------------------------------------------------------
    def _act(
        self, ready: Sequence[int], explore: bool
    ) -> tuple[dict[int, dict], dict[int, dict], dict[int, dict]]:
        """Actions (as stored), actions for the env, and extra model outputs, per env."""
        state = self.sampler_state
        rows: dict[str, _Rows] = defaultdict(_Rows)
        for i in ready:
            episode = self._ongoing_episodes[i]
            for agent, ob in state.pending[i].items():
                r = rows[episode.module_for(agent)]
                r.keys.append((i, agent))
                r.obs.append(ob)
        actions: dict[int, dict] = {i: {} for i in ready}
        for_env: dict[int, dict] = {i: {} for i in ready}
        extras: dict[int, dict] = {i: {} for i in ready}
        together = self._generate_together(rows, explore)
        for mid, r in rows.items():
            self._act_module(mid, r, explore, actions, for_env, extras, together.get(mid))
        return actions, for_env, extras

    def _act_module(
        self,
        mid: str,
        rows: _Rows,
        explore: bool,
        actions: dict[int, dict],
        for_env: dict[int, dict],
        extras: dict[int, dict],
        acted: tuple[np.ndarray, dict[str, np.ndarray], None] | None = None,
    ) -> None:
        """Store ``mid``'s actions and extra outputs for its rows; ``acted``: its rows' forward
        result when already sampled (:meth:`_generate_together`), else its forward now."""
        module = self.module[mid]
        if acted is not None:
            act_np, columns, state_out = acted
        elif getattr(module, "acts_with_token_ids", False):
            act_np, columns, state_out = self._generate_rows(module, rows, explore)
        else:
            act_np, columns, state_out = self._forward_rows(module, rows, explore)
        state = self.sampler_state
        space = module.action_space
        box = isinstance(space, gym.spaces.Box)
        names = (*columns, WEIGHTS_SEQ_NO)
        # each row's values (iterating an array yields what indexing it does)
        per_row = zip(act_np, *columns.values(), itertools.repeat(self._weights_seq_no))
        for r, ((i, agent), (a, *values)) in enumerate(zip(rows.keys, per_row, strict=True)):
            actions[i][agent] = a
            for_env[i][agent] = self._for_env(a, space) if box else a
            extra = dict(zip(names, values, strict=True))
            if state_out is not None:  # the state after this step, per row
                h = {k: v[r] for k, v in state_out.items()}
                state.states[i][agent] = h
                extra[Columns.STATE_OUT] = {k: v.numpy() for k, v in h.items()}
            extras[i][agent] = extra

    def _forward_rows(
        self, module: Any, rows: _Rows, explore: bool
    ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, torch.Tensor] | None]:
        """A small-network (or scripted) module's rows: one forward on float observations
        (GRU states per row), actions sampled from each row's env stream. Returns the actions,
        the columns to store and, for a recurrent module, the state after this step."""
        state = self.sampler_state
        stateful = module.is_stateful()
        # a runner given a GPU (resources.num_gpus_per_env_runner) holds its modules there
        device = self._device if any(True for _ in module.parameters()) else "cpu"
        obs = to_tensors(stack_observations(rows.obs), device, time_axis=stateful)
        batch: dict[str, Any] = {Columns.OBS: obs}  # a dict for masked observations
        if stateful:
            init = module.get_initial_state()
            batch[Columns.STATE_IN] = {
                k: torch.stack([state.states[i].get(a, {}).get(k, v) for i, a in rows.keys]).to(
                    device
                )
                for k, v in init.items()
            }
        out = forward(module, batch, explore)
        columns: dict[str, np.ndarray] = {}
        if Columns.ACTIONS in out:  # scripted modules act directly
            act = out[Columns.ACTIONS]
            if Columns.ACTION_LOGP in out:
                columns[Columns.ACTION_LOGP] = to_numpy(out[Columns.ACTION_LOGP])
        else:
            logits = out[Columns.ACTION_DIST_INPUTS]
            logits = logits[:, 0] if stateful else logits  # no time axis
            with torch.no_grad():
                act = self._draw(module, logits, rows, explore, columns)
        state_out = None
        if stateful:
            state_out = {k: v.detach().cpu() for k, v in out[Columns.STATE_OUT].items()}
        return to_numpy(act), columns, state_out

    def _generate_rows(
        self, module: Any, rows: _Rows, explore: bool
    ) -> tuple[np.ndarray, dict[str, np.ndarray], None]:
        """An LLM module's rows (``CausalLMModule``): **one** ``generate`` for all of them.

        Observations go in as the token ids they are (the obs space's integer dtype). Each row
        gets a sampling seed drawn from its env's generator (:data:`~marl_agents.llm.
        rl_module.SAMPLING_SEEDS`), so its tokens depend on its env's stream alone — except
        rows of a module sampled by vLLM (:func:`seeds_rows`). Every output but the actions
        (``action_logp``, ``token_logp``, ``sampling_temperature``) is a column stored under its
        own name, as RLlib's sampler stores it.
        """
        out = forward(module, self._llm_batch(module, rows), explore)
        self.metrics.log_value(ROWS_PER_GENERATE, len(rows.keys), reduce="mean")
        return _acted(out)

    def _llm_batch(self, module: Any, rows: _Rows) -> dict[str, Any]:
        """An LLM module's forward batch: the rows' token ids and, unless vLLM samples it,
        a sampling seed per row from its env's stream."""
        dtype = getattr(module.observation_space, "dtype", None) or np.int64
        obs = torch.from_numpy(np.stack(rows.obs).astype(dtype, copy=False))
        # each call's constraint, carried by its observation
        batch: dict[str, Any] = add_constraint_keys({Columns.OBS: obs}, rows.obs)
        if seeds_rows(module):
            rngs = self.sampler_state.rngs
            seeds = np.array([rngs[i].integers(SEED_BOUND) for i, _ in rows.keys], np.int64)
            batch[SAMPLING_SEEDS] = torch.from_numpy(seeds)
        return batch

    def _generate_together(
        self, rows: dict[str, _Rows], explore: bool
    ) -> dict[str, tuple[np.ndarray, dict[str, np.ndarray], None]]:
        """LoRA pools on one base with rows this step: all their rows in **one** ``generate``
        (:func:`marl_agents.llm.shared_batch.act_together`), per module the forward result
        :meth:`_generate_rows` would give. Modules alone on their base are left out."""
        by_base: dict[int, list[str]] = defaultdict(list)
        for mid in rows:
            base = batch_key(self.module[mid])
            if base is not None:
                by_base[id(base)].append(mid)
        done: dict[str, tuple[np.ndarray, dict[str, np.ndarray], None]] = {}
        for mids in by_base.values():
            if len(mids) < 2:
                continue
            modules = [self.module[m] for m in mids]
            batches = [self._llm_batch(self.module[m], rows[m]) for m in mids]
            outs = forward_together(modules, batches, explore)
            n = sum(len(rows[m].keys) for m in mids)
            self.metrics.log_value(ROWS_PER_GENERATE, n, reduce="mean")
            done.update({m: _acted(out) for m, out in zip(mids, outs, strict=True)})
        return done

    def _draw(
        self, module: Any, logits: torch.Tensor, rows: _Rows, explore: bool, columns: dict
    ) -> Any:
        """Sample (or, without exploration, take the mode of) each row's distribution; the
        distribution inputs and log-probabilities go to ``columns``. Categorical and
        multi-categorical pools skip RLlib's distribution objects
        (:func:`~trainers.sampling.action_rows.categorical_rows`: the same ops, so the same
        numbers)."""
        dist_cls = (
            module.get_exploration_action_dist_cls()
            if explore
            else module.get_inference_action_dist_cls()
        )
        lens = self._categorical_lens(dist_cls, logits)
        rngs = self.sampler_state.rngs
        if lens is not None:
            draw = [rngs[i] for i, _ in rows.keys] if explore else None
            act, logp = categorical_rows(logits, lens[0], lens[1], draw)
        else:
            dist = dist_cls.from_logits(logits)
            act = (
                sample_rows(dist, [rngs[i] for i, _ in rows.keys])
                if explore
                else dist.to_deterministic().sample()
            )
            logp = dist.logp(act)
        columns[Columns.ACTION_DIST_INPUTS] = to_numpy(logits)
        columns[Columns.ACTION_LOGP] = to_numpy(logp)
        return act

    def _categorical_lens(self, dist_cls: Any, logits: torch.Tensor) -> Any:
        """:func:`~trainers.learners.categorical.categorical_lens` of ``dist_cls``, probed once."""
        if dist_cls not in self._lens:
            self._lens[dist_cls] = categorical_lens(dist_cls, logits)
        return self._lens[dist_cls]

    def _for_env(self, action: Any, space: Any) -> Any:
        """The action the env gets: Box actions unsquashed/clipped as RLlib's connector does."""
        if not isinstance(space, gym.spaces.Box):
            return action
        if self.config.normalize_actions:
            return unsquash_action(action, space)
        if self.config.clip_actions:
            return clip_action(action, space)
        return action


class _Counts:
    """Steps sampled in one ``sample()`` call, logged once at its end (RLlib logs per step)."""

    def __init__(self) -> None:
        self.env = 0
        self.episodes = 0
        self.agents: Counter[Any] = Counter()
        self.modules: Counter[str] = Counter()

    def add(self, obs: Mapping[str, Any], episode: Any) -> None:
        self.env += 1
        self.agents.update(obs.keys())  # agent ids as they are: str() once, in log()
        self.modules.update(map(episode.module_for, obs))

    def log(self, runner: MultiAgentEnvRunner) -> None:
        m = runner.metrics
        m.log_value(NUM_ENV_STEPS_SAMPLED, self.env, reduce="sum")
        m.log_value(
            NUM_ENV_STEPS_SAMPLED_LIFETIME, self.env, reduce="lifetime_sum", with_throughput=True
        )
        if self.episodes:
            m.log_value(NUM_EPISODES, self.episodes, reduce="sum")
            m.log_value(NUM_EPISODES_LIFETIME, self.episodes, reduce="lifetime_sum")
        agents: Counter[str] = Counter()
        for aid, n in self.agents.items():
            agents[str(aid)] += n
        for aid, n in agents.items():
            m.log_value((NUM_AGENT_STEPS_SAMPLED, aid), n, reduce="sum")
            m.log_value((NUM_AGENT_STEPS_SAMPLED_LIFETIME, aid), n, reduce="lifetime_sum")
        for mid, n in self.modules.items():
            m.log_value((NUM_MODULE_STEPS_SAMPLED, mid), n, reduce="sum")
            m.log_value((NUM_MODULE_STEPS_SAMPLED_LIFETIME, mid), n, reduce="lifetime_sum")
        if self.env:
            log_env_steps_sampled(runner, self.env)
