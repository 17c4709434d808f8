"""Every assumption :mod:`trainers.rllib_compat` makes about RLlib's (and Ray's) internals,
one test each, on real RLlib objects (a real ``MultiAgentEnvRunner``, episodes, learner,
minibatch iterator, distributions); and the check that no private RLlib/Ray name is used
outside the compat package (``ast``: file and line of each).

An RLlib upgrade that moves an internal fails here, naming it; fix the compat function (and
only it), then the pin.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray
import tomllib
import torch
from ray.rllib.core.distribution.torch.torch_distribution import (
    TorchCategorical,
    TorchDiagGaussian,
    TorchMultiCategorical,
)
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator

from trainers.rllib_compat import RAY_VERSION, distributions, episodes, learner, ray_private, runner

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("topologies", "scenarios", "marl_agents", "trainers")
COMPAT = ROOT / "trainers" / "rllib_compat"
OVERRIDDEN = (*runner.OVERRIDDEN, *learner.OVERRIDDEN, *learner.MODULE_HOOKS)
INHERITED = (*runner.INHERITED, *learner.INHERITED)
LISTED = (*INHERITED, *OVERRIDDEN)
#: RLlib's signatures of the private methods we override or call (parameter names, in order)
SIGNATURES = {
    "_sample": [
        "self",
        "num_timesteps",
        "num_episodes",
        "explore",
        "random_actions",
        "force_reset",
    ],
    "_new_episode": ["self", "env_index", "episodes"],
    "_log_episode_metrics": ["self", "length", "ret", "sec", "agents", "modules", "agent_steps"],
    "_make_on_episode_callback": ["self", "which", "idx", "episodes"],
    "_prune_zero_len_sa_episodes": ["episode"],
    "_set_optimizer_state": ["self", "state"],
    "_make_batch_if_necessary": ["self", "training_data"],
    "_uncompiled_update": ["self", "batch", "kwargs"],
    "_create_iterator_if_necessary": [
        "self",
        "training_data",
        "num_total_minibatches",
        "num_epochs",
        "minibatch_size",
        "shuffle_batch_per_epoch",
        "kwargs",
    ],
    "_compute_off_policyness": ["self", "batch"],
    "_check_component": ["self", "name", "components", "not_components"],
    "_value_error": ["self", "errmsg"],
    "_forward": ["self", "batch", "kwargs"],
    "_forward_train": ["self", "batch", "kwargs"],
    "_forward_exploration": ["self", "batch", "kwargs"],
    "_forward_inference": ["self", "batch", "kwargs"],
}


def parameters(fn: Any) -> list[str]:
    """``fn``'s parameter names, without the ``_ray_trace_ctx`` that Ray adds to the methods of
    a class once an actor of it exists in the process (tracing hooks)."""
    return [p for p in inspect.signature(fn).parameters if p != "_ray_trace_ctx"]


@pytest.fixture(scope="module")
def env_runner() -> Any:
    """RLlib's own ``MultiAgentEnvRunner`` (not ours) on a 2-agent team, 2 sub-envs."""
    from trainers.algo import to_algorithm_config
    from trainers.configs.experiment import ExperimentConfig

    cfg = ExperimentConfig.from_dict(
        {"topology": "star:2", "resources": {"num_envs_per_env_runner": 2}}
    )
    r = MultiAgentEnvRunner(config=to_algorithm_config(cfg))
    yield r
    r.stop()


@pytest.fixture(scope="module")
def built_learner(env_runner: Any) -> Any:
    """The project's PPO learner (RLlib's ``TorchLearner`` underneath), built locally."""
    learner_ = env_runner.config.build_learner(env=None, spaces=env_runner.get_spaces())
    learner_.build()
    return learner_


def slots(obj: Any) -> set[str]:
    """The slot fields an instance has set."""
    names = {s for c in type(obj).__mro__ for s in getattr(c, "__slots__", ())}
    return {n for n in names if hasattr(obj, n)}


