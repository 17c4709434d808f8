"""Transcripts: what each agent observed and did, rewards, outcome and credit, per iteration of
a training run and from ``marl eval --transcripts``."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from toys import ToyStar
from typer.testing import CliRunner

from scenarios import GraphEnv
from scenarios.base import compact
from trainers.configs.experiment import ExperimentConfig
from trainers.run.transcripts import render


def play(env: GraphEnv, policy: Any, seed: int = 0) -> None:
    obs, infos = env.reset(seed=seed)
    while env.agents:
        acting = [a for a in env.agents if infos[a]["acting"]]
        obs, _, _, _, infos = env.step({a: policy(a, obs[a]) for a in acting})


def test_transcript_records_who_acted_on_what() -> None:
    env = GraphEnv(ToyStar("star:2", rounds=1))
    play(env, lambda a, o: 2, seed=3)
    t = env.transcript()
    json.dumps(t)  # plain data
    assert t["scenario"] == "toy-star-v0" and t["seed"] == 3 and t["failure"] is None
    assert [[d["agent"] for d in s["decisions"]] for s in t["steps"]] == [
        ["orchestrator"],
        ["worker_0", "worker_1"],
        ["orchestrator"],
    ]
    first = t["steps"][0]["decisions"][0]
    assert first == {"agent": "orchestrator", "observation": "[0., 0.]", "action": "2"}
    assert t["outcome"] == {
        "reward": 4.0, "success": True, "truncated": False, "metrics": {}, "local": {}
    }  # fmt: skip
    assert t["returns"] == {"orchestrator": 4.0, "worker_0": 4.0, "worker_1": 4.0}
    assert t["steps"][-1]["rewards"] == t["returns"]
    text = render(t)
    assert "### step 1 · superstep 2" in text and "**worker_1**" in text
    assert "outcome: reward 4.000 · success yes" in text


def test_a_failed_episode_says_why() -> None:
    env = GraphEnv(ToyStar("star:2", rounds=2, fail_on=2))
    play(env, lambda a, o: 2 if a == "worker_1" else 1)
    t = env.transcript()
    assert t["failure"] == "error" and "worker_1 failed on action 2" in t["error"]
    assert "failed (error): node 'worker_1' raised RuntimeError" in render(t)


def test_text_agents_show_decoded_prompts_replies_and_tool_calls() -> None:
    from scenarios.text_toolchain import TextToolchain

    tt = TextToolchain("single")
    env = GraphEnv(tt)
    play(env, tt.optimal_policy(), seed=0)
    t = env.transcript()
    first = t["steps"][0]["decisions"][0]
    assert "Task: k1 = " in first["observation"] and "<|im_start|>" in first["observation"]
    assert first["action"].startswith("<tool>") and first["tool_calls"][0].startswith("lookup(")
    last = t["steps"][-1]["decisions"][0]
    assert last["tool_calls"][0].startswith("answer(")
    text = render(t)
    assert "```text" in text and "tool call: `lookup(" in text


def test_scenarios_can_render_their_own_steps() -> None:
    class Described(ToyStar):
        def render_observation(self, agent: str, observation: Any) -> str:
            return f"round {int(observation[0])}"

        def render_action(self, agent: str, action: Any) -> str:
            return ["idle", "work", "work hard"][int(action)]

    env = GraphEnv(Described("star:1", rounds=1))
    play(env, lambda a, o: 2)
    decisions = [d for s in env.transcript()["steps"] for d in s["decisions"]]
    assert decisions[0] == {
        "agent": "orchestrator",
        "observation": "round 0",
        "action": "work hard",
    }


def test_compact_repr_is_short() -> None:
    assert compact(np.arange(100, dtype=np.float32) / 3).count(",") < 20
    assert compact(np.int64(3)) == "3"
    assert len(compact("x" * 1000)) <= 240


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, ray_session: Any) -> Any:
    """One iteration on delegate star:2 with Shapley credit and 2 transcripts per iteration."""
    from trainers.run.loop import train

    cfg = ExperimentConfig.from_dict(
        {
            "topology": "star:2",
            "credit": {"method": "shapley", "workers": 1},
            "algorithm": {"train_batch_size": 64, "minibatch_size": 32, "num_epochs": 1},
            "budget": {"iterations": 1},
            "resources": {"num_envs_per_env_runner": 2},
            "logging": {"wandb": "disabled", "progress": False},
            "output": {"dir": str(tmp_path_factory.mktemp("tr")), "checkpoint_every": 0},
        }
    )
    assert cfg.output.transcripts == 2  # the default
    return train(cfg)


def test_training_writes_transcripts_every_iteration(trained: Any) -> None:
    folder = trained.run_dir / "transcripts"
    lines = (folder / "iter_000001.jsonl").read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        t = json.loads(line)
        assert t["iteration"] == 1 and t["scenario"] == "delegate-v0"
        assert t["steps"] and all("observation" in d for s in t["steps"] for d in s["decisions"])
        assert t["credit_method"] == "shapley"
        assert set(t["credit"]) == {d["agent"] for s in t["steps"] for d in s["decisions"]}
        assert "_actions" not in t
    md = (folder / "iter_000001.md").read_text()
    assert md.startswith("# iteration 1: 2 episode(s)") and "credit (shapley):" in md


def test_eval_prints_transcripts(trained: Any) -> None:
    from trainers.cli import app

    result = CliRunner().invoke(
        app, ["eval", str(trained.run_dir), "--episodes", "2", "--transcripts", "1"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("## episode seed") == 1
    assert "### step 0 · superstep 1" in result.output and "**orchestrator**" in result.output
