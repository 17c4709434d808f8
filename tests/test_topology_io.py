"""Topology IO: dict and YAML round trips, mermaid snapshots, PNG drawing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from topologies import END, START, Topology, TopologyError
from topologies.draw import layout

SPECS = ["single", "chain:1", "chain:3", "star:1", "star:4", "tree:2x1", "tree:2x2", "tree:3x2",
         "mesh:1", "mesh:3"]  # fmt: skip
PNG = b"\x89PNG\r\n\x1a\n"

MIXED = {
    "name": "mixed",
    "nodes": [
        {"id": "plan", "role": "orchestrator"},
        {"id": "search", "role": "tool", "kind": "node"},
        {"id": "team/draft", "role": "worker", "max_instances": 2, "subgraph": "team"},
        {"id": "team/edit", "role": "worker", "subgraph": "team", "trainable": False},
        {"id": "end", "role": "aggregator"},
    ],
    "edges": [
        {"source": START, "target": "plan"},
        {"source": START, "target": "search"},
        {"source": "plan", "target": "team/draft", "kind": "send"},
        {"source": "team/draft", "target": "team/edit", "kind": "command", "label": 'say "hi"'},
        {"source": "team/edit", "target": "end", "kind": "join", "label": "team/edit+search"},
        {"source": "search", "target": "end", "kind": "join", "label": "team/edit+search"},
        {"source": "end", "target": "plan", "kind": "conditional", "label": "again"},
        {"source": "end", "target": END, "kind": "conditional", "label": "done"},
    ],
}

STAR_2 = """\
flowchart TD
    __start__([START])
    orchestrator["orchestrator<br/>orchestrator · orchestrator"]:::orchestrator
    worker_0["worker_0<br/>worker · worker"]:::worker
    worker_1["worker_1<br/>worker · worker"]:::worker
    __end__([END])
    __start__ --> orchestrator
    orchestrator -.->|"worker_0"| worker_0
    orchestrator -.->|"worker_1"| worker_1
    orchestrator -.->|"answer"| __end__
    worker_0 --> orchestrator
    worker_1 --> orchestrator
    classDef orchestrator fill:#f4a261,stroke:#9c5a1d
    classDef worker fill:#8ecae6,stroke:#1d6f91
"""

MIXED_MERMAID = """\
flowchart TD
    __start__([START])
    plan["plan<br/>orchestrator · orchestrator"]:::orchestrator
    search[/"search<br/>tool"/]:::node
    end_["end<br/>aggregator · aggregator"]:::aggregator
    subgraph team_group["team"]
        team_draft["draft<br/>worker · worker ×2"]:::worker
        team_edit["edit<br/>worker · worker · frozen"]:::worker
    end
    __end__([END])
    __start__ --> plan
    __start__ --> search
    plan ==>|"send"| team_draft
    search --o|"team/edit+search"| end_
    team_draft -.-x|"say #quot;hi#quot;"| team_edit
    team_edit --o|"team/edit+search"| end_
    end_ -.->|"again"| plan
    end_ -.->|"done"| __end__
    classDef orchestrator fill:#f4a261,stroke:#9c5a1d
    classDef worker fill:#8ecae6,stroke:#1d6f91
    classDef aggregator fill:#b5e48c,stroke:#4f772d
    classDef node fill:#ffffff,stroke:#6c757d,stroke-dasharray:3 3
