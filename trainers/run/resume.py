"""Exact resume: the sampling state that RLlib's checkpoints leave out.

``Algorithm.save_to_path`` keeps weights, optimizers, connector and metrics-logger state and the
iteration counter, but not what decides the next iteration's samples: each env runner's episodes
in progress (``truncate_episodes`` cuts them at iteration boundaries) and its metrics windows,
each sub-environment's episode-seed stream (and task schedule) and the episode it is running,
the curriculum's pass-rate estimates and each process's task schedule, the processes' RNGs
(action sampling, minibatch shuffling), PPO's adaptive KL coefficients and the wall clock
(``time_total_s``). :func:`save` writes them into a checkpoint directory (``marl_state.pkl``,
and ``marl_state.json`` with the iteration); :func:`restore` puts them back after
``Algorithm.from_checkpoint`` (and gives remote env runners the learner's weights, which it does
not — or, under asynchronous GRPO where they lag the learner by design, the weights they held),
so the resumed run samples, learns and reports what the uninterrupted one would have.
Asynchronous GRPO has no sample in flight between iterations: the batch sampled ahead is saved
with its policy versions (:mod:`trainers.grpo.async_sampling`), so nothing is lost.

An episode in progress is rebuilt by replaying its recorded actions from its seed (scenarios are
deterministic given seed and actions); a replay that does not reproduce the recorded
observations is logged as a warning. Exact where every sampling process is the driver or an env
runner; remote learners' RNGs are not captured (see docs/internals.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trainers.signals.curriculum import SCHEDULE

log = logging.getLogger(__name__)

STATE_FILE = "marl_state.pkl"
INFO_FILE = "marl_state.json"
#: our env-runner attributes that carry sampling across ``sample()`` calls (saved with RLlib's
#: own: :data:`trainers.rllib_compat.runner.SAMPLING_STATE`)
RUNNER_ATTRS = (
    "_marl_policy_version",  # trainers.grpo.async_sampling.RUNNER_VERSION
    "_batched",  # trainers.sampling.batched_runner.STATE_ATTR
)


def save(algo: Any, path: Path) -> None:
    """Write the sampling state of ``algo`` (after a whole iteration) into checkpoint ``path``.

    State that cannot be captured (an env runner down, something unpicklable in a custom env)
    is a warning, not a failed checkpoint: a run resumed from it continues, but not exactly.
    """
    from ray import cloudpickle

    from trainers.rllib_compat.runner import time_total as algo_time

    time_total = algo_time(algo)
    try:
        state = {
            "rng": rng_state(),
            "time_total_s": time_total,
            "runners": _capture_runners(algo),
            "learners": _foreach_learner(algo, capture_learner),
            "curriculum": _curriculum_state(algo),
            "pipeline": _pipeline(algo).state() if _pipeline(algo) else None,
            "runner_weights": _lagging_weights(algo),
        }
        data = cloudpickle.dumps(state)
    except Exception as exc:  # any capture failure costs exactness, not the checkpoint
        log.warning("%s: sampling state not saved (%s): resuming from it is not exact", path, exc)
    else:
        (path / STATE_FILE).write_bytes(data)
    info = {"iteration": int(algo.iteration), "time_total_s": time_total}
    (path / INFO_FILE).write_text(json.dumps(info) + "\n")


def _curriculum_state(algo: Any) -> Any:
    """The driver's curriculum state (``trainers.signals.curriculum.Curriculum``), if the run has
    one."""
    cur = getattr(algo, "marl_curriculum", None)
    return None if cur is None else cur.get_state()


def _capture_runners(algo: Any) -> dict[int, bytes]:
    from ray import cloudpickle

    group = getattr(algo, "env_runner_group", None)
    if group is None:
        return dict([cloudpickle.loads(capture_runner(algo.env_runner))])
    # RLlib drops the answers of runners that fail (fault tolerance): count them
    parts = group.foreach_env_runner(capture_runner, local_env_runner=True)
    runners = dict(cloudpickle.loads(p) for p in parts)
    missing = group.num_remote_env_runners() - sum(1 for k in runners if k > 0)
    if missing > 0:
        log.warning("%d env runner(s) gave no sampling state: they resume fresh", missing)
    return runners


def restore(algo: Any, path: Path) -> bool:
    """Put back what :func:`save` wrote into ``path`` (False: nothing saved there)."""
    from ray import cloudpickle

    from trainers.rllib_compat.runner import set_time_total

    file = path / STATE_FILE
    if not file.exists():
        log.warning("%s has no %s: the resumed run is not an exact continuation", path, STATE_FILE)
        return False
    state = cloudpickle.loads(file.read_bytes())
    runners: dict[int, bytes] = state["runners"]
    group = getattr(algo, "env_runner_group", None)
    pipe = _pipeline(algo)
    if pipe is not None and state.get("pipeline"):
        pipe.set_state(state["pipeline"])  # the batch sampled ahead, and the policy versions
    if group is not None:
        if pipe is None or pipe.runner_version == pipe.learner_version:
            _push_learner_weights(algo)
        else:  # runners that lag by design get back the weights they held (the last sync)
            _push_runner_weights(algo, state.get("runner_weights"))
        restored = group.foreach_env_runner(
            lambda r: restore_runner(r, runners), local_env_runner=False
        )
        if sum(restored) < sum(1 for k in runners if k > 0):
            log.warning("some env runners were not restored: they start from fresh episodes")
    if algo.env_runner is not None and not restore_runner(algo.env_runner, runners):
        log.warning("the driver's env runner was not restored: it starts from fresh episodes")
    learners = state.get("learners") or []
    if learners:  # data-parallel learners hold the same coefficients
        _foreach_learner(algo, lambda learner: restore_learner(learner, learners[0]))
    set_time_total(algo, state["time_total_s"])
    algo.marl_curriculum_state = state.get("curriculum")  # read by Curriculum.start
    set_rng_state(state["rng"])  # last: restoring the runners may draw numbers
    return True


def _push_learner_weights(algo: Any) -> None:
    """Give every env runner the learner's weights, as the uninterrupted run's last sync did.

    ``Algorithm.from_checkpoint`` syncs remote runners from the checkpoint's local env runner
    first, whose weights (in a run with remote runners) lag the learner's, and the learner's
    sync that follows is skipped as not newer (same ``weights_seq_no``)."""
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    state = algo.learner_group.get_state(
        components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}", inference_only=True
    )[COMPONENT_LEARNER][COMPONENT_RL_MODULE]
    algo.env_runner_group.foreach_env_runner(
        lambda r: r.module.set_state(state), local_env_runner=True
    )


def _lagging_weights(algo: Any) -> dict[int, Any] | None:
    """Asynchronous GRPO's remote runners' weights when they lag the learner by design
    (``from_checkpoint`` would give them newer ones); None when they hold the learner's."""
    pipe = _pipeline(algo)
    group = getattr(algo, "env_runner_group", None)
    if pipe is None or group is None or pipe.runner_version == pipe.learner_version:
        return None
    parts = group.foreach_env_runner(
        lambda r: (int(r.worker_index or 0), r.module.get_state(inference_only=True)),
        local_env_runner=False,
    )
    return dict(parts)


