"""Slow tools: injected latency keeps episodes identical (sync and async chat apps, toolchain on
both engines), per-tool timeouts end a hung tool's episode as a named failure, and the
:class:`~scenarios.in_flight.Stepper` keeps other envs going while one waits (or hangs).

Latencies are milliseconds; nothing here asserts on wall-clock time.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")

from marl_agents.llm.env_chat_model import tokens_action
from scenarios.clocks import ENV_CLOCK, TOOL_CLOCK, BusyClock, Clock
from scenarios.in_flight import CallTimeout, Done, Stepper
from scenarios.registry import make
from scenarios.replay import same
from scenarios.rllib_env import RLlibGraphEnv
from scenarios.tool_latency import ToolLatency, ToolSettings, ToolTimeout, tool_call
from scenarios.toolcalls import render_tool_call
from scenarios.toolchain import TOOLS
from tests.apps import slow_tools
from trainers.configs.experiment import EpisodesConfig, ExperimentConfig
from trainers.configs.typed import ConfigError
from trainers.signals.curriculum import TaskSchedule

APPS = {"sync": "tests.apps.slow_tools:sync_app", "async": "tests.apps.slow_tools:async_app"}
JITTERED = ToolSettings(ToolLatency(seconds=0.004, jitter=0.003))


@pytest.fixture(autouse=True)
def hung_tools_released() -> Iterator[None]:
    """``lookup(key='hang')`` blocks until the test ends (then every blocked thread goes on)."""
    slow_tools.RELEASE.clear()
    yield
    slow_tools.RELEASE.set()


class Replies:
    """Text actions of the slow-tool apps: ``lookup(key)`` calls and a final answer."""

    def __init__(self, env: RLlibGraphEnv) -> None:
        scenario = env.env.scenario
        self.spaces, self.tokenizer = scenario.spaces, scenario.tokenizer

    def call(self, key: str) -> np.ndarray:
        text = render_tool_call("lookup", {"key": key})
        return tokens_action(self.spaces, self.tokenizer, text)

    def answer(self, text: str = "It is cobalt.") -> np.ndarray:
        return tokens_action(self.spaces, self.tokenizer, text)

    def script(self, first: str = "k2") -> list[np.ndarray]:
        """Two lookups, then the answer."""
        return [self.call(first), self.call("k1"), self.answer()]


def play(env: Any, seed: int, act: Callable[[int, str, Any], Any]) -> list[tuple[Any, ...]]:
    """Every ``reset``/``step`` output of one episode; ``act(k, agent, obs)`` gives actions."""
    out: list[tuple[Any, ...]] = [env.reset(seed=seed)]
    k = 0
    while True:
        obs = out[-1][0]
        step = env.step({a: act(k, a, obs[a]) for a in obs})
        out.append(step)
        k += 1
        if step[2]["__all__"] or step[3]["__all__"]:
            return out


def rllib_env(ref: str, **config: Any) -> RLlibGraphEnv:
    return RLlibGraphEnv({"scenario": ref, **config})


# ----- latency keeps episodes identical --------------------------------------------------------
@pytest.mark.parametrize("app", sorted(APPS))
def test_latency_on_chat_apps_keeps_episodes_identical(app: str) -> None:
    env = rllib_env(APPS[app])
    replies = Replies(env)
    rng = np.random.default_rng(0)
    menu = [replies.call("k1"), replies.call("k3"), replies.call("nope"), replies.answer()]
    picks = rng.integers(len(menu), size=(4, 6))  # episode → its replies (then the answer)

    def episode(seed: int) -> list[tuple[Any, ...]]:
        return play(env, seed, lambda k, a, obs: menu[picks[seed, k]] if k < 6 else menu[-1])

    plain = [episode(seed) for seed in range(4)]
    env.env.tools = JITTERED
    slow, calls = [], 0
    for seed in range(4):
        slow.append(episode(seed))
        tools = env.env.tool_episode
        assert tools is not None and (tools.waited_s > 0) == (tools.calls > 0)
        calls += tools.calls
    assert calls == sum(min(list(p).index(3) if 3 in p else 6, 6) for p in picks)
    assert same(slow, plain)  # observations, rewards, flags and infos alike


@pytest.mark.parametrize("engine", ["fast", "langgraph", "check"])
@pytest.mark.parametrize("scenario", ["toolchain", "text-toolchain"])
def test_latency_on_toolchain_keeps_episodes_identical(scenario: str, engine: str) -> None:
    env = RLlibGraphEnv({"env": make(scenario, topology="chain:3"), "engine": engine})
    policy = env.env.scenario.optimal_policy()

    def act(k: int, agent: str, obs: Any) -> Any:
        return policy(agent, obs)

    plain = [play(env, seed, act) for seed in range(3)]
    env.env.tools = JITTERED
    slow = [play(env, seed, act) for seed in range(3)]
    assert same(slow, plain)
    assert env.env.tool_episode is not None and env.env.tool_episode.calls == 4  # the 4-call path
    assert (env.env.stepped_graph() is not None) == (engine != "langgraph")


def test_a_fast_run_that_falls_back_replays_its_tool_calls_without_latency() -> None:
    runs = {}
    for engine in ("fast", "langgraph"):
        env = RLlibGraphEnv({"env": make("toolchain", fail_tool="calc"), "engine": engine})
        policy = env.env.scenario.optimal_policy()
        env.env.tools = JITTERED
        steps = play(env, 0, lambda k, a, obs, policy=policy: policy(a, obs))
        tools = env.env.tool_episode
        assert tools is not None
        runs[engine] = (steps, tools.calls, tools.waited_s)
    (fast, fast_calls, fast_s), (slow, slow_calls, slow_s) = runs["fast"], runs["langgraph"]
    assert same(fast, slow) and "ToolError" in fast[-1][4]["agent"]["error"]
    assert fast_calls == slow_calls == 3 and fast_s == slow_s  # lookup, lookup, calc (raises)


def test_jitter_comes_from_its_own_rng_seeded_by_the_episode() -> None:
    draws = []
    for _ in range(2):
        episode = JITTERED.episode(seed=7)
        draws.append([episode.delay() for _ in range(5)])
    assert draws[0] == draws[1] and len(set(draws[0])) == 5
    assert all(0.001 <= d <= 0.007 for d in draws[0])
    other = JITTERED.episode(seed=8)
    assert [other.delay() for _ in range(5)] != draws[0]


def test_latency_reaches_the_env_from_the_config() -> None:
    from trainers.algo import to_algorithm_config

    cfg = ExperimentConfig(
        scenario="toolchain",
        episodes=EpisodesConfig(tool_latency={"seconds": 0.2, "jitter": 0.05}, tool_timeout_s=5),
    )
    env_config = to_algorithm_config(cfg).env_config
    assert env_config["spec"].tool_latency == {"seconds": 0.2, "jitter": 0.05}
    tools = RLlibGraphEnv(env_config).env.tools
    assert tools == ToolSettings(ToolLatency(0.2, 0.05), 5.0)
    assert RLlibGraphEnv({"scenario": "toolchain", "tool_latency": None}).env.tools is None


@pytest.mark.usefixtures("ray_session")
def test_training_returns_are_bit_identical_with_tool_latency(tmp_path: Path) -> None:
    from configs import learning_rows, tiny_config

    from trainers.run.loop import train

    rows = {}
    for name, episodes in {
        "plain": {},
        "slow": {"tool_latency": {"seconds": 0.001, "jitter": 0.001}, "tool_timeout_s": 30},
    }.items():
        cfg = tiny_config(tmp_path / name, scenario="toolchain", episodes=episodes)
        rows[name] = learning_rows(train(cfg).run_dir)
    assert rows["slow"] == rows["plain"]
    assert len(rows["slow"]) == 2 and "charts/team_return" in rows["slow"][0]


# ----- per-tool timeouts ----------------------------------------------------------------------
@pytest.mark.parametrize("app", sorted(APPS))
def test_hung_tool_ends_the_episode_as_a_named_failure(app: str) -> None:
    env = rllib_env(APPS[app], tool_timeout_s=0.2)
    replies = Replies(env)
    steps = play(env, 0, lambda k, a, obs: replies.script(first="hang")[min(k, 2)])
    obs, rewards, terms, truncs, infos = steps[-1]
    assert truncs["__all__"] and not terms["__all__"]
    info = infos["assistant"]
    assert info["failure"] == "error"
    assert "ToolTimeout" in info["error"] and "tool 'lookup'" in info["error"]
    assert "tool_timeout_s=0.2" in info["error"]


@pytest.mark.parametrize("app", sorted(APPS))
def test_a_tool_node_that_handles_errors_shows_the_timeout_to_the_agent(app: str) -> None:
    env = rllib_env(APPS[app], kwargs={"handle_tool_errors": True}, tool_timeout_s=0.2)
    replies = Replies(env)
    steps = play(env, 0, lambda k, a, obs: replies.script(first="hang")[min(k, 2)])
    assert len(steps) == 4 and steps[-1][2]["__all__"]  # the episode went on to the answer
    prompt = replies.tokenizer.decode(replies.spaces.decode_prompt(steps[1][0]["assistant"]))
    assert "ToolTimeout" in prompt and "tool_timeout_s" in prompt


def test_tool_call_helper_times_out_and_passes_errors() -> None:
    # a limit no quick call reaches on a loaded machine (parallel test workers): only the
    # tool that blocks until released times out
    episode = ToolSettings(ToolLatency(0.001), timeout_s=1.0).episode(seed=0)
    with pytest.raises(ToolTimeout, match=r"tool 'slow' ran longer than tool_timeout_s=1 s"):
        episode.call("slow", slow_tools.RELEASE.wait)
    with pytest.raises(ZeroDivisionError):
        episode.call("div", lambda: 1 / 0)
    assert episode.call("add", lambda: 1 + 1) == 2 and episode.calls == 3
    assert tool_call("plain", max, 1, 2) == 2  # outside an episode: a plain call


# ----- the stepper -----------------------------------------------------------------------------
def drive(stepper: Stepper, act: Callable[[int, int, str], Any], last: int) -> list[Done]:
    """Run episodes on every env until env ``last``'s first episode ends (``act(env, k,
    agent)`` gives actions); returns the episodes' final steps in the order they finished."""
    ends: list[Done] = []
    steps = dict.fromkeys(range(len(stepper)), 0)
    for i in range(len(stepper)):
        stepper.start_reset(i, seed=i)
    while stepper.in_flight:
        for done in stepper.wait():
            i = done.index
            assert done.error is None, done.error
            assert done.result is not None
            if done.kind == "step" and (done.result[2]["__all__"] or done.result[3]["__all__"]):
                ends.append(done)
                steps[i] = 0
                if not any(d.index == last for d in ends):
                    stepper.start_reset(i)
                continue
            obs = done.result[0]
            stepper.start_step(i, {a: act(i, steps[i], a) for a in obs})
            steps[i] += 1
    return ends


