"""``EnvChatModel``: an app's chat model whose replies come from the environment in a GraphEnv.

Swap it in for the chat model of an existing LangGraph app (your own nodes, a supervisor with
handoff tools, ``langgraph.prebuilt.create_react_agent``) and the app trains without being
rewritten:

* **Inside a GraphEnv run** (the graph is executed by :class:`scenarios.graph_env.GraphEnv`, or
  :func:`scenarios.decisions.run_inline`), a call renders the messages (and the bound tools'
  descriptions) with the tokenizer's chat template into prompt token ids, encodes them as the
  agent's observation (:meth:`TextSpaces.encode_prompt`: right-padded; a longer prompt keeps
  its system message and its newest tokens, :mod:`marl_agents.llm.prompt_fit`), and asks
  ``scenarios.decide(agent, observation)``. The
  action is the token ids the learner's policy generated (:meth:`TextSpaces.decode_action`);
  they are cut after the first EOS (a generation stops there), decoded to text, parsed for
  tool calls in the ``<tool>{"name": …, "arguments": {…}}</tool>`` format of
  :mod:`scenarios.toolcalls`, and returned as an ``AIMessage`` with ``tool_calls``.
  Unparseable output never raises: the message carries no tool call, the step is recorded
  with ``format_ok=False`` (also in ``response_metadata["format_ok"]``), ``format_penalty``
  (if > 0) is paid to the agent at once with ``scenarios.emit_reward``, and the episode goes
  on. Sampling parameters are ignored here: the policy samples. A call with tools or a
  ``response_format`` declares its constraint, and a free call its ``stop`` strings, which
  travel with the observation (:func:`marl_agents.llm.constraints.with_constraint`): the
  module ends the sampled ids at the stop string as the app's reply is ended (the action the
  learner trains on is the recorded step's ids); the module sampling the reply (with
  ``constrain: auto``) draws only replies that parse and close within ``max_new_tokens``
  (:mod:`marl_agents.llm.constraints`, :mod:`marl_agents.llm.closing`). A constraint that
  cannot close within ``max_new_tokens`` even at its shortest is refused at the call
  (:class:`~marl_agents.llm.constraints.ReplyBudgetError`, naming the agent, the schema, its
  shortest length and the budget to set); a structured reply cut at the budget anyway (e.g.
  sampled by an engine that does not see the budget) raises a ``ConstraintError`` that says so
  (``reply cut at max_new_tokens=…``), or, for the gateway (``return_cut_replies=True``), is
  returned with ``finish_reason: "length"`` and no ``<tool>`` markup.
* **Outside** (plain ``graph.invoke``), the same model generates with its backend, exactly
  as :class:`~marl_agents.llm.chat_model.PolicyChatModel` does.

**Agent ids.** A call's agent id is the first of: an ``agent`` call argument
(``model.bind(agent=...)``); a *string* ``"agent"`` in the run metadata
(``config={"metadata": {"agent": ...}}``; the boolean ``agent`` flag of node metadata that
:meth:`Topology.from_langgraph` reads is not an id and is ignored); the model's ``agent``
field; the calling LangGraph node's name (``langgraph_node``); ``"agent"`` outside a graph.
The recorder keys steps by it and ``decide`` is asked with it. In a GraphEnv the environment
has the last word: when several agent tasks run in one superstep it names each decision after
its task (``<node>``, or ``<node>_<i>`` for the parallel instances of a ``Send`` target with
``max_instances > 1``, in LangGraph's scheduling order); otherwise it takes the id given, which
must be one of the scenario's ``possible_agents``. So leave ``agent`` unset in a GraphEnv app:
the node's name *is* its GraphEnv agent id (the recorder then keys fan-out instances under the
node's name; the env's trace has ``<node>_<i>``). In a prebuilt ReAct agent run directly as
the graph, the model is called in node ``"agent"``.
A scenario run **by agent id** (``GraphEnv(agent_ids=...)``, e.g.
:class:`~marl_agents.llm.chat_app.ChatAppScenario`, which sets ``agent`` on every model) names
each decision by the id the model passes, wherever the call happens (inside subgraphs, ``Send``
instances get ``<id>_<i>``); set ``agent`` then.

A ``prompt_ids`` call argument (``model.invoke(messages, prompt_ids=[...])``) gives the
prompt's ids instead of rendering ``messages`` with the chat template: the gateway
(:mod:`marl_agents.gateway.fidelity`) passes earlier replies as the ids they were sampled as.

The recorder gets one :class:`~marl_agents.llm.chat_model.LLMStep` per call in both modes
(in env mode unless ``record=False``).
In env mode its ``generation.prompt_ids`` are the observed (possibly truncated) ids, its
``token_ids`` the ids up to the first EOS, and its ``logprobs`` are ``nan``: the behaviour
logprobs belong to the learner's module, which recorded them with the action.

Example:
    >>> from scenarios.text_space import make_tiny_tokenizer
    >>> from scenarios.text_space import TextSpaces
    >>> tok = make_tiny_tokenizer()
    >>> spaces = TextSpaces.for_tokenizer(tok, max_prompt_tokens=256, max_new_tokens=32)
    >>> chat = EnvChatModel(tokenizer=tok, spaces=spaces)  # env-only: no backend
    >>> chat.spaces.action_space.shape
    (32,)
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from pydantic import Field, PrivateAttr, model_validator

from marl_agents.llm.backend import Generation, SamplingParams, stop_ids
from marl_agents.llm.chat_model import PolicyChatModel, chat_result, parse_step, tool_names
from marl_agents.llm.constraints import (
    Constraint,
    ConstraintError,
    call_of,
    check_reply_budget,
    describe,
    with_constraint,
)
from marl_agents.llm.prompt_fit import fit_chat_prompt
from marl_agents.llm.stop_strings import cut_at_stop
from scenarios.text_space import TextSpaces, encode_prompt
from scenarios.toolcalls import OPEN, complete_call

#: prefill texts whose ids a model keeps (a prefill function may make many)
PREFILL_IDS_KEPT = 1024


def in_env_run(agent_given: bool = False) -> bool:
    """Whether the caller runs inside a marl-orchestra episode (GraphEnv or ``run_inline``).

    ``agent_given``: the call or its model names its agent (the gateway's calls do, and
    ``ChatAppScenario``'s models), so a run on the fast path can answer it; a call that would
    read its agent off LangGraph's run metadata (``langgraph_node``) makes the fast run fall
    back to LangGraph."""
    from langgraph.config import get_config

    from scenarios.bridge import BRIDGE_KEY
    from scenarios.replay import FAST_BRIDGE
    from scenarios.stepped import needs_langgraph

    if agent_given and FAST_BRIDGE.get() is not None:
        return True
    # the fast executor runs nodes without LangGraph's config: it falls back to LangGraph here
    needs_langgraph("a chat model in a node finds its episode through LangGraph's run config")
    try:
        config = get_config()
    except RuntimeError:  # not inside a runnable at all
        return False
    return BRIDGE_KEY in (config.get("configurable") or {})


class EnvChatModel(PolicyChatModel):
    """A chat model answered by the environment in a GraphEnv run, by its backend outside.

    Attributes:
        spaces: the agent's text spaces (observation = prompt ids, action = generated ids);
            use the same object for the scenario's ``observation_space``/``action_space``.
        tokenizer: renders prompts and decodes actions; default: ``backend.tokenizer``.
        backend: generates outside an env run (optional when the model only runs in envs).
        format_penalty: reward (≥ 0, subtracted) paid to the agent through
            ``scenarios.emit_reward`` when its output has a malformed tool call in an env
            run; ``0`` only records the flag.
        prefill: text an env-mode reply starts with (or a function of the prompt's chat
            dicts returning it, e.g. to prefill only the first turn): the prompt ends with it,
            the policy continues it, and the app sees ``prefill`` + the generated text (e.g.
            ``'<tool>{"name": "transfer_to_'`` constrains a supervisor's reply to a handoff).
        complete_calls: an unfinished call whose name so far is a prefix of exactly one
            bound tool's name is completed to that tool's call with no arguments
            (:func:`scenarios.toolcalls.complete_call`); with a ``prefill`` that opens a
            handoff, one generated letter then picks the worker.
        record: whether env-mode calls are recorded in ``recorder`` (the env's trace and the
            learner's episodes hold the same observations and actions). An env runner never
            empties the recorder: in long training runs set ``False`` or call
            ``recorder.pop_all()`` between episodes.
        agent, params, recorder: as in :class:`PolicyChatModel` (see the module docstring
            for how the agent id is resolved). ``params.max_new_tokens`` defaults to
            ``spaces.max_new_tokens`` and may not exceed it, so direct generations fit the
            action space.
    """

    backend: Any = None
    spaces: TextSpaces
    tokenizer: Any = None
    format_penalty: float = Field(default=0.0, ge=0.0)
    record: bool = True
    prefill: str | Callable[[list[dict[str, Any]]], str] = ""
    complete_calls: bool = False
    _calls: int = PrivateAttr(default=0)
    _prefill_ids: dict[tuple[int, str], list[int]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> EnvChatModel:
        if self.tokenizer is None:
            if self.backend is None:
                raise ValueError("EnvChatModel needs a tokenizer or a backend that has one")
            self.tokenizer = self.backend.tokenizer
        if len(self.tokenizer) > self.spaces.vocab_size:
            raise ValueError(
                f"the tokenizer has {len(self.tokenizer)} tokens but the spaces only "
                f"{self.spaces.vocab_size}: build them with TextSpaces.for_tokenizer"
            )
        if "params" not in self.model_fields_set:
            self.params = SamplingParams(max_new_tokens=self.spaces.max_new_tokens)
        elif self.params.max_new_tokens > self.spaces.max_new_tokens:
            raise ValueError(
                f"params.max_new_tokens={self.params.max_new_tokens} > the action length "
                f"spaces.max_new_tokens={self.spaces.max_new_tokens}: lower it or widen the spaces"
            )
        return self

    @property
    def _llm_type(self) -> str:
        return "marl-env-chat-model"

    # ----- LangChain entry points ----------------------------------------------------------
    def _reply(
        self, agent: str, chat: list[dict[str, Any]], tools: list[Any] | None, kwargs: Any
    ) -> ChatResult:
        # an agent named by the call or the model (ChatAppScenario's) needs no LangGraph
        # metadata, so the fast path answers it; one read off ``langgraph_node`` falls back
        if not in_env_run(agent_given="agent" in kwargs or self.agent is not None):
            if self.backend is None:
                raise RuntimeError(
                    "EnvChatModel without a backend was called outside a GraphEnv run: give it "
                    "backend=... to generate directly, or run the graph with scenarios.GraphEnv"
                )
            return super()._reply(agent, chat, tools, kwargs)
        from scenarios.decisions import decide, emit_reward

        stop = kwargs.pop("stop", None)  # the call's stop strings (PolicyChatModel._generate)
        given = kwargs.pop("prompt_ids", None)  # the caller's own ids of ``chat`` (the gateway's)
        prompt = list(given) if given is not None else encode_prompt(self.tokenizer, chat)
        prefill, head = self.prefill_of(chat)
        prompt += head
        # too long: the system prompt is kept, the oldest turns go (marl_agents.llm.prompt_fit)
        limit = self.spaces.max_prompt_tokens
        obs = self.spaces.encode_prompt(fit_chat_prompt(self.tokenizer, chat, prompt, limit, agent))
        constraint = self.constraint_of(tools, kwargs, prefix=prefill)
        self.check_budget(agent, constraint)
        # the call's constraint and stop strings travel with its observation to the sampler
        # (another call with the same prompt ids and other settings is another decision), which
        # ends the sampled reply at the stop string as ``stopped`` below ends the app's
        obs = with_constraint(obs, constraint, self.stops_for(stop, tools, constraint))
        return_cut = bool(kwargs.pop("return_cut_replies", False))
        gen = self.stopped(
            self.tokenizer, self.generation_of(obs, decide(agent, obs)), stop, tools, constraint
        )
        text = prefill + gen.text
        if self.complete_calls and tools:
            text = complete_call(text, tool_names(tools))
        step, content = parse_step(agent, gen, chat, tools, text, prefill)
        cut = self.cut_reply(constraint, step, text)
        if cut is not None:  # named in the record (transcripts) and where it surfaces
            step.format_ok = False
            step.errors.append(cut)
            content = content.split(OPEN, 1)[0] if constraint.kind == "tools" else content
        index = self.recorder.add(step) if self.record else None
        self._calls += 1
        if not step.format_ok and self.format_penalty:
            emit_reward(-self.format_penalty, [agent])
        if cut is not None and not return_cut:
            raise ConstraintError(cut)
        return chat_result(step, index, content, self._calls)

    def check_budget(self, agent: str, constraint: Constraint | None) -> None:
        """Refuse a call whose constraint cannot close within the agent's ``max_new_tokens``
        even at its shortest (:func:`~marl_agents.llm.constraints.check_reply_budget`).
        With ``complete_calls`` a tool call need not close in the budget: the app completes
        an unfinished call itself (a prefill opening a handoff, one letter picking the tool)."""
        if constraint is not None and not (self.complete_calls and constraint.kind == "tools"):
            stops = stop_ids(self.tokenizer, self.params)
            check_reply_budget(
                agent,
                constraint,
                self.tokenizer,
                self.spaces.vocab_size,
                sorted(stops),
                self.spaces.max_new_tokens,
            )

    def cut_reply(self, constraint: Constraint | None, step: Any, text: str) -> str | None:
        """Why a structured reply (a forced call or a JSON reply) does not parse, when the
        budget cut it (``None``: it parses, is free, or was not cut). A free reply, or one with
        optional calls, cut by the budget stays a free reply."""
        gen = step.generation
        if constraint is None or gen.finish_reason != "length":
            return None
        if constraint.kind == "tools":
            if not constraint.forced or (step.format_ok and step.tool_calls):
                return None
        else:
            try:
                json.loads(text)
                return None
            except ValueError:
                pass
        return (
            f"reply cut at max_new_tokens={self.spaces.max_new_tokens} before its "
            f"{describe(constraint)} closed ({len(gen.token_ids)} tokens: {text[-60:]!r}): "
            "raise the agent's max_new_tokens"
        )

    def prefill_of(self, chat: list[dict[str, Any]]) -> tuple[str, list[int]]:
        """The text an env-mode reply to ``chat`` starts with (``prefill`` called once), and
        its token ids."""
        text = self.prefill(chat) if callable(self.prefill) else self.prefill
        return text, self.prefill_ids(text)

    def prefill_ids(self, text: str) -> list[int]:
        """The token ids of the prefill ``text`` (kept per text: a prefill is tokenised once,
        not at every call)."""
        if not text:
            return []
        key = (id(self.tokenizer), text)  # a copy with another tokenizer shares the dict
        ids = self._prefill_ids.get(key)
        if ids is None:
            if len(self._prefill_ids) >= PREFILL_IDS_KEPT:
                self._prefill_ids.clear()
            ids = self._prefill_ids[key] = encode_prompt(self.tokenizer, text)
        return list(ids)

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if not in_env_run():
            return await super()._agenerate(messages, stop, run_manager, **kw)
        # ``decide`` suspends the episode's greenlet, so it runs here, on the caller's thread
        # (LangChain's default would run ``_generate`` in a thread pool)
        sync = run_manager.get_sync() if run_manager is not None else None
        return self._generate(messages, stop, sync, **kw)

    # ----- actions → text ------------------------------------------------------------------
    def generation_of(self, observation: Any, action: Any) -> Generation:
        """The generation an (observation, action) pair stands for; logprobs are ``nan``.

        The action's ids are cut after the first EOS / stop id of ``params`` (generation ends
        there); ids the tokenizer does not know (model vocabularies may be padded) decode to
        nothing.
        """
        ids = self.spaces.decode_action(action)
        stops = stop_ids(self.tokenizer, self.params)
        end = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
        ids = ids[:end] if end is not None else ids
        known = [t for t in ids if t < len(self.tokenizer)]
        return Generation(
            prompt_ids=self.spaces.decode_prompt(observation),
            token_ids=ids,
            logprobs=[math.nan] * len(ids),
            text=self.tokenizer.decode(known, skip_special_tokens=True),
            finish_reason="stop" if end is not None else "length",
        )


def backend_policy(
    backend: Any,
    spaces: TextSpaces,
    params: SamplingParams | Mapping[str, SamplingParams] | None = None,
) -> Callable[[str, Any], np.ndarray]:
    """A GraphEnv policy ``(agent, observation) → action`` that generates with ``backend``.

    The observation's prompt ids go to the backend as ids (no re-tokenisation), with the
    constraint its call declared, and the generated ids (ended at its stop strings) come back
    as the action: with the same sampling parameters and seed, an episode stepped with this
    policy gives the app the same replies as running it directly on the backend. Stands in for
    the learner's policy in tests and evaluation.

    Args:
        backend: an :class:`~marl_agents.llm.backend.LLMBackend`.
        spaces: the agents' text spaces.
        params: sampling parameters, or agent id → parameters; ``max_new_tokens`` is capped
            at the action length. Default: ``SamplingParams(max_new_tokens=action length)``.
    """

    def params_for(agent: str) -> SamplingParams:
        p = params.get(agent) if isinstance(params, Mapping) else params
        p = p or SamplingParams(max_new_tokens=spaces.max_new_tokens)
        return dataclasses.replace(p, max_new_tokens=min(p.max_new_tokens, spaces.max_new_tokens))

    def policy(agent: str, observation: Any) -> np.ndarray:
        call = call_of(observation)
        p = dataclasses.replace(params_for(agent), constraint=call.constraint)
        [gen] = backend.generate([spaces.decode_prompt(observation)], p)
        # ended at the call's stop strings as the learner's module ends its actions
        gen = cut_at_stop(backend.tokenizer, gen, call.stop) if call.stop else gen
        return spaces.encode_action(gen.token_ids)

    return policy


def tokens_action(spaces: TextSpaces, tokenizer: Any, text: str, eos: bool = True) -> np.ndarray:
    """The action array of ``text`` (tokenised without special tokens, then EOS if ``eos``).

    Handy for scripted episodes: ``tokens_action(spaces, tok, render_tool_call("add", {...}))``.
    """
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if eos and tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return spaces.encode_action(ids)


__all__ = ["EnvChatModel", "backend_policy", "in_env_run", "tokens_action"]
