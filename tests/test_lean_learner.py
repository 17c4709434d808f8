"""The lean learner step (``algorithm.learner: lean``) against RLlib's (``rllib``).

From the same weights and episodes one update gives the same weights and loss metrics: bit for
bit with foreach Adam (``LeanTorchLearner.fused = False``), within float32 rounding with the
fused Adam kernel (it orders Adam's arithmetic differently: here ≤ 1e-5 absolute after a dozen
steps at lr 1e-3, ≤ 1e-4 at lr 1e-2). Short ``train()`` runs (PPO, small-network GRPO, credit
with per-agent normalisation) give the same metrics; the tiny LLM's GRPO updates (KL penalty)
match the GRPO learner's; frozen pools stay bit-identical; a checkpoint resumes exactly. No
wall-clock thresholds.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from configs import tiny_config

from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError
from trainers.grpo.lean import LeanGRPOLearner
from trainers.learners.batch import ArrayPPOPipeline
from trainers.learners.categorical import (
    Categoricals,
    StackedCategoricals,
    categorical_lens,
    categoricals,
)
from trainers.learners.lean import IndexMinibatches, LeanPPOLearner, LeanTorchLearner

pytestmark = pytest.mark.usefixtures("ray_session")

#: fused Adam's drift from single-tensor Adam after one update of a dozen steps at lr 1e-3
#: (absolute; the kernels round differently in the last bits of float32).
FUSED_ATOL = 1e-5


def _cfg(tmp_path: Path, learner: str, **algo: Any) -> ExperimentConfig:
    return tiny_config(
        tmp_path,
        batch=128,
        topology="star:2",
        algorithm={
            "train_batch_size": 128,
            "minibatch_size": 32,
            "num_epochs": 3,
            "learner": learner,
            **algo,
        },
    )


def _weights(algo: Any) -> dict[str, dict[str, np.ndarray]]:
    state = algo.learner_group.get_weights()
    return {m: {k: np.array(v) for k, v in w.items()} for m, w in state.items()}


def _loss_metrics(results: Any) -> dict[tuple[str, str], float]:
    """The loss metrics of a ``learner_group.update`` result (its leaves are RLlib stats)."""
    keys = ("policy_loss", "vf_loss", "vf_loss_unclipped", "vf_explained_var", "entropy")
    keys += ("mean_kl_loss", "total_loss", "curr_kl_coeff")
    keys += ("diff_num_grad_updates_vs_sampler_policy",)
    out = {}
    for module, stats in results[0].items():
        for key in keys:
            if key in stats:
                value = stats[key]
                value = value.peek() if hasattr(value, "peek") else value
                out[(module, key)] = float(np.asarray(value))
    return out


def _update_both(tmp_path: Path, lean_cls: type) -> tuple[Any, Any, Any, Any]:
    """One update of an RLlib learner and of ``lean_cls`` from the same state and episodes."""
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    from trainers.algo import to_algorithm_config
    from trainers.run.resume import rng_state, set_rng_state

    ref_cfg = to_algorithm_config(_cfg(tmp_path / "r", "rllib"))
    lean_cfg = to_algorithm_config(_cfg(tmp_path / "l", "lean")).learners(learner_class=lean_cls)
    ref, lean = ref_cfg.build_algo(), lean_cfg.build_algo()
    ref.train()  # a non-trivial optimizer state, then the lean learner starts from it
    lean.learner_group.set_state(ref.learner_group.get_state())
    episodes = ref.env_runner_group.local_env_runner.sample(num_timesteps=128, explore=True)
    blob = pickle.dumps([e.get_state() for e in episodes])
    kwargs = {"timesteps": {}, "num_epochs": 3, "minibatch_size": 32}
    kwargs["shuffle_batch_per_epoch"] = True
    rng = rng_state()
    results = []
    for algo in (ref, lean):
        set_rng_state(rng)
        copies = [MultiAgentEpisode.from_state(s) for s in pickle.loads(blob)]
        results.append(algo.learner_group.update(episodes=copies, **kwargs))
    return ref, lean, results[0], results[1]


class ExactLean(LeanPPOLearner):
    """The lean PPO learner with foreach Adam (bit-identical to RLlib's single-tensor Adam)."""

    fused = False


def test_learner_field_is_typed_and_checked(tmp_path: Path) -> None:
    from trainers.algo import learner_class
    from trainers.learners.value_norm_learner import ValueNormPPOLearner

    assert ExperimentConfig().algorithm.learner == "lean"
    assert learner_class(ExperimentConfig()) is LeanPPOLearner
    cfg = ExperimentConfig.from_dict({"algorithm": {"name": "GRPO"}})
    assert learner_class(cfg) is LeanGRPOLearner
    rllib = ExperimentConfig.from_dict({"algorithm": {"learner": "rllib"}})
    assert learner_class(rllib) is ValueNormPPOLearner  # RLlib's step, normalised targets
    plain = ExperimentConfig.from_dict({"algorithm": {"learner": "rllib", "value_norm": False}})
    # RLlib's step with time limits bootstrapped (trainers.learners.time_limits); a plain
    # PPOTorchLearner otherwise
    assert learner_class(plain) is ValueNormPPOLearner
    grpo_rllib = ExperimentConfig.from_dict({"algorithm": {"name": "GRPO", "learner": "rllib"}})
    assert learner_class(grpo_rllib) is None
    with pytest.raises(ConfigError, match=r"algorithm.learner='fast' is not one of 'lean'"):
        ExperimentConfig.from_dict({"algorithm": {"learner": "fast"}})
    bad = ExperimentConfig()
    bad.algorithm.learner = "fast"  # type: ignore[assignment]  (set after construction)
    with pytest.raises(ConfigError, match=r"algorithm.learner='fast' is unknown: use lean"):
        bad.algorithm.check()
    with pytest.raises(ConfigError, match="learner"):
        ExperimentConfig.from_dict({"algorithm": {"name": "APPO", "learner": "lean"}})


def test_categoricals_match_torch_distributions_bit_for_bit() -> None:
    from ray.rllib.core.distribution.torch.torch_distribution import (
        TorchCategorical,
        TorchMultiCategorical,
    )

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 9, generator=gen, requires_grad=True)
    other = torch.randn(64, 9, generator=gen)
    other[:, 0] = -torch.inf  # a zero-probability action: KL's special cases
    for dist_cls, actions in (
        (TorchCategorical, torch.randint(0, 9, (64,), generator=gen)),
        (
            TorchMultiCategorical.get_partial_dist_cls(input_lens=[2, 3, 4]),
            torch.stack([torch.randint(0, n, (64,), generator=gen) for n in (2, 3, 4)], -1),
        ),
        (
            TorchMultiCategorical.get_partial_dist_cls(input_lens=[9]),
            torch.randint(0, 9, (64, 1), generator=gen),
        ),
        (  # parts of one size: StackedCategoricals
            TorchMultiCategorical.get_partial_dist_cls(input_lens=[3, 3, 3]),
            torch.randint(0, 3, (64, 3), generator=gen),
        ),
    ):
        found = categorical_lens(dist_cls, logits)
        assert found is not None
        theirs, their_prev = dist_cls.from_logits(logits), dist_cls.from_logits(other)
        pairs = []
        for make in (Categoricals, categoricals):
            ours, prev = make(logits, *found), make(other, *found)
            pairs += [
                (ours.logp(actions), theirs.logp(actions)),
                (ours.entropy(), theirs.entropy()),
                (prev.kl(ours), their_prev.kl(theirs)),
                (ours.kl(prev), theirs.kl(their_prev)),  # infinite where prev has probability 0
            ]
        stacked = found[0] == [3, 3, 3]
        assert isinstance(categoricals(logits, *found), StackedCategoricals) is stacked
        for a, b in pairs:
            assert torch.equal(a, b)
            (ga,) = torch.autograd.grad(a[torch.isfinite(a)].sum(), logits, retain_graph=True)
            (gb,) = torch.autograd.grad(b[torch.isfinite(b)].sum(), logits, retain_graph=True)
            torch.testing.assert_close(ga, gb, rtol=0, atol=0, equal_nan=True)


