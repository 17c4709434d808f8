"""PPO's learner batch built with array ops (the lean learner's connector pipeline).

Contract:

* :func:`install` gives an :class:`ArrayPPOPipeline` (a ``LearnerConnectorPipeline`` with
  the same pieces, which the learner then uses) for a PPO pipeline of RLlib's default shape —
  ``AddOneTsToEpisodesAndTruncate``, credit pieces (:class:`~trainers.credit.connector.
  CreditConnector`), RLlib's default batch pieces (``AddObservationsFromEpisodesToBatch`` …
  ``NumpyToTensor``), optionally the centralised critic's input piece
  (:class:`~trainers.learners.critic_input.CriticInputs`), ``GeneralAdvantageEstimation`` (or
  its value-normalising
  :class:`~trainers.learners.value_norm_learner.ValueNormGAE`), optionally
  :class:`~trainers.learners.credit_ppo.PerAgentAdvantageNormalization`; None for any other.
* :class:`ArrayPPOPipeline` gives the batch its pieces give (same modules in the same order,
  same columns, rows, dtypes and values; advantages and value targets by the function the GAE
  pieces use, :func:`~trainers.learners.value_norm_learner.advantages_and_targets`) from each agent
  episode's arrays: per module one ``np.concatenate`` and one gather per column instead of
  per-episode batch items. Covered: ``MultiAgentEpisode``s after
  ``to_numpy()`` whose buffers hold plain arrays, each agent episode at least one step long,
  non-recurrent modules, an empty incoming batch, the pipeline still of that shape. Anything
  else runs the pieces as RLlib's pipeline does (``fallbacks`` counts those calls).
* Episodes: ids are renamed as RLlib's pieces rename them; credit pieces see the episodes
  before the one-step extension (they read infos and rewards up to the outcome, which the
  extension does not move); the extension itself (``add_one_ts_to_episodes_and_truncate``)
  is applied only when a piece after GAE reads the episodes. The learner reads nothing else
  from them.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
from ray.rllib.connectors.common import (
    AddObservationsFromEpisodesToBatch,
    AddStatesFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    AgentToModuleMapping,
    BatchIndividualItems,
    NumpyToTensor,
)
from ray.rllib.connectors.learner import (
    AddColumnsFromEpisodesToTrainBatch,
    AddOneTsToEpisodesAndTruncate,
    GeneralAdvantageEstimation,
)
from ray.rllib.connectors.learner.learner_connector_pipeline import LearnerConnectorPipeline
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    CONNECTOR_PIPELINE_TIMER,
    CONNECTOR_TIMERS,
    LEARNER_CONNECTOR,
    LEARNER_CONNECTOR_SUM_EPISODES_LENGTH_IN,
    LEARNER_CONNECTOR_SUM_EPISODES_LENGTH_OUT,
    TIMERS,
)
from ray.rllib.utils.metrics.utils import to_snake_case
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.postprocessing.episodes import add_one_ts_to_episodes_and_truncate

from trainers.credit.connector import CreditConnector
from trainers.learners.credit_ppo import PerAgentAdvantageNormalization
from trainers.learners.critic_input import CriticInputs
from trainers.learners.value_norm_learner import ValueNormGAE, advantages_and_targets
from trainers.rllib_compat.learner import rl_modules

__all__ = ["ArrayPPOPipeline", "install"]

#: RLlib's default batch pieces, in their pipeline order.
DEFAULT_PIECES = (
    AddObservationsFromEpisodesToBatch,
    AddColumnsFromEpisodesToTrainBatch,
    AddTimeDimToBatchAndZeroPad,
    AddStatesFromEpisodesToBatch,
    AgentToModuleMapping,
    BatchIndividualItems,
    NumpyToTensor,
)
#: pieces that may sit between the one-step extension and the default pieces (they rewrite
#: rewards of finished episodes) and after GAE (they read the extended episodes).
BEFORE = (CreditConnector,)
AFTER = (PerAgentAdvantageNormalization,)
#: the GAE pieces: RLlib's, or the one with value normalisation
#: (trainers.learners.value_norm_learner)
GAE_PIECES = (GeneralAdvantageEstimation, ValueNormGAE)


def install(pipeline: Any) -> ArrayPPOPipeline | None:
    """An :class:`ArrayPPOPipeline` with ``pipeline``'s pieces when they have RLlib's default
    PPO shape (see the module docstring), else None (keep ``pipeline``)."""
    if pipeline is None or _split(list(pipeline.connectors)) is None:
        return None
    return ArrayPPOPipeline(
        pipeline.input_observation_space,
        pipeline.input_action_space,
        connectors=list(pipeline.connectors),
    )


def _split(pieces: list[Any]) -> tuple[list[Any], list[Any], Any, Any, list[Any]] | None:
    """``(credit pieces, pieces after GAE, NumpyToTensor, GAE, critic input piece or none)``
    of a pipeline of RLlib's default PPO shape, else None."""
    n = len(DEFAULT_PIECES)
    start = next((i for i, p in enumerate(pieces) if type(p) is DEFAULT_PIECES[0]), None)
    if start is None:
        return None
    before, default, rest = pieces[:start], pieces[start : start + n], pieces[start + n :]
    critic = rest[:1] if rest and type(rest[0]) is CriticInputs else []
    gae, after = rest[len(critic) : len(critic) + 1], rest[len(critic) + 1 :]
    shape_ok = (
        before
        and type(before[0]) is AddOneTsToEpisodesAndTruncate
        and all(type(p) in BEFORE for p in before[1:])
        and [type(p) for p in default] == list(DEFAULT_PIECES)
        and len(gae) == 1
        and type(gae[0]) in GAE_PIECES
        and all(type(p) in AFTER for p in after)
    )
    return (before[1:], after, default[-1], gae[0], critic) if shape_ok else None


