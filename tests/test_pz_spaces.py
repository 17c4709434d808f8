"""Every observation and action space PettingZoo envs use (issue #43): the conversion of
:mod:`scenarios.pz_spaces` against gymnasium's own flattening, the action-mask contract, the
refusals (naming agent, space and fix; exit 2 from ``marl run`` before Ray starts), the
wrapped env under PettingZoo's ``parallel_api_test``, and each space kind through ``train()``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from scenarios.pz_spaces import (
    MASK_KEY,
    MAX_ONE_HOT,
    OBS_KEY,
    UnsupportedSpace,
    convert_action_space,
    convert_observation_space,
    flat_space,
    has_action_mask,
    image_pool,
    is_image,
)
from scenarios.registry import build
from scenarios.rllib_env import RLlibGraphEnv
from scenarios.testing import check_pettingzoo, random_episode
from tests.configs import tiny_config
from tests.pz_toys import ACT_KINDS, OBS_KINDS, REFUSED_ACT, REFUSED_OBS, SpaceEnv

SPACE_ENV = "tests.pz_toys:space_env"
MASKED = ("mask", "info_mask")
PLAIN = [k for k in OBS_KINDS if k not in MASKED and not is_image(OBS_KINDS[k])]


@pytest.mark.parametrize("kind", PLAIN)
def test_observations_flatten_as_gymnasium_flattens_them(kind: str) -> None:
    """The same layout as gymnasium's ``flatten`` (RLlib's flatten: one-hot Discrete and
    MultiDiscrete, Dict in key order, Tuple in order), always ``float32``, inside the space."""
    space = OBS_KINDS[kind]
    conv = convert_observation_space("left_0", space, gym.spaces.Discrete(3))
    assert not conv.masked and isinstance(conv.space, gym.spaces.Box)
    assert conv.space.dtype == np.float32 and conv.space.shape == (gym.spaces.flatdim(space),)
    space.seed(0)
    for _ in range(5):
        x = space.sample()
        out = conv(x)
        assert out.dtype == np.float32 and conv.space.contains(out)
        np.testing.assert_array_equal(out, gym.spaces.flatten(space, x).astype(np.float32))


def test_one_hots_by_hand() -> None:
    conv = convert_observation_space("a", gym.spaces.Discrete(3, start=-1), gym.spaces.Discrete(2))
    assert conv(-1).tolist() == [1.0, 0.0, 0.0] and conv(1).tolist() == [0.0, 0.0, 1.0]
    md = convert_observation_space("a", gym.spaces.MultiDiscrete([2, 3]), gym.spaces.Discrete(2))
    assert md(np.array([1, 2])).tolist() == [0.0, 1.0, 0.0, 0.0, 1.0]
    small = flat_space("a", gym.spaces.Box(0, 255, (4, 4, 3), np.uint8))
    assert small.shape == (48,) and small.high.max() == 255.0  # not an image: as it is


def test_images_are_pooled_to_at_most_max_image_pixels_and_scaled() -> None:
    """The documented choice for images (no CNN): block means, pixels in [0, 1]."""
    space = OBS_KINDS["image"]
    assert is_image(space) and image_pool(space) == 2
    conv = convert_observation_space("a", space, gym.spaces.Discrete(2))
    assert conv.space == gym.spaces.Box(0.0, 1.0, (50 * 45 * 3,), np.float32)
    x = np.zeros(space.shape, np.uint8)
    x[0, 0, 1] = 255  # one pixel of a 2×2 block, channel 1
    x[-2:, -2:, 2] = 255  # a whole block, the last one, channel 2
    out = conv(x).reshape(50, 45, 3)
    assert out[0, 0].tolist() == [0.0, 0.25, 0.0] and out[-1, -1].tolist() == [0.0, 0.0, 1.0]
    assert out.sum() == pytest.approx(1.25)
    pistonball = gym.spaces.Box(0, 255, (457, 120, 3), np.uint8)
    assert flat_space("a", pistonball).shape == (152 * 40 * 3,)
    assert not is_image(OBS_KINDS["small_uint8"]) and not is_image(OBS_KINDS["int_box"])


def test_a_mask_in_the_observation_is_the_masked_dict() -> None:
    space = OBS_KINDS["mask"]
    conv = convert_observation_space("p", space, gym.spaces.Discrete(3))
    assert has_action_mask(conv.space) and conv.masked and conv.mask_in_obs
    assert conv.space[OBS_KEY] == gym.spaces.Box(0.0, 1.0, (3,), np.float32)
    assert conv.space[MASK_KEY] == gym.spaces.Box(0, 1, (3,), np.int8)  # PettingZoo's dtype
    out = conv({"observation": np.array([1, 0, 1], np.int8), "action_mask": np.array([0, 1, 1])})
    assert out[OBS_KEY].tolist() == [1.0, 0.0, 1.0] and out[MASK_KEY].tolist() == [0.0, 1.0, 1.0]
    assert out[MASK_KEY].dtype == np.int8 and conv.space.contains(out)
    assert gym.spaces.Discrete(3).sample(mask=out[MASK_KEY]) in (1, 2)  # PettingZoo's idiom


def test_a_mask_in_the_infos_is_the_masked_dict() -> None:
    space = OBS_KINDS["info_mask"]
    conv = convert_observation_space("p", space, gym.spaces.Discrete(3), info_mask=True)
    assert has_action_mask(conv.space) and not conv.mask_in_obs
    x = np.array([0.5, 0, 1], np.float32)
    out = conv(x, {"action_mask": np.array([1, 0, 1], np.int8)})
    assert out[OBS_KEY].tolist() == x.tolist() and out[MASK_KEY].tolist() == [1.0, 0.0, 1.0]
    assert conv(x, {})[MASK_KEY].tolist() == [1.0, 1.0, 1.0]  # no mask this step: all allowed
    assert not has_action_mask(gym.spaces.Dict({"observation": gym.spaces.Box(0, 1)}))


def test_a_mask_of_the_wrong_size_or_for_box_actions_is_refused() -> None:
    with pytest.raises(UnsupportedSpace, match=r"'p'.*has 3 entries for 4 actions"):
        convert_observation_space("p", OBS_KINDS["mask"], gym.spaces.Discrete(4))
    with pytest.raises(UnsupportedSpace, match=r"'p': action space Box.*needs Discrete"):
        convert_observation_space("p", OBS_KINDS["mask"], gym.spaces.Box(-1, 1, (3,)))


@pytest.mark.parametrize("kind", list(ACT_KINDS))
def test_actions_go_back_to_the_envs_space(kind: str) -> None:
    raw = ACT_KINDS[kind]
    conv = convert_action_space("a", raw)
    assert isinstance(conv.space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.Box))
    conv.space.seed(1)
    for _ in range(10):
        action = conv(conv.space.sample())
        assert raw.contains(np.asarray(action, raw.dtype) if not np.isscalar(action) else action)
    if kind == "multibinary":  # MultiBinary(n) is sampled as MultiDiscrete([2] * n)
        assert conv.space == gym.spaces.MultiDiscrete([2, 2, 2])
        assert conv(np.array([1, 0, 1])).dtype == raw.dtype
    if kind == "discrete_start":
        assert conv.space == gym.spaces.Discrete(3) and conv(0) == 1


@pytest.mark.parametrize(
    ("obs", "act", "match"),
    [
        *[(k, "discrete", "observation space") for k in REFUSED_OBS],
        *[("box", k, "action space") for k in REFUSED_ACT],
    ],
)
def test_a_space_that_cannot_be_trained_is_refused_naming_agent_and_space(
    obs: str, act: str, match: str
) -> None:
    space = (REFUSED_OBS.get(obs) if act == "discrete" else REFUSED_ACT[act]) or OBS_KINDS[obs]
    name = type(space).__name__
    with pytest.raises(UnsupportedSpace, match=f"agent 'left_0': {match} {name}") as err:
        build(SPACE_ENV, obs=obs, act=act)
    text = str(err.value)
    assert "cannot be trained" in text and ("wrap the env" in text or "give the agent" in text)
    assert "\n" not in text


def test_huge_discrete_is_refused_with_the_limit() -> None:
    with pytest.raises(UnsupportedSpace, match=f"MAX_ONE_HOT={MAX_ONE_HOT}"):
        build(SPACE_ENV, obs="huge_discrete")


def test_marl_run_refuses_before_ray_starts(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trainers.cli import app

    config = tmp_path / "c.yaml"
    config.write_text("scenario_kwargs: {obs: sequence}\n")
    args = ["run", SPACE_ENV, "--config", str(config), "--iterations", "1"]
    args += ["--wandb", "disabled", "--output", str(tmp_path / "runs")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())  # one message (rich wraps it to the terminal)
    assert text.startswith("error: ") and text.count("error: ") == 1
    assert "agent 'left_0': observation space Sequence(Discrete(3)" in text
    assert "Traceback" not in text
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.parametrize(
    ("obs", "act"),
    [(k, "discrete") for k in OBS_KINDS] + [("box", k) for k in ACT_KINDS if k != "discrete"],
)
def test_the_wrapped_env_passes_pettingzoos_tests(obs: str, act: str) -> None:
    """``parallel_api_test`` on the env the trainer sees, every observation inside its declared
    (converted) space, the RLlib view's spaces the converted ones. (PettingZoo's test samples
    with an ``action_mask`` it expects as ``int8``; the trainer's masked observations carry it
    as ``float32`` (the contract of :mod:`scenarios.pz_spaces`), so masked kinds are stepped
    with random episodes instead.)"""
    view = RLlibGraphEnv({"scenario": SPACE_ENV, "kwargs": {"obs": obs, "act": act}})
    if obs not in MASKED:
        check_pettingzoo(lambda: build(SPACE_ENV, obs=obs, act=act), cycles=40)
        parallel_api_test(view.env, num_cycles=20)
    for seed in range(3):
        random_episode(view.env, seed=seed)
    for a in view.possible_agents:
        space = view.observation_spaces[a]
        assert isinstance(space, gym.spaces.Box) or has_action_mask(space)
    obs_, _ = view.reset(seed=0)
    assert all(view.observation_spaces[a].contains(o) for a, o in obs_.items())


def test_classic_rps_starts_its_state_being_a_dict() -> None:
    """PettingZoo's rps_v2 keeps a dict in ``self.state``: no global state, no crash."""
    s = build("pettingzoo.classic.rps_v2:env")
    assert s.state_space is None
    assert s.observation_space("player_0") == gym.spaces.Box(0.0, 1.0, (4,), np.float32)
    check_pettingzoo(lambda: build("pettingzoo.classic.rps_v2:parallel_env"), cycles=30)


