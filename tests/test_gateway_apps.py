"""Apps trained through the gateway (``AppScenario``): many concurrent episodes never mix;
failing, non-zero-exit and hanging apps (functions and commands) end their episodes counted as
errors / timeouts with their stderr, also where they fail before their first request, and
function apps that never return are counted and bounded; the
``openai``-SDK router app makes the same decisions on the same prompts as its in-process
``ChatAppScenario`` twin, so exact Shapley values agree; and it trains 2 iterations with
``router`` learning and ``worker`` frozen (bit-identical).
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from episodes import play

pytest.importorskip("transformers")
pytest.importorskip("openai")

import openai

from marl_agents.gateway.app_scenario import AppScenario
from marl_agents.llm.env_chat_model import tokens_action
from scenarios.base import ScenarioError
from scenarios.graph_env import GraphEnv
from tests.apps import openai_router
from topologies.errors import MarlError


def client(llm: Any) -> Any:
    return openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)


# ----- concurrent episodes -------------------------------------------------------------------
def echo_run(task: str, llm: Any) -> list[tuple[str, str]]:
    """Three turns of two agents, each asking about this episode's task; replies kept."""
    c, seen = client(llm), []
    for turn in range(3):
        for agent in ("a", "b"):
            r = c.chat.completions.create(
                model=llm.models[agent],
                messages=[{"role": "user", "content": f"{task} {agent}{turn}"}],
            )
            seen.append((f"{agent}{turn}", r.choices[0].message.content))
    return seen


def test_many_concurrent_episodes_with_interleaved_requests_never_mix():
    sc = AppScenario(
        echo_run,
        tasks=[f"T{i}" for i in range(40)],
        verifier=lambda s: True,
        agents=["a", "b"],
        max_prompt_tokens=64,
        max_new_tokens=12,
    )
    tok = sc.tokenizer

    def policy(obs: Any) -> Any:  # repeats the task and turn it was asked about
        text = tok.decode(sc.spaces.decode_prompt(obs), skip_special_tokens=True)
        task, turn = re.findall(r"(T\d+) ([ab]\d)", text)[-1]
        return tokens_action(sc.spaces, tok, f"{task}/{turn}")

    envs = [GraphEnv(sc) for _ in range(12)]

    def episode(i: int) -> tuple[str, list[tuple[str, str]], int]:
        env = envs[i]
        obs, infos = env.reset(seed=i)
        steps = 0
        while env.agents:
            acting = [a for a in env.agents if infos[a]["acting"]]
            steps += len(acting)
            actions = {
                a: policy(obs[a]) if a in acting else sc.default_action(a) for a in env.agents
            }
            obs, _, _, _, infos = env.step(actions)
            time.sleep(0.001 * (i % 3))  # vary the interleaving
        assert env.failure is None, env.error
        return env.final_state["task"], env.final_state["result"], steps

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(episode, range(len(envs))))
    for task, seen, steps in results:
        assert steps == 6
        assert seen == [(turn, f"{task}/{turn}") for turn, _ in seen], (task, seen)


# ----- failures ---------------------------------------------------------------------------------
def one_call_then(action: str) -> Any:
    def run(task: str, llm: Any) -> Any:
        client(llm).chat.completions.create(
            model="router", messages=[{"role": "user", "content": task}]
        )
        if action == "raise":
            raise RuntimeError("the app broke")
        time.sleep(60)

    return run


def finish(env: GraphEnv, seed: int = 0) -> GraphEnv:
    sc = env.scenario
    obs, infos = env.reset(seed=seed)
    while env.agents:
        obs, _, _, _, infos = env.step({a: sc.default_action(a) for a in env.agents})
    return env


@pytest.mark.parametrize("limit", [None, 30.0])
def test_a_function_app_that_raises_or_hangs_ends_its_episode_counted(limit):
    settings = {**openai_router.SETTINGS, "verifier": bool, "agents": ["router", "worker"]}
    raising = AppScenario(one_call_then("raise"), **settings)
    env = finish(GraphEnv(raising, episode_timeout_s=limit))
    assert env.failure == "error" and "RuntimeError: the app broke" in env.error, env.error
    hanging = AppScenario(one_call_then("hang"), timeout_s=3.0, **settings)
    env = finish(GraphEnv(hanging, episode_timeout_s=limit))
    assert env.failure == "timeout" and "timeout_s=3" in env.error, env.error


