"""``delegate``: an orchestrator splits a task among hidden-skill specialist subagents.

A task has ``K`` parts, each of one of ``T`` types. On ``star:N`` the orchestrator decides each
round which worker handles which part (it may fan out to several workers at once), workers pick
a method for each part they were given and report back, and the orchestrator either dispatches
again (e.g. retries failed parts) or stops, which ends the run. A part is solved when the
worker's method matches the part's type and a skill draw succeeds; the skill matrix (worker ×
type success probabilities) is fixed per scenario instance and never observed: the orchestrator
has to learn it across episodes.

Spaces (all observations are float32 ``Box(0, 1)`` vectors of one-hot blocks; unused slots are
zero):

* ``orchestrator``: part types ``K×T`` · part status ``K×3`` (pending, failed, solved) · round
  ``max_rounds``. Action ``MultiDiscrete([N+1]*K)``: 0 = not now, ``i+1`` = hand the part to
  ``worker_i``. Assignments of solved parts are ignored; with ``parallel=False`` only the worker
  named first (lowest part index) is called and the other assignments are dropped for the round.
  Assigning nothing ends the run, as does reaching ``max_rounds`` or solving every part.
* ``worker_i``: the types of the parts assigned to it this round, ``K×T`` (zero rows elsewhere).
  Action ``MultiDiscrete([T+1]*K)``: 0 = pass, ``m`` = method for type ``m-1``; only assigned
  slots count.
* ``agent`` (``single``): one generalist does everything in one superstep, no retries. Same
  spaces as a worker that was given every part; its skill on a type is the mean of the skill
  matrix's rows on that type (the average specialist).

Reward (terminal, team): ``solved/K − λ·latency − μ·calls`` where ``latency`` is the number of
dispatch rounds (critical-path worker supersteps: a parallel fan-out round costs one, however
many workers it calls; ``single`` costs one) and ``calls`` is the number of parts handed to
workers (``single``: 0). Skill draws use common random numbers,
``default_rng([task_seed, round, part, worker]).random() < skill``, so replays are exact.
Metrics: ``latency``, ``calls``, ``solved_fraction`` and ``rounds`` (orchestrator decisions,
counting a final "assign nothing"). ``Outcome.local`` gives each worker the parts it solved
over ``K`` minus ``μ`` per part it was handed. Absent agents (counterfactual replays) take the
all-zeros action: an absent orchestrator assigns nothing, an absent worker passes.

Frozen policies: :meth:`Delegate.scripted_worker` (matching method) and
:meth:`Delegate.oracle_policy` (the skill-aware optimal orchestrator, exact dynamic programming,
see :mod:`scenarios.delegate_oracle`); :meth:`Delegate.oracle_value` is its expected reward.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Annotated, Any, TypedDict

import gymnasium as gym
import numpy as np
from langgraph.graph import StateGraph
from typing_extensions import override

from scenarios.args import checked_action, cost_arg, int_arg
from scenarios.base import Outcome, Scenario, ScriptedPolicy
from scenarios.decisions import decide
from scenarios.declared import DeclaredSpaces, accept_topology
from scenarios.delegate_args import check_parallel, check_skills, check_unknown
from scenarios.delegate_oracle import Planner, make_skills
from scenarios.difficulty import check_difficulty, knob_level
from scenarios.registry import register
from topologies import Topology
from topologies.generators import merge_routes

PENDING, FAILED, SOLVED = 0, 1, 2
#: specialists drawn from ``skills_seed`` for the ``single`` topology (its skill is their mean).
SINGLE_POOL = 3
MAX_PARTS = 8
MAX_TYPES = 8
MAX_ROUNDS = 16


def merge_status(left: dict[int, int] | None, right: dict[int, int] | None) -> dict[int, int]:
    """Reducer for per-part status written by parallel workers: the best status wins."""
    out = dict(left or {})
    for part, status in (right or {}).items():
        out[part] = max(out.get(part, PENDING), status)
    return out


class DelegateState(TypedDict, total=False):
    """Graph state of one ``delegate`` episode."""

    task_seed: int
    types: list[int]
    status: Annotated[dict[int, int], merge_status]
    #: ``(round, part, worker index, method, solved)`` for every attempt.
    attempts: Annotated[list[tuple[int, int, int, int, bool]], operator.add]
    assignment: dict[str, list[int]]
    round: int
    latency: int
    calls: int
    decisions: int
    route: Annotated[dict[str, list[str]], merge_routes]


def _one_hot(size: int, hot: list[int]) -> np.ndarray:
    """A float32 vector of ``size`` zeros with ones at ``hot`` (built per decision: one array,
    a few item writes; ~3× faster than filling blocks and concatenating them)."""
    out = np.zeros(size, np.float32)
    for i in hot:  # at most 2·MAX_PARTS + 1 entries: item writes beat one fancy-index write
        out[i] = 1.0
    return out


def new_task(
    rng: np.random.Generator, parts: int, types: int, active: int | None = None
) -> dict[str, Any]:
    """A fresh delegate episode state: task seed, part types, nothing spent yet.

    Shared by ``delegate`` and ``text-delegate`` so both draw the same task for a seed. Only
    the first ``active`` parts (default: all) are pending; the others start solved (the
    ``active_parts`` difficulty knob: the same draws, fewer parts left to solve).
    """
    active = parts if active is None else active
    return {
        "task_seed": int(rng.integers(2**31)),
        "types": [int(x) for x in rng.integers(types, size=parts)],
        "status": {i: PENDING if i < active else SOLVED for i in range(parts)},
        "attempts": [],
        "assignment": {},
        "round": 0,
        "latency": 0,
        "calls": 0,
        "decisions": 0,
    }


def unsolved_types(state: Mapping[str, Any]) -> list[int]:
    """The types of a state's parts not yet solved."""
    return [t for i, t in enumerate(state["types"]) if state["status"][i] != SOLVED]


