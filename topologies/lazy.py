"""Lazy package exports: a package's public names load their module on first use.

A package's ``__init__`` lists its exports once, as imports under ``if TYPE_CHECKING:``
(``from pkg.module import Name as Name``: type checkers see the real types), and ends with
``__all__ = export_lazily(__name__)``. The names then import on first access
(``from pkg import Name``, ``pkg.Name``, ``dir(pkg)``), so importing the package loads
neither LangGraph, Ray nor torch. A name that is also a submodule's name
(``trainers.evaluate``) stays the exported object after the submodule is imported, as with
eager imports.
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from typing import Any

__all__ = ["LazyModule", "export_lazily"]


class LazyModule(types.ModuleType):
    """A package whose ``_lazy_exports`` (name → module) load on first attribute access."""

    def __getattr__(self, name: str) -> Any:
        module = self.__dict__.get("_lazy_exports", {}).get(name)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        super().__setattr__(name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        # importing submodule `pkg.name` sets `pkg.name = <module>`: keep the exported object
        exports = self.__dict__.get("_lazy_exports", {})
        if name in exports and getattr(value, "__name__", None) == f"{self.__name__}.{name}":
            value = getattr(importlib.import_module(exports[name]), name)
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__dict__.get("_lazy_exports", {})))


def type_checking_imports(source: str, where: str) -> dict[str, str]:
    """Name → module of the ``from module import name`` statements under the source's
    ``if TYPE_CHECKING:`` block."""
    exports: dict[str, str] = {}
    for stmt in ast.parse(source).body:
        if not (isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "TYPE_CHECKING"):
            continue
        for imp in stmt.body:
            if not (isinstance(imp, ast.ImportFrom) and imp.module and imp.level == 0):
                raise ValueError(
                    f"{where}:{imp.lineno}: the TYPE_CHECKING block lists exports; write each "
                    "as `from package.module import Name as Name`"
                )
            for alias in imp.names:
                name = alias.asname or alias.name
                if name in exports:
                    raise ValueError(
                        f"{where}:{imp.lineno}: {name!r} exported twice "
                        f"({exports[name]}, {imp.module}); export it from one module"
                    )
                exports[name] = imp.module
    return exports


def export_lazily(package: str) -> list[str]:
    """Export the names imported under ``package``'s ``if TYPE_CHECKING:`` block lazily;
    return them sorted (the package's ``__all__``).

    Example:
        >>> import topologies
        >>> "Topology" in topologies.__all__ and "Topology" in dir(topologies)
        True
    """
    module = sys.modules[package]
    spec = module.__spec__
    source = spec.loader.get_source(package) if spec and spec.loader else None
    if source is None:
        raise ImportError(
            f"{package}: export_lazily needs the package's source to read its exports"
        )
    exports = type_checking_imports(source, getattr(module, "__file__", package))
    if not exports:
        raise ValueError(f"{package}: no `if TYPE_CHECKING:` imports to export")
    module.__class__ = LazyModule
    module.__dict__["_lazy_exports"] = exports
    return sorted(exports)