def test_app_episodes_run_on_the_fast_path_and_a_failing_app_runs_once():
    """An app episode answers its requests on the fast path (no LangGraph run), and an app
    that raises after its request ends its episode with that error: it is never run a second
    time to replay the episode through LangGraph."""
    from scenarios.stepped import SteppedRun

    runs = []

    def app(task: str, llm: Any) -> Any:
        runs.append(task)
        client(llm).chat.completions.create(model="a", messages=[{"role": "user", "content": task}])
        if len(runs) > 1:
            raise RuntimeError("the app broke")
        return "ok"

    env = finish(GraphEnv(AppScenario(app, tasks=["t"], verifier=bool, agents=["a"])))
    assert env.failure is None and env.final_state["result"] == "ok", env.error
    assert isinstance(env._run, SteppedRun) and not env._run.fell_back
    finish(env, seed=1)
    assert env.failure == "error" and "RuntimeError: the app broke" in env.error, env.error
    assert len(runs) == 2 and not env._run.fell_back


def test_a_replay_where_the_app_fails_runs_the_app_once_and_scores_a_failure():
    """loo / Shapley replays: an app that raises when an agent is absent (its default reply)
    makes the coalition's value a failed episode's, and past the fast path's first checks
    (which replay through LangGraph too, by design) each such replay runs the app once."""
    from scenarios.counterfactual import Counterfactual
    from scenarios.env_replays import FAST_REPLAY_CHECKS

    runs = []

    def app(task: str, llm: Any) -> Any:
        runs.append(task)
        c = client(llm)
        reply = c.chat.completions.create(model="a", messages=[{"role": "user", "content": task}])
        if reply.choices[0].message.content != "go":
            raise RuntimeError("a was not there")
        return "ok"

    sc = AppScenario(app, tasks=["t"], verifier=bool, agents=["a"], default_reply="stop")
    env = GraphEnv(sc)
    env.reset(seed=0)
    env.step({"a": tokens_action(sc.spaces, sc.tokenizer, "go")})
    assert env.failure is None and env.outcome.reward == 1.0, env.error
    rule = Counterfactual(sc, env.episode_actions())
    for _ in range(FAST_REPLAY_CHECKS):  # checked against LangGraph: the app runs twice
        assert env.replay(0, rule.coalition(frozenset())).reward == 0.0
    assert env.fast_graph() is not None  # the fast replays agreed with LangGraph's
    runs.clear()
    for _ in range(3):
        assert env.replay(0, rule.coalition(frozenset())).reward == 0.0
        assert env.replay(0, rule.coalition(frozenset({"a"}))).reward == 1.0
    assert len(runs) == 6


def test_command_apps_run_per_episode_and_fail_or_hang_counted_with_their_stderr():
    root = str(Path(__file__).resolve().parents[1])
    env_vars = {"PYTHONPATH": root}
    ok = openai_router.command_scenario(env=env_vars, cwd=root)
    env = finish(GraphEnv(ok))
    assert env.failure is None, env.error
    assert set(env.final_state["result"]) >= {"reply", "routed"}
    failing = openai_router.command_scenario(env={**env_vars, "MARL_TEST_MODE": "fail"}, cwd=root)
    env = finish(GraphEnv(failing))
    assert env.failure == "error" and "exited with status 3" in env.error
    assert "the app broke on purpose" in env.error
    hanging = openai_router.command_scenario(
        env={**env_vars, "MARL_TEST_MODE": "hang"}, cwd=root, timeout_s=10.0
    )
    env = finish(GraphEnv(hanging))  # ends (the app sleeps an hour): it was killed
    assert env.failure == "timeout" and "timeout_s=10" in env.error, env.error


