"""Dec-POMDP scenarios executed from LangGraph graphs."""

from scenarios.base import Outcome, Scenario, ScenarioError
from scenarios.engine import decide, emit_reward

__all__ = ["Outcome", "Scenario", "ScenarioError", "decide", "emit_reward"]
