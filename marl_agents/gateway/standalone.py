"""A team's policies served outside any episode: what ``marl serve`` answers with.

:class:`ServedTeam` stands where an app episode stands in the gateway's registry (its key,
its model names, :meth:`ServedTeam.ask`), but no episode runs: each request is answered on
the server thread that read it. The agent's own
:class:`~marl_agents.llm.env_chat_model.EnvChatModel` (the one its scenario hands its app) is
called inside a LangChain runnable whose run config carries an
:class:`~scenarios.decisions.InlineBridge`: the chat model renders the messages with the chat
template, asks ``decide(agent, observation)`` as in an episode, and the bridge answers with
``policy(agent, observation)`` in place — the pool's module sampling the reply. So a served
reply goes through exactly the rendering and parsing path of an episode's (prompt ids, tool
calls, constrained decoding for ``tools`` / ``response_format``, ``prefill``). Requests are
rendered and parsed one at a time (a lock: tokenizers are not thread-safe), but the lock is
released while a request waits for its policy's decision, so concurrent requests wait
together (and a prompt is bounded in characters before it is rendered,
:mod:`marl_agents.gateway.prompt_bound`: no request holds the lock for long) and a batching
policy (``marl serve``'s: one ``generate`` per pool for the requests
waiting, :func:`trainers.serve.module_policy`) samples them in one batch.

Assistant turns sent back are re-tokenised (there is no episode to keep their sampled ids).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Mapping
from typing import Any

from marl_agents.gateway.protocol import ChatRequest, Reply
from marl_agents.gateway.replies import answer, unknown_model


class ServedTeam:
    """A team's agents answering requests directly (no episode).

    Args:
        chat_models: agent id → its ``EnvChatModel`` (a ``ChatAppScenario``'s ``models``).
        policy: ``(agent, observation) → action``: the agent's policy on its prompt ids.
        model_names: agent id → the model name clients send (default: the ids).
        key: the API key (default: a new random one, :attr:`key`).
        truncate_prompts: keep a too-long prompt's last tokens; default: refuse it (400).
    """

    def __init__(
        self,
        chat_models: Mapping[str, Any],
        policy: Callable[[str, Any], Any],
        model_names: Mapping[str, str] | None = None,
        key: str | None = None,
        truncate_prompts: bool = False,
    ) -> None:
        names = {a: a for a in chat_models}
        names.update({a: str(n) for a, n in (model_names or {}).items() if a in chat_models})
        #: model name → agent id
        self.models = {n: a for a, n in names.items()}
        self.chat_models = dict(chat_models)
        self.policy = policy
        self.key = key or secrets.token_urlsafe(24)
        self.truncate_prompts = bool(truncate_prompts)
        self.requests = 0
        self._lock = threading.Lock()

    def ask(self, request: ChatRequest) -> Reply:
        """Answer ``request`` here (any thread)."""
        from langchain_core.runnables import RunnableLambda

        from marl_agents.llm.chat_model import GenerationRecorder
        from scenarios.bridge import BRIDGE_KEY
        from scenarios.decisions import InlineBridge

        agent = self.models.get(request.model)
        if agent is None:
            raise unknown_model(request.model, self.models, "this served run")
        update = {"record": True, "recorder": GenerationRecorder()}
        model = self.chat_models[agent].model_copy(update=update)

        def call(_: Any) -> Reply:
            return answer(model, agent, request, truncate_prompts=self.truncate_prompts)[0]

        with self._lock:
            self.requests += 1
            bridge = InlineBridge(self._decide)
            return RunnableLambda(call).invoke(None, config={"configurable": {BRIDGE_KEY: bridge}})

    def _decide(self, agent: str, observation: Any) -> Any:
        """The policy's decision, the lock released meanwhile (called holding it)."""
        self._lock.release()
        try:
            return self.policy(agent, observation)
        finally:
            self._lock.acquire()


__all__ = ["ServedTeam"]