def test_an_app_failing_before_its_first_request_is_a_counted_failed_episode(tmp_path):
    """A function raising at once and a command exiting non-zero before calling the endpoint:
    each such episode is recorded (error text with the traceback / stderr) and ``reset()``
    runs the app again on the same task; only ``MAX_LOST_IN_A_ROW`` in a row make it raise."""
    from scenarios.graph_env import MAX_LOST_IN_A_ROW

    starts = []

    def once_broken(task: str, llm: Any) -> Any:
        starts.append(task)
        if len(starts) == 1:
            return 1 / 0
        return openai_router.run(task, llm)

    settings = {**openai_router.SETTINGS, "verifier": openai_router.routed}
    sc = AppScenario(once_broken, agents=["router", "worker"], **settings)
    env = finish(GraphEnv(sc), seed=3)
    assert env.failure is None and env.outcome is not None, env.error
    assert len(starts) == 2 and starts[0] == starts[1]  # the same task again
    (lost,) = env.lost_episodes
    assert lost.failure == "error" and lost.seed == 3 and lost.outcome.reward == 0.0
    assert "ZeroDivisionError" in lost.error and "traceback ends" in lost.error, lost.error
    assert "once_broken" in lost.error  # the traceback's frame

    root = str(Path(__file__).resolve().parents[1])
    mark = tmp_path / "started"
    command = openai_router.command_scenario(
        env={"PYTHONPATH": root, "MARL_TEST_MODE": "early-once", "MARL_TEST_MARK": str(mark)},
        cwd=root,
    )
    env = finish(GraphEnv(command))
    assert env.failure is None and env.outcome is not None, env.error
    (lost,) = env.lost_episodes
    assert lost.failure == "error" and "exited with status 4" in lost.error, lost.error
    assert "failed before its first request on purpose" in lost.error  # its stderr

    always = AppScenario(lambda t, llm: 1 / 0, tasks=["x"], verifier=bool, agents=["a"])
    env = GraphEnv(always)
    with pytest.raises(ScenarioError, match=rf"{MAX_LOST_IN_A_ROW} episodes in a row failed"):
        env.reset(seed=0)
    assert len(env.lost_episodes) == MAX_LOST_IN_A_ROW
    assert all("ZeroDivisionError" in x.error for x in env.lost_episodes)


def test_apps_failing_before_their_first_request_count_in_the_error_rate(ray_session, tmp_path):
    """Through ``train()``: every third app start raises before its first request; those
    episodes count in ``charts/error_rate`` with their error, and the run trains on."""
    from configs import grpo_app_config

    from trainers.run.loop import train

    pools = {
        "router": {"model": {"type": "llm", "path": "tiny", "tiny_seed": 0}},
        "worker": {"model": {"type": "llm", "path": "tiny", "tiny_seed": 1}},
    }
    app = "tests.apps.openai_router:flaky_scenario"
    cfg = grpo_app_config(tmp_path, app, pools, ["router"], sharing="role")
    result = train(cfg)
    assert result.status == "completed", result.status
    for row in result.history:
        n = row["charts/episodes"]
        assert n > 4 and 0 < row["charts/error_rate"] < 1, row  # 4 ran, the lost ones too
        assert row["charts/error_rate"] * n == pytest.approx(n - 4)
    (error,) = result.errors
    assert error["kind"] == "error" and "before its first request on purpose" in error["error"]


@pytest.fixture
def release() -> Any:
    """An Event the stuck apps wait on, set at teardown (their threads then end)."""
    import threading

    event = threading.Event()
    yield event
    event.set()


