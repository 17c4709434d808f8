"""``text-toolchain``: the ``toolchain`` task for LLM agents that write their tool calls as text.

The task, the tools and the per-call checklist are :mod:`scenarios.toolchain`'s (a
:class:`~scenarios.toolchain.Toolchain` is built inside and its task generation, tool
execution, checklist and verifier are used as they are): report ``table[k1] <op> table[k2]``
(mod 97), where only ``lookup`` reads the hidden table. What changes is the interface:

* **Observation**: the token ids of a chat prompt (the tokenizer's chat template), right-padded
  to ``max_prompt_tokens`` (:class:`scenarios.text_space.TextSpaces`; a longer prompt
  keeps its end). The prompt holds a system message describing the tools in the documented
  ``<tool>`` format, the agent's view of the task (``Task: k1 = 2, k2 = ?, op = add.``; ``?``
  marks a field another agent sees) and the episode so far: the agent's own calls as assistant
  turns, and for every call of the team a result line ``#i lookup(key=2) = 57`` (``#i``
  numbers the call; ``failed`` for a call with invalid arguments), passes of other agents, and
  the agent's own format errors.
* **Action**: the generated token ids, right-padded to ``max_new_tokens``; they are cut after
  the first EOS and decoded (special tokens skipped).
* **A turn** must hold exactly one call (text around it is allowed) in the format of
  :mod:`scenarios.toolcalls`: ``lookup {"key": int}``, ``calc {"op": "add" | "sub" |
  "mul" | "max", "x": int, "y": int}`` (``x``/``y`` name earlier calls by their ``#i``),
  ``answer {"x": int}`` (submit call ``x``'s result; ends the episode) or ``done {}`` (pass
  the turn on). Anything else — no call, several calls, malformed JSON, an unknown tool, wrong
  argument names, non-integer or negative numbers, a non-string op — is a **format error**:
  nothing is executed, the turn is used up, and the episode goes on. A well-formed call with
  out-of-range values (``key=99``, an op the task does not use, an unfilled register) is
  executed as an invalid call (``ok=False``), exactly as in ``toolchain``.

Budgets: at most ``max_calls`` executed calls (as in ``toolchain``) and ``max_turns`` turns
(decisions, including format errors and passes) per episode; an episode ends when one runs out.

Reward: ``toolchain``'s checklist + final verification, minus ``format_penalty`` per format
error (``Outcome.local`` likewise per agent, over its own calls and errors). Metrics add
``format_errors`` and ``turns``. Topologies: ``single`` and ``chain:N`` (the task split as in
``toolchain``). Absent agents pass (``done``).

Layering note: the text spaces, the tiny tokenizer (``tokenizer=None`` or ``"tiny"``) and the
tool-call format come from :mod:`scenarios.text_space` and :mod:`scenarios.toolcalls`; building
a tokenizer needs the ``llm`` extra (transformers, tokenizers).

Example:
    >>> from scenarios.decisions import run_inline
    >>> tt = TextToolchain("single")
    >>> _, outcome, decisions = run_inline(tt, tt.optimal_policy(), seed=0)
    >>> round(outcome.reward, 2), decisions, outcome.metrics["format_errors"]
    (1.3, 4, 0.0)
"""

from __future__ import annotations

import operator
import re
from typing import Annotated, Any, TypedDict

import numpy as np
from langgraph.graph import StateGraph

from scenarios.args import cost_arg, int_arg
from scenarios.base import Outcome, Scenario, ScenarioError
from scenarios.counterfactual import Policy
from scenarios.decisions import decide
from scenarios.declared import DeclaredSpaces
from scenarios.registry import register
from scenarios.text_space import TextSpaces, encode_prompt, load_tokenizer
from scenarios.tool_latency import tool_call
from scenarios.toolcalls import parse_tool_calls, render_tool_call, render_tool_instructions
from scenarios.toolchain import ANSWER, DONE, OPS, TASK_ARGS, TOOLS, Toolchain
from topologies import Topology

#: argument names of each tool, in the order of the ``(arg, x, y)`` action fields they fill.
TOOL_ARGS = {"lookup": ("key",), "calc": ("op", "x", "y"), "answer": ("x",), "done": ()}
_CALL_LINE = re.compile(r"^#(\d+) (lookup|calc|answer)\((.*?)\) (?:= (-?\d+)|failed)$")
_TASK_LINE = re.compile(r"Task: k1 = (\d+|\?), k2 = (\d+|\?), op = (\w+|\?)\.")
ERROR_CHARS = 100  # format error messages shown in prompts are cut to this many characters


class TextToolchainState(TypedDict, total=False):
    """``toolchain``'s state plus the episode's turns (calls, format errors, passes) in order."""

    task: dict[str, int]
    table: list[int]
    calls: Annotated[list[dict[str, Any]], operator.add]
    events: Annotated[list[dict[str, Any]], operator.add]
    answer: int | None
    finished: bool


