"""Reward sources (``scenarios.reward_sources``, ``trainers.signals.rewards``): composition math
by hand, per-turn payment to the acting agent, judge voting with scripted judges of known noise,
judge timeouts and failures named and counted, the toolchain checklist as a source equal to the
old reward, per-source normalisation, the config section, and a chat app written the way
LangGraph's docs write apps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments import judges as scripted
from scenarios.decisions import run_inline
from scenarios.graph_env import GraphEnv
from scenarios.reward_sources import (
    JudgeError,
    JudgeRequest,
    RewardSources,
    Turn,
    render_transcript,
    run_judges,
    to_turn,
    vote,
)
from scenarios.toolchain import COMMUTATIVE, CRITERIA, OPS, Toolchain
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.rewards import RewardsConfig
from trainers.configs.typed import ConfigError
from trainers.signals.rewards import per_source_rewards


def play(env: GraphEnv, policy, seed: int) -> tuple[dict[str, float], list[dict[str, float]]]:
    """One episode; returns each agent's return and every step's rewards."""
    obs, infos = env.reset(seed=seed)
    returns = dict.fromkeys(env.possible_agents, 0.0)
    steps = []
    sc = env.scenario
    while env.agents:
        actions = {
            a: policy(a, obs[a]) if infos[a]["acting"] else sc.default_action(a) for a in env.agents
        }
        obs, rewards, _, _, infos = env.step(actions)
        steps.append(rewards)
        for a, r in rewards.items():
            returns[a] += r
    return returns, steps


def with_sources(scenario, spec) -> GraphEnv:
    env = GraphEnv(scenario)
    env.rewards = RewardSources.from_spec(spec, scenario)
    return env


# ----- composition ------------------------------------------------------------------------------
def test_composition_by_hand_end_and_turn_sources_on_toolchain():
    tc = Toolchain("chain:3")
    spec = {
        "sources": [
            {"name": "exact", "kind": "verifier", "weight": 0.5},
            {
                "name": "steps",
                "kind": "checklist",
                "weight": 2.0,
                "criteria_weights": {"right_tool": 1.0},
            },
            {"name": "calls", "kind": "shaping", "weight": 0.1, "when": "turn"},
        ]
    }
    env = with_sources(tc, spec)
    returns, steps = play(env, tc.optimal_policy(), seed=3)
    # the optimal four calls meet every criterion and answer right: verifier 0.1·3 + 1 = 1.3;
    # checklist weights right_tool 1.0, valid_args 0.1, result_used 0.1 → 1.2
    end = 0.5 * 1.3 + 2.0 * 1.2
    assert env.outcome.reward == pytest.approx(end)
    assert env.outcome.metrics["reward/exact"] == pytest.approx(0.65)
    assert env.outcome.metrics["reward/steps"] == pytest.approx(2.4)
    assert env.outcome.metrics["reward/calls"] == pytest.approx(0.4)  # four calls
    assert env.outcome.metrics["reward/steps/right_tool"] == 1.0
    # agent_0 looks k1 up, agent_1 k2, agent_2 calcs and answers (passes are no calls)
    assert returns == pytest.approx(
        {"agent_0": end + 0.1, "agent_1": end + 0.1, "agent_2": end + 0.2}
    )
    assert env.outcome.success and env.outcome.metrics["calls"] == 4.0


def test_per_turn_reward_is_paid_to_the_acting_agent_at_its_step():
    tc = Toolchain("chain:3")
    spec = {"sources": [{"name": "calls", "kind": "shaping", "weight": 1.0, "when": "turn"}]}
    env = with_sources(tc, spec)
    _, infos = env.reset(seed=1)
    policy = tc.optimal_policy()
    obs = {a: env._last_obs[a] for a in env.agents}
    paid = []
    while env.agents:
        acting = [a for a in env.agents if infos[a]["acting"]]
        actions = {a: policy(a, obs[a]) for a in env.agents}
        calls = {a: float(actions[a][0] != 3) for a in acting}
        obs, rewards, _, _, infos = env.step(actions)
        if not env.finished:
            assert rewards == {a: calls.get(a, 0.0) for a in rewards}
        paid.append(rewards)
    first = paid[0]
    assert first["agent_0"] == 1.0 and set(first) == {"agent_0"}  # the lookup of k1, now
    parts = infos["agent_2"]["reward_parts"]
    assert parts == {"calls": 2.0} and infos["agent_2"]["reward_weights"] == {"calls": 1.0}
    assert env.outcome.reward == 0.0  # no end source: the episode pays only per turn


def test_without_sources_the_env_pays_the_verifier_exactly():
    tc = Toolchain("chain:3")
    plain = GraphEnv(tc)
    returns, _ = play(plain, tc.optimal_policy(), seed=5)
    env = with_sources(tc, {"sources": [{"name": "v", "kind": "verifier"}]})
    again, _ = play(env, tc.optimal_policy(), seed=5)
    assert returns == again and plain.outcome.reward == env.outcome.reward
    assert "reward_parts" not in plain._observe(plain.possible_agents)[1]["agent_0"]


# ----- the toolchain checklist as a source ------------------------------------------------------
def old_toolchain_reward(tc: Toolchain, state) -> float:
    """The hand-written checklist reward as it was before it became a Checklist (verbatim)."""
    task, calls = state["task"], state.get("calls", [])
    k1, k2, (op, _) = f"L{task['k1']}", f"L{task['k2']}", OPS[task["op"]]
    combos = {f"{op}({k1},{k2})"} | ({f"{op}({k2},{k1})"} if op in COMMUTATIVE else set())
    have: set[str] = set()
    marks = []
    for i, call in enumerate(calls):
        needed = "lookup" if not {k1, k2} <= have else "answer" if combos & have else "calc"
        later = calls[i + 1 :]
        used = call["tool"] == "answer" or any(
            c["ok"] and i in ((c["x"], c["y"]) if c["tool"] == "calc" else (c["x"],))
            for c in later
            if c["tool"] != "lookup"
        )
        marks.append(
            {
                "right_tool": call["tool"] == needed,
                "valid_args": call["ok"],
                "result_used": call["ok"] and used,
            }
        )
        if call["ok"]:
            have.add(call["src"])
    fractions = {c: sum(m[c] for m in marks) / len(marks) if marks else 0.0 for c in CRITERIA}
    answer = state.get("answer")
    final = tc.final_weight * (answer is not None and answer == tc.target(state))
    return sum(tc.weights[c] * f for c, f in fractions.items()) + final


def random_policy(tc: Toolchain, seed: int):
    rng = np.random.default_rng(seed)
    optimal = tc.optimal_policy()

    def policy(agent, obs):
        if rng.random() < 0.5:
            return optimal(agent, obs)
        return rng.integers(0, [4, 4, 8, 8])

    return policy


def test_toolchain_checklist_as_a_source_equals_the_old_reward_bit_for_bit():
    weights = {"right_tool": 0.3, "valid_args": 0.1, "result_used": 0.2}
    tc = Toolchain("chain:2", checklist_weights=weights)
    bare = Toolchain("chain:2", checklist_weights=dict.fromkeys(CRITERIA, 0.0))
    spec = {
        "sources": [
            {"name": "answer", "kind": "verifier"},
            {"name": "checklist", "kind": "checklist", "criteria_weights": weights},
        ]
    }
    env, plain = with_sources(bare, spec), GraphEnv(tc)
    for seed in range(60):
        play(plain, random_policy(tc, seed), seed)
        play(env, random_policy(tc, seed), seed)
        assert env.trace and [t.action.tolist() for t in env.trace] == [
            t.action.tolist() for t in plain.trace
        ]
        # the refactor changed nothing, and the checklist as a source gives the same bits
        assert plain.outcome.reward == old_toolchain_reward(tc, plain.final_state)
        assert env.outcome.reward == plain.outcome.reward


# ----- judges -----------------------------------------------------------------------------------
def toolchain_requests(n: int) -> list[JudgeRequest]:
    """Real episodes of toolchain (some solved) as judge requests."""
    tc = Toolchain("single")
    env = GraphEnv(tc)
    out = []
    for seed in range(n):
        play(env, random_policy(tc, seed), seed)
        turns = tuple(to_turn(tc, t) for t in env.trace)
        out.append(JudgeRequest("", render_transcript(turns), env.final_state, turns, tc, seed))
    return out


def test_majority_of_noisy_judges_agrees_with_the_exact_verifier_far_more_than_one():
    requests = toolchain_requests(400)
    exact = [scripted.exact_verdict(r) for r in requests]
    assert 0.1 < np.mean(exact) < 0.9  # both verdicts occur (flips are symmetric)
    agree = {}
    for k in (1, 3, 5):
        panel = [(f"noisy_{i}", scripted.noisy_verifier(0.2, seed=i)) for i in range(k)]
        hits = 0
        for r, truth in zip(requests, exact, strict=True):
            scores, failed = run_judges(panel, r, timeout_s=60)
            assert not failed
            hits += vote(list(scores.values()), "majority")[0] == truth
        agree[k] = hits / len(requests)
    # binomial: one judge agrees 80% of the time, 3 judges 89.6%, 5 judges 94.2%
    assert 0.74 < agree[1] < 0.86
    assert agree[3] > agree[1] + 0.05 and agree[5] > agree[1] + 0.09


def test_vote_and_disagreement_by_hand():
    assert vote([1.0, 0.9, 0.0, 0.2, 0.7], "majority") == (1.0, 0.4)
    assert vote([0.0, 0.0, 1.0], "majority") == (0.0, pytest.approx(1 / 3))
    assert vote([1.0, 0.0], "majority") == (0.5, 0.5)
    value, spread = vote([0.2, 0.4, 0.9], "mean")
    assert value == pytest.approx(0.5) and spread == pytest.approx((0.3 + 0.1 + 0.4) / 3)
    assert vote([3.0, 1.0, 2.5], "majority", threshold=2.0) == (1.0, pytest.approx(1 / 3))


def judge_spec(judges, **extra):
    return {"sources": [{"name": "judged", "kind": "judge", "judges": judges, **extra}]}


def test_a_hanging_judge_times_out_is_counted_and_left_out_of_the_vote():
    tc = Toolchain("single")
    spec = judge_spec(
        [
            {"ref": "experiments.judges:hanging", "kwargs": {"seconds": 600}, "name": "slow"},
            {"ref": "experiments.judges:exact_verdict"},
            {"ref": "experiments.judges:exact_verdict"},
        ],
        timeout_s=0.2,
        on_failure="skip",
    )
    env = with_sources(tc, spec)
    play(env, tc.optimal_policy(), seed=0)
    m = env.outcome.metrics
    assert env.outcome.reward == 1.0  # the two exact judges: solved
    assert m["reward/judge_failures"] == 1.0 and m["reward/judge_failures/slow"] == 1.0
    assert m["reward/judge_disagreement"] == 0.0


def test_a_raising_judge_is_named_in_the_error_or_counted_under_its_name():
    tc = Toolchain("single")
    failing = {"ref": "experiments.judges:failing", "kwargs": {"message": "backend 503"}}
    env = with_sources(tc, judge_spec([{**failing, "name": "gpt-judge"}]))
    with pytest.raises(JudgeError, match=r"judge 'gpt-judge' raised RuntimeError: backend 503"):
        play(env, tc.optimal_policy(), seed=0)
    spec = judge_spec([failing, "experiments.judges:exact_verdict"], on_failure="skip")
    env = with_sources(tc, spec)
    play(env, tc.optimal_policy(), seed=0)
    assert env.outcome.metrics["reward/judge_failures/failing_0"] == 1.0
    assert env.outcome.reward == 1.0
    env = with_sources(tc, judge_spec([failing], on_failure="skip"))
    with pytest.raises(JudgeError, match="every judge failed"):
        play(env, tc.optimal_policy(), seed=0)


def test_a_judge_returning_no_number_is_a_failure_not_a_zero():
    tc = Toolchain("single")
    env = with_sources(tc, judge_spec([lambda request: None]))
    with pytest.raises(JudgeError, match="returned None, not a finite number"):
        play(env, tc.optimal_policy(), seed=0)


def test_length_biased_judge_pays_longer_transcripts_more():
    tc = Toolchain("single")
    judge = scripted.length_biased(bias=1.0, scale=1000)
    short = (Turn("agent", 0, None, None, "ok"),)
    long = (Turn("agent", 0, None, None, "ok " * 100),)
    state = run_inline(tc, tc.optimal_policy(), seed=0)[0]
    a = judge(JudgeRequest("", "", state, short, tc, 0))
    b = judge(JudgeRequest("", "", state, long, tc, 0))
    assert a == pytest.approx(1.0 + 2 / 1000) and b == pytest.approx(1.0 + 300 / 1000)


# ----- per-source normalisation ------------------------------------------------------------------
def test_per_source_normalisation_by_hand():
    # two sources in one group of 3: a large "tool" term and a small "params" term
    parts = [
        {"tool": 10.0, "params": 0.0},
        {"tool": 0.0, "params": 0.1},
        {"tool": 10.0, "params": 0.1},
    ]
    totals = [10.0, 0.1, 10.1]
    out = per_source_rewards(parts, totals, {"tool": 10.0, "params": -0.1}, [0, 0, 0], eps=0.0)
    z_tool = (np.array([10, 0, 10]) - 20 / 3) / np.std([10, 0, 10])
    z_params = (np.array([0, 0.1, 0.1]) - 0.2 / 3) / np.std([0, 0.1, 0.1])
    np.testing.assert_allclose(out, 10 * z_tool + 0.1 * z_params)
    # a remainder (a penalty no source names) is one more component; groups are apart
    out = per_source_rewards([{"a": 1.0}, {"a": 1.0}], [1.0, 0.0], {"a": 1.0}, [0, 0], eps=0.0)
    np.testing.assert_allclose(out, [1.0, -1.0])
    out = per_source_rewards([{"a": 1.0}, {"a": 0.0}], [1.0, 0.0], {"a": 1.0}, [0, 1])
    np.testing.assert_allclose(out, [0.0, 0.0])


# ----- config -----------------------------------------------------------------------------------
def test_rewards_config_round_trips_and_reaches_the_env_config():
    cfg = ExperimentConfig(
        scenario="toolchain",
        rewards={
            "sources": [
                {"name": "exact", "kind": "verifier", "weight": 0.5},
                {
                    "name": "panel",
                    "kind": "judge",
                    "judges": [{"ref": "experiments.judges:noisy_verifier", "kwargs": {"seed": 1}}],
                },
            ],
            "normalize": "per_source",
        },
    ).check()
    assert ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg
    from trainers.plan import resolve

    spec = resolve(cfg, ray_workers=False).env
    assert spec.rewards["sources"][1]["judges"][0]["kwargs"] == {"seed": 1}
    assert resolve(ExperimentConfig(scenario="toolchain"), ray_workers=False).env.rewards is None


@pytest.mark.parametrize(
    ("rewards", "match"),
    [
        ({"sources": [{"name": "a"}, {"name": "a"}]}, r"names \['a'\] repeat"),
        ({"sources": [{"name": "v", "when": "turn"}]}, r"sources\[0\]\.when='turn'"),
        ({"sources": [{"name": "j", "kind": "judge"}]}, r"sources\[0\]\.judges is empty"),
        ({"sources": [{"name": "v", "vote": "mean"}]}, r"sources\[0\]\.vote is set but kind"),
        ({"sources": [{"name": "x y"}]}, r"sources\[0\]\.name='x y'"),
        ({"sources": [{"name": "w", "weight": math.inf}]}, r"sources\[0\]\.weight=inf"),
        ({"normalize": "per_source"}, "needs rewards.sources"),
        (
            {"sources": [{"name": "j", "kind": "judge", "judges": [{"ref": "nope.mod:judge"}]}]},
            r"judges\[0\]\.ref='nope.mod:judge' cannot be imported",
        ),
        ({"sources": [{"name": "s", "kind": "shaping", "term": "nope.mod:f"}]}, "term"),
    ],
)
def test_bad_rewards_config_is_one_line_naming_the_field(rewards, match):
    with pytest.raises(ConfigError, match=match) as err:
        ExperimentConfig(scenario="toolchain", rewards=rewards).check()
    assert "\n" not in str(err.value)


def test_counterfactual_credit_refuses_sources_its_replays_would_not_score():
    from trainers.plan import resolve

    shaping = {"name": "calls", "kind": "shaping", "when": "turn"}
    cfg = ExperimentConfig(
        scenario="toolchain", credit={"method": "loo"}, rewards={"sources": [shaping]}
    )
    with pytest.raises(ConfigError, match=r"credit 'loo' values agents by the scenario's verif"):
        resolve(cfg, ray_workers=False)
    plain = {"sources": [{"name": "exact", "kind": "verifier"}]}
    resolve(
        cfg.replace(rewards=plain), ray_workers=False
    )  # the verifier alone is what replays score
    resolve(cfg.replace(**{"credit.method": "team"}), ray_workers=False)


def test_rewards_config_types_are_checked_at_construction():
    with pytest.raises(ConfigError, match=r"rewards\.sources\[0\]\.weight must be a number"):
        RewardsConfig(sources=[{"name": "a", "weight": "heavy"}])
    with pytest.raises(ConfigError, match="kind"):
        RewardsConfig(sources=[{"name": "a", "kind": "oracle"}])


def test_checklist_source_needs_a_checklist_the_scenario_or_config_gives():
    from scenarios.base import ScenarioError
    from scenarios.delegate import Delegate

    with pytest.raises(ScenarioError, match="declares no reward_checklist"):
        RewardSources.from_spec({"sources": [{"name": "c", "kind": "checklist"}]}, Delegate())
    with pytest.raises(ScenarioError, match="use when: end"):
        spec = {"sources": [{"name": "c", "kind": "checklist", "when": "turn"}]}
        RewardSources.from_spec(spec, Toolchain())


# ----- a user's chat app --------------------------------------------------------------------------
def docs_style_app(models):
    """Two agents in a row, written as LangGraph's docs write apps (MessagesState, nodes that
    invoke their chat model)."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    researcher, writer = models["researcher"], models["writer"]

    def research(state: MessagesState):
        return {"messages": [researcher.invoke(state["messages"])]}

    def write(state: MessagesState):
        return {"messages": [writer.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("researcher", research)
    builder.add_node("writer", write)
    builder.add_edge(START, "researcher")
    builder.add_edge("researcher", "writer")
    builder.add_edge("writer", END)
    return builder.compile()


def mentions_answer(request: JudgeRequest) -> float:
    """A scripted rubric judge: the transcript states the answer."""
    return float("42" in request.transcript)


def test_reward_sources_on_a_chat_app_pay_the_tool_call_to_the_agent_that_made_it():
    pytest.importorskip("transformers")
    from marl_agents.llm.chat_app import ChatAppScenario
    from marl_agents.llm.env_chat_model import tokens_action

    sc = ChatAppScenario(
        docs_style_app,
        tasks=["What is 6 times 7?"],
        verifier=lambda s: "42" in str(s["messages"][-1].content),
        max_prompt_tokens=256,
        max_new_tokens=48,
    )
    spec = {
        "sources": [
            {"name": "verifier", "kind": "verifier"},
            {"name": "rubric", "kind": "judge", "judges": [mentions_answer], "weight": 0.5},
            {"name": "tools", "kind": "shaping", "when": "turn", "weight": 0.25},
        ]
    }
    env = with_sources(sc, spec)
    lines = {
        "researcher": '<tool>{"name": "calc", "arguments": {"x": 6}}</tool>',
        "writer": "42",
    }

    def policy(agent, obs):
        return tokens_action(sc.spaces, sc.tokenizer, lines[agent])

    returns, _ = play(env, policy, seed=0)
    assert env.outcome.metrics["reward/verifier"] == 1.0
    assert env.outcome.metrics["reward/rubric"] == 0.5
    assert env.outcome.metrics["reward/tools"] == 0.25
    assert returns == pytest.approx({"researcher": 1.75, "writer": 1.5})


def test_rllib_env_builds_the_sources_from_its_config_and_final_infos_carry_the_parts():
    pytest.importorskip("ray")
    from scenarios.rllib_env import RLlibGraphEnv

    rewards = RewardsConfig(
        sources=[
            {"name": "exact", "kind": "verifier", "weight": 2.0},
            {"name": "calls", "kind": "shaping", "when": "turn", "weight": 0.5},
        ],
        normalize="per_source",
    ).to_spec()
    env = RLlibGraphEnv({"scenario": "toolchain", "topology": "chain:3", "rewards": rewards})
    policy = env.env.scenario.optimal_policy()
    obs, _ = env.reset(seed=0)
    returns: dict[str, float] = {}
    while True:
        obs, rew, terms, truncs, infos = env.step({a: policy(a, o) for a, o in obs.items()})
        for a, r in rew.items():
            returns[a] = returns.get(a, 0.0) + r
        if terms["__all__"] or truncs["__all__"]:
            break
    # verifier 2 × 1.3 = 2.6 to everyone; 0.5 per call to whoever made it (1, 1 and 2 calls)
    assert returns == pytest.approx({"agent_0": 3.1, "agent_1": 3.1, "agent_2": 3.6})
    assert infos["agent_2"]["reward_parts"] == pytest.approx({"exact": 2.6, "calls": 1.0})
    assert infos["agent_2"]["reward_normalize"] == "per_source"


def test_a_frozen_llm_judge_scores_from_its_reply_or_fails_by_name():
    pytest.importorskip("transformers")
    from marl_agents.llm.judges import parse_score

    assert parse_score("Score: 0.75.") == 0.75 and parse_score("-3", 0, 1) == 0.0
    with pytest.raises(ValueError, match="holds no score"):
        parse_score("excellent work")
    tc = Toolchain("single")
    spec = judge_spec(
        [
            {"ref": "marl_agents.llm.judges:llm_judge", "kwargs": {"path": "tiny"}, "name": "tiny"},
            "experiments.judges:exact_verdict",
        ],
        rubric="Did the agent answer correctly?",
        on_failure="skip",
        vote="mean",
    )
    env = with_sources(tc, spec)
    play(env, tc.optimal_policy(), seed=0)
    m = env.outcome.metrics
    # the random tiny model either writes a number (a score in [0, 1]) or not (a failure
    # counted under its name): never a silent 0
    if m["reward/judge_failures"]:
        assert m["reward/judge_failures/tiny"] == 1.0 and env.outcome.reward == 1.0
    else:
        assert 0.5 <= env.outcome.reward <= 1.0


def test_grpo_reads_per_source_parts_from_the_episodes_final_infos():
    pytest.importorskip("ray")
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from trainers.signals.rewards import per_source_from_episodes

    def episode(parts, total, normalize="per_source"):
        info = {"reward_parts": parts, "reward_weights": {"a": 1.0, "b": 0.1}}
        info["reward_normalize"] = normalize
        e = SingleAgentEpisode(observations=[0], infos=[{}])
        e.add_env_step(1, 0, total, infos=info, terminated=True)
        return e

    eps = [episode({"a": 1.0, "b": 0.0}, 1.0), episode({"a": 0.0, "b": 0.1}, 0.1)]
    rewards, groups = np.array([1.0, 0.1], np.float32), np.array([0, 0])
    out = per_source_from_episodes(eps, rewards, groups)
    # z-scores of a: (+1, −1); of b: (−1, +1) → 1·z_a + 0.1·z_b
    np.testing.assert_allclose(out, [0.9, -0.9], rtol=1e-5)
    summed = [episode({"a": 1.0}, 1.0, "sum"), episode({"a": 0.0}, 0.0, "sum")]
    assert per_source_from_episodes(summed, rewards, groups) is rewards


def test_train_reports_each_source_and_the_judges(ray_session, tmp_path):
    from configs import tiny_config

    from trainers.run.loop import train

    rewards = {
        "sources": [
            {"name": "exact", "kind": "verifier", "weight": 0.5},
            {
                "name": "panel",
                "kind": "judge",
                "judges": [
                    {"ref": "experiments.judges:noisy_verifier", "kwargs": {"seed": i}}
                    for i in range(3)
                ],
            },
        ]
    }
    cfg = tiny_config(tmp_path, scenario="delegate", topology="star:2", rewards=rewards)
    result = train(cfg.replace(**{"budget.iterations": 1}))
    row = result.history[-1]
    assert {"charts/reward/exact", "charts/reward/panel"} <= row.keys()
    assert row["charts/reward/judge_failures"] == 0.0
    assert 0.0 <= row["charts/reward/judge_disagreement"] <= 1 / 3
    assert row["charts/team_return"] == pytest.approx(
        row["charts/reward/exact"] + row["charts/reward/panel"]
    )
