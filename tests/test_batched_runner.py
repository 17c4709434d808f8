"""The batched sampler (``episodes.sampler: batched``) against RLlib's own.

What a user relies on: the same policy gives the same action distribution; the episodes carry
the same columns, so every learner path (GAE, credit, GRU sequences, GRPO) reads them alike;
a seed fixes every episode without ``PYTHONHASHSEED``; an env's episodes do not depend on how
many other envs share the batch; and the switch back to RLlib's sampler is one config key.
Runners are built directly here (no Ray needed: the local env runner is a plain object).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import (
    TorchCategorical,
    TorchDiagGaussian,
    TorchMultiCategorical,
)

from trainers.algo import to_algorithm_config
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError
from trainers.learners.categorical import Categoricals
from trainers.plan import resolve
from trainers.sampling.action_rows import categorical_rows, inverse_cdf, sample_rows
from trainers.sampling.batched_runner import BatchedEnvRunner
from trainers.sampling.forward import forward_fn

ROOT = Path(__file__).resolve().parents[1]
TEAM = {
    "topology": "star:3",
    "pools": {
        "orchestrator": {"model": {"type": "mlp"}},
        "worker": {"model": {"type": "gru", "gru_size": 16}},
    },
}


def runner(
    cls: type, extra: dict[str, Any] | None = None, envs: int = 4, base: dict | None = None
) -> Any:
    cfg = ExperimentConfig.from_dict(
        {**(TEAM if base is None else base), **(extra or {}),
         "resources": {"num_envs_per_env_runner": envs}}
    )  # fmt: skip
    return cls(config=to_algorithm_config(cfg))


def copy_weights(src: Any, dst: Any) -> None:
    dst.module.set_state(src.module.get_state())


# ----- the distribution ---------------------------------------------------------------------
def frequencies(actions: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(actions, minlength=n) / len(actions)


def test_categorical_rows_follow_the_distribution() -> None:
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.0]]).repeat(20_000, 1)
    dist = TorchCategorical.from_logits(logits)
    rngs = [np.random.default_rng(i) for i in range(len(logits))]
    got = sample_rows(dist, rngs).numpy()
    p = torch.softmax(logits[0], -1).numpy()
    sigma = np.sqrt(p * (1 - p) / len(got))
    assert np.all(np.abs(frequencies(got, 4) - p) < 5 * sigma)


def test_multicategorical_parts_are_independent_and_follow_their_logits() -> None:
    lens = [2, 3]
    logits = torch.tensor([[0.0, 1.5, -0.5, 0.2, 1.0]]).repeat(20_000, 1)
    dist = TorchMultiCategorical.get_partial_dist_cls(input_lens=lens).from_logits(logits)
    rng = np.random.default_rng(0)
    got = sample_rows(dist, [rng] * len(logits)).numpy()
    assert got.shape == (20_000, 2)
    for part, (lo, hi) in enumerate([(0, 2), (2, 5)]):
        p = torch.softmax(logits[0, lo:hi], -1).numpy()
        sigma = np.sqrt(p * (1 - p) / len(got))
        assert np.all(np.abs(frequencies(got[:, part], hi - lo) - p) < 5 * sigma)
    joint = frequencies(got[:, 0] * 3 + got[:, 1], 6)  # independence: p(a, b) = p(a) p(b)
    p0, p1 = (torch.softmax(logits[0, s], -1).numpy() for s in (slice(0, 2), slice(2, 5)))
    assert np.abs(joint - np.outer(p0, p1).ravel()).max() < 0.02


def test_gaussian_rows_have_the_distribution_moments() -> None:
    logits = torch.tensor([[1.0, -2.0, np.log(0.5), np.log(2.0)]]).repeat(20_000, 1)
    dist = TorchDiagGaussian.from_logits(logits)
    got = sample_rows(dist, [np.random.default_rng(7)] * len(logits)).numpy()
    np.testing.assert_allclose(got.mean(0), [1.0, -2.0], atol=0.05)
    np.testing.assert_allclose(got.std(0), [0.5, 2.0], rtol=0.03)


@pytest.mark.parametrize(
    ("lens", "multi"), [([4, 4, 4], True), ([2, 3, 5], True), ([6], False), ([3], True)]
)
@pytest.mark.parametrize("explore", [True, False])
def test_categorical_rows_are_categoricals_bit_for_bit(
    lens: list[int], multi: bool, explore: bool
) -> None:
    """The sampler's fused categorical path gives the actions, log-probabilities and random
    draws of ``Categoricals`` + ``inverse_cdf`` (its per-part ops), to the last bit."""
    gen = torch.Generator().manual_seed(sum(lens))
    for b in (1, 2, 7, 16, 33):
        for scale in (0.1, 3.0, 40.0):
            logits = torch.randn(b, sum(lens), generator=gen) * scale
            cats = Categoricals(logits, lens, multi)
            if explore:
                want = inverse_cdf(cats.probs, [np.random.default_rng(r) for r in range(b)])
            else:
                want = torch.stack([lg.argmax(-1) for lg in cats.logits], dim=-1)
            want = want if multi else want[:, 0]
            rngs = [np.random.default_rng(r) for r in range(b)] if explore else None
            act, logp = categorical_rows(logits, lens, multi, rngs)
            assert act.dtype == np.int64 and np.array_equal(act, want.numpy())
            assert logp.dtype == torch.float32 and torch.equal(logp, cats.logp(want))
            if rngs is not None:  # the same number of draws per row
                assert [r.random() for r in rngs] == [
                    np.random.default_rng(r).random(len(lens) + 1)[-1] for r in range(b)
                ]


def test_direct_forward_is_rllibs_wrapper_and_leaves_the_modes() -> None:
    """The runner calls ``_forward_exploration``/``_forward_inference`` of a module in eval
    mode (no ``eval()`` walk per call; for RLlib's default PPO module the actor encoder and
    policy head alone): the same outputs as RLlib's wrappers, every submodule left in the mode
    it was in; a module in train mode (or with an instance-level wrapper) goes through the
    wrapper."""
    r = runner(BatchedEnvRunner)
    try:
        r.sample(num_timesteps=20, explore=True)  # puts the modules in eval mode
        for mid, direct in (("orchestrator", "actor_forward"), ("worker", "_forward_")):
            module = r.module[mid]
            obs = torch.randn(5, 1, module.observation_space.shape[0])
            batch = {Columns.OBS: obs if module.is_stateful() else obs[:, 0]}
            if module.is_stateful():
                batch[Columns.STATE_IN] = {
                    k: torch.randn(5, *v.shape) for k, v in module.get_initial_state().items()
                }
            for explore in (True, False):
                fn = forward_fn(module, explore)
                assert getattr(fn, "func", fn).__name__.startswith(direct)
                with torch.no_grad():
                    got = fn(batch)
                    wrapper = module.forward_exploration if explore else module.forward_inference
                    want = wrapper(batch)
                assert list(got) == list(want)
                for key in want:
                    for a, b in zip(flatten(got[key]), flatten(want[key]), strict=True):
                        assert torch.equal(a, b)
                assert not any(m.training for m in module.modules())
        module = r.module["orchestrator"]
        module.train()
        assert forward_fn(module, True) == module.forward_exploration
        module.eval()
        module.forward_exploration = spy = lambda batch: module._forward_exploration(batch)
        assert forward_fn(module, True) is spy
    finally:
        r.stop()


def flatten(value: Any) -> list[torch.Tensor]:
    return (
        [v for k in sorted(value) for v in flatten(value[k])]
        if isinstance(value, dict)
        else [value]
    )


def test_batched_and_rllib_runners_sample_the_same_action_frequencies() -> None:
    """Same weights, same task: the orchestrator's first action has the same distribution
    under both samplers (240 episodes each, first step only, compared within 5 sigma)."""
    ours, theirs = runner(BatchedEnvRunner, envs=16), None
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    theirs = runner(MultiAgentEnvRunner, envs=16)
    copy_weights(ours, theirs)
    counts = {}
    for name, r in (("batched", ours), ("rllib", theirs)):
        firsts = []
        for _ in range(15):
            for ep in r.sample(num_episodes=16, explore=True):
                firsts.append(tuple(ep.agent_episodes["orchestrator"].get_actions()[0]))
        counts[name] = firsts
    # the first decision's marginal over the first part (4 choices), pooled over tasks
    a = np.array([f[0] for f in counts["batched"]])
    b = np.array([f[0] for f in counts["rllib"]])
    fa, fb = frequencies(a, 4), frequencies(b, 4)
    sigma = np.sqrt(fa * (1 - fa) / len(a) + fb * (1 - fb) / len(b)) + 1e-9
    assert np.all(np.abs(fa - fb) < 5 * sigma), (fa, fb)


# ----- the episodes -------------------------------------------------------------------------
def _columns(episode: Any) -> dict[str, Any]:
    """Per agent: the extra-output keys and each column's dtype and per-step shape."""
    out = {}
    for aid, sa in episode.agent_episodes.items():
        cols = {}
        for key in sa.extra_model_outputs:
            v = sa.get_extra_model_outputs(key)
            if isinstance(v, dict):
                v = next(iter(v.values()))
            cols[key] = (str(np.asarray(v).dtype), np.asarray(v).shape[1:])
        actions = np.asarray(sa.get_actions())
        cols["actions"] = (str(actions.dtype), actions.shape[1:])
        obs = np.asarray(sa.get_observations())
        cols["obs"] = (str(obs.dtype), obs.shape[1:])
        out[aid] = cols
    return out


