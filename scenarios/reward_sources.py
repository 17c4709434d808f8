"""Reward sources: a scenario's reward composed from named, weighted parts kept apart.

Contract. A :class:`RewardSources` (built from the plain ``rewards:`` spec of an experiment,
``trainers.configs.rewards.RewardsConfig.to_spec()``, or from Python) is attached to a
:class:`~scenarios.graph_env.GraphEnv` (``env.rewards``). Without it the env pays the verifier's
reward exactly as before. With it:

* a source paid ``when="turn"`` is evaluated on every decision (a :class:`Turn`) right after
  the step and paid to the agent that acted, at that step;
* a source paid ``when="end"`` is evaluated once on the final state; the episode's
  ``Outcome.reward`` becomes the weighted sum of the end sources, paid to every agent that
  acted (as the verifier's reward was);
* kinds: ``verifier`` (the scenario's ``score`` plus emitted team rewards), ``checklist``
  (named predicates ``(state, message) -> bool | float``; :class:`Checklist`), ``judge``
  (callables given a :class:`JudgeRequest`, voted by ``majority`` or ``mean``, each under a
  timeout; a failure raises :class:`JudgeError` naming the judge, or with
  ``on_failure="skip"`` is left out of the vote and counted) and ``shaping`` (a per-message
  term, by default the number of tool calls in the message);
* ``Outcome.metrics`` gains ``reward/<source>`` (the episode's weighted total of each source),
  ``reward/judge_disagreement`` and ``reward/judge_failures`` (when there are judges); the
  final infos of each agent carry ``reward_parts`` (source → what that agent was paid),
  ``reward_weights`` and ``reward_normalize`` for the GRPO advantage connector.

A failed episode (a node raised, a timeout, the step limit) earns only the verifier's weighted
failure reward (no judge or checklist runs on a state that does not exist). Counterfactual
replays (credit ``loo``/``shapley``) value coalitions with the verifier alone: judges are not
re-run ``2**n`` times an episode.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scenarios.base import Outcome, ScenarioError
from topologies.errors import MarlError

KINDS = ("verifier", "checklist", "judge", "shaping")
WHEN = ("end", "turn")
VOTES = ("majority", "mean")
NORMALIZE = ("sum", "per_source")

#: ``(state, message) -> bool | float``: one named criterion of a checklist.
Predicate = Callable[[Any, Any], Any]


class JudgeError(MarlError, RuntimeError):
    """A judge raised, timed out or returned no finite score; the message names it."""


@dataclasses.dataclass(frozen=True)
class Turn:
    """One decision, as reward sources see it.

    Attributes:
        agent: who acted.
        step: the env step.
        observation: what it saw.
        action: what it did (as executed).
        text: the decoded message for a text agent, else ``None``.
    """

    agent: str
    step: int
    observation: Any
    action: Any
    text: str | None = None


@dataclasses.dataclass(frozen=True)
class Checklist:
    """Named criteria judged on every message, weighted by the fraction of messages that pass.

    ``value = Σ_c weights[c] · f_c`` with ``f_c`` the mean of criterion ``c`` over the
    messages (0 when there are none). ``messages(state, turns)`` picks what is judged: the
    turns by default; a scenario may judge other items (``toolchain``: each tool call, as
    ``(index, call)``), which then only makes sense at the end of the episode.

    Example:
        >>> cl = Checklist({"short": lambda s, m: len(m.text) < 5}, {"short": 2.0})
        >>> turns = [Turn("a", 0, None, None, "hi"), Turn("a", 1, None, None, "hello!")]
        >>> cl.value(cl.fractions(None, turns))
        1.0
    """

    criteria: Mapping[str, Predicate]
    weights: Mapping[str, float]
    messages: Callable[[Any, Sequence[Turn]], Sequence[Any]] | None = None

    def marks(self, state: Any, messages: Sequence[Any]) -> list[dict[str, Any]]:
        """Every criterion of every message, in order."""
        return [{c: fn(state, m) for c, fn in self.criteria.items()} for m in messages]

    def fractions(self, state: Any, messages: Sequence[Any]) -> dict[str, float]:
        """Fraction of ``messages`` meeting each criterion (0 when there are none)."""
        marks = self.marks(state, messages)
        return {c: sum(m[c] for m in marks) / len(marks) if marks else 0.0 for c in self.criteria}

    def value(self, fractions: Mapping[str, float]) -> float:
        """The weighted sum of the fractions."""
        return sum(self.weights.get(c, 0.0) * f for c, f in fractions.items())


@dataclasses.dataclass(frozen=True)
class JudgeRequest:
    """What a judge is given: the rubric, the transcript as text and the raw material.

    ``state`` is the final state for an end-of-episode judge and the episode's initial state
    (the task) for a per-turn one; ``turns`` are the episode's decisions (the one judged, per
    turn); ``seed`` is the episode seed.
    """

    rubric: str
    transcript: str
    state: Any
    turns: tuple[Turn, ...]
    scenario: Any
    seed: int | None = None


Judge = Callable[[JudgeRequest], Any]


# ----- sources -------------------------------------------------------------------------------
@dataclasses.dataclass
class Source:
    """One named, weighted part of the reward (see the module doc for the kinds)."""

    name: str
    kind: str
    weight: float = 1.0
    when: str = "end"

    def end(self, ctx: _Context) -> float:
        raise ScenarioError(f"reward source {self.name!r} ({self.kind}) cannot be paid at the end")

    def turn(self, ctx: _Context, turn: Turn) -> float:
        raise ScenarioError(
            f"reward source {self.name!r} ({self.kind}) cannot be paid per turn: use when: end"
        )


@dataclasses.dataclass
class _Context:
    scenario: Any
    state: Any
    outcome: Outcome | None
    turns: tuple[Turn, ...]
    seed: int | None
    stats: dict[str, float]


@dataclasses.dataclass
class VerifierSource(Source):
    """The scenario's verifier: ``Outcome.reward`` (emitted team rewards included)."""

    def end(self, ctx: _Context) -> float:
        assert ctx.outcome is not None
        return float(ctx.outcome.reward)


