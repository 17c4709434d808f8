"""PettingZoo's own catalogue as the test list (issue 43, item 7; experiments/pettingzoo_catalogue).

Default suite: the catalogue script lists exactly the packages' own envs; one env per family and
space kind builds as a scenario whose spaces the trainer takes (or is refused with a named
reason); three envs of different shapes train an iteration. ``--slow``: the whole catalogue,
2 iterations each, in subprocesses, and no env crashes.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

from experiments import pettingzoo_catalogue as cat
from topologies.errors import MarlError

#: ``cat.fast_subset(cat.catalogue())``, written out so collecting this file builds no env
FAST_NAMES = (
    "chess_v6", "rps_v2", "cooperative_pong_v6", "pistonball_v6", "multiwalker_v9", "pursuit_v5",
    "collect_treasure_v1", "adversarial_pursuit_v4",
)  # fmt: skip
FAST = cat.select(cat.catalogue(), FAST_NAMES)


def test_the_catalogue_is_the_packages_own() -> None:
    from magent2 import environments as magent
    from mpe2.all_modules import mpe_environments
    from pettingzoo.butterfly.all_modules import butterfly_environments
    from pettingzoo.classic.all_modules import classic_environments
    from pettingzoo.sisl.all_modules import sisl_environments

    theirs = {
        "classic": classic_environments,
        "butterfly": butterfly_environments,
        "sisl": sisl_environments,
        "mpe": mpe_environments,
    }
    for family, envs in theirs.items():
        assert sorted(m.__name__ for m in envs.values()) == sorted(cat.FAMILIES[family]), family
    magent_mods = sorted(
        f"magent2.environments.{p.stem}" for p in Path(magent.__file__).parent.glob("*_v[0-9]*.py")
    )
    assert magent_mods == sorted(cat.FAMILIES["magent"])


def test_the_fast_subset_covers_every_family_and_space_kind() -> None:
    assert cat.fast_subset(cat.catalogue()) == FAST
    kinds = {(e.family, k) for e in cat.catalogue() for k in cat.describe(e)["kinds"]}
    covered = {(e.family, k) for e in FAST for k in cat.describe(e)["kinds"]}
    assert covered == kinds
    assert {e.family for e in FAST} == set(cat.FAMILIES)
    assert len(FAST) < len(cat.catalogue())


@pytest.mark.parametrize("entry", FAST, ids=[e.name for e in FAST])
def test_a_catalogue_env_builds_with_trainable_spaces_or_is_refused_by_name(entry) -> None:
    """The scenario's declared spaces are what the pools train on: a flat float Box, or
    ``Dict{observations, action_mask}``; a refusal is our error naming an agent."""
    from scenarios.pz_spaces import MASK_KEY, OBS_KEY
    from scenarios.registry import build

    try:
        scenario = build(entry.ref)
    except MarlError as exc:
        agents = cat.make_env(entry).possible_agents
        assert any(a in str(exc) for a in agents), str(exc)
        return
    for agent in scenario.possible_agents:
        space = scenario.observation_space(agent)
        if isinstance(space, gym.spaces.Dict):
            assert set(space.spaces) == {OBS_KEY, MASK_KEY}, (agent, space)
            space = space[OBS_KEY]
        assert isinstance(space, gym.spaces.Box) and len(space.shape) == 1, (agent, space)
        assert space.dtype == "float32"


def test_random_play_steps_turn_based_and_parallel_envs() -> None:
    by_name = {e.name: e for e in cat.catalogue()}
    for name in ("tictactoe_v3", "simple_spread_v3"):
        rate = cat.random_rate(lambda n=name: cat.make_env(by_name[n]), seconds=0.2)
        assert rate["random_episodes"] >= 1 and rate["agent_steps_per_s"] > 0, (name, rate)


def test_the_table_counts_each_status_per_family() -> None:
    rows = [
        {"family": "classic", "env": "tictactoe_v3", "status": "trains", "obs": [], "act": []},
        {"family": "classic", "env": "go_v5", "status": "refused", "error": "a|b"},
        {"family": "sisl", "env": "pursuit_v5", "status": "crash", "error": "E: x"},
    ]
    text = cat.table(rows)
    assert "| classic | 1 | 1 | 0 | 0 | 0 |" in text
    assert "| **all** | 1 | 1 | 1 | 0 | 0 |" in text
    assert "a\\|b" in text  # a pipe in an error does not split the Markdown row


@pytest.mark.parametrize(
    "name",
    ["tictactoe_v3", "knights_archers_zombies_v11", "rps_v2"],  # turn-based+mask, 2-D Box, Discrete
)
def test_a_catalogue_env_trains_an_iteration(name, ray_session, tmp_path) -> None:
    (entry,) = cat.select(cat.catalogue(), [name])
    row = cat.train_entry(entry, tmp_path, iterations=1)
    assert row["status"] == "trains", row


@pytest.mark.slow
def test_the_whole_catalogue_trains_or_refuses_with_a_reason(tmp_path) -> None:
    rows_path, table_path = tmp_path / "rows.jsonl", tmp_path / "table.md"
    assert cat.main(["--out", str(rows_path), "--table", str(table_path)]) == 0
    rows = cat.load_rows(rows_path)
    assert len(rows) == len(cat.catalogue())
    bad = [(r["env"], r["status"], r.get("error")) for r in rows]
    bad = [b for b in bad if b[1] not in ("trains", "refused")]
    assert not bad, bad