@pytest.mark.parametrize("app", sorted(APPS))
def test_episodes_go_on_while_one_env_hangs_on_a_tool(app: str) -> None:
    envs = [rllib_env(APPS[app], tool_timeout_s=2.0) for _ in range(4)]
    replies = Replies(envs[0])
    scripts = {i: replies.script(first="hang" if i == 0 else "k2") for i in range(4)}
    with Stepper(envs, threads=True) as stepper:
        ends = drive(stepper, lambda i, k, a: scripts[i][min(k, 2)], last=0)
    hung = next(d for d in ends if d.index == 0)
    others = [d for d in ends if d.index != 0]
    assert ends.index(hung) >= 3  # other envs finished episodes while env 0 waited on its tool
    assert {d.index for d in ends[: ends.index(hung)]} == {1, 2, 3}
    (info,) = hung.result[4].values()
    assert info["failure"] == "error" and "ToolTimeout" in info["error"]
    assert all(info["failure"] is None for d in others for info in d.result[4].values())


def test_a_call_past_its_deadline_retires_the_slot() -> None:
    envs = [rllib_env(APPS["sync"]) for _ in range(3)]  # no tool timeout: env 0 really hangs
    replies = Replies(envs[0])
    stepper = Stepper(envs, threads=True, call_timeout_s=0.3)
    for i in range(3):
        stepper.start_reset(i, seed=i)
    first = drain(stepper, 3)
    stepper.start_step(0, {"assistant": replies.call("hang")})
    stepper.start_step(1, {"assistant": replies.answer()})
    results = {d.index: d for d in drain(stepper, 2)}
    assert results[1].error is None and results[1].result[2]["__all__"]
    timeout = results[0]
    assert isinstance(timeout.error, CallTimeout) and timeout.kind == "step"
    assert "env 0's step() ran longer than call_timeout_s=0.3 s" in str(timeout.error)
    with pytest.raises(RuntimeError, match=r"replace\(0, env\)"):
        stepper.start_step(0, {"assistant": replies.answer()})
    stepper.replace(0, rllib_env(APPS["sync"]))
    stepper.start_reset(0, seed=5)
    (again,) = stepper.wait()
    assert again.index == 0 and again.error is None and all(d.error is None for d in first)
    stepper.close()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("marl-env-")]
    assert alive == ["marl-env-0"]  # the retired slot's thread, still in its hung call
    slow_tools.RELEASE.set()  # the hung call returns: the thread closes its env and ends
    for t in threading.enumerate():
        if t.name.startswith("marl-env-"):
            t.join()


