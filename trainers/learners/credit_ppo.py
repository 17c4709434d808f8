"""Per-agent advantage normalisation after GAE, for credit with parameter sharing.

GAE standardises advantages per *module*; with ``credit.normalize`` they are standardised per
*agent* too. A learner connector cannot add a piece after GAE, so
:class:`CreditPPOTorchLearner` (a
:class:`~trainers.learners.value_norm_learner.ValueNormPPOLearner`)
inserts :class:`PerAgentAdvantageNormalization` right after the GAE piece in ``build()``
whenever its pipeline holds a :class:`~trainers.credit.connector.CreditConnector` whose credit
config has ``normalize=True``; otherwise it is a plain ``PPOTorchLearner`` (with value-target
normalisation when the config asks for it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.postprocessing.zero_padding import split_and_zero_pad_n_episodes

from trainers.credit.connector import CreditConnector
from trainers.learners.value_norm_learner import ValueNormPPOLearner, find_gae

__all__ = ["CreditPPOTorchLearner", "PerAgentAdvantageNormalization"]


class PerAgentAdvantageNormalization(ConnectorV2):
    """Standardise advantages per agent within each module's batch (place it after GAE).

    GAE standardises advantages per module; with parameter sharing several agents feed one
    module, and an agent whose credits are large would dominate its module's update. This piece
    recovers each row's agent from the episodes (in the order GAE uses) and rescales each
    agent's advantages to zero mean and unit standard deviation over its valid (loss-mask)
    timesteps. With one agent per module it changes nothing that matters.
    """

    def __call__(
        self, *, rl_module: Any, batch: dict[str, Any], episodes: list[Any], **kwargs: Any
    ) -> Any:
        sa_episodes = list(
            self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False)
        )
        for module_id, module_batch in batch.items():
            if Postprocessing.ADVANTAGES not in module_batch:
                continue
            mine = [e for e in sa_episodes if e.module_id in (None, module_id)]
            ids = _agent_rows(rl_module[module_id], mine)
            adv = module_batch[Postprocessing.ADVANTAGES]
            if tuple(ids.shape) != tuple(adv.shape):
                raise RuntimeError(
                    f"per-agent normalisation: module {module_id!r} has advantages of shape "
                    f"{tuple(adv.shape)} but its episodes give {tuple(ids.shape)} rows; place "
                    "PerAgentAdvantageNormalization directly after GeneralAdvantageEstimation"
                )
            module_batch[Postprocessing.ADVANTAGES] = _standardise_per_agent(
                adv, ids, module_batch.get(Columns.LOSS_MASK)
            )
        return batch


def _agent_rows(module: Any, episodes: list[Any]) -> np.ndarray:
    """Each batch row's agent as an index from 1 (0: padding), in the order GAE uses."""
    agents = sorted({e.agent_id for e in episodes}, key=str)
    index = {a: i + 1 for i, a in enumerate(agents)}
    if not episodes:
        return np.zeros(0, dtype=np.int64)
    ids = np.concatenate([np.full(len(e), index[e.agent_id], dtype=np.int64) for e in episodes])
    if not module.is_stateful():
        return ids
    padded = split_and_zero_pad_n_episodes(
        ids,
        episode_lens=[len(e) for e in episodes],
        max_seq_len=module.model_config["max_seq_len"],
    )
    return np.stack(padded, axis=0)


def _standardise_per_agent(adv: Any, ids: np.ndarray, mask: Any) -> Any:
    """``adv`` with each agent's rows at zero mean and unit std over its valid rows."""
    import torch

    ids_t = torch.as_tensor(ids, device=adv.device)
    valid = (
        torch.ones_like(ids_t, dtype=torch.bool)
        if mask is None
        else torch.as_tensor(mask, device=adv.device).bool()
    )
    out = adv.clone()
    for i in torch.unique(ids_t[ids_t > 0]).tolist():
        rows = ids_t == i
        pick = rows & valid
        if not bool(pick.any()):
            continue
        sel = adv[pick]
        std = sel.std(unbiased=False) if sel.numel() > 1 else sel.new_tensor(0.0)
        out[rows] = (adv[rows] - sel.mean()) / torch.clamp(std, min=1e-4)
    return out


class CreditPPOTorchLearner(ValueNormPPOLearner):
    """``PPOTorchLearner`` that adds per-agent advantage normalisation after GAE when asked.

    In ``build()`` it looks for a :class:`CreditConnector` with ``normalize=True`` in its
    learner pipeline and, if there is one, inserts :class:`PerAgentAdvantageNormalization`
    right after the GAE piece (RLlib's ``GeneralAdvantageEstimation``, or
    :class:`~trainers.learners.value_norm_learner.ValueNormGAE` with value normalisation, which
    :class:`~trainers.learners.value_norm_learner.ValueNormPPOLearner` sets up first). Otherwise it
    is
    a plain ``PPOTorchLearner`` (with value normalisation when the config asks for it), so it
    is safe to set it whenever credit is on:
    ``config.learners(learner_class=CreditPPOTorchLearner)``.
    """

    def build(self) -> None:
        super().build()
        pipeline = self._learner_connector
        if pipeline is None:
            return
        pieces = list(pipeline.connectors)
        wants = any(isinstance(p, CreditConnector) and p.credit.normalize for p in pieces)
        has = any(isinstance(p, PerAgentAdvantageNormalization) for p in pieces)
        if wants and not has:
            gae = find_gae(pipeline)
            if gae is not None:
                pipeline.insert_after(type(gae), PerAgentAdvantageNormalization())
            else:
                pipeline.append(PerAgentAdvantageNormalization())
