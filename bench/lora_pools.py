"""Memory and iteration time of N LoRA pools on one base vs N full-model pools.

Each configuration runs in a fresh Python process that builds N
:class:`~marl_agents.llm.rl_module.CausalLMModule` pools as one RLlib process holds them
(``lora``: adapters on one shared base; ``full``: N copies of the model) and runs
``--iterations`` GRPO-shaped iterations: per pool, sample a batch with the module's exploration
forward (the transformers sampler), score it with the training forward, back-propagate a
policy-gradient loss and take an Adam step over the module's parameters (what the learner's
optimizer sees). Printed per model size and N: the process's peak RSS (``VmHWM``) after the
last iteration, the mean time of an iteration after the first, and the full/LoRA ratios;
``lora-1gen`` is the LoRA pools with every pool's rows sampled in one ``generate`` (one
adapter per row, :func:`~marl_agents.llm.shared_batch.act_together`, as the batched sampler
does for pools whose rows wait at one step) instead of one per pool.

Models: ``tiny`` (378k parameters) and ``medium``, a bigger Qwen2 built in code (hidden 512,
8 layers, ~26M parameters), saved once to a temporary directory.

    .venv/bin/python bench/lora_pools.py [--pools 2 4 8] [--sizes tiny medium] [--iterations 3]

One generate for all pools against one per pool (``lora/1-gen``, iteration time ratio, > 1:
one generate faster), 2026-11-27, 2-core box under load 5–10 from other jobs (±30%),
``--iterations 4``: tiny ×1.18 / ×0.91 / ×1.10 at N = 2 / 4 / 8; medium ×1.74 / ×1.03 / ×1.50
(8 prompts of 24 tokens per pool, 8 new tokens; the iteration includes each pool's learner
step, which is unchanged).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEDIUM = dict(
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=8,
    head_dim=64,
)
LORA = {"r": 8, "alpha": 16.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}

CHILD = r"""
import json, sys, time
import numpy as np, torch
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from marl_agents.llm.rl_module import CausalLMModule
from scenarios.text_space import TextSpaces

path, kind, n, iterations = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
lora = json.loads(sys.argv[5])
torch.manual_seed(0)
torch.set_num_threads(1)
spaces = TextSpaces(vocab_size=384, max_prompt_tokens=32, max_new_tokens=8)
modules, optims = [], []
for i in range(n):
    config = {"model": path, "pool": f"p{i}"}
    if kind != "full":
        config["lora"] = lora
    m = RLModuleSpec(module_class=CausalLMModule, observation_space=spaces.observation_space,
                     action_space=spaces.action_space, model_config=config).build()
    modules.append(m)
    optims.append(torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-4))
rng = np.random.default_rng(0)
obs = torch.as_tensor(np.stack([spaces.encode_prompt(rng.integers(5, 300, 24).tolist())
                                for _ in range(8)]))
times = []
for it in range(iterations):
    t0 = time.perf_counter()
    if kind == "lora-1gen":  # every pool's rows in one generate (the batched sampler's way)
        from marl_agents.llm.shared_batch import act_together
        outs = act_together(modules, [{"obs": obs}] * n, True)
    else:
        outs = [m.forward_exploration({"obs": obs}) for m in modules]
    for m, opt, out in zip(modules, optims, outs):
        lp = m.forward_train({"obs": obs, "actions": out["actions"]})["token_logp"]
        adv = torch.as_tensor(rng.standard_normal(len(obs)), dtype=torch.float32)
        loss = -(lp.sum(-1) * adv).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    times.append(time.perf_counter() - t0)
peak = 0
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        peak = int(line.split()[1]) * 1024
trainable = sum(p.numel() for m in modules for p in m.parameters())
print(json.dumps({"rss": peak, "iteration_s": sum(times[1:]) / max(1, len(times) - 1),
                  "trainable": trainable}))
"""


def run(path: str, kind: str, n: int, iterations: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, path, kind, str(n), str(iterations), json.dumps(LORA)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} × {n} on {path} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pools", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "medium"])
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"tiny": "tiny"}
        if "medium" in args.sizes:
            from marl_agents.llm.tiny import make_tiny_model

            paths["medium"] = str(Path(tmp) / "medium")
            make_tiny_model(paths["medium"], seed=0, **MEDIUM)
        print(f"LoRA {LORA}; {args.iterations} iterations, time = mean after the first")
        print(
            f"{'model':<8}{'N':>3} {'RSS full':>10} {'RSS lora':>10} {'ratio':>6} "
            f"{'it full s':>10} {'it lora s':>10} {'ratio':>6} {'trained full/lora':>20} "
            f"{'it lora 1-gen s':>16} {'lora/1-gen':>10}"
        )
        for size in args.sizes:
            for n in args.pools:
                full = run(paths[size], "full", n, args.iterations)
                lora = run(paths[size], "lora", n, args.iterations)
                one = run(paths[size], "lora-1gen", n, args.iterations)
                mib = 1024**2
                print(
                    f"{size:<8}{n:>3} {full['rss'] / mib:>9.0f}M {lora['rss'] / mib:>9.0f}M "
                    f"{full['rss'] / lora['rss']:>6.2f} {full['iteration_s']:>10.3f} "
                    f"{lora['iteration_s']:>10.3f} "
                    f"{full['iteration_s'] / lora['iteration_s']:>6.2f} "
                    f"{full['trainable'] / 1e6:>9.2f}M/{lora['trainable'] / 1e6:.3f}M "
                    f"{one['iteration_s']:>16.3f} "
                    f"{lora['iteration_s'] / one['iteration_s']:>10.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
