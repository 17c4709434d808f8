"""``toolchain``: multi-step tool use with deterministic tools and a per-call checklist.

Task: report ``table[k1] <op> table[k2]`` (mod 97) for two distinct keys and one of ``n_ops``
calculator ops (``add``, ``sub``, ``mul``, ``max``; ``sub`` is ``table[k1] - table[k2]``). The
``table`` (``n_keys`` values in [0, 97)) is hidden: only the ``lookup`` tool reads it. The
shortest solution is four calls: ``lookup(k1)``, ``lookup(k2)``, ``calc(op, r0, r1)``,
``answer(r2)``.

**Tools are internal functions**, not graph nodes: an agent's node loops — observe, ``decide``
one call, run the tool, append the call to the shared call log — until the agent calls ``done``
(hand the turn on) or ``answer`` (submit; ends the episode), or ``max_calls`` calls were made in
the episode. So the named topologies' static edges run unchanged and every call is one env step.
A tool named by ``fail_tool`` raises :class:`ToolError` out of the node (a crash or timeout);
the engine ends such an episode truncated with the error in its infos.

Action (every agent): ``MultiDiscrete([4, A, R, R])`` = ``[tool, arg, x, y]`` with tools
``0 lookup(key=arg)``, ``1 calc(op=arg, x, y)``, ``2 answer(x)``, ``3 done`` (not a call);
``A = max(n_keys, n_ops)``, ``R = max_calls``; registers ``x``/``y`` name earlier calls by index
(a call that failed validation leaves an empty register). Unused fields are ignored.

Observation (every agent, ``Box(0, 1, float32)``): its own part of the task — one-hots of
``k1`` (``n_keys``), ``k2`` (``n_keys``) and ``op`` (``n_ops``), zeros where it does not see
that field — then the public call log, ``R`` slots of ``[tool one-hot (3), arg one-hot (A),
x one-hot (R), y one-hot (R), ok]`` (zero padding after the last call). Tool *results* (table
values) are never shown: agents plan, the verifier checks values.

Topologies: ``single`` (the agent sees the whole task) and ``chain:N`` — the task is split along
the pipeline: ``agent_0`` (planner) sees ``k1`` (and ``k2`` when N = 2), ``agent_1`` sees ``k2``
(N ≥ 3), the last agent (answerer) sees ``op``; agents in between see no task field and should
pass. Star and tree skeletons are rejected: their static report edges give a worker one step
per visit and parallel workers cannot see each other's results within a superstep.

Reward: each call is judged by three binary criteria — ``right_tool`` (the tool the task needs
next: lookup until both keys were fetched, then calc until the target was combined, then
answer), ``valid_args`` (arguments in range and registers filled) and ``result_used`` (a later
call consumes the call's result; the answer call counts when it is valid). With ``f_c`` the
fraction of calls meeting criterion ``c``, ``reward = Σ_c checklist_weights[c] · f_c +
final_weight · answer_correct``: the final verification always counts (``final_weight > 0``).
``Outcome.local`` gives each agent the same formula over its own calls. Metrics:
``checklist/<criterion>``, ``answer_correct`` and ``calls``. Absent agents pass (``done``).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Annotated, Any, TypedDict

import gymnasium as gym
import numpy as np
from langgraph.graph import StateGraph

from scenarios.args import checked_action, cost_arg, int_arg
from scenarios.base import Outcome, Scenario, ScenarioError
from scenarios.counterfactual import Policy
from scenarios.decisions import decide
from scenarios.declared import DeclaredSpaces, accept_topology
from scenarios.registry import register
from scenarios.reward_sources import Checklist
from scenarios.tool_latency import tool_call
from topologies import MarlError, Topology

TOOLS = ("lookup", "calc", "answer", "done")
LOOKUP, CALC, ANSWER, DONE = range(4)
OPS = (("add", operator.add), ("sub", operator.sub), ("mul", operator.mul), ("max", max))
COMMUTATIVE = {"add", "mul", "max"}
CRITERIA = ("right_tool", "valid_args", "result_used")
DEFAULT_WEIGHTS = dict.fromkeys(CRITERIA, 0.1)
MODULUS = 97
#: the task's keyword arguments (``text-toolchain`` passes them through)
TASK_ARGS = ("n_keys", "n_ops", "max_calls", "checklist_weights", "final_weight", "fail_tool")
ACCEPTED = "single, chain:N"


class ToolError(MarlError, RuntimeError):
    """A tool crashed or timed out (simulated with ``fail_tool``)."""


class ToolchainState(TypedDict, total=False):
    """Graph state: the task, the hidden table, the call log, the answer and a finished flag."""

    task: dict[str, int]
    table: list[int]
    calls: Annotated[list[dict[str, Any]], operator.add]
    answer: int | None
    finished: bool


@register
class Toolchain(DeclaredSpaces, Scenario):
    """Look up two values, combine them with a calculator op, answer; judged call by call.

    Args:
        topology: ``"single"`` (default), ``"chain:N"`` or a :class:`Topology` of those kinds.
        n_keys: lookup table size, in [2, 16].
        n_ops: calculator ops used (the first of add, sub, mul, max), in [1, 4].
        max_calls: call budget of an episode, in [4, 32] (4 calls solve the task).
        checklist_weights: criterion → weight ≥ 0 for ``right_tool``, ``valid_args``,
            ``result_used``; criteria left out keep their default 0.1.
        final_weight: weight of ``answer_correct``, a finite number > 0.
        fail_tool: ``None`` or ``"lookup"`` / ``"calc"`` / ``"answer"``: that tool raises.

    Raises:
        ScenarioError: a bad argument value or an unsupported topology.

    Example:
        >>> from scenarios.decisions import run_inline
        >>> tc = Toolchain("chain:3")
        >>> _, outcome, decisions = run_inline(tc, tc.optimal_policy(), seed=0)
        >>> round(outcome.reward, 2), outcome.metrics["calls"]
        (1.3, 4.0)
    """

    name = "toolchain"
    version = 0
    summary = "look up two values, combine them, answer; per-call checklist plus final check"
    topologies = ("single", "chain")
    default_topology = "single"
    has_oracle = True
    has_local_rewards = True

    def __init__(
        self,
        topology: str | Topology = "single",
        *,
        n_keys: int = 4,
        n_ops: int = 4,
        max_calls: int = 8,
        checklist_weights: Mapping[str, float] | None = None,
        final_weight: float = 1.0,
        fail_tool: str | None = None,
    ) -> None:
        self.topology = accept_topology("toolchain", topology, self.topologies, ACCEPTED)
        self.n_keys = int_arg("n_keys", n_keys, 2, 16)
        self.n_ops = int_arg("n_ops", n_ops, 1, len(OPS))
        self.max_calls = int_arg("max_calls", max_calls, 4, 32)
        self.weights = _weights(checklist_weights)
        self.final_weight = cost_arg("final_weight", final_weight)
        if self.final_weight == 0:
            raise ScenarioError("final_weight must be > 0: the final verification always counts")
        if fail_tool not in (None, *TOOLS[:DONE]):
            raise ScenarioError(f"fail_tool={fail_tool!r}: give None, 'lookup', 'calc' or 'answer'")
        self.fail_tool = fail_tool
        agents = self.topology.agents
        self.visible = {a: set() for a in agents}
        self.visible[agents[0]].add("k1")
        self.visible[agents[1] if len(agents) >= 3 else agents[0]].add("k2")
        self.visible[agents[-1]].add("op")
        self.arg_size = max(self.n_keys, self.n_ops)
        #: where a log slot's tool, arg, x and y one-hots start; ``ok`` is its last entry.
        self._starts = np.cumsum([0, 3, self.arg_size, self.max_calls])
        self.slot = int(self._starts[-1]) + self.max_calls + 1
        size = 2 * self.n_keys + self.n_ops + self.max_calls * self.slot
        obs_space = gym.spaces.Box(0.0, 1.0, (size,), np.float32)
        nvec = [len(TOOLS), self.arg_size, self.max_calls, self.max_calls]
        act_space = gym.spaces.MultiDiscrete(nvec)
        self.agent_spaces = {a: (obs_space, act_space) for a in agents}
        # one superstep per agent; GraphEnv also caps env steps (calls + passes) by this number
        self.max_supersteps = max(Scenario.max_supersteps, self.max_calls + 2 * len(agents) + 4)

    # ----- the Dec-POMDP -------------------------------------------------------------------
    def default_action(self, agent: str) -> np.ndarray:
        """``done``: an absent agent passes its turn without calling a tool."""
        self._known(agent)
        return np.array([DONE, 0, 0, 0], dtype=np.int64)

    def observe(self, agent: str, task: dict[str, int], log: list[dict[str, Any]]) -> np.ndarray:
        """``agent``'s view: its own task fields and the public call log (no tool results)."""
        obs = np.zeros(self.observation_space(agent).shape, np.float32)
        offsets = {"k1": 0, "k2": self.n_keys, "op": 2 * self.n_keys}
        for field in self.visible[agent]:
            obs[offsets[field] + task[field]] = 1.0
        base = 2 * self.n_keys + self.n_ops
        for i, call in enumerate(log):
            slot = obs[base + i * self.slot : base + (i + 1) * self.slot]
            fields = (TOOLS.index(call["tool"]), call["arg"], call["x"], call["y"])
            slot[self._starts + np.array(fields)] = 1.0
            slot[-1] = float(call["ok"])
        return obs

    def build_graph(self) -> StateGraph:
        return self.topology.to_langgraph(self._node, ToolchainState)

    def _node(self, node: str) -> Any:
        space = self.action_space(node)

        def act(state: dict[str, Any]) -> dict[str, Any]:
            if state.get("finished"):
                return {}
            log, new, answer = list(state.get("calls", [])), [], None
            finished = node == self.topology.agents[-1]
            while len(log) < self.max_calls:
                obs = self.observe(node, state["task"], log)
                tool, arg, x, y = checked_action(space, decide(node, obs), node).tolist()
                if tool == DONE:
                    break
                # latency/timeouts of episodes.tool_latency (scenarios.tool_latency)
                call = tool_call(TOOLS[tool], self.run_tool, state, log, tool, arg, x, y)
                call["agent"] = node
                log.append(call)
                new.append(call)
                if tool == ANSWER:
                    finished, answer = True, call["value"]
                    break
            finished = finished or len(log) >= self.max_calls
            return {"calls": new, "answer": answer, "finished": finished}

        act.__name__ = f"toolchain_{node}"
        return act

    def run_tool(
        self, state: dict[str, Any], log: list[dict[str, Any]], tool: int, arg: int, x: int, y: int
    ) -> dict[str, Any]:
        """Execute one call against ``log``; an invalid call returns ``ok=False`` and no value.

        Raises:
            ToolError: when ``tool`` is the ``fail_tool``.
        """
        name = TOOLS[tool]
        if name == self.fail_tool:
            raise ToolError(f"tool {name!r} failed (simulated crash/timeout: fail_tool={name!r})")
        call = {"tool": name, "arg": arg, "x": x, "y": y, "ok": False, "value": None, "src": None}

        def filled(r: int) -> bool:
            return r < len(log) and log[r]["ok"]

        if tool == LOOKUP and arg < self.n_keys:
            call.update(ok=True, value=state["table"][arg], src=f"L{arg}")
        elif tool == CALC and arg < self.n_ops and filled(x) and filled(y):
            op_name, fn = OPS[arg]
            value = fn(log[x]["value"], log[y]["value"]) % MODULUS
            call.update(ok=True, value=value, src=f"{op_name}({log[x]['src']},{log[y]['src']})")
        elif tool == ANSWER and filled(x):
            call.update(ok=True, value=log[x]["value"], src=log[x]["src"])
        return call

    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        k1, k2 = (int(k) for k in rng.choice(self.n_keys, size=2, replace=False))
        task = {"k1": k1, "k2": k2, "op": int(rng.integers(self.n_ops))}
        table = [int(v) for v in rng.integers(0, MODULUS, size=self.n_keys)]
        return {"task": task, "table": table, "calls": [], "answer": None, "finished": False}

    # ----- verification --------------------------------------------------------------------
    def target(self, state: dict[str, Any]) -> int:
        """The correct answer of the episode's task."""
        task, table = state["task"], state["table"]
        return OPS[task["op"]][1](table[task["k1"]], table[task["k2"]]) % MODULUS

    def reward_checklist(self) -> Checklist:
        """The per-call checklist (a reward source, :mod:`scenarios.reward_sources`): each call
        ``(index, call)`` of the log judged by ``right_tool``, ``valid_args`` and
        ``result_used``, weighted by ``checklist_weights``."""
        return Checklist(
            {"right_tool": _right_tool, "valid_args": _valid_args, "result_used": _result_used},
            dict(self.weights),
            messages=lambda state, turns: list(enumerate(state.get("calls", []))),
        )

    def judge(self, task: dict[str, int], calls: list[dict[str, Any]]) -> list[dict[str, bool]]:
        """The checklist of every call, in order: criterion → passed."""
        state = {"task": task, "calls": calls}
        return self.reward_checklist().marks(state, list(enumerate(calls)))

    def checklist(self, marks: list[dict[str, bool]]) -> dict[str, float]:
        """Fraction of calls meeting each criterion (0 when there were no calls)."""
        return {c: sum(m[c] for m in marks) / len(marks) if marks else 0.0 for c in CRITERIA}

    def tool_calls(self, agent: str, action: Any) -> int:
        """Tool calls in one decision (1 unless it is ``done``): the ``tool_calls`` shaping
        term of :mod:`scenarios.reward_sources`."""
        return int(np.asarray(action)[0] != DONE)

    def score(self, state: dict[str, Any]) -> Outcome:
        """Weighted checklist fractions plus ``final_weight`` × ``answer_correct``."""
        calls = state.get("calls", [])
        checklist = self.reward_checklist()
        answer = state.get("answer")
        correct = answer is not None and answer == self.target(state)
        final = self.final_weight * correct

        def reward(indices: list[int]) -> float:
            fractions = checklist.fractions(state, [(i, calls[i]) for i in indices])
            return checklist.value(fractions) + final

        local = {
            a: reward([i for i, c in enumerate(calls) if c["agent"] == a])
            for a in self.possible_agents
        }
        everything = list(enumerate(calls))
        metrics = {f"checklist/{c}": f for c, f in checklist.fractions(state, everything).items()}
        metrics.update(answer_correct=float(correct), calls=float(len(calls)))
        return Outcome(
            reward=reward(list(range(len(calls)))), success=correct, local=local, metrics=metrics
        )

    def oracle_value(self, rng: np.random.Generator) -> float:
        """The four-call solution meets every criterion and answers correctly."""
        return sum(self.weights.values()) + self.final_weight

    def decode(self, obs: Any) -> tuple[dict[str, int], list[tuple[int, ...]]]:
        """Invert :meth:`observe`: the visible task fields and ``(tool, arg, x, y, ok)`` calls."""
        obs = np.asarray(obs)
        nk, no = self.n_keys, self.n_ops
        parts = {"k1": obs[:nk], "k2": obs[nk : 2 * nk], "op": obs[2 * nk : 2 * nk + no]}
        fields = {f: int(v.argmax()) for f, v in parts.items() if v.any()}
        log = obs[2 * nk + no :].reshape(self.max_calls, self.slot)
        calls = [
            (*(int(part.argmax()) for part in np.split(s[:-1], self._starts[1:])), int(s[-1]))
            for s in log
            if s[:3].any()
        ]
        return fields, calls

    # ----- the scripted solution -----------------------------------------------------------
    def optimal_policy(self) -> Policy:
        """A policy reading only ``obs``: fetch the keys it sees (k1 first), combine the first
        two lookups when it sees ``op``, answer that result, otherwise pass."""

        def policy(agent: str, obs: Any) -> np.ndarray:
            fields, calls = self.decode(obs)
            looked = [i for i, c in enumerate(calls) if c[0] == LOOKUP and c[4]]
            fetched = {calls[i][1] for i in looked}
            for key in ("k1", "k2"):
                if key in fields and fields[key] not in fetched:
                    return np.array([LOOKUP, fields[key], 0, 0])
            if "op" in fields and len(looked) >= 2:
                want = (CALC, fields["op"], looked[0], looked[1], 1)
                done = [i for i, c in enumerate(calls) if c == want]
                return np.array([ANSWER, 0, done[-1], 0] if done else want[:4])
            return np.array([DONE, 0, 0, 0])

        return policy


