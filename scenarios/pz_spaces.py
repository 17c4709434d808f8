"""A PettingZoo env's spaces as the trainer sees them: flat ``float32`` ``Box`` observations.

Pure functions, no env: :func:`convert_observation_space` turns an agent's raw observation space
into the one the scenario declares, and the :class:`ObservationConverter` it returns turns each
raw observation (and the step's ``info``) into an element of it; :func:`convert_action_space`
does the same for actions (the converted space and the map back to the env's action). Anything
that cannot be trained raises :class:`UnsupportedSpace` (a :class:`~scenarios.base.ScenarioError`)
naming the agent, the space and what to do — at scenario build, so ``marl run`` refuses it
before Ray starts.

Observations (the same flattening as RLlib's ``FlattenObservations`` connector and gymnasium's
``flatten_space``; nothing is scaled):

* ``Box`` of any shape and numeric dtype: flattened to 1-D ``float32``, values as they are;
* images (:func:`is_image`: a ``uint8`` ``Box`` of 0–255 shaped ``H×W`` or ``H×W×C`` with
  ``C`` in 1, 3, 4): flattened too — the documented choice, as RLlib's flatten is; there is no
  CNN — with pixels scaled to ``[0, 1]``, and an image of more than :data:`MAX_IMAGE_PIXELS`
  pixels first average-pooled over ``k×k`` blocks (the smallest integer ``k`` that brings it
  under, remainder rows and columns dropped; channels kept): pistonball's 457×120×3 becomes
  152×40×3 = 18,240 inputs instead of 164,520 (a batch of its 20 agents' observations would
  otherwise take 13 GB a thousand env steps). Wrap the env (e.g. SuperSuit's resize) for
  another choice;
* ``Discrete(n, start)``: a one-hot of ``n``; ``MultiDiscrete(nvec)``: the one-hots of its
  components, concatenated; ``MultiBinary``: its bits as ``0.0``/``1.0``;
* ``Dict`` (in its key order) and ``Tuple``: their parts flattened and concatenated, nested
  to any depth.

Refused: ``Text``, ``Graph``, ``Sequence``, ``OneOf`` and any other space without a fixed-size
flat form, and a ``Discrete``/``MultiDiscrete`` component of more than :data:`MAX_ONE_HOT`
values (no one-hot of it would train).

**Action masks** (the contract the samplers and learners build on). An agent whose raw
observation space is a ``Dict`` holding :data:`MASK_KEY` (PettingZoo's classic envs:
``{"observation": ..., "action_mask": ...}``), or whose reset/step ``info`` carries
:data:`MASK_KEY` (``info_mask=True``), gets the observation space
``Dict({OBS_KEY: Box(flat of the other keys, float32), MASK_KEY: Box(0, 1, (n,), int8)})``
with ``n`` the number of actions (:func:`action_count`), and observations
``{OBS_KEY: flat float32 vector, MASK_KEY: int8 0/1 vector}`` (``int8`` as PettingZoo's own
masks, so ``action_space.sample(mask=...)`` and PettingZoo's API tests take them; the samplers
stack them as ``float32``); :func:`has_action_mask`
tells such a space apart. Without a mask (an ``info`` that carries none this step) every action
is allowed.

Actions: ``Discrete`` (a ``start`` other than 0 is shifted back for the env), ``MultiDiscrete``
(likewise per component), ``Box`` (float), and ``MultiBinary(n)`` as ``MultiDiscrete([2] * n)``
(each bit a two-way choice; the env gets its ``int8`` array back). Anything else is refused.

Example:
    >>> import gymnasium as gym
    >>> raw = gym.spaces.Dict({"observation": gym.spaces.MultiBinary(3),
    ...                        "action_mask": gym.spaces.Box(0, 1, (2,), "int8")})
    >>> conv = convert_observation_space("player_0", raw, gym.spaces.Discrete(2))
    >>> has_action_mask(conv.space), conv.space[OBS_KEY].shape
    (True, (3,))
    >>> out = conv({"observation": [1, 0, 1], "action_mask": [0, 1]})
    >>> out[OBS_KEY].tolist(), out[MASK_KEY].tolist()
    ([1.0, 0.0, 1.0], [0, 1])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from scenarios.base import ScenarioError

__all__ = [
    "MASK_KEY",
    "MAX_IMAGE_PIXELS",
    "MAX_ONE_HOT",
    "OBS_KEY",
    "ActionConverter",
    "ObservationConverter",
    "UnsupportedSpace",
    "action_count",
    "convert_action_space",
    "convert_observation_space",
    "flat_space",
    "flattener",
    "has_action_mask",
    "image_pool",
    "is_image",
]

#: the key of the (flattened) observation in a masked observation
OBS_KEY = "observations"
#: the key of the action mask (PettingZoo's own name for it, in observations and infos)
MASK_KEY = "action_mask"
#: the most values one ``Discrete`` (or one ``MultiDiscrete`` component) may one-hot into
MAX_ONE_HOT = 65_536
#: images with more pixels (``H·W``) are average-pooled until they have at most this many
MAX_IMAGE_PIXELS = 84 * 84

Flatten = Callable[[Any], np.ndarray]


class UnsupportedSpace(ScenarioError):
    """A space the trainer cannot train on (the message names the agent, the space and a fix)."""


def has_action_mask(space: gym.Space) -> bool:
    """Whether ``space`` is a masked observation space (:data:`OBS_KEY` and :data:`MASK_KEY`).

    >>> has_action_mask(gym.spaces.Box(0, 1, (2,)))
    False
    """
    return isinstance(space, gym.spaces.Dict) and set(space.spaces) == {OBS_KEY, MASK_KEY}


def _short(space: gym.Space) -> str:
    """``space`` as text, without a ``Text`` space's long charset."""
    if isinstance(space, gym.spaces.Text):
        return f"Text(max_length={space.max_length})"
    if isinstance(space, gym.spaces.Dict):
        return "Dict(" + ", ".join(f"{k!r}: {_short(v)}" for k, v in space.spaces.items()) + ")"
    if isinstance(space, gym.spaces.Tuple):
        return "Tuple(" + ", ".join(_short(v) for v in space.spaces) + ")"
    return str(space)


