"""Moved to :mod:`scenarios.text_space` (environments render prompts); re-exported here.

``from marl_agents.llm.text_space import TextSpaces`` keeps working.
"""

from __future__ import annotations

from scenarios.text_space import ID_DTYPE, Prompt, TextSpaces, encode_prompt, lengths

__all__ = ["ID_DTYPE", "Prompt", "TextSpaces", "encode_prompt", "lengths"]