def drain(stepper: Stepper, n: int) -> list[Done]:
    """Wait until ``n`` calls have come back."""
    out: list[Done] = []
    while len(out) < n:
        out += stepper.wait()
    return out


@pytest.mark.parametrize("threads", [False, True])
def test_call_errors_come_back_with_the_env_index(threads: bool) -> None:
    envs = [rllib_env("toolchain") for _ in range(3)]
    with Stepper(envs, threads=threads) as stepper:
        for i in range(3):
            stepper.start_reset(i, seed=i)
        drain(stepper, 3)
        stepper.start_step(1, {"someone_else": 0})  # the acting agent has no action
        stepper.start_step(2, {"agent": np.array([3, 0, 0, 0])})
        done = sorted(drain(stepper, 2), key=lambda d: d.index)
    assert [d.index for d in done] == [1, 2] and done[1].error is None
    error = done[0].error
    assert isinstance(error, ValueError) and "no action for agent 'agent'" in str(error)
    assert "in env 1's step()" in "".join(error.__notes__)


def test_without_threads_calls_run_in_order_as_given() -> None:
    direct, stepped = (rllib_env("toolchain", topology="chain:2") for _ in range(2))
    policy = direct.env.scenario.optimal_policy()
    expected = play(direct, 3, lambda k, a, obs: policy(a, obs))
    got: list[tuple[Any, ...]] = []
    with Stepper([stepped]) as stepper:
        stepper.start_reset(0, seed=3)
        while True:
            (done,) = stepper.wait()
            got.append(done.result)
            if done.kind == "step" and done.result[2]["__all__"]:
                break
            obs = done.result[0]
            stepper.start_step(0, {a: policy(a, obs[a]) for a in obs})
    assert same(got, expected)


