"""The README's Python example runs as written (with its own tiny budget)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(ray_session, tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md has no python example"
    monkeypatch.chdir(tmp_path)  # its run directory goes under tmp_path/runs
    namespace: dict = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    result = namespace["result"]
    assert result.status == "completed"
    assert (tmp_path / "runs") in result.run_dir.parents
    assert result.final["charts/iteration"] == 2