@dataclasses.dataclass
class ChecklistSource(Source):
    """A :class:`Checklist`: the scenario's own (``reward_checklist()``) or a given one."""

    checklist: Checklist | None = None
    criteria_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def bind(self, scenario: Any) -> None:
        if self.checklist is None:
            own = getattr(scenario, "reward_checklist", None)
            if own is None:
                raise ScenarioError(
                    f"reward source {self.name!r}: scenario {scenario.id()} declares no "
                    "reward_checklist(): give checklist: package.module:attr (a Checklist or a "
                    "dict criterion → predicate(state, message))"
                )
            self.checklist = own()
        unknown = sorted(set(self.criteria_weights) - set(self.checklist.criteria))
        if unknown:
            raise ScenarioError(
                f"reward source {self.name!r}: criteria_weights names unknown criteria "
                f"{unknown}: use {sorted(self.checklist.criteria)}"
            )
        if self.criteria_weights:
            weights = {**self.checklist.weights, **self.criteria_weights}
            self.checklist = dataclasses.replace(self.checklist, weights=weights)
        if self.when == "turn" and self.checklist.messages is not None:
            raise ScenarioError(
                f"reward source {self.name!r}: this checklist judges the scenario's own items, "
                "not single messages: use when: end"
            )

    def end(self, ctx: _Context) -> float:
        cl = self.checklist
        assert cl is not None
        items = cl.messages(ctx.state, ctx.turns) if cl.messages is not None else ctx.turns
        fractions = cl.fractions(ctx.state, items)
        for c, f in fractions.items():
            ctx.stats[f"reward/{self.name}/{c}"] = float(f)
        return float(cl.value(fractions))

    def turn(self, ctx: _Context, turn: Turn) -> float:
        assert self.checklist is not None
        return float(self.checklist.value(self.checklist.fractions(ctx.state, [turn])))