# ----- the release ------------------------------------------------------------------------
def test_installed_ray_is_the_pinned_release() -> None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d.split("]", 1)[1] for d in deps if d.startswith("ray[")]
    assert Version(ray.__version__) in SpecifierSet(spec), (ray.__version__, spec)
    assert Version(RAY_VERSION) in SpecifierSet(spec)
    assert ray.__version__.startswith(RAY_VERSION + ".")


# ----- private methods: overridden and inherited ------------------------------------------
@pytest.mark.parametrize(("cls", "name"), OVERRIDDEN, ids=lambda x: getattr(x, "__name__", x))
def test_an_overridden_private_method_exists_with_its_signature(cls: type, name: str) -> None:
    method = inspect.getattr_static(cls, name)
    fn = method.__func__ if isinstance(method, staticmethod | classmethod) else method
    assert callable(fn), (cls, name)
    assert parameters(fn) == SIGNATURES[name]


@pytest.mark.parametrize(("cls", "name"), INHERITED, ids=lambda x: getattr(x, "__name__", x))
def test_an_inherited_private_member_exists(
    cls: type, name: str, env_runner: Any, built_learner: Any
) -> None:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.connectors.learner.general_advantage_estimation import (
        GeneralAdvantageEstimation,
    )

    if name in vars(cls) or any(name in vars(c) for c in cls.__mro__):  # a method
        fn = inspect.getattr_static(cls, name)
        fn = fn.__func__ if isinstance(fn, staticmethod) else fn
        assert parameters(fn) == SIGNATURES[name]
        return
    if cls is GeneralAdvantageEstimation:
        instance = GeneralAdvantageEstimation(gamma=0.99, lambda_=0.95)
    else:
        instance = {MultiAgentEnvRunner: env_runner, AlgorithmConfig: env_runner.config}.get(
            cls, built_learner
        )
    assert isinstance(instance, cls)
    assert name in vars(instance), f"{cls.__name__} instances have no {name} any more"


def test_runner_state_types(env_runner: Any) -> None:
    """What ``BatchedEnvRunner`` and exact resume assume about the runner's state."""
    r = env_runner
    assert set(runner.SAMPLING_STATE) <= set(vars(r))
    assert isinstance(r._ongoing_episodes, list) and len(r._ongoing_episodes) == r.num_envs
    assert isinstance(r._ongoing_episodes_for_metrics, defaultdict)
    assert r._ongoing_episodes_for_metrics.default_factory is list
    assert isinstance(r._done_episodes_for_metrics, list)
    assert isinstance(r._needs_initial_reset, bool)
    assert isinstance(r._weights_seq_no, int)
    assert isinstance(r._callbacks, list)


def test_value_error_raises() -> None:
    from ray.rllib.algorithms.ppo import PPOConfig

    with pytest.raises(ValueError, match="bad"):
        PPOConfig()._value_error("bad")


# ----- runner -----------------------------------------------------------------------------
def test_ongoing_episodes_one_per_sub_env_across_samples(env_runner: Any) -> None:
    env_runner.sample(num_timesteps=6, explore=True)
    ongoing = runner.ongoing_episodes(env_runner)
    assert len(ongoing) == env_runner.num_envs
    assert all(type(e) is MultiAgentEpisode and not e.is_done for e in ongoing)
    assert runner.ongoing_episodes(object()) == []


def test_metrics_lock_is_the_reentrant_lock_log_dict_holds() -> None:
    metrics = MetricsLogger()
    assert "with self._threading_lock" in inspect.getsource(MetricsLogger.log_dict)
    with runner.metrics_lock(metrics):
        metrics.log_dict({"a": 1.0})  # re-entrant: log_dict takes it again
    metrics._threading_lock = threading.RLock()  # as RLlib's IMPALA learner makes it
    with runner.metrics_lock(metrics):
        metrics.log_value("b", 2.0)
    assert metrics.peek("a") == 1.0 and metrics.peek("b") == 2.0