def test_one_update_is_bit_identical_with_foreach_adam(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Any] = []
    replacing = IndexMinibatches.replacing
    monkeypatch.setattr(
        IndexMinibatches, "replacing", lambda found: made.append(replacing(found)) or made[-1]
    )
    ref, lean, ref_out, lean_out = _update_both(tmp_path, ExactLean)
    try:
        assert made and all(isinstance(m, IndexMinibatches) for m in made)  # its minibatches
        pipeline = lean.learner_group._learner._learner_connector
        assert isinstance(pipeline, ArrayPPOPipeline) and pipeline.fallbacks == 0  # arrays
        ref_w, lean_w = _weights(ref), _weights(lean)
        assert ref_w.keys() == lean_w.keys() == {"orchestrator", "worker"}
        for module, weights in ref_w.items():
            for key, value in weights.items():
                assert np.array_equal(value, lean_w[module][key]), (module, key)
        metrics = _loss_metrics(ref_out)
        assert len(metrics) >= 14
        assert metrics == _loss_metrics(lean_out)
    finally:
        ref.stop()
        lean.stop()


def test_one_update_with_fused_adam_is_equal_up_to_rounding(tmp_path: Path) -> None:
    ref, lean, ref_out, lean_out = _update_both(tmp_path, LeanPPOLearner)
    try:
        opt = lean.learner_group._learner.get_optimizer("orchestrator")
        assert opt.param_groups[0]["fused"] is True  # kept when the RLlib state was loaded
        ref_w, lean_w = _weights(ref), _weights(lean)
        for module, weights in ref_w.items():
            for key, value in weights.items():
                np.testing.assert_allclose(lean_w[module][key], value, rtol=0, atol=FUSED_ATOL)
        ref_m, lean_m = _loss_metrics(ref_out), _loss_metrics(lean_out)
        assert ref_m.keys() == lean_m.keys()
        for key, value in ref_m.items():
            assert lean_m[key] == pytest.approx(value, rel=1e-3, abs=1e-5), key
    finally:
        ref.stop()
        lean.stop()


