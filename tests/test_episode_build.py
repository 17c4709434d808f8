"""The batched sampler's episode recording (``trainers/sampling/episode_build.py``) against RLlib's.

What a user relies on: the episodes the learner connectors (GAE, credit, GRPO groups, GRU
sequences) and rollout dumps read, and the metrics a run reports, are exactly those RLlib's
``MultiAgentEpisode.add_env_reset`` / ``add_env_step`` give. Compared field by field (every
buffer with its lookback, the env-to-agent step mappings, hanging caches, module mapping,
flags, the order of ``agent_episodes``), on scripted step sequences that walk every case of
RLlib's step (hanging actions, late first observations, reward-only agents, agents done
without an observation, cuts mid-episode) and on real runners sampling with the one and the
other (MLP, GRU, scripted pools, GRPO groups, cut episodes continued, env threads).
Only wall-clock stamps and random episode ids may differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.error import MultiAgentEnvError

from trainers.algo import to_algorithm_config
from trainers.configs.experiment import ExperimentConfig
from trainers.sampling import batched_runner
from trainers.sampling.batched_runner import BatchedEnvRunner
from trainers.sampling.episode_build import add_env_reset, add_env_step

#: fields that hold wall-clock stamps or random ids (compared for consistency, not equality)
UNSTAMPED = {
    "_start_time",
    "_last_step_time",
    "id_",
    "multi_agent_episode_id",
    "agent_to_module_mapping_fn",
}


def snapshot(value: Any) -> Any:
    """Everything an episode holds, as plain nested data (stamps and random ids left out)."""
    if isinstance(value, MultiAgentEpisode):
        out = {s: snapshot(getattr(value, s)) for s in _slots(value) if s not in UNSTAMPED}
        out["agent_order"] = list(value.agent_episodes)
        for sa in value.agent_episodes.values():
            assert sa.multi_agent_episode_id == value.id_
        return out
    if isinstance(value, SingleAgentEpisode):
        return {s: snapshot(getattr(value, s)) for s in _slots(value) if s not in UNSTAMPED}
    if isinstance(value, InfiniteLookbackBuffer):
        return {
            "data": snapshot(value.data),
            "lookback": value.lookback,
            "finalized": value.finalized,
            "space": repr(value.space),
            "struct": repr(value.space_struct),
            "type": type(value.data).__name__,
        }
    if isinstance(value, dict):
        return {"__type": type(value).__name__, **{repr(k): snapshot(v) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return [type(value).__name__, *(snapshot(v) for v in value)]
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tolist())
    if isinstance(value, np.generic):
        return ("scalar", value.dtype.str, value.item())
    return value


def _slots(obj: Any) -> list[str]:
    return [s for cls in type(obj).__mro__ for s in getattr(cls, "__slots__", ())]


def assert_same(a: Any, b: Any) -> None:
    x, y = snapshot(a), snapshot(b)
    assert x == y, diff(x, y)[:10]


# ----- scripted step sequences -------------------------------------------------------------
AGENTS = ["a", "b", "c", "d"]
SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def pair(**kwargs: Any) -> tuple[MultiAgentEpisode, MultiAgentEpisode]:
    def make() -> MultiAgentEpisode:
        return MultiAgentEpisode(
            id_="ep",
            observation_space=dict.fromkeys(AGENTS, SPACE),
            action_space=dict.fromkeys(AGENTS, gym.spaces.Discrete(3)),
            agent_to_module_mapping_fn=lambda aid, ep: "m_a" if aid == "a" else "m_rest",
            **kwargs,
        )

    return make(), make()


def ob(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-1, 1, 2).astype(np.float32)


def script(seed: int, steps: int, end: str, anchored: bool = False) -> list[dict[str, Any]]:
    """A valid random step sequence: who observes, acts, is rewarded and is done when.
    ``anchored``: agent "a" is there from the reset and never done alone, so the episode
    ends at the last step (else it may end earlier, every agent done on its own)."""
    rng = np.random.default_rng(seed)
    first = [a for a in AGENTS if rng.random() < 0.5] or ["b"]
    if anchored:
        first = ["a", *(a for a in first if a != "a")]
    out: list[dict[str, Any]] = [{"reset": {a: ob(rng) for a in first}}]
    pending, hanging, gone = set(first), set(), set()
    for t in range(steps):
        acts = {a: int(rng.integers(3)) for a in sorted(pending)}
        extras = {a: {"logp": np.float32(rng.normal()), "k": [t]} for a in acts}
        hanging |= set(acts)
        alive = [a for a in AGENTS if a not in gone]
        last = t == steps - 1
        seen = {a for a in alive if rng.random() < 0.5}
        terms: dict[str, bool] = {"__all__": False}
        truncs: dict[str, bool] = {"__all__": False}
        if last and end == "truncated":
            seen |= hanging  # truncation needs a last observation of every agent that acted
            truncs["__all__"] = True
        elif last:
            terms["__all__"] = True
        else:
            for a in alive[1:] if anchored and alive[0] == "a" else alive:
                if rng.random() < 0.08 and (a in seen or a not in hanging or rng.random() < 0.5):
                    terms[a] = True
                    gone.add(a)
        obs = {a: ob(rng) for a in sorted(seen) if a not in gone or terms.get(a)}
        rewards = {a: float(rng.normal()) for a in alive if rng.random() < 0.7}
        rewards.update({a: float(rng.normal()) for a in obs if a in hanging or a in acts})
        infos = {a: {"t": t} for a in obs}
        out.append(
            {"obs": obs, "actions": acts, "rewards": rewards, "infos": infos,
             "terminateds": terms, "truncateds": truncs, "extras": extras}
        )  # fmt: skip
        pending = {a for a in obs if a not in gone}
        hanging -= set(obs)
        hanging -= gone
    return out


def play(episode: MultiAgentEpisode, steps: list[dict[str, Any]], ours: bool) -> None:
    """Record ``steps`` (up to the episode's end) with our functions or RLlib's methods."""
    for s in steps:
        if episode.is_done:
            return
        if "reset" in s:
            if ours:
                add_env_reset(episode, s["reset"], {a: {"r": 1} for a in s["reset"]})
            else:
                episode.add_env_reset(
                    observations=s["reset"], infos={a: {"r": 1} for a in s["reset"]}
                )
            continue
        args = (s["obs"], s["actions"], s["rewards"], s["infos"])
        kwargs = {
            "terminateds": s["terminateds"],
            "truncateds": s["truncateds"],
            "extra_model_outputs": s["extras"],
        }
        if ours:
            add_env_step(episode, *args, **kwargs)
        else:
            episode.add_env_step(*args, **kwargs)


@pytest.mark.parametrize("end", ["terminated", "truncated", "open"])
@pytest.mark.parametrize("seed", range(12))
def test_scripted_steps_leave_the_episode_as_rllibs_do(seed: int, end: str) -> None:
    steps = script(seed, 3 + seed % 7, end)
    if end == "open":
        steps = steps[:-1]
    ours, theirs = pair()
    play(ours, steps, True)
    play(theirs, steps, False)
    assert_same(ours, theirs)
    if ours.is_done:
        assert_same(ours.to_numpy(), theirs.to_numpy())


@pytest.mark.parametrize("seed", range(12))
def test_cut_episodes_continue_as_rllibs_do(seed: int) -> None:
    """Cut mid-way (as ``truncate_episodes`` does at a sample's end, with a lookback) and
    continued: every chunk equal, hanging actions and rewards carried alike."""
    steps = script(100 + seed, 10, "terminated", anchored=True)
    cut_at = 2 + seed % 7
    ours, theirs = pair()
    play(ours, steps[: cut_at + 1], True)
    play(theirs, steps[: cut_at + 1], False)
    assert_same(ours, theirs)
    ours_next = ours.cut(len_lookback_buffer=1 + seed % 3)
    theirs_next = theirs.cut(len_lookback_buffer=1 + seed % 3)
    assert_same(ours_next, theirs_next)
    play(ours_next, steps[cut_at + 1 :], True)
    play(theirs_next, steps[cut_at + 1 :], False)
    assert_same(ours_next, theirs_next)
    assert_same(ours_next.to_numpy(), theirs_next.to_numpy())


def test_numpy_episodes_take_rllibs_path() -> None:
    steps = script(7, 6, "open", anchored=True)[:-1]
    ours, theirs = pair()
    play(ours, steps[:3], True)
    play(theirs, steps[:3], False)
    ours.to_numpy(), theirs.to_numpy()
    play(ours, steps[3:], True)
    play(theirs, steps[3:], False)
    assert_same(ours, theirs)


ZERO, ONE = np.zeros(2, np.float32), np.ones(2, np.float32)


@pytest.mark.parametrize(
    "bad",
    [
        # "a" acted and received its next observation, but no reward
        lambda s: s[1].update(rewards={"b": 1.0}),
        # truncated after acting, without a last observation
        lambda s: s[1].update(obs={}, truncateds={"__all__": True}),
        # data for an agent already done
        lambda s: (
            s[1].update(terminateds={"__all__": False, "a": True}),
            s[2].update(actions={"b": 1}, obs={"a": ZERO}),
        ),
    ],
)
def test_invalid_steps_raise_rllibs_errors(bad: Callable[[list], Any]) -> None:
    live = {"terminateds": {"__all__": False}, "truncateds": {"__all__": False}}
    step = {"actions": {"a": 1, "b": 2}, "rewards": {"a": 1.0, "b": 0.0}, "infos": {},
            "extras": {}, **live}  # fmt: skip
    steps = [
        {"reset": {"a": ZERO, "b": ZERO}},
        {**step, "obs": {"a": ONE, "b": ONE}},
        {**step, "obs": {}},
    ]
    bad(steps)
    errors = []
    for flag in (True, False):
        episode = pair()[0]
        with pytest.raises(MultiAgentEnvError) as info:
            play(episode, steps, flag)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def diff(a: Any, b: Any, path: str = "", rtol: float = 0.0) -> list[str]:
    """Where two snapshots differ; ``rtol``: float arrays need only be that close."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}: keys {sorted(set(a) ^ set(b))}"] if set(a) != set(b) else []
        for k in a.keys() & b.keys():
            out += diff(a[k], b[k], f"{path}/{k}", rtol)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in diff(x, y, f"{path}[{i}]", rtol)]
    if rtol and _float_array(a) and _float_array(b) and a[1:3] == b[1:3]:
        ok = np.allclose(np.asarray(a[3]), np.asarray(b[3]), rtol=rtol, atol=rtol)
        return [] if ok else [f"{path}: {a!r:.300} != {b!r:.300}"]
    return [] if a == b else [f"{path}: {a!r:.300} != {b!r:.300}"]


