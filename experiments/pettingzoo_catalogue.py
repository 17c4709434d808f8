"""PettingZoo's own catalogue as the test list (issue 43, item 7): does every env train?

For every env of PettingZoo 1.27's catalogue families that installs here from PyPI
(``pettingzoo[classic,butterfly,sisl]``, ``mpe2`` for MPE, ``magent2`` for MAgent; Atari is
left out: its ``multi-agent-ale-py`` and ROMs are not among the issue's extras), this script

1. builds the env and records its API (``turn-based`` for an AEC env that is not
   parallelisable, else ``parallel``), agent count and spaces;
2. steps the env alone with uniformly random (legal, where an ``action_mask`` says) actions
   for about a second: env steps/s and agent steps/s on its own;
3. trains it for 2 iterations with the default config and a tiny batch
   (:data:`TINY`: ``train_batch_size`` 128, ``minibatch_size`` 64, one epoch, 2 envs), each env
   in its own subprocess with a timeout (a crash, a hang or a leaked Ray of one env cannot
   touch the next; a local Ray costs ~5 s a process here, small beside the runs);
4. records the status: ``trains`` (2 iterations completed), ``refused`` (our own error —
   :class:`~trainers.configs.typed.MarlError` — raised before Ray started, with its reason),
   ``crash`` (any other exception, with its last line; ``before_ray`` says where) or
   ``timeout``.

Rows go to ``experiments/results/pettingzoo_catalogue.jsonl`` (one per env; a run with
``--envs`` replaces only its rows) and the table to ``docs/pettingzoo_catalogue.md``.

Usage::

    python -m experiments.pettingzoo_catalogue              # the whole catalogue (~20-40 min)
    python -m experiments.pettingzoo_catalogue --fast       # one env per family and space kind
    python -m experiments.pettingzoo_catalogue --envs tictactoe_v3 battle_v4
    python -m experiments.pettingzoo_catalogue --table-only # rebuild the Markdown from the rows
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "pettingzoo_catalogue.jsonl"
TABLE = ROOT / "docs" / "pettingzoo_catalogue.md"
COMMAND = "python -m experiments.pettingzoo_catalogue"

#: PettingZoo 1.27's catalogue families (module names), Atari left out (see the module doc).
#: ``tests/test_pettingzoo_catalogue.py`` checks these lists against the packages' own.
FAMILIES: dict[str, tuple[str, ...]] = {
    family: tuple(f"{package}.{name}" for name in names.split())
    for family, package, names in (
        (
            "classic",
            "pettingzoo.classic",
            "chess_v6 connect_four_v3 go_v5 hanabi_v5 leduc_holdem_v4 rps_v2 "
            "texas_holdem_no_limit_v6 texas_holdem_v4 tictactoe_v3",
        ),
        (
            "butterfly",
            "pettingzoo.butterfly",
            "cooperative_pong_v6 knights_archers_zombies_v11 pistonball_v6",
        ),
        ("sisl", "pettingzoo.sisl", "multiwalker_v9 pursuit_v5"),
        (
            "mpe",
            "mpe2",
            "collect_treasure_v1 simple_adversary_v3 simple_crypto_v3 simple_formation_v1 "
            "simple_line_v1 simple_push_v3 simple_reference_v3 simple_speaker_listener_v4 "
            "simple_spread_v3 simple_tag_v3 simple_v3 simple_world_comm_v3",
        ),
        (
            "magent",
            "magent2.environments",
            "adversarial_pursuit_v4 battle_v4 battlefield_v5 combined_arms_v6 gather_v5 "
            "tiger_deer_v4",
        ),
    )
}

#: what the catalogue changes in the default config: a tiny batch, so an iteration is cheap.
TINY: dict[str, Any] = {
    "algorithm": {"train_batch_size": 128, "minibatch_size": 64, "num_epochs": 1},
    "resources": {"num_envs_per_env_runner": 2},
}
TIMEOUT_S = 300.0
PROBE_S = 1.0


@dataclasses.dataclass(frozen=True)
class Entry:
    """One catalogue env: its family, short name, module and the scenario reference trained.

    Classic games are trained as PettingZoo documents them, through their AEC ``env``; every
    other family through its ``parallel_env``.
    """

    family: str
    name: str
    module: str

    @property
    def ref(self) -> str:
        return f"{self.module}:{'env' if self.family == 'classic' else 'parallel_env'}"


def catalogue() -> list[Entry]:
    """Every env of :data:`FAMILIES`, in order."""
    return [Entry(f, m.rsplit(".", 1)[1], m) for f, mods in FAMILIES.items() for m in mods]


def select(entries: Iterable[Entry], names: Sequence[str] | None) -> list[Entry]:
    """The entries whose name (or module, or family) is in ``names`` (all for ``None``).

    Raises:
        SystemExit: a name that matches nothing (with the known names).
    """
    entries = list(entries)
    if not names:
        return entries
    keys = set(names)
    picked = [e for e in entries if keys & {e.name, e.module, e.family}]
    unknown = keys - {k for e in entries for k in (e.name, e.module, e.family)}
    if unknown:
        raise SystemExit(
            f"--envs: unknown {', '.join(sorted(unknown))}; known: "
            + ", ".join(e.name for e in entries)
        )
    return picked


# --- the env on its own ------------------------------------------------------------------------


def make_env(entry: Entry) -> Any:
    """The env as the scenario reference's factory returns it (AEC for classic)."""
    return getattr(importlib.import_module(entry.module), entry.ref.split(":")[1])()


