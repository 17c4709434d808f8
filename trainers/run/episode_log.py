"""The per-iteration episode log: failed episodes' distinct errors, transcripts and credit
of the iteration's episodes, drained from the env runners.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainers.configs.experiment import ExperimentConfig
from trainers.run.outcome import RunFailed

log = logging.getLogger(__name__)


class EpisodeLog:
    """A run's failed episodes and transcripts, drained from the env runners' journals
    (:class:`trainers.signals.episode_metrics.EpisodeJournal`) after every iteration."""

    def __init__(self, cfg: ExperimentConfig, plan: Any, run: Path, resumed: bool) -> None:
        self.cfg, self.plan, self.run = cfg, plan, run
        self.errors: dict[tuple[str, str], dict[str, Any]] = {}
        self.streak = 0  # consecutive iterations in which every finished episode failed
        self._env: Any = None  # replays credit for transcripts (built on first use)
        summary = run / "summary.json"
        if resumed and summary.exists():
            from trainers.signals.episode_metrics import error_key

            for e in json.loads(summary.read_text()).get("errors") or []:
                self.errors[(e["kind"], error_key(e["error"]))] = e

    def drain(self, algo: Any) -> dict[str, Any]:
        """Every env runner's journal, merged; they keep ``output.transcripts`` from now on."""
        from trainers.signals.episode_metrics import drain_journal, error_key, raise_callback_errors

        keep = self.cfg.output.transcripts
        group = getattr(algo, "env_runner_group", None)
        if group is None:
            parts = [drain_journal(keep=keep)]
        else:
            parts = group.foreach_env_runner(
                functools.partial(drain_journal, keep=keep), local_env_runner=True
            )
        raise_callback_errors(parts)
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        transcripts: list[dict[str, Any]] = []
        for part in parts:
            transcripts += part["transcripts"]
            for e in part["errors"]:
                key = (e["kind"], error_key(e["error"]))
                if key in merged:
                    merged[key]["count"] += e["count"]
                else:
                    merged[key] = dict(e)
        return {"transcripts": transcripts[:keep], "errors": list(merged.values())}

    def record(self, drained: Mapping[str, Any], iteration: int) -> None:
        """Log each new distinct error once; write the iteration's transcripts."""
        from trainers.signals.episode_metrics import error_key

        for e in drained["errors"]:
            key = (e["kind"], error_key(e["error"]))
            if key in self.errors:
                self.errors[key]["count"] += e["count"]
                continue
            self.errors[key] = {**e, "first_iteration": iteration}
            what = "timed out" if e["kind"] == "timeout" else "failed"
            log.warning(
                "%d episode(s) %s in iteration %d (logged once; later ones are counted in "
                "charts/%s_rate and %s): %s",
                e["count"],
                what,
                iteration,
                e["kind"],
                self.run / "summary.json",
                e["error"],
            )
        if drained["transcripts"]:
            from trainers.run.transcripts import write_iteration

            transcripts = [self._credited(t, iteration) for t in drained["transcripts"]]
            write_iteration(self.run, iteration, transcripts)

    def _credited(self, t: dict[str, Any], iteration: int) -> dict[str, Any]:
        t = {**t, "iteration": iteration}
        actions = t.pop("_actions", None)
        credit = self.cfg.credit
        if credit.method == "team" or actions is None or t.get("failure") == "timeout":
            return t
        from trainers.run.transcripts import episode_credit

        if self._env is None:
            self._env = self.plan.env.make_env()
        local = (t.get("outcome") or {}).get("local")
        t["credit"] = episode_credit(self._env, int(t["seed"]), actions, local, credit)
        t["credit_method"] = credit.method
        return t

    def check(self, row: Mapping[str, Any], drained: Mapping[str, Any]) -> None:
        """Raise :class:`RunFailed` once every episode failed in ``fail_after`` iterations."""
        n = int(row.get("charts/episodes", 0))
        if n == 0:
            if "charts/episode_len" not in row:  # nothing sampled at all
                log.warning(
                    "iteration %s sampled nothing: every env runner is down (RLlib restarts "
                    "them; resources.num_env_runners: 0 samples in this process)",
                    row.get("charts/iteration"),
                )
            return  # no episode finished: nothing to judge
        if round(row.get("charts/limit_rate", 0.0) * n) >= n:
            log.warning(
                "every episode of iteration %s (%d) hit the step limit (the scenario's "
                "max_supersteps, LangGraph's recursion limit): nothing reached the verifier. "
                "Raise max_supersteps (scenario_kwargs.max_supersteps) if episodes only run "
                "long, or fix the loop that never reaches END (transcripts are in %s)",
                row.get("charts/iteration"),
                n,
                self.run,
            )
        errors = round(row.get("charts/error_rate", 0.0) * n)
        timeouts = round(row.get("charts/timeout_rate", 0.0) * n)
        self.streak = self.streak + 1 if errors + timeouts >= n else 0
        after = self.cfg.episodes.fail_after
        if not after or self.streak < after:
            return
        first = (drained["errors"] or self.error_list() or [{"error": "unknown"}])[0]["error"]
        span = "" if after == 1 else f" (and the {after - 1} before it)"
        raise RunFailed(
            f"every episode of iteration {row['charts/iteration']}{span} failed ({n} episodes: "
            f"{errors} node errors, {timeouts} timeouts), so the run stopped instead of "
            f"training on nothing. First error: {first}. Fix the failing node (transcripts "
            f"and errors are in {self.run}), {timeout_advice(drained['errors'])}, or set "
            "episodes.fail_after: 0 to train on regardless"
        )

    def error_list(self) -> list[dict[str, Any]]:
        """The distinct errors so far, most frequent first."""
        return sorted(self.errors.values(), key=lambda e: -e["count"])


def timeout_advice(errors: Any) -> str:
    """The advice for episodes that time out, naming the limit that fired: an app episode's
    own ``timeout_s`` (its error names :data:`~marl_agents.gateway.app_scenario.
    APP_TIMEOUT_LIMIT`), else ``episodes.timeout_s``."""
    from marl_agents.gateway.app_scenario import APP_TIMEOUT_LIMIT

    texts = [str(e["error"]) for e in errors or () if e.get("kind") == "timeout"]
    app = any(APP_TIMEOUT_LIMIT in t for t in texts)
    episode = not texts or any(APP_TIMEOUT_LIMIT not in t for t in texts)
    advice = []
    if app:
        advice.append(
            f"raise {APP_TIMEOUT_LIMIT} (AppScenario(timeout_s=...)) if its apps only run long"
        )
    if episode:
        advice.append("raise episodes.timeout_s if episodes only run long")
    return " and ".join(advice)
