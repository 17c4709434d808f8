"""Tests of ``text-toolchain``: toolchain's task and checklist behind a token-id text interface."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")

from scenarios import ScenarioError
from scenarios.decisions import run_inline
from scenarios.graph_env import GraphEnv
from scenarios.registry import REGISTRY, build, make
from scenarios.testing import check_scenario
from scenarios.text_space import make_tiny_tokenizer
from scenarios.text_toolchain import TextToolchain
from scenarios.toolcalls import render_tool_call
from scenarios.toolchain import ANSWER, CALC, DONE, LOOKUP, Toolchain

FULL = 0.1 * 3 + 1.0  # toolchain's default weights: every criterion met, answer correct
PENALTY = 0.1


@pytest.fixture(scope="module")
def tok() -> Any:
    return make_tiny_tokenizer()


def call(name: str, **args: Any) -> str:
    return render_tool_call(name, args)


class Script:
    """Plays fixed texts per agent (``done`` once they run out), as token-id actions."""

    def __init__(self, tt: TextToolchain, texts: dict[str, list[str]]) -> None:
        self.tt = tt
        self.texts = {a: list(t) for a, t in texts.items()}

    def __call__(self, agent: str, obs: np.ndarray) -> np.ndarray:
        queue = self.texts.get(agent, [])
        return self.tt.action_of(queue.pop(0) if queue else call("done"))


def play(env: GraphEnv, policy: Any, seed: int) -> float:
    obs, infos = env.reset(seed=seed)
    total = 0.0
    while env.agents:
        acts = {
            a: policy(a, obs[a]) if infos[a]["acting"] else env.action_space(a).sample()
            for a in env.agents
        }
        obs, rewards, *_, infos = env.step(acts)
        total += sum(rewards.values()) / max(len(rewards), 1)
    return total


def test_registered_and_built_by_name(tok: Any) -> None:
    assert REGISTRY["text-toolchain-v0"] is TextToolchain
    env = make("text-toolchain", topology="chain:2", tokenizer=tok, max_new_tokens=32)
    assert env.possible_agents == ["agent_0", "agent_1"]
    space = env.action_space("agent_0")
    assert space.shape == (32,) and int(space.nvec[0]) == len(tok) + 1
    assert env.observation_space("agent_1").shape == (1024,)
    with pytest.raises(ScenarioError, match="unknown agent 'agent'"):
        env.scenario.action_space("agent")


@pytest.mark.parametrize("spec", ["single", "chain:2", "chain:3"])
def test_scripted_token_policy_reaches_the_oracle_through_graphenv(spec: str, tok: Any) -> None:
    tt = TextToolchain(spec, tokenizer=tok)
    env = GraphEnv(tt)
    for seed in range(3):
        total = play(env, tt.optimal_policy(), seed)
        assert env.outcome is not None and env.outcome.success
        assert env.outcome.reward == pytest.approx(FULL)
        assert tt.oracle_value(np.random.default_rng(seed)) == pytest.approx(FULL)
        assert total == pytest.approx(FULL)
        assert env.outcome.metrics["format_errors"] == 0 and env.outcome.metrics["calls"] == 4


@pytest.mark.parametrize("spec", ["single", "chain:3"])
def test_same_task_and_reward_as_toolchain(spec: str, tok: Any) -> None:
    """Task generation is toolchain's: same seed → same task, same optimal reward."""
    tt, tc = TextToolchain(spec, tokenizer=tok), Toolchain(spec)
    for seed in range(4):
        text_state, text_out, _ = run_inline(tt, tt.optimal_policy(), seed)
        base_state, base_out, _ = run_inline(tc, tc.optimal_policy(), seed)
        assert text_state["task"] == base_state["task"]
        assert text_state["table"] == base_state["table"]
        assert text_state["answer"] == base_state["answer"] == tc.target(base_state)
        assert text_out.reward == pytest.approx(base_out.reward)


