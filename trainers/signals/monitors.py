"""Monitors for reward hacking and collapse, checked after every training iteration.

Contract: :class:`Monitors` reads one iteration's metrics row (and, for the per-episode
length/reward moments and the gold score, RLlib's result), adds ``monitor/…`` keys to the row
(so they land in ``metrics.jsonl``) and returns the :class:`Alarm`\\ s raised this iteration.
Each monitor is a pure function of the metric stream, alarms once when its condition starts
(again after the condition cleared) and says what users usually do about it. Its ``action``
decides what :func:`trainers.run.loop.train` does: ``warn`` (log it), ``checkpoint`` (also save
``checkpoints/alarm_iter_NNNNNN``), ``stop`` (end the run cleanly with status
``stopped: monitor <name> …`` and a final checkpoint) or ``off``. Alarms are listed in
``summary.json["alarms"]``.

Monitors (config section ``monitors:``, :class:`MonitorsConfig`):

* ``length`` — Pearson r between episode length (completion tokens of text agents, else
  decisions) and team return **among episodes of the same outcome** (succeeded / failed, and
  malformed replies apart where the scenario reports formats: the pooled within-outcome
  correlation), over the iteration's episodes, from sums the episode
  callback logs per outcome (:func:`episode_length`, :func:`length_values`,
  :func:`pearson_within`); alarm at r > ``max_r`` (0.5). Within an outcome a longer episode
  that is paid more is paid for its length (a judge that likes long answers, a per-round
  bonus); across outcomes a longer episode is often simply a solved one (a completed handoff,
  a tool call that was needed), which the pooled correlation over all episodes mistook for
  an exploit.
* ``entropy`` — per learning pool, ``losses/<pool>/entropy`` below ``floor``, or a rise by
  more than ``rise`` (relative) over the previous iteration.
* ``kl`` — GRPO pools log ``losses/<pool>/grpo/kl_to_start`` (KL from a frozen copy of the
  starting weights, also when ``kl_coef`` is 0); alarm above ``max`` when set.
* ``gold`` — with a ``scorer`` (``pkg.mod:attr`` called as ``f(scenario, final_state)``, or
  the name of a scenario method called with the final state) the episodes' mean gold score
  ``monitor/gold``, the gap ``monitor/gold_gap`` = team return − gold and its least-squares
  slope over ``window`` iterations; alarm when the gap exceeds ``max_gap`` or grows faster
  than ``max_slope`` per iteration.
* ``tool_calls`` — the scenario's ``charts/<metric>`` (default ``calls`` per episode) falling
  to ≤ ``floor`` after it was ≥ ``from_at_least``.
* ``critic`` — per learning pool whose learner logs them (PPO's): the share of the value loss
  that clipping removes, ``monitor/<pool>/vf_clipped`` = 1 − ``vf_loss`` /
  ``vf_loss_unclipped``, above ``max_clipped`` (the clamp of ``vf_clip_param`` on squared errors
  takes the critic's gradient away; issue #27); and, when ``floor`` is set (off by default, see
  :class:`CriticMonitor`), ``losses/<pool>/vf_explained_var`` below ``floor`` in ``iterations``
  consecutive iterations counted after the first ``after``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scenarios.text_space import TextSpaces
from trainers.configs.monitors import Action, MonitorsConfig
from trainers.configs.typed import ConfigError

log = logging.getLogger(__name__)

#: the outcomes the length monitor compares episodes within: success, and whether the
#: replies were well formed where the scenario reports it (:func:`well_formed`)
OUTCOMES = ("succeeded", "failed", "succeeded_malformed", "failed_malformed")
#: per-outcome moments the episode callback sums (under ``marl/``) for the length monitor:
#: ``len_<outcome>_<moment>`` (``n``, Σx, Σy, Σx², Σy², Σxy with x = length, y = team return)
MOMENTS = ("n", "x", "y", "xx", "yy", "xy")
#: env-runner sum of the gold scores (under ``marl/``)
GOLD_SUM = "gold"
#: ``learner_config_dict`` key: whether GRPO learners log ``grpo/kl_to_start``
KL_TO_START = "kl_to_start"


# ----- the math --------------------------------------------------------------------------------
def pearson_within(groups: Sequence[Sequence[float]]) -> float | None:
    """The pooled within-group Pearson r: each group's ``(n, Σx, Σy, Σx², Σy², Σxy)``
    centred on its own means, the (co)variances summed over groups (one group: the plain
    Pearson r). None when x or y does not vary within any group (or fewer than two samples in
    all)."""
    vx = vy = cxy = sxx_all = syy_all = 0.0
    total = 0.0
    for n, sx, sy, sxx, syy, sxy in groups:
        if n <= 0:
            continue
        total += n
        vx += sxx - sx * sx / n
        vy += syy - sy * sy / n
        cxy += sxy - sx * sy / n
        sxx_all += sxx
        syy_all += syy
    if total < 2 or vx <= 1e-12 * max(1.0, sxx_all) or vy <= 1e-12 * max(1.0, syy_all):
        return None
    r = cxy / math.sqrt(vx * vy)
    return max(-1.0, min(1.0, r)) if math.isfinite(r) else None


def _finite(value: Any) -> float:
    """``value`` as a float, 0 for a missing or non-finite one."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) else 0.0


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against 0, 1, 2, … (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    x = np.arange(len(values), dtype=float)
    y = np.asarray(values, dtype=float)
    x -= x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())