def test_env_steps_counter_is_incremented(env_runner: Any) -> None:
    from ray.util.metrics import Counter

    counter = env_runner._metrics_num_env_steps_sampled
    assert isinstance(counter, Counter)
    seen: list[int] = []

    class Recording:  # the counter as _log_env_steps sees it
        info = counter.info

        def inc(self, value: int) -> None:
            seen.append(value)

    env_runner._metrics_num_env_steps_sampled = Recording()
    try:
        runner.log_env_steps_sampled(env_runner, 5)
    finally:
        env_runner._metrics_num_env_steps_sampled = counter
    assert seen == [5]


def test_new_episode_builds_a_slotted_multi_agent_episode(env_runner: Any) -> None:
    class Sorted(MultiAgentEpisode):
        __slots__ = ()

    eps: list[Any] = [None]
    env_runner._new_episode(0, eps)
    assert type(eps[0]) is MultiAgentEpisode and not hasattr(eps[0], "__dict__")
    swapped = runner.set_episode_class(eps[0], Sorted)
    assert swapped is eps[0] and type(eps[0]) is Sorted
    assert type(eps[0].cut()) in (Sorted, MultiAgentEpisode)

    class WithFields(MultiAgentEpisode):
        __slots__ = ("extra",)

    with pytest.raises(TypeError, match="add no fields"):
        runner.set_episode_class(MultiAgentEpisode(), WithFields)


def test_autoreset_envs_are_a_flag_per_sub_env(env_runner: Any) -> None:
    vec = env_runner.env
    flags = runner.autoreset_envs(vec)
    assert isinstance(flags, np.ndarray) and flags.dtype == np.bool_
    assert flags.shape == (env_runner.num_envs,)
    runner.set_autoreset_envs(vec, np.array([True, False]))
    assert runner.autoreset_envs(vec).tolist() == [True, False]
    runner.set_autoreset_envs(vec, flags)
    assert runner.autoreset_envs(object()) == []


def test_time_total_is_the_trainables_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray.tune.trainable.trainable as trainable_module
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.tune.trainable import Trainable

    monkeypatch.setattr(trainable_module, "DEFAULT_STORAGE_PATH", str(tmp_path))  # its logdir

    assert issubclass(Algorithm, Trainable)

    class Clock(Trainable):
        def step(self) -> dict[str, Any]:
            return {}

    t = Clock()
    assert runner.time_total(t) == 0.0
    runner.set_time_total(t, 100.0)
    result = t.train()
    assert result["time_total_s"] == runner.time_total(t) >= 100.0
    assert runner.time_total(object()) == 0.0
    t.stop()


# ----- episodes ---------------------------------------------------------------------------
SPACES = (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Discrete(4))


def test_rewards_space_is_the_agent_episodes_rewards_space() -> None:
    sa = SingleAgentEpisode(observation_space=SPACES[0], action_space=SPACES[1])
    assert sa.rewards.space is episodes.REWARDS_SPACE
    space = episodes.REWARDS_SPACE
    assert (space.shape, space.dtype, space.low, space.high) == ((), np.float32, -np.inf, np.inf)


def test_new_buffer_has_the_constructors_fields() -> None:
    theirs = InfiniteLookbackBuffer(data=[], lookback=0, space=SPACES[0])
    ours = episodes.new_buffer(SPACES[0])
    assert vars(ours).keys() == vars(theirs).keys()
    assert ours.space is theirs.space and ours.data == theirs.data == []
    assert (ours.lookback, ours.finalized) == (theirs.lookback, theirs.finalized)
    assert ours.space_struct == theirs.space_struct


def test_blank_agent_episode_has_the_constructors_fields() -> None:
    theirs = SingleAgentEpisode(
        agent_id="a",
        module_id="m",
        multi_agent_episode_id="e",
        observation_space=SPACES[0],
        action_space=SPACES[1],
    )
    ours = episodes.blank_agent_episode("a", "m", "e", SPACES[0], SPACES[1])
    assert slots(ours) == slots(theirs)
    for name in slots(theirs) - {"id_"}:
        a, b = getattr(ours, name), getattr(theirs, name)
        if isinstance(b, InfiniteLookbackBuffer):
            assert vars(a).keys() == vars(b).keys() and a.data == b.data and a.space is b.space
        else:
            assert a == b, name


