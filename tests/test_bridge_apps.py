"""The app patterns users bring, stepped through GraphRun / GraphEnv with scripted decisions.

Real ``langgraph_supervisor.create_supervisor`` / ``langgraph_swarm.create_swarm`` /
``create_react_agent`` apps written as their docs write them, LangGraph's map-reduce how-to (a
``Send`` router with and without ``-> list[Send]``), agents deciding inside nested subgraphs and
in several subgraphs of one parallel superstep, and async apps (``async def`` nodes, routers and
tools, async subgraphs) against their sync twins. The chat model is a fake whose every call is a
``scenarios.decide`` (an action picks a reply from its menu). Every test runs under an alarm:
a deadlock fails the test instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import operator
import re
import signal
import warnings
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal, TypedDict

import gymnasium as gym
import numpy as np
import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Send
from pettingzoo.test import parallel_api_test

from scenarios import Outcome, Scenario, decide
from scenarios.bridge import BridgeError, GraphRun
from scenarios.custom import GraphScenario
from scenarios.graph_env import GraphEnv

TIMEOUT_S = 60
OBS = gym.spaces.Box(0.0, 1000.0, (3,), np.float32)


@pytest.fixture(autouse=True)
def alarm() -> Iterator[None]:
    """Fail a test that runs too long (a deadlocked bridge) instead of hanging the suite."""

    def timeout(signum: int, frame: Any) -> None:
        raise TimeoutError(f"test still running after {TIMEOUT_S} s: a deadlock?")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(TIMEOUT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ----- a chat model answered by decide() -------------------------------------------------------
def first_int(text: Any) -> int:
    found = re.findall(r"\d+", str(text))
    return int(found[0]) if found else 0


class FakeChat(BaseChatModel):
    """A chat model whose reply is ``menu[decide(agent, obs)]``: a text, or ``(tool, args)``.

    The observation is ``[#messages, #tool messages, first number of the first message]``;
    ``_agenerate`` awaits ``io`` seconds of real asyncio sleep, then decides on the caller's
    greenlet (like ``EnvChatModel``).
    """

    agent: str
    menu: list[Any]
    io: float = 0.0

    @property
    def _llm_type(self) -> str:
        return "fake-decide"

    def bind_tools(self, tools: Any, **kwargs: Any) -> FakeChat:
        return self

    def _generate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        obs = np.array(
            [
                len(messages),
                sum(isinstance(m, ToolMessage) for m in messages),
                first_int(messages[0].content if messages else ""),
            ],
            np.float32,
        )
        item = self.menu[int(decide(self.agent, obs))]
        if isinstance(item, str):
            message = AIMessage(item)
        else:  # one call (name, args) or a list of them
            calls = item if isinstance(item, list) else [item]
            message = AIMessage(
                "",
                tool_calls=[
                    {"name": name, "args": args, "id": f"{self.agent}-{len(messages)}-{i}"}
                    for i, (name, args) in enumerate(calls)
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        if self.io:
            await asyncio.sleep(self.io)
        return self._generate(messages, stop, None, **kwargs)


class AppScenario(Scenario):
    """A user's app with agents named by id (``GraphEnv(..., agent_ids=...)``)."""

    name = "app"
    topologies = ("graph",)
    topology = None  # type: ignore[assignment]  # agents by id: GraphEnv does not read it

    def __init__(
        self,
        build: Callable[[], Any],
        agents: list[str],
        n_actions: int,
        score: Callable[[dict], float],
        task: Callable[[np.random.Generator], dict],
        max_supersteps: int = 40,
        spaces: Any = None,
    ) -> None:
        self.build, self.agents = build, agents
        self._score, self._task = score, task
        self.max_supersteps = max_supersteps
        self._obs = spaces.observation_space if spaces else OBS
        self._act = spaces.action_space if spaces else gym.spaces.Discrete(n_actions)

    @property
    def possible_agents(self) -> list[str]:
        return list(self.agents)

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs

    def action_space(self, agent: str) -> gym.Space:
        return self._act

    def build_graph(self) -> Any:
        app = self.build()
        return getattr(app, "builder", app)

    def initial_state(self, rng: np.random.Generator) -> dict:
        return self._task(rng)

    def score(self, state: dict) -> Outcome:
        return Outcome(reward=float(self._score(state)))


def play(env: GraphEnv, script: dict[str, list[int]], seed: int = 0) -> tuple[list, dict]:
    """Step one episode, each agent taking its scripted actions in turn (then 0); returns the
    acting agents of every step and each agent's summed reward."""
    script = {a: list(v) for a, v in script.items()}
    obs, infos = env.reset(seed=seed)
    steps, total = [], {}
    while env.agents:
        acting = [a for a in env.agents if infos[a]["acting"]]
        steps.append(acting)
        base = {a: a.rsplit("_", 1)[0] if a not in script else a for a in acting}
        actions = {a: (script[base[a]] or [0]).pop(0) if base[a] in script else 0 for a in acting}
        obs, rewards, terms, truncs, infos = env.step(actions)
        for a, r in rewards.items():
            total[a] = total.get(a, 0.0) + r
    assert env.error is None, env.error
    return steps, total


def quiet() -> Any:
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore")  # create_react_agent: "moved to langchain.agents"
    return ctx


# ----- create_supervisor with create_react_agent workers (the package's README) --------------
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def web_search(query: str) -> str:
    """Search the web for information."""
    return "Here are the headcounts for each of the FAANG companies in 2024: ..."


def supervisor_app() -> Any:
    from langgraph.prebuilt import create_react_agent
    from langgraph_supervisor import create_supervisor

    def model(agent: str, menu: list[Any]) -> FakeChat:
        return FakeChat(agent=agent, menu=menu)

    ctx = quiet()
    math_agent = create_react_agent(
        model=model("math", ["The product is 12.", ("multiply", {"a": 3, "b": 4})]),
        tools=[add, multiply],
        name="math_expert",
        prompt="You are a math expert. Always use one tool at a time.",
    )
    research_agent = create_react_agent(
        model=model("research", ["Found the headcounts.", ("web_search", {"query": "FAANG"})]),
        tools=[web_search],
        name="research_expert",
        prompt="You are a world class researcher with access to web search. Do not do any math.",
    )
    workflow = create_supervisor(
        [research_agent, math_agent],
        model=model(
            "supervisor",
            [
                "I do not know.",
                ("transfer_to_math_expert", {}),
                ("transfer_to_research_expert", {}),
                "The answer is 12.",
            ],
        ),
        prompt=(
            "You are a team supervisor managing a research expert and a math expert. "
            "For current events, use research_agent. For math problems, use math_agent."
        ),
    )
    ctx.__exit__(None, None, None)
    return workflow


def answered(state: dict, text: str) -> float:
    last = state["messages"][-1]
    return float(isinstance(last, AIMessage) and not last.tool_calls and text in last.content)


def supervisor_env() -> GraphEnv:
    scenario = AppScenario(
        supervisor_app,
        ["supervisor", "math", "research"],
        n_actions=4,
        score=lambda s: answered(s, "12"),
        task=lambda rng: {"messages": [HumanMessage("What is 3 times 4?")]},
    )
    return GraphEnv(scenario, agent_ids=["supervisor", "math", "research"])


SUPERVISOR_SCRIPT = {"supervisor": [1, 2, 3], "math": [1, 0], "research": [1, 0]}


def test_supervisor_app_scripted_episode() -> None:
    env = supervisor_env()
    steps, rewards = play(env, SUPERVISOR_SCRIPT)
    assert steps == [
        ["supervisor"],
        ["math"],
        ["math"],
        ["supervisor"],
        ["research"],
        ["research"],
        ["supervisor"],
    ]
    assert rewards == {"supervisor": 1.0, "math": 1.0, "research": 1.0}
    assert [t.superstep for t in env.trace] == [1, 2, 2, 3, 4, 4, 5]
    msgs = env._run.result["messages"]  # type: ignore[union-attr]
    assert [(type(m).__name__, m.name) for m in msgs if isinstance(m, AIMessage)] == [
        ("AIMessage", "supervisor"),
        ("AIMessage", "math_expert"),  # output_mode="last_message": the worker's answer
        ("AIMessage", "math_expert"),  # ... and its handoff back
        ("AIMessage", "supervisor"),
        ("AIMessage", "research_expert"),
        ("AIMessage", "research_expert"),
        ("AIMessage", "supervisor"),
    ]
    assert msgs[-1].content == "The answer is 12."
    # the worker's tool ran inside its subgraph: its result reached the worker's second call
    # (system prompt, question, handoff call and its ack, multiply call, its result)
    assert env.trace[2].observation.tolist() == [6.0, 2.0, 0.0]
    # counterfactual replays through LangGraph (subgraphs): the full team reproduces the reward
    actions = env.episode_actions()
    assert env.value(0, env.possible_agents, actions) == 1.0
    assert env.value(0, ["math", "research"], actions) == 0.0  # the supervisor gives up
    assert env.value(0, ["supervisor"], actions) == 1.0  # workers answer without their tools


def test_supervisor_app_parallel_api() -> None:
    parallel_api_test(supervisor_env(), num_cycles=30)


# ----- create_swarm with create_agent and handoff tools (the package's README) ----------------
def swarm_app() -> Any:
    from langchain.agents import create_agent
    from langgraph_swarm import create_handoff_tool, create_swarm

    def add_ints(a: int, b: int) -> int:
        """Add two numbers"""
        return a + b

    alice = create_agent(
        FakeChat(
            agent="alice", menu=["Done.", ("add_ints", {"a": 5, "b": 7}), ("transfer_to_bob", {})]
        ),
        tools=[add_ints, create_handoff_tool(agent_name="Bob", description="Transfer to Bob")],
        system_prompt="You are Alice, an addition expert.",
        name="Alice",
    )
    bob = create_agent(
        FakeChat(agent="bob", menu=["Arr, it be 12.", ("transfer_to_alice", {})]),
        tools=[
            create_handoff_tool(
                agent_name="Alice", description="Transfer to Alice, she can help with math"
            )
        ],
        system_prompt="You are Bob, you speak like a pirate.",
        name="Bob",
    )
    return create_swarm([alice, bob], default_active_agent="Alice")


def test_swarm_app_scripted_episode() -> None:
    scenario = AppScenario(
        swarm_app,
        ["alice", "bob"],
        n_actions=3,
        score=lambda s: answered(s, "12"),
        task=lambda rng: {"messages": [HumanMessage("what's 5 + 7?")]},
    )
    env = GraphEnv(scenario, agent_ids=["alice", "bob"])
    # alice hands off to bob, bob hands back, alice adds with her tool, then answers
    steps, rewards = play(env, {"alice": [2, 1, 0], "bob": [1]})
    assert steps == [["alice"], ["bob"], ["alice"], ["alice"]]
    assert rewards == {"alice": 0.0, "bob": 0.0}  # "Done." holds no 12
    state = env._run.result  # type: ignore[union-attr]
    assert state["active_agent"] == "Alice"
    assert [m.content for m in state["messages"] if isinstance(m, ToolMessage)] == [
        "Successfully transferred to Bob",
        "Successfully transferred to Alice",
        "12",
    ]
    steps, rewards = play(env, {"alice": [2], "bob": [0]})  # bob answers
    assert steps == [["alice"], ["bob"]] and rewards == {"alice": 1.0, "bob": 1.0}


def test_react_agent_alone_by_id() -> None:
    from langgraph.prebuilt import create_react_agent

    def app() -> Any:
        ctx = quiet()
        out = create_react_agent(
            FakeChat(agent="assistant", menu=["It is 12.", ("multiply", {"a": 3, "b": 4})]),
            [multiply],
        )
        ctx.__exit__(None, None, None)
        return out

    scenario = AppScenario(
        app,
        ["assistant"],
        2,
        lambda s: answered(s, "12"),
        lambda rng: {"messages": [HumanMessage("3 times 4?")]},
    )
    env = GraphEnv(scenario, agent_ids=["assistant"])
    steps, rewards = play(env, {"assistant": [1, 0]})
    assert steps == [["assistant"], ["assistant"]] and rewards == {"assistant": 1.0}
    assert [t.observation.tolist() for t in env.trace] == [[1, 0, 3], [3, 1, 3]]


def test_react_agent_parallel_tool_calls_by_node() -> None:
    """Two calls in one reply: LangGraph sends one ``tools`` task per call (a fan-out of the
    ``ToolNode``, which is no agent): both run, and only the agent decides."""
    from langgraph.prebuilt import create_react_agent

    calls = [("multiply", {"a": 3, "b": 4}), ("add", {"a": 3, "b": 4})]
    model = FakeChat(agent="agent", menu=["12 and 7.", calls])
    ctx = quiet()
    app = create_react_agent(model, [multiply, add])
    ctx.__exit__(None, None, None)
    env = GraphEnv(
        GraphScenario(
            app,
            observation_space=OBS,
            action_space=gym.spaces.Discrete(2),
            score=lambda s: answered(s, "12"),
            initial_state={"messages": [HumanMessage("3 and 4?")]},
        )
    )
    assert env.possible_agents == ["agent"]  # by node; the ToolNode is no agent
    steps, rewards = play(env, {"agent": [1, 0]})
    assert steps == [["agent"], ["agent"]] and rewards == {"agent": 1.0}
    tool_results = [m.content for m in env._run.result["messages"] if isinstance(m, ToolMessage)]
    assert sorted(tool_results) == ["12.0", "7.0"]


# ----- map-reduce with Send (LangGraph's how-to) -----------------------------------------------
class OverallState(TypedDict, total=False):
    topic: str
    subjects: list[str]
    jokes: Annotated[list, operator.add]
    best_selected_joke: str


class JokeState(TypedDict):
    subject: str


SUBJECTS = ["lions", "tigers", "bears"]


def map_reduce(
    annotated: bool,
    max_instances: int | None = None,
    by_id: str | None = None,
    judge_id: str = "best_joke",
) -> StateGraph:
    """The how-to's graph; each LLM call is a decision (``by_id``: the id the joke node's model
    passes; default: its node name)."""

    def generate_topics(state: OverallState) -> dict:
        n = int(decide("generate_topics", np.array([len(state["topic"]), 0, 0], np.float32)))
        return {"subjects": SUBJECTS[: n + 1]}

    def generate_joke(state: JokeState) -> dict:
        i = SUBJECTS.index(state["subject"])
        k = int(decide(by_id or "generate_joke", np.array([i, 0, 0], np.float32)))
        return {"jokes": [f"joke {k} about {state['subject']}"]}

    def best_joke(state: OverallState) -> dict:
        k = int(decide(judge_id, np.array([len(state["jokes"]), 0, 0], np.float32)))
        return {"best_selected_joke": sorted(state["jokes"])[min(k, len(state["jokes"]) - 1)]}

    def continue_to_jokes(state: OverallState):  # unannotated, as the how-to writes it
        return [Send("generate_joke", {"subject": s}) for s in state["subjects"]]

    def annotated_router(state: OverallState) -> list[Send]:
        return continue_to_jokes(state)

    meta = {"max_instances": max_instances} if max_instances else None
    graph = StateGraph(OverallState)
    graph.add_node("generate_topics", generate_topics)
    graph.add_node("generate_joke", generate_joke, metadata=meta)
    graph.add_node("best_joke", best_joke)
    graph.add_edge(START, "generate_topics")
    router = annotated_router if annotated else continue_to_jokes
    graph.add_conditional_edges("generate_topics", router, ["generate_joke"])
    graph.add_edge("generate_joke", "best_joke")
    graph.add_edge("best_joke", END)
    return graph


def joke_scenario(builder: StateGraph) -> GraphScenario:
    return GraphScenario(
        builder,
        observation_space=OBS,
        action_space=gym.spaces.Discrete(3),
        score=lambda s: float(len(s.get("jokes", []))),
        initial_state={"topic": "animals", "jokes": []},
    )


@pytest.mark.parametrize("annotated", [False, True])
def test_map_reduce_fan_out_without_instances_fails_at_once_naming_the_fix(annotated: bool) -> None:
    env = GraphEnv(joke_scenario(map_reduce(annotated)))
    assert "generate_joke_0" not in env.possible_agents  # one instance declared
    env.reset(seed=0)
    with pytest.raises(
        BridgeError, match=r"node 'generate_joke' runs 2 tasks.*max_instances=1, so"
    ):
        env.step({"generate_topics": 1})  # two Sends: both would act as 'generate_joke'
    assert env._run is not None and env._run.finished  # the run was ended, nothing left hanging
    env.reset(seed=0)  # and the env is usable again: one Send is fine
    obs, rewards, *_ = env.step({"generate_topics": 0})
    assert list(obs) == ["generate_topics", "generate_joke"]


@pytest.mark.parametrize("annotated", [False, True])
def test_map_reduce_instances_by_node(annotated: bool) -> None:
    env = GraphEnv(joke_scenario(map_reduce(annotated, max_instances=3)))
    steps, rewards = play(env, {"generate_topics": [2], "best_joke": [1]})
    jokers = ["generate_joke_0", "generate_joke_1", "generate_joke_2"]
    assert steps == [["generate_topics"], jokers, ["best_joke"]]
    assert [t.observation[0] for t in env.trace[1:4]] == [0, 1, 2]  # scheduling order
    assert env.outcome is not None and env.outcome.reward == 3.0
    with pytest.raises(BridgeError, match=r"runs 3 tasks.*max_instances=2"):
        more = GraphEnv(joke_scenario(map_reduce(annotated, max_instances=2)))
        play(more, {"generate_topics": [2]})


def test_map_reduce_instances_by_id() -> None:
    def scenario() -> AppScenario:
        return AppScenario(
            lambda: map_reduce(False, by_id="joker", judge_id="judge"),
            ["generate_topics", "joker_0", "joker_1", "joker_2", "judge"],
            3,
            lambda s: len(s["jokes"]),
            lambda rng: {"topic": "animals", "jokes": []},
        )

    env = GraphEnv(scenario(), agent_ids={"generate_topics": 1, "joker": 3, "judge": 1})
    env.scenario.build = lambda: map_reduce(False, by_id="joker", judge_id="judge")  # type: ignore[attr-defined]
    steps, rewards = play(env, {"generate_topics": [2], "joker": [1, 2, 0]})
    assert steps == [["generate_topics"], ["joker_0", "joker_1", "joker_2"], ["judge"]]
    assert sorted(env._run.result["jokes"]) == [  # type: ignore[union-attr]
        "joke 0 about bears",
        "joke 1 about lions",
        "joke 2 about tigers",
    ]
    # fast replays name instances as GraphRun does: checked against LangGraph, still trusted
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for members in ([], ["joker_1"], ["generate_topics", "judge"], env.possible_agents):
            env.value(env.seed_used, members, env.episode_actions())
    assert env._fast is not None
    assert env.value(env.seed_used, env.possible_agents, env.episode_actions()) == 3.0
    # one declared instance: the second concurrent decision is an error naming the fix
    run = GraphRun(
        map_reduce(False, by_id="joker", judge_id="judge").compile(),
        {"topic": "x", "jokes": []},
        agent_ids=["generate_topics", "joker", "judge"],
    )
    run.start()
    with pytest.raises(BridgeError, match=r"agent 'joker'.*'generate_joke'.*instances of 'joker'"):
        run.resume({"generate_topics": 1})
    assert run.finished and not run.pending


def test_two_nodes_deciding_as_one_agent_in_one_superstep_is_an_error() -> None:
    g = StateGraph(OverallState)
    g.add_node("left", lambda s: {"jokes": [decide("critic", 0)]})
    g.add_node("right", lambda s: {"jokes": [decide("critic", 1)]})
    g.add_edge(START, "left")
    g.add_edge(START, "right")
    run = GraphRun(g.compile(), {"jokes": []}, agent_ids=["critic"])
    with pytest.raises(BridgeError, match=r"agent 'critic' is asked to decide at node 'right'"):
        run.start()
    assert run.finished
    # by node, two plain nodes asking for one id collide the same way
    run = GraphRun(g.compile(), {"jokes": []}, {})
    with pytest.raises(BridgeError, match="agent 'critic'"):
        run.start()


# ----- agents inside subgraphs ---------------------------------------------------------------
class Log(TypedDict, total=False):
    log: Annotated[list, operator.add]


def deciding(agent: str, tag: str | None = None) -> Callable[[Log], dict]:
    def node(state: Log) -> dict:
        return {"log": [(tag or agent, int(decide(agent, len(state.get("log", [])))))]}

    return node


def test_agent_inside_nested_subgraphs() -> None:
    team = StateGraph(Log)
    team.add_node("member", deciding("deep"))
    team.add_edge(START, "member")
    org = StateGraph(Log)
    org.add_node("team", team.compile())
    org.add_node("lead", deciding("lead"))
    org.add_edge(START, "team")
    org.add_edge("team", "lead")
    outer = StateGraph(Log)
    outer.add_node("boss", deciding("boss"))
    outer.add_node("org", org.compile())
    outer.add_edge(START, "boss")
    outer.add_edge("boss", "org")
    run = GraphRun(outer.compile(), {"log": []}, agent_ids=["boss", "deep", "lead"])
    seen = []
    pending = run.start()
    while not run.finished:
        seen.append([(a, r.path, r.superstep) for a, r in pending.items()])
        pending = run.resume(dict.fromkeys(pending, 1))
    assert seen == [
        [("boss", "boss", 1)],
        [("deep", "org/team/member", 2)],
        [("lead", "org/lead", 2)],
    ]
    # (each subgraph returns its whole state, so LangGraph's reducer adds "boss" again twice)
    assert run.error is None and run.result["log"][-2:] == [("deep", 1), ("lead", 1)]


def two_teams() -> StateGraph:
    """Two subgraph nodes in one superstep; team_a has its own parallel superstep, then a join."""
    a = StateGraph(Log)
    a.add_node("a1", deciding("alice", "a1"))
    a.add_node("a2", deciding("carol"))
    a.add_node("a3", deciding("alice", "a3"))
    a.add_edge(START, "a1")
    a.add_edge(START, "a2")
    a.add_edge(["a1", "a2"], "a3")
    b = StateGraph(Log)
    b.add_node("b1", deciding("bob"))
    b.add_edge(START, "b1")
    outer = StateGraph(Log)
    outer.add_node("team_a", a.compile())
    outer.add_node("team_b", b.compile())
    outer.add_node("judge", deciding("judge"))
    outer.add_edge(START, "team_a")
    outer.add_edge(START, "team_b")
    outer.add_edge(["team_a", "team_b"], "judge")
    return outer


def test_subgraph_agents_of_one_superstep_act_in_one_step() -> None:
    scenario = AppScenario(
        two_teams,
        ["alice", "carol", "bob", "judge"],
        2,
        lambda s: sum(x for _, x in s["log"]),
        lambda rng: {"log": []},
    )
    env = GraphEnv(scenario, agent_ids=scenario.agents)
    steps, rewards = play(env, {"alice": [1, 1], "carol": [1], "bob": [1], "judge": [1]})
    # alice (team_a/a1), carol (team_a/a2) and bob (team_b/b1) are pending together
    assert steps == [["alice", "carol", "bob"], ["alice"], ["judge"]]
    assert [(t.agent, t.superstep) for t in env.trace] == [
        ("alice", 1),
        ("carol", 1),
        ("bob", 1),
        ("alice", 1),
        ("judge", 2),
    ]
    assert env.outcome is not None and env.outcome.reward == 5.0
    assert rewards == dict.fromkeys(scenario.agents, 5.0)
    # by node (team_a, team_b as agent nodes): the same schedule, named after the top nodes
    run = GraphRun(two_teams().compile(), {"log": []}, {"team_b": 1, "judge": 1})
    pending = run.start()
    assert {a: r.path for a, r in pending.items()} == {
        "alice": "team_a/a1",
        "carol": "team_a/a2",
        "team_b": "team_b/b1",
    }
    run.abort()


def test_send_to_react_agent_subgraphs_keeps_each_instance_id() -> None:
    from langgraph.prebuilt import create_react_agent

    def app() -> StateGraph:
        ctx = quiet()
        worker = create_react_agent(
            FakeChat(agent="worker", menu=["Result ready.", ("multiply", {"a": 2, "b": 5})]),
            [multiply],
            name="worker",
        )
        ctx.__exit__(None, None, None)

        def plan(state: Team) -> dict:
            return {}

        def fan_out(state: Team) -> list[Send]:
            return [Send("worker", {"messages": [HumanMessage(f"task {i}")]}) for i in (7, 8)]

        g = StateGraph(Team)
        g.add_node("plan", plan)
        g.add_node("worker", worker)
        g.add_edge(START, "plan")
        g.add_conditional_edges("plan", fan_out, ["worker"])
        g.add_edge("worker", END)
        return g

    scenario = AppScenario(
        app, ["worker_0", "worker_1"], 2, lambda s: len(s["messages"]), lambda rng: {"messages": []}
    )
    env = GraphEnv(scenario, agent_ids={"worker": 2})
    obs, infos = env.reset(seed=0)
    assert env.agents == ["worker_0", "worker_1"]
    assert obs["worker_0"].tolist() == [1, 0, 7] and obs["worker_1"].tolist() == [1, 0, 8]
    obs, *_ = env.step({"worker_0": 1, "worker_1": 0})  # worker_1 answers at once
    assert [a for a in env.agents if _acting(env, a)] == ["worker_0"]
    assert obs["worker_0"].tolist() == [3, 1, 7]  # still the task-7 branch, after its tool
    obs, rewards, terms, *_ = env.step({"worker_0": 0, "worker_1": 0})
    assert all(terms.values()) and rewards == {"worker_0": 6.0, "worker_1": 6.0}  # 4 + 2


class Team(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]


def _acting(env: GraphEnv, agent: str) -> bool:
    return env._run is not None and agent in env._run.pending


# ----- async apps against their sync twins ------------------------------------------------------
class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    notes: Annotated[list, operator.add]
    score: float


def assistant_app(use_async: bool, io: float = 0.01) -> StateGraph:
    """An assistant with tools, then two critics in parallel, then a sync tally node.

    ``use_async``: ``async def`` nodes, router and tools awaiting real asyncio sleeps, the
    models called with ``ainvoke`` (a server-style app); otherwise the same app, sync.
    """
    menu = ["It is 21C in Paris.", ("lookup", {"city": "Paris"}), ("convert", {"celsius": 21})]
    model = FakeChat(agent="assistant", menu=menu, io=io if use_async else 0.0)
    critics = {
        c: FakeChat(agent=c, menu=["reject", "approve"], io=io if use_async else 0.0)
        for c in ("critic_a", "critic_b")
    }

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

        async def assistant(state: Chat, config: RunnableConfig) -> dict:  # server-style
            return {"messages": [await model.ainvoke(state["messages"], config)]}

        async def route(state: Chat) -> Literal["tools", "critics"]:
            await asyncio.sleep(0)
            return "tools" if state["messages"][-1].tool_calls else "critics"

        def critic(name: str) -> Callable[..., Any]:
            async def run(state: Chat) -> dict:
                reply = await critics[name].ainvoke(state["messages"])
                return {"notes": [(name, reply.content)]}

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

        def assistant(state: Chat, config: RunnableConfig) -> dict:
            return {"messages": [model.invoke(state["messages"], config)]}

        def route(state: Chat) -> Literal["tools", "critics"]:
            return "tools" if state["messages"][-1].tool_calls else "critics"

        def critic(name: str) -> Callable[..., Any]:
            def run(state: Chat) -> dict:
                return {"notes": [(name, critics[name].invoke(state["messages"]).content)]}

            return run

    def tally(state: Chat) -> dict:  # a sync node in both twins
        approvals = sum(text == "approve" for _, text in state["notes"])
        return {"score": answered({"messages": state["messages"]}, "21C") + approvals}

    g = StateGraph(Chat)
    g.add_node("assistant", assistant)
    g.add_node("tools", ToolNode([lookup, convert]))
    g.add_node("critics", lambda s: {})
    g.add_node("critic_a", critic("critic_a"))
    g.add_node("critic_b", critic("critic_b"))
    g.add_node("tally", tally)
    g.add_edge(START, "assistant")
    g.add_conditional_edges("assistant", route)
    g.add_edge("tools", "assistant")
    g.add_edge("critics", "critic_a")
    g.add_edge("critics", "critic_b")
    g.add_edge(["critic_a", "critic_b"], "tally")
    return g


ASSISTANT_AGENTS = ["assistant", "critic_a", "critic_b"]


def assistant_env(use_async: bool, io: float = 0.01) -> GraphEnv:
    scenario = AppScenario(
        lambda: assistant_app(use_async, io),
        ASSISTANT_AGENTS,
        3,
        lambda s: s["score"],
        lambda rng: {"messages": [HumanMessage(f"Weather {rng.integers(9)}?")]},
    )
    return GraphEnv(scenario, agent_ids=ASSISTANT_AGENTS)


def test_async_graph_is_an_env_like_its_sync_twin() -> None:
    with pytest.raises(TypeError, match="No synchronous function"):  # LangGraph's own invoke
        assistant_app(True).compile().invoke({"messages": [HumanMessage("hi")]})
    script = {"assistant": [1, 2, 0], "critic_a": [1], "critic_b": [0]}
    runs = {}
    for use_async in (False, True):
        env = assistant_env(use_async)
        steps, rewards = play(env, script, seed=3)
        runs[use_async] = env, steps, rewards
    (sync, s_steps, s_rewards), (asy, a_steps, a_rewards) = runs[False], runs[True]
    assert a_steps == s_steps == [["assistant"]] * 3 + [["critic_a", "critic_b"]]
    assert a_rewards == s_rewards == dict.fromkeys(ASSISTANT_AGENTS, 2.0)
    assert [(t.agent, t.superstep, t.observation.tolist(), t.action) for t in asy.trace] == [
        (t.agent, t.superstep, t.observation.tolist(), t.action) for t in sync.trace
    ]
    msgs = asy._run.result["messages"]  # type: ignore[union-attr]
    assert [m.content for m in msgs if isinstance(m, ToolMessage)] == ["Paris: 21C", "70F"]
    assert [m.content for m in msgs] == [
        m.content
        for m in sync._run.result["messages"]  # type: ignore[union-attr]
    ]
    # counterfactual credit: every coalition's replay value is the sync twin's
    actions = sync.episode_actions()
    coalitions = [[], ["assistant"], ["critic_a"], ["assistant", "critic_b"], ASSISTANT_AGENTS]
    values = {
        use_async: [runs[use_async][0].value(3, c, actions) for c in coalitions]
        for use_async in runs
    }
    # (an absent assistant answers at once, absent critics reject)
    assert values[True] == values[False] == [1.0, 1.0, 2.0, 1.0, 2.0]
    assert asyncio._get_running_loop() is None


def join_app(use_async: bool) -> StateGraph:
    """a and b in parallel, c joins them; by node, async or sync nodes."""

    def make(name: str) -> Callable[..., Any]:
        if use_async:

            async def node(state: Log) -> dict:
                await asyncio.sleep(0.001)
                return {"log": [(name, int(decide(name, len(state.get("log", [])))))]}

            return node
        return deciding(name)

    g = StateGraph(Log)
    for name in "abc":
        g.add_node(name, make(name))
    g.add_edge(START, "a")
    g.add_edge(START, "b")
    g.add_edge(["a", "b"], "c")
    return g


def test_async_nodes_by_node_with_skip_replays() -> None:
    values = {}
    for use_async in (False, True):
        scenario = GraphScenario(
            join_app(use_async),
            observation_space=gym.spaces.Discrete(10),
            action_space=gym.spaces.Discrete(3),
            score=lambda s: float(sum(x for _, x in s["log"])),
            initial_state={"log": []},
            absent="skip",
        )
        env = GraphEnv(scenario)
        steps, rewards = play(env, {"a": [2], "b": [1], "c": [2]})
        assert steps == [["a", "b"], ["c"]] and rewards == dict.fromkeys("abc", 5.0)
        coalitions = [[], ["a"], ["b", "c"], ["a", "b", "c"]]
        values[use_async] = [env.value(0, c, env.episode_actions()) for c in coalitions]
    assert values[True] == values[False] == [0.0, 2.0, 3.0, 5.0]  # skipped nodes write nothing


def test_async_env_parallel_api() -> None:
    parallel_api_test(assistant_env(True, io=0.0), num_cycles=30)


def test_reset_mid_episode_unwinds_suspended_coroutines() -> None:
    env = assistant_env(True)
    env.reset(seed=0)
    env.step({"assistant": 0})  # no tool: both critics are now suspended in their coroutines
    assert env._run is not None and list(env._run.pending) == ["critic_a", "critic_b"]
    first = env._run
    env.reset(seed=1)
    assert first.finished and not first._live and asyncio._get_running_loop() is None
    steps, rewards = play(env, {"assistant": [0], "critic_a": [1], "critic_b": [1]})
    assert steps == [["assistant"], ["critic_a", "critic_b"]] and rewards["assistant"] == 3.0


def test_async_subgraphs_as_nodes_and_awaited() -> None:
    def inner(name: str) -> Any:
        async def think(state: Log) -> dict:
            await asyncio.sleep(0.001)
            return {"log": [(name, int(decide(name, len(state.get("log", [])))))]}

        g = StateGraph(Log)
        g.add_node("think", think)
        g.add_node("check", deciding(f"{name}_check"))  # a sync node inside an async subgraph
        g.add_edge(START, "think")
        g.add_edge(START, "check")
        return g.compile()

    team_b = inner("b")

    async def call_b(state: Log) -> dict:  # a node awaiting a subgraph itself
        out = await team_b.ainvoke({"log": []})
        return {"log": out["log"]}

    g = StateGraph(Log)
    g.add_node("team_a", inner("a"))  # a compiled async subgraph as a node
    g.add_node("call_b", call_b)
    g.add_edge(START, "team_a")
    g.add_edge(START, "call_b")
    agents = ["a", "a_check", "b", "b_check"]
    run = GraphRun(g.compile(), {"log": []}, agent_ids=agents)
    seen = []
    pending = run.start()
    while not run.finished:
        seen.append(sorted(pending))
        pending = run.resume(dict.fromkeys(pending, 1))
    assert run.error is None
    # the awaited graph runs LangGraph's sync loop on the bridge: both subgraphs' parallel
    # supersteps are one step
    assert seen == [["a", "a_check", "b", "b_check"]]
    assert sorted(run.result["log"]) == sorted((a, 1) for a in agents)


def test_decision_in_a_tool_thread_is_an_error_naming_the_fix() -> None:
    helper = FakeChat(agent="helper", menu=["ok"])

    @tool
    def ask_helper(question: str) -> str:
        """Ask the helper agent."""
        return helper.invoke(question).content  # a sync tool: ToolNode runs it in a thread

    model = FakeChat(agent="boss", menu=[("ask_helper", {"question": "why"})])
    g = StateGraph(Chat)
    g.add_node("boss", lambda s: {"messages": [model.invoke(s["messages"])]})
    g.add_node("tools", ToolNode([ask_helper]))
    g.add_edge(START, "boss")
    g.add_edge("boss", "tools")
    run = GraphRun(g.compile(), {"messages": [HumanMessage("go")]}, agent_ids=["boss", "helper"])
    run.start()
    with pytest.raises(BridgeError, match=r"decide\('helper'\).*worker thread.*async def"):
        run.resume({"boss": 0})


def test_env_chat_model_agenerate_decides_on_the_episode_greenlet() -> None:
    pytest.importorskip("transformers")
    from marl_agents.llm.env_chat_model import EnvChatModel, tokens_action
    from scenarios.text_space import TextSpaces, make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    spaces = TextSpaces.for_tokenizer(tok, max_prompt_tokens=128, max_new_tokens=16)
    chats = {a: EnvChatModel(tokenizer=tok, spaces=spaces, agent=a) for a in ("x", "y")}

    def node(agent: str) -> Callable[..., Any]:
        async def run(state: Chat) -> dict:
            await asyncio.sleep(0.001)
            return {"notes": [(agent, (await chats[agent].ainvoke("hello")).content)]}

        return run

    def app() -> StateGraph:
        g = StateGraph(Chat)
        g.add_node("n1", node("x"))
        g.add_node("n2", node("y"))
        g.add_edge(START, "n1")
        g.add_edge(START, "n2")
        return g

    scenario = AppScenario(
        app, ["x", "y"], 0, lambda s: len(s["notes"]), lambda rng: {"notes": []}, spaces=spaces
    )
    env = GraphEnv(scenario, agent_ids=["x", "y"])
    env.reset(seed=0)
    assert env.agents == ["x", "y"]  # both async calls pending in one parallel step
    _, rewards, terms, *_ = env.step({a: tokens_action(spaces, tok, f"from {a}") for a in "xy"})
    assert all(terms.values()) and rewards == {"x": 2.0, "y": 2.0}
    assert sorted(env._run.result["notes"]) == [("x", "from x"), ("y", "from y")]  # type: ignore[union-attr]
    assert [(s.agent, s.generation.text) for s in chats["x"].recorder] == [("x", "from x")]