def episode_length(episode: Any) -> int:
    """An episode's length for the length monitor: the completion tokens of text agents (ids
    before the padding value of each action), one per decision of other agents. A text agent
    is one whose observation and action spaces are both token ids
    (:meth:`~scenarios.text_space.TextSpaces.of`); a ``MultiDiscrete`` choice over a ``Box``
    observation (delegate's orchestrator) counts decisions."""
    total = 0
    for agent_episode in episode.agent_episodes.values():
        actions = agent_episode.get_actions()
        if len(actions) == 0:
            continue
        text = TextSpaces.of(
            getattr(agent_episode, "observation_space", None),
            getattr(agent_episode, "action_space", None),
        )
        arr = np.asarray(actions) if text is not None else None
        if arr is None or arr.ndim != 2:
            total += len(actions)
            continue
        pad = text.pad_id
        for row in arr.tolist():  # a few short rows: Python beats numpy's per-call cost
            total += row.index(pad) if pad in row else len(row)
    return total


def well_formed(outcome: Any) -> bool | None:
    """``False`` when an episode's outcome reports a format error (its ``metrics`` carry
    ``format_errors`` > 0 or ``format_ok`` false), ``True`` when it reports none, ``None``
    when the scenario does not report formats."""
    metrics = getattr(outcome, "metrics", None) or {}
    if "format_errors" in metrics:
        return float(metrics["format_errors"]) == 0
    if "format_ok" in metrics:
        return bool(metrics["format_ok"])
    return None


def length_values(length: float, outcome: Any) -> dict[str, float]:
    """One episode's ``len_<outcome>_<moment>`` terms (:data:`MOMENTS` of its outcome class:
    success, and a format error where reported; summed per iteration by the callback) and
    ``length`` (for the mean). A malformed reply is often shorter and always paid less than a
    well-formed one: an honest link between length and reward, kept apart like success."""
    x, y = float(length), float(outcome.reward)
    kind = (OUTCOMES[0] if outcome.success else OUTCOMES[1]) + (
        "_malformed" if well_formed(outcome) is False else ""
    )
    terms = (1.0, x, y, x * x, y * y, x * y)
    return {"length": x, **{f"len_{kind}_{m}": v for m, v in zip(MOMENTS, terms, strict=True)}}


def gold_scorer(ref: str) -> Any:
    """``f(scenario, final_state) -> float`` for a ``pkg.mod:attr`` reference or a scenario
    method name."""
    if ":" in ref:
        import importlib

        mod, _, attr = ref.partition(":")
        try:
            obj: Any = importlib.import_module(mod)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"monitors.gold.scorer={ref!r} cannot be imported ({exc}): give pkg.mod:attr "
                "of a function f(scenario, final_state) -> float on the Python path"
            ) from None
        return obj

    def method(scenario: Any, state: Any) -> float:
        fn = getattr(scenario, ref, None)
        if not callable(fn):
            raise ConfigError(
                f"monitors.gold.scorer={ref!r}: scenario {type(scenario).__name__} has no such "
                "method; give a method name it has or pkg.mod:attr"
            )
        return fn(state)

    return method


