"""``text-delegate``: the ``delegate`` task for an LLM orchestrator that writes tool calls.

A task has ``K`` parts of ``T`` types; ``N`` frozen subagents (``star:N``) solve a part of type
``t`` with a hidden probability ``skills[w, t]``. The orchestrator, the only RL agent, observes
its prompt's token ids and acts with the ids it generated (both
:class:`~scenarios.text_space.TextSpaces`); each message's ``assign`` calls are one dispatch
round (:mod:`scenarios.text_delegate_parse`); a format error costs ``format_penalty`` and the
episode goes on; a well-formed message without calls, solving every part or ``max_rounds``
messages end it. Reward (terminal, team):
``solved/K − λ·latency − μ·calls − format_penalty·format_errors``. ``level`` (``easy`` /
``full``) sets the defaults of the other arguments. Prompts:
:mod:`scenarios.text_delegate_prompts`; subagents: :mod:`scenarios.text_delegate_subagents`;
prefill, subagents and levels are described in docs/internals.md (scenarios).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypedDict

import numpy as np
from langgraph.graph import END, START, StateGraph
from typing_extensions import override

from scenarios.args import cost_arg, int_arg
from scenarios.base import Outcome, Scenario, ScenarioError
from scenarios.decisions import decide
from scenarios.declared import DeclaredSpaces, accept_topology
from scenarios.delegate import (
    MAX_PARTS,
    MAX_ROUNDS,
    MAX_TYPES,
    SOLVED,
    Delegate,
    exact_planner,
    merge_status,
    new_task,
    planned_value,
)
from scenarios.delegate_oracle import Planner, make_skills
from scenarios.difficulty import check_difficulty, knob_level
from scenarios.registry import register
from scenarios.text_delegate_parse import Assignment, parse_assignment
from scenarios.text_delegate_prompts import DelegatePrompts
from scenarios.text_delegate_subagents import build_subagent, check_subagents, solve_method
from scenarios.text_space import TextSpaces, load_tokenizer
from topologies import Topology, TopologyError

FAILED = 1

LEVELS: dict[str, dict[str, Any]] = {
    "easy": {
        "parts": 1,
        "types": 2,
        "prefill": True,
        "max_rounds": 1,
        "max_new_tokens": 4,
        "max_prompt_tokens": 160,
        "latency_cost": 0.0,
        "call_cost": 0.3,
        "format_penalty": 0.1,
    },
    "full": {
        "parts": 3,
        "types": 3,
        "prefill": False,
        "max_rounds": None,
        "max_new_tokens": 160,
        "max_prompt_tokens": 512,
        "latency_cost": 0.05,
        "call_cost": 0.02,
        "format_penalty": 0.2,
    },
}
VALID_KWARGS = (
    "level",
    *LEVELS["full"],
    "skills",
    "skills_seed",
    "subagents",
    "tokenizer",
    "vocab_size",
    "difficulty",
)


class TextDelegateState(TypedDict, total=False):
    """Graph state of one ``text-delegate`` episode."""

    task_seed: int
    types: list[int]
    status: Annotated[dict[int, int], merge_status]
    #: ``(round, part, worker, method text, solved)`` for every attempt.
    attempts: Annotated[list[tuple[int, int, int, str, bool]], operator.add]
    assignment: dict[int, int]
    round: int
    latency: int
    calls: int
    decisions: int
    format_errors: int
    last_error: str | None
    reports: list[str]
    done: bool


def vocab_size_of(name: str, tokenizer: Any) -> int:
    """Token ids a model may emit: ``len(tokenizer)`` or the model config's, if larger."""
    size = len(tokenizer)
    if name != "tiny":
        config = Path(name) / "config.json"
        if config.exists():
            size = max(size, int(json.loads(config.read_text()).get("vocab_size", 0)))
    return size