class ArrayPPOPipeline(LearnerConnectorPipeline):
    """RLlib's PPO learner pipeline, its pieces kept as they are, that builds the batch from
    episode arrays where it covers the call (see the module docstring) and runs the pieces
    otherwise (``fallbacks`` counts those calls). Metrics as the pipeline logs them: episode
    lengths in and out, the pipeline timer, and per-piece timers of the credit pieces and the
    pieces after GAE (the batch pieces and GAE log none on the array path)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fallbacks = 0

    @override(LearnerConnectorPipeline)
    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[str, Any] | None = None,
        episodes: list[Any],
        explore: bool = False,
        shared_data: dict[str, Any] | None = None,
        metrics: Any = None,
        **kwargs: Any,
    ) -> Any:
        call = {"rl_module": rl_module, "explore": explore, "shared_data": shared_data}
        call.update(metrics=metrics, **kwargs)
        parts = _split(self.connectors)  # pieces may have been added since
        agent_eps = None if parts is None else _covered(rl_module, batch, episodes)
        if parts is None or agent_eps is None:
            self.fallbacks += 1
            return super().__call__(batch=batch, episodes=episodes, **call)
        call["shared_data"] = shared_data if shared_data is not None else {}
        lengths = (ALL_MODULES, LEARNER_CONNECTOR_SUM_EPISODES_LENGTH_IN)
        if metrics:
            metrics.log_value(lengths, sum(map(len, episodes)))
        timer = (ALL_MODULES, LEARNER_CONNECTOR, CONNECTOR_PIPELINE_TIMER)
        with metrics.log_time(timer) if metrics else contextlib.nullcontext():
            batch = self._arrays(parts, agent_eps, episodes, call)
        if metrics:
            lengths = (ALL_MODULES, LEARNER_CONNECTOR_SUM_EPISODES_LENGTH_OUT)
            metrics.log_value(lengths, sum(map(len, episodes)))
        return batch

    def _arrays(
        self,
        parts: tuple[list[Any], list[Any], Any, Any, list[Any]],
        agent_eps: list[Any],
        episodes: list[Any],
        call: dict[str, Any],
    ) -> dict[str, Any]:
        """The covered call: what the pieces would do, with array ops."""
        credit, after, to_tensor, gae, critic = parts
        _rename(episodes, agent_eps)
        ends = [(len(sa), bool(sa.is_terminated), bool(sa.is_truncated or not sa.is_done))
                for sa in agent_eps]  # fmt: skip
        call["shared_data"]["_added_loss_mask_for_valid_episode_ts"] = True
        batch = _run(credit, {}, episodes, call)  # rewrites rewards in place
        columns, lens = _columns(agent_eps, ends)
        batch = to_tensor(batch=columns, episodes=episodes, **call)
        for piece in critic:  # the critic column: each episode's n + 1 observations
            piece.fill(
                batch,
                call["rl_module"],
                [(sa, n + 1) for sa, (n, _, _) in zip(agent_eps, ends, strict=True)],
            )
        _advantages(gae, to_tensor, batch, lens, episodes, call)
        if after:
            for sa in agent_eps:
                add_one_ts_to_episodes_and_truncate([sa])
            batch = _run(after, batch, episodes, call)
        return batch


def _advantages(
    gae: Any,
    to_tensor: Any,
    batch: dict[str, Any],
    lens: dict[str, list[int]],
    episodes: list[Any],
    call: dict[str, Any],
) -> None:
    """The GAE piece's columns: the same value forward, targets, normalisation (of advantages,
    and of value targets with :class:`~trainers.learners.value_norm_learner.ValueNormGAE`), over
    each
    module's concatenated (extended) episodes."""
    out: dict[str, dict[str, np.ndarray]] = {}
    normed = isinstance(gae, ValueNormGAE)
    for mid, module in rl_modules(call["rl_module"]).items():
        if mid not in batch or not isinstance(module, ValueFunctionAPI):
            continue
        cols = batch[mid]
        vf_preds = convert_to_numpy(module.compute_values(cols))
        adv, targets = advantages_and_targets(
            vf_preds,
            convert_to_numpy(cols[Columns.REWARDS]),
            convert_to_numpy(cols[Columns.TERMINATEDS]),
            convert_to_numpy(cols[Columns.TRUNCATEDS]),
            gamma=gae.gamma,
            lambda_=gae.lambda_,
            norm=gae.norm(mid) if normed else None,
            mask=convert_to_numpy(cols[Columns.LOSS_MASK]) if normed else None,
            learn=normed and gae.updates(mid),
        )
        assert targets.shape[0] == sum(lens[mid])
        out[mid] = {Postprocessing.ADVANTAGES: adv, Postprocessing.VALUE_TARGETS: targets}
    for mid, module_batch in to_tensor(batch=out, episodes=episodes, **call).items():
        batch[mid].update(module_batch)