def test_checklist_matches_toolchain_on_an_imperfect_run(tok: Any) -> None:
    """Invalid calls, a wrong tool and an unused result are judged exactly as in toolchain.

    (An ``answer`` call ends an episode whether or not it is valid, as in toolchain.)
    """
    tt, tc = TextToolchain("single", tokenizer=tok), Toolchain("single")
    seed = 5
    task = tc.initial_state(np.random.default_rng(seed))["task"]
    k1, k2, op = task["k1"], task["k2"], task["op"]
    texts = [
        call("lookup", key=99),  # valid format, invalid key: executed, ok=False
        call("calc", op="add", x=5, y=6),  # wrong tool, empty registers
        call("lookup", key=k1),
        call("lookup", key=k2),
        call("lookup", key=k1),  # unused duplicate
        call("calc", op=["add", "sub", "mul", "max"][op], x=2, y=3),
        call("answer", x=5),
    ]
    actions = [
        [LOOKUP, 99, 0, 0],
        [CALC, 0, 5, 6],
        [LOOKUP, k1, 0, 0],
        [LOOKUP, k2, 0, 0],
        [LOOKUP, k1, 0, 0],
        [CALC, op, 2, 3],
        [ANSWER, 0, 5, 0],
    ]
    _, text_out, _ = run_inline(tt, Script(tt, {"agent": texts}), seed)
    state = tc.initial_state(np.random.default_rng(seed))  # toolchain's own tools and judge
    log: list[dict[str, Any]] = []
    for tool, arg, x, y in actions:
        log.append({**tc.run_tool(state, log, tool, arg, x, y), "agent": "agent"})
    base_out = tc.score({**state, "calls": log, "answer": log[-1]["value"]})
    assert text_out.reward == pytest.approx(base_out.reward)
    assert text_out.metrics == {**base_out.metrics, "format_errors": 0.0, "turns": 7.0}
    assert text_out.success and text_out.reward < FULL


def test_format_errors_are_penalised_and_the_episode_goes_on(tok: Any) -> None:
    tt = TextToolchain("single", tokenizer=tok, format_penalty=PENALTY)
    seed = 1
    task = tt.initial_state(np.random.default_rng(seed))["task"]
    op = ["add", "sub", "mul", "max"][task["op"]]
    texts = [
        "I will look it up.",  # no call
        '<tool>{"name": "lookup", "arguments": {"key": 1</tool>',  # bad JSON
        call("lookup", key=task["k1"]) + call("lookup", key=task["k2"]),  # two calls
        call("search", q="x"),  # unknown tool
        "Sure. " + call("lookup", key=task["k1"]),  # text around one call is fine
        call("lookup", key=task["k2"]),
        call("calc", op=op, x=0, y=1),
        call("answer", x=2),
    ]
    env = GraphEnv(tt)
    total = play(env, Script(tt, {"agent": texts}), seed)
    out = env.outcome
    assert out is not None and out.success and out.metrics["format_errors"] == 4
    assert out.metrics["calls"] == 4 and out.metrics["turns"] == 8
    assert out.reward == pytest.approx(FULL - 4 * PENALTY) == total
    assert out.local == {"agent": pytest.approx(FULL - 4 * PENALTY)}
    # the agent saw its own format errors in the prompt that followed them
    prompt = tt.spaces.prompt_text(env.trace[4].observation, tok)
    assert prompt.count("Format error:") == 4 and "2 tool calls" in prompt


def test_random_token_actions_use_up_the_turn_budget(tok: Any) -> None:
    tt = TextToolchain("single", tokenizer=tok, max_turns=6)
    env = GraphEnv(tt)
    env.action_space("agent").seed(0)
    for seed in range(3):
        play(env, lambda a, o: env.action_space(a).sample(), seed)
        out = env.outcome
        assert out is not None and not env.truncated and env.error is None
        assert out.metrics["turns"] == 6 and out.metrics["format_errors"] == 6
        assert out.reward == pytest.approx(-6 * PENALTY)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (call("lookup", key=3), (LOOKUP, 3, 0, 0)),
        (call("calc", op="mul", x=0, y=1), (CALC, 2, 0, 1)),
        (call("calc", op="pow", x=0, y=1), (CALC, 4, 0, 1)),  # executed as an invalid call
        (call("answer", x=2), (ANSWER, 0, 2, 0)),
        (call("done"), (DONE, 0, 0, 0)),
        ("thinking... " + call("lookup", key=0) + " ok", (LOOKUP, 0, 0, 0)),
        ("", "0 tool calls"),
        (call("lookup", key=-1), "integer >= 0"),
        (call("lookup", key=True), "integer >= 0"),
        (call("lookup", key="3"), "integer >= 0"),
        (call("lookup", k=3), "takes arguments ['key']"),
        (call("calc", op=2, x=0, y=1), '"op" must be a string'),
        (call("delete", key=1), "unknown tool"),
        ("<tool>lookup 3</tool>", "not valid JSON"),
    ],
)
def test_parse(text: str, expected: Any, tok: Any) -> None:
    fields, error = TextToolchain("single", tokenizer=tok).parse(text)
    if isinstance(expected, tuple):
        assert (fields, error) == (expected, "")
    else:
        assert fields is None and expected in error