@dataclasses.dataclass
class JudgeSource(Source):
    """Judges voting on the transcript (module doc); every judge runs under ``timeout_s``."""

    judges: Sequence[tuple[str, Judge]] = ()
    vote: str = "majority"
    threshold: float = 0.5
    timeout_s: float = 30.0
    on_failure: str = "raise"
    rubric: str = ""

    def end(self, ctx: _Context) -> float:
        return self._judge(ctx, ctx.state, ctx.turns)

    def turn(self, ctx: _Context, turn: Turn) -> float:
        return self._judge(ctx, ctx.state, (turn,))

    def _judge(self, ctx: _Context, state: Any, turns: tuple[Turn, ...]) -> float:
        request = JudgeRequest(
            self.rubric, render_transcript(turns), state, turns, ctx.scenario, ctx.seed
        )
        scores, failed = run_judges(self.judges, request, self.timeout_s)
        ctx.stats["reward/judge_failures"] = ctx.stats.get("reward/judge_failures", 0.0) + len(
            failed
        )
        for name, why in failed.items():
            key = f"reward/judge_failures/{name}"
            ctx.stats[key] = ctx.stats.get(key, 0.0) + 1.0
            if self.on_failure == "raise":
                raise JudgeError(f"reward source {self.name!r}: judge {name!r} {why}")
        if not scores:
            raise JudgeError(
                f"reward source {self.name!r}: every judge failed ({'; '.join(failed)}): "
                "nothing to vote on"
            )
        value, disagreement = vote(list(scores.values()), self.vote, self.threshold)
        n = ctx.stats.get("_judge_votes", 0.0)
        mean = ctx.stats.get("reward/judge_disagreement", 0.0)
        ctx.stats["reward/judge_disagreement"] = (mean * n + disagreement) / (n + 1)
        ctx.stats["_judge_votes"] = n + 1
        return value


@dataclasses.dataclass
class ShapingSource(Source):
    """A per-message term: ``tool_calls`` (well-formed calls in the message) or a function
    ``turn -> float``; at the end of the episode, the sum over every message."""

    term: Callable[[Any, Turn], float] | None = None

    def end(self, ctx: _Context) -> float:
        assert self.term is not None
        return float(sum(self.term(ctx.scenario, t) for t in ctx.turns))

    def turn(self, ctx: _Context, turn: Turn) -> float:
        assert self.term is not None
        return float(self.term(ctx.scenario, turn))


def tool_calls(scenario: Any, turn: Turn) -> float:
    """The built-in shaping term: tool calls in the message — the scenario's own count
    (``scenario.tool_calls(agent, action)``) or, for a text agent, its well-formed
    ``<tool>`` calls."""
    count = getattr(scenario, "tool_calls", None)
    if callable(count):
        return float(count(turn.agent, turn.action))
    if turn.text is None:
        raise ScenarioError(
            f"shaping term tool_calls: agent {turn.agent!r} of {scenario.id()} does not act "
            "with text and the scenario has no tool_calls(agent, action): give term: "
            "package.module:function(scenario, turn) -> float"
        )
    from scenarios.toolcalls import parse_tool_calls

    return float(len(parse_tool_calls(turn.text).tool_calls))


# ----- judges ----------------------------------------------------------------------------------
def run_judges(
    judges: Sequence[tuple[str, Judge]], request: JudgeRequest, timeout_s: float
) -> tuple[dict[str, float], dict[str, str]]:
    """Ask every judge at once (one daemon thread each) and wait at most ``timeout_s``.

    Returns:
        ``(scores, failures)``: judge name → finite score, and judge name → what went wrong
        (raised, timed out, or returned something that is not a finite number). A judge that
        hangs is left running in its daemon thread; its late answer is ignored.
    """
    boxes: dict[str, dict[str, Any]] = {name: {} for name, _ in judges}
    threads = []
    for name, judge in judges:

        def work(judge: Judge = judge, box: dict[str, Any] = boxes[name]) -> None:
            try:
                box["score"] = judge(request)
            except BaseException as exc:  # reported below, never swallowed
                box["error"] = exc

        thread = threading.Thread(target=work, daemon=True, name=f"judge-{name}")
        thread.start()
        threads.append((name, thread))
    deadline = _now() + timeout_s
    scores: dict[str, float] = {}
    failures: dict[str, str] = {}
    for name, thread in threads:
        thread.join(max(0.0, deadline - _now()))
        box = boxes[name]
        if thread.is_alive():
            failures[name] = f"timed out after {timeout_s:g} s (timeout_s)"
        elif "error" in box:
            exc = box["error"]
            failures[name] = f"raised {type(exc).__name__}: {exc}"
        else:
            try:
                score = float(box.get("score"))
            except (TypeError, ValueError):
                score = math.nan
            if not math.isfinite(score):
                failures[name] = f"returned {box.get('score')!r}, not a finite number"
            else:
                scores[name] = score
    return scores, failures


