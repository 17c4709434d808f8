"""Turn-based PettingZoo AEC envs stepped natively (:mod:`scenarios.pz_aec`): which envs take
the path, turn order and reward delivery against PettingZoo's own tic-tac-toe played by hand,
the conformance checks on the env the trainer sees, and the env node's refusal of a masked
action."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pettingzoo.classic import tictactoe_v3
from pettingzoo.test import parallel_api_test

from scenarios.graph_env import GraphEnv
from scenarios.pettingzoo_env import PettingZooScenario
from scenarios.pz_aec import AECScenario, legal
from scenarios.pz_spaces import MASK_KEY, OBS_KEY
from scenarios.registry import build, make
from scenarios.rllib_env import RLlibGraphEnv
from scenarios.testing import check_rllib

TTT = "pettingzoo.classic.tictactoe_v3:env"
#: hand-played games: cells in turn order (player_1 first)
GAMES = {
    "player_1 wins": [0, 3, 1, 4, 2],
    "player_2 wins": [0, 3, 1, 4, 8, 5],
    "draw": [0, 1, 2, 4, 3, 5, 7, 6, 8],
}


def test_turn_based_envs_take_the_aec_path_and_parallelisable_ones_do_not() -> None:
    s = build(TTT)
    assert type(s) is AECScenario
    assert s.possible_agents == ["player_1", "player_2"]
    assert set(s.topology.pools.values()) == {"player"}  # one pool: self-play by sharing
    space = s.observation_space("player_1")
    assert space[OBS_KEY].shape == (18,) and space[MASK_KEY].shape == (9,)
    spread = build("mpe2.simple_spread_v3:env", N=2, max_cycles=5)  # parallelisable AEC
    assert type(spread) is PettingZooScenario
    direct = PettingZooScenario(TTT)  # built directly, as a user may
    assert type(direct) is AECScenario and direct.possible_agents == s.possible_agents


def pettingzoo_game(moves: list[int]) -> tuple[list[str], dict[str, float]]:
    """PettingZoo's own tic-tac-toe through its AEC loop: who acted, in order, and each
    agent's total of what ``env.last()`` reported (its cumulative rewards)."""
    env = tictactoe_v3.env()
    env.reset(seed=0)
    order, totals, it = [], dict.fromkeys(env.possible_agents, 0.0), iter(moves)
    for agent in env.agent_iter():
        _, reward, term, trunc, _ = env.last()
        totals[agent] += float(reward)
        if term or trunc:
            env.step(None)
            continue
        order.append(agent)
        env.step(next(it))
    return order, totals


def our_game(moves: list[int]) -> tuple[list[str], dict[str, float], list[dict[str, Any]]]:
    """The same moves through the env RLlib steps: who was asked, each agent's rewards summed,
    and every step's returns."""
    env = RLlibGraphEnv({"scenario": TTT})
    obs, _ = env.reset(seed=0)
    order, totals, steps = [], dict.fromkeys(env.possible_agents, 0.0), []
    for cell in moves:
        assert len(obs) == 1, obs  # one agent a turn
        (agent,) = obs
        order.append(agent)
        assert obs[agent][MASK_KEY][cell] == 1.0
        obs, rewards, terms, truncs, _ = env.step({agent: cell})
        steps.append({"rewards": rewards, "terms": terms, "truncs": truncs})
        for a, r in rewards.items():
            totals[a] += r
    assert steps[-1]["terms"]["__all__"] and not steps[-1]["truncs"]["__all__"]
    return order, totals, steps


@pytest.mark.parametrize("game", sorted(GAMES))
def test_turn_order_and_rewards_are_pettingzoos(game: str) -> None:
    moves = GAMES[game]
    want_order, want = pettingzoo_game(moves)
    order, got, steps = our_game(moves)
    assert order == want_order
    assert got == want
    for step in steps[:-1]:  # nothing is paid before the end; then each agent its own
        assert all(r == 0.0 for r in step["rewards"].values())
    last = steps[-1]
    assert set(last["rewards"]) == {"player_1", "player_2"}  # the loser too
    assert all(last["terms"][a] and not last["truncs"][a] for a in last["rewards"])
    if game != "draw":
        winner = game.split()[0]
        loser = ({"player_1", "player_2"} - {winner}).pop()
        assert (last["rewards"][winner], last["rewards"][loser]) == (1.0, -1.0)


