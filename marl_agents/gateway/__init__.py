"""An OpenAI-compatible endpoint for the agents of running episodes, and apps trained through it.

Any app that talks to an OpenAI-compatible endpoint — written with the ``openai`` SDK,
LangChain's ``ChatOpenAI``, another framework, or run as its own program — trains unchanged:
each episode gives the app a base URL, its own key and each agent's model name, and every
request is one decision of that agent (its own policy, frozen or trained).

* :class:`AppScenario` (:mod:`~marl_agents.gateway.app_scenario`) — the app as a scenario:
  ``run(task, llm)`` or a command per episode, tasks, a verifier.
* :func:`gateway` / :class:`Gateway` (:mod:`~marl_agents.gateway.server`) — the process's
  HTTP server (loopback by default).
* :class:`GatewayError` (:mod:`~marl_agents.gateway.protocol`) — OpenAI-style errors.
* :class:`ServedTeam` (:mod:`~marl_agents.gateway.standalone`) — a team's policies answering
  requests outside any episode (what ``marl serve`` runs, :mod:`trainers.serve`).

Names load on first use (:mod:`topologies.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topologies.lazy import export_lazily

if TYPE_CHECKING:  # the exports (topologies.lazy): loaded on first use
    from marl_agents.gateway.app_scenario import AppLLM as AppLLM
    from marl_agents.gateway.app_scenario import AppScenario as AppScenario
    from marl_agents.gateway.protocol import GatewayError as GatewayError
    from marl_agents.gateway.server import Gateway as Gateway
    from marl_agents.gateway.server import gateway as gateway
    from marl_agents.gateway.standalone import ServedTeam as ServedTeam

__all__ = export_lazily(__name__)