def _history(result: Any) -> list[dict[str, Any]]:
    """The metrics rows without timings and throughputs (which differ run to run)."""
    return [
        {k: v for k, v in row.items() if not (k.startswith("timers/") or k.endswith(_TIMED))}
        for row in result.history
    ]


_TIMED = ("_s", "per_s", "throughput")


@pytest.mark.parametrize(
    "sections",
    [
        pytest.param({}, id="ppo"),
        pytest.param({"algorithm": {"value_norm": False}}, id="ppo-raw-value-targets"),
        pytest.param({"credit": {"method": "loo", "normalize": True, "workers": 1}}, id="credit"),
        pytest.param(
            {
                "algorithm": {
                    "name": "GRPO",
                    "num_epochs": 2,
                    "grpo": {"group_size": 4, "groups_per_iteration": 2},
                },
                "pools": {"orchestrator": {"model": {"type": "mlp", "hidden": [16]}}},
            },
            id="grpo",
        ),
    ],
)
def test_train_gives_the_same_metrics_on_both_learners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sections: dict[str, Any]
) -> None:
    """Bit-identical metrics with foreach Adam; the lean learner is the one that ran. With
    ``value_norm: false`` the reference is RLlib's ``PPOTorchLearner`` itself."""
    from trainers.run.loop import train

    monkeypatch.setattr(LeanTorchLearner, "fused", False)
    flushes: list[str] = []
    flush = LeanTorchLearner.flush_metrics
    monkeypatch.setattr(
        LeanTorchLearner, "flush_metrics", lambda self: flushes.append(learner) or flush(self)
    )
    runs = {}
    for learner in ("rllib", "lean"):
        algo = {**sections.get("algorithm", {}), "learner": learner}
        if "name" not in algo:
            algo.update(train_batch_size=128, minibatch_size=64, num_epochs=2)
        cfg = tiny_config(tmp_path / learner, **{**sections, "algorithm": algo})
        runs[learner] = train(cfg)
    ref, lean = _history(runs["rllib"]), _history(runs["lean"])
    assert len(ref) == 2
    assert set(flushes) == {"lean"}  # the lean learner updated in the lean run only
    assert sum(k.startswith("losses/") for k in ref[0]) >= 4
    diff = {
        k
        for r, a in zip(ref, lean, strict=True)
        for k in r.keys() | a.keys()
        if r.get(k) != a.get(k)
    }
    assert not diff


def _checkpoint_weights(ckpt: Path) -> dict[str, dict[str, Any]]:
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule

    modules = MultiRLModule.from_checkpoint(str(ckpt / "learner_group" / "learner" / "rl_module"))
    return {mid: dict(m.state_dict()) for mid, m in modules.items()}


def test_frozen_pool_is_bit_identical_with_the_lean_learner(tmp_path: Path) -> None:
    from trainers.algo import to_algorithm_config

    cfg = _cfg(tmp_path, "lean").replace(train=["orchestrator"])
    algo = to_algorithm_config(cfg).build_algo()
    try:
        assert isinstance(algo.learner_group._learner, LeanPPOLearner)
        before = _weights(algo)
        for _ in range(2):
            algo.train()
        after = _weights(algo)
        frozen = before["worker"]
        assert all(np.array_equal(v, after["worker"][k]) for k, v in frozen.items())
        runner = algo.get_module("worker").get_state(inference_only=True)
        assert all(np.array_equal(np.asarray(v), frozen[k]) for k, v in runner.items())
        trained = before["orchestrator"]
        assert any(not np.array_equal(v, after["orchestrator"][k]) for k, v in trained.items())
    finally:
        algo.stop()