def test_last_added_and_time_stamps_follow_rllibs_steps() -> None:
    sa = SingleAgentEpisode(observation_space=SPACES[0], action_space=SPACES[1])
    obs = np.zeros(3, np.float32)
    sa.add_env_reset(observation=obs, infos={"i": 0})
    assert episodes.last_added(sa)[0] is obs and episodes.last_added(sa)[1] == {"i": 0}
    assert sa._start_time is not None and sa._last_step_time is None
    sa.add_env_step(observation=obs + 1, action=1, reward=0.5, infos={"i": 1})
    assert episodes.last_added(sa)[1] == {"i": 1} and sa._last_step_time >= sa._start_time
    episodes.set_last_added(sa, obs, {"x": 1})
    assert episodes.last_added(sa) == (obs, {"x": 1})
    blank = episodes.blank_agent_episode("a", "m", "e", *SPACES)
    episodes.stamp_step(blank)
    assert blank._start_time == blank._last_step_time is not None
    ma = MultiAgentEpisode()
    episodes.stamp_start(ma)
    assert ma._start_time is not None


def test_hanging_caches_hold_an_action_until_the_next_observation() -> None:
    obs = np.zeros(3, np.float32)
    ma = MultiAgentEpisode(
        observation_space={"a": SPACES[0], "b": SPACES[0]},
        action_space={"a": SPACES[1], "b": SPACES[1]},
    )
    ma.add_env_reset(observations={"a": obs})
    actions_end, rewards_end, extras_end = episodes.hanging_end(ma)
    begin = episodes.hanging_rewards_begin(ma)
    for cache in (rewards_end, begin):
        assert isinstance(cache, defaultdict) and cache.default_factory is float
    # a acted but gets no observation (RLlib's case 3); b, not yet observing, gets a reward
    ma.add_env_step(observations={}, actions={"a": 2}, rewards={"a": 1.0, "b": 0.5})
    assert actions_end == {"a": 2} and rewards_end["a"] == 1.0 and extras_end["a"] is None
    assert begin["b"] == 0.5
    assert episodes.hanging_end(ma)[0] is actions_end  # the live dicts, not copies
    episodes.del_hanging(ma, "a")
    assert "a" not in actions_end and "a" not in rewards_end and "a" not in extras_end


def test_lookback_len_is_the_constructors() -> None:
    ma = MultiAgentEpisode(len_lookback_buffer=3)
    assert episodes.lookback_len(ma) == 3
    assert episodes.lookback_len(MultiAgentEpisode()) == 0


# ----- learner, iterator, modules ---------------------------------------------------------
def test_rl_modules_is_the_multi_modules_live_dict(env_runner: Any) -> None:
    multi = env_runner.module
    mods = learner.rl_modules(multi)
    assert isinstance(mods, dict) and set(mods) == set(multi.keys())
    assert all(mods[m] is multi[m] for m in mods)
    assert learner.default_multi_forward_train(multi)

    class Custom(type(multi)):
        def _forward_train(self, batch: Any, **kwargs: Any) -> Any:
            return {}

    assert not learner.default_multi_forward_train(Custom.__new__(Custom))


def test_module_hooks_are_what_the_public_forwards_call(env_runner: Any) -> None:
    from ray.rllib.core.rl_module.rl_module import RLModule
    from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

    for name in ("forward_exploration", "forward_inference", "forward_train"):
        owner = TorchRLModule if name != "forward_train" else RLModule
        assert f"self._{name}(" in inspect.getsource(getattr(owner, name)), name
    module = env_runner.module["orchestrator"]
    hook = learner.module_hook(module, "forward_exploration")
    assert hook.__func__ is type(module)._forward_exploration
    assert learner.module_hook(type(module), "forward") is type(module)._forward


