"""Token-level GRPO through RLlib's Learner API (new API stack), for LLM policies (and, one
"token" per step, for small-network policies).

The pieces, each an RLlib seam:

* :class:`GroupedEnv` (env side): an :class:`~scenarios.rllib_env.RLlibGraphEnv` whose task
  seeds come from a **group schedule**, so that ``G`` rollouts share one task. Every env
  repeats each task seed ``repeat`` times (counted in *finished* episodes: an episode cut off
  by a reset is re-run with the same seed), and with ``shared_seeds`` all vector sub-envs of
  an env runner draw the same seed stream, so the ``k``-th finished episode of each sub-env has
  the same task. With ``num_envs_per_env_runner = G``, ``repeat = 1`` and ``shared_seeds`` the
  ``G`` rollouts of a task are sampled side by side, in one batched generation per step.
  (The seed RLlib passes to ``reset()`` is ignored: it passes the same config seed at every
  forced reset, which would replay the same tasks every iteration.)
* :class:`GRPOAdvantages` (a learner connector piece appended after RLlib's default pipeline;
  it replaces GAE): per module, one sample per (episode, agent) with reward = the agent's
  return in the episode — the team reward, or the per-agent credit when a credit connector
  (``trainers.credit_connector``) rewrote the rewards earlier in the pipeline. Samples are
  grouped by (task seed, agent) (with ``rewards.normalize: per_source``, each reward source
  is first normalised within its group and the sources summed:
  :func:`trainers.reward_config.per_source_from_episodes`) and turned into advantages by
  :func:`trainers.grpo.compute_advantages` (format penalty, length dual, dynamic sampling,
  std scaling), then spread over the episode's steps by ``turn_credit``
  (:mod:`trainers.turn_credit`: the same value on every step by default, or reward to go, or
  GiGPO step groups keyed by the anchors ``GroupedEnv`` records from ``Scenario.anchor_key``).
  Recurrent modules get them zero-padded like their batch. Modules that do not learn
  (``policies_to_train``) are skipped.
* :class:`GRPOLearner` (a ``TorchLearner``): ``compute_loss_for_module`` calls
  :func:`trainers.grpo.grpo_loss` with every knob of :class:`~trainers.grpo.GRPOConfig` on the
  module's teacher-forced token logprobs (``CausalLMModule.forward_train``) against those
  recorded at sampling. Both are under the distribution that drew the tokens: the sampler
  stores ``log softmax(logits / T)`` and the row's temperature ``T``
  (``SAMPLING_TEMPERATURE``), and the training forward divides its logits by that ``T``;
  a constrained reply's tokens are scored under the grammar masks they were drawn under
  (``TOKEN_MASK``, :mod:`marl_agents.llm.constraints`).
  Trained modules must sample with ``temperature > 0`` and ``top_p = 1``
  (``CausalLMModule.check_trainable``, checked when the learner is built). Only the module's
  own sampled tokens carry gradient: the observation (prompt, other agents' messages, tool
  outputs) is never scored, and padding is masked. It logs ``logprob_gap`` (largest
  ``|new − old|`` token logprob) and ``sampler_kl`` (k3 estimate of ``KL(sampler ‖ learner)``
  on the sampled tokens) per minibatch, their ``_fresh`` values on the first minibatch of an
  update (weights still equal to the samplers': the agreement check, ≈ 0 unless sampler and
  learner score different distributions), ``sampling_temperature`` (mean ``T`` of the rows),
  a frozen KL reference (scored at the same ``T``) when ``kl_coef > 0``, and the length
  dual's ``λ``. A module that is not a ``CausalLMModule`` (MLP, GRU, ...) gets the same
  clipped surrogate on its actions' logprobs (``_action_loss``; no value function, no KL).
* :class:`LearnerOldLogprobs` (a learner connector piece after :class:`GRPOAdvantages`, only
  for trained modules whose ``grpo.tis`` is active — by default those sampled by vLLM):
  scores the batch's tokens with the learner's weights at the start of the update
  (:data:`LEARNER_OLD_LOGP`). The loss then uses them as the ratio's old logprobs and
  weights each token by the truncated importance ratio against the sampler's logprobs
  (:func:`trainers.grpo.tis_weights`), logging ``mismatch_abs_logprob`` (mean
  ``|Δ logprob|``), ``tis_clip_fraction`` and ``tis_weight_mean``.
* :class:`GRPO` (a ``PPO`` subclass) samples exactly ``episodes_per_iteration`` finished
  episodes per iteration (so groups are whole) and updates the learners like PPO;
  :class:`GRPOAlgorithmConfig` carries the knobs (``config.grpo(...)``).

Example:
    >>> cfg = GRPOAlgorithmConfig().grpo(group_size=4, groups_per_iteration=2, clip_high=0.3)
    >>> cfg.learner_config_dict["grpo"]["clip_high"], cfg.episodes_per_iteration
    (0.3, 8)
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.ppo import PPO, PPOConfig
from ray.rllib.algorithms.ppo.ppo import LEARNER_RESULTS_KL_KEY
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import ENTROPY_KEY
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)
from typing_extensions import override

import marl_agents.llm.subagents  # noqa: F401  (registers the hf and vllm subagent backends)
import scenarios.text_delegate  # noqa: F401  (registers text-delegate in env-runner processes)
from marl_agents.llm.rl_module import TOKEN_ENTROPY, TOKEN_LOGP, CausalLMModule
from scenarios.rllib_env import RLlibGraphEnv
from trainers.async_sampling import SamplePipeline, shares
from trainers.config import GRPOConfig
from trainers.curriculum import SCHEDULE, passed
from trainers.grpo import LengthDual, compute_advantages, grpo_loss, kl_k3, sampler_kl
from trainers.monitors import KL_TO_START, well_formed
from trainers.reward_config import per_source_from_episodes
from trainers.turn_credit import ANCHOR_INFO, episode_anchors, turn_advantages

#: batch column: the GRPO advantage of the row's episode (one value per row).
ADVANTAGES = "advantages"
#: batch column: whether the row's group was kept by dynamic sampling.
GRPO_KEEP = "grpo_keep"
#: batch column: the learner's logprobs of the sampled tokens at the start of the update
#: ``[B, max_new_tokens]`` (TIS's ``lp_old``; only for modules whose ``grpo.tis`` is active).
LEARNER_OLD_LOGP = "learner_old_logp"
#: ``learner_config_dict`` key holding the :class:`~trainers.grpo.GRPOConfig` fields.
CONFIG_KEY = "grpo"
#: learner-results counter (``ALL_MODULES``): iterations whose episodes had no step of a trained
#: module, so no update ran.
SKIPPED_UPDATES = "grpo_skipped_updates"


# ----- group sampling (env side) ------------------------------------------------------------
class GroupedEnv(RLlibGraphEnv):
    """An RLlib view of a scenario whose task seeds follow a group schedule (module doc).

    Args:
        config: the :class:`~scenarios.rllib_env.RLlibGraphEnv` config plus ``seed`` (base of
            the seed stream, default 0), ``repeat`` (finished episodes per task seed and env,
            default 1), ``shared_seeds`` (all sub-envs of a runner share the stream,
            default True) and ``curriculum`` (``{"tasks": [seeds], "pass_threshold": x}``:
            tasks come from this process's :data:`trainers.curriculum.SCHEDULE`, which also
            gets every finished episode's pass/fail). An RLlib ``EnvContext`` supplies
            ``worker_index`` (and ``vector_index``, used when ``shared_seeds`` is False).
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        cfg = config or {}
        self.repeat = int(cfg.get("repeat", 1))
        if self.repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {self.repeat}")
        stream = [int(cfg.get("seed", 0)), int(getattr(cfg, "worker_index", 0))]
        if not cfg.get("shared_seeds", True):
            stream.append(int(getattr(cfg, "vector_index", 0)))
        self._stream = tuple(stream)
        self._curriculum: Mapping[str, Any] | None = cfg.get("curriculum")
        if self._curriculum is not None:
            SCHEDULE.ensure(self._curriculum["tasks"])
        self._seeds = np.random.default_rng(stream)
        self._k = 0  # tasks drawn before the current one
        self._task_index = 0  # the current task's index in the curriculum's pool
        self._task_seed = self._next_task()
        self._finished = 0  # finished episodes of the current task seed

    def _next_task(self) -> int:
        if self._curriculum is None:
            return int(self._seeds.integers(2**31))
        self._task_index = SCHEDULE.draw(self._stream, self._k)
        return int(self._curriculum["tasks"][self._task_index])

    @property
    def task_seed(self) -> int:
        """The task seed the next (or current) episode runs."""
        return self._task_seed

    @override
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, infos = super().reset(seed=self._task_seed, options=options)
        return obs, self._anchors(obs, infos)

    @override
    def step(self, action_dict: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
        obs, rewards, terms, truncs, infos = super().step(action_dict)
        if terms.get("__all__") or truncs.get("__all__"):
            if self._curriculum is not None and self.env.outcome is not None:
                ok = passed(self.env.outcome, self._curriculum.get("pass_threshold"))
                SCHEDULE.record(self._stream, self._k, self._task_index, ok)
            self._finished += 1
            if self._finished >= self.repeat:
                self._finished = 0
                self._k += 1
                self._task_seed = self._next_task()
        return obs, rewards, terms, truncs, self._anchors(obs, infos)

    def _anchors(self, obs: Mapping[str, Any], infos: dict[str, Any]) -> dict[str, Any]:
        """``infos`` with the scenario's anchor key of each observation (``Scenario.anchor_key``;
        nothing added where it returns ``None``: the observation itself is the anchor)."""
        scenario = self.env.scenario
        for agent, ob in obs.items():
            key = scenario.anchor_key(agent, ob)
            if key is not None:
                infos[agent] = {**infos.get(agent, {}), ANCHOR_INFO: key}
        return infos

    def schedule_state(self) -> dict[str, Any]:
        """Where this env is in its task schedule (saved by :mod:`trainers.resume`)."""
        return {
            "rng": self._seeds.bit_generator.state,
            "k": self._k,
            "task_index": self._task_index,
            "task_seed": self._task_seed,
            "finished": self._finished,
        }

    def set_schedule_state(self, state: Mapping[str, Any]) -> None:
        """Set what :meth:`schedule_state` returned."""
        self._seeds.bit_generator.state = state["rng"]
        self._k, self._task_index = int(state["k"]), int(state["task_index"])
        self._task_seed, self._finished = int(state["task_seed"]), int(state["finished"])


# ----- advantages (learner connector) -------------------------------------------------------
def episode_seed(sa_episode: Any) -> int | None:
    """The task seed recorded in an agent episode's infos (``GraphEnv`` writes ``seed``)."""
    infos = sa_episode.get_infos()
    for info in (infos[-1], infos[0]) if len(infos) else ():
        if isinstance(info, Mapping) and info.get("seed") is not None:
            return int(info["seed"])
    return None


def episode_format_ok(sa_episode: Any) -> bool | None:
    """``False`` when the episode's outcome reports a format error (``None``: not reported)."""
    infos = sa_episode.get_infos()
    last = infos[-1] if len(infos) else None
    return well_formed(last.get("outcome") if isinstance(last, Mapping) else None)


class GRPOAdvantages(ConnectorV2):
    """Group-normalised advantages per (episode, agent), spread over the episode's rows.

    Args:
        grpo: the knobs.
        duals: module id → :class:`~trainers.grpo.LengthDual` (filled on first use when
            ``grpo.length_budget`` is set; owned by the learner so it is checkpointed).
        trainable: a predicate ``module_id -> bool``; other modules get no advantages.
    """

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        grpo: GRPOConfig | None = None,
        duals: dict[str, LengthDual] | None = None,
        trainable: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.grpo = grpo or GRPOConfig()
        self.duals = duals if duals is not None else {}
        self.trainable = trainable or (lambda mid: True)

    @override
    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[str, Any],
        episodes: list[Any],
        metrics: Any = None,
        **kwargs: Any,
    ) -> Any:
        sa_episodes = list(
            self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False)
        )
        for module_id, module_batch in batch.items():
            if not self.trainable(module_id) or Columns.ACTIONS not in module_batch:
                continue
            module = rl_module[module_id].unwrapped()
            mine = [e for e in sa_episodes if e.module_id in (None, module_id)]
            lens = [len(e) for e in mine]
            stateful = module.is_stateful()
            if stateful:  # rows are zero-padded sequences; the loss mask marks real steps
                rows = int(module_batch[Columns.LOSS_MASK].sum())
            else:
                rows = len(module_batch[Columns.ACTIONS])
            if sum(lens) != rows:
                raise RuntimeError(
                    f"GRPO: module {module_id!r} has {rows} rows but its episodes have "
                    f"{sum(lens)} steps; GRPO needs complete episodes "
                    "(batch_mode='complete_episodes')"
                )
            adv, keep, stats = self.advantages(module_id, module, mine)
            adv, keep, turn_stats = self.per_turn(mine, adv, keep)
            if stateful:
                adv, keep = (pad_episodes(x, lens, module) for x in (adv, keep))
            device = module_batch[Columns.ACTIONS].device
            module_batch[ADVANTAGES] = torch.as_tensor(adv, device=device)
            module_batch[GRPO_KEEP] = torch.as_tensor(keep, device=device)
            stats.update(turn_stats)
            if metrics is not None:
                metrics.log_dict(
                    {f"grpo/{k}": v for k, v in stats.items()}, key=module_id, window=1
                )
        return batch

    def per_turn(
        self, sa_episodes: list[Any], adv: np.ndarray, keep: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
        """Episode ``(advantage, keep)`` → one per step, by ``grpo.turn_credit``
        (:func:`trainers.turn_credit.turn_advantages`)."""
        rewards = [np.asarray(e.get_rewards(), dtype=np.float64) for e in sa_episodes]
        anchors = None
        if self.grpo.turn_credit == "step_groups":
            anchors = [episode_anchors(e) for e in sa_episodes]
        groups = [self._group_key(e) for e in sa_episodes]
        ids = {k: i for i, k in enumerate(dict.fromkeys(groups))}
        return turn_advantages(
            rewards, [ids[k] for k in groups], adv, keep, self.grpo, anchors=anchors
        )

    @staticmethod
    def _group_key(sa_episode: Any) -> tuple[Any, ...]:
        """An agent episode's GRPO group: its task seed and agent."""
        seed = episode_seed(sa_episode)
        return (seed, sa_episode.agent_id) if seed is not None else ("batch", sa_episode.agent_id)

    def advantages(
        self, module_id: str, module: Any, sa_episodes: list[Any]
    ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
        """``(advantage, keep)`` per agent episode, and summary statistics."""
        n = len(sa_episodes)
        rewards = np.array([float(np.sum(e.get_rewards())) for e in sa_episodes], np.float32)
        keys: dict[tuple[Any, ...], int] = {}
        groups = np.empty(n, dtype=np.int64)
        for i, e in enumerate(sa_episodes):
            groups[i] = keys.setdefault(self._group_key(e), len(keys))
        rewards = per_source_from_episodes(sa_episodes, rewards, groups)
        pad = getattr(module, "pad_id", None)
        lengths = np.zeros(n, dtype=np.float32)
        for i, e in enumerate(sa_episodes):
            acts = np.asarray(e.get_actions())
            lengths[i] = float((acts != pad).sum()) if pad is not None else float(acts.size)
        ok = [episode_format_ok(e) for e in sa_episodes]
        format_ok = None if any(o is None for o in ok) else torch.tensor(ok, dtype=torch.bool)
        dual = None
        if self.grpo.length_budget is not None:
            dual = self.duals.setdefault(module_id, LengthDual.from_config(self.grpo))
        adv, keep = compute_advantages(
            torch.as_tensor(rewards),
            torch.as_tensor(groups),
            self.grpo,
            lengths=torch.as_tensor(lengths),
            format_ok=format_ok,
            dual=dual,
        )
        stats = {
            "reward_mean": float(rewards.mean()) if n else 0.0,
            "groups": float(len(keys)),
            "group_size_mean": n / max(len(keys), 1),
            "kept_fraction": float(keep.float().mean()) if n else 0.0,
            "completion_tokens_mean": float(lengths.mean()) if n else 0.0,
        }
        if dual is not None:
            stats["length_dual"] = dual.update(torch.as_tensor(lengths))
        return adv.numpy().astype(np.float32), keep.numpy(), stats


def pad_episodes(values: np.ndarray, lens: list[int], module: Any) -> np.ndarray:
    """Per-step values laid out like a recurrent module's zero-padded ``[B, T]`` batch."""
    from ray.rllib.utils.postprocessing.zero_padding import split_and_zero_pad_n_episodes

    seq = module.model_config["max_seq_len"]
    return np.stack(split_and_zero_pad_n_episodes(values, episode_lens=lens, max_seq_len=seq))


class LearnerOldLogprobs(ConnectorV2):
    """The learner's logprobs of each row's tokens before the update (:data:`LEARNER_OLD_LOGP`).

    Runs once per update, before minibatching, so every minibatch and epoch sees the
    logprobs of the weights the update started from (scored at each row's sampling
    temperature, without gradient).

    Args:
        active: a predicate ``module_id -> bool``: the modules to score (TIS active).
    """

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        active: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.active = active or (lambda mid: False)

    @override
    def __call__(self, *, rl_module: Any, batch: dict[str, Any], **kwargs: Any) -> Any:
        for module_id, module_batch in batch.items():
            if not self.active(module_id) or Columns.ACTIONS not in module_batch:
                continue
            module = rl_module[module_id].unwrapped()
            with torch.no_grad():
                lp, _ = module.score(
                    module_batch[Columns.OBS],
                    module_batch[Columns.ACTIONS],
                    temperature=module.batch_temperature(module_batch),
                    token_mask=module.batch_token_mask(module_batch),
                )
            module_batch[LEARNER_OLD_LOGP] = lp.detach()
        return batch


# ----- the learner ---------------------------------------------------------------------------
class GRPOLearner(TorchLearner):
    """Token-level GRPO for :class:`~marl_agents.llm.rl_module.CausalLMModule` modules, and
    step-level GRPO for other RLlib torch modules.

    Reads its knobs from ``config.learner_config_dict["grpo"]`` (the fields of
    :class:`~trainers.grpo.GRPOConfig`). See the module doc for what each part does.
    """

    @override
    def build(self) -> None:
        super().build()
        fields = dict(self.config.learner_config_dict.get(CONFIG_KEY, {}))
        self.grpo = GRPOConfig(**fields)
        self.duals: dict[str, LengthDual] = {}
        self._refs: dict[str, Any] = {}
        self._fresh = False
        for mid in self.module.keys():  # noqa: SIM118 (MultiRLModule iterates by index)
            module = self.module[mid].unwrapped()
            if self.should_module_be_updated(mid) and isinstance(module, CausalLMModule):
                module.check_trainable(f"module {mid!r}")
        if self._learner_connector is not None:
            self._learner_connector.append(
                GRPOAdvantages(
                    grpo=self.grpo,
                    duals=self.duals,
                    trainable=lambda mid: self.should_module_be_updated(mid),
                )
            )
            self._learner_connector.append(LearnerOldLogprobs(active=self.tis_active))
        # a frozen copy of the starting weights: the KL penalty's reference, and the reference
        # of the kl_to_start metric (trainers.monitors), also when kl_coef is 0
        if self.grpo.kl_coef or self.config.learner_config_dict.get(KL_TO_START, False):
            for mid in self.module.keys():  # noqa: SIM118 (MultiRLModule iterates by index)
                llm = isinstance(self.module[mid].unwrapped(), CausalLMModule)
                if self.should_module_be_updated(mid) and (llm or self.grpo.kl_coef):
                    if not llm:  # kl_to_start alone is only measured for LLM modules
                        raise ValueError(
                            f"GRPO kl_coef > 0 needs LLM modules (a reference model); module "
                            f"{mid!r} is {type(self.module[mid].unwrapped()).__name__}"
                        )
                    ref = copy.deepcopy(self.module[mid].unwrapped().model)
                    for p in ref.parameters():
                        p.requires_grad_(False)
                    self._refs[mid] = ref.eval()

    def tis_active(self, module_id: str) -> bool:
        """Whether ``module_id`` is trained with the TIS correction (``grpo.tis``)."""
        if not self.should_module_be_updated(module_id):
            return False
        module = self.module[module_id].unwrapped()
        sampler = getattr(module, "sampler", "transformers")
        return isinstance(module, CausalLMModule) and self.grpo.tis.active(sampler)

    @override
    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().before_gradient_based_update(timesteps=timesteps)
        self._fresh = True  # weights equal the samplers' until the first optimizer step

    @override
    def apply_gradients(self, gradients_dict: Any) -> None:
        super().apply_gradients(gradients_dict)
        self._fresh = False

    @override
    def compute_loss_for_module(
        self, *, module_id: str, config: Any, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        module = self.module[module_id].unwrapped()
        if not isinstance(module, CausalLMModule):
            return self._action_loss(module_id, module, batch, fwd_out)
        lp = fwd_out[TOKEN_LOGP]
        entropy = fwd_out.get(TOKEN_ENTROPY)
        old = batch[TOKEN_LOGP].float()  # the sampler's (behaviour) logprobs
        actions = batch[Columns.ACTIONS]
        mask = actions != module.pad_id  # the module's own sampled tokens only
        if GRPO_KEEP in batch:
            mask = mask & batch[GRPO_KEEP].bool()[:, None]
        adv = batch[ADVANTAGES].float()
        temps = module.batch_temperature(batch)  # the rows' sampling temperatures
        ref = None
        if self.grpo.kl_coef or (self._fresh and module_id in self._refs):
            with torch.no_grad():
                ref, _ = module.score(
                    batch[Columns.OBS],
                    actions,
                    model=self._refs[module_id],
                    temperature=temps,
                    token_mask=module.batch_token_mask(batch),
                )
        drift = kl_to_start(lp, ref, actions != module.pad_id) if self._fresh else None
        if not self.grpo.kl_coef:
            ref = None  # only measured: no penalty
        learner_old = batch.get(LEARNER_OLD_LOGP)
        if learner_old is not None:  # TIS: ratio against the learner, weights against the sampler
            loss, stats = grpo_loss(
                lp,
                learner_old.float(),
                adv,
                mask,
                self.grpo,
                ref_logprobs=ref,
                entropy=entropy,
                sampler_logprobs=old,
            )
        else:
            loss, stats = grpo_loss(
                lp, old, adv, mask, self.grpo, ref_logprobs=ref, entropy=entropy
            )
        with torch.no_grad():
            own = actions != module.pad_id
            gap = float(((lp - old).abs() * own).max()) if own.any() else 0.0
            stats["logprob_gap"] = gap
            stats["sampler_kl"] = sampler_kl(old, lp.detach(), own)
            if learner_old is None and self._fresh and own.any():
                # no recompute: at the sampler's weights the learner's logprobs are lp_old
                stats["mismatch_abs_logprob"] = float((lp - old).abs()[own].mean())
            stats["sampling_temperature"] = float(temps.mean()) if len(temps) else 0.0
            if entropy is not None and own.any():
                stats["entropy"] = float((entropy * own).sum() / own.sum())
            stats["advantage_abs_mean"] = float(adv.abs().mean()) if len(adv) else 0.0
        self.metrics.log_dict({f"grpo/{k}": v for k, v in stats.items()}, key=module_id, window=1)
        # also under RLlib's standard names, which train()'s metrics (losses/<pool>/…) report
        standard = {LEARNER_RESULTS_KL_KEY: stats["kl"]}
        if "entropy" in stats:
            standard[ENTROPY_KEY] = stats["entropy"]
        self.metrics.log_dict(standard, key=module_id, window=1)
        if drift is not None:
            self.metrics.log_value((module_id, "grpo/kl_to_start"), drift, window=1)
        if self._fresh:
            self.metrics.log_value((module_id, "grpo/logprob_gap_fresh"), gap, window=1)
            self.metrics.log_value(
                (module_id, "grpo/sampler_kl_fresh"), stats["sampler_kl"], window=1
            )
        return loss

    def _action_loss(
        self, module_id: str, module: Any, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        """GRPO for a plain RLlib torch module (MLP, GRU, ...): the clipped surrogate of
        :func:`~trainers.grpo.grpo_loss` on each step's action logprob (one "token" per step)
        with the group advantages; no value function. Recurrent batches are ``[B, T]`` with
        RLlib's loss mask; flat batches become ``[N, 1]``."""
        dist = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        lp = dist.logp(batch[Columns.ACTIONS])
        old = batch[Columns.ACTION_LOGP].float()
        adv = batch[ADVANTAGES].float()
        real = batch[Columns.LOSS_MASK].bool() if Columns.LOSS_MASK in batch else None
        if real is None:
            real = torch.ones_like(adv, dtype=torch.bool)
        mask = real & batch[GRPO_KEEP].bool() if GRPO_KEEP in batch else real
        entropy = dist.entropy() if self.grpo.spurious_mask else None
        if lp.dim() == 1:  # one row per step: a sequence of one "token"
            lp, old, adv, mask = lp[:, None], old[:, None], adv[:, None], mask[:, None]
            entropy = entropy[:, None] if entropy is not None else None
        loss, stats = grpo_loss(lp, old, adv, mask, self.grpo, entropy=entropy)
        with torch.no_grad():  # entropy over every real step, kept or not
            ent = dist.entropy().reshape(real.shape)
            stats["entropy"] = float(ent[real].mean()) if real.any() else 0.0
            stats["advantage_abs_mean"] = float(adv[mask].abs().mean()) if mask.any() else 0.0
        self.metrics.log_dict({f"grpo/{k}": v for k, v in stats.items()}, key=module_id, window=1)
        self.metrics.log_dict(
            {LEARNER_RESULTS_KL_KEY: stats["kl"], ENTROPY_KEY: stats["entropy"]},
            key=module_id,
            window=1,
        )
        return loss

    @override
    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        if self.duals:
            state["grpo_duals"] = {mid: d.state_dict() for mid, d in self.duals.items()}
        return state

    @override
    def set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        for mid, d in (state.pop("grpo_duals", None) or {}).items():
            self.duals.setdefault(mid, LengthDual(1.0)).load_state_dict(d)
        super().set_state(state)


def kl_to_start(logp: torch.Tensor, ref: torch.Tensor | None, mask: torch.Tensor) -> float | None:
    """KL(π ‖ π_start) per sampled token (:func:`~trainers.grpo.kl_k3`, unbiased when the
    tokens are drawn from π: the first minibatch of an update, before any optimizer step);
    None without a reference or tokens."""
    if ref is None or not mask.any():
        return None
    return float(kl_k3(logp.detach().double(), ref.double())[mask].mean())


# ----- the algorithm -------------------------------------------------------------------------
class GRPOAlgorithmConfig(PPOConfig):
    """``PPOConfig`` for :class:`GRPO`: the GRPO learner, whole episodes, group knobs.

    ``.grpo(group_size=G, groups_per_iteration=B, **GRPOConfig fields)`` sets the sampling
    schedule (``G·B`` finished episodes per iteration) and the loss knobs.
    """

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or GRPO)
        self.group_size = 4
        self.groups_per_iteration = 4
        self.batch_mode = "complete_episodes"
        self.learner_config_dict = {CONFIG_KEY: {}}
        self.async_sampling = False
        self.max_staleness = 1

    @property
    def episodes_per_iteration(self) -> int:
        """Finished episodes sampled per training iteration (``group_size · groups``)."""
        return int(self.group_size) * int(self.groups_per_iteration)

    def grpo(
        self,
        *,
        group_size: int | None = None,
        groups_per_iteration: int | None = None,
        async_sampling: bool | None = None,
        max_staleness: int | None = None,
        **knobs: Any,
    ) -> GRPOAlgorithmConfig:
        """Set the group schedule, asynchronous sampling (:mod:`trainers.async_sampling`) and
        :class:`~trainers.grpo.GRPOConfig` knobs.

        Raises:
            ValueError: an unknown knob or a bad value (checked by ``GRPOConfig``).
        """
        if group_size is not None:
            self.group_size = int(group_size)
        if groups_per_iteration is not None:
            self.groups_per_iteration = int(groups_per_iteration)
        if async_sampling is not None:
            self.async_sampling = bool(async_sampling)
        if max_staleness is not None:
            self.max_staleness = int(max_staleness)
        names = {f.name for f in dataclasses.fields(GRPOConfig)}
        unknown = sorted(set(knobs) - names)
        if unknown:
            raise ValueError(f"unknown GRPO knob(s) {unknown}; known: {sorted(names)}")
        merged = {**self.learner_config_dict.get(CONFIG_KEY, {}), **knobs}
        GRPOConfig(**merged)  # validate now, not on the learner
        self.learner_config_dict = {**self.learner_config_dict, CONFIG_KEY: merged}
        return self

    @override
    def get_default_learner_class(self) -> type:
        return GRPOLearner

    @override
    def validate(self) -> None:
        super().validate()
        if self.group_size < 1 or self.groups_per_iteration < 1:
            self._value_error("group_size and groups_per_iteration must be >= 1")
        bad = self.num_env_runners < 1 or self.max_staleness < 1
        if self.async_sampling and not self.in_evaluation and bad:
            self._value_error(
                "async_sampling needs num_env_runners >= 1 (it overlaps remote env runners "
                "with the learner) and max_staleness >= 1"
            )


class GRPO(PPO):
    """PPO's loop with episode-count sampling: ``episodes_per_iteration`` finished episodes."""

    @classmethod
    @override
    def get_default_config(cls) -> GRPOAlgorithmConfig:
        return GRPOAlgorithmConfig(cls)

    @override
    def setup(self, config: Any) -> None:
        super().setup(config)
        cfg = self.config
        self.pipeline = (
            SamplePipeline(max_staleness=cfg.max_staleness) if cfg.async_sampling else None
        )

    @override
    def training_step(self) -> None:
        if self.pipeline is not None:
            self._training_step_async(self.pipeline)
            return
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            episodes, runner_metrics = sample_episodes(
                self.env_runner_group, self.config.episodes_per_iteration, self.config.group_size
            )
            if not episodes:
                return
            self.metrics.aggregate(runner_metrics, key=ENV_RUNNER_RESULTS)
        learner_results = self._update(episodes)
        if learner_results is not None:
            self._sync_weights(learner_results)

    def _training_step_async(self, pipe: SamplePipeline) -> None:
        """Learn from the batch sampled during the last iteration while the runners sample
        the next one (:mod:`trainers.async_sampling`)."""
        group, n = self.env_runner_group, self.config.episodes_per_iteration
        g = self.config.group_size
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            if pipe.pending is None:  # first iteration (or a lost sample): sample now
                pipe.wait(group, pipe.launch(group, n, g))
            episodes, runner_metrics = pipe.take() or ([], [])
            self.metrics.aggregate(runner_metrics, key=ENV_RUNNER_RESULTS)
        requests = pipe.launch(group, n, g)  # overlaps the update below
        episodes, stats = pipe.filter(episodes)
        learner_results = self._update(episodes) if episodes else None
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            pipe.wait(group, requests)
        if learner_results is None:
            return
        pipe.learner_version += 1
        for module_id in set(learner_results[0]) - {ALL_MODULES}:
            for key, value in stats.items():
                self.metrics.log_value((LEARNER_RESULTS, module_id, key), value, window=1)
        if pipe.needs_sync():
            self._sync_weights(learner_results)
            pipe.runner_version = pipe.learner_version

    def _update(self, episodes: list[Any]) -> Any:
        """One learner update on ``episodes`` (``None``: no trained module acted, skipped)."""
        cfg = self.config
        if not any(self._trains(m) for m in episode_modules(episodes)):
            # no trained agent acted (e.g. a frozen agent used up every turn): nothing to learn,
            # and RLlib's learner cannot update on a batch without a trained module
            self.metrics.log_value((LEARNER_RESULTS, ALL_MODULES, SKIPPED_UPDATES), 1, reduce="sum")
            return None
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            learner_results = self.learner_group.update(
                episodes=episodes,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                        (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME)
                    ),
                    NUM_MODULE_STEPS_TRAINED_LIFETIME: self.metrics.peek(
                        (LEARNER_RESULTS, ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME),
                        default=0,
                    ),
                },
                num_epochs=cfg.num_epochs,
                minibatch_size=cfg.minibatch_size,
                shuffle_batch_per_epoch=cfg.shuffle_batch_per_epoch,
            )
            self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        return learner_results

    def _sync_weights(self, learner_results: Any) -> None:
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            modules = set(learner_results[0].keys()) - {ALL_MODULES}
            self.env_runner_group.sync_weights(
                from_worker_or_learner_group=self.learner_group,
                policies=modules,
                inference_only=True,
            )

    def _trains(self, module_id: str) -> bool:
        """Whether ``module_id`` is in ``policies_to_train``."""
        which = self.config.policies_to_train
        if which is None:
            return True
        return which(module_id, None) if callable(which) else module_id in which


def episode_modules(episodes: list[Any]) -> set[str]:
    """The module ids that acted (stepped at least once) in multi-agent ``episodes``."""
    return {
        sa.module_id
        for episode in episodes
        for sa in episode.agent_episodes.values()
        if sa.module_id is not None and len(sa) > 0
    }


def sample_episodes(group: Any, n: int, group_size: int = 1) -> tuple[list[Any], list[Any]]:
    """Sample ``n`` finished episodes: from the local runner, or split over remote runners in
    whole groups of ``group_size`` (:func:`trainers.async_sampling.shares`).

    Returns:
        ``(episodes, per-runner metrics)``.
    """
    remote = group.num_remote_env_runners()
    if remote == 0:
        runner = group.local_env_runner
        episodes = runner.sample(num_episodes=n, explore=True)
        return list(episodes), [runner.get_metrics()]
    share = shares(n, remote, group_size)

    def work(runner: Any) -> tuple[list[Any], Any]:
        k = share[(runner.worker_index - 1) % remote]
        return runner.sample(num_episodes=k, explore=True), runner.get_metrics()

    results = group.foreach_env_runner(work, local_env_runner=False)
    episodes = [e for eps, _ in results for e in eps]
    return episodes, [m for _, m in results]