def space_text(space: Any) -> str:
    """A short name of a gymnasium space: ``Box(3,3,2) int8``, ``Dict(action_mask, observation:
    Box(6,7,2) int8)``, ``Discrete(9)``."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return f"Box({','.join(map(str, space.shape))}) {space.dtype}"
    if isinstance(space, spaces.Dict):
        inner = ", ".join(
            k if k == "action_mask" else f"{k}: {space_text(s)}" for k, s in space.spaces.items()
        )
        return f"Dict({inner})"
    if isinstance(space, spaces.Tuple):
        return f"Tuple({', '.join(space_text(s) for s in space.spaces)})"
    return str(space)


def space_kind(space: Any) -> str:
    """The kind of a space the trainer must handle: ``vector``, ``image``, ``dict+mask``,
    ``discrete``, ``box`` (a Box action) ..."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return "image" if len(space.shape) >= 2 else "vector"
    if isinstance(space, spaces.Dict):
        return "dict+mask" if "action_mask" in space.spaces else "dict"
    return type(space).__name__.lower()


def action_kind(space: Any) -> str:
    """``discrete``, ``box``, ``multidiscrete`` ... (the space's class, lower case)."""
    return type(space).__name__.lower()


def is_turn_based(env: Any) -> bool:
    """An AEC env PettingZoo does not declare parallelisable (one agent acts per step)."""
    from pettingzoo import AECEnv

    return isinstance(env, AECEnv) and not env.metadata.get("is_parallelizable", False)


def describe(entry: Entry) -> dict[str, Any]:
    """The env's API, agent count, spaces (distinct ones, in agent order) and space kinds."""
    env = make_env(entry)
    try:
        agents = list(env.possible_agents)
        obs = list(dict.fromkeys(space_text(env.observation_space(a)) for a in agents))
        act = list(dict.fromkeys(space_text(env.action_space(a)) for a in agents))
        kinds = sorted(
            {space_kind(env.observation_space(a)) for a in agents}
            | {f"act:{action_kind(env.action_space(a))}" for a in agents}
        )
        return {
            "api": "turn-based" if is_turn_based(env) else "parallel",
            "agents": len(agents),
            "obs": obs,
            "act": act,
            "kinds": kinds,
        }
    finally:
        env.close()


def _mask_of(obs: Any, info: Any) -> Any:
    if isinstance(obs, dict) and "action_mask" in obs:
        return obs["action_mask"]
    if isinstance(info, dict) and "action_mask" in info:
        return info["action_mask"]
    return None


def _sample(space: Any, mask: Any) -> Any:
    import numpy as np

    if mask is None:
        return space.sample()
    return space.sample(mask=np.asarray(mask, dtype=np.int8))