@register
class TextToolchain(DeclaredSpaces, Scenario):
    """``toolchain`` for LLM agents: token-id observations and actions, ``<tool>`` text calls.

    Args:
        topology: ``"single"`` (default), ``"chain:N"`` or a :class:`Topology` of those kinds.
        task: the task's keyword arguments, as in :class:`~scenarios.toolchain.Toolchain`
            (:data:`~scenarios.toolchain.TASK_ARGS`: ``n_keys``, ``n_ops``, ``max_calls``,
            ``checklist_weights``, ``final_weight``, ``fail_tool``).
        max_turns: decisions per episode (calls, format errors and passes), in
            [1, 256]; default ``2 * max_calls``.
        format_penalty: subtracted from the reward per format error, a finite number ≥ 0.
        tokenizer: a Hugging Face tokenizer with a chat template, the path of a local
            tokenizer directory, or ``"tiny"`` / ``None``: the tiny tokenizer built in code.
        max_prompt_tokens: observation length (prompt ids), in [16, 65536].
        max_new_tokens: action length (generated ids), in [8, 4096].

    Raises:
        ScenarioError: a bad argument value or an unsupported topology.
    """

    name = "text-toolchain"
    version = 0
    summary = "toolchain for LLM agents: token-id actions, <tool> text calls, format penalty"
    topologies = Toolchain.topologies
    default_topology = Toolchain.default_topology
    has_text_agents = True
    has_oracle = True
    has_local_rewards = True

    def __init__(
        self,
        topology: str | Topology = "single",
        *,
        max_turns: int | None = None,
        format_penalty: float = 0.1,
        tokenizer: Any = None,
        max_prompt_tokens: int = 1024,
        max_new_tokens: int = 48,
        **task: Any,
    ) -> None:
        unknown = sorted(set(task) - set(TASK_ARGS))
        if unknown:
            raise ScenarioError(
                f"text-toolchain got unknown argument(s) {unknown}: it accepts topology, "
                f"max_turns, format_penalty, tokenizer, max_prompt_tokens, max_new_tokens and "
                f"the task's {', '.join(TASK_ARGS)}"
            )
        self.base = Toolchain(topology, **task)
        self.topology = self.base.topology
        turns = 2 * self.base.max_calls if max_turns is None else max_turns
        self.max_turns = int_arg("max_turns", turns, 1, 256)
        self.format_penalty = cost_arg("format_penalty", format_penalty)
        self.tokenizer = _tokenizer(tokenizer)
        self.spaces = TextSpaces.for_tokenizer(
            self.tokenizer,
            int_arg("max_prompt_tokens", max_prompt_tokens, 16, 65536),
            int_arg("max_new_tokens", max_new_tokens, 8, 4096),
        )
        spaces = (self.spaces.observation_space, self.spaces.action_space)
        self.agent_spaces = dict.fromkeys(self.base.possible_agents, spaces)
        self.ops = [name for name, _ in OPS[: self.base.n_ops]]
        self.tools = _tool_specs(self.ops)
        self._stops = _stop_ids(self.tokenizer)
        # one superstep per agent visit; GraphEnv caps env steps (turns) by this number too
        agents = len(self.topology.agents)
        self.max_supersteps = max(Scenario.max_supersteps, self.max_turns + 2 * agents + 4)

    # ----- the Dec-POMDP -------------------------------------------------------------------
    @property
    def text_agents(self) -> tuple[str, ...]:
        """Agents acting with text spaces (token ids): all of them."""
        return tuple(self.possible_agents)

    def default_action(self, agent: str) -> np.ndarray:
        """``done``: an absent agent passes its turn."""
        self._known(agent)
        return self.action_of(render_tool_call("done", {}))

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        return {**self.base.initial_state(rng), "events": []}

    def build_graph(self) -> StateGraph:
        return self.topology.to_langgraph(self._node, TextToolchainState)

    # ----- text in, text out ---------------------------------------------------------------
    def messages(self, agent: str, state: dict[str, Any]) -> list[dict[str, str]]:
        """``agent``'s chat prompt: tools, its view of the task, the episode so far."""
        task, seen = state["task"], self.base.visible[agent]
        fields = {f: (self._field(f, task[f]) if f in seen else "?") for f in ("k1", "k2", "op")}
        system = (
            f"You are {agent}, one of {len(self.possible_agents)} agents. Report "
            "table[k1] <op> table[k2] mod 97: lookup both keys, calc, answer. One tool call "
            "per reply; #i is call i (for x, y); '?' is another agent's field.\n"
            + render_tool_instructions(self.tools)
        )
        task_line = f"Task: k1 = {fields['k1']}, k2 = {fields['k2']}, op = {fields['op']}."
        out = [{"role": "system", "content": system}, {"role": "user", "content": task_line}]
        calls = state.get("calls", [])
        for event in state.get("events", []):
            kind, who = event["kind"], event["agent"]
            if kind == "call":
                i = event["call"]
                if who == agent:
                    name, args = self._call_args(calls[i])
                    out.append({"role": "assistant", "content": render_tool_call(name, args)})
                out.append({"role": "tool", "content": self.result_line(i, calls[i])})
            elif kind == "done" and who != agent:
                out.append({"role": "user", "content": f"{who} passed."})
            elif kind == "error" and who == agent:
                out.append(
                    {
                        "role": "user",
                        "content": f"Format error: {event['error'][:ERROR_CHARS]}",
                    }
                )
        return out

    def observe(self, agent: str, state: dict[str, Any]) -> np.ndarray:
        """``agent``'s observation: its prompt's token ids, right-padded."""
        return self.spaces.encode_prompt(encode_prompt(self.tokenizer, self.messages(agent, state)))

    def result_line(self, i: int, call: dict[str, Any]) -> str:
        """``#i name(args) = value`` or ``#i name(args) failed``."""
        name, args = self._call_args(call)
        shown = ", ".join(f"{k}={v}" for k, v in args.items())
        outcome = f"= {call['value']}" if call["ok"] else "failed"
        return f"#{i} {name}({shown}) {outcome}"

    def text_of(self, action: Any) -> str:
        """The text of an action: its ids up to the first EOS, special tokens skipped."""
        ids = self.spaces.decode_action(action)
        end = next((i + 1 for i, t in enumerate(ids) if t in self._stops), len(ids))
        known = [t for t in ids[:end] if t < len(self.tokenizer)]
        return self.tokenizer.decode(known, skip_special_tokens=True)

    def action_of(self, text: str, eos: bool = True) -> np.ndarray:
        """The action array generating ``text`` (then EOS when ``eos``); for scripted agents."""
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos and self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        return self.spaces.encode_action(ids)

    def parse(self, text: str) -> tuple[tuple[int, int, int, int] | None, str]:
        """One turn's text → ``(tool, arg, x, y)`` as ``toolchain`` executes it, or an error.

        Returns:
            ``(fields, "")`` for a well-formed call, ``(None, message)`` for a format error.
        """
        parsed = parse_tool_calls(text, TOOLS)
        if parsed.errors:
            return None, parsed.errors[0]
        if len(parsed.tool_calls) != 1:
            return None, f"{len(parsed.tool_calls)} tool calls; give exactly one per reply"
        call = parsed.tool_calls[0]
        names = TOOL_ARGS[call.name]
        if set(call.arguments) != set(names):
            return None, f"{call.name} takes arguments {list(names)}, got {sorted(call.arguments)}"
        values: list[int] = []
        for key in names:
            v = call.arguments[key]
            if key == "op":
                if not isinstance(v, str):
                    return None, f'"op" must be a string, one of {self.ops}'
                names_all = [n for n, _ in OPS]  # an op the task does not use is invalid
                values.append(names_all.index(v) if v in names_all else len(OPS))
            elif isinstance(v, bool) or not isinstance(v, int) or v < 0:
                return None, f'"{key}" must be an integer >= 0, got {v!r}'
            else:
                values.append(v)
        tool = TOOLS.index(call.name)
        fields = [0, *values] if tool == ANSWER else values  # answer's x is the x field
        arg, x, y = fields + [0] * (3 - len(fields))
        return (tool, arg, x, y), ""

    # ----- the agents' node ----------------------------------------------------------------
    def _node(self, node: str) -> Any:
        def act(state: dict[str, Any]) -> dict[str, Any]:
            if state.get("finished"):
                return {}
            log = list(state.get("calls", []))
            events = list(state.get("events", []))
            view = {**state, "calls": log, "events": events}  # grows as the node acts
            new_calls, new_events, answer = [], [], None
            finished = node == self.topology.agents[-1]
            while len(log) < self.base.max_calls and len(events) < self.max_turns:
                fields, error = self.parse(self.text_of(decide(node, self.observe(node, view))))
                if fields is None:
                    event: dict[str, Any] = {"agent": node, "kind": "error", "error": error}
                elif fields[0] == DONE:
                    event = {"agent": node, "kind": "done"}
                else:
                    call = tool_call(TOOLS[fields[0]], self.base.run_tool, state, log, *fields)
                    call["agent"] = node
                    event = {"agent": node, "kind": "call", "call": len(log)}
                    log.append(call)
                    new_calls.append(call)
                events.append(event)
                new_events.append(event)
                if event["kind"] == "done":
                    break
                if event["kind"] == "call" and fields is not None and fields[0] == ANSWER:
                    finished, answer = True, log[-1]["value"]
                    break
            finished = finished or len(log) >= self.base.max_calls
            finished = finished or len(events) >= self.max_turns
            return {
                "calls": new_calls,
                "events": new_events,
                "answer": answer,
                "finished": finished,
            }

        act.__name__ = f"text_toolchain_{node}"
        return act

    # ----- verification --------------------------------------------------------------------
    def score(self, state: dict[str, Any]) -> Outcome:
        """``toolchain``'s score minus ``format_penalty`` per format error."""
        out = self.base.score(state)
        events = state.get("events", [])
        errors: dict[str, int] = {}
        for e in events:
            if e["kind"] == "error":
                errors[e["agent"]] = errors.get(e["agent"], 0) + 1
        out.reward -= self.format_penalty * sum(errors.values())
        out.local = {a: r - self.format_penalty * errors.get(a, 0) for a, r in out.local.items()}
        out.metrics.update(format_errors=float(sum(errors.values())), turns=float(len(events)))
        return out

    def oracle_value(self, rng: np.random.Generator) -> float:
        """Four well-formed calls meet every criterion and answer correctly."""
        return self.base.oracle_value(rng)

    # ----- the scripted solution -----------------------------------------------------------
    def optimal_policy(self) -> Policy:
        """A policy reading only the prompt text (as ``toolchain``'s scripted solution):
        fetch the visible keys (k1 first), combine the first two lookups when it sees ``op``,
        answer that result, otherwise pass. Its actions are token ids of well-formed calls."""

        def policy(agent: str, obs: Any) -> np.ndarray:
            text = self.spaces.prompt_text(obs, self.tokenizer)
            task = _TASK_LINE.search(text)
            if task is None:
                raise ValueError("the prompt was truncated: raise max_prompt_tokens")
            k1, k2, op = task.groups()
            calls = {}
            for line in text.splitlines():
                m = _CALL_LINE.match(line.replace("<|im_end|>", ""))
                if m:
                    calls[int(m.group(1))] = (m.group(2), m.group(3), m.group(4) is not None)
            looked = [i for i, (t, _, ok) in sorted(calls.items()) if t == "lookup" and ok]
            fetched = {calls[i][1] for i in looked}
            for key in (k1, k2):
                if key != "?" and f"key={key}" not in fetched:
                    return self.action_of(render_tool_call("lookup", {"key": int(key)}))
            if op != "?" and len(looked) >= 2:
                want = f"op={op}, x={looked[0]}, y={looked[1]}"
                done = [
                    i
                    for i, (t, a, ok) in sorted(calls.items())
                    if (t, a, ok) == ("calc", want, True)
                ]
                if done:
                    return self.action_of(render_tool_call("answer", {"x": done[-1]}))
                return self.action_of(
                    render_tool_call("calc", {"op": op, "x": looked[0], "y": looked[1]})
                )
            return self.action_of(render_tool_call("done", {}))

        return policy

    # ----- helpers -------------------------------------------------------------------------
    def _field(self, field: str, value: int) -> str:
        return OPS[value][0] if field == "op" else str(value)

    def _call_args(self, call: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        name = call["tool"]
        if name == "lookup":
            return name, {"key": call["arg"]}
        if name == "calc":
            op = OPS[call["arg"]][0] if call["arg"] < len(OPS) else "?"
            return name, {"op": op, "x": call["x"], "y": call["y"]}
        return name, {"x": call["x"]}


def _tool_specs(ops: list[str]) -> list[dict[str, Any]]:
    """The tools in OpenAI function format, for the system prompt."""

    def fn(name: str, description: str, **params: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {"type": "object", "properties": params},
            },
        }

    integer = {"type": "integer"}
    return [
        fn("lookup", "Read table[key].", key=integer),
        fn(
            "calc",
            "Combine the results of calls x and y (sub is x - y), mod 97.",
            op={"type": "string", "enum": ops},
            x=integer,
            y=integer,
        ),
        fn("answer", "Submit the result of call x; ends the episode.", x=integer),
        fn("done", "Pass the turn to the next agent."),
    ]


def _tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None or isinstance(tokenizer, str):
        try:
            return load_tokenizer(tokenizer or "tiny")
        except (OSError, ValueError) as exc:
            raise ScenarioError(
                f"tokenizer {tokenizer!r} could not be loaded ({exc}): give 'tiny' or a "
                "directory saved with save_pretrained"
            ) from None
    if not callable(getattr(tokenizer, "apply_chat_template", None)):
        raise ScenarioError(
            f"tokenizer={tokenizer!r}: give a Hugging Face tokenizer with a chat template, "
            "a local tokenizer directory, or None for the tiny tokenizer"
        )
    return tokenizer


def _stop_ids(tokenizer: Any) -> set[int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}
