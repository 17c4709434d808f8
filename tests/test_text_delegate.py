"""text-delegate: conformance, the assignment format, format penalties, subagents, the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from scenarios.base import ScenarioError
from scenarios.decisions import run_inline
from scenarios.delegate import PENDING, SOLVED
from scenarios.graph_env import GraphEnv
from scenarios.testing import check_scenario
from scenarios.text_delegate import TextDelegate


def ids(scenario, text):
    return scenario.tokenizer(text, add_special_tokens=False)["input_ids"]


def text_policy(scenario, texts):
    """A policy writing ``texts`` in order (the last one again when they run out)."""
    seq = list(texts)
    calls = {"n": 0}

    def policy(agent, obs):
        i = min(calls["n"], len(seq) - 1)
        calls["n"] += 1
        return scenario.spaces.encode_action(ids(scenario, seq[i]))

    return policy


def call(part, worker):
    return f'<tool>{{"name": "assign", "arguments": {{"part": {part}, "worker": {worker}}}}}</tool>'


@pytest.fixture(scope="module")
def easy():
    return TextDelegate("star:2", level="easy")


@pytest.fixture(scope="module")
def full():
    return TextDelegate(
        "star:3", level="full", skills=[[0.9, 0.1, 0.1], [0.1, 0.9, 0.1], [0.1, 0.1, 0.9]]
    )


@pytest.mark.parametrize("level", ["easy", "full"])
def test_conformance(level):
    check_scenario(lambda: TextDelegate("star:3", level=level), cycles=40, seeds=2)


def test_spaces_are_text_spaces(easy):
    obs_space, act_space = easy.observation_space("orchestrator"), easy.action_space("orchestrator")
    assert obs_space.nvec[0] == act_space.nvec[0] == easy.spaces.vocab_size + 1 == 385
    state = easy.initial_state(np.random.default_rng(0))
    obs = easy.orchestrator_obs(state)
    assert obs_space.contains(obs)
    text = easy.spaces.prompt_text(obs, easy.tokenizer)
    assert text.endswith('"type": "' + easy.type_name(state["types"][0]) + '", "worker": ')
    assert easy.possible_agents == ["orchestrator"]
    assert easy.topology.agent_ids == ["orchestrator"]


@pytest.mark.parametrize(
    ("text", "worker", "ok"),
    [("1", 1, True), (" 0", 0, True), ("1}}</tool>", 1, True), ("0 and more", 0, True),
     ("7", None, False), ("abc", None, False), ("", None, False)],
)  # fmt: skip
def test_prefill_parse(easy, text, worker, ok):
    state = easy.initial_state(np.random.default_rng(0))
    out = easy.parse(text, state)
    assert out.assignment.get(0) == worker
    assert (not out.errors) == ok


def test_free_form_parse(full):
    state = full.initial_state(np.random.default_rng(0))
    out = full.parse(call(0, 0) + " and " + call(2, 1), state)
    assert out.assignment == {0: 0, 2: 1} and not out.errors
    bad = [
        call(0, 5),  # no such worker
        call(9, 0),  # no such part
        call(0, 0) + call(0, 1),  # assigned twice
        '<tool>{"name": "finish"}</tool>',  # unknown tool
        '<tool>{"name": "assign", "arguments": {"part": 0',  # unclosed
    ]
    for text in bad:
        assert full.parse(text, state).errors, text
    solved = {**state, "status": {0: SOLVED, 1: PENDING, 2: PENDING}}
    assert full.parse(call(0, 0), solved).errors  # a solved part cannot be assigned


def test_easy_rewards(easy):
    """Right worker: 1 − μ on success; malformed: −format_penalty; the env never raises."""
    rewards = {}
    for text in ("0", "1", "zz"):
        _, out, _ = run_inline(easy, text_policy(easy, [text]), seed=3)
        rewards[text] = out.reward
        assert out.metrics["format_ok"] == float(text != "zz")
    assert rewards["zz"] == pytest.approx(-easy.format_penalty)
    state = easy.initial_state(np.random.default_rng(3))
    best = int(easy.skills[:, state["types"][0]].argmax())
    assert max(rewards["0"], rewards["1"]) == rewards[str(best)]
    assert rewards[str(best)] in (pytest.approx(1 - easy.call_cost), -easy.call_cost)


def test_malformed_message_costs_a_round_and_the_episode_goes_on(full):
    texts = ["no calls <tool>{oops</tool>", call(0, 0) + call(1, 1) + call(2, 2), "done"]
    state, out, decisions = run_inline(full, text_policy(full, texts), seed=1)
    assert decisions >= 2 and out.metrics["latency"] == 1.0
    assert out.metrics["format_errors"] == 1.0
    assert "error" in full.orchestrator_messages({**state, "last_error": "x"})[1]["content"]
    solved = out.metrics["solved_fraction"]
    expected = solved - full.format_penalty - full.latency_cost * out.metrics["latency"]
    assert out.reward == pytest.approx(expected - full.call_cost * out.metrics["calls"])


def test_well_formed_message_without_calls_ends_the_episode(full):
    _, out, decisions = run_inline(full, text_policy(full, ["I am done."]), seed=0)
    assert decisions == 1 and out.metrics["calls"] == 0 and out.metrics["format_ok"] == 1.0


def test_oracle_text_reaches_oracle_value(easy):
    rewards, values = [], []
    for seed in range(120):
        state = easy.initial_state(np.random.default_rng(seed))
        _, out, _ = run_inline(easy, text_policy(easy, [easy.oracle_text(state)]), seed=seed)
        rewards.append(out.reward)
        values.append(easy.oracle_value(np.random.default_rng(seed)))
    assert np.mean(values) == pytest.approx(0.9 - easy.call_cost)
    assert abs(np.mean(rewards) - np.mean(values)) < 0.08


def test_replay_is_exact(full):
    env = GraphEnv(full)
    obs, infos = env.reset(seed=5)
    action = full.spaces.encode_action(ids(full, call(0, 1)))
    while env.agents:
        obs, rewards, _, _, infos = env.step({"orchestrator": action})
    assert env.value(5, ["orchestrator"], env.episode_actions()) == pytest.approx(
        env.outcome.reward
    )


def test_hf_subagent_is_deterministic_and_frozen():
    import torch

    import marl_agents.llm.subagents  # noqa: F401  (registers the hf backend)
    from marl_agents.llm.tiny import make_tiny_model

    s = TextDelegate("star:2", level="easy", subagents={"type": "hf", "path": "tiny", "seed": 1})
    policy = text_policy(s, ["0"])
    first = [run_inline(s, policy, seed=k)[1].reward for k in range(3)]
    again = [run_inline(s, policy, seed=k)[1].reward for k in range(3)]
    assert first == again
    # an untrained tiny subagent never answers with a valid solve call: every part fails
    assert all(r == pytest.approx(-s.call_cost) for r in first)
    _, fresh = make_tiny_model(seed=1)
    served = s.subagents[0].backend.model
    for (name, a), (_, b) in zip(
        served.state_dict().items(), fresh.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"level": "hard"}, "level must be one of"),
        ({"colour": 1}, "unknown argument"),
        ({"topology": "chain:3"}, "star:N"),
        ({"parts": 0}, "parts must be"),
        ({"skills": [[0.5]]}, r"\(2, 2\)"),
        ({"subagents": "gpt"}, "unknown type"),
        ({"subagents": {"type": "hf"}}, "needs 'path'"),
        ({"subagents": {"type": "hf", "path": "/nonexistent"}}, "config.json"),
        ({"subagents": {"type": "hf", "path": "tiny", "pth": 1}}, r"unknown key\(s\) \['pth'\]"),
        ({"subagents": {"type": "scripted", "max_new_tokens": 0}}, "unknown key"),
        ({"subagents": {"type": "hf", "path": "tiny", "max_new_tokens": 0}}, "max_new_tokens"),
        ({"subagents": {"type": "vllm", "url": "http://x"}}, r"\['model'\]"),
        ({"subagents": ["scripted"] * 3}, "3 specs for 2 workers"),
        ({"tokenizer": "/nonexistent/tok"}, "could not be loaded"),
        ({"format_penalty": -1}, "format_penalty"),
    ],
)
def test_argument_errors_name_the_fix(kwargs, match):
    kwargs = dict(kwargs)
    topology = kwargs.pop("topology", "star:2")
    with pytest.raises(ScenarioError, match=match):
        TextDelegate(topology, **kwargs)


# ----- layering ------------------------------------------------------------------------------
def test_scenarios_never_import_marl_agents_or_trainers():
    """DESIGN: topologies ← scenarios ← marl_agents ← trainers; only the CLI imports trainers."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    offenders = []
    for path in sorted((root / "scenarios").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top == "marl_agents" or (top == "trainers" and path.name != "cli.py"):
                    offenders.append(f"{path.name}:{node.lineno} imports {name}")
    assert not offenders
    code = (
        "import sys, scenarios.builtin\n"
        "from scenarios.registry import make\n"
        "make('text-delegate', 'star:2'); make('text-toolchain', 'chain:2')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('marl_agents', 'trainers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_llm_subagent_without_a_registered_backend_names_the_fix(monkeypatch):
    from scenarios import text_delegate_subagents

    monkeypatch.setattr(text_delegate_subagents, "SUBAGENT_BACKENDS", {})
    s = TextDelegate("star:2", subagents={"type": "hf", "path": "tiny"})
    with pytest.raises(ScenarioError, match=r"import marl_agents\.llm\.subagents"):
        s.subagents  # noqa: B018  (built on first use)