def random_rate(make: Callable[[], Any], seconds: float = PROBE_S, seed: int = 0) -> dict[str, Any]:
    """Step a fresh env from ``make()`` alone with uniformly random actions (legal ones where
    the observation or info carries ``action_mask``) for about ``seconds``, resetting after
    each episode: ``env_steps_per_s`` (``step()`` calls: one agent's turn in an AEC env, a
    joint action in a parallel one) and ``agent_steps_per_s`` (actions taken)."""
    from pettingzoo import AECEnv

    env = make()
    steps = actions = episodes = 0
    start = time.perf_counter()
    if isinstance(env, AECEnv):
        env.reset(seed=seed)
        for a in env.possible_agents:
            env.action_space(a).seed(seed)
        while time.perf_counter() - start < seconds:
            agent = env.agent_selection
            obs, _, term, trunc, info = env.last()
            act = None if term or trunc else _sample(env.action_space(agent), _mask_of(obs, info))
            env.step(act)
            steps += 1
            actions += act is not None
            if not env.agents:
                episodes += 1
                env.reset(seed=seed + episodes)
    else:
        obs, infos = env.reset(seed=seed)
        for a in env.possible_agents:
            env.action_space(a).seed(seed)
        while time.perf_counter() - start < seconds:
            acts = {
                a: _sample(env.action_space(a), _mask_of(obs.get(a), infos.get(a)))
                for a in env.agents
            }
            obs, _, _, _, infos = env.step(acts)
            steps += 1
            actions += len(acts)
            if not env.agents:
                episodes += 1
                obs, infos = env.reset(seed=seed + episodes)
    dt = time.perf_counter() - start
    env.close()
    return {
        "env_steps_per_s": steps / dt,
        "agent_steps_per_s": actions / dt,
        "random_episodes": episodes,
    }


# --- one env, trained (in the child process) ---------------------------------------------------


def train_config(entry: Entry, out_dir: Path, iterations: int = 2, **extra: Any) -> Any:
    """The default config for ``entry``'s scenario reference with :data:`TINY` batch sizes,
    ``iterations`` iterations, seed 0, no wandb/progress/plot/checkpoints."""
    from experiments.harness import deep_merge
    from trainers.configs.experiment import ExperimentConfig

    return ExperimentConfig.from_dict(
        deep_merge(
            TINY,
            {
                "scenario": entry.ref,
                "budget": {"iterations": iterations},
                "seed": 0,
                "logging": {"wandb": "disabled", "progress": False},
                "output": {"dir": str(out_dir), "checkpoint_every": 0, "plot": False},
            },
            extra,
        )
    )