def test_fresh_cyclic_iterator_fields() -> None:
    batch = MultiAgentBatch({"m": SampleBatch({"x": torch.arange(10)})}, env_steps=10)
    it = MiniBatchCyclicIterator(
        batch, minibatch_size=4, num_epochs=2, shuffle_batch_per_epoch=True
    )
    fields = learner.fresh_cyclic_iterator(it)
    assert fields == learner.MinibatchFields(batch, 4, 2, True, 0)
    minibatches = iter(it)
    next(minibatches)
    assert learner.fresh_cyclic_iterator(it) == fields  # counted when the next is asked for
    next(minibatches)
    assert learner.fresh_cyclic_iterator(it) is None
    sub = type("Sub", (MiniBatchCyclicIterator,), {})(batch, minibatch_size=4)
    assert learner.fresh_cyclic_iterator(sub) is None


def test_slices_sequences_follows_enable_slicing_by_batch_id() -> None:
    batch = SampleBatch({"x": np.arange(4), "seq_lens": np.array([2, 2])})
    assert learner.slices_sequences(batch) is False
    batch.enable_slicing_by_batch_id()
    assert learner.slices_sequences(batch) is True


def test_learner_registries(built_learner: Any) -> None:
    lrn = built_learner
    assert set(lrn._named_optimizers) == {
        n for names in lrn._module_optimizers.values() for n in names
    }
    assert all(isinstance(o, torch.optim.Optimizer) for o in lrn._named_optimizers.values())
    assert set(lrn._module_optimizers) == set(lrn.module.keys())
    params = {id(p) for p in lrn._params.values()}
    assert params == {id(p) for m in lrn.module.values() for p in m.parameters()}
    assert lrn._module is lrn.module
    assert lrn._grad_scalers is None and lrn._lr_scheduler_classes is None


# ----- distributions ----------------------------------------------------------------------
def test_categorical_parts_are_the_multi_categoricals_parts() -> None:
    logits = torch.randn(5, 5)
    dist = TorchMultiCategorical.from_logits(logits, input_lens=[2, 3])
    parts = distributions.categorical_parts(dist)
    assert [type(p) for p in parts] == [TorchCategorical, TorchCategorical]
    assert [p.logits.shape[-1] for p in parts] == [2, 3]


def test_torch_dist_is_the_wrapped_torch_distribution() -> None:
    cat = TorchCategorical.from_logits(torch.randn(5, 3))
    assert isinstance(distributions.torch_dist(cat), torch.distributions.Categorical)
    gauss = TorchDiagGaussian.from_logits(torch.randn(5, 4))
    normal = distributions.torch_dist(gauss)
    assert isinstance(normal, torch.distributions.Normal) and normal.loc.shape == (5, 2)


# ----- Ray's private modules --------------------------------------------------------------
def test_gcs_probe_reports_an_unreachable_address() -> None:
    from ray._raylet import InnerGcsClient

    assert callable(InnerGcsClient.standalone)
    cmd = [sys.executable, "-c", ray_private.GCS_PROBE, "127.0.0.1:9", "500"]
    env = {**os.environ, "RAY_gcs_rpc_server_connect_timeout_s": "1"}  # as cluster.gcs_error
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 1 and len(out.stdout.strip().splitlines()) == 1, out


def test_driver_sys_path_is_unknown_without_a_connected_driver() -> None:
    import ray._private.worker

    assert hasattr(ray._private.worker, "global_worker")
    if not ray.is_initialized():
        assert ray_private.driver_sys_path() is None


def test_trial_working_directory_is_none_outside_a_trial() -> None:
    from ray.train._internal.session import get_session

    assert get_session() is None
    assert ray_private.trial_working_directory() is None


# ----- nothing private outside the compat package -----------------------------------------
def rllib_private_names() -> set[str]:
    """Private names RLlib (and Tune's ``Trainable``, which ``Algorithm`` is) defines or sets
    (``def _x``, ``self._x``, ``cls._x``) in its source."""
    pattern = re.compile(r"(?:self\.|cls\.|def )(_[a-z]\w*)")
    ray_dir = Path(ray.__file__).parent
    paths = [*(ray_dir / "rllib").rglob("*.py"), ray_dir / "tune" / "trainable" / "trainable.py"]
    names: set[str] = set()
    for path in paths:
        if "tests" not in path.parts and "examples" not in path.parts:
            names |= set(pattern.findall(path.read_text(errors="ignore")))
    return names


