"""The call's decoding settings into RLlib's forward batch (``episodes.sampler: rllib``).

A chat-model call's observation carries its constraint and stop strings
(:func:`marl_agents.llm.constraints.with_constraint`); RLlib's env-to-module pipeline stacks
observations into a plain array, which drops them. :class:`AddConstraintKeys`, placed before
RLlib's default pieces, reads each acting agent's latest observation off its episode (the
object the env returned: episodes hold observations as given while sampling) and adds its
:func:`~marl_agents.llm.constraints.call_key` as the :data:`~marl_agents.llm.rl_module.
CONSTRAINT_KEY` column, batched per module like the observations; ``CausalLMModule`` samples
each row under its own constraint and ends it at its own stop strings. The batched sampler
adds the same column itself (``trainers.sampling.batched_runner``).

Example:
    >>> pieces = constraint_keys_connector(None)
    >>> type(pieces[0]).__name__
    'AddConstraintKeys'
"""

from __future__ import annotations

from typing import Any

from ray.rllib.connectors.connector_v2 import ConnectorV2

from marl_agents.llm.constraints import call_key, call_of
from marl_agents.llm.rl_module import CONSTRAINT_KEY


class AddConstraintKeys(ConnectorV2):
    """Env-to-module piece: each acting agent's :data:`CONSTRAINT_KEY` (its call's settings;
    ``0``: a free call)."""

    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[str, Any],
        episodes: list[Any],
        explore: bool | None = None,
        shared_data: dict | None = None,
        **kwargs: Any,
    ) -> Any:
        for sa_episode in self.single_agent_episode_iterator(
            episodes, agents_that_stepped_only=True
        ):
            observation = sa_episode.get_observations(-1)
            self.add_batch_item(
                batch,
                CONSTRAINT_KEY,
                item_to_add=call_key(call_of(observation)),
                single_agent_episode=sa_episode,
            )
        return batch


def constraint_keys_connector(
    env: Any = None, spaces: Any = None, device: Any = None
) -> list[ConnectorV2]:
    """``config.env_runners(env_to_module_connector=...)`` for LLM pools sampled by RLlib's
    own env runner: ``[AddConstraintKeys()]`` (RLlib's default pieces follow)."""
    return [AddConstraintKeys()]


__all__ = ["AddConstraintKeys", "constraint_keys_connector"]
