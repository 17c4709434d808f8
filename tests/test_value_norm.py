"""Value-target normalisation (issue #27): the normaliser's math and GAE with it against
hand-computed numbers, its state round trip and the config switch. No Ray started here; the
learners are tested in ``tests/test_value_norm_learner.py``, the critic monitor in
``tests/test_monitors.py``."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

import trainers.learners.value_norm
from trainers.configs.algorithms import PPOAlgo
from trainers.configs.experiment import ExperimentConfig
from trainers.configs.typed import ConfigError
from trainers.learners.value_norm import ValueNorm


# ----- the normaliser ---------------------------------------------------------------------------
def test_identity_before_the_first_update() -> None:
    norm = ValueNorm()
    x = np.array([-50.0, 0.5, 3.0], dtype=np.float32)
    assert (norm.mean, norm.std) == (0.0, 1.0)
    for out in (norm.normalize(x), norm.denormalize(x)):
        assert out.dtype == np.float32 and np.array_equal(out, x)
    norm.update(np.zeros(0))  # an empty batch changes nothing
    assert norm.updates == 0 and norm.std == 1.0


def test_debiased_running_moments_by_hand() -> None:
    norm = ValueNorm(beta=0.5)
    norm.update([1.0, 3.0])
    # running mean = 0.5·2 = 1, running mean square = 0.5·5 = 2.5, weight = 0.5:
    # μ = 1 / 0.5 = 2, σ² = 2.5 / 0.5 − 2² = 1 (the first batch exactly)
    assert (norm.mean, norm.var) == (2.0, 1.0)
    norm.update(np.array([[4.0]]))
    # running mean = 0.5·1 + 0.5·4 = 2.5, mean square = 0.5·2.5 + 0.5·16 = 9.25, weight 0.75:
    # μ = 10/3, σ² = 37/3 − 100/9 = 11/9
    assert norm.mean == pytest.approx(10 / 3, abs=1e-12)
    assert norm.var == pytest.approx(11 / 9, abs=1e-12)
    y = norm.normalize(np.array([4.0, 10 / 3]))
    np.testing.assert_allclose(y, [(4 - 10 / 3) / math.sqrt(11 / 9), 0.0], atol=1e-12)
    np.testing.assert_allclose(norm.denormalize(y), [4.0, 10 / 3], atol=1e-12)


def test_variance_floor() -> None:
    norm = ValueNorm(beta=0.9)
    norm.update([5.0, 5.0, 5.0])  # equal returns: σ² = 0, floored at 0.01
    assert norm.mean == pytest.approx(5.0) and norm.std == pytest.approx(0.1)
    assert norm.normalize(np.array([5.1]))[0] == pytest.approx(1.0)


def test_beta_is_checked() -> None:
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\)"):
        ValueNorm(beta=1.0)


def test_state_round_trip_continues_exactly() -> None:
    rng = np.random.default_rng(0)
    batches = [rng.normal(-40, 12, size=64) for _ in range(4)]
    norm = ValueNorm()
    for b in batches[:2]:
        norm.update(b)
    copy = ValueNorm.from_state(norm.get_state())
    assert copy.get_state() == norm.get_state()
    for b in batches[2:]:
        norm.update(b)
        copy.update(b)
    assert copy.get_state() == norm.get_state() and copy.updates == 4
    x = rng.normal(size=8).astype(np.float32)
    assert np.array_equal(copy.denormalize(x), norm.denormalize(x))


def test_docstring_example_runs() -> None:
    result = doctest.testmod(trainers.learners.value_norm, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# ----- GAE with normalisation (the function both learner pipelines call) --------------------------
def test_advantages_and_targets_by_hand() -> None:
    """One episode of two steps cut by truncation, plus the extra step RLlib appends for the
    bootstrap value. γ = 0.5, λ = 1; the critic's normalised outputs 0, 1, 2 with μ = 10,
    σ = 2 are the values 10, 12, 14. TD errors: 1 + 0.5·12 − 10 = −3, 2 + 0.5·14 − 12 = −3
    (the cut step bootstraps V = 14), and 0 − 14 on the extra row; GAE: −3 + 0.5·(−3) = −4.5,
    −3 (the recursion stops at the cut), −14. Targets = advantages + values: 5.5, 9, 0."""
    pytest.importorskip("ray")
    from trainers.learners.value_norm_learner import advantages_and_targets

    norm = ValueNorm(beta=0.0)  # β = 0: the statistics are the last batch's
    norm.update([8.0, 12.0])  # μ = 10, σ = 2
    cols = {
        "values": np.array([0.0, 1.0, 2.0], dtype=np.float32),
        "rewards": np.array([1.0, 2.0, 0.0], dtype=np.float32),
        "terminateds": np.array([0.0, 0.0, 0.0], dtype=np.float32),
        "truncateds": np.array([0.0, 1.0, 0.0], dtype=np.float32),
    }
    mask = np.array([True, True, False])
    adv, targets = advantages_and_targets(
        *cols.values(), gamma=0.5, lambda_=1.0, norm=norm, mask=mask, learn=True
    )
    raw = np.array([-4.5, -3.0, -14.0])
    np.testing.assert_allclose(adv, (raw - raw.mean()) / raw.std(), rtol=1e-6)
    # the update saw the two valid targets 5.5 and 9: μ = 7.25, σ² = 55.625 − 7.25² = 1.75²
    assert norm.mean == pytest.approx(7.25) and norm.std == pytest.approx(1.75)
    np.testing.assert_allclose(targets, [-1.0, 1.0, -7.25 / 1.75], rtol=1e-6)
    assert adv.dtype == targets.dtype == np.float32
    # without a normaliser: RLlib's computation (raw values, raw targets)
    raw_cols = dict(cols, values=np.array([10.0, 12.0, 14.0], dtype=np.float32))
    adv2, targets2 = advantages_and_targets(*raw_cols.values(), gamma=0.5, lambda_=1.0)
    np.testing.assert_allclose(targets2, [5.5, 9.0, 0.0])
    np.testing.assert_allclose(adv2, adv, rtol=1e-6)
    frozen = ValueNorm.from_state(norm.get_state())
    advantages_and_targets(*cols.values(), gamma=0.5, lambda_=1.0, norm=frozen, learn=False)
    assert frozen.get_state() == norm.get_state()  # learn=False: a frozen module's stays


# ----- the config switch -------------------------------------------------------------------------
def test_value_norm_is_on_by_default_and_clipping_off() -> None:
    algo = ExperimentConfig().algorithm
    assert isinstance(algo, PPOAlgo) and algo.value_norm is True
    assert algo.training_kwargs()["vf_clip_param"] == math.inf
    off = ExperimentConfig.from_dict({"algorithm": {"value_norm": False}})
    assert off.algorithm.value_norm is False  # type: ignore[attr-defined]
    assert ExperimentConfig.from_yaml(off.to_yaml()) == off
    assert ExperimentConfig.from_dict({"algorithm": "PPO"}).algorithm.value_norm is True  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"algorithm.value_norm must be true or false"):
        ExperimentConfig.from_dict({"algorithm": {"value_norm": "yes"}})
    with pytest.raises(ConfigError, match=r"'APPO', which has no field\(s\) \['value_norm'\]"):
        ExperimentConfig.from_dict({"algorithm": {"name": "APPO", "value_norm": True}})
    # switching to APPO drops the default; a non-default value is named
    assert ExperimentConfig().replace(**{"algorithm.name": "APPO"}).algorithm.name == "APPO"
    with pytest.raises(ConfigError, match="value_norm"):
        off.replace(**{"algorithm.name": "APPO"})


@pytest.mark.parametrize(
    ("sections", "want"),
    [
        pytest.param({}, "LeanPPOLearner", id="lean"),
        pytest.param({"algorithm": {"learner": "rllib"}}, "ValueNormPPOLearner", id="rllib"),
        pytest.param(
            {"algorithm": {"learner": "rllib"}, "credit": {"method": "loo", "normalize": True}},
            "CreditPPOTorchLearner",
            id="rllib-credit",
        ),
        pytest.param(
            {"algorithm": {"learner": "rllib", "value_norm": False}},
            "ValueNormPPOLearner",  # with the flag off: it still bootstraps time limits
            id="rllib-off",
        ),
    ],
)
def test_learner_classes_and_the_flag(sections: dict, want: str) -> None:
    """Every PPO learner is a ValueNormPPOLearner (the credit and lean learners too; with
    ``value_norm: false`` it only bootstraps time limits, issue #27); the flag reaches them in
    ``learner_config_dict``."""
    pytest.importorskip("ray")
    from trainers.algo import to_algorithm_config
    from trainers.learners.value_norm import VALUE_NORM_KEY
    from trainers.learners.value_norm_learner import ValueNormPPOLearner

    cfg = ExperimentConfig.from_dict(sections)
    config = to_algorithm_config(cfg)
    assert config.learner_class.__name__ == want
    on = cfg.algorithm.value_norm  # type: ignore[attr-defined]
    assert issubclass(config.learner_class, ValueNormPPOLearner)
    assert config.learner_config_dict[VALUE_NORM_KEY] is on


def test_value_norm_beta_is_a_checked_knob() -> None:
    """``algorithm.value_norm_beta`` (issue #27): 0.99 by default; MAPPO's 0.99999 makes the
    debiased statistics the plain mean over the batches so far; a beta outside [0, 1) is a
    ConfigError naming the choices."""
    from trainers.learners.value_norm import BETA

    algo = ExperimentConfig.from_dict({"algorithm": "MAPPO"}).algorithm
    assert algo.value_norm_beta == BETA == 0.99  # type: ignore[attr-defined]
    assert ValueNorm().beta == BETA
    mappo = ExperimentConfig.from_dict({"algorithm": {"value_norm_beta": 0.99999}})
    slow = ValueNorm(beta=mappo.algorithm.value_norm_beta)  # type: ignore[attr-defined]
    for batch in ([-10.0, -30.0], [-50.0], [-70.0, -90.0, -110.0]):
        slow.update(batch)
    # equal weight per batch: the mean of the batch means (−20, −50, −90)
    assert slow.mean == pytest.approx(-160 / 3, rel=1e-4)
    with pytest.raises(ConfigError, match=r"value_norm_beta must be in \[0, 1\).*0.99999"):
        ExperimentConfig.from_dict({"algorithm": {"value_norm_beta": 1.0}}).check()


def test_value_norm_beta_reaches_the_learners_normalisers() -> None:
    pytest.importorskip("ray")
    from trainers.algo import to_algorithm_config
    from trainers.learners.value_norm import VALUE_NORM_BETA_KEY
    from trainers.learners.value_norm_learner import ValueNormGAE

    cfg = ExperimentConfig.from_dict({"algorithm": {"value_norm_beta": 0.9}})
    assert to_algorithm_config(cfg).learner_config_dict[VALUE_NORM_BETA_KEY] == 0.9
    piece = ValueNormGAE(gamma=0.99, lambda_=0.95, beta=0.9)
    assert piece.norm("team").beta == 0.9
    assert ValueNormGAE(gamma=0.99, lambda_=0.95).norm("team").beta == 0.99