def test_checkpoint_resume_is_exact_with_the_lean_learner(tmp_path: Path) -> None:
    """Iterations 1–3 in one go equal 1–2 then a resume for 3 (fused Adam's state included)."""
    from trainers.run.loop import train

    straight = train(_cfg(tmp_path / "a", "lean").replace(**{"budget.iterations": 3}))
    first = train(_cfg(tmp_path / "b", "lean"))
    resumed = train(
        _cfg(tmp_path / "b", "lean").replace(**{"budget.iterations": 3}), resume=first.run_dir
    )
    assert _history(resumed) == _history(straight)
    want = _checkpoint_weights(straight.run_dir / "checkpoints" / "iter_000003")
    got = _checkpoint_weights(resumed.run_dir / "checkpoints" / "iter_000003")
    assert want.keys() == got.keys() == {"orchestrator", "worker"}
    for mid, params in want.items():
        for name, value in params.items():
            assert torch.equal(got[mid][name], value), (mid, name)


class ExactLeanGRPO(LeanGRPOLearner):
    """The lean GRPO learner with foreach Adam."""

    fused = False


@pytest.mark.parametrize("lean_cls", [ExactLeanGRPO, LeanGRPOLearner], ids=["foreach", "fused"])
def test_llm_grpo_updates_match_the_grpo_learner(lean_cls: type) -> None:
    """The tiny LLM under GRPO with a KL penalty, two minibatches, two updates: the same
    trained weights (bit for bit with foreach Adam) and loss metrics; the frozen pool stays."""
    from llm_modules import learner_config
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from test_llm_rllib import hand_batch, state_of

    from scenarios.text_space import TextSpaces
    from trainers.grpo.learner import GRPOLearner

    spaces = TextSpaces(vocab_size=384, max_prompt_tokens=48, max_new_tokens=8)
    both = (spaces.observation_space, spaces.action_space)
    out = {}
    for cls in (GRPOLearner, lean_cls):
        config = learner_config(spaces, minibatch_size=3, kl_coef=0.1, clip_high=0.3)
        learner = config.learners(learner_class=cls).build_learner(
            spaces={"trained": both, "frozen": both}
        )
        assert type(learner) is cls
        trained = learner.module["trained"].unwrapped()
        frozen = learner.module["frozen"].unwrapped()
        before, start = state_of(frozen), state_of(trained)
        batch = hand_batch(trained, spaces, [1.0, -1.0, 0.5, -0.5, 2.0, 3.0])
        numpy_batch = {k: v.numpy() for k, v in batch.items()}
        for _ in range(2):
            results = learner.update(
                batch=MultiAgentBatch({"trained": SampleBatch(dict(numpy_batch))}, env_steps=6),
                minibatch_size=3,
                num_epochs=1,
            )
        assert all(torch.equal(before[k], v) for k, v in state_of(frozen).items())
        stats = {k: v.peek() for k, v in results["trained"].items() if k.startswith("grpo/")}
        out[cls] = (state_of(trained), stats, start)
    (ref_w, ref_m, ref_start), (lean_w, lean_m, lean_start) = out[GRPOLearner], out[lean_cls]
    assert any(name.endswith("k_proj.bias") for name in ref_w)
    assert ref_m.keys() == lean_m.keys() and "grpo/kl" in ref_m
    for name, value in ref_w.items():
        if lean_cls is ExactLeanGRPO:
            assert torch.equal(lean_w[name], value), name
        elif name.endswith("k_proj.bias"):
            # a key bias shifts every score of a query's row alike, which softmax ignores: its
            # gradient is 0 in exact arithmetic, so both updates are Adam's step m / (√v + ε)
            # of rounding noise (seen: 1.9e-4 apart on an AMD EPYC); only bounded here, by
            # four Adam steps (2 updates of 2 minibatches) of about lr 1e-2 each
            assert torch.equal(lean_start[name], ref_start[name]), name
            assert (lean_w[name] - lean_start[name]).abs().max() <= 4 * 1e-2 * 1.1, name
        else:
            # lr 1e-2 here: Adam's step m / (√v + ε) magnifies the kernels' rounding where
            # √v ≈ ε (seen: 1.1e-5 on one of 128 elements)
            torch.testing.assert_close(lean_w[name], value, rtol=0, atol=10 * FUSED_ATOL)
    for key, value in ref_m.items():
        if lean_cls is ExactLeanGRPO:
            assert lean_m[key] == value, key
        else:
            assert lean_m[key] == pytest.approx(value, rel=1e-3, abs=1e-4), key
