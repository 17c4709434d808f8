"""``PolicyChatModel``: a LangChain chat model backed by an agent's LLM policy.

Put it wherever a LangGraph graph expects a chat model — your own nodes,
``langgraph.prebuilt.create_react_agent``, a supervisor with handoff tools — and every call
is served by an :class:`~marl_agents.llm.backend.LLMBackend` and recorded for training: the
prompt's token ids, the generated token ids and their logprobs (exactly as sampled, never
re-tokenised), the parsed tool calls and the format-penalty flag, keyed by agent.

Tools bound with :meth:`PolicyChatModel.bind_tools` are described in the system message and
called in the ``<tool>{"name": …, "arguments": {…}}</tool>`` format of
:mod:`scenarios.toolcalls`. Malformed calls never raise: the message carries no tool call
and the step is recorded with ``format_ok=False``.

**Constrained replies.** A call with bound tools (``tool_choice`` forcing a call, as
``with_structured_output`` binds its schema, or leaving it optional) or a ``response_format``
(``model.bind(response_format=...)``: a JSON reply) declares a
:class:`~marl_agents.llm.constraints.Constraint`; the backend then samples only replies that
parse (:mod:`marl_agents.llm.constraints`). ``constrain="off"`` (the model field) leaves
every reply free. A JSON reply's text is the message content.

**Streaming.** ``stream``/``astream`` (and a graph streamed with ``stream_mode="messages"``,
which streams every model call in it) yield ``AIMessageChunk``s cut from ONE decision
(:func:`message_chunks`): the text in word pieces, each tool call as ``tool_call_chunks``
that LangChain assembles into the same ``tool_calls``, the metadata on the last chunk. Their
sum equals what ``invoke`` returns for the same reply; a structured-output or tool reply
streams the same way (it is generated, constrained, before the first chunk).

Example:
    >>> from marl_agents.llm.tiny import make_tiny_model
    >>> from marl_agents.llm.hf_backend import HFBackend
    >>> tok, model = make_tiny_model(seed=0)
    >>> recorder = GenerationRecorder()
    >>> chat = PolicyChatModel(backend=HFBackend(model, tok), agent="solver",
    ...                        params=SamplingParams(max_new_tokens=8, seed=0),
    ...                        recorder=recorder)
    >>> reply = chat.invoke("What is 1 + 2?")
    >>> [step.agent for step in recorder.steps()]
    ['solver']
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from marl_agents.llm.backend import Generation, SamplingParams
from marl_agents.llm.constraints import Constraint
from marl_agents.llm.stop_strings import cut_at_stop, stop_list
from scenarios.toolcalls import (
    ToolCall,
    parse_tool_calls,
    render_tool_call,
    render_tool_instructions,
)


@dataclasses.dataclass
class LLMStep:
    """One recorded call of an agent's policy.

    Attributes:
        agent: who generated (the recorder key).
        generation: prompt ids, generated ids, their logprobs and text (what training uses).
        tool_calls: the calls parsed from the text.
        format_ok: ``False`` when a tool-call block was malformed (apply the format penalty).
        errors: the parser's messages for malformed blocks.
        messages: the chat messages the prompt was rendered from.
        prefill: the text the reply was started with (not generated: its ids end the prompt),
            ``""`` when none.
    """

    agent: str
    generation: Generation
    tool_calls: list[ToolCall]
    format_ok: bool
    errors: list[str]
    messages: list[dict[str, Any]]
    prefill: str = ""


class GenerationRecorder:
    """Thread-safe store of :class:`LLMStep` records, keyed by agent, in call order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: list[LLMStep] = []

    def add(self, step: LLMStep) -> int:
        """Record ``step``; returns its index in :meth:`steps`."""
        with self._lock:
            self._steps.append(step)
            return len(self._steps) - 1

    def steps(self, agent: str | None = None) -> list[LLMStep]:
        """All steps in call order, or only ``agent``'s."""
        with self._lock:
            return [s for s in self._steps if agent is None or s.agent == agent]

    def by_agent(self) -> dict[str, list[LLMStep]]:
        """Steps grouped by agent (agents in first-call order)."""
        out: dict[str, list[LLMStep]] = {}
        for s in self.steps():
            out.setdefault(s.agent, []).append(s)
        return out

    def pop_all(self) -> list[LLMStep]:
        """Return every step and clear the store (e.g. at the end of an episode)."""
        with self._lock:
            steps, self._steps = self._steps, []
            return steps

    def __len__(self) -> int:
        with self._lock:
            return len(self._steps)

    def __iter__(self) -> Iterator[LLMStep]:
        return iter(self.steps())


