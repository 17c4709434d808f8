"""Episodes behind the gateway: each one's unguessable key, and the queue its node answers.

An app episode (:class:`~marl_agents.gateway.app_scenario.AppScenario`) opens an
:class:`Episode` in the process's :class:`Registry`: the episode's key
(``secrets.token_urlsafe``, 192 bits) is the API key its app is given
(``Authorization: Bearer <key>``; the base URL ``/e/<key>/v1`` is accepted too) and is
removed when the episode ends, so a stale or guessed key is a 401.

**Who answers a request.** A decision (``scenarios.decide``) must be made on the episode's
own thread and greenlet: the bridge suspends that greenlet until the environment brings the
action (``GraphRun.decide`` refuses any other thread). So a request is not answered on the
server thread that read it: the server thread puts it on the episode's queue
(:meth:`Episode.ask`) and waits, and the episode's node, which runs the app in another thread
or process, takes requests off the queue (:meth:`Episode.serve`) and answers each one by
calling the agent's :class:`~marl_agents.llm.env_chat_model.EnvChatModel` — the same object
``ChatAppScenario`` hands to ``build_app`` — with the request's tools, ``tool_choice`` and
``response_format``. Recording, constrained decoding, frozen pools, absent agents' default
replies (loo / Shapley replays) and GRPO thus work as for an in-process app. Requests of one
episode are answered one at a time, in arrival order: each is one decision (one env step).
"""

from __future__ import annotations

import dataclasses
import queue
import secrets
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any, Protocol

from marl_agents.gateway.fidelity import TurnIds
from marl_agents.gateway.protocol import ChatRequest, GatewayError, Reply
from marl_agents.gateway.replies import answer, unknown_model

#: seconds a server thread waits for its decision before answering 504
DECISION_WAIT_S = 3600.0


@dataclasses.dataclass
class _Call:
    agent: str
    request: ChatRequest
    future: Future[Reply]


@dataclasses.dataclass
class _Done:
    result: Any = None
    error: BaseException | None = None