def test_views_follow_toolchain_visibility(tok: Any) -> None:
    tt = TextToolchain("chain:3", tokenizer=tok)
    state = tt.initial_state(np.random.default_rng(0))
    t = state["task"]
    op = ["add", "sub", "mul", "max"][t["op"]]
    lines = {a: tt.messages(a, state)[1]["content"] for a in tt.possible_agents}
    assert lines == {
        "agent_0": f"Task: k1 = {t['k1']}, k2 = ?, op = ?.",
        "agent_1": f"Task: k1 = ?, k2 = {t['k2']}, op = ?.",
        "agent_2": f"Task: k1 = ?, k2 = ?, op = {op}.",
    }
    obs = tt.observe("agent_0", state)
    assert tt.observation_space("agent_0").contains(obs)
    assert tt.spaces.prompt_text(obs, tok).startswith("<|im_start|>system\nYou are agent_0")


def test_failing_tool_truncates_the_episode_with_the_error(tok: Any) -> None:
    tt = TextToolchain("single", tokenizer=tok, fail_tool="lookup")
    env = GraphEnv(tt)
    play(env, tt.optimal_policy(), seed=0)
    assert env.truncated and env.error is not None and "ToolError" in env.error


def test_long_prompts_keep_their_end(tok: Any) -> None:
    tt = TextToolchain("single", tokenizer=tok, max_prompt_tokens=64)
    state = tt.initial_state(np.random.default_rng(0))
    obs = tt.observe("agent", state)
    full = TextToolchain("single", tokenizer=tok).observe("agent", state)
    ids = tt.spaces.decode_prompt(obs)
    assert len(ids) == 64 and ids == tt.spaces.decode_prompt(full)[-64:]
    assert tt.spaces.prompt_text(obs, tok).endswith("<|im_start|>assistant\n")


def test_absent_agents_pass(tok: Any) -> None:
    tt = TextToolchain("chain:2", tokenizer=tok)
    env = GraphEnv(tt)
    assert tt.parse(tt.text_of(tt.default_action("agent_0"))) == ((DONE, 0, 0, 0), "")
    play(env, tt.optimal_policy(), seed=0)
    actions = env.episode_actions()
    assert env.value(0, env.possible_agents, actions) == pytest.approx(FULL)
    assert env.value(0, [], actions) == pytest.approx(0.0)  # everyone passes: no calls


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"topology": "star:3"}, "single, chain:N"),
        ({"max_turns": 0}, "max_turns"),
        ({"format_penalty": -1.0}, "format_penalty"),
        ({"max_new_tokens": 4}, "max_new_tokens"),
        ({"tokenizer": object()}, "chat template"),
        ({"final_weight": 0.0}, "final_weight"),
        ({"n_keys": 1}, "n_keys"),
        ({"n_key": 4}, r"unknown argument\(s\) \['n_key'\].*n_keys"),
    ],
)
def test_argument_errors(kwargs: dict[str, Any], match: str, tok: Any) -> None:
    kwargs = {"tokenizer": tok, **kwargs}
    with pytest.raises(ScenarioError, match=match):
        build("text-toolchain", **kwargs)


@pytest.mark.parametrize("spec", ["single", "chain:2"])
def test_conformance(spec: str, tok: Any) -> None:
    check_scenario(lambda: TextToolchain(spec, tokenizer=tok), cycles=30, seeds=2, rllib=True)