def _refuse(agent: str, what: str, space: gym.Space, why: str, fix: str) -> UnsupportedSpace:
    return UnsupportedSpace(
        f"agent {agent!r}: {what} {_short(space)} cannot be trained: {why}; {fix}"
    )


_FLAT_FIX = (
    "wrap the env so that this agent observes a Box, Discrete, MultiDiscrete, MultiBinary, "
    "Dict or Tuple space (e.g. encode it as a fixed-size Box)"
)


def _one_hot_size(agent: str, what: str, top: gym.Space, n: int) -> int:
    if n > MAX_ONE_HOT:
        raise _refuse(
            agent,
            what,
            top,
            f"a one-hot of {n} values (over MAX_ONE_HOT={MAX_ONE_HOT}) cannot be learned from",
            "wrap the env so that this value is observed as a Box (e.g. Box(0, n - 1, (1,)) "
            "or a few scaled features)",
        )
    return n


def is_image(space: gym.Space) -> bool:
    """Whether ``space`` is an image (module doc): a ``uint8`` ``Box`` of 0–255 shaped
    ``H×W`` or ``H×W×C`` (``C`` in 1, 3, 4), both sides at least 8.

    >>> image = gym.spaces.Box(0, 255, (64, 48, 3), np.uint8)
    >>> is_image(image), is_image(gym.spaces.Box(0, 1, (8, 8)))
    (True, False)
    """
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8:
        return False
    shape = space.shape
    if not (len(shape) == 2 or (len(shape) == 3 and shape[2] in (1, 3, 4))):
        return False
    return min(shape[:2]) >= 8 and bool((space.low == 0).all() and (space.high == 255).all())


