"""``text-delegate``: the ``delegate`` task for an LLM orchestrator that writes tool calls.

A task has ``K`` parts, each of one of ``T`` types (``math``, ``code``, …). ``N`` frozen
specialist subagents (``worker_0 … worker_{N-1}``, ``topology="star:N"``) solve a part of type
``t`` with a hidden probability ``skills[w, t]``; the orchestrator never sees the skills and has
to learn them across episodes, as in :mod:`scenarios.delegate`.

**The orchestrator** is the only RL agent. Its observation is the token ids of a chat prompt
(system: the rules and the format; user: the parts, their status and the round) and its action
the token ids it generated; both spaces are
:class:`~scenarios.text_space.TextSpaces` (``MultiDiscrete``, padded with
``pad_id = vocab_size``). Its text assigns parts with tool calls in the format of
:mod:`scenarios.toolcalls`, parsed with :func:`~scenarios.toolcalls.parse_tool_calls`::

    <tool>{"name": "assign", "arguments": {"part": 0, "worker": 1}}</tool>

One call per part; the calls of one message run in parallel (one dispatch round). A call that
does not parse, names another tool, or has a bad part (unknown or already solved) or worker is
a **format error**: it is ignored and costs ``format_penalty``; the episode goes on (the next
prompt repeats the first error). A message with valid calls dispatches them; a well-formed
message without calls ends the episode; so do solving every part and reaching ``max_rounds``
orchestrator messages.

**Prefill** (``prefill=True``, the easy level): the prompt ends *inside* an opened call for the
first unsolved part, just before its worker number::

    <|im_start|>assistant
    <tool>{"name": "assign", "arguments": {"part": 0, "type": "code", "worker":

and the orchestrator's text continues it. The environment parses ``prefill + text``; when that
is not a valid call and the text starts with an integer, it reads the integer and closes the
call (``prefill + digits + "}}</tool>"``), i.e. the integer acts as a stop sequence and the rest
of the text is ignored. One part is assigned per message in this mode.

**Subagents** are frozen and run inside the environment (they are not RL agents): for each
assignment the subagent gets a prompt naming the part's type and must answer
``<tool>{"name": "solve", "arguments": {"method": "<type>"}}</tool>``; the part is solved when
the method is the part's type and the skill draw succeeds
(``default_rng([task_seed, round, part, worker]).random() < skill``: common random numbers, so
replays are exact). ``subagents`` chooses them, one spec for all workers or a list of ``N``:

* ``"scripted"`` (default): always answers with the right method.
* ``{"type": "hf", "path": DIR_or_"tiny", "seed": 0}``: a transformers model
  (:class:`~marl_agents.llm.hf_backend.HFBackend`), greedy, loaded once per process.
* ``{"type": "vllm", "url": "http://host:8000", "model": NAME, "tokenizer": DIR}``: a vLLM
  OpenAI-compatible server (:class:`~marl_agents.llm.vllm_backend.OpenAIServerBackend`).

Every spec may set ``max_new_tokens`` (the answer budget, default 48). Specs are checked when
the scenario is built (types, keys, that an ``hf`` path holds a saved model); the models are
loaded on first use, in the process running the environment. All assignments of a round go to
each backend as one batched ``generate`` call, greedy and seeded, so LLM subagents are
deterministic too.

**Reward** (terminal, team): ``solved/K − λ·latency − μ·calls − format_penalty·format_errors``
with ``latency`` the dispatch rounds and ``calls`` the assignments executed. Metrics:
``solved_fraction``, ``latency``, ``calls``, ``rounds`` (orchestrator messages),
``format_errors``, ``format_ok`` (1 when the episode had no format error).

**Levels** set the defaults of every argument not given explicitly:

* ``"easy"``: 1 part, 2 types, prefill, 1 round, ``max_new_tokens=4``, no latency cost,
  ``μ=0.3`` per call, ``format_penalty=0.1``, skills ``0.9`` for worker ``i`` on type
  ``i mod T`` and ``0.1`` elsewhere. So a malformed answer earns ``−0.1``, a call to a wrong
  worker usually ``−0.3`` and a call to a right one usually ``0.7`` (oracle ``0.6``). A wrong
  call costing more than a malformed message matters: with ``μ ≤ format_penalty`` GRPO
  reinforces *any* well-formed number at first and the policy collapses onto one worker for
  every type (measured). Use ``star:8`` with the tiny model: the eight worker numbers cover
  both parities of the digit tokens a random model emits (about 2% of its first-token mass),
  and on ``star:8`` the tiny model goes from about ``−0.1`` to ``0.5–0.65`` in 70 GRPO
  iterations of 64 episodes (~1.5 min of CPU; ``examples/finetune_tiny.yaml``,
  ``tests/test_finetune.py``).
* ``"full"``: 3 parts, 3 types, free-form calls (no prefill), ``2·K`` rounds,
  ``max_new_tokens=160``, ``λ=0.05``, ``μ=0.02``, ``format_penalty=0.2``, skills drawn from
  ``skills_seed`` (:func:`scenarios.delegate_oracle.make_skills`). Meant for real LLMs.

The oracle (:meth:`TextDelegate.oracle_value`) is the skill-aware optimal orchestrator of
:mod:`scenarios.delegate_oracle` (exact; ``None`` in prefill mode with ``K > 1``, whose
one-part-per-round rule the planner does not model).

Layering: the text spaces, the tokenizer and the tool-call format are ``scenarios``'
(:mod:`scenarios.text_space`, :mod:`scenarios.toolcalls`); ``scenarios`` never imports
``marl_agents``. The language models behind ``hf`` and ``vllm`` subagents are plugged in with
:func:`register_subagent_backend` by :mod:`marl_agents.llm.subagents` (imported by the trainers
and the GRPO environment; import it yourself to run LLM subagents outside them).
"""