"""


# ----- dict / YAML ------------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS)
def test_yaml_round_trip_every_generator(spec: str, tmp_path: Path) -> None:
    t = Topology.from_spec(spec)
    text = t.to_yaml()
    back = Topology.from_yaml(text)
    assert back.to_yaml() == text
    assert back.to_dict() == t.to_dict()
    assert back.spec == spec and back.name == t.name and back.kind == t.kind
    assert list(back.graph.nodes(data=True)) == list(t.graph.nodes(data=True))
    assert list(back.graph.edges(data=True)) == list(t.graph.edges(data=True))
    assert back.agent_ids == t.agent_ids
    assert back.critical_path_length() == t.critical_path_length()
    assert back.to_mermaid() == t.to_mermaid()
    # files: a Path or a path string ending in .yaml
    path = tmp_path / "t.yaml"
    assert t.to_yaml(path) == path.read_text(encoding="utf-8")
    assert Topology.from_yaml(path).to_yaml() == text
    assert Topology.from_yaml(str(path)).to_yaml() == text


def test_dict_round_trip_of_a_mixed_topology() -> None:
    t = Topology.from_dict(MIXED)
    assert Topology.from_dict(t.to_dict()).to_dict() == t.to_dict()
    assert Topology.from_yaml(t.to_yaml()).to_yaml() == t.to_yaml()
    assert t.to_dict()["version"] == 1
    assert t.agent_ids == ["plan", "team/draft_0", "team/draft_1", "team/edit", "end"]


def test_langgraph_imports_round_trip_through_yaml() -> None:
    from test_topology_langgraph import joins, map_reduce, supervisor, swarm, with_subgraph

    for make in (supervisor, map_reduce, swarm, joins, with_subgraph):
        t = Topology.from_langgraph(make())
        assert Topology.from_yaml(t.to_yaml()).to_yaml() == t.to_yaml(), make.__name__


def test_minimal_hand_written_yaml_takes_defaults() -> None:
    t = Topology.from_yaml(
        """
        name: duo
        nodes: [{id: a}, {id: b, role: worker}]
        edges:
          - {source: __start__, target: a}
          - {source: a, target: b}
          - {source: b, target: __end__}
        """
    )
    assert t.pools == {"a": "agent", "b": "worker"}
    assert t.trainable == ["a", "b"]
    assert t.edge_counts()["static"] == 3


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("nodes: [", r"topology YAML does not parse \(line 1, column 9: expected .*\): fix the"),
        ("- a\n- b\n", r"must be a mapping, got list"),
        (Path("/nonexistent/t.yaml"), r"topology file '/nonexistent/t.yaml' does not exist"),
        ("missing.yaml", r"topology file 'missing.yaml' does not exist"),
    ],
)
def test_bad_yaml(source: Any, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        Topology.from_yaml(source)


# ----- mermaid ----------------------------------------------------------------------------
def test_mermaid_snapshot_star() -> None:
    assert Topology.from_spec("star:2").to_mermaid() == STAR_2


def test_mermaid_snapshot_every_kind() -> None:
    assert Topology.from_dict(MIXED).to_mermaid() == MIXED_MERMAID


@pytest.mark.parametrize("spec", SPECS)
def test_mermaid_is_deterministic(spec: str) -> None:
    a, b = Topology.from_spec(spec).to_mermaid(), Topology.from_spec(spec).to_mermaid()
    assert a == b
    assert a.startswith("flowchart TD\n")
    assert a.count(" --> ") + a.count(" -.->") == Topology.from_spec(spec).graph.number_of_edges()


# ----- drawing ----------------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS)
def test_draw_every_generator(spec: str, tmp_path: Path) -> None:
    out = Topology.from_spec(spec).draw(tmp_path / "t.png")
    assert out == tmp_path / "t.png"
    assert out.read_bytes()[:8] == PNG


def test_draw_every_edge_kind_and_title(tmp_path: Path) -> None:
    out = Topology.from_dict(MIXED).draw(str(tmp_path / "mixed.png"), title="x", dpi=50)
    assert out.read_bytes()[:8] == PNG


def test_layout_rows_follow_supersteps() -> None:
    pos = layout(Topology.from_spec("tree:2x2"))
    ys = {n: y for n, (_, y) in pos.items()}
    assert ys[START] > ys["orchestrator"] > ys["lead_0"] > ys["worker_0_0"] > ys[END]
    assert ys["lead_0"] == ys["lead_1"]
    # children sit under their parent: lead_0's workers left of lead_1's
    assert pos["worker_0_1"][0] < pos["worker_1_0"][0]
    wide = layout(Topology.from_spec("star:40"), wrap=16)
    assert len({y for _, y in wide.values()}) == 2 + 3 + 1  # START, orchestrator, 3 lines, END