def _float_array(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) == 4 and x[0] == "ndarray" and x[1][1] == "f"


# ----- real runners ------------------------------------------------------------------------
def rllib_recording(monkeypatch: pytest.MonkeyPatch, runner: Any) -> None:
    """Make ``runner`` record through RLlib's own methods and compute and log RLlib's own
    metrics."""

    def reset(episode: Any, observations: Any, infos: Any = None) -> None:
        episode.add_env_reset(observations=observations, infos=infos)

    def step(episode: Any, *args: Any, **kwargs: Any) -> None:
        episode.add_env_step(*args, **kwargs)

    monkeypatch.setattr(batched_runner, "add_env_reset", reset)
    monkeypatch.setattr(batched_runner, "add_env_step", step)
    runner._log_episode_metrics = MultiAgentEnvRunner._log_episode_metrics.__get__(runner)
    runner.get_metrics = MultiAgentEnvRunner.get_metrics.__get__(runner)


def build(extra: dict[str, Any], envs: int) -> Any:
    cfg = ExperimentConfig.from_dict(
        {"topology": "star:3", **extra, "resources": {"num_envs_per_env_runner": envs}}
    )
    return BatchedEnvRunner(config=to_algorithm_config(cfg), worker_index=0)


#: runner metrics that measure wall-clock time
WALL_CLOCK = {"sample"}
WALL_CLOCK_PARTS = ("duration", "throughput", "timers", "time")


