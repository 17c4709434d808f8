"""Dec-POMDP scenarios executed from LangGraph graphs.

Names load on first use (:mod:`topologies.lazy`): ``import scenarios`` does not load LangGraph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topologies.lazy import export_lazily

if TYPE_CHECKING:  # the exports (topologies.lazy): loaded on first use
    from scenarios.base import Outcome as Outcome
    from scenarios.base import Scenario as Scenario
    from scenarios.base import ScenarioError as ScenarioError
    from scenarios.decisions import decide as decide
    from scenarios.decisions import emit_reward as emit_reward
    from scenarios.decisions import emit_state as emit_state
    from scenarios.decisions import leave as leave
    from scenarios.decisions import run_inline as run_inline
    from scenarios.graph_env import GraphEnv as GraphEnv
    from scenarios.graph_env import TraceStep as TraceStep
    from scenarios.registry import build as build
    from scenarios.registry import list_scenarios as list_scenarios
    from scenarios.registry import make as make
    from scenarios.registry import register as register

__all__ = export_lazily(__name__)