def test_episodes_carry_rllibs_columns_for_mlp_gru_and_scripted_pools() -> None:
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    scripted = {"type": "scripted", "policy": "delegate.scripted_worker"}
    for extra in ({}, {"pools": {"worker": {"model": scripted}}}):
        team = {**TEAM, **extra, "pools": {**TEAM["pools"], **extra.get("pools", {})}}
        ours = runner(BatchedEnvRunner, team)
        theirs = runner(MultiAgentEnvRunner, team)
        a = ours.sample(num_episodes=2, explore=True)[0]
        b = theirs.sample(num_episodes=2, explore=True)[0]
        assert a.is_numpy and b.is_numpy
        ca, cb = _columns(a), _columns(b)
        assert set(ca) == set(cb) or set(ca) & set(cb), (set(ca), set(cb))
        for aid in set(ca) & set(cb):
            assert ca[aid] == cb[aid], aid


def test_gru_state_out_continues_across_steps() -> None:
    """The state stored at step t is the state fed at step t + 1 (what the learner's sequence
    connector reads back)."""
    r = runner(BatchedEnvRunner)
    module = r.module["worker"]
    for ep in r.sample(num_episodes=4, explore=True):
        for aid, sa in ep.agent_episodes.items():
            if not aid.startswith("worker") or len(sa) < 2:
                continue
            obs = torch.as_tensor(np.asarray(sa.get_observations()[:-1]), dtype=torch.float32)
            h = module.get_initial_state()["h"][None]
            logits = []
            with torch.no_grad():
                for t in range(len(sa)):
                    out = module.forward_inference(
                        {Columns.OBS: obs[t][None, None], Columns.STATE_IN: {"h": h}}
                    )
                    h = out[Columns.STATE_OUT]["h"]
                    stored = sa.get_extra_model_outputs(Columns.STATE_OUT, indices=t)["h"]
                    np.testing.assert_allclose(h[0].numpy(), stored, atol=1e-6)
                    logits.append(out[Columns.ACTION_DIST_INPUTS][0, 0].numpy())
            stored_logits = sa.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS)
            np.testing.assert_allclose(np.stack(logits), stored_logits, atol=1e-5)
            return
    pytest.fail("no worker acted twice in 4 episodes")