def _now() -> float:
    import time

    return time.monotonic()


def vote(scores: Sequence[float], how: str, threshold: float = 0.5) -> tuple[float, float]:
    """``(value, disagreement)`` of the judges' scores.

    ``majority``: each judge passes when its score ≥ ``threshold``; the value is 1.0 when
    more than half pass, 0.0 when fewer, 0.5 on a tie; disagreement = the fraction of judges
    against the vote (0.5 on a tie). ``mean``: the mean score; disagreement = the mean
    absolute deviation from it.

    Example:
        >>> vote([1, 1, 0], "majority"), vote([0.2, 0.6], "mean")
        ((1.0, 0.3333333333333333), (0.4, 0.19999999999999998))
    """
    n = len(scores)
    if how == "majority":
        passed = sum(s >= threshold for s in scores)
        if 2 * passed == n:
            return 0.5, 0.5
        value = 1.0 if 2 * passed > n else 0.0
        against = n - passed if value == 1.0 else passed
        return value, against / n
    mean = sum(scores) / n
    return mean, sum(abs(s - mean) for s in scores) / n


def http_judge(url: str, timeout_s: float = 30.0) -> Judge:
    """A remote judge: POSTs ``{"rubric", "transcript", "seed"}`` as JSON to ``url`` and
    reads ``{"score": x}`` back (use it as ``ref: scenarios.reward_sources:http_judge`` with
    ``kwargs: {url: ...}``)."""

    def judge(request: JudgeRequest) -> float:
        body = {"rubric": request.rubric, "transcript": request.transcript, "seed": request.seed}
        req = urllib.request.Request(
            url, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout_s) as response:
            return float(json.loads(response.read())["score"])

    return judge


def render_transcript(turns: Sequence[Turn]) -> str:
    """One line per decision: ``<agent>: <message>`` (non-text actions as a compact repr)."""
    from scenarios.base import compact

    lines = (f"{t.agent}: {compact(t.action) if t.text is None else t.text}" for t in turns)
    return "\n".join(lines)