def _train(tmp_path: Path, scenario: str, **kwargs: Any) -> dict[str, Any]:
    from trainers import train

    cfg = tiny_config(
        tmp_path, batch=32, checkpoint_every=0, scenario=scenario, scenario_kwargs=kwargs
    )
    result = train(cfg)
    assert result.status == "completed", result.status
    assert len(result.history) == 2
    return result.history[-1]


def test_rps_trains(ray_session: Any, tmp_path: Path) -> None:
    row = _train(tmp_path, "pettingzoo.classic.rps_v2:env", max_cycles=5)
    assert np.isfinite(row["charts/team_return"])


def test_discrete_observations_and_multibinary_actions_train(
    ray_session: Any, tmp_path: Path
) -> None:
    """The two crashes a user met first: ``Discrete`` observations (RLlib has no encoder for
    them) and a space kind RLlib cannot sample as it is (``MultiBinary`` actions)."""
    row = _train(tmp_path, SPACE_ENV, obs="discrete", act="multibinary")
    assert np.isfinite(row["charts/team_return"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("obs", "act"),
    [(k, "discrete") for k in OBS_KINDS] + [("dict", k) for k in ACT_KINDS if k != "discrete"],
)
def test_every_space_kind_trains(ray_session: Any, tmp_path: Path, obs: str, act: str) -> None:
    row = _train(tmp_path, SPACE_ENV, obs=obs, act=act)
    assert np.isfinite(row["charts/team_return"])


def test_space_env_itself_checks_actions() -> None:
    """The toy env refuses an action outside its space (so the trainings above would fail
    loudly were a conversion wrong)."""
    env = SpaceEnv("box", "multibinary")
    env.reset()
    with pytest.raises(ValueError, match="not in MultiBinary"):
        env.step({"left_0": np.array([2, 0, 0]), "right_0": np.array([0, 0, 0])})
