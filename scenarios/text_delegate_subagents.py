"""``text-delegate``'s subagents: frozen solvers that run inside the environment.

A subagent answers ``respond(prompts, types) -> [text]``, one ``solve`` call per prompt,
deterministically. ``subagents`` specs (``"scripted"``, ``{"type": "hf", ...}``,
``{"type": "vllm", ...}``) are checked by :func:`check_subagents` when the scenario is built and
turned into subagents by :func:`build_subagent` on first use. ``scenarios`` never imports
``marl_agents``: the language-model backends are plugged in with
:func:`register_subagent_backend` (by :mod:`marl_agents.llm.subagents`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scenarios.base import ScenarioError
from scenarios.toolcalls import parse_tool_calls, render_tool_call

SOLVE = "solve"


class ScriptedSubagent:
    """Always answers with the method matching the part's type."""

    def respond(self, prompts: Sequence[str], types: Sequence[str]) -> list[str]:
        return [render_tool_call(SOLVE, {"method": t}) for t in types]


#: subagent types a spec may name; ``scripted`` is built in, the others run a language model.
SUBAGENT_TYPES: tuple[str, ...] = ("scripted", "hf", "vllm")
_SPEC_KEYS: dict[str, tuple[str, ...]] = {
    "scripted": ("type",),
    "hf": ("type", "path", "seed", "max_new_tokens"),
    "vllm": ("type", "url", "model", "tokenizer", "max_new_tokens"),
}
#: subagent type → factory ``spec -> subagent`` (an object with ``respond(prompts, types)``
#: returning one answer text per prompt, deterministically).
SUBAGENT_BACKENDS: dict[str, Callable[[Mapping[str, Any]], Any]] = {}


def register_subagent_backend(kind: str, factory: Callable[[Mapping[str, Any]], Any]) -> None:
    """Plug in the language-model backend serving subagents of type ``kind``.

    ``scenarios`` does not import ``marl_agents`` (dependencies point the other way), so the
    ``hf`` and ``vllm`` backends are registered by :mod:`marl_agents.llm.subagents` when it is
    imported (the trainers and the GRPO environment import it).

    Args:
        kind: a type of :data:`SUBAGENT_TYPES` other than ``scripted``.
        factory: builds the subagent of one normalised spec (see :func:`check_subagents`).
    """
    if kind not in SUBAGENT_TYPES or kind == "scripted":
        raise ValueError(f"kind must be one of {SUBAGENT_TYPES[1:]}, got {kind!r}")
    SUBAGENT_BACKENDS[kind] = factory


def check_subagents(spec: Any, n_workers: int) -> list[dict[str, Any]]:
    """Normalise ``subagents`` to one plain dict per worker.

    Raises:
        ScenarioError: an unknown type or key, a missing or non-existent path, a missing url or
            model, a bad ``max_new_tokens``, or a list of the wrong length.
    """
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if len(items) == 1:
        items = items * n_workers
    if len(items) != n_workers:
        raise ScenarioError(
            f"subagents lists {len(items)} specs for {n_workers} workers: give one spec (or a "
            "list of one) for all workers, or exactly one per worker"
        )
    out = []
    for i, item in enumerate(items):
        d = {"type": item} if isinstance(item, str) else dict(item or {})
        kind = d.get("type")
        if kind not in SUBAGENT_TYPES:
            raise ScenarioError(
                f"subagents[{i}]: unknown type {kind!r}: use 'scripted', "
                "{'type': 'hf', 'path': ...} or {'type': 'vllm', 'url': ..., 'model': ...}"
            )
        unknown = sorted(set(d) - set(_SPEC_KEYS[kind]))
        if unknown:
            raise ScenarioError(
                f"subagents[{i}]: unknown key(s) {unknown} for a {kind} subagent: valid are "
                f"{', '.join(_SPEC_KEYS[kind])}"
            )
        if kind == "hf":
            path = d.get("path")
            if not path or (path != "tiny" and not (Path(path) / "config.json").exists()):
                raise ScenarioError(
                    f"subagents[{i}]: an hf subagent needs 'path': a saved HF model directory "
                    f"(with config.json) or 'tiny'; got {path!r}"
                )
        elif kind == "vllm":
            missing = [k for k in ("url", "model") if not d.get(k)]
            if missing:
                raise ScenarioError(
                    f"subagents[{i}]: a vllm subagent needs {missing} (server url and served "
                    "model name; 'tokenizer' defaults to the model name); start a server with "
                    "marl_agents.llm.VLLMServer"
                )
        budget = d.get("max_new_tokens", 48)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ScenarioError(f"subagents[{i}].max_new_tokens must be an integer ≥ 1")
        out.append(d)
    return out


def build_subagent(spec: Mapping[str, Any]) -> Any:
    """The subagent of one normalised spec (``scripted``, or a registered LLM backend).

    Raises:
        ScenarioError: an LLM type whose backend is not registered in this process.
    """
    kind = spec["type"]
    if kind == "scripted":
        return ScriptedSubagent()
    factory = SUBAGENT_BACKENDS.get(kind)
    if factory is None:
        raise ScenarioError(
            f"subagent type {kind!r} runs a language model, and no backend is registered for "
            "it in this process: `import marl_agents.llm.subagents` first (it registers 'hf' "
            "and 'vllm'; the trainers do this)"
        )
    return factory(spec)


def solve_method(text: str) -> str | None:
    """The ``method`` of the first valid ``solve`` call in a subagent's answer."""
    for call in parse_tool_calls(text, tool_names={SOLVE}).tool_calls:
        method = call.arguments.get("method")
        if isinstance(method, str):
            return method
    return None