def last_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of an exception (what a user would see last)."""
    text = str(exc).strip().splitlines()
    cause = exc.__cause__
    why = f" (from {type(cause).__name__})" if cause is not None else ""
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300] + why


def train_entry(entry: Entry, out_dir: Path, iterations: int = 2) -> dict[str, Any]:
    """Train ``entry`` ``iterations`` iterations in this process; the status row (see the
    module doc). A Ray this process already runs is used (and left running)."""
    import trainers.run.loop as loop
    from topologies.errors import MarlError

    ray_started: list[bool] = []
    real = loop.ensure_ray

    def ensure_ray(*args: Any, **kwargs: Any) -> bool:  # records that training reached Ray
        ray_started.append(True)
        return real(*args, **kwargs)

    loop.ensure_ray = ensure_ray
    start = time.perf_counter()
    try:
        result = loop.train(train_config(entry, out_dir, iterations))
    except Exception as exc:  # the status of this env is the point: record what it raised
        before = not ray_started
        status = "refused" if before and isinstance(exc, MarlError) else "crash"
        return {
            "status": status,
            "before_ray": before,
            "error": last_line(exc),
            "traceback_tail": traceback.format_exc().strip().splitlines()[-6:],
            "train_s": time.perf_counter() - start,
        }
    finally:
        loop.ensure_ray = real
    hist = result.history
    row: dict[str, Any] = {
        "status": "trains" if result.status == "completed" and len(hist) == iterations else "crash",
        "train_s": time.perf_counter() - start,
        "iterations": len(hist),
    }
    if row["status"] == "crash":
        row["error"] = f"run status {result.status!r}, {len(hist)} iterations"
    if hist:
        last = hist[-1]
        for key in ("env_steps", "env_steps_per_s", "episodes", "team_return", "error_rate"):
            if f"charts/{key}" in last:
                row[f"train_{key}"] = last[f"charts/{key}"]
    if result.errors:
        row["episode_errors"] = result.errors[:3]
    return row


def child(name: str) -> dict[str, Any]:
    """Everything recorded for one env (run in its own process by :func:`run_entry`)."""
    (entry,) = [e for e in catalogue() if e.name == name]
    row: dict[str, Any] = {"family": entry.family, "env": entry.name, "ref": entry.ref}
    try:
        row.update(describe(entry))
        row.update(random_rate(lambda: make_env(entry)))
    except Exception as exc:  # the env itself does not build or step here: not ours to train
        row.update(status="env-error", error=last_line(exc))
        return row
    with tempfile.TemporaryDirectory(prefix="pz_catalogue_") as tmp:
        row.update(train_entry(entry, Path(tmp)))
    return row


def run_entry(entry: Entry, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """Run :func:`child` for ``entry`` in a subprocess (its own process group, killed whole on
    timeout); the row it printed last, or a ``crash``/``timeout`` row from outside."""
    cmd = [sys.executable, "-m", "experiments.pettingzoo_catalogue", "--child", entry.name]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and the Ray it started
        proc.communicate()
        return {
            "family": entry.family, "env": entry.name, "ref": entry.ref, "status": "timeout",
            "error": f"no result within {timeout_s:.0f} s", "wall_s": time.perf_counter() - start,
        }  # fmt: skip
    with contextlib.suppress(ProcessLookupError):  # a group already gone is fine
        os.killpg(proc.pid, signal.SIGKILL)  # anything the child left behind in its group
    rows = [line for line in out.splitlines() if line.startswith('{"family"')]
    if rows:
        row = json.loads(rows[-1])
    else:
        tail = [line for line in err.strip().splitlines() if line.strip()]
        row = {
            "family": entry.family, "env": entry.name, "ref": entry.ref, "status": "crash",
            "before_ray": None, "error": (tail[-1] if tail else f"exit {proc.returncode}")[:300],
        }  # fmt: skip
    row["wall_s"] = time.perf_counter() - start
    return row


# --- the fast subset, rows and table ------------------------------------------------------------


def fast_subset(entries: Iterable[Entry]) -> list[Entry]:
    """One env per family and per space kind (the first in catalogue order that adds a
    (family, kind) pair not yet covered)."""
    seen: set[tuple[str, str]] = set()
    picked = []
    for e in entries:
        pairs = {(e.family, k) for k in describe(e)["kinds"]}
        if pairs - seen:
            picked.append(e)
            seen |= pairs
    return picked


def meta() -> dict[str, Any]:
    import pettingzoo

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "commit": commit,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "pettingzoo": pettingzoo.__version__,
    }


def load_rows(path: Path = RESULTS) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def save_rows(rows: list[dict[str, Any]], path: Path = RESULTS) -> None:
    """Write ``rows`` over the file's rows of the same env; catalogue order."""
    order = {e.name: i for i, e in enumerate(catalogue())}
    merged = {r["env"]: r for r in [*load_rows(path), *rows] if r["env"] in order}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        "".join(
            json.dumps(r) + "\n" for r in sorted(merged.values(), key=lambda r: order[r["env"]])
        )
    )
    tmp.replace(path)


def _rate(x: Any) -> str:
    return "" if x is None else f"{x:,.0f}"


