"""Private names of LangGraph/LangChain and CPython appear only in the compat modules.

:mod:`topologies.langgraph_compat` and :mod:`topologies.stdlib_compat` hold every assumption
about another library's internals, each pinned by a test; this test parses (``ast``) every
module of the four packages and names ``path:line`` for any private name reached elsewhere:

* an import of a module with a private part (``langgraph._internal``, ``_signal``) or of a
  private name (``from langgraph.x import _y``) from LangGraph, LangChain or the stdlib;
* an attribute starting with ``_`` (not a dunder) read from a name bound to a LangGraph or
  LangChain import (``Command._update_as_tuples``, ``BaseTool._arun``), or from ``asyncio`` /
  ``signal`` (``asyncio._get_running_loop``).

Overriding a LangChain base class's documented hooks (``super()._agenerate`` in a chat model)
is not reached from an imported name and is not flagged; neither is ``sys._getframe``, a
documented function of :mod:`sys`.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("topologies", "scenarios", "marl_agents", "trainers")
COMPAT = {Path("topologies/langgraph_compat.py"), Path("topologies/stdlib_compat.py")}
#: libraries whose private names only the compat modules may touch
GUARDED = ("langgraph", "langchain", "langchain_core")
#: stdlib modules whose private attributes only the compat modules may touch
STDLIB = ("asyncio", "signal")


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _guarded(module: str) -> bool:
    top = module.split(".")[0]
    return top in GUARDED or top.startswith("langchain") or top in STDLIB


def private_uses(source: str, where: str) -> list[str]:
    """``where:line: what`` for every private name of a guarded library used in ``source``."""
    tree = ast.parse(source, where)
    bound: set[str] = set()  # names bound to guarded modules or their members
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] != "__future__" and any(_private(p) for p in parts):
                    top = parts[0]
                    if _guarded(alias.name) or _private(top):
                        out.append(f"{where}:{node.lineno}: import {alias.name}")
                if _guarded(alias.name):
                    bound.add(alias.asname or parts[0])
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            parts = node.module.split(".")
            guarded = _guarded(node.module) or _private(parts[0])
            for alias in node.names:
                if guarded and (any(_private(p) for p in parts) or _private(alias.name)):
                    out.append(f"{where}:{node.lineno}: from {node.module} import {alias.name}")
                if _guarded(node.module):
                    bound.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            chain = [node.attr]
            while isinstance(root, ast.Attribute):
                chain.append(root.attr)
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                dotted = ".".join([root.id, *reversed(chain)])
                out.append(f"{where}:{node.lineno}: {dotted}")
    return sorted(set(out), key=lambda u: int(u.split(":")[1]))


def violations(root: Path) -> list[str]:
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if rel not in COMPAT:
                out += private_uses(path.read_text(), str(rel))
    return out


def test_private_names_only_in_the_compat_modules() -> None:
    assert violations(ROOT) == [], (
        "move each use behind a function in topologies/langgraph_compat.py or "
        "topologies/stdlib_compat.py, with a pinning test"
    )


def test_the_compat_modules_are_where_the_private_names_are() -> None:
    found = [u for path in sorted(COMPAT) for u in private_uses((ROOT / path).read_text(), "m")]
    assert any("langgraph._internal" in u for u in found)
    assert any("_signal" in u for u in found) and any("asyncio._" in u for u in found)


def test_a_violation_names_the_file_the_line_and_the_name() -> None:
    source = textwrap.dedent(
        """
        import asyncio
        import _signal
        from langgraph._internal._runnable import RunnableCallable
        from langgraph.types import Command, _private_helper
        import langgraph.pregel._utils as utils
        from langchain_core.tools import BaseTool

        loop = asyncio._get_running_loop()
        updates = Command(update={})._update_as_tuples()  # a call's result: not a bound name
        arun = BaseTool._arun
        fine = asyncio.get_running_loop, BaseTool.invoke, Command.__init__
        """
    )
    assert private_uses(source, "pkg/m.py") == [
        "pkg/m.py:3: import _signal",
        "pkg/m.py:4: from langgraph._internal._runnable import RunnableCallable",
        "pkg/m.py:5: from langgraph.types import _private_helper",
        "pkg/m.py:6: import langgraph.pregel._utils",
        "pkg/m.py:9: asyncio._get_running_loop",
        "pkg/m.py:11: BaseTool._arun",
    ]
