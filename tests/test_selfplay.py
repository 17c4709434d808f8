"""Two-player games by self-play (issue 43, item 5): win / draw / loss, a random legal opponent,
a frozen opponent, both seats trained or one seat frozen bit-identical (tic-tac-toe, PettingZoo's
own turn-based AEC env)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from scenarios.pz_matches import match_metrics, result_of
from scenarios.pz_spaces import MASK_KEY, OBS_KEY
from tests.configs import tiny_config
from tests.test_train import learner_weights, same
from trainers.configs.typed import ConfigError
from trainers.opponents import RandomPolicy, evaluate_vs, seats_of

TICTACTOE = "pettingzoo.classic.tictactoe_v3:env"


def test_results_compare_each_seat_with_the_best_other_seat():
    assert [result_of(1, [-1]), result_of(-1, [1]), result_of(0, [0])] == ["win", "loss", "draw"]
    assert result_of(2.0, [2.0, -4.0]) == "draw" and result_of(1.0, [2.0, -4.0]) == "loss"
    m = match_metrics({"player_1": 0.0, "player_2": 0.0})
    assert m == {
        **{f"player_{i}/draw": 1.0 for i in (1, 2)},
        **{f"player_{i}/{r}": 0.0 for i in (1, 2) for r in ("win", "loss")},
    }
    assert match_metrics({"a": 1.0, "b": 0.0, "c": 0.0}) == {}  # not a two-player game


def test_seats_are_roles_when_there_are_teams_else_agents():
    assert seats_of(["p_1", "p_2"], {"p_1": "p", "p_2": "p"}) == {"p_1": ["p_1"], "p_2": ["p_2"]}
    teams = {"red_0": "red", "red_1": "red", "blue_0": "blue"}
    assert seats_of(list(teams), teams) == {"red": ["red_0", "red_1"], "blue": ["blue_0"]}


def test_the_random_opponent_never_plays_a_masked_action():
    policy = RandomPolicy({"p": gym.spaces.Discrete(9)}, seed=0)
    mask = np.zeros(9, np.float32)
    mask[[2, 5]] = 1.0
    obs = {OBS_KEY: np.zeros(3, np.float32), MASK_KEY: mask}
    played = {policy.act({"p": obs})["p"] for _ in range(2000)}
    assert played == {2, 5}
    unmasked = {policy.act({"p": np.zeros(3, np.float32)})["p"] for _ in range(2000)}
    assert unmasked == set(range(9))
    with pytest.raises(ValueError, match="p: its action mask allows no action"):
        policy.act({"p": {OBS_KEY: obs[OBS_KEY], MASK_KEY: np.zeros(9, np.float32)}})


def test_a_tictactoe_run_reports_wins_and_plays_a_random_and_a_frozen_opponent(
    ray_session, tmp_path
):
    from trainers.run.loop import train

    result = train(tiny_config(tmp_path, scenario=TICTACTOE))
    last = result.history[-1]
    for p in ("player_1", "player_2"):  # self-play rates of the training episodes
        rates = [last[f"charts/{p}/{r}"] for r in ("win", "draw", "loss")]
        assert sum(rates) == pytest.approx(1.0), last
    vs = evaluate_vs(result.run_dir, "random", episodes=6, show=False)
    assert set(vs.seats) == {"player_1", "player_2"}
    assert len(vs.episodes) == 12
    for seat, r in vs.rates.items():
        assert r["win"] + r["draw"] + r["loss"] == pytest.approx(1.0), seat
        assert r["episodes"] == 6
    assert vs.summary["win_or_draw"] == pytest.approx(vs.summary["win"] + vs.summary["draw"])
    assert vs.summary["failed"] == 0.0  # greedy moves respect the mask: no illegal move
    frozen = evaluate_vs(result.run_dir, result.final_checkpoint, episodes=3, show=False)
    assert len(frozen.episodes) == 6
    with pytest.raises(ConfigError, match="episodes must be"):
        evaluate_vs(result.run_dir, "random", episodes=0, show=False)
    from typer.testing import CliRunner

    from trainers.cli import app

    cli = CliRunner().invoke(app, ["eval", str(result.run_dir), "--opponent", "random",
                                   "--episodes", "2"])  # fmt: skip
    assert cli.exit_code == 0, cli.output
    assert "player_1" in cli.output and "win" in cli.output.lower()


@pytest.mark.parametrize("train_seats", [None, ["player_1"]])
def test_self_play_trains_both_seats_or_leaves_a_frozen_seat_bit_identical(
    ray_session, tmp_path, train_seats
):
    from trainers.algo import to_algorithm_config

    cfg = tiny_config(tmp_path, scenario=TICTACTOE, sharing="agent", train=train_seats)
    algo = to_algorithm_config(cfg).build_algo()
    try:
        before = {p: learner_weights(algo, p) for p in ("player_1", "player_2")}
        for _ in range(2):
            algo.train()
        assert not same(learner_weights(algo, "player_1"), before["player_1"])
        moved = not same(learner_weights(algo, "player_2"), before["player_2"])
        assert moved == (train_seats is None)
    finally:
        algo.stop()