def test_episode_metrics_are_each_agents_own_return() -> None:
    env = GraphEnv(build(TTT))
    _, infos = env.reset(seed=0)
    for cell in GAMES["player_2 wins"]:
        (agent,) = [a for a, info in infos.items() if info["acting"]]
        _, _, _, _, infos = env.step({agent: cell})
    metrics = env.outcome.metrics
    assert metrics["player_1/return"] == -1.0 and metrics["player_2/return"] == 1.0
    assert metrics["sum_return"] == 0.0 and metrics["steps"] == 6.0
    assert not env.truncated


def test_rllib_checks_the_env_the_trainer_sees() -> None:
    check_rllib(make(TTT))


def test_pettingzoos_parallel_api_test_on_the_env_the_trainer_sees() -> None:
    parallel_api_test(GraphEnv(build(TTT)), num_cycles=200)


def test_a_masked_action_never_reaches_the_env() -> None:
    env = GraphEnv(build(TTT))
    env.reset(seed=0)
    env.step({"player_1": 4})
    _, _, _, truncs, infos = env.step({"player_2": 4})  # the cell player_1 took
    assert env.finished and env.truncated and all(truncs.values())
    assert infos["player_2"]["failure"] == "error"
    assert "IllegalActionError" in infos["player_2"]["error"]
    assert "player_2" in infos["player_2"]["error"] and "action_mask" in infos["player_2"]["error"]


def test_without_the_check_the_envs_own_rule_applies() -> None:
    scenario = AECScenario(TTT, check_mask=False)
    env = RLlibGraphEnv({"env": GraphEnv(scenario)})
    env.reset(seed=0)
    env.step({"player_1": 4})
    _, rewards, terms, _, _ = env.step({"player_2": 4})
    assert terms["__all__"] and rewards["player_2"] == -1.0  # TerminateIllegalWrapper's


def test_legal_reads_discrete_and_multidiscrete_masks() -> None:
    import gymnasium as gym

    mask = np.array([0, 1, 1], np.float32)
    assert legal(mask, 1, gym.spaces.Discrete(3)) and not legal(mask, 0, gym.spaces.Discrete(3))
    md = gym.spaces.MultiDiscrete([2, 3])
    both = np.array([1, 0, 0, 1, 1], np.float32)  # part 0: {0}; part 1: {1, 2}
    assert legal(both, [0, 2], md) and not legal(both, [1, 2], md) and not legal(both, [0, 0], md)


@pytest.mark.slow  # ~50 s: two trainings (the catalogue's fast subset trains it by default)
@pytest.mark.usefixtures("ray_session")
def test_tictactoe_trains_resumes_and_evaluates(tmp_path: Any) -> None:
    """Two real PPO iterations of tic-tac-toe through ``train()`` (one shared pool for both
    seats, masked), each seat's own return in the metrics; a resumed run repeats the first
    one's rows; ``evaluate`` (``marl eval``) plays the checkpoint greedily."""
    import json
    import shutil

    from configs import tiny_config

    from trainers.evaluate import evaluate
    from trainers.run.loop import train

    cfg = tiny_config(tmp_path, batch=64, scenario=TTT)
    result = train(cfg)
    assert result.status == "completed"
    row = result.history[-1]
    for key in ("player_1/return", "player_2/return", "charts/player_1/return"):
        assert any(k.endswith(key) for k in row), (key, sorted(row))
    run = tmp_path / "copy"
    shutil.copytree(result.run_dir, run)
    resumed = train(cfg.replace(**{"budget.iterations": 3}), resume=run)
    assert [h["charts/iteration"] for h in resumed.history] == [1, 2, 3]
    assert resumed.history[:2] == result.history
    ev = evaluate(run, episodes=4, show=False)
    assert ev.summary["episodes"] == 4 and ev.summary.get("failures", 0) == 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(x) for x in lines)