from __future__ import annotations

import dataclasses
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypedDict

import gymnasium as gym
import numpy as np
from langgraph.graph import END, START, StateGraph
from typing_extensions import override

from scenarios.args import cost_arg, int_arg
from scenarios.base import Outcome, Scenario, ScenarioError
from scenarios.delegate import (
    MAX_PARTS,
    MAX_ROUNDS,
    MAX_TYPES,
    SOLVED,
    merge_status,
    new_task,
)
from scenarios.delegate_oracle import Planner, make_skills
from scenarios.engine import decide
from scenarios.registry import register
from scenarios.text_space import TextSpaces, load_tokenizer
from scenarios.toolcalls import parse_tool_calls, render_tool_call
from topologies import Topology, TopologyError

FAILED = 1
TYPE_NAMES = ("math", "code", "text", "data", "plan", "web", "sql", "art")
ASSIGN, SOLVE = "assign", "solve"

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


@dataclasses.dataclass(frozen=True)
class Assignment:
    """What the environment made of one orchestrator message."""

    assignment: dict[int, int]
    errors: list[str]
    text: str


# ----- subagents ---------------------------------------------------------------------------
class ScriptedSubagent:
    """Always answers with the method matching the part's type."""

    def respond(self, prompts: Sequence[str], types: Sequence[str]) -> list[str]:
        return [render_tool_call(SOLVE, {"method": t}) for t in types]


#: subagent types a spec may name; ``scripted`` is built in, the others run a language model.
SUBAGENT_TYPES: tuple[str, ...] = ("scripted", "hf", "vllm")
_SPEC_KEYS: dict[str, tuple[str, ...]] = {
    "scripted": ("type",),
    "hf": ("type", "path", "seed", "max_new_tokens"),
    "vllm": ("type", "url", "model", "tokenizer", "max_new_tokens"),
}
#: subagent type → factory ``spec -> subagent`` (an object with ``respond(prompts, types)``
#: returning one answer text per prompt, deterministically).
SUBAGENT_BACKENDS: dict[str, Callable[[Mapping[str, Any]], Any]] = {}