# ----- the composition ------------------------------------------------------------------------
class RewardSources:
    """The sources of one env, and what each agent was paid by each in the current episode.

    Args:
        sources: the sources (unique names).
        normalize: ``"sum"`` or ``"per_source"`` (read by the GRPO advantage connector: each
            source is normalised within its group before the weighted sum).
    """

    def __init__(self, sources: Sequence[Source], normalize: str = "sum") -> None:
        names = [s.name for s in sources]
        if not sources or len(set(names)) != len(names):
            raise ScenarioError(f"reward sources need unique names, got {names}")
        if normalize not in NORMALIZE:
            raise ScenarioError(f"rewards normalize={normalize!r}: use one of {NORMALIZE}")
        self.sources = list(sources)
        self.normalize = normalize
        self._bound: Any = None
        self.start()

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], scenario: Any = None) -> RewardSources:
        """Build from the plain ``rewards:`` spec (``RewardsConfig.to_spec()``); references
        ``package.module:attr`` are imported here (judges, checklists, shaping terms)."""
        out = cls([_source(s) for s in spec.get("sources", [])], spec.get("normalize", "sum"))
        if scenario is not None:
            out.bind(scenario)
        return out

    def bind(self, scenario: Any) -> None:
        """Resolve what needs the scenario (its checklist); idempotent per scenario."""
        if self._bound is scenario:
            return
        for s in self.sources:
            if isinstance(s, ChecklistSource):
                s.bind(scenario)
        self._bound = scenario

    def start(self) -> None:
        """A new episode: nothing paid yet."""
        self.parts: dict[str, dict[str, float]] = {}
        self._turn_totals = {s.name: 0.0 for s in self.sources if s.when == "turn"}
        self._stats: dict[str, float] = {}

    @property
    def weights(self) -> dict[str, float]:
        return {s.name: s.weight for s in self.sources}

    def on_turns(
        self, scenario: Any, task: Any, steps: Sequence[Any], seed: Any = None
    ) -> dict[str, float]:
        """Per-turn rewards of one env step's decisions (``TraceStep``s): agent → reward."""
        self.bind(scenario)
        out: dict[str, float] = {}
        per_turn = [s for s in self.sources if s.when == "turn"]
        if not per_turn:
            return out
        ctx = _Context(scenario, task, None, (), seed, self._stats)
        for step in steps:
            turn = to_turn(scenario, step)
            for s in per_turn:
                r = s.weight * s.turn(ctx, turn)
                self._pay(step.agent, s.name, r)
                self._turn_totals[s.name] += r
                out[step.agent] = out.get(step.agent, 0.0) + r
        return out

    def on_end(
        self,
        scenario: Any,
        state: Any,
        outcome: Outcome,
        trace: Sequence[Any],
        acted: Sequence[str],
        *,
        failed: bool = False,
        seed: Any = None,
    ) -> Outcome:
        """The episode's composed outcome: reward = Σ weighted end sources; metrics added."""
        self.bind(scenario)
        turns = tuple(to_turn(scenario, t) for t in trace)
        ctx = _Context(scenario, state, outcome, turns, seed, self._stats)
        total = 0.0
        metrics = dict(outcome.metrics or {})
        for s in self.sources:
            if s.when != "end":
                metrics[f"reward/{s.name}"] = self._turn_totals[s.name]
                continue
            # documented: a failed episode earns only the verifier's reward
            value = 0.0 if failed and s.kind != "verifier" else s.weight * s.end(ctx)
            total += value
            metrics[f"reward/{s.name}"] = value
            for agent in acted:
                self._pay(agent, s.name, value)
        metrics.update({k: v for k, v in self._stats.items() if not k.startswith("_")})
        if any(s.kind == "judge" for s in self.sources):
            metrics.setdefault("reward/judge_failures", 0.0)
            metrics.setdefault("reward/judge_disagreement", 0.0)
        return dataclasses.replace(outcome, reward=total, metrics=metrics)

    def infos(self, agent: str) -> dict[str, Any]:
        """What ``agent``'s final infos carry for the learner (module doc)."""
        return {
            "reward_parts": dict(self.parts.get(agent, {})),
            "reward_weights": self.weights,
            "reward_normalize": self.normalize,
        }

    def _pay(self, agent: str, source: str, value: float) -> None:
        mine = self.parts.setdefault(agent, {})
        mine[source] = mine.get(source, 0.0) + value


def to_turn(scenario: Any, step: Any) -> Turn:
    """A ``TraceStep`` (or anything with ``agent``, ``step``, ``observation``, ``action``) as a
    :class:`Turn`; a text agent's message is decoded with ``scenario.render_action``."""
    if isinstance(step, Turn):
        return step
    text = (
        scenario.render_action(step.agent, step.action)
        if step.agent in getattr(scenario, "text_agents", ())
        else None
    )
    return Turn(step.agent, step.step, step.observation, step.action, text)


def load_ref(ref: Any, what: str) -> Any:
    """``package.module:attr`` imported (a non-string is returned as it is)."""
    if not isinstance(ref, str):
        return ref
    from scenarios.registry import parse_reference

    try:
        module, attr = parse_reference(ref)
    except ScenarioError as exc:
        raise ScenarioError(f"{what}: {exc}") from None
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ScenarioError(f"{what}={ref!r} cannot be imported ({exc}): fix it") from None
    return obj