# ----- the scenario ------------------------------------------------------------------------
@register
class TextDelegate(DelegatePrompts, DeclaredSpaces, Scenario):
    """Delegate typed parts to hidden-skill subagents by writing tool calls (see module doc).

    Args:
        topology: ``"star:N"``: ``N`` subagents (1–8; default ``star:2``).
        level: ``"easy"`` (default) or ``"full"``: the defaults of the arguments below.
        parts: parts per task ``K``, 1–8.
        types: part types ``T``, 1–8.
        prefill: open the first unsolved part's call in the prompt (one part per message).
        max_rounds: orchestrator messages allowed, 1–16 (``None``: ``2·K``).
        max_new_tokens: the orchestrator's generation budget (action length).
        max_prompt_tokens: observation length (longer prompts keep their end).
        latency_cost: ``λ ≥ 0`` per dispatch round.
        call_cost: ``μ ≥ 0`` per assignment executed.
        format_penalty: ``≥ 0`` per orchestrator message with a format error.
        skills: explicit ``(N, T)`` skill matrix in ``[0, 1]``.
        skills_seed: seed of the drawn skill matrix (level ``full``); ignored with ``skills``.
        subagents: ``"scripted"``, an ``hf`` / ``vllm`` spec, or a list of ``N`` specs.
        tokenizer: ``"tiny"`` or a directory / hub name: the orchestrator model's tokenizer.
        vocab_size: token ids the orchestrator model may emit (default: the larger of the
            tokenizer's size and the model's ``config.json`` ``vocab_size``).
        difficulty: the ``active_parts`` knob, as ``delegate``'s (:mod:`scenarios.difficulty`).

    Example:
        >>> from scenarios.decisions import run_inline
        >>> s = TextDelegate("star:2", level="easy")
        >>> ids = s.tokenizer("1", add_special_tokens=False)["input_ids"]
        >>> _, out, _ = run_inline(s, lambda a, o: s.spaces.encode_action(ids), seed=0)
        >>> out.metrics["format_ok"], out.metrics["calls"]
        (1.0, 1.0)
    """

    name = "text-delegate"
    version = 0
    summary = "LLM orchestrator assigns typed parts to frozen subagents with tool calls"
    topologies = ("star",)
    default_topology = "star:2"
    absent = "default"  # an absent orchestrator writes nothing, which ends the episode
    #: agents acting with text spaces (token ids); fine-tuning jobs look for this marker.
    text_agents: ClassVar[tuple[str, ...]] = ("orchestrator",)
    agents_note: ClassVar[str] = " (the subagents run inside the environment)"
    has_text_agents = True
    has_oracle = True
    has_local_rewards = True
    difficulty_knob = "active_parts"

    def __init__(
        self, topology: str | Topology = "star:2", *, level: str = "easy", **kwargs: Any
    ) -> None:
        if level not in LEVELS:
            raise ScenarioError(f"level must be one of {sorted(LEVELS)}, got {level!r}")
        unknown = sorted(set(kwargs) - set(VALID_KWARGS))
        if unknown:
            raise ScenarioError(
                f"text-delegate got unknown argument(s) {unknown}: valid are "
                f"{', '.join(VALID_KWARGS)}"
            )
        args = {**LEVELS[level], **kwargs}
        self.level = level
        fix = "pass topology='star:N' with N ≥ 1 subagents"
        self.workers_topology = accept_topology("text-delegate", topology, ("star",), "star:N", fix)
        self.n_workers = len(self.workers_topology.agent_ids) - 1
        self.parts = int_arg("parts", args["parts"], 1, MAX_PARTS)
        self.types = int_arg("types", args["types"], 1, MAX_TYPES)
        self.difficulty_levels = tuple(range(1, self.parts + 1))
        self.difficulty = check_difficulty(
            args.get("difficulty"), self.difficulty_levels, "text-delegate"
        )
        if not isinstance(args["prefill"], bool):
            raise ScenarioError(f"prefill must be True or False, got {args['prefill']!r}")
        self.prefill = args["prefill"]
        rounds = 2 * self.parts if args["max_rounds"] is None else args["max_rounds"]
        self.max_rounds = int_arg("max_rounds", rounds, 1, MAX_ROUNDS)
        self.latency_cost = cost_arg("latency_cost", args["latency_cost"])
        self.call_cost = cost_arg("call_cost", args["call_cost"])
        self.format_penalty = cost_arg("format_penalty", args["format_penalty"])
        self.skills = self._skills(args)
        self.skills.setflags(write=False)
        self.subagent_specs = check_subagents(args.get("subagents", "scripted"), self.n_workers)
        self._subagents: list[Any] | None = None
        self.tokenizer_name = str(args.get("tokenizer", "tiny"))
        try:
            self.tokenizer = load_tokenizer(self.tokenizer_name)
        except (OSError, ValueError) as exc:
            raise ScenarioError(
                f"tokenizer {self.tokenizer_name!r} could not be loaded ({exc}): give 'tiny' or a "
                "directory saved with save_pretrained"
            ) from None
        vocab = args.get("vocab_size") or vocab_size_of(self.tokenizer_name, self.tokenizer)
        self.spaces = TextSpaces(
            int_arg("vocab_size", vocab, len(self.tokenizer), None),
            int_arg("max_prompt_tokens", args["max_prompt_tokens"], 8, None),
            int_arg("max_new_tokens", args["max_new_tokens"], 1, None),
        )
        self.agent_spaces = {
            "orchestrator": (self.spaces.observation_space, self.spaces.action_space)
        }
        self.topology = self._graph_topology()
        self.max_supersteps = 2 * self.max_rounds + 4
        self._planner: Planner | None = None

    def _skills(self, args: Mapping[str, Any]) -> np.ndarray:
        n, t = self.n_workers, self.types
        if args.get("skills") is not None:
            try:
                arr = np.array(args["skills"], dtype=float)
            except (TypeError, ValueError):
                arr = np.zeros(0)
            if arr.shape != (n, t) or not ((arr >= 0) & (arr <= 1)).all():
                raise ScenarioError(
                    f"skills must be an ({n}, {t}) = (workers, types) matrix of probabilities "
                    "in [0, 1]"
                )
            return arr
        if self.level == "easy":
            strong = (np.arange(n)[:, None] % t) == np.arange(t)[None, :]
            return np.where(strong, 0.9, 0.1)
        return make_skills(n, t, int_arg("skills_seed", args.get("skills_seed", 0), 0, None))

    def _graph_topology(self) -> Topology:
        try:
            return Topology.from_langgraph(self.build_graph())
        except TopologyError as exc:  # pragma: no cover - the graph is fixed
            raise ScenarioError(f"text-delegate graph: {exc}") from None

    # ----- spaces --------------------------------------------------------------------------
    @override
    def default_action(self, agent: str) -> np.ndarray:
        return self.spaces.encode_action([])

    # ----- parsing -------------------------------------------------------------------------
    def parse(self, text: str, state: Mapping[str, Any]) -> Assignment:
        """Turn the orchestrator's generated ``text`` into assignments and format errors."""
        unsolved = {i for i in range(self.parts) if state["status"][i] != SOLVED}
        if not self.prefill:
            return parse_assignment(text, unsolved, self.n_workers)
        first = self.first_unsolved(state)
        if first is None:
            return Assignment({}, [], text)
        return parse_assignment(text, unsolved, self.n_workers, self.prefill_text(first, state))

    # ----- the graph -----------------------------------------------------------------------
    @override
    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        return {
            **new_task(rng, self.parts, self.types, knob_level(self, rng)),
            "format_errors": 0,
            "last_error": None,
            "reports": [],
            "done": False,
        }

    @override
    def build_graph(self) -> StateGraph:
        builder = StateGraph(TextDelegateState)
        builder.add_node("orchestrator", self._orchestrator, metadata={"role": "orchestrator"})
        builder.add_node(
            "subagents", self._subagents_node, metadata={"role": "worker", "agent": False}
        )
        builder.add_edge(START, "orchestrator")
        builder.add_conditional_edges(
            "orchestrator", self._route, {"subagents": "subagents", "end": END}
        )
        builder.add_edge("subagents", "orchestrator")
        return builder

    @staticmethod
    def _route(state: TextDelegateState) -> str:
        return "end" if state.get("done") else "subagents"

    def _orchestrator(self, state: TextDelegateState) -> dict[str, Any]:
        unsolved = [i for i in range(self.parts) if state["status"][i] != SOLVED]
        if not unsolved or state["decisions"] >= self.max_rounds:
            return {"done": True}
        action = decide("orchestrator", self.orchestrator_obs(state))
        text = self.tokenizer.decode(self.spaces.decode_action(action), skip_special_tokens=True)
        parsed = self.parse(text, state)
        update: dict[str, Any] = {
            "decisions": state["decisions"] + 1,
            "format_errors": state["format_errors"] + bool(parsed.errors),
            "last_error": parsed.errors[0] if parsed.errors else None,
            "assignment": parsed.assignment,
        }
        last = update["decisions"] >= self.max_rounds
        if not parsed.assignment:
            # a well-formed message without calls ends the run; a malformed one costs a round
            update["done"] = not parsed.errors or last
            return update
        return {
            **update,
            "round": state["round"] + 1,
            "latency": state["latency"] + 1,
            "calls": state["calls"] + len(parsed.assignment),
        }

    @property
    def subagents(self) -> list[Any]:
        """One subagent per worker (built on first use, in the process running the env)."""
        if self._subagents is None:
            self._subagents = [build_subagent(s) for s in self.subagent_specs]
        return self._subagents

    def _subagents_node(self, state: TextDelegateState) -> dict[str, Any]:
        assignment = state.get("assignment") or {}
        if not assignment:
            return {}
        round_ = state["round"] - 1
        by_agent: dict[int, list[int]] = {}
        for part, worker in sorted(assignment.items()):
            by_agent.setdefault(worker, []).append(part)
        answers: dict[int, str] = {}
        groups: dict[int, list[tuple[int, int]]] = {}
        for worker, parts in by_agent.items():
            agent = self.subagents[worker]
            groups.setdefault(id(agent), []).extend((worker, p) for p in parts)
        for items in groups.values():  # one batched call per subagent object (backend)
            agent = self.subagents[items[0][0]]
            prompts = [self.worker_prompt(w, p, state["types"][p]) for w, p in items]
            names = [self.type_name(state["types"][p]) for _, p in items]
            for (_, p), text in zip(items, agent.respond(prompts, names), strict=True):
                answers[p] = text
        status: dict[int, int] = {}
        attempts = []
        reports = []
        for part, worker in sorted(assignment.items()):
            type_ = state["types"][part]
            method = solve_method(answers[part])
            ok = method == self.type_name(type_) and self.draw(
                state["task_seed"], round_, part, worker
            ) < float(self.skills[worker, type_])
            status[part] = SOLVED if ok else FAILED
            attempts.append((round_, part, worker, method or "", ok))
            reports.append(f"worker {worker} {'solved' if ok else 'failed'} part {part}")
        return {"status": status, "attempts": attempts, "reports": reports, "assignment": {}}

    #: the common-random-number skill draw, ``delegate``'s
    draw = staticmethod(Delegate.draw)

    # ----- verification --------------------------------------------------------------------
    @override
    def score(self, state: dict[str, Any]) -> Outcome:
        solved = sum(1 for s in state["status"].values() if s == SOLVED)
        frac = solved / self.parts
        errors = state["format_errors"]
        reward = (
            frac
            - self.latency_cost * state["latency"]
            - self.call_cost * state["calls"]
            - self.format_penalty * errors
        )
        return Outcome(
            reward=float(reward),
            success=solved == self.parts,
            local={"orchestrator": float(reward)},
            metrics={
                "solved_fraction": float(frac),
                "latency": float(state["latency"]),
                "calls": float(state["calls"]),
                "rounds": float(state["decisions"]),
                "format_errors": float(errors),
                "format_ok": float(errors == 0),
            },
        )

    # ----- the oracle ----------------------------------------------------------------------
    @override
    def oracle_value(self, rng: np.random.Generator) -> float | None:
        """Exact expected reward of the skill-aware optimal orchestrator on this task.

        ``None`` in prefill mode with several parts (one part per message is not what the
        planner models).
        """
        if self.prefill and self.parts > 1:
            return None
        if self._planner is None:
            self._planner = exact_planner(self, True)
        return planned_value(self._planner, self.initial_state(rng), self.parts, self.types)