#: our own private names that RLlib happens to use too, read on our own objects
#: (path, name): ``GraphEnv``'s twin/seed/stream, ``RLlibGraphEnv``'s seed
OWN_PRIVATE = {
    ("scenarios/graph_env.py", "_reset"),
    ("scenarios/graph_env.py", "_step"),
    ("trainers/run/resume.py", "_seed"),
    ("trainers/run/resume.py", "_np_random"),
}
PRIVATE_MODULE = re.compile(r"(^|\.)_[a-z]")
PRIVATE_RAY_CODE = re.compile(r"\bray\.(\w+\.)*_[a-z]")


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def private_uses(root: Path, known: set[str], own: set[tuple[str, str]]) -> list[str]:
    """``path:line: what`` for every private RLlib/Ray name used outside the compat package:
    a ``_x`` attribute RLlib defines, read on something other than ``self``/``cls``/
    ``super()``; an import from a private Ray module (``ray._raylet``, ``ray._private``,
    ``ray.train._internal``) or of a private name from Ray; ``ray._…`` attribute chains and
    code strings naming them."""
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if path.is_relative_to(root / "trainers" / "rllib_compat"):
                continue
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(), rel)
            skip = {  # docstrings, and the parts of a reported ``ray._…`` chain
                id(n.value)
                for n in ast.walk(tree)
                if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
            }
            for node in ast.walk(tree):
                if id(node) in skip:
                    if isinstance(node, ast.Attribute):
                        skip.add(id(node.value))
                    continue
                what = _private_use(node, known, {n for p, n in own if p == rel}, skip)
                if what and what.startswith("__class__") and not _imports_ray(tree):
                    continue  # swapping the class of our own objects
                if what:
                    out.append(f"{rel}:{node.lineno}: {what}")
    return out


def _imports_ray(tree: ast.Module) -> bool:
    return any(
        isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "ray"
        for n in ast.walk(tree)
    )


def _private_use(node: ast.AST, known: set[str], own: set[str], skip: set[int]) -> str | None:
    """What is private about ``node`` (None: nothing); see :func:`private_uses`."""
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ray"):
        private = [a.name for a in node.names if a.name.startswith("_")]
        if PRIVATE_MODULE.search(node.module or "") or private:
            return f"from {node.module} import {', '.join(private) or '...'}"
    elif isinstance(node, ast.Import):
        names = [a.name for a in node.names if a.name.startswith("ray")]
        private = [n for n in names if PRIVATE_MODULE.search(n)]
        if private:
            return f"import {', '.join(private)}"
    elif isinstance(node, ast.Attribute):
        dotted = _dotted(node)
        if dotted.startswith("ray.") and PRIVATE_MODULE.search(dotted):
            skip.add(id(node.value))
            return dotted
        value = node.value
        mine = isinstance(value, ast.Name) and value.id in ("self", "cls")
        mine = mine or (isinstance(value, ast.Call) and _dotted(value.func) == "super")
        if node.attr in known - own and not node.attr.startswith("__") and not mine:
            return f".{node.attr} (RLlib private)"
    elif isinstance(node, ast.Call) and _dotted(node.func) in ("getattr", "hasattr", "setattr"):
        name = node.args[1] if len(node.args) > 1 else None
        if isinstance(name, ast.Constant) and name.value in known - own:
            return f"{_dotted(node.func)}(..., {name.value!r}) (RLlib private)"
    elif isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Attribute) and t.attr == "__class__" for t in node.targets
    ):
        return "__class__ assignment (trainers.rllib_compat.runner.set_episode_class)"
    elif isinstance(node, ast.Constant) and re.search(PRIVATE_RAY_CODE, str(node.value)):
        return "code string naming a private Ray module"
    return None


def test_no_private_rllib_or_ray_name_outside_the_compat_package() -> None:
    found = private_uses(ROOT, rllib_private_names(), OWN_PRIVATE)
    assert found == [], "use trainers.rllib_compat instead:\n" + "\n".join(found)


