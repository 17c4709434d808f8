"""Token budgets checked before training (called by :func:`trainers.plan.resolve`, no Ray).

* **A prompt longer than a pool's context** (an error): an LLM pool's prompts
  (``max_prompt_tokens``) must fit the model's context (``max_position_embeddings`` of its
  ``config.json``; 1,024 for the tiny model), and with the replies (``max_new_tokens``) they
  should (a warning): positions past it are ones the model never saw.
* **A system prompt that truncation would cut** (warnings): a chat app
  (:class:`~marl_agents.llm.chat_app.ChatAppScenario`) is run once in this process with every
  agent answering its declared default reply (:func:`scenarios.decisions.run_inline`); an agent
  whose prompt was longer than ``max_prompt_tokens`` with a system message too long to keep
  (:mod:`marl_agents.llm.prompt_fit`) is named with the lengths and the knob.

(A schema's shortest reply against ``max_new_tokens`` is the constrained-decoding check's,
also called from :func:`trainers.plan.resolve`.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainers.configs.typed import ConfigError

log = logging.getLogger(__name__)


def model_context(path: str) -> int | None:
    """The context length (``max_position_embeddings``) of an LLM pool's model: the tiny
    model's, or read from a saved model's ``config.json`` (``None`` when it names none)."""
    if path == "tiny":
        from marl_agents.llm.checkpoints import TINY_FIELDS

        return int(TINY_FIELDS["max_position_embeddings"])
    from scenarios.pretrained import PretrainedError, resolve

    try:
        config = json.loads((Path(resolve(path)).expanduser() / "config.json").read_text())
    except (OSError, ValueError, PretrainedError):
        return None  # the model check names an unreadable model
    for section in (config, config.get("text_config") or {}):
        value = section.get("max_position_embeddings") if isinstance(section, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_contexts(pools: Mapping[str, Any]) -> list[str]:
    """Every LLM pool's prompt budget fits its model's context; returns a warning per pool
    whose prompt plus reply budget does not (the longest replies then run past it).

    Raises:
        ConfigError: a prompt budget over the context, naming the pool, its model's context
            and the knob.
    """
    from marl_agents.llm.rl_module import spaces_from
    from marl_agents.pools import LLMModel

    warnings = []
    for pid, pool in pools.items():
        if not isinstance(pool.model, LLMModel):
            continue
        try:
            spaces = spaces_from(pool.observation_space, pool.action_space)
        except TypeError:
            continue  # not text spaces: the text check names it
        context = model_context(pool.model.path)
        if context is None:
            continue
        prompt, reply = spaces.max_prompt_tokens, spaces.max_new_tokens
        knob = "(scenario_kwargs.max_prompt_tokens, or the scenario's max_prompt_tokens=...)"
        where = f"pool {pid!r}: model {pool.model.path!r} has a context of {context} tokens"
        if prompt > context:
            raise ConfigError(
                f"{where}, but prompts may be {prompt} tokens: lower max_prompt_tokens to "
                f"≤ {context - reply} {knob}, or use a model with a longer context"
            )
        if prompt + reply > context:
            warnings.append(
                f"{where}, and a {prompt}-token prompt plus a {reply}-token reply is "
                f"{prompt + reply}: the longest replies run past it; lower max_prompt_tokens "
                f"to ≤ {context - reply} {knob} or max_new_tokens"
            )
    return warnings


def system_prompt_warnings(scenario: Any, seed: int = 0) -> list[str]:
    """For a chat app: one line per agent whose system prompt a front cut would remove, from
    one episode run here with the agents' default replies (see the module doc; an app that
    fails on them is checked up to its error); empty for other scenarios."""
    from marl_agents.llm.chat_app import ChatAppScenario

    if not isinstance(scenario, ChatAppScenario):
        return []
    from marl_agents.llm import prompt_fit
    from marl_agents.llm.constraints import ReplyBudgetError
    from scenarios.decisions import run_inline

    before = dict(prompt_fit.CUTS)
    prompt_fit.CUTS.clear()
    try:
        run_inline(scenario, lambda agent, obs: scenario.default_action(agent), seed)
    except ReplyBudgetError as exc:  # a schema whose shortest reply exceeds max_new_tokens
        raise ConfigError(str(exc)) from exc
    except Exception as exc:  # an app may not run on its default replies
        # the prompts made before the error are checked; training warns of later cuts as they
        # happen (prompt_fit) and reports the app's own errors
        log.info(
            "the prompt-budget trial episode stopped (%s: %s) after the calls it checked",
            type(exc).__name__,
            exc,
        )
    finally:
        cuts = dict(prompt_fit.CUTS)
        prompt_fit.CUTS.clear()
        prompt_fit.CUTS.update(before)
    return prompt_fit.system_cut_warnings(cuts)


__all__ = ["check_contexts", "model_context", "system_prompt_warnings"]