def image_pool(space: gym.spaces.Box) -> int:
    """The side ``k`` of the blocks an image of ``space`` is average-pooled over (1: none)."""
    h, w = space.shape[:2]
    k = 1
    while (h // k) * (w // k) > MAX_IMAGE_PIXELS:
        k += 1
    return k


def _image_shape(space: gym.spaces.Box) -> tuple[int, ...]:
    k = image_pool(space)
    h, w = space.shape[:2]
    return (h // k, w // k, *space.shape[2:])


def flat_space(agent: str, space: gym.Space, what: str = "observation space") -> gym.spaces.Box:
    """The flat ``float32`` ``Box`` of ``space`` (module doc); :class:`UnsupportedSpace` when
    it has none, naming ``agent`` and ``what`` the space is (``"observation space"``).

    >>> flat_space("a", gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2, 2)))))
    Box([ 0.  0.  0. -1. -1. -1. -1.], 1.0, (7,), float32)
    """
    low, high = _bounds(agent, what, space, space)
    return gym.spaces.Box(low, high, low.shape, np.float32)


def _bounds(
    agent: str, what: str, space: gym.Space, top: gym.Space
) -> tuple[np.ndarray, np.ndarray]:
    """Flat ``float32`` (low, high) of ``space`` (a part of the agent's space ``top``)."""
    if is_image(space):
        n = int(np.prod(_image_shape(space)))
        return np.zeros(n, np.float32), np.ones(n, np.float32)
    if isinstance(space, gym.spaces.Box):
        if not np.issubdtype(space.dtype, np.number) and space.dtype != np.bool_:
            raise _refuse(
                agent, what, top, f"a Box of dtype {space.dtype} is not numeric", _FLAT_FIX
            )
        return (
            np.asarray(space.low, np.float32).reshape(-1),
            np.asarray(space.high, np.float32).reshape(-1),
        )
    if isinstance(space, gym.spaces.Discrete):
        n = _one_hot_size(agent, what, top, int(space.n))
        return np.zeros(n, np.float32), np.ones(n, np.float32)
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec).reshape(-1)
        n = sum(_one_hot_size(agent, what, top, int(k)) for k in nvec)
        return np.zeros(n, np.float32), np.ones(n, np.float32)
    if isinstance(space, gym.spaces.MultiBinary):
        n = int(np.prod(space.shape))
        return np.zeros(n, np.float32), np.ones(n, np.float32)
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        parts = space.spaces.values() if isinstance(space, gym.spaces.Dict) else space.spaces
        bounds = [_bounds(agent, what, p, top) for p in parts]
        if not bounds:
            raise _refuse(agent, what, top, "it is empty", "give this agent something to observe")
        return np.concatenate([b[0] for b in bounds]), np.concatenate([b[1] for b in bounds])
    why = f"{type(space).__name__} has no fixed-size flat form, so no network can read it"
    raise _refuse(agent, what, top, why, _FLAT_FIX)


def flattener(agent: str, space: gym.Space, what: str = "observation space") -> Flatten:
    """A function from an element of ``space`` to its flat ``float32`` vector (the layout of
    :func:`flat_space`); :class:`UnsupportedSpace` as there.

    >>> flattener("a", gym.spaces.MultiDiscrete([2, 3]))([1, 0]).tolist()
    [0.0, 1.0, 1.0, 0.0, 0.0]
    """
    flat_space(agent, space, what)  # refuses what cannot be flattened, naming the agent
    return _flattener(space)


def _flattener(space: gym.Space) -> Flatten:
    if is_image(space):
        k = image_pool(space)
        h, w, *c = _image_shape(space)

        def pixels(x: Any) -> np.ndarray:
            img = np.asarray(x, np.float32)
            if k > 1:
                img = img[: h * k, : w * k].reshape(h, k, w, k, *c).mean(axis=(1, 3))
            return (img * np.float32(1 / 255)).reshape(-1)

        return pixels
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)):
        return lambda x: np.asarray(x, np.float32).reshape(-1)
    if isinstance(space, gym.spaces.Discrete):
        n, start = int(space.n), int(space.start)

        def one_hot(x: Any) -> np.ndarray:
            out = np.zeros(n, np.float32)
            out[int(np.asarray(x).reshape(())) - start] = 1.0
            return out

        return one_hot
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec).reshape(-1)
        start = np.asarray(space.start).reshape(-1)
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        total = int(nvec.sum())

        def one_hots(x: Any) -> np.ndarray:
            out = np.zeros(total, np.float32)
            out[offsets + np.asarray(x, np.int64).reshape(-1) - start] = 1.0
            return out

        return one_hots
    if isinstance(space, gym.spaces.Dict):
        parts = [(k, _flattener(v)) for k, v in space.spaces.items()]
        return lambda x: np.concatenate([f(x[k]) for k, f in parts])
    if isinstance(space, gym.spaces.Tuple):
        fs = [_flattener(v) for v in space.spaces]
        return lambda x: np.concatenate([f(v) for f, v in zip(fs, x, strict=True)])
    raise AssertionError(f"flat_space accepted {space}")  # pragma: no cover


