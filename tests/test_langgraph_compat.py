"""Each LangGraph internal the project relies on, pinned in one place.

The numbers follow :mod:`topologies.langgraph_compat`'s docstring; a LangGraph upgrade that
changes one of them fails here, naming it, before the bridge misbehaves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import operator
import sys
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph._internal._runnable import RunnableCallable
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.channels.last_value import LastValue
from langgraph.graph import START, StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command
from test_bridge_apps import ASSISTANT_AGENTS, AppScenario, assistant_app, two_teams

from scenarios.decisions import run_inline
from topologies import langgraph_compat as lg


class Pin:
    """A bridge answering 1 to every decision."""

    def decide(self, agent: str, observation: Any) -> int:
        return 1

    def emit_reward(self, value: float, agents: Any = None) -> None:
        pass


def run_recording_submits() -> list[dict[str, Any]]:
    """Run ``two_teams`` with a submit that records what LangGraph hands it, from where."""
    calls: list[dict[str, Any]] = []

    def submit(fn: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1)
        tasks = lg.tick_tasks(caller)
        flags = {k for k in kwargs if k.startswith("__")}
        calls.append(
            {
                "from_tick": tasks is not None,
                "tasks": [t.name for t in tasks or ()],
                "task": args[0].name,
                "ns": lg.checkpoint_ns(args[0].config),
                "step": lg.task_step(args[0].config),
                "outer_step": lg.outermost_tick_step(caller),
                "flags": flags,
            }
        )
        kwargs = {k: v for k, v in kwargs.items() if k not in flags}
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(fn(*args, **kwargs))
        return fut

    configurable = {**lg.runner_config(submit), "__marl_bridge__": Pin()}
    two_teams().compile().invoke({"log": []}, {"configurable": configurable})
    return calls


def test_1_runner_submit_hook_is_inherited_by_nested_runs_and_takes_known_flags() -> None:
    calls = run_recording_submits()
    # every parallel superstep, nested ones included, goes through the configured submit
    assert [c["task"] for c in calls] == ["team_a", "a1", "a2", "team_b"]
    assert set().union(*(c["flags"] for c in calls)) <= set(lg.SUBMIT_FLAGS)
    from langgraph.pregel._executor import BackgroundExecutor

    params = inspect.signature(BackgroundExecutor.submit).parameters
    assert set(lg.SUBMIT_FLAGS) <= params.keys()
    assert all(params[f].kind is inspect.Parameter.KEYWORD_ONLY for f in lg.SUBMIT_FLAGS)


def test_2_tick_submits_its_tasks_tuple_in_order_lone_supersteps_inline() -> None:
    calls = run_recording_submits()
    # from PregelRunner.tick, in the order of its `tasks` tuple; the lone superstep (the judge)
    # and team_b's single task run inline, unsubmitted
    assert [(c["from_tick"], c["tasks"], c["task"]) for c in calls] == [
        (True, ["team_a", "team_b"], "team_a"),
        (True, ["a1", "a2"], "a1"),
        (True, ["a1", "a2"], "a2"),
        (True, ["team_a", "team_b"], "team_b"),
    ]
    assert lg.tick_tasks(sys._getframe()) is None  # any other frame
    assert lg.outermost_tick_step(sys._getframe()) is None


def test_3_namespaces_and_supersteps() -> None:
    calls = run_recording_submits()
    top, nested = calls[0]["ns"], calls[1]["ns"]
    assert not lg.is_nested(top) and top.startswith("team_a:")
    assert lg.is_nested(nested) and nested.startswith(top + "|" + "a1:")
    assert lg.task_path(top) == "team_a" and lg.task_path(nested) == "team_a/a1"
    # a nested task's own step counts inside its subgraph; the outermost tick gives the top's
    assert calls[0]["step"] == 1 and calls[0]["outer_step"] == 1
    assert calls[1]["outer_step"] == 1
    assert lg.task_step({}, 7) == 7 and lg.task_step({}) is None


def test_4_async_only_runnables() -> None:
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    node = RunnableCallable(None, double)
    with pytest.raises(TypeError, match="No synchronous function"):  # unchanged outside runs
        node.invoke(2)
    assert asyncio.run(node.ainvoke(2)) == 4
    assert RunnableCallable.invoke.sync_invoke is lg.SYNC_INVOKE  # our hook is installed
    from langgraph.prebuilt import ToolNode

    assert issubclass(ToolNode, RunnableCallable)
    assert "tools_by_name" in dir(ToolNode([]))
    # inside a marl run (here run_inline) the coroutine runs on the caller's greenlet
    scenario = AppScenario(
        lambda: assistant_app(True, io=0.001),
        ASSISTANT_AGENTS,
        3,
        lambda s: s["score"],
        lambda rng: {"messages": [HumanMessage("x")]},
    )
    state, outcome, decisions = run_inline(scenario, lambda a, o: 1 if a != "assistant" else 0, 0)
    assert decisions == 3 and outcome.reward == 3.0  # the answer and two approvals


def test_5_pregel_async_entry_points_take_the_sync_ones_arguments() -> None:
    for sync, async_ in ((Pregel.invoke, lg.PREGEL_AINVOKE), (lg.PREGEL_STREAM, lg.PREGEL_ASTREAM)):
        assert list(inspect.signature(sync).parameters) == list(
            inspect.signature(async_).parameters
        )
    assert Pregel.ainvoke.async_run is lg.PREGEL_AINVOKE  # our hook is installed
    assert Pregel.astream.async_run is lg.PREGEL_ASTREAM


class _S(TypedDict):
    x: Annotated[list[int], operator.add]
    y: int


def _plain(state: _S) -> dict[str, Any]:
    return {"x": [1], "y": 2}


def _with_config(state: _S, config: RunnableConfig) -> dict[str, Any]:
    return {"x": [config["configurable"]["k"]]}


def test_6_node_runnables_are_runnable_callables() -> None:
    builder = StateGraph(_S)
    builder.add_node("plain", _plain)
    builder.add_node("configured", _with_config)
    builder.add_edge(START, "plain")
    builder.add_edge("plain", "configured")
    spec = builder.nodes
    assert isinstance(spec["plain"].runnable, RunnableCallable)
    assert lg.plain_function(spec["plain"].runnable) is _plain
    assert lg.plain_function(spec["configured"].runnable) is None  # takes the config
    assert lg.plain_function(_plain) is None  # not a runnable at all
    # wrapping replaces the functions inside copies; the builder and its runnables are untouched
    seen: list[str] = []

    def wrap(func: Any) -> Any:
        def node(*args: Any, **kwargs: Any) -> Any:
            seen.append(func.__name__)
            return func(*args, **kwargs)

        return node

    wrapped = lg.wrap_node_functions(builder, ["plain", "configured"], wrap, wrap)
    assert builder.nodes["plain"].runnable.func is _plain
    out = wrapped.compile().invoke({"x": [], "y": 0}, {"configurable": {"k": 7}})
    assert seen == ["_plain", "_with_config"]
    assert out == {"x": [1, 7], "y": 2}  # the config is still injected

    # an async node: its afunc is wrapped too
    async def anode(state: _S) -> dict[str, Any]:
        return {"y": 5}

    abuilder = StateGraph(_S)
    abuilder.add_node("a", anode)
    abuilder.add_edge(START, "a")
    awrapped = lg.wrap_node_functions(abuilder, ["a"], wrap, lambda f: f)
    assert awrapped.nodes["a"].runnable.afunc is anode
    # runnable_of: a function as a node's runnable, called with the run's config
    runnable = lg.runnable_of(_with_config, "configured")
    assert runnable.invoke({"x": []}, {"configurable": {"k": 3}}) == {"x": [3]}


def test_7_empty_channels_hold_missing_and_command_updates() -> None:
    compiled = StateGraph(_S).add_node("plain", _plain).add_edge(START, "plain").compile()
    last, summed = compiled.channels["y"], compiled.channels["x"]
    assert type(last) is LastValue and type(summed) is BinaryOperatorAggregate
    assert last.from_checkpoint(lg.MISSING).value is lg.MISSING  # empty until written
    assert summed.from_checkpoint(lg.MISSING).value == []  # a reducer's initial value
    assert lg.command_updates(Command(update={"y": 1, "x": [2]})) == [("y", 1), ("x", [2])]
    assert lg.command_updates(Command(goto="plain")) == []


def test_8_find_subgraph_pregel_finds_a_nodes_compiled_graph() -> None:
    inner = StateGraph(_S).add_node("plain", _plain).add_edge(START, "plain").compile()
    outer = StateGraph(_S)
    outer.add_node("team", inner)
    outer.add_node("plain", _plain)
    outer.add_edge(START, "team")
    outer.add_edge("team", "plain")
    assert lg.subgraph_pregel(outer.nodes["team"].runnable) is inner
    assert lg.subgraph_pregel(outer.nodes["plain"].runnable) is None


def test_9_a_nested_invoke_with_its_own_configurable_replaces_the_callers() -> None:
    import inspect as _inspect

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    assert "self.stream(" in _inspect.getsource(Pregel.invoke)  # invoke runs through stream
    assert Pregel.stream.sync_run is lg.PREGEL_STREAM  # our hook is installed

    class S(TypedDict):
        seen: list

    def look(state: S) -> dict:
        return {"seen": sorted(lg.parent_configurable())}

    inner = StateGraph(S)
    inner.add_node("look", look)
    inner.add_edge(START, "look")
    saver = InMemorySaver()
    graph = inner.compile(checkpointer=saver)
    assert graph.checkpointer is saver and inner.compile().checkpointer is None

    def outer_node(state: S) -> dict:
        return graph.invoke({"seen": []}, {"configurable": {"thread_id": "1"}})

    outer = StateGraph(S)
    outer.add_node("outer", outer_node)
    outer.add_edge(START, "outer")
    seen = outer.compile().invoke({"seen": []}, {"configurable": {"mine": 1}})["seen"]
    assert "thread_id" in seen and "mine" not in seen  # replaced, not merged