#: PettingZoo's turn-based classic games: the cheap ones by default, the rest with --slow
CLASSIC = [
    "tictactoe_v3",
    "connect_four_v3",
    "leduc_holdem_v4",
    "texas_holdem_v4",
    pytest.param("texas_holdem_no_limit_v6", marks=pytest.mark.slow),
    pytest.param("chess_v6", marks=pytest.mark.slow),
    pytest.param("go_v5", marks=pytest.mark.slow),
    pytest.param("hanabi_v5", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", CLASSIC)
def test_random_legal_games_replay_in_pettingzoos_own_loop(name: str) -> None:
    """Episodes of a classic game played through the env RLlib steps with random allowed
    actions, then replayed in PettingZoo's own AEC loop with the env seed our episode used:
    the same agents act in the same order, every episode ends with every agent terminated or
    truncated, each agent's rewards sum to its PettingZoo cumulative rewards, and so do the
    episode's ``<agent>/return`` metrics (also of an agent that never acted: a poker player
    whose opponent folded at once)."""
    import importlib

    from scenarios.pettingzoo_env import env_seed

    ref = f"pettingzoo.classic.{name}:env"
    env = RLlibGraphEnv({"scenario": ref})
    rng = np.random.default_rng(0)
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        played, totals = [], dict.fromkeys(env.possible_agents, 0.0)
        done = False
        while not done:
            (agent,) = obs
            action = int(rng.choice(np.flatnonzero(obs[agent][MASK_KEY])))
            played.append((agent, action))
            obs, rewards, terms, truncs, _ = env.step({agent: action})
            for a, r in rewards.items():
                totals[a] += r
            done = terms["__all__"] or truncs["__all__"]
        raw = importlib.import_module(f"pettingzoo.classic.{name}").env()
        raw.reset(seed=env_seed(np.random.default_rng(seed)))
        want, moves = dict.fromkeys(raw.possible_agents, 0.0), iter(played)
        for agent in raw.agent_iter():
            _, reward, term, trunc, _ = raw.last()
            want[agent] += float(reward)
            if term or trunc:
                raw.step(None)
                continue
            who, action = next(moves)
            assert who == agent
            raw.step(action)
        assert next(moves, None) is None
        acted = {a for a, _ in played}  # one who never acted has no step to be paid on
        assert totals == pytest.approx({a: want[a] if a in acted else 0.0 for a in want})
        metrics = env.env.outcome.metrics  # the episode's metrics report every agent's return
        assert {a: metrics[f"{a}/return"] for a in want} == pytest.approx(want)


@pytest.mark.parametrize("engine", ["auto", "langgraph"])
def test_an_agent_that_leaves_gets_its_own_flag_and_everything_it_earned(engine: str) -> None:
    """A hand-written turn-based env (which passes PettingZoo's ``api_test``): ``quitter``
    terminates after two moves, ``stayer`` is truncated after five. RLlib sees the quitter
    terminated in the step it leaves, with its last reward; the stayer truncated at the end
    (bootstrapped); each agent's rewards sum to PettingZoo's cumulative rewards."""
    from pettingzoo.test import api_test
    from pz_aec_toys import TurnToy

    api_test(TurnToy(), num_cycles=50)
    raw, want = TurnToy(), {"quitter": 0.0, "stayer": 0.0}
    raw.reset()
    for agent in raw.agent_iter():
        _, reward, term, trunc, _ = raw.last()
        want[agent] += float(reward)
        raw.step(None if term or trunc else 1)
    env = RLlibGraphEnv({"scenario": "tests.pz_aec_toys:turn_toy", "engine": engine})
    obs, _ = env.reset(seed=0)
    got, flags, ended = {"quitter": 0.0, "stayer": 0.0}, {}, set()
    while True:
        (agent,) = [a for a in obs if a not in ended]
        obs, rewards, terms, truncs, _ = env.step({agent: 1})
        for a, r in rewards.items():
            got[a] += r
        for a in obs:
            if terms.get(a) or truncs.get(a):
                flags[a] = "truncated" if truncs.get(a) else "terminated"
                ended.add(a)
        if terms["__all__"] or truncs["__all__"]:
            break
    assert got == want == {"quitter": 2.5, "stayer": 6.0}
    assert flags == {"quitter": "terminated", "stayer": "truncated"}
    assert env.env.final_state["ends"] == flags
    assert not env.env.outcome.truncated  # not every agent was


@pytest.mark.parametrize("sampler", ["batched", "rllib"])
def test_both_samplers_record_each_agents_own_end(sampler: str) -> None:
    """The episodes both samplers build from the turn-based toy: the quitter's agent episode
    ends terminated after its two moves, the stayer's truncated after five (RLlib also flags
    it terminated; the learners clear that, trainers.learners.time_limits)."""
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    from trainers.algo import to_algorithm_config
    from trainers.configs.experiment import ExperimentConfig
    from trainers.sampling.batched_runner import BatchedEnvRunner

    cfg = ExperimentConfig.from_dict(
        {
            "scenario": "tests.pz_aec_toys:turn_toy",
            "resources": {"num_envs_per_env_runner": 2},
            "episodes": {"sampler": sampler},
        }
    )
    cls = BatchedEnvRunner if sampler == "batched" else MultiAgentEnvRunner
    for ep in cls(config=to_algorithm_config(cfg)).sample(num_episodes=2, explore=True):
        quitter, stayer = ep.agent_episodes["quitter"], ep.agent_episodes["stayer"]
        assert (len(quitter), quitter.is_terminated, quitter.is_truncated) == (2, True, False)
        assert (len(stayer), stayer.is_truncated) == (5, True)
