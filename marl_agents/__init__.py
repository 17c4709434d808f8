"""Policies: torch RLModules, scripted and frozen agents, LLM backends, agent pools.

Names load on first use (:mod:`topologies.lazy`): ``import marl_agents`` loads neither torch
nor Ray.

Example:
    >>> from marl_agents.pools import ScriptedModel
    >>> ScriptedModel(policy="delegate.scripted_worker").frozen
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topologies.lazy import export_lazily

if TYPE_CHECKING:  # the exports (topologies.lazy): loaded on first use
    from marl_agents.modules import GRUModule as GRUModule
    from marl_agents.modules import MessagePassingModule as MessagePassingModule
    from marl_agents.modules import module_spec as module_spec
    from marl_agents.pools import AgentPool as AgentPool
    from marl_agents.pools import CheckpointModel as CheckpointModel
    from marl_agents.pools import GRUModel as GRUModel
    from marl_agents.pools import LLMModel as LLMModel
    from marl_agents.pools import MLPModel as MLPModel
    from marl_agents.pools import ModelConfig as ModelConfig
    from marl_agents.pools import MPNNModel as MPNNModel
    from marl_agents.pools import PoolConfig as PoolConfig
    from marl_agents.pools import PoolError as PoolError
    from marl_agents.pools import ScriptedModel as ScriptedModel
    from marl_agents.pools import resolve_pools as resolve_pools
    from marl_agents.scripted import ScriptedModule as ScriptedModule
    from marl_agents.scripted import get_scripted as get_scripted
    from marl_agents.scripted import list_scripted as list_scripted
    from marl_agents.scripted import register_scripted as register_scripted

__all__ = export_lazily(__name__)
