"""``stop`` in training: the learner trains on the ids the app received (issue #42 item 3).

A chat app's agent calls its model with ``stop`` strings (``tests/apps/stop_app.py``); the
call's stop strings ride on its observation with its constraint
(:class:`~marl_agents.llm.constraints.CallSettings`) and the module ends each sampled reply
at its first stop string (:func:`~marl_agents.llm.stop_strings.cut_at_stop`). On both
samplers (the batched runner and RLlib's env runner) the learner's rows for the agent hold
exactly the cut ids — those the app's replies were made of, one row per reply the app got —
padded past them as an EOS-ended reply is, so nothing after a stop string is in the loss mask
(``actions != pad_id``), in the behaviour logprobs or in the token masks; those logprobs are
the learner's own recompute; and the learner trains one update on them.
"""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from configs import grpo_app_config
from ray.rllib.core.columns import Columns

from marl_agents.llm.rl_module import SAMPLING_TEMPERATURE, TOKEN_LOGP, TOKEN_MASK
from marl_agents.llm.stop_strings import first_stop
from tests.apps import stop_app

AGREEMENT_TOL = 1e-4


def learner_batch(algo: Any, episodes: list[Any]) -> dict[str, Any]:
    """The writer's rows as the learner's connector pipeline makes them (from copies of the
    episodes, as ``tests/test_learner_batch.py`` does)."""
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    blob = pickle.dumps([e.get_state() for e in episodes])
    copies = [MultiAgentEpisode.from_state(s) for s in pickle.loads(blob)]
    for c, e in zip(copies, episodes, strict=True):
        c.__class__ = type(e)
    learner = algo.learner_group._learner
    batch = learner._make_batch_if_necessary(TrainingData(episodes=copies))
    return batch.policy_batches["writer"]


@pytest.mark.parametrize("sampler", ["batched", "rllib"])
def test_the_learner_trains_on_the_ids_the_app_received(
    ray_session: Any, tmp_path: Path, sampler: str
) -> None:
    from trainers.algo import to_algorithm_config

    cfg = grpo_app_config(
        tmp_path,
        "tests.apps.stop_app:scenario",
        {"writer": {"agents": ["writer"], "model": {"type": "llm", "path": "tiny"}}},
        ["writer"],
        episodes={"sampler": sampler},
        budget={"iterations": 1},
    )
    algo = to_algorithm_config(cfg).build_algo()
    try:
        runner = algo.env_runner_group.local_env_runner
        stop_app.RECEIVED.clear()
        episodes = runner.sample(num_episodes=8, explore=True)
        received = list(stop_app.RECEIVED)
        rows = learner_batch(algo, episodes)
        module = algo.learner_group._learner.module["writer"]
        tok, pad = module.tokenizer, module.pad_id
        actions = rows[Columns.ACTIONS]
        loss_mask = actions != pad

        # each row is one reply the app received: its ids, cut after the stop string
        got = []
        ended_at_stop = 0
        for r in range(len(actions)):
            ids = actions[r][loss_mask[r]].tolist()
            n = len(ids)
            assert loss_mask[r, :n].all() and not loss_mask[r, n:].any()  # one prefix
            text = tok.decode(ids, skip_special_tokens=True)
            found = first_stop(text, stop_app.STOP)
            if found is not None:  # the stop string completes at the last id, not before
                assert first_stop(tok.decode(ids[:-1], skip_special_tokens=True),
                                  stop_app.STOP) is None, text  # fmt: skip
                ended_at_stop += ids[-1] != tok.eos_token_id and n < module.spaces.max_new_tokens
                text = text[: found[0]]
            got.append((text, n))
        assert ended_at_stop >= 2, got  # replies cut before the budget, not by EOS
        assert Counter(got) == Counter((t, n) for t, _, n in received)
        assert sum(f == "stop" for _, f, _ in received) >= ended_at_stop

        # nothing after the stop: behaviour logprobs and token masks padded as past an EOS
        token_lp = rows[TOKEN_LOGP]
        assert (token_lp[~loss_mask] == 0).all()
        if TOKEN_MASK in rows:
            assert (rows[TOKEN_MASK][~loss_mask] == -1).all()
        # the behaviour logprobs of the kept ids are the learner's recompute
        with torch.no_grad():
            want, _ = module.score(
                rows[Columns.OBS],
                actions,
                temperature=rows[SAMPLING_TEMPERATURE],
                token_mask=rows.get(TOKEN_MASK),
            )
        gap = (token_lp - want).abs()[loss_mask].max().item()
        assert gap < AGREEMENT_TOL, gap

        # and the learner trains on them
        results = algo.learner_group.update(episodes=episodes)
        assert results
    finally:
        algo.stop()


@pytest.mark.parametrize("constrain", ["auto", "off"])
def test_the_module_ends_each_row_at_its_own_stop_strings(constrain: str) -> None:
    """The same prompts and seeds with and without ``stop`` on the observation: a stopped
    row's action is the free row's ids up to and with the token completing the stop string
    (rows without stop strings unchanged; ``stop`` is no constraint: ``constrain: off`` too),
    its behaviour logprobs a prefix of the free row's, zeros after."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from marl_agents.llm.constraints import call_of, constraint_of, with_constraint
    from marl_agents.llm.rl_module import SAMPLING_SEEDS, CausalLMModule, add_constraint_keys
    from scenarios.text_space import TextSpaces, make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    spaces = TextSpaces.for_tokenizer(tok, max_prompt_tokens=16, max_new_tokens=16)
    module = RLModuleSpec(
        module_class=CausalLMModule,
        observation_space=spaces.observation_space,
        action_space=spaces.action_space,
        model_config={"model": "tiny", "constrain": constrain},
    ).build()
    prompts = [spaces.encode_prompt(tok(f"say {w}")["input_ids"]) for w in ("one", "two")] * 4
    stops = [stop_app.STOP if r % 2 == 0 else () for r in range(len(prompts))]
    calls = [with_constraint(p, None, s) for p, s in zip(prompts, stops, strict=True)]
    assert [call_of(c).stop for c in calls[:2]] == [tuple(stop_app.STOP), ()]
    assert constraint_of(calls[0]) is None
    seeds = torch.arange(len(prompts))

    def act(observations: list[Any]) -> dict[str, Any]:
        obs = torch.as_tensor(np.stack(observations))
        batch = add_constraint_keys({Columns.OBS: obs, SAMPLING_SEEDS: seeds}, observations)
        return module.forward_exploration(batch)

    free, stopped = act(prompts), act(calls)
    cut = 0
    for r, stop in enumerate(stops):
        whole = spaces.decode_action(free[Columns.ACTIONS][r].numpy())
        ids = spaces.decode_action(stopped[Columns.ACTIONS][r].numpy())
        assert whole[: len(ids)] == ids
        n = len(ids)
        text = tok.decode(whole, skip_special_tokens=True)
        if stop and first_stop(text, stop) is not None:
            assert first_stop(tok.decode(ids, skip_special_tokens=True), stop) is not None
            assert first_stop(tok.decode(ids[:-1], skip_special_tokens=True), stop) is None
            cut += n < len(whole)
        else:
            assert ids == whole
        lp_free, lp = free[TOKEN_LOGP][r], stopped[TOKEN_LOGP][r]
        torch.testing.assert_close(lp[:n], lp_free[:n])
        assert (lp[n:] == 0).all()
        assert torch.isclose(stopped[Columns.ACTION_LOGP][r], lp.sum())
        if TOKEN_MASK in stopped:
            assert (stopped[TOKEN_MASK][r, n:] == -1).all()
    assert cut >= 1  # some row really lost tokens sampled after its stop string