# ----- alarms and the per-iteration check ------------------------------------------------------
ADVICE = {
    "length": "reward rises with episode length: check that the reward or judge does not pay "
    "for length; add a length penalty or budget (grpo.length_budget), cap max_new_tokens, or "
    "train on a stricter verifier",
    "entropy_floor": "the policy has collapsed to (nearly) deterministic actions: raise "
    "entropy_coeff or the sampling temperature, lower lr, or restart from an earlier checkpoint",
    "entropy_rise": "entropy jumped: the update destabilised the policy; lower lr, tighten "
    "clipping or grad_clip, and compare with the checkpoint before the jump",
    "kl": "the policy drifted far from its starting point: set grpo.kl_coef > 0, lower lr, or "
    "check the outputs for reward hacking (transcripts/)",
    "gold_gap": "the training reward outruns the gold verifier (reward hacking): inspect "
    "transcripts/, fix or tighten the reward, and keep the checkpoint where gold was best",
    "gold_trend": "the proxy–gold gap is growing: the policy is learning to game the reward; "
    "inspect transcripts/ and tighten the reward before the gap grows further",
    "tool_calls": "agents stopped calling tools (interaction collapse): add a per-call reward, "
    "raise entropy, or check that tool results reach the agents",
    "critic_stalled": "the critic explains (almost) none of the returns' variance, so the "
    "advantages are returns minus a constant: keep algorithm.value_norm: true (the default) and "
    "remove any vf_clip_param from algorithm.extra (a clamp on squared errors stops the "
    "critic's gradient once |V − target| > √vf_clip_param); else raise lr or vf_loss_coeff, or "
    "give the critic the inputs the return depends on. If the return cannot be predicted from "
    "the pool's observations (one decision per episode, chance-level successes) nothing is "
    "wrong: lower monitors.critic.floor or set it to null",
    "critic_clipped": "most of the value loss is clipped away (vf_clip_param clamps squared "
    "errors, so those rows give the critic no gradient): remove vf_clip_param from "
    "algorithm.extra or raise it far above the squared returns, and keep algorithm.value_norm: "
    "true",
}


