"""``marl topology show`` through typer's CliRunner on the sub-app."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topologies import Topology
from topologies.cli import app

runner = CliRunner()

USER_MODULE = textwrap.dedent(
    """
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    from topologies import Topology


    class S(TypedDict, total=False):
        x: int


    def _noop(state):
        return {}


    def make_builder():
        b = StateGraph(S)
        b.add_node("boss", _noop, metadata={"role": "orchestrator"})
        b.add_node("helper", _noop, metadata={"role": "worker", "max_instances": 4})
        b.add_node("lookup", _noop, metadata={"role": "tool"})
        b.add_edge(START, "boss")
        b.add_conditional_edges("boss", lambda s: "helper", {"delegate": "helper", "done": END})
        b.add_edge("helper", "lookup")
        b.add_edge("lookup", "boss")
        return b


    builder = make_builder()
    compiled = builder.compile()
    topology = Topology.from_spec("chain:2")
    not_a_graph = 42


    class Holder:
        graph = compiled


    def broken():
        raise RuntimeError("boom")


    def hidden():
        b = StateGraph(S)
        b.add_node("a", _noop)
        b.add_edge(START, "a")
        b.add_conditional_edges("a", lambda s: END)
        return b
    """
)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A user's module in the working directory, under a name unique to the test."""
    name = f"user_graphs_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE, encoding="utf-8")
    (tmp_path / "bad_import.py").write_text("import not_installed_pkg_xyz\n", encoding="utf-8")
    (tmp_path / "raises.py").write_text("raise ValueError('bad config')\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for mod in ("bad_import", "raises"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    return name


def show(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["show", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_show_spec_prints_summary() -> None:
    code, out = show("star:3")
    assert code == 0
    assert "star:3: 4 agent(s) on 4 agent node(s), 0 plain node(s)" in out
    for text in ("orchestrator", "worker_2", "conditional", "static", "critical path: 3"):
        assert text in out
    assert "(START → orchestrator → worker_0 → orchestrator → END)\n" in out


def test_show_draws_png_and_mermaid(tmp_path: Path) -> None:
    png = tmp_path / "t.png"
    code, out = show("tree:2x2", "--png", str(png), "--mermaid")
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "drew" in out
    assert Topology.from_spec("tree:2x2").to_mermaid() in out


def test_show_star_100(tmp_path: Path) -> None:
    code, out = show("star:100", "--png", str(tmp_path / "s.png"))
    assert code == 0
    assert "101 agent(s)" in out
    assert (tmp_path / "s.png").stat().st_size > 0


@pytest.mark.parametrize("attr", ["builder", "compiled", "make_builder", "Holder.graph"])
def test_show_user_graph(user_module: str, attr: str, tmp_path: Path) -> None:
    code, out = show(f"{user_module}:{attr}", "--png", str(tmp_path / "g.png"))
    assert code == 0, out
    assert "5 agent(s) on 2 agent node(s), 1 plain node(s)" in out
    assert "helper_{0..3}" in out
    assert "lookup" in out and "tool" in out
    assert (tmp_path / "g.png").exists()


def test_show_user_topology_and_yaml(user_module: str, tmp_path: Path) -> None:
    code, out = show(f"{user_module}:topology")
    assert code == 0 and "agent_1" in out
    path = tmp_path / "team.yaml"
    Topology.from_spec("mesh:2").to_yaml(path)
    code, out = show(str(path))
    assert code == 0 and "critical path: 2" in out


@pytest.mark.parametrize("spec", ["star:1000000", "mesh:1000000", "tree:1000x1000"])
def test_show_huge_spec_fails_in_bounded_memory(spec: str) -> None:
    """In a process limited to 2 GiB of address space (before the size check, these specs grew
    memory until the machine killed them)."""
    import resource
    import subprocess

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    code = f"from topologies.cli import app; app(['show', {spec!r}])"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limit, timeout=600
    )
    assert proc.returncode == 2, proc.stderr
    assert "above the limit of 256 (topologies.MAX_AGENTS)" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("star:0", "error: bad topology spec 'star:0': write star:N with positive integers"),
        ("ring", "error: unknown topology 'ring': give a spec (single, chain:N"),
        ("no_such_module_xyz:graph", "error: cannot import module 'no_such_module_xyz': check"),
        ("bad_import:graph", "error: importing 'bad_import' failed: no module named "
                             "'not_installed_pkg_xyz'; install it"),
        ("raises:graph", "error: importing 'raises' failed (ValueError: bad config): fix"),
        ("{mod}:missing", "error: module '{mod}' has no attribute 'missing': name a StateGraph"),
        ("{mod}:not_a_graph", "error: {mod}:not_a_graph is a int, not a graph"),
        ("{mod}:broken", "error: calling {mod}:broken() failed (RuntimeError: boom)"),
        ("{mod}:hidden", "error: node 'a': its conditional edge / Send router '<lambda>' declares"),
        ("missing.yaml", "error: topology file 'missing.yaml' does not exist"),
    ],
)  # fmt: skip
def test_show_errors_are_one_line_exit_2(user_module: str, target: str, message: str) -> None:
    code, out = show(target.format(mod=user_module))
    assert code == 2
    assert message.format(mod=user_module) in out
    assert out.count("\n") == 1  # one line, no traceback
    assert "Traceback" not in out


def test_png_into_missing_directory_is_an_error(tmp_path: Path) -> None:
    code, out = show("single", "--png", str(tmp_path / "nope" / "t.png"))
    assert code == 2
    assert "its directory does not exist; create it" in out


def test_no_arguments_prints_help() -> None:
    result = runner.invoke(app, [])
    assert "show" in result.output