def test_function_apps_that_never_return_are_counted_warned_and_bounded(
    release, monkeypatch, caplog
):
    """``run`` blocks on an Event after its request: each episode times out and leaves its
    thread; the first warns (naming the app and the fix), and once the limit is reached no
    episode starts (``StuckApps``) until the threads return."""
    import logging

    from marl_agents.gateway import app_scenario

    def blocked_app(task: str, llm: Any) -> Any:
        client(llm).chat.completions.create(model="a", messages=[{"role": "user", "content": task}])
        release.wait()

    caplog.set_level(logging.WARNING, logger="marl.gateway")
    # only this test's threads count (other tests' stuck apps may return at any time)
    monkeypatch.setattr(app_scenario, "_STUCK", [])
    monkeypatch.setattr(app_scenario, "MAX_STUCK_APP_THREADS", 2)
    sc = AppScenario(blocked_app, tasks=["t"], verifier=bool, agents=["a"], timeout_s=0.5)
    env = GraphEnv(sc)
    for seed in range(2):
        finish(env, seed)
        assert env.failure == "timeout" and "timeout_s=0.5" in env.error, env.error
    mine = [n for n in app_scenario.stuck_app_threads() if "blocked_app" in n]
    assert len(mine) == 2
    warnings = [r.getMessage() for r in caplog.records if "did not return" in r.getMessage()]
    assert len(warnings) == 1 and "blocked_app" in warnings[0], warnings  # warned once
    assert "AppScenario.command" in warnings[0] and "timeout" in warnings[0]
    with pytest.raises(app_scenario.StuckApps, match=r"never returned.*blocked_app.*command"):
        env.reset(seed=2)
    assert isinstance(app_scenario.StuckApps("x"), MarlError)
    release.set()  # the apps return: their threads end and episodes start again
    for _ in range(600):
        if not [n for n in app_scenario.stuck_app_threads() if "blocked_app" in n]:
            break
        time.sleep(0.05)
    assert not [n for n in app_scenario.stuck_app_threads() if "blocked_app" in n]
    release.clear()
    finish(env, 3)  # runs (and times out again: the app blocks)
    assert env.failure == "timeout"
    release.set()


def test_app_scenario_errors_name_the_fix():
    with pytest.raises(ScenarioError, match="agents="):
        AppScenario(lambda t, llm: 1, tasks=["x"], verifier=bool, agents=[])
    with pytest.raises(ScenarioError, match="not agents"):
        AppScenario(
            lambda t, llm: 1, tasks=["x"], verifier=bool, agents=["a"], model_names={"b": "m"}
        )
    with pytest.raises(ScenarioError, match="run must be a function"):
        AppScenario("python app.py", tasks=["x"], verifier=bool, agents=["a"])
    with pytest.raises(ScenarioError, match="non-empty list"):
        AppScenario.command("python app.py", tasks=["x"], verifier=bool, agents=["a"])


# ----- the same app in process and through the gateway -------------------------------------------
@pytest.fixture(scope="module")
def tiny() -> Any:
    from marl_agents.llm.tiny import make_tiny_model

    return make_tiny_model(seed=0)


def episodes_and_shapley(sc: Any, tiny: Any, seeds: range) -> list[Any]:
    import torch

    from marl_agents.llm.backend import SamplingParams
    from marl_agents.llm.env_chat_model import backend_policy
    from marl_agents.llm.hf_backend import HFBackend
    from trainers.credit.values import shapley_exact

    tok, model = tiny
    policy = backend_policy(HFBackend(model, tok), sc.spaces, SamplingParams(max_new_tokens=2))
    env = GraphEnv(sc)
    out = []
    for seed in seeds:
        torch.manual_seed(seed)
        play(env, seed, policy)
        actions = env.episode_actions()
        trace = [
            (s.agent, s.observation.tolist(), np.asarray(s.action).tolist()) for s in env.trace
        ]
        phi = shapley_exact(
            sc.possible_agents, lambda S, seed=seed, actions=actions: env.value(seed, S, actions)
        )
        out.append((env.outcome.reward, trace, phi))
    return out


def test_shapley_values_equal_the_in_process_chat_app_on_the_same_seeds(tiny):
    from tests.apps.router import app

    absent = {"default_reply": "x"}  # an absent router routes lowercase
    # in-process apps re-tokenise the router's reply the worker sees: so does the gateway here
    gateway = openai_router.scenario(token_fidelity=False, **absent)
    through = episodes_and_shapley(gateway, tiny, range(6))
    in_process = episodes_and_shapley(app(max_prompt_tokens=64, **absent), tiny, range(6))
    assert [r for r, _, _ in through] == [r for r, _, _ in in_process]
    assert [t for _, t, _ in through] == [t for _, t, _ in in_process]  # same prompts, replies
    assert [p for _, _, p in through] == [p for _, _, p in in_process]
    assert any(p["router"] != 0 for _, _, p in through)  # not a trivial game
    assert all(p["worker"] == 0 for _, _, p in through)  # the worker never changes the reward