class AppTimedOut(GatewayError):
    """The app ran past its episode's ``timeout_s`` (raised by :meth:`Episode.serve`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 504, "server_error", None, "timeout")


class Episode:
    """One app episode's side of the gateway.

    Args:
        models: model name → agent id (the names the app may put in ``model``).
        truncate_prompts: a prompt longer than the agent's ``max_prompt_tokens`` keeps its last
            tokens (as in-process chat apps do); default: refused with a 400
            ``context_length_exceeded``, as OpenAI does.
        fidelity: an assistant turn sent back that is one of this episode's replies is given
            to the policy as the ids it was sampled as (:mod:`marl_agents.gateway.fidelity`);
            ``False``: re-tokenised from its text, as in-process chat apps do.
    """

    def __init__(
        self,
        models: Mapping[str, str],
        truncate_prompts: bool = False,
        fidelity: bool = True,
    ) -> None:
        self.key = secrets.token_urlsafe(24)
        self.models = dict(models)
        self.truncate_prompts = bool(truncate_prompts)
        #: the sampled ids of this episode's replies (``None``: assistant turns re-tokenised)
        self.turns = TurnIds() if fidelity else None
        self._recorded: dict[str, Any] = {}  # agent → its model, recording this episode's replies
        self._sources: dict[str, Any] = {}  # agent → the chat model it is a copy of
        self.requests = 0
        self._queue: queue.Queue[_Call | _Done] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False

    # ----- server threads --------------------------------------------------------------------
    def agent_of(self, model: str) -> str:
        """The agent a request's ``model`` names (a 404 listing the known names if none)."""
        agent = self.models.get(model)
        if agent is None:
            raise unknown_model(model, self.models)
        return agent

    def ask(self, request: ChatRequest) -> Reply:
        """Hand ``request`` to the episode's node and wait for its reply. Called on a server
        thread."""
        agent = self.agent_of(request.model)
        call = _Call(agent, request, Future())
        with self._lock:
            if self._closed:
                raise _ended()
            self._queue.put(call)
        try:
            return call.future.result(timeout=DECISION_WAIT_S)
        except TimeoutError as exc:
            raise GatewayError(
                f"no decision within {DECISION_WAIT_S:g} s", 504, "server_error", None, "timeout"
            ) from exc

    # ----- the app's runner ------------------------------------------------------------------
    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """The app ended (with ``result``, or failing with ``error``)."""
        self._queue.put(_Done(result, error))

    # ----- the episode's node ----------------------------------------------------------------
    def serve(self, chat_models: Mapping[str, Any], timeout_s: float | None) -> Any:
        """Answer the app's requests here (the node's greenlet) until the app ends; return its
        result, or raise its error.

        Raises:
            AppTimedOut: the app ran ``timeout_s`` seconds in all without ending (the time its
                decisions take, between a request and its reply, does not count).
        """
        waited = 0.0
        while True:
            start = time.monotonic()
            try:
                if timeout_s is None:
                    item = self._queue.get()
                else:
                    item = self._queue.get(timeout=max(timeout_s - waited, 0.0))
            except queue.Empty:
                raise AppTimedOut(
                    f"the app ran longer than timeout_s={timeout_s:g} s without ending "
                    f"(after {self.requests} requests)"
                ) from None
            finally:
                waited += time.monotonic() - start
            if isinstance(item, _Done):
                if item.error is not None:
                    raise item.error
                return item.result
            self._answer(item, chat_models)

    def _answer(self, call: _Call, chat_models: Mapping[str, Any]) -> None:
        self.requests += 1
        model = self._model(call.agent, chat_models)
        try:
            reply, step = answer(
                model,
                call.agent,
                call.request,
                turns=self.turns,
                truncate_prompts=self.truncate_prompts,
            )
        except GatewayError as exc:
            call.future.set_exception(exc)
            return
        except BaseException:  # the episode ends (a timeout, an abort, a bridge error)
            call.future.set_exception(_ended())
            raise
        if self.turns is not None:
            self._remember(model, step, reply.message)
        call.future.set_result(reply)

    def _model(self, agent: str, chat_models: Mapping[str, Any]) -> Any:
        """A copy of ``agent``'s chat model recording this episode's replies (their ids)."""
        model = self._recorded.get(agent)
        if model is None:
            source = chat_models[agent]
            model = _COPIES.take(source)
            if model is None:
                from marl_agents.llm.chat_model import GenerationRecorder

                update = {"record": True, "recorder": GenerationRecorder()}
                model = source.model_copy(update=update)
            self._recorded[agent] = model
            self._sources[agent] = source
        return model

    def _remember(self, model: Any, step: Any, message: Any) -> None:
        """Keep the ids of the reply ``message`` (the call ``step`` recorded) under the text
        the app will send back: the prefill's ids (the prompt's last ones) and the sampled."""
        from marl_agents.llm.backend import stop_ids
        from marl_agents.llm.chat_model import to_chat_dicts
        from marl_agents.llm.stop_strings import text_ids

        assert self.turns is not None
        gen = step.generation
        sampled = list(gen.token_ids)
        if sampled and sampled[-1] in stop_ids(model.tokenizer, model.params):
            sampled.pop()
        head = model.prefill_ids(step.prefill)
        content = to_chat_dicts([message])[0]["content"]
        if content == step.prefill + gen.text:  # else the app sees other text (a completed call)
            # a reply cut at a stop string: its text's ids, not the stop string's
            self.turns.remember(content, head + text_ids(model.tokenizer, gen.text, sampled))

    def close(self) -> None:
        """End the episode: requests still queued, and any later, are answered 401; its
        recording copies go to later episodes (:class:`RecordingCopies`)."""
        with self._lock:
            self._closed = True
        for agent, model in self._recorded.items():
            _COPIES.give(self._sources[agent], model)
        self._recorded.clear()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Call):
                item.future.set_exception(_ended())