def test_logp_is_the_log_probability_of_the_stored_action() -> None:
    r = runner(BatchedEnvRunner)
    ep = r.sample(num_episodes=1, explore=True)[0]
    sa = ep.agent_episodes["orchestrator"]
    logits = torch.as_tensor(sa.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS))
    dist = r.module["orchestrator"].get_exploration_action_dist_cls().from_logits(logits)
    want = dist.logp(torch.as_tensor(np.asarray(sa.get_actions()))).numpy()
    np.testing.assert_allclose(sa.get_extra_model_outputs(Columns.ACTION_LOGP), want, atol=1e-6)


def test_without_exploration_the_mode_is_taken() -> None:
    r = runner(BatchedEnvRunner)
    ep = r.sample(num_episodes=1, explore=False)[0]
    sa = ep.agent_episodes["orchestrator"]
    logits = sa.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS)
    want = np.stack([logits[:, s].argmax(-1) for s in (slice(0, 4), slice(4, 8), slice(8, 12))])
    np.testing.assert_array_equal(np.asarray(sa.get_actions()), want.T)


# ----- determinism --------------------------------------------------------------------------
def _actions(episodes: list[Any]) -> list[list[list[int]]]:
    return [
        [np.asarray(sa.get_actions()).ravel().tolist() for _, sa in sorted(items.items())]
        for items in (e.agent_episodes for e in episodes)
    ]