def planned_value(planner: Planner, state: Mapping[str, Any], parts: int, types: int) -> float:
    """The oracle's expected reward from a fresh ``state``: parts that start solved (the
    difficulty knob) count as solved, the planner values the rest."""
    left = unsolved_types(state)
    counts = np.bincount(np.asarray(left, dtype=np.int64), minlength=types)
    return (parts - len(left)) / parts + planner.value(tuple(int(c) for c in counts), 0)


def exact_planner(task: Any, parallel: bool) -> Planner:
    """The exact oracle of a delegate task: its ``skills``, ``parts``, ``max_rounds`` and costs."""
    costs = (task.latency_cost, task.call_cost)
    return Planner(task.skills, task.parts, task.max_rounds, *costs, parallel)


@register
class Delegate(DeclaredSpaces, Scenario):
    """Orchestrator delegates ``parts`` typed parts to hidden-skill specialists (see module doc).

    Args:
        topology: ``"star:N"`` (N ≥ 1, default ``star:3``), ``"single"`` or such a Topology.
        parts: parts per task ``K``, 1–8.
        types: part types ``T``, 1–8.
        skills_seed: seed of the hidden skill matrix (≥ 0).
        skills: explicit ``(N, T)`` skill matrix in ``[0, 1]``; overrides ``skills_seed``.
        parallel: whether a round may call several workers at once.
        max_rounds: dispatch rounds allowed, 1–16 (default ``2·parts``).
        latency_cost: ``λ ≥ 0`` per dispatch round.
        call_cost: ``μ ≥ 0`` per part handed to a worker.
        difficulty: the ``active_parts`` knob (:mod:`scenarios.difficulty`): ``None`` (all
            parts), a level index (``i + 1`` parts pending, the rest start solved) or
            ``"seed"`` (the level from the episode seed).

    Example:
        >>> from scenarios.decisions import run_inline
        >>> s = Delegate("star:3", parts=3, types=3)
        >>> _, out, _ = run_inline(s, s.oracle_policy, seed=0)
        >>> sorted(out.metrics)
        ['calls', 'latency', 'rounds', 'solved_fraction']
    """

    name = "delegate"
    version = 0
    summary = "orchestrator delegates typed parts to hidden-skill specialists (fan-out, retries)"
    topologies = ("single", "star")
    default_topology = "star:3"
    absent = "default"  # absent orchestrator: assigns nothing; absent worker: passes every part
    has_oracle = True
    has_local_rewards = True
    difficulty_knob = "active_parts"
    scripted_policies = (
        ScriptedPolicy(
            "scripted_worker",
            lambda s: s.scripted_worker,
            "delegate worker: the method matching each assigned part's type",
            default_for=("worker",),
        ),
        ScriptedPolicy(
            "oracle",
            lambda s: s.oracle_policy,
            "delegate: skill-aware optimal orchestrator (and scripted workers)",
        ),
    )

    def __init__(
        self,
        topology: str | Topology = "star:3",
        *,
        parts: int = 3,
        types: int = 3,
        skills_seed: int = 0,
        skills: Any = None,
        parallel: bool = True,
        max_rounds: int | None = None,
        latency_cost: float = 0.05,
        call_cost: float = 0.02,
        difficulty: int | str | None = None,
        **unknown: Any,
    ) -> None:
        check_unknown(unknown)
        fix = "pass topology='star:N' (N ≥ 1) or topology='single'"
        self.topology = accept_topology(
            "delegate", topology, self.topologies, "single or star:N", fix, named=True
        )
        self.single = self.topology.kind == "single"
        self.parts = int_arg("parts", parts, 1, MAX_PARTS)
        self.types = int_arg("types", types, 1, MAX_TYPES)
        self.difficulty_levels = tuple(range(1, self.parts + 1))
        self.difficulty = check_difficulty(difficulty, self.difficulty_levels, "delegate")
        self.skills_seed = int_arg("skills_seed", skills_seed, 0, None)
        self.parallel = check_parallel(parallel)
        rounds = 2 * self.parts if max_rounds is None else max_rounds
        self.max_rounds = int_arg("max_rounds", rounds, 1, MAX_ROUNDS)
        self.latency_cost = cost_arg("latency_cost", latency_cost)
        self.call_cost = cost_arg("call_cost", call_cost)
        self.n_workers = 0 if self.single else len(self.topology.agent_ids) - 1
        rows = SINGLE_POOL if self.single else self.n_workers
        if skills is None:
            self.skills = make_skills(rows, self.types, self.skills_seed)
        else:
            self.skills = check_skills(skills, rows, self.types, any_rows=self.single)
        self.skills.setflags(write=False)
        # orchestrator decisions + worker supersteps + slack for the final aggregation
        self.max_supersteps = 2 * self.max_rounds + 4
        self._planner: Planner | None = None
        k, t = self.parts, self.types
        self.agent_spaces = {}
        for agent in self.topology.agent_ids:
            orch = agent == "orchestrator"
            size = k * t + k * 3 + self.max_rounds if orch else k * t
            nvec = [self.n_workers + 1 if orch else t + 1] * k
            self.agent_spaces[agent] = (
                gym.spaces.Box(0.0, 1.0, (size,), np.float32),
                gym.spaces.MultiDiscrete(nvec),
            )

    # ----- spaces --------------------------------------------------------------------------
    @override
    def default_action(self, agent: str) -> np.ndarray:
        return np.zeros(self.parts, dtype=np.int64)

    # ----- observations --------------------------------------------------------------------
    def orchestrator_obs(self, state: Mapping[str, Any]) -> np.ndarray:
        """Part types, part status and round index (never the skills)."""
        k, t = self.parts, self.types
        status, base = state["status"], k * t
        hot = [i * t + x for i, x in enumerate(state["types"][:k])]  # the one-hot entries
        hot += [base + 3 * i + status[i] for i in range(k)]
        hot.append(base + 3 * k + min(state["round"], self.max_rounds - 1))
        return _one_hot(base + 3 * k + self.max_rounds, hot)

    def worker_obs(self, state: Mapping[str, Any], parts: list[int]) -> np.ndarray:
        """The types of ``parts`` (the parts this worker was given); other rows are zero."""
        types, t = state["types"], self.types
        return _one_hot(self.parts * t, [p * t + types[p] for p in parts])

    # ----- the graph -----------------------------------------------------------------------
    @override
    def initial_state(self, rng: np.random.Generator) -> dict[str, Any]:
        return {**new_task(rng, self.parts, self.types, knob_level(self, rng)), "route": {}}

    @override
    def build_graph(self) -> StateGraph:
        def node_fn(node: str) -> Any:
            if node == "orchestrator":
                return self._orchestrator
            if node == "agent":
                return self._single_agent
            return lambda state, _w=node: self._worker(_w, state)

        return self.topology.to_langgraph(node_fn, DelegateState)

    def _orchestrator(self, state: DelegateState) -> dict[str, Any]:
        stop = {"route": {"orchestrator": []}}
        unsolved = [i for i in range(self.parts) if state["status"][i] != SOLVED]
        if not unsolved or state["round"] >= self.max_rounds:
            return stop
        action = self._decide("orchestrator", self.orchestrator_obs(state)).tolist()
        assignment: dict[str, list[int]] = {}
        for part in unsolved:
            if action[part] > 0:
                assignment.setdefault(f"worker_{action[part] - 1}", []).append(part)
        if not self.parallel and assignment:
            first = next(iter(assignment))
            assignment = {first: assignment[first]}
        decisions = state["decisions"] + 1
        if not assignment:
            return {**stop, "decisions": decisions}
        return {
            "route": {"orchestrator": list(assignment)},
            "assignment": assignment,
            "round": state["round"] + 1,
            "latency": state["latency"] + 1,
            "calls": state["calls"] + sum(len(p) for p in assignment.values()),
            "decisions": decisions,
        }

    def _worker(self, worker: str, state: DelegateState) -> dict[str, Any]:
        parts = state["assignment"].get(worker, [])
        action = self._decide(worker, self.worker_obs(state, parts))
        index = int(worker.rpartition("_")[2])
        return self._attempt(state, parts, action, index, self.skills[index], state["round"] - 1)

    def _single_agent(self, state: DelegateState) -> dict[str, Any]:
        parts = list(range(self.parts))
        action = self._decide("agent", self.worker_obs(state, parts))
        skill = self.skills.mean(axis=0)
        update = self._attempt(state, parts, action, len(self.skills), skill, 0)
        return {**update, "round": 1, "latency": 1, "decisions": 1}

    def _attempt(
        self,
        state: DelegateState,
        parts: list[int],
        action: np.ndarray,
        index: int,
        skill: np.ndarray,
        round_: int,
    ) -> dict[str, Any]:
        status: dict[int, int] = {}
        attempts = []
        methods = action.tolist()  # Python ints: the same comparisons, no numpy scalars
        for part in parts:
            type_ = state["types"][part]
            ok = methods[part] == type_ + 1 and self.draw(
                state["task_seed"], round_, part, index
            ) < float(skill[type_])
            status[part] = SOLVED if ok else FAILED
            attempts.append((round_, part, index, methods[part], ok))
        return {"status": status, "attempts": attempts}

    def _decide(self, agent: str, observation: Any) -> np.ndarray:
        """``agent``'s decision on ``observation``, checked against its action space."""
        return checked_action(self.action_space(agent), decide(agent, observation), agent)

    @staticmethod
    def draw(task_seed: int, round_: int, part: int, worker: int) -> float:
        """The common-random-number skill draw of ``worker`` on ``part`` in ``round_``."""
        key = (task_seed, round_, part, worker)
        if min(key) >= 0 and max(key) < 1 << 32:  # words as SeedSequence makes of the list,
            # without converting each int (~7 µs of the ~20 µs a draw costs)
            return float(np.random.default_rng(np.array(key, np.uint32)).random())
        return float(np.random.default_rng(list(key)).random())

    # ----- verification --------------------------------------------------------------------
    @override
    def score(self, state: dict[str, Any]) -> Outcome:
        solved = sum(1 for s in state["status"].values() if s == SOLVED)
        frac = solved / self.parts
        latency, calls = state["latency"], state["calls"]
        reward = frac - self.latency_cost * latency - self.call_cost * calls
        local = {"orchestrator" if not self.single else "agent": reward}
        for w in range(self.n_workers):
            mine = [a for a in state["attempts"] if a[2] == w]
            local[f"worker_{w}"] = sum(a[4] for a in mine) / self.parts - self.call_cost * len(mine)
        return Outcome(
            reward=float(reward),
            success=solved == self.parts,
            local=local,
            metrics={
                "latency": float(latency),
                "calls": float(calls),
                "solved_fraction": float(frac),
                "rounds": float(state["decisions"]),
            },
        )

    # ----- frozen policies -----------------------------------------------------------------
    def scripted_worker(self, agent: str, obs: np.ndarray) -> np.ndarray:
        """The frozen subagent: for every assigned part, pick the method matching its type.

        Serves ``worker_i`` and the ``single`` agent (same observation layout). Bound to the
        scenario because the flat observation alone does not say how many types there are.
        """
        rows = np.asarray(obs).reshape(self.parts, self.types)
        return np.where(rows.any(axis=1), rows.argmax(axis=1) + 1, 0).astype(np.int64)

    # ----- the oracle ----------------------------------------------------------------------
    @property
    def planner(self) -> Planner:
        """The exact dynamic-programming oracle for this instance (built on first use)."""
        if self._planner is None:
            self._planner = exact_planner(self, self.parallel)
        return self._planner

    @override
    def oracle_value(self, rng: np.random.Generator) -> float:
        """Exact expected reward of the skill-aware optimal team on the episode ``rng`` seeds.

        Pass a generator seeded like the episode (``default_rng(seed)``): the task is drawn the
        same way as :meth:`initial_state`. Star: backward induction, see
        :mod:`scenarios.delegate_oracle`. Single: ``mean_i skill(type_i) − λ``.
        """
        state = self.initial_state(rng)
        if self.single:
            left = unsolved_types(state)
            mean = self.skills.mean(axis=0)
            done = (self.parts - len(left)) / self.parts  # parts the difficulty knob solved
            return float(done + sum(mean[t] for t in left) / self.parts - self.latency_cost)
        return planned_value(self.planner, state, self.parts, self.types)

    def oracle_policy(self, agent: str, obs: np.ndarray) -> np.ndarray:
        """A policy for every agent: the optimal skill-aware orchestrator, scripted workers."""
        if agent != "orchestrator":
            return self.scripted_worker(agent, obs)
        k, t = self.parts, self.types
        flat = np.asarray(obs)
        types = flat[: k * t].reshape(k, t).argmax(axis=1)
        status = flat[k * t : k * t + 3 * k].reshape(k, 3).argmax(axis=1)
        round_ = int(flat[k * t + 3 * k :].argmax())
        unsolved = [i for i in range(k) if status[i] != SOLVED]
        counts = np.bincount(types[unsolved], minlength=t)
        option, dispatch = self.planner.best(tuple(int(c) for c in counts), round_)
        action = np.zeros(k, dtype=np.int64)
        left = list(dispatch)
        for part in unsolved:
            if left[types[part]] > 0:
                left[types[part]] -= 1
                worker = self.planner.best_worker(types[part]) if self.parallel else option
                action[part] = worker + 1
        return action