def _run(pieces: list[Any], batch: Any, episodes: list[Any], call: dict[str, Any]) -> Any:
    """Call ``pieces`` in order as ``ConnectorPipelineV2`` does (per-piece timers)."""
    metrics = call.get("metrics")
    for piece in pieces:
        name = to_snake_case(type(piece).__name__)
        key = (ALL_MODULES, LEARNER_CONNECTOR, TIMERS, CONNECTOR_TIMERS, name)
        with metrics.log_time(key) if metrics else contextlib.nullcontext():
            batch = piece(batch=batch, episodes=episodes, data=batch, **call)
    return batch


def _covered(rl_module: Any, batch: Any, episodes: list[Any]) -> list[Any] | None:
    """The agent episodes in RLlib's iteration order when the array path covers the call,
    else None (decided before anything is touched: credit pieces rewrite rewards)."""
    if batch or not episodes or not all(isinstance(e, MultiAgentEpisode) for e in episodes):
        return None
    agent_eps = [e.agent_episodes[a] for e in episodes for a in e.agent_ids]
    stateful: dict[str, bool] = {}
    columns: dict[str, Any] = {}  # per module one layout: its columns concatenate as they are
    for sa in agent_eps:
        mid = sa.module_id
        if mid not in stateful:
            stateful[mid] = mid not in rl_module or rl_module[mid].is_stateful()
        if stateful[mid] or not sa.is_numpy or len(sa) < 1:
            return None
        extras = sa.extra_model_outputs
        bufs = (sa.observations, sa.actions, sa.rewards, *(extras[k] for k in sorted(extras)))
        if not all(type(b.data) is np.ndarray for b in bufs):
            return None
        layout = (sorted(extras), [(b.data.shape[1:], b.data.dtype) for b in bufs])
        if columns.setdefault(mid, layout) != layout:
            return None
    return agent_eps