def _finished_by_env(r: Any) -> dict[int, list[Any]]:
    """Record each sub-env's finished episodes (in order) as ``r`` samples."""
    seen: dict[int, list[Any]] = {}
    on_step = r._on_step

    def recording(i: int, *args: Any) -> None:
        before = r._ongoing_episodes[i]
        on_step(i, *args)
        if before.is_done:  # the step ended it (a GRPO group's env may wait before resetting)
            seen.setdefault(i, []).append(before)

    r._on_step = recording
    return seen


def test_an_envs_episodes_do_not_depend_on_the_other_envs() -> None:
    """Env 0 of a 2-env and of a 5-env runner: same seed stream, same episodes."""
    small, big = runner(BatchedEnvRunner, envs=2), runner(BatchedEnvRunner, envs=5)
    copy_weights(small, big)
    a, b = _finished_by_env(small), _finished_by_env(big)
    small.sample(num_timesteps=100, explore=True)
    big.sample(num_timesteps=250, explore=True)
    assert len(a[0]) >= 3 and len(b[0]) >= 3
    assert _actions(a[0][:3]) == _actions(b[0][:3])
    assert _actions(a[1][:3]) == _actions(b[1][:3])
    assert _actions(b[0][:3]) != _actions(b[2][:3])  # other envs: other streams


SCRIPT = """
import json, logging, ray
from configs import tiny_config
from trainers.run.loop import train
ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
rows = []
from pathlib import Path
cfg = tiny_config(Path({tmp!r}), **{sections!r})
train(cfg, report=rows.append)
print(json.dumps([{{k: v for k, v in r.items() if k.startswith(("charts/team", "losses/"))}}
                  for r in rows], sort_keys=True))
"""


def test_a_seed_fixes_training_without_pythonhashseed(tmp_path: Path) -> None:
    """Two processes with different ``PYTHONHASHSEED``s train the same (episodes and updates):
    the sampler's streams are per env, and its episodes order agents sorted for the learner."""
    sections = {"seed": 3, "pools": TEAM["pools"], "topology": "star:3"}
    procs = []
    for hashseed in ("1", "2"):  # side by side: each process runs its own one-CPU Ray
        env = {**os.environ, "PYTHONHASHSEED": hashseed,
               "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}  # fmt: skip
        script = SCRIPT.format(tmp=str(tmp_path / hashseed), sections=sections)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
        )
    outs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=600)
            assert proc.returncode == 0, stderr[-3000:]
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:  # none is left running, whatever failed
            proc.kill()
            proc.wait()
    assert len(outs[0]) == 2 and "losses/worker/policy_loss" in outs[0][-1]
    assert outs[0] == outs[1]


# ----- envs in flight (episodes.env_threads) -----------------------------------------------
TOOLCHAIN = {"scenario": "toolchain"}


def _returns(episodes: list[Any]) -> list[list[float]]:
    return [[sa.get_return() for _, sa in sorted(e.agent_episodes.items())] for e in episodes]


