"""Tiny scenarios built from real LangGraph graphs of each pattern, for the engine's tests."""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypedDict

import gymnasium as gym
import numpy as np
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send

from scenarios import Outcome, Scenario, decide
from scenarios.custom import GraphScenario
from scenarios.declared import DeclaredSpaces
from topologies import Topology
from topologies.generators import merge_routes

OBS = gym.spaces.Box(0.0, 100.0, (2,), np.float32)


def obs(*xs: float) -> np.ndarray:
    return np.array(xs[:2] + (0.0,) * (2 - len(xs[:2])), dtype=np.float32)


class StarState(TypedDict, total=False):
    task: int
    route: Annotated[dict[str, list[str]], merge_routes]
    results: Annotated[list, operator.add]
    rounds: int


class ToyStar(DeclaredSpaces, Scenario):
    """Orchestrator fans out to every worker for ``rounds`` rounds; reward = sum of actions."""

    name = "toy-star"
    topologies = ("star",)

    def __init__(self, topology: str = "star:3", rounds: int = 2, fail_on: int | None = None):
        self.topology = Topology.from_spec(topology)
        self.rounds = rounds
        self.fail_on = fail_on
        self.agent_spaces = {a: (OBS, gym.spaces.Discrete(3)) for a in self.topology.agent_ids}

    def build_graph(self) -> StateGraph:
        def node_fn(node: str) -> Any:
            def run(state: StarState) -> dict[str, Any]:
                act = decide(node, obs(state.get("rounds", 0), len(state.get("results", []))))
                if self.fail_on is not None and act == self.fail_on:
                    raise RuntimeError(f"{node} failed on action {act}")
                if node == "orchestrator":
                    r = state.get("rounds", 0)
                    workers = self.topology.children(node) if r < self.rounds else []
                    return {"route": {node: workers}, "rounds": r + 1}
                return {"results": [(node, int(act), state["task"])]}

            return run

        return self.topology.to_langgraph(node_fn, StarState)

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        return {"task": int(rng.integers(10)), "rounds": 0}

    def score(self, state: dict[str, Any]) -> Outcome:
        return Outcome(reward=float(sum(a for _, a, _ in state.get("results", []))), success=True)


# ----- user graphs of each LangGraph pattern, wrapped with GraphScenario -----------------------
class MRState(TypedDict, total=False):
    n: int
    results: Annotated[list, operator.add]
    total: int


def map_reduce_graph() -> StateGraph:
    """planner decides how many workers to fan out to with Send; a reducer node sums."""

    def planner(state: MRState) -> dict[str, Any]:
        return {"n": int(decide("planner", obs(state.get("n", 0))))}

    def fan_out(state: MRState) -> list[Send]:
        return [Send("worker", {"n": i}) for i in range(state["n"])]

    def worker(state: MRState) -> dict[str, Any]:
        return {"results": [int(decide("worker", obs(state["n"])))]}

    def reduce(state: MRState) -> dict[str, Any]:
        return {"total": sum(state.get("results", []))}

    b = StateGraph(MRState)
    b.add_node("planner", planner)
    b.add_node("worker", worker, metadata={"max_instances": 3, "role": "worker"})
    b.add_node("reduce", reduce, metadata={"agent": False, "role": "tool"})
    b.add_edge(START, "planner")
    b.add_conditional_edges("planner", fan_out, ["worker"])
    b.add_edge("worker", "reduce")
    b.add_edge("reduce", END)
    return b


def join_graph() -> StateGraph:
    """a and b act in parallel; c waits for both (a join)."""

    def make(name: str) -> Any:
        def run(state: MRState) -> dict[str, Any]:
            return {"results": [int(decide(name, obs(len(state.get("results", [])))))]}

        return run

    b = StateGraph(MRState)
    for name in ("a", "b", "c"):
        b.add_node(name, make(name))
    b.add_edge(START, "a")
    b.add_edge(START, "b")
    b.add_edge(["a", "b"], "c")
    b.add_edge("c", END)
    return b


def handoff_graph() -> StateGraph:
    """alice hands off to bob or ends; bob hands back or ends (Command routing)."""

    def alice(state: MRState) -> Command[Literal["bob", "__end__"]]:
        act = int(decide("alice", obs(len(state.get("results", [])))))
        done = len(state.get("results", [])) >= 4
        return Command(goto=END if done or act == 0 else "bob", update={"results": [act]})

    def bob(state: MRState) -> Command[Literal["alice", "__end__"]]:
        act = int(decide("bob", obs(len(state.get("results", [])))))
        return Command(goto="alice" if act else END, update={"results": [10 * act]})

    b = StateGraph(MRState)
    b.add_node("alice", alice)
    b.add_node("bob", bob)
    b.add_edge(START, "alice")
    return b


def user_scenario(builder: StateGraph, n_actions: int = 3) -> GraphScenario:
    return GraphScenario(
        builder,
        observation_space=OBS,
        action_space=gym.spaces.Discrete(n_actions),
        score=lambda s: float(s.get("total", sum(s.get("results", [])))),
        initial_state={"results": []},
    )