def action_count(agent: str, space: gym.Space) -> int:
    """How many entries an action mask of ``space`` has: ``n`` for ``Discrete(n)``, the sum of
    ``nvec`` for ``MultiDiscrete`` (one mask per component, concatenated); refused for other
    action spaces (a mask has no meaning there)."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.asarray(space.nvec).sum())
    raise _refuse(
        agent,
        "action space",
        space,
        f"its observations or infos carry an {MASK_KEY!r}, which needs Discrete or "
        "MultiDiscrete actions",
        "drop the mask in a wrapper or give the agent discrete actions",
    )


@dataclasses.dataclass(frozen=True)
class ObservationConverter:
    """One agent's raw observations → the converted space's (call it with ``(obs, info)``).

    Attributes:
        space: the converted space: a flat ``float32`` ``Box``, or the masked ``Dict`` of the
            module doc (:func:`has_action_mask`).
        raw: the env's own observation space.
        masked: observations carry an action mask.
        mask_in_obs: the mask is the raw observation's :data:`MASK_KEY` (else the info's).
    """

    space: gym.Space
    raw: gym.Space
    masked: bool
    mask_in_obs: bool
    _flatten: Flatten
    _mask_size: int

    def __call__(self, obs: Any, info: Mapping[str, Any] | None = None) -> Any:
        if not self.masked:
            return self._flatten(obs)
        if self.mask_in_obs:
            mask: Any = obs[MASK_KEY]
            flat = self._flatten({k: v for k, v in obs.items() if k != MASK_KEY})
        else:
            mask = (info or {}).get(MASK_KEY)
            flat = self._flatten(obs)
        if mask is None:  # an info without a mask this step: every action allowed
            mask_arr = np.ones(self._mask_size, np.int8)
        else:
            mask_arr = (np.asarray(mask).reshape(-1) != 0).astype(np.int8)
            if mask_arr.shape != (self._mask_size,):
                raise ValueError(
                    f"{MASK_KEY} of shape {np.shape(mask)} where the action space has "
                    f"{self._mask_size} actions: the env's mask does not match its action space"
                )
        return {OBS_KEY: flat, MASK_KEY: mask_arr}


def convert_observation_space(
    agent: str, space: gym.Space, action_space: gym.Space, *, info_mask: bool = False
) -> ObservationConverter:
    """The converted observation space of ``agent`` and the function to its elements.

    Args:
        agent: the agent (named in errors).
        space: its raw observation space.
        action_space: its raw action space (sizes the mask).
        info_mask: its reset/step ``info`` carries :data:`MASK_KEY` (found by probing the env).

    Raises:
        UnsupportedSpace: a space without a flat form (module doc), or a mask whose size does not
            match the action space.
    """
    in_obs = isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces
    if not (in_obs or info_mask):
        return ObservationConverter(
            flat_space(agent, space), space, False, False, flattener(agent, space), 0
        )
    n = action_count(agent, action_space)
    rest: gym.Space = space
    if in_obs:
        mask_space = space.spaces[MASK_KEY]
        size = int(np.prod(getattr(mask_space, "shape", None) or (-1,)))
        if size != n:
            raise _refuse(
                agent,
                "observation space",
                space,
                f"its {MASK_KEY!r} has {size} entries for {n} actions ({action_space})",
                "the mask must have one entry per action: fix the env's spaces",
            )
        rest = gym.spaces.Dict({k: v for k, v in space.spaces.items() if k != MASK_KEY})
    flat = flat_space(agent, rest)
    converted = gym.spaces.Dict({OBS_KEY: flat, MASK_KEY: gym.spaces.Box(0, 1, (n,), np.int8)})
    return ObservationConverter(converted, space, True, in_obs, flattener(agent, rest), n)


@dataclasses.dataclass(frozen=True)
class ActionConverter:
    """One agent's actions as the trainer samples them → the env's (call it with an action).

    Attributes:
        space: the action space the trainer samples from.
        raw: the env's own action space.
    """

    space: gym.Space
    raw: gym.Space
    _to_env: Callable[[Any], Any] | None

    def __call__(self, action: Any) -> Any:
        return action if self._to_env is None else self._to_env(action)


def convert_action_space(agent: str, space: gym.Space) -> ActionConverter:
    """The action space the trainer samples for ``agent`` and the map back to the env's.

    Raises:
        UnsupportedSpace: an action space other than ``Discrete``, ``MultiDiscrete``,
            ``MultiBinary`` and a numeric ``Box``.
    """
    if isinstance(space, gym.spaces.Discrete):
        start = int(space.start)
        if start == 0:
            return ActionConverter(space, space, None)
        return ActionConverter(gym.spaces.Discrete(int(space.n)), space, lambda a: int(a) + start)
    if isinstance(space, gym.spaces.MultiDiscrete):
        start = np.asarray(space.start)
        if not start.any():
            return ActionConverter(space, space, None)
        dtype = space.dtype

        def shift(a: Any) -> np.ndarray:
            return (np.asarray(a).reshape(start.shape) + start).astype(dtype)

        return ActionConverter(gym.spaces.MultiDiscrete(space.nvec), space, shift)
    if isinstance(space, gym.spaces.MultiBinary):
        shape, dtype = space.shape, space.dtype
        sampled = gym.spaces.MultiDiscrete(np.full(int(np.prod(shape)), 2))

        def bits(a: Any) -> np.ndarray:
            return np.asarray(a).reshape(shape).astype(dtype)

        return ActionConverter(sampled, space, bits)
    if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return ActionConverter(space, space, None)
    raise _refuse(
        agent,
        "action space",
        space,
        "only Discrete, MultiDiscrete, MultiBinary and float Box actions can be sampled",
        "give the agent one of those (wrap the env to map them to its own actions)",
    )
