"""A registered scenario whose tool node fails on purpose, for the failure tests.

``flaky-tool``: ``setup`` (a tool) → ``planner`` (agent) → ``tool`` → ``worker`` (agent).
``fail`` says which episodes fail (``never``, ``always``, or ``sometimes``: tasks 0 of 0…3),
``mode`` how (``raise`` a ``RuntimeError`` or ``hang`` in ``time.sleep(3600)``) and ``where``
(``first``: in ``setup``, before any agent acts; ``mid``: in ``tool``, after the planner);
a hang lasts ``hang_s`` seconds, then the tool raises.
Importing this module registers it, so a subprocess running the CLI can import it first.
"""

from __future__ import annotations

import operator
import time
from typing import Annotated, Any, TypedDict

import gymnasium as gym
import numpy as np
from langgraph.graph import END, START, StateGraph

from scenarios import Outcome, Scenario, decide, register
from topologies import Topology

OBS = gym.spaces.Box(0.0, 10.0, (2,), np.float32)


class FlakyState(TypedDict, total=False):
    task: int
    results: Annotated[list, operator.add]


def flaky_graph(
    fail: str = "never", mode: str = "raise", where: str = "mid", hang_s: float = 3600.0
) -> StateGraph:
    def trouble(state: FlakyState) -> None:
        failing = fail == "always" or (fail == "sometimes" and state["task"] == 0)
        if not failing:
            return
        if mode == "hang":
            time.sleep(hang_s)
        raise RuntimeError(f"tool broke on task {state['task']}")

    def setup(state: FlakyState) -> dict[str, Any]:
        if where == "first":
            trouble(state)
        return {}

    def planner(state: FlakyState) -> dict[str, Any]:
        return {"results": [int(decide("planner", np.array([state["task"], 0], np.float32)))]}

    def tool(state: FlakyState) -> dict[str, Any]:
        if where == "mid":
            trouble(state)
        return {"results": [1]}

    def worker(state: FlakyState) -> dict[str, Any]:
        obs = np.array([state["task"], len(state["results"])], np.float32)
        return {"results": [int(decide("worker", obs))]}

    b = StateGraph(FlakyState)
    b.add_node("setup", setup, metadata={"agent": False})
    b.add_node("planner", planner)
    b.add_node("tool", tool, metadata={"agent": False})
    b.add_node("worker", worker)
    b.add_edge(START, "setup")
    b.add_edge("setup", "planner")
    b.add_edge("planner", "tool")
    b.add_edge("tool", "worker")
    b.add_edge("worker", END)
    return b


@register
class FlakyTool(Scenario):
    """planner → tool → worker; the tool fails on purpose (see the module doc)."""

    name = "flaky-tool"
    topologies = ("graph",)
    default_topology = "graph"

    def __init__(
        self,
        topology: Any = None,
        fail: str = "never",
        mode: str = "raise",
        where: str = "mid",
        hang_s: float = 3600.0,
    ) -> None:
        self.builder = flaky_graph(fail, mode, where, hang_s)
        self.topology = Topology.from_langgraph(self.builder)

    @property
    def possible_agents(self) -> list[str]:
        return ["planner", "worker"]

    def observation_space(self, agent: str) -> gym.Space:
        return OBS

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def build_graph(self) -> StateGraph:
        return self.builder

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        return {"task": int(rng.integers(4)), "results": []}

    def score(self, state: dict[str, Any]) -> Outcome:
        return Outcome(reward=float(sum(state["results"])), success=True)
