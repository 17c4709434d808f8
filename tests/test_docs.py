"""The user guide runs: every code block of README.md and docs/ is executed or validated, the
reference pages are what the code generates, and the site builds with ``mkdocs build --strict``.

Code blocks, by their fence's language (sybil collects them, in the order of the page):

* ``python``: executed, the blocks of one page in one namespace, from a temporary working
  directory (run directories land there) with the repository on ``sys.path``.
* ``yaml``: loaded into the config class it is written for and checked: a sweep file
  (``base:`` + ``param_space:``) by ``SweepSpec`` and every combination resolved; a
  fine-tuning job (``orchestrator:``/``subagents:``/``training:``) by ``FinetuneJob``; anything
  else as an experiment (a fragment such as ``monitors: {...}`` too) by ``ExperimentConfig``
  and ``check()``, and — when it names a ``scenario:`` — resolved against that scenario
  (``trainers.plan.resolve``: pools, agents, models, credit; no Ray, nothing trained).
* ``bash``: each command line is checked: ``marl scenarios``, ``marl topology ...`` and any
  ``--help`` run; ``marl run``/``marl finetune`` run with ``--dump`` and the config they print is
  resolved; ``marl sweep FILE`` loads and resolves the sweep; the other ``marl`` commands, and
  any with a ``<placeholder>``, have their arguments parsed by the real CLI; ``python -m
  MODULE`` must name an importable module, and every repository path a command names
  (``tests/…``, ``examples/…``, ``scripts/…``) must exist. ``ray``, ``pip``, ``export``, ``cd``
  and ``git`` lines are not run. Any other command fails the test.
* ``text``: not run (output shown as an example). Any other language fails the test, and so
  does a fence without a language.

A block that must not run (it needs a GPU, a cluster or a run directory) is preceded by
``<!-- skip: next "the reason" -->`` (sybil's skip directive; the reason is required).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import unittest
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = ("python", "yaml", "bash", "text")
NOT_RUN = {"ray", "pip", "export", "cd", "git", "mkdocs", "source"}
REPO_DIRS = ("tests", "examples", "bench", "scripts", "experiments", "docs", "trainers",
             "scenarios", "marl_agents", "topologies")  # fmt: skip
FENCE = re.compile(r"^(\s*)```(.*)$", re.M)
SKIP = re.compile(r"<!--\s*skip:\s*(\w+)(.*?)-->")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_fence_has_a_known_language_and_every_skip_a_reason():
    problems = []
    for page in PAGES:
        text = page.read_text()
        opening = True
        for match in FENCE.finditer(text):
            info = match.group(2).strip()
            if opening and info.split(" ")[0] not in LANGUAGES:
                line = text[: match.start()].count("\n") + 1
                problems.append(f"{_rel(page)}:{line}: fence language {info!r}: use one of "
                                f"{', '.join(LANGUAGES)}")  # fmt: skip
            opening = not opening
        for match in SKIP.finditer(text):
            if match.group(1) == "next" and not match.group(2).strip():
                problems.append(f"{_rel(page)}: <!-- skip: next --> without a reason: write "
                                '<!-- skip: next "why it does not run" -->')  # fmt: skip
    assert not problems, "\n".join(problems)


# ----- yaml ---------------------------------------------------------------------------------
def check_yaml(text: str) -> str:
    """Validate a YAML block as the config it is written for; returns what it was read as."""
    from trainers.configs.experiment import ExperimentConfig
    from trainers.finetune import FinetuneJob
    from trainers.plan import resolve
    from trainers.sweep import SweepSpec, validate_space

    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"a YAML block must be a mapping, got {data!r}"
    if "param_space" in data:
        spec = SweepSpec.from_yaml(text)
        validate_space(spec.base, spec.param_space, spec.search, spec.metric)
        return "sweep"
    if {"orchestrator", "subagents", "training"} & set(data):
        resolve(FinetuneJob.from_yaml(text).check().to_experiment(), ray_workers=False)
        return "finetune job"
    cfg = ExperimentConfig.from_dict(data).check()
    if "scenario" in data:
        resolve(cfg, ray_workers=False, text_defaults=True)
        return "experiment (resolved)"
    return "experiment fragment (checked)"


# ----- bash ---------------------------------------------------------------------------------
def _lines(source: str) -> list[str]:
    """Command lines: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", source)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def _absolute(word: str) -> str:
    """A repository path as an absolute path (commands run from a temporary directory)."""
    return str(ROOT / word) if word.startswith(REPO_DIRS) and (ROOT / word).exists() else word


def _check_paths(words: list[str]) -> None:
    for word in words:
        path = word.split("::")[0]
        if path.startswith(tuple(d + "/" for d in REPO_DIRS)) and "<" not in path:
            assert (ROOT / path).exists(), f"{path} does not exist in the repository"