def test_stepper_misuse_is_an_error() -> None:
    envs = [rllib_env("toolchain")]
    with pytest.raises(ValueError, match="call_timeout_s needs threads=True"):
        Stepper(envs, call_timeout_s=1.0)
    with pytest.raises(ValueError, match="call_timeout_s must be > 0"):
        Stepper(envs, threads=True, call_timeout_s=0)
    with Stepper(envs, threads=True) as stepper:
        with pytest.raises(RuntimeError, match="no call in flight"):
            stepper.wait()
        with pytest.raises(RuntimeError, match=r"start_step\(0, ...\) before start_reset\(0\)"):
            stepper.start_step(0, {"agent": np.array([3, 0, 0, 0])})
        stepper.start_reset(0, seed=0)
        with pytest.raises(RuntimeError, match="already has a reset"):
            stepper.start_reset(0)
        with pytest.raises(IndexError, match="out of range"):
            stepper.start_reset(3)
        assert stepper.in_flight == [0]
        stepper.wait()
    assert not [t for t in threading.enumerate() if t.name.startswith("marl-env-")]


# ----- config errors ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("episodes", "match"),
    [
        ({"tool_latency": {"seconds": -1}}, r"episodes.tool_latency: seconds must be ≥ 0"),
        ({"tool_latency": {"seconds": 0.1, "jitter": 0.2}}, r"jitter=0.2 > seconds=0.1"),
        ({"tool_latency": {"secs": 1}}, r"unknown field\(s\) \['secs'\]"),
        ({"tool_latency": 0.2}, r"episodes.tool_latency must be a mapping"),
        ({"tool_timeout_s": 0}, r"episodes.tool_timeout_s must be a positive number"),
        ({"tool_timeout_s": "soon"}, r"episodes.tool_timeout_s must be"),
    ],
)
def test_slow_tool_config_errors_are_one_line(episodes: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        ExperimentConfig(episodes=episodes).check()
    assert "\n" not in str(info.value)


def test_slow_tool_config_round_trips_through_yaml() -> None:
    cfg = ExperimentConfig(
        episodes={"tool_latency": {"seconds": 0.2, "jitter": 0.05}, "tool_timeout_s": 3}
    )
    assert cfg.episodes.tool_latency == ToolLatency(0.2, 0.05)
    assert ExperimentConfig.from_yaml(cfg.to_yaml()) == cfg


def test_env_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="tool_timeout_s must be > 0"):
        ToolSettings(timeout_s=0)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['delay'\]"):
        ToolSettings.of({"delay": 1}, None)
    assert make("toolchain").tools is None