def test_a_private_use_is_named(tmp_path: Path) -> None:
    (tmp_path / "trainers").mkdir()
    (tmp_path / "trainers" / "bad.py").write_text(
        "from ray._raylet import GcsClient\n"
        "import ray._private.worker\n"
        "def f(runner, self, episode):\n"
        "    episode.__class__ = type(self)\n"
        "    getattr(runner, '_ongoing_episodes', None)\n"
        "    self._ongoing_episodes = []  # through self: a subclass (listed in INHERITED)\n"
        "    n = ray._private.worker.global_worker\n"
        "    return runner._ongoing_episodes\n"
    )
    assert private_uses(tmp_path, {"_ongoing_episodes"}, set()) == [
        "trainers/bad.py:1: from ray._raylet import ...",
        "trainers/bad.py:2: import ray._private.worker",
        "trainers/bad.py:4: __class__ assignment (trainers.rllib_compat.runner.set_episode_class)",
        "trainers/bad.py:5: getattr(..., '_ongoing_episodes') (RLlib private)",
        "trainers/bad.py:7: ray._private.worker.global_worker",
        "trainers/bad.py:8: ._ongoing_episodes (RLlib private)",
    ]


def our_rllib_subclasses() -> list[type]:
    """Every class of the four packages that derives from an RLlib class."""
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "ray" not in path.read_text():
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            module = importlib.import_module(name)
            for cls in vars(module).values():
                ours = inspect.isclass(cls) and cls.__module__ == name
                if ours and any(c.__module__.startswith("ray.") for c in cls.__mro__):
                    out.append(cls)
    return out


def test_every_private_rllib_method_we_override_is_listed() -> None:
    """A subclass overriding a private RLlib method lists it in an ``OVERRIDDEN`` (or
    ``MODULE_HOOKS``), so its pin above exists."""
    unlisted = []
    for cls in our_rllib_subclasses():
        rllib = [c for c in cls.__mro__ if c.__module__.startswith("ray.")]
        for name in vars(cls):
            if not name.startswith("_") or name.startswith("__") or name == "_abc_impl":
                continue
            owners = [c for c in rllib if name in vars(c)]
            if owners and (owners[0], name) not in OVERRIDDEN:
                unlisted.append(f"{cls.__qualname__}.{name} overrides {owners[0].__qualname__}'s")
    assert not unlisted, "list these in an OVERRIDDEN of trainers.rllib_compat:\n" + "\n".join(
        unlisted
    )


def test_every_private_rllib_member_a_subclass_uses_through_self_is_listed() -> None:
    """``self._x`` in a subclass of an RLlib class, where RLlib's class defines or sets
    ``_x``, is listed in an ``INHERITED`` (or ``OVERRIDDEN``), so its pin above exists."""
    listed = {(owner, name) for owner, name in LISTED}
    set_here = re.compile(r"self\.(_[a-z]\w*)\s*(?::[^=\n]*)?=[^=]")
    unlisted = []
    for cls in our_rllib_subclasses():
        rllib = [c for c in cls.__mro__ if c.__module__.startswith("ray.")]
        defined = {c: set(vars(c)) | set(set_here.findall(inspect.getsource(c))) for c in rllib}
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        for node in ast.walk(tree):
            value = getattr(node, "value", None)
            mine = isinstance(value, ast.Name) and value.id == "self"
            mine = mine or (isinstance(value, ast.Call) and _dotted(value.func) == "super")
            if not (isinstance(node, ast.Attribute) and mine and node.attr.startswith("_")):
                continue
            owners = [c for c in rllib if node.attr in defined[c]]
            unknown = not any((o, node.attr) in listed for o in rllib)
            if owners and unknown and not node.attr.startswith("__"):
                unlisted.append(f"{cls.__qualname__}: self.{node.attr} ({owners[0].__name__})")
    assert not unlisted, "list these in trainers.rllib_compat:\n" + "\n".join(sorted(set(unlisted)))
