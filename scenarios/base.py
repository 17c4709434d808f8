"""The scenario contract: a Dec-POMDP defined as a LangGraph graph plus a verifier.

A scenario builds a LangGraph ``StateGraph`` whose agent nodes ask for their decision with
:func:`scenarios.decisions.decide`. :class:`scenarios.graph_env.GraphEnv` executes that graph; the
scenario never sees RLlib or PettingZoo.
"""

from __future__ import annotations

import dataclasses
import reprlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
from langgraph.graph import StateGraph

from scenarios.global_state import concat_state
from topologies import MarlError, Topology

AbsentPolicy = Literal["skip", "placeholder", "default"]


class ScenarioError(MarlError, ValueError):
    """Bad scenario arguments or a topology the scenario cannot run on."""


class ReplayUnavailable(ScenarioError):
    """The scenario cannot replay an episode exactly (``Scenario.exact_replay`` is False), so
    counterfactual credit (``loo``, ``shapley``) cannot be computed for it."""


@dataclasses.dataclass(frozen=True)
class ScriptedPolicy:
    """A scripted policy a scenario declares (``Scenario.scripted_policies``).

    Attributes:
        name: the policy's name within the scenario (served as ``"<scenario>.<name>"``).
        factory: ``scenario -> policy``, where a policy maps ``(agent, observation)`` to an
            action (policies often need the scenario's sizes, so they are built per instance).
        summary: one line for listings.
        default_for: roles this policy serves when a pool of that role is frozen and no model
            is configured for it (e.g. ``("worker",)``).
    """

    name: str
    factory: Callable[[Any], Callable[[str, Any], Any]]
    summary: str = ""
    default_for: tuple[str, ...] = ()


@dataclasses.dataclass
class Outcome:
    """What the verifier says about a finished episode.

    Attributes:
        reward: the terminal team reward (what every agent that acted receives).
        success: whether the task was solved.
        local: optional per-agent rewards (for ``credit="local"``); agent id → reward.
        metrics: named numbers for reports (``latency``, ``calls``, checklist criteria, ...).
        truncated: the episode ended on a time limit rather than a terminal state (as MPE's
            ``max_cycles``): agents are truncated, so learners bootstrap the last value.
    """

    reward: float
    success: bool = False
    local: dict[str, float] = dataclasses.field(default_factory=dict)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    truncated: bool = False