def test_threads_change_when_envs_step_not_what_happens() -> None:
    """Each env on its own thread, tools slowed down: every env's episodes are the ones it
    plays stepping one after another in the sampler's thread."""
    latency = {"tool_latency": {"seconds": 0.002, "jitter": 0.002}}
    serial = runner(BatchedEnvRunner, {"episodes": latency}, envs=3, base=TOOLCHAIN)
    threaded = runner(
        BatchedEnvRunner, {"episodes": {**latency, "env_threads": True}}, envs=3, base=TOOLCHAIN
    )
    copy_weights(serial, threaded)
    a, b = _finished_by_env(serial), _finished_by_env(threaded)
    try:
        serial.sample(num_timesteps=90, explore=True)
        threaded.sample(num_timesteps=90, explore=True)
    finally:
        threaded.stop()
    for i in range(3):
        n = min(len(a.get(i, [])), len(b.get(i, [])))
        assert n >= 2, (i, n)
        assert _actions(a[i][:n]) == _actions(b[i][:n])
        rewards = [
            [sa.get_return() for _, sa in sorted(e.agent_episodes.items())] for e in a[i][:n]
        ]
        assert rewards == [
            [sa.get_return() for _, sa in sorted(e.agent_episodes.items())] for e in b[i][:n]
        ]


def test_a_call_past_the_timeout_loses_its_episode_not_the_sample() -> None:
    """Tool calls of up to 0.6 s against a 0.25 s limit: the episodes that hang are counted
    as timeouts (with a named error) and their envs replaced; sampling goes on."""
    from trainers.signals.episode_metrics import JOURNAL

    slow = {"tool_latency": {"seconds": 0.3, "jitter": 0.3}, "timeout_s": 0.25,
            "env_threads": True}  # fmt: skip
    r = runner(BatchedEnvRunner, {"episodes": slow}, envs=4, base=TOOLCHAIN)
    JOURNAL.drain(keep=0)
    try:
        episodes = r.sample(num_timesteps=40, explore=True)
        metrics = r.get_metrics()
    finally:
        r.stop()
    assert sum(e.env_steps() for e in episodes) > 0  # (a lost episode's steps are dropped)
    marl = metrics["marl"]
    assert marl["timeout"] >= 1 and marl["episodes"] >= marl["timeout"]
    errors = JOURNAL.drain(keep=0)["errors"]
    assert any("call_timeout_s" in e["error"] or "timeout" in e["error"] for e in errors)


def test_every_episode_hanging_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resets that never return in time (every env, fresh ones too): the sample raises a
    named error after a bounded number of lost episodes instead of looping forever."""
    import time

    from scenarios.rllib_env import RLlibGraphEnv

    r = runner(BatchedEnvRunner, {"episodes": {"timeout_s": 0.05, "env_threads": True}}, envs=2)
    reset = RLlibGraphEnv.reset

    def slow_reset(self: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)  # a stand-in for a graph that blocks before any agent acts
        return reset(self, **kwargs)

    monkeypatch.setattr(RLlibGraphEnv, "reset", slow_reset)
    try:
        with pytest.raises(
            RuntimeError, match=r"hung in a reset/step call past episodes\.timeout_s"
        ):
            r.sample(num_timesteps=20, explore=True)
    finally:
        monkeypatch.undo()
        r.stop()


def test_env_threads_config_errors() -> None:
    with pytest.raises(ConfigError, match="env_threads needs the batched sampler"):
        resolve(ExperimentConfig.from_dict(
            {**TEAM, "episodes": {"env_threads": True, "sampler": "rllib"}}
        ))  # fmt: skip


# ----- the switch ---------------------------------------------------------------------------
def test_sampler_switch_and_its_errors() -> None:
    from trainers.plan import batched_sampler

    cfg = ExperimentConfig.from_dict(TEAM)
    assert batched_sampler(cfg)
    cfg = ExperimentConfig.from_dict({**TEAM, "episodes": {"sampler": "rllib"}})
    assert not batched_sampler(cfg)
    with pytest.raises(ConfigError, match=r"episodes\.sampler must be one of"):
        ExperimentConfig.from_dict({**TEAM, "episodes": {"sampler": "fast"}}).check()