# ----- training -----------------------------------------------------------------------------------
def trains_with_frozen_pool(
    cfg: Any, trained: str, frozen: str, changes: bool = True
) -> dict[str, Any]:
    """Two iterations of ``cfg``: no failed episode, ``frozen`` bit-identical, ``trained``
    changed (if ``changes``: a group whose rewards tie has no gradient); returns the last
    result."""
    from test_train import learner_weights

    from trainers.algo import to_algorithm_config

    algo = to_algorithm_config(cfg).build_algo()
    try:
        before = learner_weights(algo, frozen), learner_weights(algo, trained)
        for _ in range(2):
            result = algo.train()
            marl = result["env_runners"].get("marl", {})
            assert not marl.get("error") and not marl.get("timeout"), marl
        same = lambda a, b: all(np.array_equal(a[k], b[k]) for k in a)  # noqa: E731
        assert same(learner_weights(algo, frozen), before[0])
        if changes:
            assert not same(learner_weights(algo, trained), before[1])
        return result
    finally:
        algo.stop()


@pytest.mark.parametrize("runners", [0, 1])
def test_the_openai_sdk_app_trains_with_the_router_learning_and_the_worker_frozen(
    ray_session, tmp_path, runners
):
    from configs import grpo_app_config

    llm = {"type": "llm", "path": "tiny"}
    cfg = grpo_app_config(
        tmp_path,
        "tests.apps.openai_router:scenario",
        {
            "router": {"agents": ["router"], "model": {**llm, "tiny_seed": 0}},
            "worker": {"agents": ["worker"], "model": {**llm, "tiny_seed": 1}},
        },
        ["router"],
        resources={"num_env_runners": runners},
    )
    result = trains_with_frozen_pool(cfg, "router", "worker")
    assert result["env_runners"]["num_episodes_lifetime"] >= 8


def test_the_supervisor_tutorial_with_chatopenai_run_as_a_program_trains(ray_session, tmp_path):
    """LangGraph's supervisor tutorial, its models LangChain ``ChatOpenAI`` reading the
    environment, a program per episode: the supervisor learns, the workers stay frozen."""
    pytest.importorskip("langchain_openai")
    from configs import supervisor_tutorial_config

    llm = {"type": "llm", "path": "tiny", "temperature": 1.0}
    scenario = "tests.apps.openai_router:supervisor_tutorial"
    # a random router may loop: our step limit (12 decisions) ends such an episode as a limit
    # episode before the app's own recursion limit (60) makes it raise
    cfg = supervisor_tutorial_config(
        tmp_path,
        llm,
        {**llm, "tiny_seed": 1},
        scenario=scenario,
        scenario_kwargs={"max_supersteps": 12},
    )
    # a binary reward over groups of 2 often ties (no gradient): only the frozen pool is checked
    result = trains_with_frozen_pool(cfg, "router", "workers", changes=False)
    assert result["env_runners"]["num_episodes_lifetime"] >= 8


def test_the_openai_sdk_app_trains_with_shapley_credit_through_train(ray_session, tmp_path):
    from configs import tiny_config

    from trainers.run.loop import train

    cfg = tiny_config(
        tmp_path,
        scenario="tests.apps.openai_router:scenario",
        train=["router"],
        pools={
            "router": {"model": {"type": "llm", "path": "tiny", "tiny_seed": 0}},
            "worker": {"model": {"type": "llm", "path": "tiny", "tiny_seed": 1}},
        },
        algorithm={
            "name": "GRPO",
            "num_epochs": 1,
            "grpo": {"group_size": 2, "groups_per_iteration": 2},
        },
        credit={"method": "shapley", "workers": 1},
        seed=0,
    )
    result = train(cfg)
    assert result.status == "completed", result.status
    assert all(h["charts/episodes"] > 0 and h["charts/error_rate"] == 0 for h in result.history)


