"""The GRPO learner connector pieces.

* :class:`GRPOAdvantages` (a learner connector piece appended after RLlib's default pipeline;
  it replaces GAE): per module, one sample per (episode, agent) with reward = the agent's
  return in the episode — the team reward, or the per-agent credit when a credit connector
  (``trainers.credit.connector``) rewrote the rewards earlier in the pipeline. Samples are
  grouped by (task seed, agent) (with ``rewards.normalize: per_source``, each reward source
  is first normalised within its group and the sources summed:
  :func:`trainers.signals.rewards.per_source_from_episodes`) and turned into advantages by
  :func:`trainers.grpo.loss.compute_advantages` (format penalty, length dual, dynamic sampling,
  std scaling), then spread over the episode's steps by ``turn_credit``
  (:mod:`trainers.grpo.turn_credit`: the same value on every step by default, or reward to go, or
  GiGPO step groups keyed by the anchors ``GroupedEnv`` records from ``Scenario.anchor_key``).
  Recurrent modules get them zero-padded like their batch. Modules that do not learn
  (``policies_to_train``) are skipped.
* :class:`LearnerOldLogprobs` (a learner connector piece after :class:`GRPOAdvantages`, only
  for trained modules whose ``grpo.tis`` is active — by default those sampled by vLLM):
  scores the batch's tokens with the learner's weights at the start of the update
  (:data:`LEARNER_OLD_LOGP`). The loss then uses them as the ratio's old logprobs and
  weights each token by the truncated importance ratio against the sampler's logprobs
  (:func:`trainers.grpo.loss.tis_weights`), logging ``mismatch_abs_logprob`` (mean
  ``|Δ logprob|``), ``tis_clip_fraction`` and ``tis_weight_mean``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from typing_extensions import override

from trainers.configs.grpo import GRPOLoss
from trainers.grpo.loss import LengthDual, compute_advantages
from trainers.grpo.turn_credit import episode_anchors, turn_advantages
from trainers.signals.monitors import well_formed
from trainers.signals.rewards import per_source_from_episodes

#: batch column: the GRPO advantage of the row's episode (one value per row).
ADVANTAGES = "advantages"
#: batch column: whether the row's group was kept by dynamic sampling.
GRPO_KEEP = "grpo_keep"
#: batch column: the learner's logprobs of the sampled tokens at the start of the update
#: ``[B, max_new_tokens]`` (TIS's ``lp_old``; only for modules whose ``grpo.tis`` is active).
LEARNER_OLD_LOGP = "learner_old_logp"
#: ``learner_config_dict`` key holding the :class:`~trainers.configs.grpo.GRPOLoss` fields.
CONFIG_KEY = "grpo"
#: learner-results counter (``ALL_MODULES``): iterations whose episodes had no step of a trained
#: module, so no update ran.
SKIPPED_UPDATES = "grpo_skipped_updates"


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
        duals: module id → :class:`~trainers.grpo.loss.LengthDual` (filled on first use when
            ``grpo.length_budget`` is set; owned by the learner so it is checkpointed).
        trainable: a predicate ``module_id -> bool``; other modules get no advantages.
    """

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        grpo: GRPOLoss | None = None,
        duals: dict[str, LengthDual] | None = None,
        trainable: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.grpo = grpo or GRPOLoss()
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
        (:func:`trainers.grpo.turn_credit.turn_advantages`)."""
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
