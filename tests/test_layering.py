"""The package layering and one import path per public name, checked from the source.

Dependencies point one way, ``topologies`` ← ``scenarios`` ← ``marl_agents`` ← ``trainers``:
a module imports only its own package and the packages below it. Every import counts — at
module level, inside functions (lazy imports), under ``TYPE_CHECKING`` — found by parsing the
modules (``ast``), so nothing has to be imported to check. A module's ``__all__`` lists only
names it defines; a package's ``__init__`` exports names of its own modules only.
"""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("topologies", "scenarios", "marl_agents", "trainers")


def modules(root: Path) -> Iterator[tuple[str, Path]]:
    """(dotted module name, path) of every module of the four packages under ``root``."""
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def imports(name: str, path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """(line, imported module, names) of every import statement anywhere in the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module, [a.name for a in node.names]


def layering_violations(root: Path) -> list[str]:
    """``path:line: module imports X (allowed: ...)`` for every import against the layering."""
    out = []
    for name, path in modules(root):
        rank = LAYERS.index(name.split(".")[0])
        for line, module, _ in imports(name, path):
            top = module.split(".")[0]
            if top in LAYERS and LAYERS.index(top) > rank:
                allowed = ", ".join(LAYERS[: rank + 1])
                out.append(
                    f"{path.relative_to(root)}:{line}: {name} imports {module} "
                    f"({name.split('.')[0]} may import {allowed} only)"
                )
    return out


def export_violations(root: Path) -> list[str]:
    """Names exported (``__all__``, or a package's ``TYPE_CHECKING`` export list) from a
    module that does not define them: each public name has one import path."""
    out = []
    for name, path in modules(root):
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        imported: dict[str, tuple[int, str]] = {}
        exported: set[str] = set()
        for stmt in tree.body:
            body = stmt.body if isinstance(stmt, ast.If) else [stmt]
            for node in body:
                if isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        imported[alias.asname or alias.name] = (node.lineno, node.module)
                        if is_package and alias.asname == alias.name:  # `X as X`: an export
                            exported.add(alias.name)
                targets = getattr(node, "targets", [])
                names_all = any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)
                if names_all and isinstance(node.value, ast.List | ast.Tuple):
                    exported |= {ast.literal_eval(e) for e in node.value.elts}
        for export in sorted(exported & imported.keys()):
            line, source = imported[export]
            own = source.startswith(f"{name}.") if is_package else False
            if not own:
                out.append(
                    f"{path.relative_to(root)}:{line}: {name} exports {export} from {source}; "
                    f"import it from {source} instead"
                )
    return out


#: the floors of ``trainers``, bottom up: a module imports its own floor and the floors below.
#: Inside a floor, a subpackage imports only itself (no sideways arrows between packages).
TRAINERS_FLOORS: tuple[tuple[str, ...], ...] = (
    ("trainers.configs", "trainers.rllib_compat"),  # typed configs; RLlib's internals
    ("trainers.signals", "trainers.credit"),  # what episodes report; credit estimators, replays
    ("trainers.learners",),  # lean learner, PPO batch, credit learner, value norm
    ("trainers.sampling",),  # env runners: no learner code but the shared categorical math
    ("trainers.ppo",),  # RLlib's PPO, its syncs leaving frozen modules out (GRPO builds on it)
    ("trainers.grpo",),  # GRPO loss, learner, connectors, algorithm
    ("trainers.cluster", "trainers.budgets", "trainers.plan", "trainers.algo"),  # config → Ray
    ("trainers.run",),  # the training loop, run directories, display, resume, exports
    ("trainers.rollouts", "trainers.passk", "trainers.evaluate", "trainers.finetune"),
    ("trainers.serve",),  # a trained run's policies behind the gateway (loads as evaluate does)
    # (opponents: marl eval against a random or frozen opponent, a command of its own)
    (
        "trainers.sweep",
        "trainers.cli_common",
        "trainers.cli",
        "trainers.docs_reference",
        "trainers.opponents",
    ),
)
#: the one learner module the sampler may import (math shared by sampler and learner)
SAMPLER_MAY_IMPORT = ("trainers.learners.categorical",)


def trainers_floor(module: str) -> int | None:
    """Index of ``module``'s floor in :data:`TRAINERS_FLOORS` (the package ``__init__`` is
    above all); None for a module outside ``trainers``."""
    if module == "trainers":
        return len(TRAINERS_FLOORS)
    for i, floor in enumerate(TRAINERS_FLOORS):
        if any(module == p or module.startswith(f"{p}.") for p in floor):
            return i
    return None


def trainers_violations(root: Path) -> list[str]:
    """Every import inside ``trainers`` that climbs a floor, crosses sideways between
    packages of one floor, is a module of no floor, or that the sampler makes into learner
    code; ``from pkg import module`` counts as an import of the module."""
    known = {name for name, _ in modules(root)}
    out = []
    for name, path in modules(root):
        if not name.startswith("trainers"):
            continue
        mine = trainers_floor(name)
        if mine is None:
            out.append(f"{path.relative_to(root)}: {name} is on no floor of TRAINERS_FLOORS")
            continue
        for line, module, names in imports(name, path):
            if not module.startswith("trainers"):
                continue
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in known] or [module]
            for target in targets:
                floor = trainers_floor(target)
                where = f"{path.relative_to(root)}:{line}: {name} imports {target}"
                if floor is None or floor > mine:
                    out.append(f"{where}, a floor above its own (TRAINERS_FLOORS)")
                elif floor == mine and target != "trainers":
                    own, other = name.split(".")[:2], target.split(".")[:2]
                    if own != other and len(name.split(".")) > 2 and len(target.split(".")) > 2:
                        out.append(f"{where}, sideways on its floor")
                sampler = name.startswith("trainers.sampling")
                learner = target.startswith("trainers.learners")
                if sampler and learner and target not in SAMPLER_MAY_IMPORT:
                    out.append(f"{where}: the sampler imports no learner code")
    return out


def test_trainers_floors_have_no_import_up_or_sideways() -> None:
    """``trainers`` is layered inside too: no import climbs a floor, so there is no circle."""
    assert trainers_violations(ROOT) == []


def test_a_trainers_floor_violation_is_named(tmp_path: Path) -> None:
    for package in ("trainers", "trainers/configs", "trainers/run"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "trainers" / "run" / "loop.py").write_text("")
    (tmp_path / "trainers" / "configs" / "bad.py").write_text(
        "def lazy():\n    from trainers.run import loop\n"
    )
    assert trainers_violations(tmp_path) == [
        "trainers/configs/bad.py:2: trainers.configs.bad imports trainers.run.loop, a floor "
        "above its own (TRAINERS_FLOORS)"
    ]


def test_imports_point_down_the_layers() -> None:
    assert layering_violations(ROOT) == []


def test_each_public_name_has_one_import_path() -> None:
    assert export_violations(ROOT) == []


def test_a_violation_names_the_module_and_the_import(tmp_path: Path) -> None:
    for package in LAYERS:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "scenarios" / "bad.py").write_text(
        textwrap.dedent(
            """
            from topologies import Topology  # allowed: a lower layer

            def lazy():
                from trainers.run.loop import train  # a lazy import counts too
                return train

            __all__ = ["Topology"]
            """
        )
    )
    assert layering_violations(tmp_path) == [
        "scenarios/bad.py:5: scenarios.bad imports trainers.run.loop "
        "(scenarios may import topologies, scenarios only)",
    ]
    assert export_violations(tmp_path) == [
        "scenarios/bad.py:2: scenarios.bad exports Topology from topologies; "
        "import it from topologies instead"
    ]
    (tmp_path / "topologies" / "rel.py").write_text("from .lazy import x\n")
    assert len(layering_violations(tmp_path)) == 1  # relative imports resolve to their package


@pytest.mark.parametrize("package", [*LAYERS, "marl_agents.llm", "marl_agents.gateway"])
def test_lazy_exports_resolve_to_their_module(package: str) -> None:
    pkg = importlib.import_module(package)
    for name in pkg.__all__:
        value = getattr(pkg, name)
        defined_in = getattr(value, "__module__", None)
        if defined_in is not None and not isinstance(value, str | int | tuple | frozenset):
            assert defined_in.startswith(package.split(".")[0]), (package, name, defined_in)
    assert set(pkg.__all__) <= set(dir(pkg))


def test_importing_the_packages_loads_neither_langgraph_nor_torch() -> None:
    import subprocess

    heavy = ("langgraph", "torch", "ray", "transformers")
    code = (
        "import sys, topologies, scenarios, marl_agents, marl_agents.llm, marl_agents.gateway, "
        "trainers, trainers.cli\n"
        f"print(sorted(m for m in {heavy} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_an_export_named_like_its_module_stays_the_export() -> None:
    """``trainers.sweep`` is the function, also after ``import trainers.sweep`` (as with eager
    imports), so ``from trainers import sweep`` never returns the module."""
    import topologies.validate
    from topologies import validate
    from trainers import sweep

    assert callable(sweep) and sweep.__module__ == "trainers.sweep"
    assert callable(validate) and topologies.validate is validate
    assert sys.modules["trainers.sweep"].sweep is sweep
