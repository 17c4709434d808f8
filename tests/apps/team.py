"""A tiny user app named by import references: a class, an instance and factories.

``Echo`` (a ``Scenario`` subclass on ``star:N``): the orchestrator sees a hidden bit and sends a
bit to its workers; each worker sees the message and answers; the team scores the fraction of
workers answering the hidden bit. ``pair`` (a ``GraphScenario`` instance over a hand-written
LangGraph graph): a speaker sees the bit, a listener sees the speaker's word.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import gymnasium as gym
import numpy as np
from langgraph.graph import START, StateGraph

from scenarios import Outcome, Scenario, decide
from scenarios.custom import GraphScenario
from topologies import Topology
from topologies.generators import merge_routes

OBS = gym.spaces.Box(0.0, 1.0, (2,), np.float32)


class EchoState(TypedDict, total=False):
    task: int
    msg: int
    rounds: int
    route: Annotated[dict[str, list[str]], merge_routes]
    answers: Annotated[list, operator.add]


class Echo(Scenario):
    """The orchestrator passes a hidden bit to its workers; reward: workers that echo it."""

    name = "echo-team"
    summary = "tests: the orchestrator relays a hidden bit, workers echo it"
    topologies = ("star",)
    has_oracle = True

    def __init__(self, topology: Any = "star:2", noise: float = 0.0) -> None:
        self.topology = topology if isinstance(topology, Topology) else Topology.from_spec(topology)
        self.noise = noise
        self._actions = {a: gym.spaces.Discrete(2) for a in self.possible_agents}

    @property
    def possible_agents(self) -> list[str]:
        return self.topology.agent_ids

    def observation_space(self, agent: str) -> gym.Space:
        return OBS

    def action_space(self, agent: str) -> gym.Space:
        return self._actions[agent]

    def build_graph(self) -> StateGraph:
        def node_fn(node: str) -> Any:
            def run(state: EchoState) -> dict[str, Any]:
                if node == "orchestrator":
                    view = np.array([state["task"], 0.0], np.float32)
                    act = int(decide(node, view))
                    first = state.get("rounds", 0) == 0
                    workers = self.topology.children(node) if first else []
                    return {"route": {node: workers}, "msg": act, "rounds": 1}
                act = int(decide(node, np.array([state.get("msg", 0), 1.0], np.float32)))
                return {"answers": [act]}

            return run

        return self.topology.to_langgraph(node_fn, EchoState)

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        return {"task": int(rng.integers(2)), "rounds": 0}

    def score(self, state: dict[str, Any]) -> Outcome:
        answers = state.get("answers", [])
        right = sum(int(a == state["task"]) for a in answers)
        reward = right / max(1, len(self.topology.children("orchestrator")))
        return Outcome(reward=float(reward), success=reward == 1.0)

    def oracle_value(self, rng: np.random.Generator) -> float | None:
        return 1.0


def make_echo(topology: Any = "star:2", noise: float = 0.0) -> Echo:
    """A factory taking the topology and scenario_kwargs."""
    return Echo(topology, noise=noise)


class PairState(TypedDict, total=False):
    task: int
    word: int
    answer: int


def pair_graph() -> StateGraph:
    """speaker → listener, a plain LangGraph app whose nodes ask for decisions."""

    def speaker(state: PairState) -> dict[str, Any]:
        return {"word": int(decide("speaker", np.array([state["task"], 0.0], np.float32)))}

    def listener(state: PairState) -> dict[str, Any]:
        return {"answer": int(decide("listener", np.array([state["word"], 1.0], np.float32)))}

    b = StateGraph(PairState).add_sequence([speaker, listener])
    b.add_edge(START, "speaker")
    return b


def app() -> GraphScenario:
    """A zero-argument factory: the user's graph as a scenario."""
    return GraphScenario(
        pair_graph(),
        observation_space=OBS,
        action_space=gym.spaces.Discrete(2),
        score=lambda s: Outcome(reward=float(s.get("answer") == s["task"])),
        initial_state=lambda rng: {"task": int(rng.integers(2))},
    )


#: an instance: used as it is.
pair = app()

# ----- what a reference must not name ----------------------------------------------------------
NOT_A_SCENARIO = 42


def returns_a_number() -> int:
    return 7


class NotAScenario:
    pass
