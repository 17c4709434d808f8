"""Import the object a ``package.module:attr`` reference names; errors are one line with the fix.

Shared by ``marl topology show module:attr`` and scenario references
(:mod:`scenarios.registry`); each caller wraps :class:`ImportRefError` in its own error type.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from topologies.errors import MarlError


class ImportRefError(MarlError, ValueError):
    """A reference whose module cannot be imported or lacks the attribute."""


def one_line(exc: BaseException) -> str:
    """``Type: message`` of an exception on one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def import_attr(
    module_name: str,
    attr: str,
    expected: str,
    hint: Callable[[Any], str] | None = None,
) -> Any:
    """``module_name``'s (dotted) attribute ``attr``.

    Args:
        module_name: the module to import.
        attr: the attribute, dotted for nested ones (``Cls.attr``).
        expected: what the attribute should be, for the message of a missing one.
        hint: module → extra text for a missing attribute (e.g. what the module has).

    Raises:
        ImportRefError: the module is not on ``sys.path``, needs a package that is not
            installed, raises while importing, or lacks ``attr``.
    """
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise ImportRefError(
                f"cannot import module {module_name!r}: check the name: no module named "
                f"{missing!r} on this process's sys.path: install its package (pip install -e .),"
                " run from the directory that holds it, or add that directory to PYTHONPATH"
            ) from None
        raise ImportRefError(
            f"importing {module_name!r} failed: no module named {missing!r}; install it "
            "(the module needs it)"
        ) from None
    except Exception as exc:  # user code: one line, with the fix
        raise ImportRefError(
            f"importing {module_name!r} failed ({one_line(exc)}): fix the module, which "
            f"raised {type(exc).__name__} on import"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            extra = hint(module) if hint is not None else ""
            raise ImportRefError(
                f"module {module_name!r} has no attribute {attr!r}{extra}: name {expected}"
            )
        obj = getattr(obj, part)
    return obj