def metrics(runner: Any) -> dict[str, Any]:
    """The runner's reduced metrics, flat, without wall-clock ones."""
    out = {}

    def walk(tree: Any, prefix: str) -> None:
        for k, v in tree.items():
            key = f"{prefix}/{k}" if prefix else str(k)
            if isinstance(v, dict):
                walk(v, key)
            elif key not in WALL_CLOCK and not any(w in key for w in WALL_CLOCK_PARTS):
                out[key] = v.peek() if hasattr(v, "peek") else v

    walk(runner.get_metrics(), "")
    return out


def sample_both(
    monkeypatch: pytest.MonkeyPatch,
    extra: dict[str, Any],
    calls: list[dict[str, Any]],
    envs: int = 4,
) -> tuple[list[list[Any]], list[list[Any]], list[dict], list[dict]]:
    """The same runner (seed, weights) sampling ``calls`` with our recording and RLlib's."""
    ours, theirs = build(extra, envs), build(extra, envs)
    theirs.module.set_state(ours.module.get_state())
    got: list[list[list[Any]]] = [[], []]
    logged: list[list[dict]] = [[], []]
    for k, runner in enumerate((ours, theirs)):
        with monkeypatch.context() as m:
            if k == 1:
                rllib_recording(m, runner)
            for call in calls:
                got[k].append(runner.sample(explore=True, **call))
                logged[k].append(metrics(runner))
        runner.stop()
    return got[0], got[1], logged[0], logged[1]


