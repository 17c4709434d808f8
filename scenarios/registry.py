"""Scenario names: registered ids (``delegate``, ``delegate-v0``) and import references.

A scenario is named either by a registered id (``@register`` on the built-ins; versioned ids
``<name>-v<version>``, the bare name meaning the latest version) or by an **import reference**
``package.module:attr`` to a user's own scenario. Every process that needs the scenario — the
driver, Ray's env runners, credit workers, Tune trials — rebuilds it from the name with
:func:`build`, so a reference is re-imported in each process and nothing depends on a
per-process registry.

What ``attr`` may name, and how :func:`build` turns it into a :class:`Scenario`:

* a ``Scenario`` subclass: called with the ``scenario_kwargs`` as keyword arguments, plus
  ``topology=`` when a topology is given (when none is given the class's own default applies);
* a function (or any callable) returning a ``Scenario``: called the same way, so a zero-argument
  function takes neither a topology nor ``scenario_kwargs``;
* a ``Scenario`` instance: used as it is (shared by the environments of a process, so keep
  per-episode state in the graph's state); giving it a topology or ``scenario_kwargs`` is an
  error that names the fix (reference a class or a function instead);
* a function or class returning a **PettingZoo** ``ParallelEnv`` or ``AECEnv`` (e.g.
  ``mpe2.simple_spread_v3:parallel_env``): called with the ``scenario_kwargs`` and wrapped in
  :class:`scenarios.pettingzoo_env.PettingZooScenario`, which calls it again for every episode.

A class or function that does not accept ``topology`` runs on its own graph: giving it one is
an error; likewise a ``scenario_kwargs`` key it does not accept. The reference text is the one
piece of code that parses and loads scenario names (:func:`parse_reference`, :func:`load`,
:func:`build`); :func:`label` is the short name used in run directories.

Example:
    >>> build("delegate", "star:3").id()
    'delegate-v0'
    >>> label("myapp.team:scenario")
    'team.scenario'
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from scenarios.base import Scenario, ScenarioError
from topologies import TopologyError
from topologies.imports import ImportRefError, import_attr, one_line

REGISTRY: dict[str, type[Scenario]] = {}

#: separates the module from the attribute in an import reference.
REF_SEP = ":"

REF_HELP = (
    "a registered scenario name (marl scenarios lists them) or an import reference "
    "'package.module:attr' to a Scenario subclass, a Scenario instance or a function returning one "
    "(or returning a PettingZoo ParallelEnv / AECEnv)"
)


def register(cls: type[Scenario]) -> type[Scenario]:
    """Class decorator: register a scenario under ``<name>-v<version>`` (and its bare name)."""
    sid = cls.id()
    if sid in REGISTRY and not _same_class(REGISTRY[sid], cls):
        raise ScenarioError(f"scenario id {sid!r} is taken: bump {cls.__name__}.version")
    REGISTRY[sid] = cls
    latest = REGISTRY.get(cls.name)
    if latest is None or latest.version <= cls.version:
        REGISTRY[cls.name] = cls
    return cls


def _same_class(a: type, b: type) -> bool:
    """``a`` is ``b``, or the same class of the same file imported under another module name
    (``tests.toys`` and ``toys`` when a folder is on ``sys.path`` too)."""
    if a is b:
        return True
    files = [getattr(sys.modules.get(c.__module__), "__file__", None) for c in (a, b)]
    return a.__qualname__ == b.__qualname__ and files[0] is not None and files[0] == files[1]


def _load_builtins() -> None:
    import scenarios.builtin  # noqa: F401  (registers the built-in scenarios)


# ----- names and references --------------------------------------------------------------------
def is_reference(name: Any) -> bool:
    """Whether ``name`` is an import reference (``package.module:attr``) rather than an id."""
    return isinstance(name, str) and REF_SEP in name


def parse_reference(ref: str) -> tuple[str, str]:
    """``(module, attr)`` of ``"package.module:attr"`` (``attr`` may be dotted: ``Cls.attr``).

    Raises:
        ScenarioError: a malformed reference, or one into ``__main__`` (which no other process
            can import); the message names the fix.
    """
    module, _, attr = ref.strip().partition(REF_SEP)
    if not (_dotted(module) and _dotted(attr)):
        raise ScenarioError(
            f"scenario reference {ref!r} is malformed: write 'package.module:attr' "
            "(e.g. 'myapp.team:scenario'), dotted Python identifiers on both sides of one ':'"
        )
    if module == "__main__":
        raise ScenarioError(f"scenario reference {ref!r}: {_main_fix(attr)}")
    return module, attr


def _dotted(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _main_fix(attr: str) -> str:
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    stem = os.path.splitext(os.path.basename(script))[0] if script else None
    where = (
        f"'{stem}:{attr}' with the script's own code under if __name__ == '__main__':, or "
        if stem and stem.isidentifier() and stem != "__main__"
        else ""
    )
    return (
        "__main__ (the script being run) cannot be imported by Ray's worker processes, which "
        f"rebuild the scenario by importing it: move it into a module and reference that: "
        f"{where}'mymodule:{attr}' for a mymodule.py next to the script"
    )


def label(name: str) -> str:
    """A short name for run directories: an id as given; ``mod.attr`` for ``pkg.mod:attr``."""
    if not is_reference(name):
        return name
    module, _, attr = name.strip().partition(REF_SEP)
    return f"{module.rsplit('.', 1)[-1]}.{attr}"


def load(ref: str) -> type[Scenario] | Scenario | Callable[..., Scenario]:
    """Import the object an import reference names (in this process).

    Returns:
        A ``Scenario`` subclass, a ``Scenario`` instance or a callable (what it returns is
        checked by :func:`build`).

    Raises:
        ScenarioError: a malformed reference, a module that cannot be imported (or raises while
            importing), a missing attribute, or an object of another kind; one line naming the
            fix.
    """
    module_name, attr = parse_reference(ref)
    where = f"scenario reference {ref!r}"
    try:
        obj = import_attr(
            module_name,
            attr,
            "a Scenario subclass, a Scenario instance or a function returning one",
            hint=_hint,
        )
    except ImportRefError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    if isinstance(obj, type):
        if _pettingzoo_class(obj):
            return obj  # called, and what it returns wrapped, by build()
        if not issubclass(obj, Scenario):
            raise ScenarioError(
                f"{where} is the class {obj.__name__}, which is not a scenarios.Scenario "
                "subclass: subclass Scenario, or name a function returning a Scenario "
                "(e.g. scenarios.custom.GraphScenario(...))"
            )
        if inspect.isabstract(obj):
            todo = ", ".join(sorted(obj.__abstractmethods__))
            raise ScenarioError(f"{where}: {obj.__name__} is abstract: implement {todo}")
        if not isinstance(getattr(obj, "name", None), str):
            raise ScenarioError(
                f"{where}: {obj.__name__} has no name: set the class attribute "
                f"name = '{obj.__name__.lower()}' (run names and metrics use it)"
            )
        return obj
    if isinstance(obj, Scenario) or callable(obj):
        return obj
    raise ScenarioError(
        f"{where} is of type {type(obj).__name__}, not a scenario: name a Scenario subclass, a "
        "Scenario instance or a function returning one"
    )


def _pettingzoo_class(obj: type) -> bool:
    from pettingzoo import AECEnv, ParallelEnv

    return issubclass(obj, (ParallelEnv, AECEnv))


def _hint(module: Any) -> str:
    found = _candidates(module)
    return f" (it has {', '.join(found)})" if found else ""


def _candidates(module: Any) -> list[str]:
    """Attributes of ``module`` a reference could name (Scenario classes and instances)."""
    out = []
    for key, value in vars(module).items():
        if key.startswith("_"):
            continue
        own = isinstance(value, type) and value.__module__ == module.__name__
        if (own and issubclass(value, Scenario)) or isinstance(value, Scenario):
            out.append(key)
    return sorted(out)[:8]


def _accepts(fn: Callable[..., Any]) -> tuple[set[str], bool]:
    """(keyword parameter names, takes ``**kwargs``) of a class or function."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return set(), True
    names = {
        p.name
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    return names, any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def _build_reference(ref: str, topology: Any, kwargs: dict[str, Any]) -> Scenario:
    target = load(ref)
    where = f"scenario reference {ref!r}"
    if isinstance(target, Scenario):
        given = (["topology"] if topology is not None else []) + (
            [f"scenario_kwargs {sorted(kwargs)}"] if kwargs else []
        )
        if given:
            raise ScenarioError(
                f"{where} is a Scenario instance (already built), so it takes no "
                f"{' and no '.join(given)}: remove them, or reference a Scenario subclass or a "
                "function that accepts them"
            )
        return target
    names, var_kw = _accepts(target)
    args = dict(kwargs)
    if topology is not None:
        if not (var_kw or "topology" in names):
            raise ScenarioError(
                f"{where} takes no topology (its graph fixes the team): remove the topology, or "
                "give the class/function a topology parameter"
            )
        args["topology"] = topology
    unknown = sorted(k for k in kwargs if not (var_kw or k in names))
    if unknown:
        accepted = ", ".join(sorted(names - {"self", "topology"})) or "none"
        raise ScenarioError(
            f"{where} does not accept scenario_kwargs {unknown} (it accepts: {accepted}): "
            "remove them or add the parameters"
        )
    try:
        made = target(**args)
    except (ScenarioError, TopologyError) as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    except Exception as exc:  # user code: one line, with where it came from
        call = ", ".join(f"{k}={v!r}" for k, v in args.items())
        raise ScenarioError(
            f"{where}: calling it with ({call}) raised {one_line(exc)}: fix the call "
            "(scenario_kwargs, topology) or the code it runs"
        ) from None
    if not isinstance(made, Scenario):
        from scenarios.pettingzoo_env import PettingZooScenario, is_pettingzoo_env

        if is_pettingzoo_env(made):
            return PettingZooScenario(ref, kwargs, made=made)
        raise ScenarioError(
            f"{where} returned an object of type {type(made).__name__}, not a Scenario: return a "
            "Scenario instance (e.g. scenarios.custom.GraphScenario(...)) or a PettingZoo "
            "ParallelEnv / AECEnv"
        )
    return made


# ----- the registry ------------------------------------------------------------------------------
def get(name: str) -> type[Scenario]:
    """The registered class of ``name`` (an id, not an import reference).

    Raises:
        ScenarioError: an unknown name (the message lists the registered ones).
    """
    _load_builtins()
    if name not in REGISTRY:
        known = ", ".join(sorted(k for k in REGISTRY if "-v" in k))
        raise ScenarioError(
            f"unknown scenario {name!r}: registered scenarios are {known}; for your own "
            "scenario give an import reference 'package.module:attr'"
        )
    return REGISTRY[name]


def scenario_class(name: str, topology: Any = None, **kwargs: Any) -> type[Scenario]:
    """The class of the scenario ``name`` builds (a function reference is called to find out)."""
    if not is_reference(name):
        return get(name)
    target = load(name)
    if isinstance(target, type):
        return target
    if isinstance(target, Scenario):
        return type(target)
    return type(build(name, topology, **kwargs))


def build(name: str, topology: Any = None, **kwargs: Any) -> Scenario:
    """The scenario ``name`` names (no environment around it), built in this process.

    Args:
        name: a registered id, or an import reference ``package.module:attr`` (see the module
            doc for what it may name and how ``topology`` and ``kwargs`` are passed).
        topology: a topology spec, ``Topology`` or ``None`` (the scenario's default).
        kwargs: the scenario's keyword arguments (``scenario_kwargs``).

    Raises:
        ScenarioError: an unknown name, a bad reference or arguments the scenario rejects.
    """
    if is_reference(name):
        return _build_reference(name, topology, kwargs)
    cls = get(name)
    return cls(topology=topology if topology is not None else cls.default_topology, **kwargs)


def list_scenarios() -> list[type[Scenario]]:
    """Registered scenario classes, one per versioned id, sorted by id."""
    _load_builtins()
    return [REGISTRY[k] for k in sorted(k for k in REGISTRY if "-v" in k)]


def make(name: str, topology: Any = None, max_steps: int | None = None, **kwargs: Any) -> Any:
    """Build the :class:`~scenarios.graph_env.GraphEnv` of a registered or referenced scenario.

    Example:
        >>> env = make("delegate", topology="star:3")  # doctest: +SKIP
        >>> env = make("myapp.team:scenario")  # doctest: +SKIP
    """
    from scenarios.graph_env import GraphEnv

    return GraphEnv(build(name, topology, **kwargs), max_steps=max_steps)


# ----- other processes ---------------------------------------------------------------------------
_PROBE = """
import importlib.util, json, sys
sys.path[:] = [p for p in json.loads(sys.argv[1]) + sys.path[1:] if p]
spec = importlib.util.find_spec(sys.argv[2])
print(json.dumps(None if spec is None else
                 [spec.origin, list(spec.submodule_search_locations or [])]))
"""


def unreachable_reason(ref: str, extra_paths: Iterable[str] = ()) -> str | None:
    """Why a fresh Python process could not import ``ref`` as this one does (``None``: it can).

    A fresh process of this interpreter with this environment (``PYTHONPATH``, installed and
    editable packages) plus ``extra_paths`` on its ``sys.path`` — what Ray gives its workers —
    must find the reference's top-level package at the same place as this process. Only the
    package's location is looked up there (its code does not run). ``ref`` must already load
    in this process (:func:`load`).
    """
    module_name, _ = parse_reference(ref)
    module = importlib.import_module(module_name)
    here = getattr(module, "__file__", None)
    if here is None:
        return None  # a namespace-only or built-in module: nothing to compare
    top = module_name.split(".", 1)[0]
    extra = [os.path.abspath(p) for p in extra_paths if p]
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE, json.dumps(extra), top],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:  # the check itself failed: say so
        warnings.warn(
            f"scenario reference {ref!r}: could not check that Ray's worker processes can import "
            f"it ({one_line(exc)}); if they cannot, their env fails to build",
            stacklevel=2,
        )
        return None
    found = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    real = os.path.realpath(here)
    home = _import_root(module_name, here)
    fix = (
        f"install its package (pip install -e .), add {home} to PYTHONPATH before Ray starts, "
        "or let trainers.run.loop.train start Ray (it gives the workers this process's sys.path)"
    )
    if found is None:
        return (
            f"module {module_name!r} is imported from {home}, which Ray's worker processes do "
            f"not have on their path (they see installed packages, PYTHONPATH and the driver's "
            f"directory, not sys.path entries added at run time): {fix}"
        )
    origin, locations = found
    roots = [os.path.realpath(p) for p in locations] or [os.path.realpath(origin or "")]
    if locations and any(real.startswith(r + os.sep) for r in roots):
        return None
    if not locations and roots[0] == real:
        return None
    elsewhere = locations[0] if locations else origin
    return (
        f"Ray's worker processes would import {top!r} from {elsewhere}, not from {home} as this "
        f"process does: {fix}"
    )


def _import_root(module_name: str, file: str) -> str:
    """The ``sys.path`` directory ``module_name`` was imported from (given its file)."""
    path = os.path.dirname(os.path.abspath(file))
    depth = module_name.count(".") + (1 if os.path.basename(file).startswith("__init__.") else 0)
    for _ in range(depth):
        path = os.path.dirname(path)
    return path
