"""One error family: every exception class of the four packages is a ``MarlError`` or an
internal control-flow signal listed here, and run statuses recognise the project's errors by
type (``describe_error``).

The classes are found by parsing the modules (``ast``), so nothing heavy is imported: a class
is an exception when a base is a builtin exception, a name ending like one (``…Error``), or
another exception class of the packages; it is in the family when a base is ``MarlError`` or
a class of the family.
"""

from __future__ import annotations

import ast
import builtins
import textwrap
from pathlib import Path

import pytest

from topologies import MarlError

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("topologies", "scenarios", "marl_agents", "trainers")

#: control flow that never reaches a user (each docstring says where it is caught); the
#: ``BaseException`` ones must pass a node's ``except Exception``
INTERNAL = {
    "scenarios.alarm:EpisodeTimeout",
    "scenarios.bridge:EpisodeAborted",
    "scenarios.bridge:SkipNode",
    "scenarios.replay:Unsupported",
    "scenarios.replay:RecursionLimit",
    "scenarios.replay:DecisionLimit",
    "scenarios.replay:NodeFailed",
    "scenarios.stepped:_Fallback",
}

_ERROR_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt", "Warning")


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _is_builtin_exception(name: str) -> bool:
    obj = getattr(builtins, name, None)
    return isinstance(obj, type) and issubclass(obj, BaseException)


def exception_classes(root: Path) -> dict[str, bool]:
    """``module:Class`` → whether it is a ``MarlError``, for every exception class defined
    (at any depth) in the four packages under ``root``."""
    classes: list[tuple[str, str, list[str]]] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    classes.append((module, node.name, [_base_name(b) for b in node.bases]))
    exceptions: set[str] = set()
    family = {"MarlError"}
    changed = True
    while changed:  # a class of a class found in a later module: repeat until nothing changes
        changed = False
        for _, name, bases in classes:
            if name not in exceptions and any(
                b in exceptions or _is_builtin_exception(b) or b.endswith(_ERROR_SUFFIXES)
                for b in bases
            ):
                exceptions.add(name)
                changed = True
            if name not in family and any(b in family for b in bases):
                family.add(name)
                changed = True
    return {
        f"{module}:{name}": name in family
        for module, name, _ in classes
        if name in exceptions and f"{module}:{name}" != "topologies.errors:MarlError"
    }


def family_violations(root: Path) -> list[str]:
    """One line per exception class that is neither a ``MarlError`` nor in :data:`INTERNAL`."""
    return [
        f"{where} is not a MarlError: derive it from topologies.errors.MarlError (keeping its "
        "builtin base), or list it in tests/test_errors.py INTERNAL if no user ever sees it"
        for where, in_family in exception_classes(root).items()
        if not in_family and where not in INTERNAL
    ]


def test_every_exception_class_is_a_marl_error_or_internal() -> None:
    assert family_violations(ROOT) == []


def test_the_walk_finds_the_family_and_the_internal_classes() -> None:
    found = exception_classes(ROOT)
    for where in (  # direct, through a subclass, and across packages
        "trainers.configs.typed:ConfigError",
        "trainers.run.rollout_dump:RolloutDumpError",
        "marl_agents.llm.checkpoints:CheckpointError",
        "scenarios.bridge:BridgeError",
        "scenarios.in_flight:CallTimeout",
        "topologies.cli:LoadError",
    ):
        assert found[where] is True, where
    for where in INTERNAL:  # every listed class exists and stays outside the family
        assert found[where] is False, where


def test_a_class_outside_the_family_is_named(tmp_path: Path) -> None:
    pkg = tmp_path / "scenarios"
    pkg.mkdir()
    (pkg / "odd.py").write_text(
        textwrap.dedent(
            """
            from topologies.errors import MarlError

            class GoodError(MarlError, ValueError): ...
            class AlsoGood(GoodError): ...
            class BadError(KeyError): ...
            def f():
                class Inner(RuntimeError): ...
            """
        )
    )
    for package in ("topologies", "marl_agents", "trainers"):
        (tmp_path / package).mkdir()
    lines = family_violations(tmp_path)
    assert [line.split(" ")[0] for line in lines] == [
        "scenarios.odd:BadError",
        "scenarios.odd:Inner",
    ]


def test_the_family_keeps_its_builtin_bases() -> None:
    from marl_agents.pools import PoolError
    from scenarios.base import ScenarioError
    from topologies.errors import MarlError as defined
    from topologies.topology import TopologyError
    from trainers.configs.typed import ConfigError

    assert MarlError is defined
    for cls in (ConfigError, PoolError, ScenarioError, TopologyError):
        assert issubclass(cls, MarlError) and issubclass(cls, ValueError)
    with pytest.raises(ValueError, match=r"pools\.x"):  # old `except ValueError` still catches
        raise ConfigError("pools.x: bad")


class AppError(MarlError, RuntimeError):
    """A project error defined outside the four packages: recognised by type."""


def test_describe_error_picks_the_deepest_project_error_by_type() -> None:
    from trainers.configs.typed import ConfigError
    from trainers.run.outcome import describe_error

    try:
        try:
            try:
                raise AppError("judge 'j' timed out: raise judge_timeout_s")
            except AppError as exc:
                raise ConfigError("rewards.sources[0]: judge 'j' timed out") from exc
        except ConfigError as exc:
            raise RuntimeError("env runner failed") from exc
    except RuntimeError as exc:
        text = describe_error(exc)
    assert text == (
        "AppError: judge 'j' timed out: raise judge_timeout_s (through ConfigError ← RuntimeError)"
    )


def test_describe_error_passes_over_internal_signals() -> None:
    from scenarios.replay import Unsupported
    from trainers.run.outcome import describe_error

    try:
        try:
            raise KeyError("root")
        except KeyError as exc:
            raise Unsupported("a node returned None") from exc
    except Unsupported as exc:
        text = describe_error(exc)
    assert text == "KeyError: 'root' (through Unsupported)"  # no MarlError: the root cause