def test_the_example_yaml_plans_the_triage_agent_learning_and_the_experts_frozen():
    from trainers.configs.experiment import ExperimentConfig
    from trainers.plan import resolve

    root = Path(__file__).resolve().parents[1]
    cfg = ExperimentConfig.from_yaml((root / "examples" / "openai_app.yaml").read_text())
    plan = resolve(cfg, ray_workers=False, text_defaults=True)  # as `marl run` resolves it
    assert plan.agents == ["triage", "math", "research"]
    assert plan.trainable == ["triage"] and plan.frozen == ["experts"]
    assert plan.cfg.algorithm.name == "GRPO"  # LLM pools: the algorithm by default
    assert cfg.credit.method == "shapley"


def test_the_example_app_hands_off_with_a_forced_tool_call_as_written(tiny):
    """``examples/openai_app.py`` sends ``tools`` + ``tool_choice="required"`` and nothing
    else marl-specific (no prefill, no call completion): an untrained tiny triage policy's
    reply, decoded under the tools' grammar, is a valid handoff the SDK parses."""
    import torch

    from examples.openai_app import RIGHT, scenario
    from marl_agents.llm.env_chat_model import backend_policy
    from marl_agents.llm.hf_backend import HFBackend

    sc = scenario()
    assert not sc.prefill and not sc.complete_calls
    tok, model = tiny
    policy = backend_policy(HFBackend(model, tok), sc.spaces)
    env = GraphEnv(sc)
    for seed in range(2):
        torch.manual_seed(seed)
        play(env, seed, policy)
        assert env.failure is None, env.error
        result = env.final_state["result"]
        assert result["expert"] in ("math", "research"), result  # the call parsed
        assert env.outcome.reward == float(result["expert"] == RIGHT[env.final_state["task"]])


def test_truncate_prompts_keeps_the_last_tokens_as_in_process_apps_do():
    def run(task: str, llm: Any) -> Any:
        r = client(llm).chat.completions.create(
            model="a", messages=[{"role": "user", "content": "word " * 200 + task}]
        )
        return r.usage.prompt_tokens

    sc = AppScenario(
        run, tasks=["go"], verifier=bool, agents=["a"], max_prompt_tokens=32, truncate_prompts=True
    )
    env = GraphEnv(sc)
    obs, _ = env.reset(seed=0)
    assert len(sc.spaces.decode_prompt(obs["a"])) == 32
    env.step({"a": tokens_action(sc.spaces, sc.tokenizer, "ok")})
    assert env.failure is None and env.final_state["result"] == 32


# ----- token fidelity ---------------------------------------------------------------------------
def two_turns(task: str, llm: Any) -> str:
    c = client(llm)
    first = c.chat.completions.create(model="a", messages=[{"role": "user", "content": task}])
    reply = first.choices[0].message.content
    c.chat.completions.create(
        model="a",
        messages=[
            {"role": "user", "content": task},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "more"},
        ],
    )
    return reply


def two_turns_scenario(**kwargs: Any) -> AppScenario:
    """:func:`two_turns` as a one-agent scenario (``kwargs``: more ``AppScenario`` settings)."""
    return AppScenario(
        two_turns,
        tasks=["hi"],
        verifier=bool,
        agents=["a"],
        max_prompt_tokens=96,
        max_new_tokens=8,
        **kwargs,
    )