class Scenario(ABC):
    """Base class of every scenario.

    Subclasses set the class attributes, validate their keyword arguments in ``__init__``
    (raising :class:`ScenarioError` naming the argument and the fix) and implement the abstract
    methods. ``absent`` declares what an agent outside a counterfactual coalition does:
    ``"skip"`` (its node writes nothing), ``"placeholder"`` (:meth:`placeholder_action`) or
    ``"default"`` (:meth:`default_action`).

    Capabilities are class attributes, read by trainers before (or without) building the
    scenario: ``has_text_agents`` (then ``text_agents`` lists them), ``has_oracle``
    (:meth:`oracle_value` is implemented), ``has_local_rewards`` (``Outcome.local`` carries
    every agent's reward, for credit ``local``) and ``scripted_policies`` (named policies,
    used by frozen ``scripted`` pools as ``"<name>.<policy>"``).

    Global state (centralised critics, :mod:`scenarios.global_state`): :meth:`global_state`
    (and :attr:`state_space` for a declared projection); by default every agent's latest
    observation concatenated.
    """

    name: ClassVar[str]
    version: ClassVar[int] = 0
    summary: ClassVar[str] = ""
    #: topology kinds this scenario runs on (``"single"``, ``"chain"``, ``"star"``, ``"tree"``,
    #: ``"mesh"``, ``"graph"`` for a user's LangGraph graph).
    topologies: ClassVar[tuple[str, ...]] = ()
    default_topology: ClassVar[str] = "single"
    absent: ClassVar[AbsentPolicy] = "default"
    #: reward given for an action outside the agent's action space; ``None`` raises ValueError.
    invalid_action_penalty: ClassVar[float | None] = None
    #: agents are the ids their decisions carry (``decide(id, ...)`` anywhere in the graph,
    #: e.g. inside subgraphs), not node names; ``GraphEnv`` then runs the graph by agent id
    #: with the topology's agent nodes as ids (``max_instances`` concurrent instances each).
    agents_by_id: ClassVar[bool] = False
    #: hard cap on LangGraph supersteps an episode may take (episode truncated beyond it);
    #: a scenario may set it per instance.
    max_supersteps: int = 64
    #: runs keep the graph's state after every superstep, so that an episode cut off by its
    #: step limit is scored by :meth:`limit_state` on the state it reached (a scenario may set
    #: it per instance).
    scores_limit_episodes: bool = False

    # ----- capabilities --------------------------------------------------------------------
    #: some agents act with token ids (``TextSpaces``); ``text_agents`` names them.
    has_text_agents: ClassVar[bool] = False
    #: the agents whose observation is a prompt's token ids and whose action is the ids they
    #: generated (empty unless ``has_text_agents``).
    text_agents: tuple[str, ...] = ()
    #: the tokenizer a text scenario renders prompts with (``"tiny"`` or a directory), if any.
    tokenizer_name: str | None = None
    #: :meth:`oracle_value` gives the best policy's expected reward (it may still return
    #: ``None`` for settings where it is not computable).
    has_oracle: ClassVar[bool] = False
    #: the verifier's ``Outcome.local`` has a reward for every agent (credit ``local``).
    has_local_rewards: ClassVar[bool] = False
    #: named policies (:class:`ScriptedPolicy`), served as ``"<scenario name>.<policy>"`` by
    #: ``scripted`` pools (see :mod:`marl_agents.scripted`).
    scripted_policies: ClassVar[tuple[ScriptedPolicy, ...]] = ()
    #: an episode replays exactly from its seed and actions (counterfactual credit needs it);
    #: False for environments the scenario only wraps (:mod:`scenarios.pettingzoo_env`).
    exact_replay: ClassVar[bool] = True
    #: a node that raises (or times out) before any agent acted ends a counted failed
    #: episode (``GraphEnv.lost_episodes``; the env starts the next one) instead of making
    #: ``reset()`` raise: for graphs that run a program which may fail on its own (an app
    #: behind the gateway), not for graphs that cannot run at all.
    counts_early_failures: ClassVar[bool] = False
    #: on the fast path, a lone node that raises ends the episode with its error, as
    #: LangGraph's run would, instead of replaying the episode through LangGraph (which
    #: runs the node again): for nodes whose work must not run twice (an app episode).
    node_errors_end_episode: ClassVar[bool] = False
    #: the space of the global state where the scenario declares one (a :meth:`global_state`
    #: projection, or states its graph emits with :func:`scenarios.emit_state`); ``None``: the
    #: default concatenation's (:func:`scenarios.global_state.state_space_of`).
    state_space: gym.Space | None = None
    #: the name of the scenario's difficulty knob, if it has one (:mod:`scenarios.difficulty`:
    #: it then takes ``difficulty=None | "seed" | level index``).
    difficulty_knob: ClassVar[str | None] = None
    #: the knob's levels, easy → hard (set per instance; empty without a knob).
    difficulty_levels: tuple[Any, ...] = ()

    topology: Topology

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "oracle_value" in vars(cls) and not cls.has_oracle:
            raise TypeError(
                f"{cls.__qualname__} implements oracle_value but does not declare "
                "has_oracle = True: declare it (trainers read the class attribute)"
            )

    @classmethod
    def id(cls) -> str:
        return f"{cls.name}-v{cls.version}"

    # ----- the Dec-POMDP -------------------------------------------------------------------
    @property
    @abstractmethod
    def possible_agents(self) -> list[str]:
        """Fixed list of agent ids."""

    @abstractmethod
    def observation_space(self, agent: str) -> gym.Space:
        """Observation space of ``agent`` (its own partial view)."""

    @abstractmethod
    def action_space(self, agent: str) -> gym.Space:
        """Action space of ``agent``."""

    @abstractmethod
    def build_graph(self) -> StateGraph:
        """The (uncompiled) LangGraph builder; agent nodes call ``decide(agent_id, obs)``."""

    @abstractmethod
    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        """The graph's input for one episode; all randomness comes from ``rng``."""

    @abstractmethod
    def score(self, state: dict[str, Any]) -> Outcome:
        """Verify the final graph state into an :class:`Outcome` (deterministic)."""

    # ----- optional hooks ------------------------------------------------------------------
    def default_action(self, agent: str) -> Any:
        """The action an absent agent takes under ``absent="default"``."""
        return self.action_space(agent).sample() * 0

    def placeholder_action(self, agent: str) -> Any:
        """The action an absent agent takes under ``absent="placeholder"``."""
        return self.default_action(agent)

    def oracle_value(self, rng: np.random.Generator) -> float | None:
        """Expected reward of the best policy on this episode's task, where computable
        (implemented by scenarios with ``has_oracle``)."""
        return None

    def message_layout(self, agent: str) -> tuple[int, int] | None:
        """``(own features, neighbour slots)`` of ``agent``'s observation, for ``mpnn``
        pools: the observation is its own features, then one equal-width slot per in-edge
        sender. ``None`` (the default): the whole observation is the agent's own."""
        return None

    def anchor_key(self, agent: str, observation: Any) -> Any:
        """The anchor state ``agent``'s turn starts from, for GRPO step groups
        (``turn_credit: step_groups``): turns of one agent in one GRPO group with equal keys are
        compared with each other. A hashable, picklable value (it travels in the step's infos),
        or ``None`` (the default): turns from identical observations share an anchor."""
        return None

    def global_state(self, observations: Mapping[str, Any]) -> np.ndarray:
        """The global state a centralised critic reads (never an actor), given every agent's
        latest observation (agents not asked yet are missing).

        Default: those observations concatenated in ``possible_agents`` order, flattened, zeros
        for an agent without one yet (:func:`scenarios.global_state.concat_state`). Override it
        (and set :attr:`state_space` when the width changes) to declare another projection;
        the env reports it under ``infos[agent][STATE_INFO]`` (:mod:`scenarios.global_state`).
        """
        agents = self.possible_agents
        return concat_state(observations, agents, {a: self.observation_space(a) for a in agents})

    def failure_state(self, state: dict[str, Any] | None) -> Outcome:
        """Outcome of an episode that failed (a node raised): zero reward by default."""
        return Outcome(reward=0.0, success=False)

    def limit_state(self, state: dict[str, Any] | None) -> Outcome:
        """Outcome of an episode cut off by its step limit (LangGraph's recursion limit, or
        the environment's decision cap). ``state`` is the graph's state after its last
        superstep where the run kept it (:attr:`scores_limit_episodes`), else ``None``.

        Default: :meth:`failure_state` of ``None`` (zero reward). The episode is counted as
        truncated (``charts/truncated``, ``charts/limit_rate``) whatever this returns.
        """
        return self.failure_state(None)

    # ----- transcripts (called only for the episodes that are saved or printed) -------------
    def render_observation(self, agent: str, observation: Any) -> str:
        """``agent``'s observation as text for transcripts.

        Default: for a text agent of a scenario that has ``spaces`` (a
        :class:`~scenarios.text_space.TextSpaces`) and a ``tokenizer``, the decoded prompt
        (special tokens kept, so chat roles show); otherwise a compact repr (arrays rounded and
        elided). Override it to show what the numbers mean.
        """
        text = _text_view(self, agent, observation, "prompt_text")
        return text if text is not None else compact(observation)

    def render_action(self, agent: str, action: Any) -> str:
        """``agent``'s action as text for transcripts.

        Default: the decoded reply of a text agent (see :meth:`render_observation`), otherwise
        a compact repr. Tool calls in the reply (``<tool>{...}</tool>``) are listed separately
        by the transcript.
        """
        text = _text_view(self, agent, action, "action_text")
        return text if text is not None else compact(action)


def compact(value: Any, width: int = 240) -> str:
    """A short one-line repr: arrays rounded to 3 decimals with long ones elided."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            value = np.round(value, 3)
        text = np.array2string(
            value, separator=", ", threshold=24, edgeitems=6, max_line_width=10**6
        )
    elif isinstance(value, np.generic):
        text = repr(value.item())
    else:
        short = reprlib.Repr()
        short.maxstring, short.maxother, short.maxlist, short.maxdict = width, width, 12, 12
        text = short.repr(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _text_view(scenario: Scenario, agent: str, value: Any, method: str) -> str | None:
    """Decoded text of a text agent's token ids, or None when the scenario has no text view."""
    if agent not in scenario.text_agents:
        return None
    spaces, tokenizer = getattr(scenario, "spaces", None), getattr(scenario, "tokenizer", None)
    if tokenizer is None or not hasattr(spaces, method):
        return None
    return str(getattr(spaces, method)(value, tokenizer))
