"""The centralised critic's input column, built on the learner (``algorithm.critic``).

Contract:

* :class:`CriticInputs` is a learner connector piece placed right before GAE
  (:func:`install`, called by :class:`~trainers.learners.value_norm_learner.
  ValueNormPPOLearner`'s ``build``; the lean learner's array batch calls :meth:`CriticInputs.
  fill` at the same point). For every module in the batch whose model config has
  ``critic_dim > 0`` it writes the column :data:`~marl_agents.critics.CRITIC_OBS`, one row per
  batch row, from each single-agent episode: row ``k`` holds the global state the env reported
  with observation ``k`` (``infos[k][STATE_INFO]``, :mod:`scenarios.global_state`), and for
  ``state_obs`` also that observation (flattened) and the agent's one-hot index among the
  team's agents. Rows are the episode's ``n + 1`` observations — the ``n`` it acted on and the
  last, whose value bootstraps a cut episode (the extra step RLlib adds before GAE repeats
  it) — in the batch's episode order; recurrent modules get them zero-padded to
  ``[B, T, D]`` as the other columns.
* Env runners never see the column: it exists only in learner batches; actors read only
  ``obs``. Modules without a centralised critic (``local``, scripted, checkpoint pools) get
  nothing.
* An episode whose infos lack the state raises :class:`ValueError` naming the agent and the
  fix (the env does not report the global state).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.utils.postprocessing.zero_padding import split_and_zero_pad_n_episodes
from typing_extensions import override

from marl_agents.action_mask import own_part
from marl_agents.critics import CRITIC_OBS
from scenarios.global_state import STATE_INFO

__all__ = ["AGENTS_KEY", "CRITIC_KEY", "CriticInputs", "install"]

#: ``learner_config_dict`` keys: the critic input kind and the team's agents (one-hot order)
CRITIC_KEY = "critic"
AGENTS_KEY = "critic_agents"


class CriticInputs(ConnectorV2):
    """Adds :data:`~marl_agents.critics.CRITIC_OBS` per centralised-critic module (module doc).

    Args:
        kind: ``state`` or ``state_obs``.
        agents: the team's agent ids (the one-hot order of ``state_obs``).
    """

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        kind: str,
        agents: Sequence[str],
    ) -> None:
        super().__init__(input_observation_space, input_action_space)
        self.kind = kind
        self.agents = {a: i for i, a in enumerate(agents)}

    @override
    def __call__(
        self, *, rl_module: Any, batch: dict[str, Any], episodes: list[Any], **kwargs: Any
    ) -> Any:
        # after RLlib's one-step extension: an episode's rows are its (extended) length
        sa = self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False)
        self.fill(batch, rl_module, [(e, len(e)) for e in sa])
        return batch

    def fill(self, batch: dict[str, Any], rl_module: Any, rows: list[tuple[Any, int]]) -> None:
        """Write the column into ``batch`` for ``rows``: each single-agent episode, in the
        batch's order, with its number of batch rows."""
        for module_id, cols in batch.items():
            module = rl_module[module_id].unwrapped() if module_id in rl_module else None
            if module is None or not module.model_config.get("critic_dim"):
                continue
            mine = [(e, n) for e, n in rows if e.module_id in (None, module_id)]
            features = np.concatenate([self.features(e, n) for e, n in mine])
            if module.is_stateful():
                seq = module.model_config["max_seq_len"]
                lens = [n for _, n in mine]
                features = np.stack(
                    split_and_zero_pad_n_episodes(features, episode_lens=lens, max_seq_len=seq)
                )
            device = cols[Columns.OBS].device
            cols[CRITIC_OBS] = torch.from_numpy(features).to(device)

    def features(self, episode: Any, n: int) -> np.ndarray:
        """The critic rows of the first ``n`` observations of a single-agent episode."""
        infos = episode.get_infos(slice(0, n))
        try:
            state = np.stack([np.asarray(i[STATE_INFO], np.float32) for i in infos])
        except (KeyError, TypeError):
            raise ValueError(
                f"agent {episode.agent_id!r}: the env reported no global state "
                f"(infos[{STATE_INFO!r}]) with its observations, which algorithm.critic="
                f"{self.kind!r} needs: the scenario must declare state_space/global_state "
                "(scenarios.global_state), or use algorithm.critic: local"
            ) from None
        if self.kind == "state":
            return state
        # of a masked observation, the part the networks read (the width obs_dim counts)
        obs = np.asarray(own_part(episode.get_observations(slice(0, n))), np.float32)
        obs = obs.reshape(n, -1)
        onehot = np.zeros((n, len(self.agents)), np.float32)
        onehot[:, self.agents[episode.agent_id]] = 1.0
        return np.concatenate([state, obs, onehot], axis=1)


def install(pipeline: Any, config: Mapping[str, Any], gae_type: type) -> None:
    """Insert :class:`CriticInputs` before the GAE piece (of type ``gae_type``) of a learner
    pipeline when ``config`` (the ``learner_config_dict``) asks for a centralised critic."""
    kind = config.get(CRITIC_KEY, "local")
    if kind == "local" or pipeline is None:
        return
    piece = CriticInputs(kind=kind, agents=list(config[AGENTS_KEY]))
    pipeline.insert_before(gae_type, piece)
