"""One copy of an LLM pool's weights where the driver samples and learns
(``trainers.ppo.share_local_weights``, ``CausalLMModule.share_weights_from``).

With no remote env runners and a local learner (the default), the local env runner's module
of each LLM pool, trained or frozen, is made of the learner module's tensors: the sampler
sees every optimizer step at once, the update's sync has nothing to copy (it only counts the
new version), frozen pools are not held twice, and training is bit for bit what it was with
a copied sampler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("langgraph_supervisor")

from test_chat_app_training import app_cfg
from test_train import learner_weights, runner_weights, same

from marl_agents.llm.rl_module import CausalLMModule
from scenarios.text_space import TextSpaces


def tensors(module: Any) -> dict[str, torch.Tensor]:
    return dict(module.named_parameters()) | dict(module.named_buffers())


def shares_storage(runner: Any, learner: Any) -> bool:
    theirs = tensors(learner)
    return all(t.data_ptr() == theirs[n].data_ptr() for n, t in tensors(runner).items())


def build(tmp_path: Path) -> Any:
    from trainers.algo import to_algorithm_config

    return to_algorithm_config(app_cfg(tmp_path)).build_algo()


def test_the_sampler_runs_on_the_learners_tensors_and_nothing_is_synced(ray_session, tmp_path):
    algo = build(tmp_path)
    group = algo.env_runner_group
    synced: list[Any] = []
    sync = group.sync_weights
    group.sync_weights = lambda *a, **kw: synced.append(kw.get("policies")) or sync(*a, **kw)
    try:
        learner = algo.learner_group._learner.module
        runner = group.local_env_runner.module
        assert algo.shared_modules == {"orchestrator", "worker"}  # trained and frozen
        for pool in ("orchestrator", "worker"):
            assert shares_storage(runner[pool].unwrapped(), learner[pool])
        before = learner_weights(algo, "orchestrator")
        version = runner["orchestrator"].unwrapped().weights_version
        frozen = learner_weights(algo, "worker"), runner["worker"].unwrapped().weights_version
        algo.train()
        ckpt = algo.save_to_path(str(tmp_path / "ckpt"))
        saved = learner_weights(algo, "orchestrator")
        algo.train()
        assert not same(learner_weights(algo, "orchestrator"), saved)  # it trained
        assert same(runner_weights(algo, "orchestrator"), learner_weights(algo, "orchestrator"))
        # no copy of the trained pool (the frozen worker is never synced either), but each
        # update counts a new version (what a vLLM sampler reloads on)
        assert synced == []
        assert runner["orchestrator"].unwrapped().weights_version == version + 2
        # the frozen pool: bit-identical, never a new version
        assert same(learner_weights(algo, "worker"), frozen[0])
        assert same(runner_weights(algo, "worker"), frozen[0])
        assert runner["worker"].unwrapped().weights_version == frozen[1]
        assert not same(saved, before)

        algo.restore_from_path(ckpt)  # restoring copies into the shared tensors
        assert same(learner_weights(algo, "orchestrator"), saved)
        assert same(runner_weights(algo, "orchestrator"), saved)
        assert shares_storage(runner["orchestrator"].unwrapped(), learner["orchestrator"])
    finally:
        algo.stop()


def test_training_is_bit_identical_to_a_copied_sampler(ray_session, tmp_path, monkeypatch):
    import trainers.ppo

    def train(where: str, shared: set[str]) -> tuple[dict[str, np.ndarray], list[float]]:
        algo = build(tmp_path / where)
        try:
            assert algo.shared_modules == shared
            returns = [algo.train()["env_runners"]["episode_return_mean"] for _ in range(2)]
            return learner_weights(algo, "orchestrator"), returns
        finally:
            algo.stop()

    shared_weights, shared_returns = train("shared", {"orchestrator", "worker"})
    monkeypatch.setattr(trainers.ppo, "share_local_weights", lambda algo: frozenset())
    copied_weights, copied_returns = train("copied", set())
    assert shared_returns == copied_returns
    assert same(shared_weights, copied_weights)


def module(**config: Any) -> CausalLMModule:
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    spaces = TextSpaces(vocab_size=384, max_prompt_tokens=16, max_new_tokens=4)
    return RLModuleSpec(
        module_class=CausalLMModule,
        observation_space=spaces.observation_space,
        action_space=spaces.action_space,
        model_config={"model": "tiny", **config},
    ).build()


def test_modules_that_do_not_match_keep_their_own_tensors():
    mine, other = module(), module(dtype="bfloat16")
    ptrs = {n: t.data_ptr() for n, t in tensors(mine).items()}
    assert not mine.share_weights_from(other)  # another dtype: nothing changed
    assert {n: t.data_ptr() for n, t in tensors(mine).items()} == ptrs
    assert mine.weights_version == 0
    twin = module(tiny_seed=1)
    assert mine.share_weights_from(twin)
    assert shares_storage(mine, twin) and mine.weights_version == 1
    with torch.no_grad():
        next(twin.parameters()).add_(1.0)  # an optimizer step on the source is seen at once
    assert torch.equal(next(mine.parameters()), next(twin.parameters()))