def _combos(task: dict[str, int]) -> set[str]:
    """The sources of a correct combination (both orders for a commutative op)."""
    k1, k2, (op, _) = f"L{task['k1']}", f"L{task['k2']}", OPS[task["op"]]
    return {f"{op}({k1},{k2})"} | ({f"{op}({k2},{k1})"} if op in COMMUTATIVE else set())


def _right_tool(state: dict[str, Any], message: tuple[int, dict[str, Any]]) -> bool:
    """The call is the tool the task needs next given the calls before it: lookup until both
    keys were fetched, then calc until the target was combined, then answer."""
    i, call = message
    task = state["task"]
    have = {c["src"] for c in state["calls"][:i] if c["ok"]}
    keys = {f"L{task['k1']}", f"L{task['k2']}"}
    needed = "lookup" if not keys <= have else "answer" if _combos(task) & have else "calc"
    return call["tool"] == needed


def _valid_args(state: dict[str, Any], message: tuple[int, dict[str, Any]]) -> bool:
    """The call's arguments were in range and its registers filled."""
    return message[1]["ok"]


def _result_used(state: dict[str, Any], message: tuple[int, dict[str, Any]]) -> bool:
    """A later valid call consumes the call's result (an answer counts when it is valid)."""
    i, call = message
    used = call["tool"] == "answer" or any(
        c["ok"] and i in ((c["x"], c["y"]) if c["tool"] == "calc" else (c["x"],))
        for c in state["calls"][i + 1 :]
        if c["tool"] != "lookup"
    )
    return call["ok"] and used


def _weights(given: Mapping[str, float] | None) -> dict[str, float]:
    """The checklist weights: defaults updated with ``given`` (checked)."""
    if given is None:
        return dict(DEFAULT_WEIGHTS)
    if not isinstance(given, Mapping):
        raise ScenarioError(f"checklist_weights={given!r}: give a dict criterion → weight")
    unknown = sorted(set(given) - set(CRITERIA))
    if unknown:
        raise ScenarioError(
            f"checklist_weights has unknown criteria {unknown}: use {', '.join(CRITERIA)}"
        )
    return {
        **DEFAULT_WEIGHTS,
        **{c: cost_arg(f"checklist_weights[{c!r}]", w) for c, w in given.items()},
    }
