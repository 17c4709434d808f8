"""How live episodes run (``GraphEnv(engine=...)``, ``episodes.engine``): the values and the
environment variable that overrides the default. A module of its own so that reading a config
does not import LangGraph.
"""

from __future__ import annotations

#: ``auto`` steps the graph with the fast path where it compiles for it (else LangGraph's
#: runner), ``langgraph`` always uses LangGraph's runner, ``fast`` the fast path or an error
#: naming why not, ``check`` both, compared at every step (slow, for tests)
ENGINES = ("auto", "langgraph", "fast", "check")
#: the environment variable that sets the default engine of every ``GraphEnv``
ENGINE_ENV = "MARL_ENGINE"

__all__ = ["ENGINES", "ENGINE_ENV"]
