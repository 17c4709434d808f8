"""Scenario registry: versioned ids (``delegate-v0``), ``make`` and ``list_scenarios``."""

from __future__ import annotations

from typing import Any

from scenarios.base import Scenario, ScenarioError

REGISTRY: dict[str, type[Scenario]] = {}


def register(cls: type[Scenario]) -> type[Scenario]:
    """Class decorator: register a scenario under ``<name>-v<version>`` (and its bare name)."""
    sid = cls.id()
    if sid in REGISTRY and REGISTRY[sid] is not cls:
        raise ScenarioError(f"scenario id {sid!r} is taken: bump {cls.__name__}.version")
    REGISTRY[sid] = cls
    latest = REGISTRY.get(cls.name)
    if latest is None or latest.version <= cls.version:
        REGISTRY[cls.name] = cls
    return cls


def _load_builtins() -> None:
    import scenarios.builtin  # noqa: F401  (registers the built-in scenarios)


def get(name: str) -> type[Scenario]:
    _load_builtins()
    if name not in REGISTRY:
        known = ", ".join(sorted(k for k in REGISTRY if "-v" in k))
        raise ScenarioError(f"unknown scenario {name!r}: registered scenarios are {known}")
    return REGISTRY[name]


def build(name: str, topology: Any = None, **kwargs: Any) -> Scenario:
    """Instantiate a registered scenario (no environment around it)."""
    cls = get(name)
    return cls(topology=topology if topology is not None else cls.default_topology, **kwargs)


def list_scenarios() -> list[type[Scenario]]:
    """Registered scenario classes, one per versioned id, sorted by id."""
    _load_builtins()
    return [REGISTRY[k] for k in sorted(k for k in REGISTRY if "-v" in k)]


def make(name: str, topology: Any = None, max_steps: int | None = None, **kwargs: Any) -> Any:
    """Build the :class:`~scenarios.engine.GraphEnv` of a registered scenario.

    Example:
        >>> env = make("delegate", topology="star:3")  # doctest: +SKIP
    """
    from scenarios.engine import GraphEnv

    return GraphEnv(build(name, topology, **kwargs), max_steps=max_steps)
