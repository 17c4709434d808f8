"""Dec-POMDP scenarios executed from LangGraph graphs."""

from scenarios.base import Outcome, Scenario, ScenarioError
from scenarios.engine import GraphEnv, TraceStep, decide, emit_reward, run_inline
from scenarios.registry import build, list_scenarios, make, register

__all__ = [
    "GraphEnv",
    "Outcome",
    "Scenario",
    "ScenarioError",
    "TraceStep",
    "build",
    "decide",
    "emit_reward",
    "list_scenarios",
    "make",
    "register",
    "run_inline",
]
