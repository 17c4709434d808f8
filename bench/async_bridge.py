"""Decisions/s of the bridge on app patterns: an async app against its sync twin, and a
``create_supervisor`` app through GraphEnv against running it inline.

Each LLM call of the apps is one decision (a fake chat model asks ``scenarios.decide`` and
replies with a scripted menu item), so the numbers are the bridge's and LangGraph's overhead:

* **assistant** (an assistant with a ``ToolNode``, then two critics in parallel, then a sync
  tally; 5 decisions an episode), in two twins: ``async def`` nodes/router/tools calling
  ``ainvoke`` (a server-style app), and the same app sync. Played
  - *inline*: the graph run directly with the policy answering in place (the sync twin with
    ``invoke``; the async twin with LangGraph's own ``ainvoke``, one event loop per episode);
  - *GraphEnv*: ``reset``/``step`` through the greenlet bridge (agents by id; the async twin's
    coroutines run on event loops inside the tasks' greenlets).
* **supervisor**: ``create_supervisor`` over two ``create_react_agent`` workers with tools and
  handoffs (7 decisions an episode), GraphEnv against ``scenarios.engine.run_inline``.

Prints decisions/s and time ratios per decision. Usage:
``python bench/async_bridge.py [--episodes N] [--io SECONDS]`` (``--io`` adds a real
``asyncio.sleep`` to every async call: it then dominates, and the ratios show what the bridge's
serialisation of parallel async I/O costs).
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import time
import warnings
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypedDict

import gymnasium as gym
import numpy as np
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

from scenarios import Outcome, Scenario, decide
from scenarios.bridge import _PREGEL_AINVOKE, BRIDGE_KEY
from scenarios.engine import GraphEnv, InlineBridge, run_inline

OBS = gym.spaces.Box(0.0, 1000.0, (2,), np.float32)


class MenuChat(BaseChatModel):
    """Replies ``menu[decide(agent, [#messages, #tool messages])]`` (a text or a tool call)."""

    agent: str
    menu: list[Any]
    io: float = 0.0

    @property
    def _llm_type(self) -> str:
        return "menu"

    def bind_tools(self, tools: Any, **kwargs: Any) -> MenuChat:
        return self

    def _generate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        n_tools = sum(isinstance(m, ToolMessage) for m in messages)
        item = self.menu[int(decide(self.agent, np.array([len(messages), n_tools], np.float32)))]
        if isinstance(item, str):
            msg = AIMessage(item)
        else:
            call = {"name": item[0], "args": item[1], "id": f"{self.agent}-{len(messages)}"}
            msg = AIMessage("", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=msg)])

    async def _agenerate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        if self.io:
            await asyncio.sleep(self.io)
        return self._generate(messages, stop, None, **kwargs)


class AppScenario(Scenario):
    name = "bench-app"
    topologies = ("graph",)
    topology = None  # type: ignore[assignment]  # agents by id

    def __init__(
        self,
        build: Callable[[], Any],
        agents: list[str],
        n_actions: int,
        score: Callable[[dict], float],
        task: dict,
    ) -> None:
        self.build, self.agents, self.n_actions = build, agents, n_actions
        self._score, self._task = score, task

    @property
    def possible_agents(self) -> list[str]:
        return list(self.agents)

    def observation_space(self, agent: str) -> gym.Space:
        return OBS

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(self.n_actions)

    def build_graph(self) -> Any:
        return self.build()

    def initial_state(self, rng: np.random.Generator) -> dict:
        return dict(self._task)

    def score(self, state: dict) -> Outcome:
        return Outcome(reward=float(self._score(state)))


def answered(state: dict, text: str) -> float:
    last = state["messages"][-1]
    return float(isinstance(last, AIMessage) and not last.tool_calls and text in last.content)


# ----- the assistant app, async and sync -------------------------------------------------------
class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    notes: Annotated[list, operator.add]
    score: float


def assistant_app(use_async: bool, io: float) -> StateGraph:
    menu = ["It is 21C in Paris.", ("lookup", {"city": "Paris"}), ("convert", {"celsius": 21})]
    model = MenuChat(agent="assistant", menu=menu, io=io)
    critics = {c: MenuChat(agent=c, menu=["reject", "approve"], io=io) for c in ("ca", "cb")}
    if use_async:

        @tool
        async def lookup(city: str) -> str:
            """Look up the weather in a city."""
            await asyncio.sleep(io)
            return f"{city}: 21C"

        @tool
        async def convert(celsius: float) -> str:
            """Convert Celsius to Fahrenheit."""
            await asyncio.sleep(io)
            return f"{celsius * 9 / 5 + 32:.0f}F"

        async def assistant(state: Chat) -> dict:
            return {"messages": [await model.ainvoke(state["messages"])]}

        async def route(state: Chat) -> Literal["tools", "critics"]:
            return "tools" if state["messages"][-1].tool_calls else "critics"

        def critic(name: str) -> Callable[..., Any]:
            async def run(state: Chat) -> dict:
                return {"notes": [(name, (await critics[name].ainvoke(state["messages"])).content)]}

            return run

    else:

        @tool
        def lookup(city: str) -> str:
            """Look up the weather in a city."""
            return f"{city}: 21C"

        @tool
        def convert(celsius: float) -> str:
            """Convert Celsius to Fahrenheit."""
            return f"{celsius * 9 / 5 + 32:.0f}F"

        def assistant(state: Chat) -> dict:
            return {"messages": [model.invoke(state["messages"])]}

        def route(state: Chat) -> Literal["tools", "critics"]:
            return "tools" if state["messages"][-1].tool_calls else "critics"

        def critic(name: str) -> Callable[..., Any]:
            def run(state: Chat) -> dict:
                return {"notes": [(name, critics[name].invoke(state["messages"]).content)]}

            return run

    def tally(state: Chat) -> dict:
        approvals = sum(text == "approve" for _, text in state["notes"])
        return {"score": answered(state, "21C") + approvals}

    g = StateGraph(Chat)
    g.add_node("assistant", assistant)
    g.add_node("tools", ToolNode([lookup, convert]))
    g.add_node("critics", lambda s: {})
    g.add_node("ca", critic("ca"))
    g.add_node("cb", critic("cb"))
    g.add_node("tally", tally)
    g.add_edge(START, "assistant")
    g.add_conditional_edges("assistant", route)
    g.add_edge("tools", "assistant")
    g.add_edge("critics", "ca")
    g.add_edge("critics", "cb")
    g.add_edge(["ca", "cb"], "tally")
    return g


ASSISTANT = {"assistant": [1, 2, 0], "ca": [1], "cb": [0]}


# ----- create_supervisor over create_react_agent workers ------------------------------------------
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def web_search(query: str) -> str:
    """Search the web for information."""
    return "Here are the headcounts for each of the FAANG companies in 2024: ..."


def supervisor_app() -> StateGraph:
    from langgraph.prebuilt import create_react_agent
    from langgraph_supervisor import create_supervisor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent moved to langchain.agents
        math = create_react_agent(
            MenuChat(agent="math", menu=["12.", ("multiply", {"a": 3, "b": 4})]),
            tools=[add, multiply],
            name="math_expert",
            prompt="You are a math expert.",
        )
        research = create_react_agent(
            MenuChat(agent="research", menu=["Found it.", ("web_search", {"query": "x"})]),
            tools=[web_search],
            name="research_expert",
            prompt="You are a researcher.",
        )
        return create_supervisor(
            [research, math],
            model=MenuChat(
                agent="supervisor",
                menu=[
                    "I do not know.",
                    ("transfer_to_math_expert", {}),
                    ("transfer_to_research_expert", {}),
                    "The answer is 12.",
                ],
            ),
            prompt="You are a team supervisor managing a research expert and a math expert.",
        )


SUPERVISOR = {"supervisor": [1, 2, 3], "math": [1, 0], "research": [1, 0]}


# ----- timing ----------------------------------------------------------------------------------
def scripted(script: dict[str, list[int]]) -> Callable[[str, Any], int]:
    """The same policy for every way of running: each agent's k-th decision takes its k-th
    scripted action (then 0)."""
    counts: dict[str, int] = {}

    def act(agent: str, obs: Any) -> int:
        k = counts[agent] = counts.get(agent, 0) + 1
        seq = script.get(agent, [])
        return seq[k - 1] if k <= len(seq) else 0

    return act


def time_env(env: GraphEnv, script: dict[str, list[int]], episodes: int) -> tuple[float, int]:
    n = 0
    t0 = time.perf_counter()
    for s in range(episodes):
        act = scripted(script)
        obs, infos = env.reset(seed=s)
        while env.agents:
            acting = {a: act(a, obs[a]) for a in env.agents if infos[a]["acting"]}
            n += len(acting)
            obs, _, _, _, infos = env.step(acting)
    return time.perf_counter() - t0, n


def time_inline(
    scenario: AppScenario, script: dict[str, list[int]], episodes: int, use_ainvoke: bool = False
) -> tuple[float, int]:
    graph = scenario.build_graph().compile()
    n = 0
    t0 = time.perf_counter()
    for s in range(episodes):
        if use_ainvoke:  # LangGraph's own async runtime (not the bridge's sync emulation)
            bridge = InlineBridge(scripted(script))
            config = {"configurable": {BRIDGE_KEY: bridge}, "recursion_limit": 100}
            asyncio.run(_PREGEL_AINVOKE(graph, scenario.initial_state(None), config))
            n += bridge.decisions
        else:
            n += run_inline(scenario, scripted(script), s, graph=graph)[2]
    return time.perf_counter() - t0, n


def row(name: str, t: float, n: int, base: tuple[float, int] | None) -> None:
    ratio = f"{t / n / (base[0] / base[1]):>8.2f}x" if base else f"{'':>9}"
    print(f"{name:<48} {n:>9} {n / t:>10.0f} {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--io", type=float, default=0.0)
    args = parser.parse_args()
    e, io = args.episodes, args.io
    agents = ["assistant", "ca", "cb"]

    def assistant(use_async: bool) -> AppScenario:
        return AppScenario(
            lambda: assistant_app(use_async, io if use_async else 0.0),
            agents,
            3,
            lambda s: s["score"],
            {"messages": [HumanMessage("Weather?")]},
        )

    sync_s, async_s = assistant(False), assistant(True)
    for s in (sync_s, async_s):  # warm up (imports, loop pool)
        time_env(GraphEnv(s, agent_ids=agents), ASSISTANT, 3)
    print(f"{'case':<48} {'decisions':>9} {'decisions/s':>10} {'ratio':>9}")
    for label, script in (("tools", ASSISTANT), ("no tools", {"ca": [1]})):
        sync_inline = time_inline(sync_s, script, e)
        row(f"assistant ({label}), sync twin, inline invoke", *sync_inline, None)
        sync_env = time_env(GraphEnv(sync_s, agent_ids=agents), script, e)
        row("  sync twin, GraphEnv    (/sync inline)", *sync_env, sync_inline)
        async_inline = time_inline(async_s, script, e, use_ainvoke=True)
        row("  async app, inline ainvoke", *async_inline, None)
        async_env = time_env(GraphEnv(async_s, agent_ids=agents), script, e)
        row("  async app, GraphEnv    (/async inline)", *async_env, async_inline)
        row("  async app, GraphEnv    (/sync GraphEnv)", *async_env, sync_env)

    sup = AppScenario(
        supervisor_app,
        ["supervisor", "math", "research"],
        4,
        lambda s: answered(s, "12"),
        {"messages": [HumanMessage("3 times 4?")]},
    )
    time_env(GraphEnv(sup, agent_ids=sup.agents), SUPERVISOR, 3)
    sup_inline = time_inline(sup, SUPERVISOR, e)
    row("create_supervisor, inline (run_inline)", *sup_inline, None)
    sup_env = time_env(GraphEnv(sup, agent_ids=sup.agents), SUPERVISOR, e)
    row("  GraphEnv              (/inline)", *sup_env, sup_inline)


if __name__ == "__main__":
    main()
