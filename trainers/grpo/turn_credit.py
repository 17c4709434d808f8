"""Turn-level credit for GRPO: how an agent's episode advantage is spread over its turns.

Per module, sample ``i`` is one agent's turns in one episode (an *agent episode*), in GRPO
group ``g`` (same task seed, same agent). ``r_{i,t}`` is the reward paid after turn ``t``: the
per-turn rewards the env pays (``emit_reward``, per-turn reward sources) and, on the last turn,
the verifier's terminal reward — or the agent's credit, when a credit connector (leave-one-out,
Shapley) replaced it. ``R_i = Σ_t r_{i,t}``, ``G_{i,t} = Σ_{s≥t} r_{i,s}`` (undiscounted reward
to go) and ``A_i`` the episode advantage of :func:`trainers.grpo.loss.compute_advantages`.
``GRPOLoss.turn_credit`` picks the advantage of turn ``t``:

* ``episode``: ``A_i`` (every turn the same; the default).
* ``reward_to_go``: ``A_i − (Σ_{s<t} r_{i,s}) / σ_g`` — that is ``(G_{i,t} − mean_g R) / σ_g``
  with ``σ_g`` the group's return std plus ``adv_eps`` (1 with ``scale_std: false``; the term
  is 0 in a group of equal returns): a turn is not credited with rewards paid before it. With
  terminal rewards only it equals ``episode``.
* ``step_groups`` (GiGPO): ``A_i + step_weight · S_{i,t}``, where ``S`` normalises ``G_{i,t}``
  (:func:`trainers.grpo.loss.group_advantages`) among the turns of group ``g`` that start from the
  same anchor state (:func:`episode_anchors`); a turn alone at its anchor gets ``S = 0``.

Credit across agents composes by construction: credit decides each agent's share of the
outcome (its terminal reward), turn credit then spreads that share over the agent's turns
(every turn's reward to go contains it) and per-turn rewards only reach the turns at or before
the one they were paid after. ``keep`` (dynamic sampling) is the episode group's; with
``step_groups`` a turn is also kept when its step group's rewards to go differ.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from trainers.configs.grpo import GRPOLoss
from trainers.grpo.loss import dynamic_sampling_mask, group_advantages, group_moments
from trainers.sampling.grouped_env import ANCHOR_INFO

__all__ = ["episode_anchors", "observation_key", "rewards_to_go", "turn_advantages"]


def rewards_to_go(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """``G_t = Σ_{s≥t} r_s`` (undiscounted), float64."""
    r = np.asarray(rewards, dtype=np.float64)
    return np.cumsum(r[::-1])[::-1].copy()


def observation_key(observation: Any) -> bytes:
    """The default anchor key: a digest of the observation's bytes (mappings by sorted key)."""
    h = hashlib.blake2b(digest_size=16)

    def feed(x: Any) -> None:
        if isinstance(x, Mapping):
            for k in sorted(x):
                h.update(str(k).encode())
                feed(x[k])
        elif isinstance(x, (tuple, list)):
            for v in x:
                feed(v)
        else:
            a = np.ascontiguousarray(x)
            h.update(f"{a.dtype}{a.shape}".encode())
            h.update(a.tobytes())

    feed(observation)
    return h.digest()


def episode_anchors(sa_episode: Any) -> list[Hashable]:
    """The anchor key of each turn of an RLlib ``SingleAgentEpisode``.

    Turn ``t`` starts from observation ``t``: its key is the scenario's own
    (``infos[t]["anchor"]``, written by ``GroupedEnv`` from ``Scenario.anchor_key``) or else
    :func:`observation_key` of the observation.
    """
    keys: list[Hashable] = []
    for t in range(len(sa_episode)):
        info = sa_episode.get_infos(t)
        own = info.get(ANCHOR_INFO) if isinstance(info, Mapping) else None
        keys.append(
            ("key", own) if own is not None else observation_key(sa_episode.get_observations(t))
        )
    return keys