@dataclasses.dataclass
class Alarm:
    """One alarm: which monitor, the metric and its value, the iteration and the advice."""

    monitor: str
    metric: str
    value: float
    threshold: float
    iteration: int
    action: str
    advice: str

    def message(self) -> str:
        return (
            f"monitor {self.monitor}: {self.metric} = {self.value:.4g} (threshold "
            f"{self.threshold:.4g}) at iteration {self.iteration}: {self.advice}"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Monitors:
    """The configured monitors' state over one run (see the module doc)."""

    def __init__(self, cfg: MonitorsConfig, pools: Sequence[str] = ()) -> None:
        self.cfg = cfg
        self.pools = list(pools)
        self.alarms: list[Alarm] = []
        self.active: set[str] = set()  # conditions currently on (alarmed once)
        self.entropy: dict[str, float] = {}  # pool → the previous iteration's entropy
        self.gaps: list[float] = []
        self.calls_seen = False
        self.low_ev: dict[str, int] = {}  # pool → consecutive judged iterations below the floor
        self.seen = 0  # iterations judged

    @staticmethod
    def extract(result: Mapping[str, Any], row: dict[str, Any]) -> None:
        """Add ``monitor/length_r``, ``monitor/length_mean``, ``monitor/gold`` and
        ``monitor/gold_gap`` to ``row`` from RLlib's ``result``."""
        marl = (result.get("env_runners") or {}).get("marl") or {}
        n = float(marl.get("episodes", 0) or 0)
        if n <= 0:
            return
        row["monitor/episodes"] = n
        if "length" in marl:
            row["monitor/length_mean"] = float(marl["length"]) / n
            # an outcome no episode had this iteration is missing, or NaN once it was logged
            # before (RLlib reduces an empty window to NaN): it contributes nothing
            groups = [[_finite(marl.get(f"len_{o}_{m}")) for m in MOMENTS] for o in OUTCOMES]
            r = pearson_within(groups)
            if r is not None:
                row["monitor/length_r"] = r
        scored = float(marl.get(f"{GOLD_SUM}_episodes", 0) or 0)
        if scored > 0:  # over the episodes the scorer saw
            gold = float(marl[GOLD_SUM]) / scored
            row["monitor/gold"] = gold
            row["monitor/gold_gap"] = float(marl[f"{GOLD_SUM}_proxy"]) / scored - gold

    def observe(self, row: dict[str, Any], result: Mapping[str, Any] | None = None) -> list[Alarm]:
        """Judge one iteration: adds ``monitor/*`` keys to ``row``; returns the new alarms."""
        if result is not None:
            self.extract(result, row)
        it = int(row.get("charts/iteration", self.seen + 1))
        self.seen += 1
        found: list[tuple[str, str, str, float, float, Action]] = []
        found += self._length(row)
        found += self._entropy(row)
        found += self._kl(row)
        found += self._gold(row)
        found += self._tool_calls(row)
        found += self._critic(row, it)
        on = {key for key, *_ in found}
        new = []
        for key, name, metric, value, threshold, action in found:
            if key in self.active or action == "off" or self.seen <= self.cfg.warmup:
                continue
            new.append(Alarm(name, metric, value, threshold, it, action, ADVICE[name]))
        self.active = on if self.seen > self.cfg.warmup else set()  # judged after warm-up
        self.alarms += new
        row["monitor/alarms"] = len(new)
        return new

    def replay(self, history: Sequence[Mapping[str, Any]], alarms: Sequence[Mapping]) -> None:
        """Rebuild the state of a resumed run from its metrics rows and recorded alarms."""
        for h in history:
            self.observe(dict(h))
        self.alarms = [Alarm(**a) for a in alarms]

    # each returns (condition key, monitor, metric, value, threshold, action) per condition on
    def _length(self, row: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        c = self.cfg.length
        r = row.get("monitor/length_r")
        if r is None or row.get("monitor/episodes", 0) < c.min_episodes or r <= c.max_r:
            return []
        return [("length", "length", "monitor/length_r", r, c.max_r, c.action)]

    def _entropy(self, row: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        c, out = self.cfg.entropy, []
        for key, value in row.items():
            parts = key.split("/")
            if len(parts) != 3 or parts[0] != "losses" or parts[2] != "entropy":
                continue
            pool, e = parts[1], float(value)
            if e < c.floor:
                out.append((f"floor:{pool}", "entropy_floor", key, e, c.floor, c.action))
            prev = self.entropy.get(pool)
            if c.rise is not None and prev is not None and prev > c.floor:
                bound = (1 + c.rise) * prev
                if e > bound:
                    out.append((f"rise:{pool}", "entropy_rise", key, e, bound, c.action))
            self.entropy[pool] = e
        return out

    def _kl(self, row: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        c, out = self.cfg.kl, []
        if c.max is None:
            return out
        for key, value in row.items():
            if key.startswith("losses/") and key.endswith("/grpo/kl_to_start") and value > c.max:
                out.append((f"kl:{key}", "kl", key, float(value), c.max, c.action))
        return out

    def _gold(self, row: dict[str, Any]) -> list[tuple[Any, ...]]:
        c, out = self.cfg.gold, []
        gap = row.get("monitor/gold_gap")
        if gap is None:
            return out
        self.gaps = [*self.gaps, float(gap)][-c.window :]
        if gap > c.max_gap:
            out.append(("gold_gap", "gold_gap", "monitor/gold_gap", gap, c.max_gap, c.action))
        if len(self.gaps) >= c.window:
            s = slope(self.gaps)
            row["monitor/gold_gap_slope"] = s
            if c.max_slope is not None and s > c.max_slope:
                metric = "monitor/gold_gap_slope"
                out.append(("gold_trend", "gold_trend", metric, s, c.max_slope, c.action))
        return out

    def _tool_calls(self, row: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        c = self.cfg.tool_calls
        key = f"charts/{c.metric}"
        if key not in row:
            return []
        rate = float(row[key])
        if rate >= c.from_at_least:
            self.calls_seen = True
        if self.calls_seen and rate <= c.floor:
            return [("tool_calls", "tool_calls", key, rate, c.floor, c.action)]
        return []

    def _critic(self, row: dict[str, Any], iteration: int) -> list[tuple[Any, ...]]:
        c, out = self.cfg.critic, []
        for key, value in list(row.items()):
            parts = key.split("/")
            if len(parts) != 3 or parts[0] != "losses" or parts[2] != "vf_explained_var":
                continue
            pool, ev, floor = parts[1], float(value), c.floor
            low = floor is not None and iteration > c.after and ev < floor
            self.low_ev[pool] = self.low_ev.get(pool, 0) + 1 if low else 0
            if floor is not None and self.low_ev[pool] >= c.iterations:
                out.append((f"ev:{pool}", "critic_stalled", key, ev, floor, c.action))
            losses = (row.get(f"losses/{pool}/{k}") for k in ("vf_loss", "vf_loss_unclipped"))
            clipped = clipped_share(*losses)
            if clipped is None:
                continue
            metric = f"monitor/{pool}/vf_clipped"
            row[metric] = clipped
            bound = c.max_clipped
            if bound is not None and clipped > bound:
                out.append((f"clip:{pool}", "critic_clipped", metric, clipped, bound, c.action))
        return out


def clipped_share(vf_loss: Any, unclipped: Any) -> float | None:
    """``1 − vf_loss / vf_loss_unclipped``: the share of the mean squared value error that the
    clamp at ``vf_clip_param`` removes (0: nothing clipped); None without both or with an
    unclipped loss of 0."""
    if vf_loss is None or unclipped is None or not float(unclipped) > 0:
        return None
    return min(1.0, max(0.0, 1.0 - float(vf_loss) / float(unclipped)))


def strongest(alarms: Sequence[Alarm]) -> str:
    """The strongest action among ``alarms`` (``stop`` > ``checkpoint`` > ``warn``)."""
    order = {"off": 0, "warn": 1, "checkpoint": 2, "stop": 3}
    return max((a.action for a in alarms), key=order.__getitem__, default="off")