@pytest.mark.parametrize("app", sorted(APPS))
def test_an_env_with_an_episode_here_can_be_handed_to_threads(app: str) -> None:
    env = rllib_env(APPS[app])
    replies = Replies(env)
    obs, _ = env.reset(seed=1)  # an episode begun in this thread (as RLlib's env checker does)
    env.step(dict.fromkeys(obs, replies.call("k1")))
    with Stepper([env], threads=True) as stepper:  # closed at hand-over, here
        stepper.start_reset(0, seed=1)
        (done,) = stepper.wait()
        assert done.error is None
        stepper.start_step(0, dict.fromkeys(done.result[0], replies.answer()))
        (done,) = stepper.wait()
    assert done.error is None and done.result[2]["__all__"]


def test_close_never_waits_on_a_hung_call() -> None:
    env = rllib_env(APPS["sync"])  # no tool timeout, no call deadline: env 0 really hangs
    replies = Replies(env)
    stepper = Stepper([env], threads=True)
    stepper.start_reset(0, seed=0)
    stepper.wait()
    stepper.start_step(0, {"assistant": replies.call("hang")})
    stepper.close()  # returns: the thread is left to its call
    (thread,) = [t for t in threading.enumerate() if t.name == "marl-env-0"]
    slow_tools.RELEASE.set()  # the call returns; the thread closes the env and ends
    thread.join()
    assert env.env.finished  # its episode was aborted by close(), in its own thread


# ----- a timed-out tool is called once --------------------------------------------------------
def hanging_calc(env: Any, calls: Counter[str]) -> None:
    """Count ``env``'s toolchain tool calls by tool; ``calc`` hangs until the test ends."""
    scenario = env.scenario
    run_tool = scenario.run_tool

    def counted(state: Any, log: Any, tool: int, *args: Any) -> Any:
        calls[TOOLS[tool]] += 1
        if TOOLS[tool] == "calc":
            slow_tools.RELEASE.wait()
        return run_tool(state, log, tool, *args)

    scenario.run_tool = counted  # the nodes look it up at every call, on both engines


def test_a_tool_that_times_out_is_called_once_on_both_engines() -> None:
    runs = {}
    for engine in ("fast", "langgraph"):
        env = RLlibGraphEnv({"env": make("toolchain"), "engine": engine, "tool_timeout_s": 0.2})
        calls: Counter[str] = Counter()
        hanging_calc(env.env, calls)
        policy = env.env.scenario.optimal_policy()
        steps = play(env, 0, lambda k, a, obs, policy=policy: policy(a, obs))
        tools = env.env.tool_episode
        assert tools is not None and tools.timeouts == 1 and tools.calls == 3
        assert (env.env.stepped_graph() is not None) == (engine == "fast")
        runs[engine] = steps, calls
    (fast, fast_calls), (slow, slow_calls) = runs["fast"], runs["langgraph"]
    assert fast_calls["calc"] == slow_calls["calc"] == 1  # the wait is not paid twice
    assert same(fast, slow)  # the same error, rewards and infos as the LangGraph path
    (info,) = fast[-1][4].values()
    assert info["failure"] == "error" and "raised ToolTimeout: tool 'calc'" in info["error"]