def turn_advantages(
    step_rewards: Sequence[Sequence[float] | np.ndarray],
    groups: Sequence[int] | np.ndarray,
    episode_adv: Sequence[float] | np.ndarray,
    episode_keep: Sequence[bool] | np.ndarray,
    config: GRPOLoss,
    anchors: Sequence[Sequence[Hashable]] | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Per-turn ``(advantage, keep)``, concatenated in episode order, and statistics.

    Args:
        step_rewards: per agent episode, the reward after each of its turns.
        groups: per agent episode, its GRPO group id.
        episode_adv: per agent episode, ``A_i`` (0 for dropped groups).
        episode_keep: per agent episode, the dynamic-sampling keep flag.
        config: ``turn_credit``, ``step_weight``, ``scale_std``, ``adv_eps``,
            ``dynamic_sampling`` and ``dynamic_sampling_tol`` are read.
        anchors: per agent episode, one hashable anchor key per turn (``step_groups`` only).

    Returns:
        float32 advantages and bool keep flags, one per turn; statistics (``step_groups``:
        ``anchor_hit_rate`` — share of turns whose step group has ≥ 2 members —,
        ``step_groups``, ``step_group_size_mean``, ``step_adv_abs_mean``).
    """
    lens = [len(r) for r in step_rewards]
    adv = np.repeat(np.asarray(episode_adv, dtype=np.float64), lens)
    keep = np.repeat(np.asarray(episode_keep, dtype=bool), lens)
    mode = config.turn_credit
    if mode == "episode" or not lens:
        return adv.astype(np.float32), keep, {}
    rewards = [np.asarray(r, dtype=np.float64) for r in step_rewards]
    if mode == "reward_to_go":
        return _reward_to_go(rewards, np.asarray(groups), adv, keep, config)
    if anchors is None or [len(a) for a in anchors] != lens:
        raise ValueError("turn_credit 'step_groups' needs one anchor key per turn")
    return _step_groups(rewards, np.asarray(groups), anchors, adv, keep, config)


def _reward_to_go(
    rewards: list[np.ndarray],
    groups: np.ndarray,
    adv: np.ndarray,
    keep: np.ndarray,
    config: GRPOLoss,
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    returns = torch.tensor([r.sum() for r in rewards], dtype=torch.float64)
    _, std = group_moments(returns, torch.as_tensor(groups))
    std = std.double().numpy()
    scale = std + config.adv_eps if config.scale_std else np.ones_like(std)
    before = np.concatenate([np.cumsum(r) - r for r in rewards])  # Σ_{s<t} r_s
    lens = [len(r) for r in rewards]
    per_turn_scale = np.repeat(scale, lens)
    term = np.where(np.repeat(std, lens) > 0, before / per_turn_scale, 0.0)
    out = (adv - term) * keep
    return out.astype(np.float32), keep, {"turn_adv_abs_mean": float(np.abs(out).mean())}


def _step_groups(
    rewards: list[np.ndarray],
    groups: np.ndarray,
    anchors: Sequence[Sequence[Hashable]],
    adv: np.ndarray,
    keep: np.ndarray,
    config: GRPOLoss,
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    ids: dict[tuple[Any, Hashable], int] = {}
    step = np.array(
        [
            ids.setdefault((int(g), k), len(ids))
            for g, keys in zip(groups, anchors, strict=True)
            for k in keys
        ],
        dtype=np.int64,
    )
    togo = torch.as_tensor(np.concatenate([rewards_to_go(r) for r in rewards]))
    step_t = torch.as_tensor(step)
    s_adv = group_advantages(togo, step_t, scale_std=config.scale_std, eps=config.adv_eps)
    s_adv = s_adv.double().numpy()
    if config.dynamic_sampling:
        s_keep = dynamic_sampling_mask(togo, step_t, config.dynamic_sampling_tol).numpy()
        s_adv = s_adv * s_keep
        keep = keep | s_keep
    out = (adv + config.step_weight * s_adv) * keep
    sizes = np.bincount(step)
    hit = sizes[step] >= 2
    stats = {
        "anchor_hit_rate": float(hit.mean()),
        "step_groups": float((sizes >= 2).sum()),
        "step_group_size_mean": float(sizes[sizes >= 2].mean()) if (sizes >= 2).any() else 0.0,
        "step_adv_abs_mean": float(np.abs(s_adv[hit]).mean()) if hit.any() else 0.0,
        "turn_adv_abs_mean": float(np.abs(out).mean()),
    }
    return out.astype(np.float32), keep, stats
