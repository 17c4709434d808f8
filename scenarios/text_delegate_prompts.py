"""What ``text-delegate``'s agents read: the orchestrator's prompt and the subagents' tasks.

:class:`DelegatePrompts` (a mixin of :class:`~scenarios.text_delegate.TextDelegate`) renders
the orchestrator's chat prompt (parts, their status, reports, the last format error, the
round), its token ids (with the opened call in prefill mode) and each subagent's prompt; it
reads ``parts``, ``n_workers``, ``prefill``, ``max_rounds``, ``skills``, ``tokenizer`` and
``spaces`` from the scenario.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from scenarios.delegate import SOLVED
from scenarios.text_delegate_parse import ASSIGN
from scenarios.text_space import chat_text
from scenarios.toolcalls import render_tool_call

TYPE_NAMES = ("math", "code", "text", "data", "plan", "web", "sql", "art")


class DelegatePrompts:
    """Prompt rendering of ``text-delegate`` (see the module doc)."""

    parts: int
    n_workers: int
    prefill: bool
    max_rounds: int
    skills: np.ndarray
    tokenizer: Any
    spaces: Any

    def type_name(self, type_: int) -> str:
        """The name of part type ``type_`` in prompts (``math``, ``code``, …)."""
        return TYPE_NAMES[type_]

    def prefill_text(self, part: int, state: Mapping[str, Any]) -> str:
        """The opened call the prompt ends with in prefill mode (it names the part's type)."""
        name = self.type_name(state["types"][part])
        return (
            '<tool>{"name": "assign", "arguments": {"part": '
            + f'{part}, "type": "{name}", "worker": '
        )

    def orchestrator_messages(self, state: Mapping[str, Any]) -> list[dict[str, str]]:
        """The chat messages of the orchestrator's prompt (before the generation header)."""
        workers = ", ".join(str(w) for w in range(self.n_workers))
        system = (
            f"You are the orchestrator. Workers: {workers}. Assign each part to one worker: "
            '<tool>{"name": "assign", "arguments": {"part": P, "worker": W}}</tool>'
        )
        if self.prefill:
            system = f"You are the orchestrator. Workers: {workers}. Pick a worker for the part."
        lines = []
        for i in range(self.parts):
            status = ("pending", "failed", "solved")[state["status"][i]]
            lines.append(f"part {i}: {self.type_name(state['types'][i])} {status}")
        lines.extend(state.get("reports", []))
        if state.get("last_error"):
            lines.append(f"error: {state['last_error']}")
        if self.max_rounds > 1:
            lines.append(f"round {state['decisions'] + 1} of {self.max_rounds}")
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": "\n".join(lines)},
        ]

    def prompt_ids(self, state: Mapping[str, Any]) -> list[int]:
        """The orchestrator's prompt token ids (chat template, generation header, prefill)."""
        text = chat_text(self.tokenizer, self.orchestrator_messages(state))
        first = self.first_unsolved(state)
        if self.prefill and first is not None:
            text += self.prefill_text(first, state)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def orchestrator_obs(self, state: Mapping[str, Any]) -> np.ndarray:
        """The observation: :meth:`prompt_ids` encoded by :attr:`spaces`."""
        return self.spaces.encode_prompt(self.prompt_ids(state))

    def worker_prompt(self, worker: int, part: int, type_: int) -> str:
        """What subagent ``worker`` is asked for ``part``."""
        return (
            f"You are worker {worker}. Solve part {part}, of type {self.type_name(type_)}. "
            f'Answer <tool>{{"name": "solve", "arguments": {{"method": "<type>"}}}}</tool>'
        )

    def first_unsolved(self, state: Mapping[str, Any]) -> int | None:
        """The first part not solved yet (``None``: all are)."""
        return next((i for i in range(self.parts) if state["status"][i] != SOLVED), None)

    def oracle_text(self, state: Mapping[str, Any]) -> str:
        """What an optimal orchestrator writes in ``state`` (for tests and demos)."""
        best = self.skills.argmax(axis=0)
        pending = [i for i in range(self.parts) if state["status"][i] != SOLVED]
        if self.prefill:
            return f"{int(best[state['types'][pending[0]]])}" if pending else ""
        return "".join(
            render_tool_call(ASSIGN, {"part": i, "worker": int(best[state["types"][i]])})
            for i in pending
        )
