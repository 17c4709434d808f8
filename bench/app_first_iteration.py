"""Import-to-first-trained-iteration time of user apps, each in a fresh process.

For every app pattern in ``tests/apps/chat_team.py`` (and the chat-app example of
docs/tutorials/langgraph-app.md), a new Python
process imports marl-orchestra, resolves the experiment (importing the app by reference),
starts Ray, builds the GRPO algorithm and trains one iteration; the wall time from process
start to the end of that iteration is printed next to the iteration alone.

    .venv/bin/python bench/app_first_iteration.py [--apps supervisor react swarm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, tempfile
t0 = float(sys.argv[2])
from trainers.configs.experiment import ExperimentConfig
from trainers.run.loop import train
pools = json.loads(sys.argv[3])
cfg = ExperimentConfig.from_dict({
    "scenario": sys.argv[1], "pools": pools["pools"], "train": pools["train"],
    "sharing": pools.get("sharing", "role"),
    "algorithm": {"name": "GRPO", "grpo": {"group_size": 4, "groups_per_iteration": 2}},
    "budget": {"iterations": 1}, "seed": 0,
    "logging": {"wandb": "disabled", "progress": False},
    "output": {"dir": tempfile.mkdtemp(), "checkpoint_every": 0, "plot": False},
})
result = train(cfg)
print(json.dumps({"total_s": time.time() - t0, "status": result.status,
                  "iteration_s": result.history[-1]["charts/iteration_s"]}))
"""

LLM = {"type": "llm", "path": "tiny"}
TEAM = {"pools": {"team": {"model": LLM}}, "train": None, "sharing": "team"}
APPS = {
    "supervisor": (
        "tests.apps.chat_team:supervisor",
        {"pools": {"orchestrator": {"model": LLM}, "worker": {"model": LLM}},
         "train": ["supervisor"]},
    ),
    "react": ("tests.apps.chat_team:react", {"pools": {"agent": {"model": LLM}}, "train": None}),
    "swarm": ("tests.apps.chat_team:swarm", TEAM),
    "map_reduce": ("tests.apps.chat_team:map_reduce", TEAM),
    "async_app": ("tests.apps.chat_team:async_app", TEAM),
    "nested": ("tests.apps.chat_team:nested", TEAM),
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", nargs="+", default=list(APPS), choices=list(APPS))
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    print(f"{'app':<12} {'import→first iteration s':>26} {'first iteration s':>18}")
    for name in args.apps:
        ref, pools = APPS[name]
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, ref, repr(time.time()), json.dumps(pools)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0:
            print(f"{name:<12} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name:<12} {out['total_s']:>26.1f} {out['iteration_s']:>18.1f}  {out['status']}")


if __name__ == "__main__":
    main()
