"""Every assumption the project makes about LangGraph's internals (1.2): the only module that
touches a private LangGraph name (``tests/test_private_names.py`` checks it).

It lives in the lowest layer so that :mod:`topologies` (importing graphs, generating skeletons)
and :mod:`scenarios` (the bridge, fast replays) share it. Each assumption is pinned by a test in
``tests/test_langgraph_compat.py``, so a LangGraph upgrade that breaks one fails there, naming
it:

1. A run's runner takes its ``submit`` from ``config["configurable"][CONFIG_KEY_RUNNER_SUBMIT]``
   (a callable returning the submit function; :func:`runner_config`), nested runs inherit it
   with the config, and ``submit`` takes the keyword flags in :data:`SUBMIT_FLAGS`.
2. The sync ``PregelRunner.tick`` submits the tasks of its ``tasks`` local (a tuple) in order
   from its own frame (:func:`tick_tasks`), then waits for their futures; a superstep of one
   task runs inline, unsubmitted.
3. A task's ``checkpoint_ns`` is ``node:task_id``, nested with ``|`` (:func:`task_path`,
   :func:`is_nested`); its superstep is ``metadata["langgraph_step"]``.
4. ``RunnableCallable.invoke`` raises for a runnable without a sync function, and ``ainvoke``
   runs ``afunc`` with the same argument injection; ``ToolNode`` is a ``RunnableCallable`` with
   ``tools_by_name``.
5. ``Pregel.ainvoke``/``astream`` take the same arguments as ``invoke``/``stream`` (under them
   LangGraph runs sync nodes in a thread pool, where no decision can be suspended).
6. A node's (or router's) runnable is a ``RunnableCallable`` (``langgraph._internal._runnable``)
   whose ``func``/``afunc`` are the user's functions and whose ``func_accepts``, ``kwargs`` and
   ``explode_args`` say what else it is called with (:func:`plain_function`,
   :func:`wrap_node_functions`); ``coerce_to_runnable`` makes one from a function
   (:func:`runnable_of`).
7. An empty channel holds ``MISSING`` (``langgraph._internal._typing``; :data:`MISSING`), and
   ``Command._update_as_tuples()`` lists a command's state writes (:func:`command_updates`).
8. ``langgraph.pregel._utils.find_subgraph_pregel`` finds the compiled graph a node runs
   (:func:`subgraph_pregel`).
9. ``Pregel.invoke`` runs through ``Pregel.stream(input, config, ...)``, and a ``configurable``
   given to a graph invoked inside a node *replaces* the calling run's (``thread_id`` of its
   own: a root run, no key of ours inherited); ``Pregel.checkpointer`` is the compiled graph's
   saver (``None``/``True``/``False`` when it has none of its own).

:func:`install` patches ``RunnableCallable.invoke`` and ``Pregel.ainvoke``/``astream`` so that,
inside a bridge run, async-only runnables and awaited graphs run on the caller's greenlet, and
``Pregel.stream`` so that every graph run inside a bridge run gets its config from the bridge
(``episode_config``: the run's keys carried into a replaced ``configurable``).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable, Coroutine, Iterable, Mapping
from types import FrameType
from typing import Any

from langgraph._internal import _typing
from langgraph._internal._constants import (
    CONF,
    CONFIG_KEY_CHECKPOINT_NS,
    CONFIG_KEY_RUNNER_SUBMIT,
    NS_END,
    NS_SEP,
)
from langgraph._internal._runnable import RunnableCallable, coerce_to_runnable
from langgraph.config import get_config
from langgraph.pregel import Pregel
from langgraph.pregel._runner import PregelRunner

__all__ = [
    "MISSING",
    "PREGEL_AINVOKE",
    "PREGEL_ASTREAM",
    "SUBMIT_FLAGS",
    "SYNC_INVOKE",
    "TICK_CODE",
    "checkpoint_ns",
    "command_updates",
    "install",
    "is_nested",
    "outermost_tick_step",
    "plain_function",
    "runnable_of",
    "runner_config",
    "subgraph_pregel",
    "task_path",
    "task_step",
    "tick_tasks",
    "wrap_node_functions",
]

#: (2) the code object of the sync runner's ``tick``: a frame running it submits ``tasks``
TICK_CODE = PregelRunner.tick.__code__
#: (1) the keyword flags LangGraph passes to ``submit`` besides the task's own arguments
SUBMIT_FLAGS = ("__name__", "__cancel_on_exit__", "__reraise_on_exit__", "__next_tick__")
#: LangGraph's own methods, before :func:`install` (the patched ones keep them as attributes)
SYNC_INVOKE = getattr(RunnableCallable.invoke, "sync_invoke", RunnableCallable.invoke)
PREGEL_AINVOKE = getattr(Pregel.ainvoke, "async_run", Pregel.ainvoke)
PREGEL_ASTREAM = getattr(Pregel.astream, "async_run", Pregel.astream)
PREGEL_STREAM = getattr(Pregel.stream, "sync_run", Pregel.stream)


# ----- (1) the runner hook ----------------------------------------------------------------
def runner_config(submit: Callable[..., Any]) -> dict[str, Any]:
    """The ``configurable`` entry that makes every (nested) run of a graph submit its parallel
    tasks through ``submit(fn, *args, <SUBMIT_FLAGS>, **kwargs) -> Future``."""
    return {CONFIG_KEY_RUNNER_SUBMIT: lambda: submit}


# ----- (2) the frame read -----------------------------------------------------------------
def tick_tasks(frame: FrameType) -> tuple[Any, ...] | None:
    """The tasks of the parallel superstep that ``frame`` (``submit``'s caller) is submitting;
    ``None`` when the frame is not the runner's ``tick`` (e.g. the functional API's ``call``)."""
    return frame.f_locals["tasks"] if frame.f_code is TICK_CODE else None


def outermost_tick_step(frame: FrameType | None) -> int | None:
    """The superstep of the outermost ``tick`` on the stack from ``frame`` (the top-level
    graph's, seen from inside nested runs); ``None`` outside any parallel superstep."""
    outer = None
    while frame is not None:
        if frame.f_code is TICK_CODE:
            outer = frame
        frame = frame.f_back
    if outer is None or not outer.f_locals.get("tasks"):
        return None
    return task_step(outer.f_locals["tasks"][0].config, 0)


# ----- (3) namespaces and supersteps ------------------------------------------------------
def checkpoint_ns(config: Mapping[str, Any]) -> str:
    """A task's ``checkpoint_ns`` (``""`` outside a task)."""
    return (config.get(CONF) or {}).get(CONFIG_KEY_CHECKPOINT_NS, "")


def is_nested(ns: str) -> bool:
    """Whether a task's namespace is inside a subgraph (a top-level task has one level)."""
    return NS_SEP in ns


def task_path(ns: str) -> str:
    """``"team:ab12|think:cd34"`` → ``"team/think"``."""
    if NS_SEP not in ns:
        return ns.partition(NS_END)[0]
    return "/".join(part.partition(NS_END)[0] for part in ns.split(NS_SEP))


def task_step(config: Mapping[str, Any], default: int | None = None) -> int | None:
    """The LangGraph superstep a task's ``config`` belongs to."""
    step = (config.get("metadata") or {}).get("langgraph_step", default)
    return None if step is None else int(step)


# ----- (4, 5) async runnables and awaited graphs inside a bridge run ----------------------
_tool_node_types: dict[type, bool] = {}


def _is_tool_node(cls: type) -> bool:
    """Whether ``cls`` is LangGraph's ``ToolNode`` (or a subclass); cached per class."""
    known = _tool_node_types.get(cls)
    if known is None:
        module = sys.modules.get("langgraph.prebuilt.tool_node")
        known = module is not None and issubclass(cls, module.ToolNode)
        if module is not None:  # before ToolNode is imported no instance exists: ask again
            _tool_node_types[cls] = known
    return known


def _async_tools(node: Any) -> bool:
    """A ``ToolNode`` with an async tool: its sync path cannot run one (and uses threads)."""
    from langchain_core.tools import BaseTool

    for tool in node.tools_by_name.values():
        coroutine = getattr(tool, "coroutine", BaseTool)
        if coroutine is BaseTool:  # a BaseTool subclass: async when it implements _arun
            if type(tool)._arun is not BaseTool._arun:
                return True
        elif coroutine is not None:
            return True
    return False


def _config_or_empty() -> Mapping[str, Any]:
    try:
        return get_config()
    except RuntimeError:
        return {}


def parent_configurable() -> Mapping[str, Any]:
    """The ``configurable`` of the run the caller is in (empty outside any run)."""
    return _config_or_empty().get(CONF) or {}


def install(
    in_run: Callable[[Mapping[str, Any]], bool],
    run_coroutine: Callable[[Coroutine[Any, Any, Any]], Any],
    episode_config: Callable[[Any, Any], Any] | None = None,
) -> None:
    """Patch LangGraph so that inside a bridge run (``in_run(configurable)``) an async-only
    runnable (or a ``ToolNode`` with async tools) runs its coroutine with ``run_coroutine``,
    and an awaited graph (``ainvoke``/``astream``) runs LangGraph's sync loop; every graph run
    (``stream``, hence ``invoke``) takes its config from ``episode_config(graph, config)``.
    Outside a run LangGraph behaves as its own. Installing again replaces the previous hooks."""

    def running(config: Any) -> bool:
        conf = (config if config is not None else _config_or_empty()).get(CONF) or {}
        return in_run(conf)

    def bridge_invoke(self: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        """``RunnableCallable.invoke``, running the async function where a bridge run needs it."""
        if self.func is not None:  # the common case first: one dict lookup
            tool_node = _tool_node_types.get(type(self))
            if tool_node is False or not (tool_node or _is_tool_node(type(self))):
                return SYNC_INVOKE(self, input, config, **kwargs)
            if not _async_tools(self):
                return SYNC_INVOKE(self, input, config, **kwargs)
        if self.afunc is not None and running(config):  # elsewhere LangGraph's own behaviour
            return run_coroutine(self.ainvoke(input, config, **kwargs))
        return SYNC_INVOKE(self, input, config, **kwargs)

    async def bridge_ainvoke(self: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        """``Pregel.ainvoke``: a graph awaited inside a run runs LangGraph's sync loop, so its
        tasks are stepped like every other (its parallel decisions in one step)."""
        if running(config):
            return self.invoke(input, config, **kwargs)
        return await PREGEL_AINVOKE(self, input, config, **kwargs)

    async def bridge_astream(self: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        """``Pregel.astream``, likewise (the chunks of the sync ``stream``)."""
        if running(config):
            for chunk in self.stream(input, config, **kwargs):
                yield chunk
            return
        async for chunk in PREGEL_ASTREAM(self, input, config, **kwargs):
            yield chunk

    def bridge_stream(self: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        """``Pregel.stream`` with the config ``episode_config`` gives it."""
        if episode_config is not None:
            config = episode_config(self, config)
        return PREGEL_STREAM(self, input, config, **kwargs)

    bridge_stream.sync_run = PREGEL_STREAM  # type: ignore[attr-defined]
    bridge_invoke.sync_invoke = SYNC_INVOKE  # type: ignore[attr-defined]
    bridge_ainvoke.async_run = PREGEL_AINVOKE  # type: ignore[attr-defined]
    bridge_astream.async_run = PREGEL_ASTREAM  # type: ignore[attr-defined]
    RunnableCallable.invoke = bridge_invoke  # type: ignore[method-assign]
    Pregel.ainvoke = bridge_ainvoke  # type: ignore[method-assign,assignment]
    Pregel.astream = bridge_astream  # type: ignore[method-assign,assignment]
    Pregel.stream = bridge_stream  # type: ignore[method-assign,assignment]


# ----- (6) node runnables -----------------------------------------------------------------
def plain_function(runnable: Any) -> Callable[[Any], Any] | None:
    """The function behind a LangGraph node or router, when it takes only the state."""
    if not isinstance(runnable, RunnableCallable) or runnable.func is None:
        return None
    if runnable.func_accepts or runnable.kwargs or runnable.explode_args:
        return None
    return runnable.func  # type: ignore[no-any-return]


def wrap_node_functions(
    builder: Any,
    names: Iterable[str],
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
    awrap: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> Any:
    """A copy of ``builder`` (a ``StateGraph``) whose nodes ``names`` run ``wrap(func)`` (and
    ``awrap(afunc)`` for an async node) instead of their functions. The functions are replaced
    inside copies of the nodes' runnables, so LangGraph's argument injection (config, runtime,
    ...) is unchanged; ``builder`` itself is untouched."""
    builder = copy.copy(builder)
    builder.nodes = dict(builder.nodes)
    for name in names:
        spec = builder.nodes[name]
        runnable = copy.copy(spec.runnable)
        if runnable.func is not None:
            runnable.func = wrap(runnable.func)
        if getattr(runnable, "afunc", None) is not None:  # an async node
            runnable.afunc = awrap(runnable.afunc)
        builder.nodes[name] = dataclasses.replace(spec, runnable=runnable)
    return builder


def runnable_of(fn: Callable[..., Any], name: str) -> Any:
    """``fn`` as LangGraph makes a node's runnable of it (untraced), to call with a config."""
    return coerce_to_runnable(fn, name=name, trace=False)


# ----- (7) channel values and commands ----------------------------------------------------
#: what an empty channel holds (``channel.value``; ``from_checkpoint(MISSING)`` makes a new one)
MISSING: Any = _typing.MISSING


def command_updates(command: Any) -> list[tuple[str, Any]]:
    """The state writes of a ``Command``'s ``update``, as LangGraph applies them."""
    return list(command._update_as_tuples())


# ----- (8) subgraphs ----------------------------------------------------------------------
def subgraph_pregel(runnable: Any) -> Any:
    """The compiled graph a node's runnable runs, as LangGraph itself detects it (``None``:
    none); where LangGraph's helper has moved, the runnable itself (direct subgraph nodes)."""
    try:
        from langgraph.pregel._utils import find_subgraph_pregel
    except ImportError:  # pragma: no cover - private helper moved: direct nodes only
        return runnable
    return find_subgraph_pregel(runnable)