def _push_runner_weights(algo: Any, weights: Mapping[int, Any] | None) -> None:
    """Give each remote env runner the weights :func:`_lagging_weights` saved for it."""
    if not weights:
        log.warning("the checkpoint has no lagging env-runner weights: resuming is not exact")
        return

    def put(runner: Any) -> None:
        state = weights.get(int(runner.worker_index or 0))
        if state is not None:
            runner.module.set_state(state)

    algo.env_runner_group.foreach_env_runner(put, local_env_runner=False)


def _pipeline(algo: Any) -> Any:
    """Asynchronous GRPO's :class:`~trainers.grpo.async_sampling.SamplePipeline` (None: sync)."""
    return getattr(algo, "pipeline", None)


def checkpoint_iteration(path: Path) -> int | None:
    """The iteration a checkpoint written with :func:`save` holds (None: not recorded)."""
    try:
        return int(json.loads((path / INFO_FILE).read_text())["iteration"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ----- learners (run in their process) -----------------------------------------------------------
def _foreach_learner(algo: Any, func: Any) -> list[Any]:
    group = getattr(algo, "learner_group", None)
    if group is None:
        return []
    return [r.get() for r in group.foreach_learner(func) if r.ok]


def capture_learner(learner: Any) -> dict[str, Any]:
    """Learner state RLlib's checkpoint misses: PPO's adaptive KL coefficients
    (``curr_kl_coeffs_per_module``, updated after every iteration)."""
    kl = getattr(learner, "curr_kl_coeffs_per_module", None) or {}
    return {"kl_coeffs": {mid: v.detach().cpu().clone() for mid, v in kl.items()}}


def restore_learner(learner: Any, state: Mapping[str, Any]) -> None:
    """Set what :func:`capture_learner` returned."""
    kl = getattr(learner, "curr_kl_coeffs_per_module", None)
    if kl is None:
        return
    for mid, value in state.get("kl_coeffs", {}).items():
        kl[mid].data.copy_(value.to(kl[mid].device))


# ----- one env runner (runs in its process) -----------------------------------------------------
def capture_runner(runner: Any) -> bytes:
    """``(worker_index, state)`` of one env runner, pickled: sampler attributes, metrics,
    sub-environments and this process's RNGs."""
    from ray import cloudpickle

    from trainers.rllib_compat.runner import SAMPLING_STATE, autoreset_envs

    attrs = (*SAMPLING_STATE, *RUNNER_ATTRS)
    state = {
        "attrs": {k: getattr(runner, k) for k in attrs if hasattr(runner, k)},
        "metrics": runner.metrics.get_state(),
        "rng": rng_state(),
        "envs": None,
        "schedule": SCHEDULE.get_state(),
    }
    vec = getattr(runner, "env", None)
    if vec is not None and hasattr(vec, "envs"):
        state["envs"] = [_env_state(sub.unwrapped) for sub in vec.envs]
        state["autoreset"] = np.array(autoreset_envs(vec))
    return cloudpickle.dumps((int(runner.worker_index or 0), cloudpickle.dumps(state)))


def restore_runner(runner: Any, runners: Mapping[int, bytes]) -> bool:
    """Restore this env runner from its entry in ``runners`` (False: none saved for it)."""
    from ray import cloudpickle

    from trainers.rllib_compat.runner import set_autoreset_envs

    blob = runners.get(int(runner.worker_index or 0))
    if blob is None:
        return False
    state = cloudpickle.loads(blob)
    vec = getattr(runner, "env", None)
    envs = list(getattr(vec, "envs", None) or [])
    if state["envs"] is not None and len(envs) != len(state["envs"]):
        log.warning(
            "env runner %s: %d sub-envs now, %d when saved (num_envs_per_env_runner changed): it "
            "starts from fresh episodes",
            runner.worker_index,
            len(envs),
            len(state["envs"]),
        )
        return False
    if state["envs"] is not None:
        for sub, env_state in zip(envs, state["envs"], strict=True):
            _restore_env(sub, env_state)
        if "autoreset" in state:  # which sub-envs reset at their next step (set at reset)
            set_autoreset_envs(vec, np.array(state["autoreset"]))
    for key, value in state["attrs"].items():
        setattr(runner, key, value)
    runner.metrics.set_state(state["metrics"])
    if "schedule" in state:
        SCHEDULE.set_state(state["schedule"])
    set_rng_state(state["rng"])
    return True


def _env_state(env: Any) -> dict[str, Any] | None:
    """An :class:`~scenarios.rllib_env.RLlibGraphEnv`'s stream and episode (None: another env)."""
    graph = getattr(env, "env", None)
    if graph is None or not hasattr(graph, "_np_random") or not hasattr(graph, "trace"):
        return None
    return {
        "seed": getattr(env, "_seed", None),
        "held": dict(getattr(env, "_held", {})),
        "agents": list(getattr(env, "agents", [])),
        "episode_seed": graph.seed_used,
        "actions": _actions(graph.trace),
        "digest": _digest(graph.trace),
        "rng": graph._np_random.bit_generator.state,
        "schedule": env.schedule_state() if hasattr(env, "schedule_state") else None,
    }


def _restore_env(sub: Any, state: dict[str, Any] | None) -> None:
    env = sub.unwrapped
    if state is None:
        return
    graph = env.env
    schedule = state.get("schedule")
    if state["episode_seed"] is not None:  # replay the episode in progress (or just ended)
        env._seed = None  # so that ``seed_once`` does not turn this seed into a fresh draw
        if schedule is not None:  # a GroupedEnv resets to its task seed: the episode's
            env.set_schedule_state({**schedule, "task_seed": state["episode_seed"]})
        sub.reset(seed=state["episode_seed"])
        for actions in state["actions"]:
            if graph._run is None or graph._run.finished:
                break
            sub.step(actions)
        if _digest(graph.trace) != state["digest"]:
            log.warning(
                "replaying episode seed %s did not reproduce its observations (a scenario that is "
                "not deterministic given seed and actions): the resumed run is not exact",
                state["episode_seed"],
            )
    graph._np_random.bit_generator.state = state["rng"]
    env._seed, env._held, env.agents = state["seed"], dict(state["held"]), list(state["agents"])
    if schedule is not None:  # GroupedEnv: where it is in its task schedule
        env.set_schedule_state(schedule)


def _actions(trace: list[Any]) -> list[dict[str, Any]]:
    """The joint action of every env step of an episode, from ``GraphEnv.trace``."""
    steps: dict[int, dict[str, Any]] = {}
    for t in trace:
        steps.setdefault(t.step, {})[t.agent] = t.action
    return [steps[k] for k in sorted(steps)]


def _digest(trace: list[Any]) -> str:
    data = [(t.step, t.agent, t.observation) for t in trace]
    return hashlib.sha256(pickle.dumps(data)).hexdigest()


# ----- process RNGs ---------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Python's, NumPy's global and torch's RNG states of this process."""
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Set what :func:`rng_state` returned."""
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
