"""``monitors:``: the reward-hacking and collapse monitors' settings (:class:`MonitorsConfig`).

What each monitor watches and when it alarms is :mod:`trainers.signals.monitors`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from trainers.configs.typed import ConfigError, typed

Action = Literal["off", "warn", "checkpoint", "stop"]
ACTIONS: tuple[str, ...] = ("off", "warn", "checkpoint", "stop")


def _check_action(action: str, where: str) -> None:
    if action not in ACTIONS:
        raise ConfigError(f"{where}.action={action!r} is unknown: use one of {', '.join(ACTIONS)}")


@dataclasses.dataclass
class LengthMonitor:
    """Correlation of episode length with reward.

    Attributes:
        action: ``off | warn | checkpoint | stop``.
        max_r: alarm when Pearson r(length, team return) exceeds this.
        min_episodes: iterations with fewer finished episodes are not judged.
    """

    action: Action = "warn"
    max_r: float = 0.5
    min_episodes: int = 8

    def __post_init__(self) -> None:
        typed(self, "monitors.length")

    def check(self) -> None:
        _check_action(self.action, "monitors.length")
        if not -1.0 <= self.max_r <= 1.0:
            raise ConfigError(f"monitors.length.max_r must be in -1…1, got {self.max_r}")
        if self.min_episodes < 2:
            raise ConfigError(
                f"monitors.length.min_episodes must be ≥ 2 (a correlation needs two episodes), "
                f"got {self.min_episodes}"
            )


@dataclasses.dataclass
class EntropyMonitor:
    """Entropy collapse (below ``floor``) and sudden rises (by more than ``rise``, relative).

    Attributes:
        action: ``off | warn | checkpoint | stop``.
        floor: nats per decision (per token for LLM pools).
        rise: alarm when entropy > (1 + rise) × the previous iteration's (null: never).
    """

    action: Action = "warn"
    floor: float = 0.01
    rise: float | None = 1.0

    def __post_init__(self) -> None:
        typed(self, "monitors.entropy")

    def check(self) -> None:
        _check_action(self.action, "monitors.entropy")
        if self.floor < 0:
            raise ConfigError(f"monitors.entropy.floor must be ≥ 0 nats, got {self.floor}")
        if self.rise is not None and self.rise <= 0:
            raise ConfigError(
                f"monitors.entropy.rise must be > 0 (a relative rise) or null, got {self.rise}"
            )


@dataclasses.dataclass
class KLMonitor:
    """KL to the starting policy of GRPO pools.

    Attributes:
        action: ``off | warn | checkpoint | stop``.
        log: keep a frozen copy of each trained LLM pool's starting weights on the learner
            and log ``grpo/kl_to_start`` (one extra no-grad forward per iteration; the copy
            costs the model's memory once more). ``false`` saves both when ``kl_coef`` is 0.
        max: alarm when the KL exceeds this (null: only logged).
    """

    action: Action = "warn"
    log: bool = True
    max: float | None = None

    def __post_init__(self) -> None:
        typed(self, "monitors.kl")

    def check(self) -> None:
        _check_action(self.action, "monitors.kl")
        if self.max is not None and self.max <= 0:
            raise ConfigError(f"monitors.kl.max must be > 0 nats or null, got {self.max}")
        if self.max is not None and not self.log:
            raise ConfigError("monitors.kl.max needs monitors.kl.log: true (the KL must be logged)")


@dataclasses.dataclass
class GoldMonitor:
    """The gap between the training reward and a stricter ``gold`` verifier.

    Attributes:
        action: ``off | warn | checkpoint | stop``.
        scorer: ``pkg.mod:attr`` (``f(scenario, final_state) -> float``) or the name of a
            scenario method (``method(final_state) -> float``); null: no gold monitor.
        max_gap: alarm when team return − gold exceeds this.
        max_slope: alarm when the gap's least-squares slope over ``window`` iterations
            exceeds this per iteration (null: no trend alarm).
        window: iterations in the trend.
    """

    action: Action = "warn"
    scorer: str | None = None
    max_gap: float = 0.2
    max_slope: float | None = 0.02
    window: int = 5

    def __post_init__(self) -> None:
        typed(self, "monitors.gold")

    def check(self) -> None:
        _check_action(self.action, "monitors.gold")
        if self.scorer is not None and not self.scorer.strip():
            raise ConfigError(
                "monitors.gold.scorer is empty: give pkg.mod:attr or a scenario method name"
            )
        if self.window < 2:
            raise ConfigError(f"monitors.gold.window must be ≥ 2 iterations, got {self.window}")


@dataclasses.dataclass
class ToolCallMonitor:
    """Tool-call rate collapse: calls per episode falling to (about) zero.

    Attributes:
        action: ``off | warn | checkpoint | stop``.
        metric: the scenario metric counting calls per episode (``charts/<metric>``).
        floor: alarm when the rate is at most this…
        from_at_least: …after it was at least this in an earlier iteration.
    """

    action: Action = "warn"
    metric: str = "calls"
    floor: float = 0.05
    from_at_least: float = 0.5

    def __post_init__(self) -> None:
        typed(self, "monitors.tool_calls")

    def check(self) -> None:
        _check_action(self.action, "monitors.tool_calls")
        if not 0 <= self.floor < self.from_at_least:
            raise ConfigError(
                f"monitors.tool_calls needs 0 ≤ floor < from_at_least, got floor={self.floor}, "
                f"from_at_least={self.from_at_least}"
            )


@dataclasses.dataclass
class CriticMonitor:
    """A critic that does not learn: a clipped value loss, or (opt-in) a low explained variance.

    The clipped-loss rule is on by default: RLlib's PPO loss clamps squared value errors at
    ``vf_clip_param``, and when most of the loss is clamped the critic gets (almost) no
    gradient (issue #27: the old ``vf_clip_param: 10`` on ``spread`` removes ≈ 80% from the
    first iteration; the default clamps nothing). The explained-variance rule is off by default
    (``floor: null``): a low ``vf_explained_var`` is as often a return the pool's observations
    cannot predict as a broken critic. Measured with the defaults (value normalisation, no
    clamp), while the teams learn: ``delegate``'s one-decision workers sit at 0.00–0.08 and
    ``relay``'s pools at ≈ 0 (chance-level successes, then constant ones), so ``floor: 0.05,
    iterations: 5`` fired on every such run (9 delegate runs, 2 relay runs). ``floor: 0.02,
    iterations: 10`` flags the old clamped config on ``spread`` (2 of 3 seeds, at iterations 23
    and 26; the third seed's critic got out of the clamp) and none of the default's ``spread``
    or ``delegate`` runs, but still ``relay``'s: set it where the returns are predictable.

    Attributes:
        action: ``off | warn | checkpoint | stop``.
        max_clipped: alarm when more than this share of the value loss is clipped away
            (``1 − vf_loss / vf_loss_unclipped``); null: never.
        floor: alarm when a pool's ``vf_explained_var`` stays below this… (null: never)
        iterations: …for this many consecutive iterations (≥ 1)…
        after: …not counting the first ``after`` iterations (a fresh critic explains nothing
            yet).
    """

    action: Action = "warn"
    max_clipped: float | None = 0.5
    floor: float | None = None
    iterations: int = 10
    after: int = 5

    def __post_init__(self) -> None:
        typed(self, "monitors.critic")

    def check(self) -> None:
        _check_action(self.action, "monitors.critic")
        if self.floor is not None and not -1.0 <= self.floor <= 1.0:
            raise ConfigError(
                f"monitors.critic.floor must be in -1…1 (an explained variance) or null, got "
                f"{self.floor}"
            )
        if self.iterations < 1 or self.after < 0:
            raise ConfigError(
                f"monitors.critic needs iterations ≥ 1 and after ≥ 0, got iterations="
                f"{self.iterations}, after={self.after}"
            )
        if self.max_clipped is not None and not 0 <= self.max_clipped < 1:
            raise ConfigError(
                f"monitors.critic.max_clipped must be in [0, 1) (a share of the value loss) or "
                f"null, got {self.max_clipped}"
            )


@dataclasses.dataclass
class MonitorsConfig:
    """The hacking and collapse monitors (all on by default, warning only).

    Attributes:
        length: length–reward correlation.
        entropy: entropy floor and sudden rises.
        kl: KL to the starting policy (GRPO pools).
        gold: proxy–gold gap (needs ``gold.scorer``).
        tool_calls: tool-call rate collapse.
        critic: the critic's explained variance and clipped value loss.
        warmup: iterations before any alarm (their metrics are still logged).
    """

    length: LengthMonitor = dataclasses.field(default_factory=LengthMonitor)
    entropy: EntropyMonitor = dataclasses.field(default_factory=EntropyMonitor)
    kl: KLMonitor = dataclasses.field(default_factory=KLMonitor)
    gold: GoldMonitor = dataclasses.field(default_factory=GoldMonitor)
    tool_calls: ToolCallMonitor = dataclasses.field(default_factory=ToolCallMonitor)
    critic: CriticMonitor = dataclasses.field(default_factory=CriticMonitor)
    warmup: int = 0

    def __post_init__(self) -> None:
        typed(self, "monitors")

    def check(self) -> None:
        """Known actions and sane thresholds."""
        for part in (self.length, self.entropy, self.kl, self.gold, self.tool_calls, self.critic):
            part.check()
        if self.warmup < 0:
            raise ConfigError(f"monitors.warmup must be ≥ 0 iterations, got {self.warmup}")
