"""One request answered by an agent's chat model: the prompt, its bound, the call, the reply.

Both sides of the gateway answer a request the same way: an app episode's node
(:mod:`marl_agents.gateway.episodes`) and a served run (:mod:`marl_agents.gateway.standalone`)
hand the request's messages, ``tools``, ``tool_choice`` and ``response_format`` to the agent's
:class:`~marl_agents.llm.env_chat_model.EnvChatModel` — chat template → prompt ids → the
agent's policy → token ids → text → tool calls — after checking the prompt against the agent's
``max_prompt_tokens``. The model is called directly (its ``_generate``), not through
LangChain's ``invoke``: no LangChain callbacks or tracers see a gateway's decisions (the app's
own client traces them, if anything does). :func:`answer` does that and returns the
:class:`Reply` with the ids the policy saw and sampled.
"""

from __future__ import annotations

import logging
from typing import Any

from marl_agents.gateway.fidelity import TurnIds
from marl_agents.gateway.prompt_bound import bound_prompt
from marl_agents.gateway.protocol import ChatRequest, GatewayError, Reply

log = logging.getLogger("marl.gateway")

_WARNED: set[tuple[str, str]] = set()  # (agent, sampling field) already logged as not used


def answer(
    model: Any,
    agent: str,
    request: ChatRequest,
    *,
    turns: TurnIds | None = None,
    truncate_prompts: bool = False,
) -> tuple[Reply, Any]:
    """Answer ``request`` with ``model`` (an ``EnvChatModel`` recording its calls).

    Args:
        model: the agent's chat model (``record=True``: its last step gives the ids).
        agent: the agent's id (for the log of unused sampling fields).
        request: the parsed request.
        turns: earlier replies' sampled ids to reuse in the prompt (``None``: re-tokenise).
        truncate_prompts: keep a too-long prompt's last tokens instead of refusing it.

    Returns:
        The reply and the model's record of the call (its ``LLMStep``: generation, the
        request's chat dicts, prefill).

    Raises:
        GatewayError: a prompt over ``max_prompt_tokens`` (400 ``context_length_exceeded``), or
            a ``response_format`` / forced tool that cannot be followed or cannot close within
            the agent's ``max_new_tokens`` even at its shortest (400, naming the agent, the
            schema, its shortest length and the ``max_new_tokens`` to set).
    """
    from marl_agents.llm.chat_model import to_chat_dicts
    from marl_agents.llm.constraints import ConstraintError
    from scenarios.text_space import encode_prompt

    check_sampling(agent, request)
    if request.prompt_ids is None:  # bounded in characters before it is tokenised
        request = bound_prompt(model, request, truncate_prompts)
    messages = request.messages
    if request.prompt_ids is not None:  # a /v1/completions prompt of token ids: used as given
        messages = [token_prompt_message(model, request.prompt_ids)]
    chat = to_chat_dicts(messages, request.tools)
    if request.prompt_ids is not None:
        prompt: list[int] | None = list(request.prompt_ids)
    else:
        prompt = turns.prompt(model.tokenizer, chat) if turns is not None else None
    length = len(prompt if prompt is not None else encode_prompt(model.tokenizer, chat))
    limit = model.spaces.max_prompt_tokens
    if length > limit and not truncate_prompts:
        raise GatewayError(
            f"this model's context is {limit} tokens; the messages take {length}: "
            "shorten them, raise the scenario's max_prompt_tokens, or truncate prompts as "
            "training does (marl serve's default, --truncate-prompts; "
            "AppScenario(truncate_prompts=True))",
            400,
            "invalid_request_error",
            "messages" if request.prompt_ids is None else "prompt",
            "context_length_exceeded",
        )
    # named: the fast path answers it (``in_env_run``); a structured reply cut at the budget
    # comes back as OpenAI's ``finish_reason: "length"`` (no ``<tool>`` markup), not an error
    kwargs: dict[str, Any] = {"agent": agent, "return_cut_replies": True}
    if request.tools:
        kwargs["tools"] = request.tools
        if request.tool_choice is not None:
            kwargs["tool_choice"] = request.tool_choice
    if request.response_format is not None:
        kwargs["response_format"] = request.response_format
    if request.stop:
        kwargs["stop"] = request.stop
    if prompt is not None:
        kwargs["prompt_ids"] = prompt
    try:
        # the model's own call, without LangChain's run machinery around it (callback
        # managers, the model's serialisation for tracers): the same reply, a third of the cost
        message = model._generate(list(messages), **kwargs).generations[0].message
    except ConstraintError as exc:  # a schema it cannot follow, or cannot close in the budget
        param = "response_format" if request.response_format is not None else "tool_choice"
        raise GatewayError(str(exc), 400, param=param) from exc
    step = model.recorder.steps()[-1]
    gen = step.generation
    return Reply(message, list(gen.prompt_ids), list(gen.token_ids)), step


def token_prompt_message(model: Any, ids: list[int]) -> Any:
    """The user message standing for a prompt given as token ids (its text, special tokens
    kept, for transcripts); a 400 for an id outside the agent's vocabulary."""
    from langchain_core.messages import HumanMessage

    vocab = model.spaces.vocab_size
    bad = [i for i in ids if i >= vocab]
    if bad:
        raise GatewayError(
            f"'prompt' token ids {bad[:5]} are outside this model's vocabulary [0, {vocab}): "
            "send ids of the agent's tokenizer",
            400,
            "invalid_request_error",
            "prompt",
        )
    known = [i for i in ids if i < len(model.tokenizer)]  # a padded vocabulary's ids: no text
    return HumanMessage(model.tokenizer.decode(known, skip_special_tokens=False))


def check_sampling(agent: str, request: ChatRequest) -> None:
    """Log the sampling fields a request sets, once per process, agent and field: they are not
    used (the agent's policy samples with its pool's settings)."""
    for key, value in request.sampling.items():
        if (agent, key) not in _WARNED:
            _WARNED.add((agent, key))
            log.warning(
                "agent %r: the request sets %s=%r, which is not used: the agent's policy "
                "samples with its pool's settings (set them in the pool's config)",
                agent,
                key,
                value,
            )


def unknown_model(model: str, names: Any, where: str = "this episode") -> GatewayError:
    """The 404 for a ``model`` that names no agent, listing the known names."""
    return GatewayError(
        f"the model {model!r} does not exist in {where}: the agents' model names are "
        f"{sorted(names)}",
        404,
        "invalid_request_error",
        "model",
        "model_not_found",
    )


__all__ = ["answer", "check_sampling", "token_prompt_message", "unknown_model"]