def assert_same_samples(a: list[list[Any]], b: list[list[Any]]) -> None:
    for x, y in zip(a, b, strict=True):
        assert len(x) == len(y)
        for e, f in zip(x, y, strict=True):
            assert type(e) is type(f)
            assert_same(e, f)


GRU = {
    "pools": {
        "orchestrator": {"model": {"type": "mlp"}},
        "worker": {"model": {"type": "gru", "gru_size": 8}},
    }
}
SCRIPTED = {
    "pools": {"worker": {"model": {"type": "scripted", "policy": "delegate.scripted_worker"}}}
}


@pytest.mark.parametrize(
    "extra",
    [{}, GRU, SCRIPTED, {"algorithm": {"name": "GRPO"}, "seed": 3}],
    ids=["mlp", "gru", "scripted", "grpo"],
)
def test_runner_episodes_and_metrics_equal_rllibs_recording(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]
) -> None:
    """Three ``sample()`` calls of 60 env steps: episodes cut at each call's end are continued
    by the next; done and cut chunks, and the reduced metrics, equal RLlib's."""
    calls = [{"num_timesteps": 60}] * 3
    a, b, ma, mb = sample_both(monkeypatch, extra, calls)
    assert_same_samples(a, b)
    assert any(e.is_done for e in a[1])
    if "algorithm" not in extra:  # GRPO samples whole episodes (complete_episodes)
        assert any(not e.is_done for e in a[0])
    assert ma == mb
    assert any("episode_return_mean" in k for k in ma)


def test_runner_whole_episodes_equal_rllibs_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, ma, mb = sample_both(monkeypatch, GRU, [{"num_episodes": 6}] * 2)
    assert_same_samples(a, b)
    assert ma == mb


def test_env_threads_episodes_equal_rllibs_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    """With each env on its own thread, which episodes a sample ends with depends on timing:
    every env's finished episodes are compared, in order, as far as both got."""
    extra = {"episodes": {"env_threads": True}}  # forwards batch other rows: floats ≈ only
    a, b, _, _ = sample_both(monkeypatch, extra, [{"num_timesteps": 80}] * 2, envs=3)
    for calls in (a, b):
        for chunk in calls:
            assert all(e.is_numpy for e in chunk if e.is_done)
    done_a = [e for chunk in a for e in chunk if e.is_done and e.env_t_started == 0]
    done_b = [e for chunk in b for e in chunk if e.is_done and e.env_t_started == 0]
    n = min(len(done_a), len(done_b))
    assert n >= 3
    by_actions = {_key(e): e for e in done_b}
    matched = 0
    for e in done_a:
        f = by_actions.get(_key(e))
        if f is not None:
            x, y = snapshot(e), snapshot(f)
            assert not diff(x, y, rtol=1e-5), diff(x, y, rtol=1e-5)[:5]
            matched += 1
    assert matched >= 3


def _key(episode: Any) -> tuple:
    """An episode's identity across runners: its seed and every agent's actions."""
    seed = next(
        (sa.infos[-1].get("seed") for sa in episode.agent_episodes.values() if len(sa.infos)),
        None,
    )
    acts = tuple((a, tuple(np.ravel(sa.actions.data).tolist()))
                 for a, sa in sorted(episode.agent_episodes.items()))  # fmt: skip
    return seed, acts