# ----- evaluation uses the run's tool settings -------------------------------------------------
class Scripted:
    """The scenario's optimal policy behind :class:`~trainers.evaluate.TeamPolicy`'s interface."""

    def __init__(self, env: Any) -> None:
        self.policy = env.scenario.optimal_policy()

    def reset(self) -> None:
        pass

    def act(self, observations: dict[str, Any]) -> dict[str, Any]:
        return {a: self.policy(a, obs) for a, obs in observations.items()}


def test_evaluation_episodes_get_the_runs_tool_latency_and_timeout() -> None:
    from trainers.evaluate import _episode, _summarise
    from trainers.plan import resolve

    cfg = ExperimentConfig(
        scenario="toolchain",
        episodes={"tool_latency": {"seconds": 0.002}, "tool_timeout_s": 0.2},
    )
    env = resolve(cfg, ray_workers=False).env.make_env()  # what evaluate() builds
    assert env.tools == ToolSettings(ToolLatency(0.002), 0.2)
    policy = Scripted(env)
    fine = _episode(env, policy, 0, "team", cfg)
    assert env.tool_episode.calls == 4 and env.tool_episode.waited_s == pytest.approx(0.008)
    assert fine["failure"] is None and fine["tool_timeouts"] == 0 and fine["success"] == 1.0
    calls: Counter[str] = Counter()
    hanging_calc(env, calls)
    hung = _episode(env, policy, 1, "team", cfg)  # returns: the hung tool times out
    assert calls["calc"] == 1 and hung["tool_timeouts"] == 1 and hung["failure"] == "error"
    assert "ToolTimeout" in hung["error"] and hung["success"] == 0.0
    summary = _summarise([fine, hung], env.possible_agents).summary
    assert summary["failures"] == 1 and summary["tool_timeouts"] == 1


@pytest.mark.usefixtures("ray_session")
def test_evaluate_counts_a_hung_tool_as_a_timed_out_failure(tmp_path: Path) -> None:
    from configs import tiny_config

    from trainers.evaluate import evaluate
    from trainers.run.loop import train

    episodes = {"tool_latency": {"seconds": 0.001}, "tool_timeout_s": 0.2}
    cfg = tiny_config(tmp_path, batch=64, scenario="toolchain", episodes=episodes)
    run = train(cfg.replace(budget={"iterations": 1})).run_dir
    built: list[Any] = []

    def make_env(env_config: Any) -> Any:
        env = make(env_config["scenario"], topology=env_config.get("topology"))
        hanging_calc(env, Counter())
        built.append(env)
        return env

    result = evaluate(run, episodes=3, credit="team", show=False, make_env=make_env)
    (env,) = built
    assert env.tools == ToolSettings(ToolLatency(0.001), 0.2)  # the run's, as in training
    records = result.episodes  # (whether the greedy team calls calc is up to its weights)
    assert all(r["failure"] == "error" for r in records if r["tool_timeouts"])
    assert result.summary["tool_timeouts"] == sum(r["tool_timeouts"] for r in records)
    assert result.summary["failures"] == sum(r["failure"] is not None for r in records)


