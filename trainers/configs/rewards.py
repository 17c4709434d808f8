"""``rewards:``: the reward sources composing an episode's reward.

Contract: :class:`RewardsConfig` lists named sources (:class:`RewardSourceConfig`, each with
a weight and ``when: end | turn``); an empty list (the default) keeps the scenario's verifier
reward exactly. :meth:`RewardsConfig.to_spec` is the plain dict the env builds
:class:`scenarios.reward_sources.RewardSources` from, in every env-runner process. GRPO's
per-source normalisation is :mod:`trainers.signals.rewards`.

Example:
    >>> cfg = RewardsConfig(sources=[{"name": "exact", "kind": "verifier"}])
    >>> cfg.to_spec()["sources"][0]["when"]
    'end'
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Literal

from trainers.configs.typed import ConfigError, to_plain, typed

SourceKind = Literal["verifier", "checklist", "judge", "shaping"]
#: fields that only one kind of source reads (the others must leave them at their defaults)
KIND_FIELDS = {
    "checklist": ("checklist", "criteria_weights"),
    "judge": ("judges", "vote", "threshold", "timeout_s", "on_failure", "rubric"),
    "shaping": ("term",),
}
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclasses.dataclass
class JudgeConfig:
    """One judge.

    Attributes:
        ref: ``package.module:attr``: the judge (a callable ``JudgeRequest -> score``), or
            with ``kwargs`` set a factory called with them that returns the judge (e.g.
            ``experiments.judges:noisy_verifier``, ``scenarios.reward_sources:http_judge``,
            ``marl_agents.llm.judges:llm_judge`` for a frozen LLM).
        kwargs: the factory's keyword arguments; ``None``: ``ref`` is the judge itself.
        name: the judge's name in metrics and errors (default ``<attr>_<index>``).
    """

    ref: str
    kwargs: dict[str, Any] | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        typed(self, "judge")


@dataclasses.dataclass
class RewardSourceConfig:
    """One named, weighted reward source (see :mod:`scenarios.reward_sources`).

    Attributes:
        name: the metric name (``charts/reward/<name>``): letters, digits, ``_ . -``.
        kind: ``verifier`` (the scenario's score), ``checklist``, ``judge`` or ``shaping``.
        weight: multiplies the source's value (finite).
        when: ``end`` (once per episode, to every agent that acted) or ``turn`` (every
            decision, to the agent that made it; not for the verifier).
        checklist: (checklist) ``package.module:attr`` of a ``Checklist`` or a dict criterion
            → predicate ``(state, message)``; ``None``: the scenario's ``reward_checklist()``.
        criteria_weights: (checklist) criterion → weight, overriding the checklist's.
        judges: (judge) one or more judges.
        vote: (judge) ``majority`` (scores ≥ ``threshold`` pass) or ``mean``.
        threshold: (judge) the pass mark of a majority vote.
        timeout_s: (judge) seconds each judge may take; a late judge is a failure.
        on_failure: (judge) ``raise`` (the episode fails with the judge named) or ``skip``
            (left out of the vote, counted in ``reward/judge_failures``; all failing raises).
        rubric: (judge) the rubric given to every judge.
        term: (shaping) ``tool_calls`` or ``package.module:function(scenario, turn)``.
    """

    name: str
    kind: SourceKind = "verifier"
    weight: float = 1.0
    when: Literal["end", "turn"] = "end"
    checklist: str | None = None
    criteria_weights: dict[str, float] = dataclasses.field(default_factory=dict)
    judges: list[JudgeConfig] = dataclasses.field(default_factory=list)
    vote: Literal["majority", "mean"] = "majority"
    threshold: float = 0.5
    timeout_s: float = 30.0
    on_failure: Literal["raise", "skip"] = "raise"
    rubric: str = ""
    term: str = "tool_calls"

    def __post_init__(self) -> None:
        typed(self, "rewards.sources")

    def check(self, where: str) -> None:
        """Field values, and no field of another kind set."""
        error = ConfigError
        if not _NAME.match(self.name):
            raise error(f"{where}.name={self.name!r}: use letters, digits, '_', '.' or '-'")
        if not math.isfinite(self.weight):
            raise error(f"{where}.weight={self.weight!r}: use a finite number")
        if self.kind == "verifier" and self.when == "turn":
            raise error(f"{where}.when='turn': the verifier scores whole episodes: use end")
        defaults = RewardSourceConfig(name="x")
        for kind, fields in KIND_FIELDS.items():
            for f in fields:
                if kind != self.kind and getattr(self, f) != getattr(defaults, f):
                    raise error(
                        f"{where}.{f} is set but kind is {self.kind!r}: it is a field of "
                        f"{kind} sources; remove it or set kind: {kind}"
                    )
        if self.kind == "judge":
            if not self.judges:
                raise error(f"{where}.judges is empty: list at least one judge (ref: pkg.mod:attr)")
            if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
                raise error(f"{where}.timeout_s={self.timeout_s!r}: use a positive number")
            if not math.isfinite(self.threshold):
                raise error(f"{where}.threshold={self.threshold!r}: use a finite number")
        for c, w in self.criteria_weights.items():
            if not math.isfinite(w):
                raise error(f"{where}.criteria_weights[{c!r}]={w!r}: use a finite number")


@dataclasses.dataclass
class RewardsConfig:
    """Reward sources composing the training reward (empty: the verifier's reward as it is).

    Attributes:
        sources: the sources, unique names.
        normalize: ``sum`` (the weighted sum is the reward) or ``per_source`` (GRPO: each
            source is normalised within its group before the weighted sum; a large term cannot
            drown a small one).
    """

    sources: list[RewardSourceConfig] = dataclasses.field(default_factory=list)
    normalize: Literal["sum", "per_source"] = "sum"

    def __post_init__(self) -> None:
        typed(self, "rewards")

    def check(self) -> None:
        """Every source's fields, unique names, and references importable."""
        error = ConfigError
        names = [s.name for s in self.sources]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise error(f"rewards.sources: names {dup} repeat: give every source its own name")
        if self.normalize == "per_source" and not self.sources:
            raise error("rewards.normalize='per_source' needs rewards.sources: list them")
        for i, s in enumerate(self.sources):
            s.check(f"rewards.sources[{i}]")
        if self.sources:
            from scenarios.base import ScenarioError
            from scenarios.reward_sources import check_references

            try:
                check_references(self.to_spec())
            except ScenarioError as exc:
                raise error(str(exc)) from None

    def to_spec(self) -> dict[str, Any]:
        """The plain dict :meth:`scenarios.reward_sources.RewardSources.from_spec` reads."""
        return to_plain(self)
