"""Every registered scenario passes the conformance checks on every topology kind it accepts."""

from __future__ import annotations

import pytest

from scenarios import build, list_scenarios
from scenarios.testing import check_scenario

SAMPLE_SPECS = {
    "single": "single",
    "chain": "chain:3",
    "star": "star:3",
    "tree": "tree:2x1",
    "mesh": "mesh:3",
}

CASES = [
    (cls.id(), SAMPLE_SPECS[kind])
    for cls in list_scenarios()
    for kind in cls.topologies
    if kind in SAMPLE_SPECS
]


def test_every_builtin_is_registered():
    ids = {cls.name for cls in list_scenarios()}
    assert {"delegate", "relay", "toolchain", "spread"} <= ids


@pytest.mark.parametrize(("scenario", "topology"), CASES, ids=[f"{s}-{t}" for s, t in CASES])
def test_conformance(scenario, topology):
    check_scenario(lambda: build(scenario, topology=topology), cycles=60, seeds=2)
