"""Policies: torch RLModules, scripted and frozen agents, LLM backends, agent pools.

Names are imported lazily: ``import marl_agents`` loads neither torch nor Ray.

Example:
    >>> from marl_agents import ModelConfig
    >>> ModelConfig(type="scripted", policy="delegate.scripted_worker").frozen
    True
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AgentPool": "marl_agents.pools",
    "ModelConfig": "marl_agents.pools",
    "PoolConfig": "marl_agents.pools",
    "PoolError": "marl_agents.pools",
    "resolve_pools": "marl_agents.pools",
    "ScriptedModule": "marl_agents.scripted",
    "get_scripted": "marl_agents.scripted",
    "list_scripted": "marl_agents.scripted",
    "register_scripted": "marl_agents.scripted",
    "GRUModule": "marl_agents.modules",
    "MessagePassingModule": "marl_agents.modules",
    "module_spec": "marl_agents.modules",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'marl_agents' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