@pytest.mark.parametrize("fidelity", [True, False])
@pytest.mark.parametrize("canonical", [True, False])
def test_a_reply_sent_back_is_its_sampled_ids_and_drift_is_counted(fidelity, canonical):
    sc = two_turns_scenario(token_fidelity=fidelity)
    tok = sc.tokenizer
    text = "hello"
    retokenized = tok(text, add_special_tokens=False)["input_ids"]
    sampled = retokenized if canonical else [tok.convert_tokens_to_ids(ch) for ch in text]
    assert canonical or sampled != retokenized  # one letter a token: not how it tokenises
    env = GraphEnv(sc)
    obs, _ = env.reset(seed=0)
    action = sc.spaces.encode_action([*sampled, tok.eos_token_id])
    obs, _, _, _, _ = env.step({"a": action})
    second = sc.spaces.decode_prompt(obs["a"])
    env.step({"a": tokens_action(sc.spaces, tok, "ok")})
    assert env.failure is None and env.final_state["result"] == text

    def holds(ids: list[int]) -> bool:
        return any(second[i : i + len(ids)] == ids for i in range(len(second)))

    assert holds(sampled) == (fidelity or canonical)
    assert holds(retokenized) == (canonical or not fidelity)
    metrics = env.outcome.metrics
    if fidelity:
        assert metrics["gateway/retokenized_turns"] == (0 if canonical else 1)
    else:
        assert "gateway/retokenized_turns" not in metrics


def test_a_prefill_function_is_called_once_a_request_and_its_reply_keeps_its_ids():
    """The reply's prefill is the one its prompt ended with: a prefill function is not asked
    again when the reply's ids are kept (a function that answers differently each call, e.g.
    one counting turns, would otherwise lose the reply's sampled ids)."""
    calls: list[int] = []

    def prefill(chat: list[dict[str, Any]]) -> str:
        calls.append(len(chat))
        return f"turn{len(calls)} "

    sc = two_turns_scenario(prefill={"a": prefill})
    tok = sc.tokenizer
    sampled = [tok.convert_tokens_to_ids(ch) for ch in "hello"]  # not how "hello" tokenises
    env = GraphEnv(sc)
    env.reset(seed=0)
    obs, _, _, _, _ = env.step({"a": sc.spaces.encode_action([*sampled, tok.eos_token_id])})
    second = sc.spaces.decode_prompt(obs["a"])
    env.step({"a": tokens_action(sc.spaces, tok, "ok")})
    assert env.failure is None and env.final_state["result"] == "turn1 hello"
    assert calls == [1, 3]  # once for each request (its chat: 1 message, then 3)
    assert any(second[i : i + len(sampled)] == sampled for i in range(len(second)))
    assert env.outcome.metrics["gateway/retokenized_turns"] == 1  # drift found and undone


# ----- async apps, parallel requests, aborted episodes ------------------------------------------
async def gather_run(task: str, llm: Any) -> list[str]:
    """Both agents asked at once (``asyncio.gather``): answered one after the other."""
    import asyncio

    c = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    replies = await asyncio.gather(
        *(
            c.chat.completions.create(
                model=llm.models[a], messages=[{"role": "user", "content": f"{task} {a}"}]
            )
            for a in ("a", "b")
        )
    )
    await c.close()
    return [r.choices[0].message.content for r in replies]


def test_an_async_app_with_parallel_requests_is_one_decision_per_request():
    sc = AppScenario(gather_run, tasks=["t"], verifier=bool, agents=["a", "b"], max_new_tokens=8)
    tok = sc.tokenizer
    env = GraphEnv(sc)
    obs, infos = env.reset(seed=0)
    steps = []
    while env.agents:
        acting = [a for a in env.agents if infos[a]["acting"]]
        steps.append(acting)
        actions = {a: tokens_action(sc.spaces, tok, f"to {a}") for a in env.agents}
        obs, _, _, _, infos = env.step(actions)
    assert env.failure is None, env.error
    assert sorted(a for step in steps for a in step) == ["a", "b"] and len(steps) == 2
    assert env.final_state["result"] == ["to a", "to b"]


def test_a_reset_mid_episode_ends_the_app_and_its_key():
    from marl_agents.gateway.server import gateway

    root = str(Path(__file__).resolve().parents[1])
    sc = openai_router.command_scenario(env={"PYTHONPATH": root}, cwd=root)
    env = GraphEnv(sc)
    before = len(gateway().registry)
    env.reset(seed=0)  # the app waits for the router's reply
    assert len(gateway().registry) == before + 1
    env.reset(seed=1)  # the first episode is aborted: its app killed, its key removed
    assert len(gateway().registry) == before + 1
    env.close()
    assert len(gateway().registry) == before