def register_subagent_backend(kind: str, factory: Callable[[Mapping[str, Any]], Any]) -> None:
    """Plug in the language-model backend serving subagents of type ``kind``.

    ``scenarios`` does not import ``marl_agents`` (dependencies point the other way), so the
    ``hf`` and ``vllm`` backends are registered by :mod:`marl_agents.llm.subagents` when it is
    imported (the trainers and the GRPO environment import it).

    Args:
        kind: a type of :data:`SUBAGENT_TYPES` other than ``scripted``.
        factory: builds the subagent of one normalised spec (see :func:`check_subagents`).
    """
    if kind not in SUBAGENT_TYPES or kind == "scripted":
        raise ValueError(f"kind must be one of {SUBAGENT_TYPES[1:]}, got {kind!r}")
    SUBAGENT_BACKENDS[kind] = factory


def check_subagents(spec: Any, n_workers: int) -> list[dict[str, Any]]:
    """Normalise ``subagents`` to one plain dict per worker.

    Raises:
        ScenarioError: an unknown type or key, a missing or non-existent path, a missing url or
            model, a bad ``max_new_tokens``, or a list of the wrong length.
    """
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if len(items) == 1:
        items = items * n_workers
    if len(items) != n_workers:
        raise ScenarioError(
            f"subagents lists {len(items)} specs for {n_workers} workers: give one spec (or a "
            "list of one) for all workers, or exactly one per worker"
        )
    out = []
    for i, item in enumerate(items):
        d = {"type": item} if isinstance(item, str) else dict(item or {})
        kind = d.get("type")
        if kind not in SUBAGENT_TYPES:
            raise ScenarioError(
                f"subagents[{i}]: unknown type {kind!r}: use 'scripted', "
                "{'type': 'hf', 'path': ...} or {'type': 'vllm', 'url': ..., 'model': ...}"
            )
        unknown = sorted(set(d) - set(_SPEC_KEYS[kind]))
        if unknown:
            raise ScenarioError(
                f"subagents[{i}]: unknown key(s) {unknown} for a {kind} subagent: valid are "
                f"{', '.join(_SPEC_KEYS[kind])}"
            )
        if kind == "hf":
            path = d.get("path")
            if not path or (path != "tiny" and not (Path(path) / "config.json").exists()):
                raise ScenarioError(
                    f"subagents[{i}]: an hf subagent needs 'path': a saved HF model directory "
                    f"(with config.json) or 'tiny'; got {path!r}"
                )
        elif kind == "vllm":
            missing = [k for k in ("url", "model") if not d.get(k)]
            if missing:
                raise ScenarioError(
                    f"subagents[{i}]: a vllm subagent needs {missing} (server url and served "
                    "model name; 'tokenizer' defaults to the model name); start a server with "
                    "marl_agents.llm.VLLMServer"
                )
        budget = d.get("max_new_tokens", 48)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ScenarioError(f"subagents[{i}].max_new_tokens must be an integer ≥ 1")
        out.append(d)
    return out