def _rename(episodes: list[Any], agent_eps: list[Any]) -> None:
    """The id suffixes ``AddOneTsToEpisodesAndTruncate`` gives episode chunks."""
    for i, ma in enumerate(episodes):
        ma.id_ += "_" + str(i)
        for sa in ma.agent_episodes.values():
            sa.multi_agent_episode_id = ma.id_
    for i, sa in enumerate(agent_eps):
        sa.id_ += "_" + str(i)


def _tail(buf: Any, n: int) -> np.ndarray:
    """The ``n`` items of a numpy'd lookback buffer after its lookback."""
    return buf.data[buf.lookback : buf.lookback + n]


def _columns(
    agent_eps: list[Any], ends: list[tuple[int, bool, bool]]
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, list[int]]]:
    """Per module (in order of first appearance) the numpy columns of its agent episodes,
    each extended by one step, and the extended lengths."""
    groups: dict[str, list[int]] = {}
    for i, sa in enumerate(agent_eps):
        groups.setdefault(sa.module_id, []).append(i)
    out, lens = {}, {}
    for mid, members in groups.items():
        eps = [agent_eps[i] for i in members]
        flags = np.array([ends[i] for i in members], dtype=np.int64).reshape(-1, 3)
        out[mid] = _module_columns(eps, flags)
        lens[mid] = (flags[:, 0] + 1).tolist()
    return out, lens


def _module_columns(eps: list[Any], flags: np.ndarray) -> dict[str, np.ndarray]:
    """One module's columns: per agent episode of ``n`` steps its ``n + 1`` observations, its
    ``n`` actions, rewards and extra model outputs followed by a copy of the last one (reward
    0.0: what ``add_one_ts_to_episodes_and_truncate`` appends, same dtype promotion), the loss
    mask (False on the extra row) and terminated/truncated flags on the last real row."""
    n = flags[:, 0]
    ext = n + 1
    ep = np.repeat(np.arange(len(eps)), ext)  # each extended row's episode
    k = np.arange(int(ext.sum())) - np.repeat(np.cumsum(ext) - ext, ext)  # its step
    starts = np.cumsum(n) - n
    last = k == n[ep] - 1
    src = starts[ep] + np.minimum(k, n[ep] - 1)  # the extra row repeats the last one
    cols = {
        Columns.LOSS_MASK: k < n[ep],
        Columns.TERMINATEDS: last & flags[ep, 1].astype(bool),
        Columns.TRUNCATEDS: last & flags[ep, 2].astype(bool),
        Columns.OBS: np.concatenate([_tail(sa.observations, len(sa) + 1) for sa in eps]),
        Columns.ACTIONS: np.concatenate([_tail(sa.actions, len(sa)) for sa in eps])[src],
    }
    rewards = [_tail(sa.rewards, len(sa)) for sa in eps]
    rewards.append(np.asarray(0.0)[np.newaxis])  # the appended reward, at index n.sum()
    cols[Columns.REWARDS] = np.concatenate(rewards)[np.where(k < n[ep], src, int(n.sum()))]
    for key in eps[0].extra_model_outputs:
        if key not in cols and key not in (Columns.STATE_IN, Columns.STATE_OUT):
            data = [_tail(sa.extra_model_outputs[key], len(sa)) for sa in eps]
            cols[key] = np.concatenate(data)[src]
    return cols