def to_chat_dicts(
    messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """LangChain messages → ``{"role", "content"}`` dicts for a chat template.

    AI messages with tool calls get the calls appended in the ``<tool>`` format (unless their
    content already holds them); tool results become ``role="tool"``. With ``tools``, their
    description is put into the (first) system message, or a new one in front.
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        content = m.text if isinstance(m.content, list) else str(m.content)
        if isinstance(m, SystemMessage):
            role = "system"
        elif isinstance(m, HumanMessage):
            role = "user"
        elif isinstance(m, AIMessage):
            role = "assistant"
            calls = "".join(render_tool_call(c["name"], c["args"]) for c in m.tool_calls)
            if calls and "<tool>" not in content:
                content = f"{content} {calls}".strip()
        elif isinstance(m, ToolMessage):
            role = "tool"
        else:
            role = getattr(m, "role", None) or m.type
        out.append({"role": role, "content": content})
    if tools:
        doc = render_tool_instructions(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{doc}"}
        else:
            out.insert(0, {"role": "system", "content": doc})
    return out


class PolicyChatModel(BaseChatModel):
    """A chat model whose replies come from an agent's policy backend, recorded for training.

    Attributes:
        backend: the :class:`~marl_agents.llm.backend.LLMBackend` serving this agent (wrap it
            in :class:`~marl_agents.llm.batching.BatchingBackend` to batch parallel calls).
        agent: the recorder key. ``None``: the calling LangGraph node's name
            (``langgraph_node`` in the run metadata), or ``"agent"`` outside a graph. An
            ``"agent"`` key in the call's metadata overrides both — e.g. a ``Send`` target
            calls ``chat.invoke(msgs, config={"metadata": {"agent": f"worker_{i}"}})``.
        params: sampling parameters; per call, ``temperature``, ``top_p``,
            ``max_new_tokens`` and ``seed`` keyword arguments (e.g. through ``.bind``)
            override them.
        recorder: where steps go; share one recorder between agents to collect a team's
            episode.
        constrain: ``"auto"``: a call with tools or a ``response_format`` declares its
            constraint (module doc); ``"off"``: never.
        stop: stop strings for every call (a call's own ``stop`` replaces them): a free reply
            ends at the first one, as OpenAI's and vLLM's do
            (:mod:`marl_agents.llm.stop_strings`: the recorded ids end with the token
            completing it, the text before it).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    backend: Any
    agent: str | None = None
    params: SamplingParams = Field(default_factory=SamplingParams)
    recorder: GenerationRecorder = Field(default_factory=GenerationRecorder)
    constrain: Literal["auto", "off"] = "auto"
    stop: list[str] | None = None

    @property
    def _llm_type(self) -> str:
        return "marl-policy-chat-model"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"agent": self.agent, **dataclasses.asdict(self.params)}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        """LangSmith's standard parameters: the model name is the call's ``model`` or the
        agent's (the name a gateway serves it under), with the sampling temperature, token
        budget and stop strings."""
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_model_name"] = str(kwargs.get("model") or self.agent or "agent")
        params["ls_temperature"] = float(kwargs.get("temperature", self.params.temperature))
        params["ls_max_tokens"] = int(kwargs.get("max_new_tokens", self.params.max_new_tokens))
        stops = stop if stop is not None else self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools: described in the system message, called in the ``<tool>`` format.

        Args:
            tools: LangChain tools, functions, pydantic models or OpenAI tool dicts.
            tool_choice: ``"any"``/``"required"``/a tool's name force one call (what
                ``with_structured_output`` asks); ``None``/``"auto"`` leave it optional;
                ``"none"`` frees the reply. Enforced by constrained decoding (module doc).
            **kwargs: further call arguments (e.g. ``temperature``).
        """
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        stops = stop_list(self.stop if stop is None else stop)
        if stops:
            kwargs["stop"] = stops
        tools = kwargs.pop("tools", None)
        agent = self._agent_key(run_manager, kwargs)
        return self._reply(agent, to_chat_dicts(messages, tools), tools, kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        result = self._generate(messages, stop, run_manager, **kwargs)  # one decision
        yield from message_chunks(result.generations[0].message)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        result = await self._agenerate(messages, stop, run_manager, **kwargs)
        for chunk in message_chunks(result.generations[0].message):
            yield chunk

    # LangChain calls ``_stream`` without the run's callback manager, so the agent id a call
    # names in its config metadata travels as the ``agent`` call argument instead
    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return super().invoke(input, config, **_lift_agent(config, kwargs))

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return await super().ainvoke(input, config, **_lift_agent(config, kwargs))

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[AIMessageChunk]:
        yield from super().stream(input, config, **_lift_agent(config, kwargs))

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[AIMessageChunk]:
        async for chunk in super().astream(input, config, **_lift_agent(config, kwargs)):
            yield chunk

    def constraint_of(
        self, tools: list[Any] | None, kwargs: dict[str, Any], prefix: str = ""
    ) -> Constraint | None:
        """The constraint a call declares (pops ``tool_choice`` / ``response_format`` from
        the call's ``kwargs``); ``None``: a free reply or ``constrain="off"``."""
        choice = kwargs.pop("tool_choice", None)
        response_format = kwargs.pop("response_format", None)
        if self.constrain == "off":
            return None
        return Constraint.for_call(tools, choice, response_format, prefix=prefix)

    @staticmethod
    def stops_for(stop: Sequence[str] | None, tools: Any, constraint: Any) -> tuple[str, ...]:
        """The stop strings that end a call's reply: the call's ``stop``, none for a reply
        with tools bound or constrained (it ends where its grammar ends)."""
        if not stop or tools or constraint is not None:
            return ()
        return tuple(stop)

    @classmethod
    def stopped(
        cls,
        tokenizer: Any,
        gen: Generation,
        stop: Sequence[str] | None,
        tools: Any,
        constraint: Any,
    ) -> Generation:
        """``gen`` ended at the call's first stop string (:func:`cut_at_stop`, with
        :meth:`stops_for`'s strings)."""
        stops = cls.stops_for(stop, tools, constraint)
        return cut_at_stop(tokenizer, gen, stops) if stops else gen

    def _reply(
        self, agent: str, chat: list[dict[str, Any]], tools: list[Any] | None, kwargs: Any
    ) -> ChatResult:
        """Answer one call (prompt as chat dicts) with the backend and record it."""
        overrides = {
            k: kwargs.pop(k)
            for k in ("temperature", "top_p", "max_new_tokens", "seed")
            if k in kwargs
        }
        stop = kwargs.pop("stop", None)
        constraint = self.constraint_of(tools, kwargs)
        if constraint is not None:
            overrides["constraint"] = constraint
        params = dataclasses.replace(self.params, **overrides) if overrides else self.params
        [gen] = self.backend.generate([chat], params)
        gen = self.stopped(self.backend.tokenizer, gen, stop, tools, constraint)
        step, content = parse_step(agent, gen, chat, tools, gen.text)
        index = self.recorder.add(step)
        return chat_result(step, index, content, index)

    def _agent_key(
        self, run_manager: CallbackManagerForLLMRun | None, kwargs: dict[str, Any]
    ) -> str:
        if "agent" in kwargs:
            return str(kwargs["agent"])
        if run_manager is not None:
            meta = run_manager.metadata or {}
        else:  # a streamed call: the metadata of the run it is called in (a LangGraph node's)
            meta = (var_child_runnable_config.get() or {}).get("metadata") or {}
        # LangGraph merges node metadata into the run's: ``{"agent": True}`` marks an agent node
        # and is no agent id, so only a string counts
        if isinstance(meta.get("agent"), str):
            return meta["agent"]
        if self.agent is not None:
            return self.agent
        return str(meta.get("langgraph_node", "agent"))


def _lift_agent(config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with ``agent`` set from a string ``"agent"`` in ``config``'s metadata (an
    ``agent`` call argument, e.g. from ``bind``, takes precedence)."""
    agent = ((config or {}).get("metadata") or {}).get("agent")
    if isinstance(agent, str) and "agent" not in kwargs:
        return {**kwargs, "agent": agent}
    return kwargs


def message_chunks(message: AIMessage) -> Iterator[ChatGenerationChunk]:
    """The chunks that stream ``message`` (one decision's reply), in order.

    The content in word pieces (each with its leading whitespace), then per tool call two
    ``tool_call_chunks`` with the call's index (name and id, then the rest of its JSON
    arguments), then an empty last chunk (``chunk_position="last"``) with the response
    metadata. Their sum has the message's content, ``tool_calls`` and response metadata.
    """
    text = message.content if isinstance(message.content, str) else message.text
    for piece in re.findall(r"\s*\S+|\s+", text):
        yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
    for i, call in enumerate(message.tool_calls):
        args = json.dumps(call["args"])
        half = len(args) // 2
        for part in (
            tool_call_chunk(name=call["name"], args=args[:half], id=call["id"], index=i),
            tool_call_chunk(name=None, args=args[half:], id=None, index=i),
        ):
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[part]))
    last = AIMessageChunk(
        content="", response_metadata=dict(message.response_metadata), chunk_position="last"
    )
    yield ChatGenerationChunk(message=last)


def tool_names(tools: Sequence[dict[str, Any]] | None) -> list[str] | None:
    """The names of bound tools (OpenAI tool dicts); ``None`` without tools."""
    return [t["function"]["name"] for t in tools] if tools else None


def parse_step(
    agent: str,
    gen: Generation,
    chat: list[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    text: str,
    prefill: str = "",
) -> tuple[LLMStep, str]:
    """The record of one call whose reply is ``text`` (``prefill`` + the generated text) and
    the reply's text outside tool calls (tool calls are parsed only when tools are bound)."""
    parsed = parse_tool_calls(text, tool_names(tools)) if tools else None
    step = LLMStep(
        agent=agent,
        generation=gen,
        tool_calls=parsed.tool_calls if parsed else [],
        format_ok=parsed.format_ok if parsed else True,
        errors=parsed.errors if parsed else [],
        messages=chat,
        prefill=prefill,
    )
    return step, parsed.content if parsed else text


def chat_result(step: LLMStep, index: int | None, content: str, serial: int) -> ChatResult:
    """The ``ChatResult`` answering one recorded call (tool calls included).

    Args:
        step: the call's record.
        index: its index in the recorder (``response_metadata["step"]``), ``None`` if not
            recorded.
        content: the text outside tool calls.
        serial: a number unique to this call, for the tool call ids.
    """
    gen, agent = step.generation, step.agent
    message = AIMessage(
        content=content,
        tool_calls=[
            {
                "name": c.name,
                "args": c.arguments,
                "id": f"call_{agent}_{serial}_{i}",
                "type": "tool_call",
            }
            for i, c in enumerate(step.tool_calls)
        ],
        response_metadata={
            "agent": agent,
            "step": index,
            "finish_reason": gen.finish_reason,
            "num_tokens": len(gen.token_ids),
            "format_ok": step.format_ok,
        },
    )
    return ChatResult(generations=[ChatGeneration(message=message)])