# ----- clocks with env threads -----------------------------------------------------------------
class FakeTime:
    """A time source the test moves by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_busy_clock_counts_overlapping_calls_once() -> None:
    now = FakeTime()
    clock = BusyClock(now)
    clock.enter()  # call a: 100 → 103
    now.t = 101.0
    clock.enter()  # call b: 101 → 105 (overlaps a)
    now.t = 103.0
    clock.exit()
    assert clock.seconds == 3.0  # the span in progress counts up to now
    now.t = 105.0
    clock.exit()
    now.t = 110.0  # idle
    with clock.timing():  # call c: 110 → 111
        now.t = 111.0
    assert clock.seconds == 6.0  # 100–105 and 110–111, not 3 + 4 + 1


def test_a_muted_thread_adds_nothing_to_a_clock() -> None:
    clock = Clock()
    clock.add(1.0)

    def muted() -> None:
        clock.mute()
        clock.add(5.0)

    def loud() -> None:
        for _ in range(1000):
            clock.add(0.001)

    threads = [threading.Thread(target=f) for f in (muted, loud, loud)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    clock.add(1.0)  # this thread is not muted
    assert clock.seconds == pytest.approx(4.0)


def test_with_env_threads_env_and_tool_time_stay_within_the_callers_wall_time() -> None:
    """Four envs wait on tools side by side: summed over threads their reset/step time is ~4×
    the wall time, but ENV_CLOCK (the caller's wait) and TOOL_CLOCK (time with a call running)
    never exceed the caller's wall time."""
    envs = [rllib_env(APPS["sync"], tool_latency={"seconds": 0.02}) for _ in range(4)]
    replies = Replies(envs[0])
    script = replies.script()
    with Stepper(envs, threads=True) as stepper:
        env0, tool0, start = ENV_CLOCK.seconds, TOOL_CLOCK.seconds, time.perf_counter()
        ends = drive(stepper, lambda i, k, a: script[min(k, 2)], last=3)
        wall = time.perf_counter() - start
        env_s, tool_s = ENV_CLOCK.seconds - env0, TOOL_CLOCK.seconds - tool0
    assert len(ends) >= 4 and all(e.error is None for e in ends)
    assert 0 < env_s <= wall and 0 < tool_s <= wall


def test_without_threads_the_env_clock_times_the_calls_here() -> None:
    env = rllib_env("toolchain", tool_latency={"seconds": 0.002})
    policy = env.env.scenario.optimal_policy()
    with Stepper([env]) as stepper:
        env0, tool0 = ENV_CLOCK.seconds, TOOL_CLOCK.seconds
        stepper.start_reset(0, seed=0)
        while True:
            (done,) = stepper.wait()
            if done.kind == "step" and done.result[2]["__all__"]:
                break
            obs = done.result[0]
            stepper.start_step(0, {a: policy(a, obs[a]) for a in obs})
    tool_s = TOOL_CLOCK.seconds - tool0
    assert tool_s >= 4 * 0.002  # four calls, each sleeping its latency first
    assert ENV_CLOCK.seconds - env0 >= tool_s  # the tool calls ran inside reset/step


# ----- the curriculum schedule under env threads -------------------------------------------------
def test_the_curriculum_schedule_is_safe_to_hammer_from_threads() -> None:
    """Env threads draw and record while the driver pushes distributions over task lists of
    different lengths: no draw is stale (every memoised index fits the current task list), and
    every recorded outcome is drained exactly once."""
    schedule = TaskSchedule()
    lists = {
        5: ([0, 1, 2, 3, 4], np.array([0, 0, 0, 0, 1.0])),
        2: ([10, 11], np.array([0.5, 0.5])),
    }
    schedule.push(*lists[5])
    drained: list[Any] = []
    recorded = [0] * 6
    errors: list[BaseException] = []
    start = threading.Barrier(7)

    def env_thread(t: int) -> None:
        start.wait()
        try:
            for k in range(400):
                i = schedule.draw((t % 2,), k)
                with schedule._lock:  # a consistent look at the current list and draws
                    assert all(v < len(schedule.tasks) for v in schedule.memo.values())
                schedule.record((t % 2,), k, i, bool(k % 2))
                recorded[t] += 1
                if k % 97 == 0:
                    drained.extend(schedule.drain())
        except BaseException as exc:  # reported below
            errors.append(exc)

    def driver() -> None:
        start.wait()
        for j in range(200):
            schedule.push(*lists[2 if j % 2 else 5])
            drained.extend(schedule.drain())

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=env_thread, args=(t,)) for t in range(6)]
        threads.append(threading.Thread(target=driver))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[0]
    drained.extend(schedule.drain())
    assert len(drained) == sum(recorded) == 6 * 400
    assert sorted(Counter(key for key, _, _ in drained).values()) == [3] * 800