def _parse_marl(args: list[str]) -> None:
    """Parse ``marl ARGS`` with the real CLI, without running the command."""
    import click
    import typer

    from trainers.cli import app

    command: Any = typer.main.get_command(app)
    ctx = command.make_context("marl", list(args))
    while isinstance(command, click.Group):
        name, command, rest = command.resolve_command(ctx, ctx.protected_args + ctx.args)
        ctx = command.make_context(name, rest, parent=ctx)


def _invoke_marl(args: list[str]) -> str:
    from typer.testing import CliRunner

    from trainers.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, f"marl {shlex.join(args)} exited {result.exit_code}:\n" + (
        result.output + ("" if result.exception is None else repr(result.exception))
    )
    return result.output


def check_marl(args: list[str]) -> str:
    """Run, dry-run or parse one ``marl`` command line; returns what was done."""
    from trainers.configs.experiment import ExperimentConfig
    from trainers.finetune import FinetuneJob
    from trainers.plan import resolve

    args = [_absolute(a) for a in args]
    _check_paths(args)
    _parse_marl(args) if "--help" not in args else None
    command = args[0] if args else ""
    if "--help" in args or command in ("scenarios", "topology"):
        _invoke_marl(args)
        return "ran"
    if any("<" in a for a in args) or "--resume" in args:
        return "parsed"
    if command == "run":
        cfg = ExperimentConfig.from_yaml(_invoke_marl([*args, "--dump"]))
        resolve(cfg, ray_workers=False, text_defaults=True)
        return "dumped and resolved"
    if command == "finetune":
        job = FinetuneJob.from_yaml(_invoke_marl([*args, "--dump"]))
        resolve(job.check().to_experiment(), ray_workers=False)
        return "dumped and resolved"
    if command == "sweep":
        check_yaml(Path(args[1]).read_text())
        return "sweep resolved"
    return "parsed"


def check_shell(source: str) -> list[str]:
    """Check every command line of a bash block (see the module docstring)."""
    done = []
    for words in _lines(source):
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words = words[1:]  # VAR=value prefixes
        program = Path(words[0]).name if words else ""
        if program == "marl":
            done.append(check_marl(words[1:]))
        elif program.startswith("python"):
            _check_paths(words)
            if "-m" in words:
                module = words[words.index("-m") + 1]
                assert importlib.util.find_spec(module) is not None, f"no module {module}"
            done.append("checked")
        elif program in ("bash", "sh") or words[0].startswith(REPO_DIRS):
            _check_paths(words if program not in ("bash", "sh") else words[1:])
            done.append("checked")
        elif program in NOT_RUN:
            done.append("not run")
        else:
            raise AssertionError(
                f"`{shlex.join(words)}`: tests/test_docs.py does not know how to check "
                f"`{program}`: teach check_shell, or put "
                '<!-- skip: next "why" --> before the block'
            )
    return done


# ----- the pages ----------------------------------------------------------------------------
def _evaluate_yaml(example: Any) -> None:
    check_yaml(example.parsed)


def _evaluate_shell(example: Any) -> None:
    check_shell(example.parsed)


def _document(page: Path) -> Any:
    from sybil import Sybil
    from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

    parsers = [
        SkipParser(),
        PythonCodeBlockParser(),
        CodeBlockParser("yaml", _evaluate_yaml),
        CodeBlockParser("bash", _evaluate_shell),
    ]
    return Sybil(parsers).parse(page)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_code_blocks_run(page, request, tmp_path, monkeypatch):
    pytest.importorskip("sybil", reason="pip install -e '.[docs]' (scripts/install.sh does)")
    text = page.read_text()
    if "```" not in text:
        return
    if re.search(r"```python\n(?:(?!```).)*(?<![.\w])train\(", text, re.S):
        request.getfixturevalue("ray_session")  # a block trains: the session's Ray
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # Ray's workers import examples.* too
    examples = list(_document(page))
    languages = [m.group(2).strip().split(" ")[0] for m in FENCE.finditer(text)][::2]
    found = sum(isinstance(e.parsed, str) for e in examples)  # code blocks, not directives
    assert found == sum(lang != "text" for lang in languages), (
        f"{_rel(page)}: sybil found {found} code blocks of {languages}: a fence it cannot read"
    )
    for example in examples:
        try:
            example.evaluate()
        except unittest.SkipTest:
            continue  # <!-- skip: next "reason" --> before the block
        except Exception as exc:
            raise AssertionError(f"{_rel(page)}, block at line {example.line}: {exc}") from exc


# ----- reference pages, links and the site --------------------------------------------------
def test_reference_pages_are_generated_from_the_code():
    from trainers import docs_reference

    stale = [_rel(p) for p in docs_reference.stale()]
    assert not stale, f"{stale} out of date: run {docs_reference.REGENERATE}"


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    broken = [
        target
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
        if "://" not in target and not (ROOT / target).exists()
    ]
    assert not broken, f"README.md links to missing files: {broken}"


def test_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="pip install -e '.[docs]' (scripts/install.sh does)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("template", sorted((ROOT / "docs" / "configs").glob("*.yaml")), ids=_rel)
def test_tutorial_templates_load(template, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    check_yaml(template.read_text())