def baseline_rows(rev: str, path: Path = RESULTS) -> list[dict[str, Any]]:
    """The rows committed at git revision ``rev`` (an earlier run to compare with)."""
    text = subprocess.run(
        ["git", "show", f"{rev}:{path.relative_to(ROOT)}"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def table(rows: list[dict[str, Any]], before: list[dict[str, Any]] | None = None) -> str:
    """The Markdown page: counts per family and status, then one row per env (with
    ``before``: the earlier run's counts and each env's earlier status too)."""
    statuses = ("trains", "refused", "crash", "timeout", "env-error")
    lines = [
        "# PettingZoo's catalogue, trained",
        "",
        f"Written by `{COMMAND}` (issue 43): every env of PettingZoo 1.27's catalogue families "
        "that installs from PyPI here (`pettingzoo[classic,butterfly,sisl]`, `mpe2`, `magent2`; "
        "Atari is left out — `pettingzoo[atari]` needs `multi-agent-ale-py` and ROMs), trained "
        "2 iterations with the default config and a tiny batch (`train_batch_size` 128, "
        "`minibatch_size` 64, one epoch, 2 envs), each env in its own process. Status: "
        "**trains** (2 iterations), **refused** (our error, before Ray starts, with its "
        "reason), **crash** (any other exception: its last line), **timeout** "
        f"({TIMEOUT_S:.0f} s unless a row says otherwise). *random steps/s*: the env stepped "
        "alone with uniformly random "
        "legal actions (a `step()` call: one turn in a turn-based env, a joint action in a "
        "parallel one); *train steps/s*: `charts/env_steps_per_s` of the second iteration "
        "(the trainer's env steps).",
        "",
    ]
    runs = sorted({(r.get("commit"), r.get("date", "")[:10]) for r in rows if r.get("commit")})
    if runs:
        lines += [
            "Rows from commit(s) " + ", ".join(f"`{c}` ({d})" for c, d in runs) + ".",
            "",
        ]
    fams = list(dict.fromkeys(r["family"] for r in rows))
    for title, rs in (("", rows), ("Before (the earlier run)", before or [])):
        if not rs:
            continue
        if title:
            commits = sorted({str(r.get("commit")) for r in rs})
            lines += [f"{title}, on `{'`, `'.join(commits)}`:", ""]
        lines += ["| family | " + " | ".join(statuses) + " |"]
        lines += ["|---" * (len(statuses) + 1) + "|"]
        for fam in [*fams, "all"]:
            sel = [r for r in rs if fam in ("all", r["family"])]
            counts = [str(sum(r["status"] == s for r in sel)) for s in statuses]
            name = "**all**" if fam == "all" else fam
            lines.append(f"| {name} | " + " | ".join(counts) + " |")
        lines.append("")
    earlier = {r["env"]: r["status"] for r in before or []}
    lines += [
        "| env | API | agents | observation | action | status | reason / error "
        "| random steps/s | train steps/s |" + (" before |" if before else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if before else ""),
    ]
    for r in rows:
        note = (r.get("error") or "").replace("\n", " ")
        note = (note[:157] + "…" if len(note) > 160 else note).replace("|", "\\|")
        lines.append(
            f"| {r['family']}/{r['env']} | {r.get('api', '')} | {r.get('agents', '')} "
            f"| {'; '.join(r.get('obs', []))} | {'; '.join(r.get('act', []))} "
            f"| {r['status']} | {note} | {_rate(r.get('env_steps_per_s'))} "
            f"| {_rate(r.get('train_env_steps_per_s'))} |"
            + (f" {earlier.get(r['env'], '')} |" if before else "")
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", nargs="*", help="env names, modules or families (default: all)")
    p.add_argument("--fast", action="store_true", help="one env per family and space kind")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per env")
    p.add_argument("--out", type=Path, default=RESULTS, help="rows (JSONL)")
    p.add_argument("--table", type=Path, default=TABLE, help="Markdown table")
    p.add_argument("--table-only", action="store_true", help="rebuild the table from the rows")
    p.add_argument("--baseline", help="a git revision whose committed rows the table compares")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        row = child(args.child)
        print(json.dumps(row, default=str), flush=True)
        return 0
    if not args.table_only:
        entries = select(catalogue(), args.envs)
        if args.fast:
            entries = fast_subset(entries)
        info = {**meta(), "timeout_s": args.timeout}
        for i, entry in enumerate(entries, 1):
            row = {**run_entry(entry, args.timeout), **info}
            save_rows([row], args.out)
            print(
                f"[{i}/{len(entries)}] {entry.family}/{entry.name}: {row['status']}"
                f" ({row['wall_s']:.0f} s) {row.get('error', '')}",
                flush=True,
            )
    args.table.parent.mkdir(parents=True, exist_ok=True)
    before = baseline_rows(args.baseline, args.out) if args.baseline else None
    args.table.write_text(table(load_rows(args.out), before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