def _ended() -> GatewayError:
    return GatewayError(
        "this episode has ended: its key is no longer valid",
        401,
        "authentication_error",
        None,
        "invalid_api_key",
    )


class RecordingCopies:
    """Recording copies of chat models, handed from ended episodes to later ones (thread-safe;
    one per process, holding no model alive: its sources are weak references).

    An episode records its replies in a copy of each agent's chat model (its own recorder:
    the episodes of one env thread interleave). A copy made per episode cost more than the
    rest of the episode's answer (LangChain serialises each new model object once, for its
    callbacks); a copy given back is emptied and handed to the next episode of the same
    model, as long as the model's fields are the ones it was copied with.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: id(source) → (a weak reference to the source, its idle copies)
        self._free: dict[int, tuple[weakref.ref[Any], list[Any]]] = {}

    def take(self, source: Any) -> Any | None:
        """An idle copy of ``source`` recording nothing yet (``None``: make one)."""
        with self._lock:
            entry = self._free.get(id(source))
            if entry is None or entry[0]() is not source or not entry[1]:
                return None
            model = entry[1].pop()
        fields = type(source).model_fields
        if any(
            getattr(model, k) is not getattr(source, k)
            for k in fields
            if k not in ("record", "recorder")
        ):
            return None  # the model changed since: a fresh copy
        # private attributes as a fresh copy has them (tool call ids numbered the same)
        private = source.__pydantic_private__
        model.__pydantic_private__ = None if private is None else dict(private)
        return model

    def give(self, source: Any, model: Any) -> None:
        """``model`` (a copy of ``source``) is no longer used by its episode."""
        model.recorder.pop_all()
        key = id(source)
        with self._lock:
            entry = self._free.get(key)
            if entry is None or entry[0]() is not source:
                ref = weakref.ref(source, lambda _, key=key: self._drop(key))
                entry = self._free[key] = (ref, [])
            entry[1].append(model)

    def _drop(self, key: int) -> None:
        """A source model was collected: its copies go."""
        with self._lock:
            entry = self._free.get(key)
            if entry is not None and entry[0]() is None:
                del self._free[key]


_COPIES = RecordingCopies()


class Answers(Protocol):
    """What the server looks up by key: an :class:`Episode`, or a served run
    (:class:`~marl_agents.gateway.standalone.ServedTeam`)."""

    key: str
    models: dict[str, str]  # model name → agent id

    def ask(self, request: ChatRequest) -> Reply: ...


class Registry:
    """The open episodes (or a served run) by key (thread-safe).

    Args:
        key_hint: where a client finds its key, for the 401s (default: an episode's app's).
    """

    def __init__(self, key_hint: str | None = None) -> None:
        self._lock = threading.Lock()
        self._episodes: dict[str, Answers] = {}
        self.key_hint = key_hint

    def add(self, episode: Answers) -> None:
        with self._lock:
            self._episodes[episode.key] = episode

    def remove(self, key: str) -> None:
        with self._lock:
            self._episodes.pop(key, None)

    def get(self, key: str | None) -> Answers:
        """The episode of ``key`` (a 401 if none is open)."""
        with self._lock:
            episode = self._episodes.get(key or "")
        if episode is None:
            if self.key_hint is not None:
                message = (
                    f"{'missing' if not key else 'invalid'} API key: send 'Authorization: "
                    f"Bearer <key>' with {self.key_hint}"
                )
            elif not key:
                message = (
                    "missing API key: send 'Authorization: Bearer <episode key>' (the key the "
                    "episode's app was given) or use the base URL /e/<key>/v1"
                )
            else:
                message = (
                    "invalid API key: no episode of this key is running (keys end with "
                    "their episode)"
                )
            raise GatewayError(message, 401, "authentication_error", None, "invalid_api_key")
        return episode

    def __len__(self) -> int:
        with self._lock:
            return len(self._episodes)


__all__ = ["Answers", "AppTimedOut", "Episode", "RecordingCopies", "Registry"]