def build_subagent(spec: Mapping[str, Any]) -> Any:
    """The subagent of one normalised spec (``scripted``, or a registered LLM backend).

    Raises:
        ScenarioError: an LLM type whose backend is not registered in this process.
    """
    kind = spec["type"]
    if kind == "scripted":
        return ScriptedSubagent()
    factory = SUBAGENT_BACKENDS.get(kind)
    if factory is None:
        raise ScenarioError(
            f"subagent type {kind!r} runs a language model, and no backend is registered for "
            "it in this process: `import marl_agents.llm.subagents` first (it registers 'hf' "
            "and 'vllm'; the trainers do this)"
        )
    return factory(spec)


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
class TextDelegate(Scenario):
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

    Example:
        >>> from scenarios.engine import run_inline
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
        self.workers_topology = _check_star(topology)
        self.n_workers = len(self.workers_topology.agent_ids) - 1
        self.parts = int_arg("parts", args["parts"], 1, MAX_PARTS)
        self.types = int_arg("types", args["types"], 1, MAX_TYPES)
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
    @property
    @override
    def possible_agents(self) -> list[str]:
        return ["orchestrator"]

    @override
    def observation_space(self, agent: str) -> gym.Space:
        self._check_agent(agent)
        return self.spaces.observation_space

    @override
    def action_space(self, agent: str) -> gym.Space:
        self._check_agent(agent)
        return self.spaces.action_space

    @override
    def default_action(self, agent: str) -> np.ndarray:
        return self.spaces.encode_action([])

    def _check_agent(self, agent: str) -> None:
        if agent != "orchestrator":
            raise ScenarioError(
                f"unknown agent {agent!r}: text-delegate has one RL agent, 'orchestrator' "
                "(the subagents run inside the environment)"
            )

    # ----- prompts -------------------------------------------------------------------------
    def type_name(self, type_: int) -> str:
        """The name of part type ``type_`` in prompts (``math``, ``code``, …)."""
        return TYPE_NAMES[type_]

    def prefill_text(self, part: int, state: Mapping[str, Any]) -> str:
        """The opened call the prompt ends with in prefill mode (it names the part's type)."""
        name = self.type_name(state["types"][part])
        return (
            '<tool>{"name": "assign", "arguments": {"part": '
            + f'{part}, "type": "{name}", "worker": '
        )

    def orchestrator_messages(self, state: Mapping[str, Any]) -> list[dict[str, str]]:
        """The chat messages of the orchestrator's prompt (before the generation header)."""
        workers = ", ".join(str(w) for w in range(self.n_workers))
        system = (
            f"You are the orchestrator. Workers: {workers}. Assign each part to one worker: "
            '<tool>{"name": "assign", "arguments": {"part": P, "worker": W}}</tool>'
        )
        if self.prefill:
            system = f"You are the orchestrator. Workers: {workers}. Pick a worker for the part."
        lines = []
        for i in range(self.parts):
            status = ("pending", "failed", "solved")[state["status"][i]]
            lines.append(f"part {i}: {self.type_name(state['types'][i])} {status}")
        lines.extend(state.get("reports", []))
        if state.get("last_error"):
            lines.append(f"error: {state['last_error']}")
        if self.max_rounds > 1:
            lines.append(f"round {state['decisions'] + 1} of {self.max_rounds}")
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": "\n".join(lines)},
        ]

    def prompt_ids(self, state: Mapping[str, Any]) -> list[int]:
        """The orchestrator's prompt token ids (chat template, generation header, prefill)."""
        text = self.tokenizer.apply_chat_template(
            self.orchestrator_messages(state), tokenize=False, add_generation_prompt=True
        )
        first = self._first_unsolved(state)
        if self.prefill and first is not None:
            text += self.prefill_text(first, state)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def orchestrator_obs(self, state: Mapping[str, Any]) -> np.ndarray:
        """The observation: :meth:`prompt_ids` encoded by :attr:`spaces`."""
        return self.spaces.encode_prompt(self.prompt_ids(state))

    def worker_prompt(self, worker: int, part: int, type_: int) -> str:
        """What subagent ``worker`` is asked for ``part``."""
        return (
            f"You are worker {worker}. Solve part {part}, of type {self.type_name(type_)}. "
            f'Answer <tool>{{"name": "solve", "arguments": {{"method": "<type>"}}}}</tool>'
        )

    def _first_unsolved(self, state: Mapping[str, Any]) -> int | None:
        return next((i for i in range(self.parts) if state["status"][i] != SOLVED), None)

    # ----- parsing -------------------------------------------------------------------------
    def parse(self, text: str, state: Mapping[str, Any]) -> Assignment:
        """Turn the orchestrator's generated ``text`` into assignments and format errors."""
        unsolved = {i for i in range(self.parts) if state["status"][i] != SOLVED}
        if self.prefill:
            first = self._first_unsolved(state)
            if first is None:
                return Assignment({}, [], text)
            full = self.prefill_text(first, state) + text
            parsed = parse_tool_calls(full, tool_names={ASSIGN})
            if not parsed.tool_calls:
                m = re.match(r"\s*(\d+)", text)
                if m is None:
                    return Assignment({}, ["expected a worker number"], full)
                closed = self.prefill_text(first, state) + m.group(1) + "}}</tool>"
                parsed = parse_tool_calls(closed, tool_names={ASSIGN})
                full = closed
            calls, errors = parsed.tool_calls[:1], list(parsed.errors)
            if calls:
                errors = []  # the first call counts; text after it is ignored
        else:
            parsed = parse_tool_calls(text, tool_names={ASSIGN})
            calls, errors, full = parsed.tool_calls, list(parsed.errors), text
        assignment: dict[int, int] = {}
        for call in calls:
            part, worker = call.arguments.get("part"), call.arguments.get("worker")
            if not _is_int(part) or part not in unsolved:
                errors.append(f"part must be an unsolved part number, got {part!r}")
            elif not _is_int(worker) or not 0 <= worker < self.n_workers:
                errors.append(f"worker must be 0..{self.n_workers - 1}, got {worker!r}")
            elif part in assignment:
                errors.append(f"part {part} assigned twice")
            else:
                assignment[part] = worker
        return Assignment(assignment, errors, full)

    # ----- the graph -----------------------------------------------------------------------
    @override
    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        return {
            **new_task(rng, self.parts, self.types),
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
            method = _method(answers[part])
            ok = method == self.type_name(type_) and self.draw(
                state["task_seed"], round_, part, worker
            ) < float(self.skills[worker, type_])
            status[part] = SOLVED if ok else FAILED
            attempts.append((round_, part, worker, method or "", ok))
            reports.append(f"worker {worker} {'solved' if ok else 'failed'} part {part}")
        return {"status": status, "attempts": attempts, "reports": reports, "assignment": {}}

    @staticmethod
    def draw(task_seed: int, round_: int, part: int, worker: int) -> float:
        """The common-random-number skill draw (the same as ``delegate``'s)."""
        return float(np.random.default_rng([task_seed, round_, part, worker]).random())

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
            self._planner = Planner(
                self.skills,
                self.parts,
                self.max_rounds,
                self.latency_cost,
                self.call_cost,
                True,
            )
        types = self.initial_state(rng)["types"]
        counts = np.bincount(types, minlength=self.types)
        return self._planner.value(tuple(int(c) for c in counts), 0)

    def oracle_text(self, state: Mapping[str, Any]) -> str:
        """What an optimal orchestrator writes in ``state`` (for tests and demos)."""
        best = self.skills.argmax(axis=0)
        pending = [i for i in range(self.parts) if state["status"][i] != SOLVED]
        if self.prefill:
            return f"{int(best[state['types'][pending[0]]])}" if pending else ""
        return "".join(
            render_tool_call(ASSIGN, {"part": i, "worker": int(best[state["types"][i]])})
            for i in pending
        )


def _check_star(topology: str | Topology) -> Topology:
    fix = "pass topology='star:N' with N ≥ 1 subagents"
    try:
        topo = Topology.from_spec(topology)
    except TopologyError as exc:
        raise ScenarioError(f"text-delegate: bad topology {topology!r} ({exc}); {fix}") from None
    if topo.kind != "star":
        raise ScenarioError(f"text-delegate runs on star:N, not {topo.spec or topo.name!r}: {fix}")
    return topo


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _method(text: str) -> str | None:
    """The ``method`` of the first valid ``solve`` call in a subagent's answer."""
    for call in parse_tool_calls(text, tool_names={SOLVE}).tool_calls:
        method = call.arguments.get("method")
        if isinstance(method, str):
            return method
    return None
