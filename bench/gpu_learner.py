"""The GPU learner path, side by side with the CPU learner (run on a machine with a GPU).

Trains the same experiments twice in one process, once with the learner on the CPU and once
on the GPU (``resources.num_learners: 1, num_gpus_per_learner: 1``), and prints per-run
seconds per iteration, the final metrics and the ratio GPU/CPU. Two experiments: the default
``delegate`` scenario with PPO (small MLPs: a GPU buys nothing, this shows the path works),
and the tiny in-code LLM orchestrator of ``examples/finetune_tiny.yaml`` with GRPO.

    python bench/gpu_learner.py [--iterations 4]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")


def experiments(iterations: int, out: str) -> dict[str, Any]:
    from trainers.configs.experiment import ExperimentConfig
    from trainers.finetune import FinetuneJob

    common = {
        "budget": {"iterations": iterations},
        "logging": {"wandb": "disabled", "progress": False},
        "output": {"dir": out, "checkpoint_every": 0},
    }
    ppo = ExperimentConfig.from_dict({"topology": "star:3", **common})
    grpo = FinetuneJob.from_yaml("examples/finetune_tiny.yaml").to_experiment()
    grpo = grpo.replace(
        budget=ppo.budget, logging=ppo.logging, output=ppo.output, resources=ppo.resources
    )
    return {"delegate-ppo": ppo, "tiny-llm-grpo": grpo}


def on(cfg: Any, gpu: bool) -> Any:
    import dataclasses

    res = dataclasses.replace(
        cfg.resources, num_learners=1 if gpu else 0, num_gpus_per_learner=1 if gpu else 0
    )
    return cfg.replace(resources=res)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=4)
    args = parser.parse_args()

    import ray
    import torch

    from trainers.run.loop import train

    assert torch.cuda.is_available(), "needs a GPU"
    print(f"torch {torch.__version__} · {torch.cuda.get_device_name(0)}")
    ray.init(include_dashboard=False, num_gpus=torch.cuda.device_count())
    with tempfile.TemporaryDirectory() as out:
        for name, cfg in experiments(args.iterations, out).items():
            times = {}
            for gpu in (False, True):
                t0 = time.perf_counter()
                result = train(on(cfg, gpu))
                wall = time.perf_counter() - t0
                last = result.history[-1]
                per_iter = [h.get("charts/iteration_s") for h in result.history[1:]]
                per_iter = [x for x in per_iter if x is not None]
                times[gpu] = sum(per_iter) / len(per_iter) if per_iter else wall / args.iterations
                keys = [k for k in last if k.startswith(("charts/", "marl/"))][:8]
                print(
                    f"{name} learner={'gpu' if gpu else 'cpu'} status={result.status} "
                    f"wall={wall:.1f}s s/iter={times[gpu]:.3f} "
                    + " ".join(f"{k}={last[k]:.4g}" for k in keys if isinstance(last[k], float))
                )
            print(f"{name} gpu/cpu seconds per iteration: {times[True] / times[False]:.2f}")


if __name__ == "__main__":
    main()
