"""A LangGraph app built from chat models, as a text scenario: no subclassing, no rewrite.

The user gives three things:

* ``build_app(models)``: builds the app (a ``StateGraph`` or a compiled graph — a
  ``create_supervisor`` team, a swarm, a ReAct agent, your own graph) from a mapping
  agent id → chat model. Each model handed in is an
  :class:`~marl_agents.llm.env_chat_model.EnvChatModel` bound to its agent id, so every call
  of that model, wherever it happens (inside a subgraph, a ``Send`` instance, an async node),
  is one decision of that agent.
* ``tasks``: a function ``rng → input`` or a sequence of inputs (one is drawn per episode); an
  input is the graph's input dict, or a string (→ ``{"messages": [HumanMessage(text)]}``).
* ``verifier``: final state → :class:`~scenarios.base.Outcome`, a float or a bool.

Agents are the keys ``build_app`` reads from the mapping (or ``agents=``). Roles come from the
app's structure where it says so (the entry agent that routes to other agents is the
``orchestrator``, its targets are workers; pooled by role), else ``agent`` with a pool of its
own per agent (one policy each); ``roles=`` overrides. An agent
absent from a counterfactual coalition (loo / Shapley credit) answers ``default_reply``.

Example:
    >>> from langgraph.prebuilt import create_react_agent            # doctest: +SKIP
    >>> scenario = ChatAppScenario(
    ...     lambda models: create_react_agent(models["assistant"], [multiply]),
    ...     tasks=["What is 6 times 7?"],
    ...     verifier=lambda state: "42" in state["messages"][-1].content,
    ... )                                                              # doctest: +SKIP
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from scenarios.base import Outcome, Scenario, ScenarioError
from scenarios.text_space import TextSpaces, load_tokenizer
from topologies import Topology
from topologies.langgraph_import import infer_roles
from topologies.topology import END, ROLES, START

Task = Mapping[str, Any] | str
TaskSource = Callable[[np.random.Generator], Task] | Sequence[Task]

#: channel kinds along which an agent hands work to another (routing, not a plain pipeline)
_ROUTING = ("conditional", "command", "send")


class ChatAppScenario(Scenario):
    """A chat-model LangGraph app as a Dec-POMDP whose agents are its LLM calls.

    Args:
        build_app: ``models → app`` (a ``StateGraph`` builder or a compiled graph), called once
            per scenario instance with a mapping agent id → chat model.
        tasks: ``rng → input`` or a sequence of inputs (one drawn at random per episode); a
            string input becomes ``{"messages": [HumanMessage(text)]}``.
        verifier: final state → ``Outcome`` | float | bool (``True`` is reward 1 and success).
        agents: the agent ids, in order; default: the keys ``build_app`` reads.
        roles: agent id → role, over the inferred ones.
        instances: agent id → parallel instances (a ``Send`` fan-out calling one agent's model
            several times in one superstep: ids ``<agent>_<i>``).
        default_reply: what an absent agent answers (text, or agent id → text).
        prefill: text a reply of an agent starts with (agent id → text, or → a function of the
            prompt's chat dicts returning the text, e.g. to prefill the first turn only): the
            policy continues it (``'<tool>{"name": "transfer_to_'`` constrains a supervisor to
            a handoff). The prompt ends with it; the app sees ``prefill + generated text``.
        tokenizer: ``"tiny"`` or a tokenizer directory: the LLM pools' tokenizer.
        max_prompt_tokens: observation length, 512 by default: a longer prompt keeps its
            system message and its newest tokens (:mod:`marl_agents.llm.prompt_fit`). The tiny
            tokenizer takes about a token a character: LangGraph's supervisor tutorial's first
            prompt (instructions and the ``Router`` schema) is 415 tokens; the tiny model's
            context is 1,024 tokens for prompt and reply together.
        max_new_tokens: action length (the generation budget of a reply), 64 by default: the
            supervisor tutorial's ``Router`` call is 29–31 tokens in the tokenizer's merges
            and longer as sampled (32 cut one at ``{"next": "FI``).
        format_penalty: reward (≥ 0, subtracted) for a reply with a malformed tool call.
        complete_calls: complete an unfinished call whose name so far picks exactly one bound
            tool (:func:`scenarios.toolcalls.complete_call`): with a ``prefill`` opening a
            handoff, one generated letter picks the worker.
        max_supersteps: LangGraph recursion limit of an episode (also its decision cap), 64
            by default.
        score_limit: an episode cut off by the recursion limit is scored by the verifier on the
            state the graph reached (partial credit, e.g. for the first route of a supervisor
            that never says FINISH); off, such an episode earns 0. Either way it counts in
            ``charts/truncated`` and ``charts/limit_rate``.
        name: the scenario's name in run names and reports.
    """

    name = "chat-app"
    topologies = ("graph",)
    absent = "default"

    agents_by_id = True  # an agent decides wherever its model is called
    has_text_agents = True

    def __init__(
        self,
        build_app: Callable[[Mapping[str, Any]], Any],
        *,
        tasks: TaskSource,
        verifier: Callable[[dict[str, Any]], Outcome | float | bool],
        agents: Sequence[str] | None = None,
        roles: Mapping[str, str] | None = None,
        instances: Mapping[str, int] | None = None,
        default_reply: str | Mapping[str, str] = "",
        prefill: Mapping[str, str | Callable[[list[dict[str, Any]]], str]] | None = None,
        tokenizer: Any = "tiny",
        max_prompt_tokens: int = 512,
        max_new_tokens: int = 64,
        format_penalty: float = 0.0,
        complete_calls: bool = False,
        max_supersteps: int = 64,
        score_limit: bool = False,
        name: str | None = None,
    ) -> None:
        if not callable(build_app):
            raise ScenarioError("build_app must be a function models → app (a LangGraph graph)")
        if not callable(verifier):
            raise ScenarioError("verifier must be a function final state → Outcome/float/bool")
        if name is not None:
            self.name = str(name)
        self.tokenizer_name = tokenizer if isinstance(tokenizer, str) else None
        self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.spaces = TextSpaces.for_tokenizer(self.tokenizer, max_prompt_tokens, max_new_tokens)
        self._tasks = _task_source(tasks)
        #: the tasks when given as a list (an episode of seed ``s`` plays
        #: ``task_list[task_index(s)]``), else None
        self.task_list: list[Task] | None = None if callable(tasks) else list(tasks)
        self._verifier = verifier
        self.format_penalty = float(format_penalty)
        self.complete_calls = bool(complete_calls)
        self.max_supersteps = int(max_supersteps)
        self.scores_limit_episodes = bool(score_limit)
        if prefill is not None and not isinstance(prefill, Mapping):
            raise ScenarioError(
                f"prefill must map agent ids to the text their replies start with (e.g. "
                f"{{'assistant': '<tool>'}}), got {type(prefill).__name__} {prefill!r}"
            )
        self.prefill = dict(prefill or {})
        self.models = ChatModels(self, agents)
        app = build_app(self.models)
        self.builder = _builder_of(app)  # None for the Functional API (no graph to read)
        #: what GraphEnv compiles: the builder, or the app as compiled (its checkpointer...)
        self._graph = self.builder if app is self.builder else KeptCompiled(app)
        ids = list(agents) if agents is not None else self.models.used
        if not ids:
            raise ScenarioError(
                "build_app read no chat model from its mapping: build the app from "
                "models['<agent>'] for each agent that should learn, or pass agents=[...]"
            )
        for what, mapping in (("roles", roles), ("instances", instances), ("prefill", prefill)):
            unknown = sorted(set(mapping or {}) - set(ids))
            if unknown:
                raise ScenarioError(
                    f"{what} names {unknown}, which are not agents: agents are {ids}"
                )
        self._replies = {
            a: default_reply.get(a, "") if isinstance(default_reply, Mapping) else default_reply
            for a in ids
        }
        self.topology = app_topology(
            self.builder, ids, roles or {}, instances or {}, entry_first=agents is None
        )

    @property
    def text_agents(self) -> tuple[str, ...]:
        """Every agent acts with text (token-id observations and actions)."""
        return tuple(self.topology.agent_ids)

    # ----- the Dec-POMDP -------------------------------------------------------------------
    @property
    def possible_agents(self) -> list[str]:
        return self.topology.agent_ids

    def observation_space(self, agent: str) -> gym.Space:
        return self.spaces.observation_space

    def action_space(self, agent: str) -> gym.Space:
        return self.spaces.action_space

    def build_graph(self) -> Any:
        return self._graph

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        return _as_input(self._tasks(rng))

    def task_index(self, seed: int) -> int | None:
        """The index in :attr:`task_list` an episode of ``seed`` plays (``initial_state`` of
        ``default_rng(seed)``, as ``GraphEnv.reset(seed=seed)`` calls it), or None for a
        function task source. ``marl eval`` picks seeds with it to cover the list evenly."""
        if self.task_list is None:
            return None
        return int(np.random.default_rng(seed).integers(len(self.task_list)))

    def score(self, state: dict[str, Any]) -> Outcome:
        out = self._verifier(state)
        if isinstance(out, Outcome):
            return out
        if isinstance(out, (bool, np.bool_)):
            return Outcome(reward=float(out), success=bool(out))
        reward = float(out)
        if not math.isfinite(reward):
            raise ScenarioError(f"the verifier returned {out!r}: return a finite number")
        return Outcome(reward=reward, success=reward > 0)

    def limit_state(self, state: dict[str, Any] | None) -> Outcome:
        """With ``score_limit``, the verifier's outcome on the state a cut-off episode reached."""
        if not self.scores_limit_episodes or state is None:
            return super().limit_state(state)
        try:
            return self.score(state)
        except ScenarioError:
            raise
        except Exception as exc:
            raise ScenarioError(
                f"the verifier raised on the state of an episode cut off by its step limit "
                f"({type(exc).__name__}: {exc}): make it accept a partial state, or set "
                "score_limit=False"
            ) from exc

    def default_action(self, agent: str) -> np.ndarray:
        """The declared default reply of ``agent`` (then EOS), as an action."""
        base = self.topology.node_of(agent)
        ids = list(self.tokenizer(self._replies[base], add_special_tokens=False)["input_ids"])
        if self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        return self.spaces.encode_action(ids[: self.spaces.max_new_tokens])


class ChatModels(Mapping[str, Any]):
    """The mapping agent id → chat model handed to ``build_app``; remembers what was read."""

    def __init__(self, scenario: ChatAppScenario, agents: Sequence[str] | None) -> None:
        self._scenario = scenario
        self._allowed = list(agents) if agents is not None else None
        self._models: dict[str, Any] = {}

    @property
    def used(self) -> list[str]:
        """Agent ids read so far, in order of first use."""
        return list(self._models)

    def __getitem__(self, agent: str) -> Any:
        if agent in self._models:
            return self._models[agent]
        if not isinstance(agent, str) or not agent or "/" in agent:
            raise KeyError(f"agent ids are non-empty strings without '/', got {agent!r}")
        if self._allowed is not None and agent not in self._allowed:
            raise KeyError(
                f"build_app asked for a model of {agent!r}, which is not in agents="
                f"{self._allowed}: add it, or leave agents unset to take the ids build_app reads"
            )
        from marl_agents.llm.env_chat_model import EnvChatModel

        s = self._scenario
        self._models[agent] = EnvChatModel(
            agent=agent,
            spaces=s.spaces,
            tokenizer=s.tokenizer,
            format_penalty=s.format_penalty,
            prefill=s.prefill.get(agent, ""),
            complete_calls=s.complete_calls,
            record=False,
        )
        return self._models[agent]

    def init_chat_model(
        self,
        model: str | None = None,
        *,
        agent: str | None = None,
        model_provider: str | None = None,
        configurable_fields: Any = None,
        config_prefix: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """``langchain.chat_models.init_chat_model`` for an app under training: ``self[agent]``.

        An app that makes its models with ``init_chat_model("provider:name", ...)`` keeps its
        calls and takes the function from the mapping instead of from LangChain
        (``init_chat_model = models.init_chat_model`` in ``build_app``). The agent id is
        ``agent`` if given, else the model's name without its provider
        (``"openai:gpt-4o"`` → ``"gpt-4o"``; characters other than letters, digits, ``_``,
        ``.`` and ``-`` become ``_``): calls naming the same model are one agent, so give
        ``agent=`` where two agents share a model. The other arguments (provider,
        configurable fields, sampling settings such as ``temperature``) are accepted and
        not used: the agent's policy answers every call, whatever model a call configures.

        Raises:
            KeyError: neither ``model`` nor ``agent`` (a fully configurable model has no id).
        """
        del model_provider, configurable_fields, config_prefix, kwargs
        if agent is None:
            if not model:
                raise KeyError(
                    "init_chat_model() without a model name has no agent id: pass agent='<id>' "
                    "(e.g. models.init_chat_model(agent='writer'))"
                )
            agent = re.sub(r"[^A-Za-z0-9_.-]", "_", model.split(":", 1)[-1])
        return self[agent]

    def __iter__(self) -> Iterator[str]:
        return iter(self._allowed if self._allowed is not None else self._models)

    def __len__(self) -> int:
        return len(self._allowed if self._allowed is not None else self._models)


def app_topology(
    builder: Any,
    agents: Sequence[str],
    roles: Mapping[str, str],
    instances: Mapping[str, int],
    entry_first: bool = False,
) -> Topology:
    """The team of a chat app: one agent node per agent id, roles inferred from the app.

    An agent whose id names a node of the app (as ``create_supervisor`` and ``create_swarm``
    name their agents' nodes) takes that node's channels to other agents; the entry agent
    that routes (conditional edges, ``Command``, ``Send``) to other agents is the
    ``orchestrator`` and the agents it routes to are workers (one pool per role: parameter
    sharing by role). Where the app's structure says nothing about an agent (plain edges, a
    router node as entry, its model called inside a node of another name, the Functional
    API), its role is ``agent`` and its pool is its own id: a policy per agent, so
    ``train=[<agent>]`` works on any app. ``roles`` overrides any of them. With
    ``entry_first`` the entry agent comes first in the agent ids.
    """
    links, entry = _agent_links(builder, set(agents)) if builder is not None else ([], None)
    if entry_first and entry is not None:
        agents = [entry, *(a for a in agents if a != entry)]
    bad = {a: r for a, r in roles.items() if r not in ROLES}
    if bad:
        raise ScenarioError(f"roles {bad} are not roles: use one of {list(ROLES)}")
    topo = Topology.empty(name=getattr(builder, "name", None) or "chat-app")
    for a in agents:
        k = int(instances.get(a, 1))
        if k < 1:
            raise ScenarioError(f"instances[{a!r}] must be ≥ 1, got {k}")
        topo.add_agent(a, roles.get(a, "agent"), max_instances=k)
    for a, b, kind in links:
        topo.add_channel(a, b, kind if kind in _ROUTING else "static")
    if entry is not None:  # the app's own entry: roles follow its routing
        topo.add_channel(START, entry)
        infer_roles(topo, keep=set(roles))
    for a in agents:  # no role from the app: a policy of its own (pool = the agent id)
        data = topo.graph.nodes[a]
        if data["role"] == "agent" and data["pool"] == "agent":
            data["pool"] = a
    first = entry if entry is not None else agents[0]
    for a in agents:
        if a == first and entry is None:
            topo.add_channel(START, a)
        elif a != first and not any(b == a for _, b, _ in links):
            topo.add_channel(START, a, "conditional")
        topo.add_channel(a, END, "conditional")
    return topo


def _agent_links(builder: Any, agents: set[str]) -> tuple[list[tuple[str, str, str]], Any]:
    """Channels between agents whose ids are node names of ``builder``, and the entry agent."""
    try:
        graph = Topology.from_langgraph(_opaque(builder))
    except Exception as exc:  # the structure only suggests roles: warn, never fail
        warnings.warn(
            f"the app's structure could not be read ({exc}); roles default to 'agent' — "
            "pass roles={...} to set them",
            RuntimeWarning,
            stacklevel=4,
        )
        return [], None
    g = graph.graph
    named = [n for n in g.nodes if n in agents]
    links = []
    for a in named:
        for b in named:
            if a != b and g.has_edge(a, b):
                links.append((a, b, g.edges[a, b]["kind"]))
    starts = [n for n in g.successors(START) if n in agents]
    return links, starts[0] if len(starts) == 1 else None


def _opaque(builder: Any) -> Any:
    """A copy of ``builder`` whose subgraph nodes are single nodes (``flatten: False``)."""
    import copy
    import dataclasses

    copied = copy.copy(builder)
    copied.nodes = {
        name: dataclasses.replace(spec, metadata={**(spec.metadata or {}), "flatten": False})
        for name, spec in builder.nodes.items()
    }
    return copied


class KeptCompiled:
    """An app ``build_app`` returned compiled, run as it was compiled: its checkpointer, store
    and other compile options are kept (a graph's thread is one of the episode's:
    :func:`scenarios.bridge.episode_config`); the Functional API's ``@entrypoint`` is one.

    ``compile()`` returns the app itself (what :class:`~scenarios.graph_env.GraphEnv` runs).
    """

    def __init__(self, app: Any) -> None:
        for when in ("before", "after"):
            nodes = getattr(app, f"interrupt_{when}_nodes", None)
            if nodes:
                raise ScenarioError(
                    f"the app was compiled with interrupt_{when}={list(nodes)!r}: an episode "
                    "has no human to resume it. Compile it without interrupt_before/after for "
                    "training (a node's interrupt() waiting for a human is not supported either)"
                )
        self.app = app
        self.name = getattr(app, "name", None)

    def compile(self) -> Any:
        return self.app


def _builder_of(app: Any) -> Any:
    """The app's ``StateGraph`` (``None`` for a Functional-API ``@entrypoint``)."""
    from langgraph.pregel import Pregel

    builder = getattr(app, "builder", None)
    if builder is None and isinstance(app, Pregel):  # @entrypoint: a Pregel with no builder
        return None
    builder = app if builder is None else builder
    if not hasattr(builder, "nodes") or not hasattr(builder, "compile"):
        raise ScenarioError(
            f"build_app returned {type(app).__name__}: return the app's StateGraph, its "
            "compiled graph (create_supervisor(...) returns a StateGraph: compile it or return "
            "it) or a Functional-API @entrypoint (decorate the function and return it)"
        )
    return builder


def _task_source(tasks: TaskSource) -> Callable[[np.random.Generator], Task]:
    if callable(tasks):
        return tasks
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence) or not tasks:
        raise ScenarioError(
            "tasks must be a function rng → input or a non-empty list of inputs "
            "(dicts, or strings for a user message)"
        )
    items = list(tasks)
    return lambda rng: items[int(rng.integers(len(items)))]


def _as_input(task: Any) -> dict[str, Any]:
    if isinstance(task, str):
        from langchain_core.messages import HumanMessage

        return {"messages": [HumanMessage(task)]}
    if isinstance(task, Mapping):
        return dict(task)
    raise ScenarioError(
        f"a task is the graph's input dict or a string, got {type(task).__name__}: "
        "fix the task source"
    )


__all__ = ["ChatAppScenario", "ChatModels", "KeptCompiled", "app_topology"]
