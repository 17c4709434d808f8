"""GraphEnv runs real LangGraph graphs: supersteps, fan-out, joins, handoffs, faults, replays."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import toys
from toys import ToyStar, handoff_graph, join_graph, map_reduce_graph, user_scenario

from scenarios import GraphEnv, ScenarioError, run_inline
from scenarios.testing import check_scenario


def play(env: GraphEnv, policy, seed: int = 0):
    """Step an episode; return the list of acting-agent sets, one per env step."""
    obs, infos = env.reset(seed=seed)
    steps = []
    while env.agents:
        acting = [a for a in env.agents if infos[a]["acting"]]
        steps.append(acting)
        obs, rewards, terms, truncs, infos = env.step({a: policy(a, obs[a]) for a in env.agents})
    return steps, rewards, terms, truncs, infos


def test_parallel_fanout_is_one_step():
    steps, rewards, terms, _, _ = play(GraphEnv(ToyStar("star:3", rounds=2)), lambda a, o: 1)
    workers = ["worker_0", "worker_1", "worker_2"]
    assert steps == [["orchestrator"], workers, ["orchestrator"], workers, ["orchestrator"]]
    assert rewards == dict.fromkeys(["orchestrator", *workers], 6.0)
    assert all(terms.values())


def test_trace_records_supersteps_and_actions():
    env = GraphEnv(ToyStar("star:2", rounds=1))
    play(env, lambda a, o: 2)
    assert [(t.superstep, t.agent, t.action) for t in env.trace] == [
        (1, "orchestrator", 2),
        (2, "worker_0", 2),
        (2, "worker_1", 2),
        (3, "orchestrator", 2),
    ]
    assert env.episode_actions()["orchestrator"] == [2, 2]


def test_send_fanout_instances_get_their_own_ids():
    env = GraphEnv(user_scenario(map_reduce_graph(), n_actions=4))
    assert env.possible_agents == ["planner", "worker_0", "worker_1", "worker_2"]
    steps, rewards, *_ = play(env, lambda a, o: 3 if a == "planner" else 2)
    assert steps == [["planner"], ["worker_0", "worker_1", "worker_2"]]
    assert env.outcome.reward == 6.0
    assert set(rewards) == {"planner", "worker_0", "worker_1", "worker_2"}


def test_join_waits_for_both_branches():
    steps, *_ = play(GraphEnv(user_scenario(join_graph())), lambda a, o: 1)
    assert steps == [["a", "b"], ["c"]]


def test_command_handoffs():
    env = GraphEnv(user_scenario(handoff_graph(), n_actions=2))
    steps, *_ = play(env, lambda a, o: 1)
    assert steps == [["alice"], ["bob"], ["alice"], ["bob"], ["alice"]]
    assert env.outcome.reward == 1 + 10 + 1 + 10 + 1


def test_env_matches_inline_run():
    scenario = ToyStar("star:3", rounds=2)
    policy = lambda a, o: 1 if a.startswith("worker") else 0  # noqa: E731
    _, outcome, decisions = run_inline(scenario, policy, seed=4)
    env = GraphEnv(scenario)
    steps, *_ = play(env, lambda a, o: policy(a, o), seed=4)
    assert env.outcome.reward == outcome.reward
    assert len(env.trace) == decisions


def test_node_failure_truncates_and_keeps_data():
    env = GraphEnv(ToyStar("star:2", rounds=2, fail_on=2))
    obs, infos = env.reset(seed=0)
    obs, *_ = env.step({"orchestrator": 0})
    obs, rewards, terms, truncs, infos = env.step({"worker_0": 1, "worker_1": 2})
    assert all(truncs.values()) and not any(terms.values())
    assert "worker_1 failed on action 2" in infos["worker_0"]["error"]
    assert len(env.trace) == 3
    assert env.agents == []


def test_invalid_action_raises_naming_the_agent():
    env = GraphEnv(ToyStar("star:2"))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"invalid action 7 for agent 'orchestrator'"):
        env.step({"orchestrator": 7})
    with pytest.raises(ValueError, match=r"no action for agent 'orchestrator'"):
        env.step({})


def test_invalid_action_penalty():
    class Lenient(ToyStar):
        invalid_action_penalty = -5.0

    env = GraphEnv(Lenient("star:1", rounds=0))
    env.reset(seed=0)
    _, rewards, terms, *_ = env.step({"orchestrator": 9})
    assert terms == {"orchestrator": True, "worker_0": False}  # worker_0: the closing step
    assert rewards["orchestrator"] == -5.0


def test_step_limit_truncates():
    env = GraphEnv(ToyStar("star:2", rounds=5), max_steps=3)
    steps, rewards, terms, truncs, infos = play(env, lambda a, o: 1)
    assert len(steps) == 3
    assert all(truncs.values())
    assert "step limit" in infos["orchestrator"]["error"]


def test_reset_mid_episode_starts_clean():
    env = GraphEnv(ToyStar("star:2"))
    env.reset(seed=0)
    env.step({"orchestrator": 1})
    obs, infos = env.reset(seed=1)
    assert list(obs) == ["orchestrator"]
    assert env.trace == []
    steps, *_ = play(env, lambda a, o: 1, seed=1)
    assert len(steps) == 5


def test_replay_values_and_cache():
    env = GraphEnv(ToyStar("star:2", rounds=1))
    play(env, lambda a, o: 2, seed=3)
    actions = env.episode_actions()
    assert env.value(3, env.possible_agents, actions) == env.outcome.reward == 4.0
    # absent workers take the default action 0
    assert env.value(3, ["orchestrator", "worker_0"], actions) == 2.0
    assert env.value(3, [], actions) == 0.0
    n = len(env._replays)
    env.value(3, ["worker_0", "orchestrator"], actions)
    assert len(env._replays) == n  # served from the cache
    with pytest.raises(ValueError, match="unknown agents"):
        env.value(3, ["nobody"], actions)


def test_replay_skip_absent_writes_nothing():
    env = GraphEnv(ToyStar("star:2", rounds=1))
    play(env, lambda a, o: 2, seed=3)
    # a skipped orchestrator routes nowhere: the run ends before any worker acts
    assert env.value(3, ["worker_0", "worker_1"], env.episode_actions(), absent="skip") == 0.0
    assert env.value(3, ["orchestrator"], env.episode_actions(), absent="skip") == 0.0


def test_replay_with_a_policy():
    env = GraphEnv(ToyStar("star:2", rounds=1))
    assert env.value(0, env.possible_agents, lambda a, o: 1) == 2.0


def test_rllib_view_only_acting_agents():
    from scenarios.rllib_env import RLlibGraphEnv

    env = RLlibGraphEnv({"env": GraphEnv(ToyStar("star:2", rounds=1))})
    obs, _ = env.reset(seed=0)
    assert list(obs) == ["orchestrator"]
    obs, rew, terms, _, _ = env.step({"orchestrator": 1})
    assert list(obs) == ["worker_0", "worker_1"] and not terms["__all__"]
    obs, rew, terms, _, _ = env.step({"worker_0": 1, "worker_1": 2})
    assert list(obs) == ["orchestrator"]
    obs, rew, terms, truncs, _ = env.step({"orchestrator": 0})
    assert terms["__all__"] and not truncs["__all__"]
    assert rew == {"orchestrator": 3.0, "worker_0": 3.0, "worker_1": 3.0}


@pytest.mark.parametrize(
    "factory",
    [
        lambda: ToyStar("star:3"),
        lambda: user_scenario(map_reduce_graph(), n_actions=4),
        lambda: user_scenario(join_graph()),
        lambda: user_scenario(handoff_graph(), n_actions=2),
    ],
    ids=["star", "send", "join", "command"],
)
def test_conformance(factory):
    check_scenario(factory, cycles=100)


def test_subgraph_agents_are_rejected_with_a_fix():
    from langgraph.graph import END, START, StateGraph

    inner = map_reduce_graph().compile()
    outer = StateGraph(dict)
    outer.add_node("team", inner)
    outer.add_edge(START, "team")
    outer.add_edge("team", END)
    with pytest.raises(ScenarioError, match="flatten"):
        GraphEnv(user_scenario(outer))


def test_observation_is_own_view():
    env = GraphEnv(ToyStar("star:2"))
    obs, _ = env.reset(seed=0)
    assert env.observation_space("orchestrator").contains(obs["orchestrator"])
    assert isinstance(obs["orchestrator"], np.ndarray)


def test_node_metadata_marks_nodes_of_an_app_you_cannot_edit():
    scenario = user_scenario(join_graph())
    assert scenario.possible_agents == ["a", "b", "c"]
    from scenarios.custom import GraphScenario

    def build(**kw):
        return GraphScenario(
            join_graph(), observation_space=toys.OBS,
            action_space=gym.spaces.Discrete(3), score=lambda s: 0.0,
            initial_state={"results": []}, **kw,
        )  # fmt: skip

    marked = build(node_metadata={"c": {"agent": False}})
    assert marked.possible_agents == ["a", "b"]
    with pytest.raises(ScenarioError, match=r"names \['z'\]"):
        build(node_metadata={"z": {"agent": False}})


def test_rllib_view_reseeds_only_on_a_new_seed():
    """RLlib passes its config seed to every reset when sampling complete episodes."""
    from scenarios.rllib_env import RLlibGraphEnv

    env = RLlibGraphEnv({"env": GraphEnv(ToyStar("star:2", rounds=1)), "seed_once": True})
    env.reset(seed=5)
    first = env.env.seed_used
    env.reset(seed=5)
    assert env.env.seed_used != first  # the episode stream goes on
    env.reset(seed=6)
    again = RLlibGraphEnv({"env": GraphEnv(ToyStar("star:2", rounds=1))})
    again.reset(seed=6)
    assert env.env.seed_used == again.env.seed_used == 6


def test_blank_observation_lies_in_its_space():
    from scenarios.graph_env import blank_observation

    spaces = [
        gym.spaces.Box(1.0, 2.0, (3,), np.float32),
        gym.spaces.Discrete(4, start=2),
        gym.spaces.MultiDiscrete([3, 4]),
        gym.spaces.MultiBinary(3),
        gym.spaces.Dict({"a": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}),
        gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(0, 5, (1,), np.int64))),
        gym.spaces.Text(5),  # no zero: a seeded sample
    ]
    for space in spaces:
        assert space.contains(blank_observation(space)), space
    assert blank_observation(gym.spaces.Text(5)) == blank_observation(gym.spaces.Text(5))


def test_graph_env_takes_its_settings_at_construction():
    from scenarios.reward_sources import RewardSources
    from scenarios.rllib_env import RLlibGraphEnv
    from scenarios.tool_latency import ToolSettings
    from scenarios.toolchain import Toolchain

    scenario = Toolchain("chain:3")
    rewards = RewardSources.from_spec({"sources": [{"kind": "verifier"}]}, scenario)
    tools = ToolSettings.of(None, 5.0)
    env = GraphEnv(
        scenario, engine="langgraph", episode_timeout_s=7.0, rewards=rewards, tools=tools
    )
    assert (env.engine, env.episode_timeout_s, env.rewards, env.tools) == (
        "langgraph",
        7.0,
        rewards,
        tools,
    )
    # RLlib's env builds its GraphEnv with the env config's settings
    view = RLlibGraphEnv(
        {
            "scenario": "toolchain",
            "topology": "chain:3",
            "engine": "langgraph",
            "episode_timeout_s": 7.0,
            "rewards": {"sources": [{"kind": "verifier"}]},
            "tool_timeout_s": 5.0,
        }
    )
    inner = view.env
    assert (inner.engine, inner.episode_timeout_s) == ("langgraph", 7.0)
    assert isinstance(inner.rewards, RewardSources) and inner.tools == tools
    plain = RLlibGraphEnv({"scenario": "toolchain", "topology": "chain:3"}).env
    assert plain.rewards is None and plain.tools is None
    assert plain.episode_timeout_s == GraphEnv(scenario).episode_timeout_s
