"""How live episodes run (``GraphEnv(engine=...)``, ``episodes.engine``): the values, the
environment variable that overrides the default, and the default wall-clock limit. A module
of its own so that reading a config does not import LangGraph.
"""

from __future__ import annotations

#: ``auto`` steps the graph with the fast path where it compiles for it (else LangGraph's
#: runner), ``langgraph`` always uses LangGraph's runner, ``fast`` the fast path or an error
#: naming why not, ``check`` both, compared at every step (slow, for tests)
ENGINES = ("auto", "langgraph", "fast", "check")
#: the environment variable that sets the default engine of every ``GraphEnv``
ENGINE_ENV = "MARL_ENGINE"

#: default wall-clock seconds the graph may run in one episode (``None`` turns the limit off)
DEFAULT_EPISODE_TIMEOUT_S: float | None = 300.0

__all__ = ["DEFAULT_EPISODE_TIMEOUT_S", "ENGINES", "ENGINE_ENV"]
