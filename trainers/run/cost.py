"""What an iteration costs, shown once the first one is done: where its time went (the phase
timers of :mod:`trainers.signals.phase_timers`) and, when it was slow, the knobs of the config
that set that cost (prompt length, epochs, episodes an iteration and their step limit, a large
vocabulary).

:func:`cost_lines` is pure (a metrics row, the experiment, its plan → lines of text), so the
rules are tested without training; :mod:`trainers.run.loop` prints its lines after the first
iteration of a run (not of a resumed one).

Example:
    >>> row = {"charts/iteration_s": 10.0, "timers/env_s": 1.0, "timers/learn_s": 8.0}
    >>> where_time_goes(row)
    'iteration 1: 10.0 s — learn 8.0 s (80%), env 1.0 s (10%), other 1.0 s (10%)'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainers.signals.phase_timers import PHASE_KEYS

#: an iteration slower than this (seconds) gets the knobs that set its cost
SLOW_ITERATION_S = 30.0
#: a phase taking at least this share of a slow iteration is named as its cost
MAIN_SHARE = 0.4
#: prompt budgets (tokens) beyond which a slow learner or sampler names ``max_prompt_tokens``
LONG_PROMPT = 512
#: a share of episodes cut by the step limit from which ``max_supersteps`` is named
LIMITED_SHARE = 0.2
#: vocabularies (token ids) beyond which every scored token's logits are a cost of their own
LARGE_VOCAB = 100_000


def where_time_goes(row: Mapping[str, Any]) -> str:
    """One line: the iteration's wall time and its phases, largest first, with shares."""
    total = float(row.get("charts/iteration_s", 0.0) or 0.0)
    phases = {
        key.removeprefix("timers/").removesuffix("_s"): float(row.get(key, 0.0) or 0.0)
        for key in PHASE_KEYS
    }
    phases = {k: v for k, v in phases.items() if v > 0}
    other = max(0.0, total - sum(phases.values()))
    if other > 0:
        phases["other"] = other
    parts = [
        f"{name.replace('_', ' ')} {secs:.1f} s ({100 * secs / total:.0f}%)"
        for name, secs in sorted(phases.items(), key=lambda kv: -kv[1])
        if total > 0
    ]
    head = f"iteration {row.get('charts/iteration', 1)}: {total:.1f} s"
    return f"{head} — {', '.join(parts)}" if parts else head


def cost_lines(
    row: Mapping[str, Any], cfg: Any, plan: Any, slow_s: float = SLOW_ITERATION_S
) -> list[str]:
    """Where the first iteration's time went and, when it took ``slow_s`` or more, one
    ``warning:`` line per knob of ``cfg`` that sets the cost of its largest phases."""
    lines = [where_time_goes(row)]
    total = float(row.get("charts/iteration_s", 0.0) or 0.0)
    if total < slow_s:
        return lines
    learn = float(row.get("timers/learn_s", 0.0) or 0.0) / total
    sample = sum(
        float(row.get(f"timers/{p}_s", 0.0) or 0.0) for p in ("env", "forward", "sample_overhead")
    )
    sample /= total
    algo = cfg.algorithm
    grpo = getattr(algo, "grpo", None)
    llm = _llm_pools(plan)
    knobs: list[str] = []
    if learn >= MAIN_SHARE and algo.num_epochs > 1:
        default = type(algo)().num_epochs
        knobs.append(
            f"algorithm.num_epochs={algo.num_epochs}: the learner passes over each batch "
            f"{algo.num_epochs} times ({algo.name}'s default: {default})"
        )
    if (learn >= MAIN_SHARE or sample >= MAIN_SHARE) and llm:
        for pid, (prompt, reply, vocab, path) in llm.items():
            if prompt > LONG_PROMPT:
                knobs.append(
                    f"pool {pid!r}: prompts of up to {prompt} tokens (scenario_kwargs."
                    "max_prompt_tokens, ChatAppScenario(max_prompt_tokens=...)): the learner "
                    "and the sampler run every prompt token; 512 fits the tiny model's apps"
                )
            if vocab > LARGE_VOCAB:
                knobs.append(
                    f"pool {pid!r}: model {path!r} has a {vocab:,}-token vocabulary: every "
                    f"prompt and reply token ({prompt} + {reply} at most) costs a row of "
                    f"{vocab:,} logits; a smaller model (pools.{pid}.model.path) or shorter "
                    "prompts and replies cost less"
                )
    limited = float(row.get("charts/limit_rate", 0.0) or 0.0)
    if limited >= LIMITED_SHARE:
        knobs.append(
            f"{100 * limited:.0f}% of the episodes ran to the step limit (mean "
            f"{float(row.get('charts/episode_len', 0.0) or 0.0):.0f} env steps an episode): "
            "the scenario's max_supersteps (scenario_kwargs.max_supersteps, "
            "ChatAppScenario(max_supersteps=...)) caps what such an episode costs"
        )
    if sample >= MAIN_SHARE or learn >= MAIN_SHARE:
        if grpo is not None:
            n = grpo.episodes_per_iteration
            knobs.append(
                f"{n} episodes an iteration (algorithm.grpo.group_size={grpo.group_size} × "
                f"groups_per_iteration={grpo.groups_per_iteration}): fewer groups an iteration "
                "cost proportionally less"
            )
        elif hasattr(algo, "train_batch_size"):
            knobs.append(
                f"algorithm.train_batch_size={algo.train_batch_size} env steps an iteration"
            )
    lines += [
        f"warning: iteration {row.get('charts/iteration', 1)} took {total:.0f} s; what sets "
        f"its cost: {knob}"
        for knob in knobs
    ]
    return lines


def _llm_pools(plan: Any) -> dict[str, tuple[int, int, int, str]]:
    """Pool id → (max prompt tokens, max reply tokens, vocabulary, model path) of the plan's
    LLM pools that train (whose learner and sampler the iteration pays for)."""
    from marl_agents.pools import LLMModel

    out = {}
    for pid, pool in plan.pools.items():
        if not isinstance(pool.model, LLMModel):
            continue
        from marl_agents.llm.rl_module import spaces_from

        try:
            spaces = spaces_from(pool.observation_space, pool.action_space)
        except TypeError:  # not text spaces: resolve() refuses such a pool
            continue
        out[pid] = (
            spaces.max_prompt_tokens,
            spaces.max_new_tokens,
            spaces.vocab_size,
            pool.model.path,
        )
    return out


__all__ = ["SLOW_ITERATION_S", "cost_lines", "where_time_goes"]