def check_references(spec: Mapping[str, Any]) -> None:
    """Import every ``package.module:attr`` of a spec (judges, checklists, shaping terms)
    without building anything (no judge factory is called: an LLM judge loads no model)."""
    for source in spec.get("sources", []):
        where = f"rewards.sources[{source.get('name', '')!r}]"
        for i, j in enumerate(source.get("judges") or []):
            load_ref(j.get("ref") if isinstance(j, Mapping) else j, f"{where}.judges[{i}].ref")
        if source.get("kind") == "checklist":
            load_ref(source.get("checklist"), f"{where}.checklist")
        term = source.get("term", "tool_calls") if source.get("kind") == "shaping" else None
        if term not in (None, "tool_calls") and not callable(load_ref(term, f"{where}.term")):
            raise ScenarioError(f"{where}.term={term!r} is not callable")


def _source(spec: Mapping[str, Any]) -> Source:
    """One source from its plain spec (the fields of ``RewardSourceConfig``)."""
    name, kind = str(spec.get("name", "")), spec.get("kind", "verifier")
    weight, when = float(spec.get("weight", 1.0)), spec.get("when", "end")
    if kind not in KINDS:
        raise ScenarioError(f"reward source {name!r}: kind={kind!r}: use one of {KINDS}")
    if when not in WHEN or (when == "turn" and kind == "verifier"):
        raise ScenarioError(
            f"reward source {name!r}: when={when!r}: use end or turn (the verifier: end)"
        )
    base = {"name": name, "kind": kind, "weight": weight, "when": when}
    where = f"rewards.sources[{name!r}]"
    if kind == "verifier":
        return VerifierSource(**base)
    if kind == "checklist":
        given = load_ref(spec.get("checklist"), f"{where}.checklist")
        if isinstance(given, Mapping):
            given = Checklist(dict(given), dict.fromkeys(given, 1.0))
        if given is not None and not isinstance(given, Checklist):
            raise ScenarioError(f"{where}.checklist must name a Checklist or a dict of predicates")
        return ChecklistSource(
            **base, checklist=given, criteria_weights=dict(spec.get("criteria_weights") or {})
        )
    if kind == "judge":
        judges = [_judge(j, i, where) for i, j in enumerate(spec.get("judges") or [])]
        if not judges:
            raise ScenarioError(f"{where}: a judge source needs at least one judge in judges")
        return JudgeSource(
            **base,
            judges=judges,
            vote=spec.get("vote", "majority"),
            threshold=float(spec.get("threshold", 0.5)),
            timeout_s=float(spec.get("timeout_s", 30.0)),
            on_failure=spec.get("on_failure", "raise"),
            rubric=str(spec.get("rubric", "")),
        )
    term = spec.get("term", "tool_calls")
    fn = tool_calls if term == "tool_calls" else load_ref(term, f"{where}.term")
    if not callable(fn):
        raise ScenarioError(f"{where}.term={term!r} is not callable (scenario, turn) -> float")
    return ShapingSource(**base, term=fn)


def _judge(spec: Any, index: int, where: str) -> tuple[str, Judge]:
    """``(name, judge)``: a reference/callable (the judge), or ``{ref, kwargs, name}``: with
    ``kwargs`` given, ``ref`` is a factory called with them that returns the judge."""
    if not isinstance(spec, Mapping):
        spec = {"ref": spec}
    ref = spec.get("ref")
    obj = load_ref(ref, f"{where}.judges[{index}].ref")
    kwargs = spec.get("kwargs")  # given (even {}): ``ref`` is a factory of the judge
    judge = obj(**dict(kwargs)) if kwargs is not None else obj
    if not callable(judge):
        raise ScenarioError(f"{where}.judges[{index}]: {ref!r} is not a callable judge")
    default = ref.rsplit(":", 1)[-1] if isinstance(ref, str) else getattr(ref, "__name__", "judge")
    return str(spec.get("name") or f"{default}_{index}"), judge
