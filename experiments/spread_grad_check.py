"""One fixed simple_spread batch through one update of our MAPPO learner and of the plain-torch
reference (:mod:`experiments.spread_reference`), from identical weights (issue #27: why ours
loses entropy ~2× faster with the reference's recipe).

Our side is the real thing: the MAPPO experiment of :mod:`experiments.spread_mappo` with the
reference's recipe (batch 800 env steps, minibatch 600 rows, 15 epochs, lr 5e-4, grad clip 10,
no KL loss, entropy 0.01; critic on the global state only so that the reference's critic
weights fit), one ``algo.train()``: our env runner samples the batch, our learner (lean
learner, array batch, value normalisation, centralised critic column) builds it and updates.
Taps on that learner record the batch after its connector pipeline (advantages, value
targets, loss mask), the rows of every minibatch, each minibatch's policy loss, entropy and
value loss and the actor's raw gradient (before the clip).

The reference side gets the same episodes as arrays ``[E, T + 1, n]``, our module's initial
weights copied into its actor and critic, its own GAE with the framework's ``ValueNorm`` (the
reference's ``--value-norm`` mode, so both critics learn the same normalised targets), and runs
:func:`experiments.spread_reference.update` (its loss and optimiser) over *our* minibatches'
rows (bootstrap rows dropped). Printed:

1. the batch: our advantages on the valid rows against the reference's, the bootstrap rows'
   share and advantages, value targets, the terminated/truncated flags;
2. per minibatch: policy loss, entropy and value loss of both sides, and the actor gradients'
   cosine and norm ratio (ours / reference), per parameter on the first minibatch;
3. over the update: entropy and KL from the initial policy on the batch after the update, for
   ours, the reference on our minibatches (with its advantages, and with ours) and the
   reference with its own minibatches (4 per epoch, whole episodes).

Found with it (issue #27): every mpe2 time limit reached our GAE flagged *terminated* (RLlib
marks an all-truncated multi-agent episode terminated), so the value targets dropped
``V(s_T)``: at initial weights the targets differed from the reference's by up to 0.33 (return
units), growing toward the episode's end; fixed in :mod:`trainers.learners.time_limits`. The
loss, entropy term, value term and actor gradients agree (cosine 1.000, norm ratio 1.000 on
the first minibatch); the masked bootstrap rows in the advantage statistics scale the valid
rows' advantages by ~0.995 and shift them by ~+0.03σ.

Run: ``python -m experiments.spread_grad_check [--seed 0]`` (~20 s on 2 cores).
"""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any

import numpy as np

#: the reference's recipe in our experiment (docs/results.md, arm ``recipe-state``)
RECIPE = {
    "algorithm.critic": "state",
    "algorithm.train_batch_size": 800,
    "algorithm.minibatch_size": 600,
    "algorithm.num_epochs": 15,
    "algorithm.lr": 5e-4,
    "algorithm.grad_clip": 10.0,
    "algorithm.extra": {"use_kl_loss": False},
}
ROW = "_grad_check_row"


class Taps:
    """Records what our learner does during one update (see the module doc)."""

    def __init__(self, learner: Any, module_id: str) -> None:
        self.learner, self.mid = learner, module_id
        self.batch: dict[str, np.ndarray] = {}
        self.steps: list[dict[str, Any]] = []
        self._tap_connector()
        self._tap_loss()

    def _tap_connector(self) -> None:
        import torch

        pipe, taps = self.learner._learner_connector, self

        class Tapped(type(pipe)):  # type: ignore[misc]
            def __call__(self, **kwargs: Any) -> Any:
                batch = super().__call__(**kwargs)
                cols = batch[taps.mid]
                taps.batch = {k: v.detach().cpu().numpy().copy() for k, v in cols.items()}
                n = len(cols[next(iter(cols))])
                cols[ROW] = torch.arange(n, device=cols[next(iter(cols))].device)
                return batch

        pipe.__class__ = Tapped

    def _tap_loss(self) -> None:
        learner, taps = self.learner, self
        loss_fn, grads_fn = learner.compute_loss_for_module, learner.compute_gradients

        def compute_loss_for_module(**kwargs: Any) -> Any:
            total = loss_fn(**kwargs)
            stats = {k: float(v) for k, v in learner._lean_stash[kwargs["module_id"]]().items()}
            rows = kwargs["batch"][ROW].cpu().numpy()
            taps.steps.append({"rows": rows, **stats})
            return total

        def compute_gradients(*args: Any, **kwargs: Any) -> Any:
            out = grads_fn(*args, **kwargs)
            taps.steps[-1]["grads"] = actor_grads(learner.module[taps.mid].unwrapped())
            return out

        learner.compute_loss_for_module = compute_loss_for_module
        learner.compute_gradients = compute_gradients


def actor_grads(module: Any) -> dict[str, np.ndarray]:
    """Our module's actor gradients by the reference actor's parameter names."""
    return {
        ref: p.grad.detach().cpu().numpy().copy()
        for ref, p in zip(REF_ACTOR, actor_params(module), strict=True)
    }


#: the reference actor's parameter names, in the order of :func:`actor_params`
REF_ACTOR = ("0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias")


def actor_params(module: Any) -> list[Any]:
    return [*module.actor.parameters(), *module.pi.parameters()]


def copy_weights(module: Any, actor: Any, critic: Any) -> None:
    """Our module's actor/policy head and centralised critic → the reference's nets."""
    import torch

    with torch.no_grad():
        for p, q in zip(actor.parameters(), actor_params(module), strict=True):
            p.copy_(q)
        for p, q in zip(critic.parameters(), module.critic.parameters(), strict=True):
            p.copy_(q)


def run_ours(seed: int) -> tuple[Taps, list[Any], dict[str, Any], Any]:
    """One ``algo.train()`` of the recipe; returns the taps, the sampled episodes (as they
    came to the learner), the module's initial state and its final module."""
    import torch

    from experiments.spread_mappo import config
    from trainers.algo import to_algorithm_config
    from trainers.plan import resolve

    cfg = config("MAPPO", seed, 800, dict(RECIPE))
    plan = resolve(cfg)
    algo = to_algorithm_config(cfg, plan).build_algo()
    learner = algo.learner_group._learner
    (mid,) = plan.pools
    taps = Taps(learner, mid)
    module = learner.module[mid].unwrapped()
    start = {k: v.detach().clone() for k, v in module.state_dict().items()}
    seen: dict[str, Any] = {}
    update = algo.learner_group.update

    def tapped(*args: Any, **kwargs: Any) -> Any:
        seen["episodes"] = copy.deepcopy(kwargs["episodes"])
        return update(*args, **kwargs)

    algo.learner_group.update = tapped
    algo.train()
    final = copy.deepcopy(module)
    algo.stop()
    with torch.no_grad():
        initial = copy.deepcopy(module)
        initial.load_state_dict(start)
    return taps, seen["episodes"], initial, final


def arrays(taps: Taps) -> dict[str, np.ndarray]:
    """Our batch as the reference's arrays: agent episodes (26 rows each: 25 steps and the
    bootstrap observation) → ``[E, T + 1, n, ...]``; also each row's flat reference index."""
    b = taps.batch
    mask = b["loss_mask"].astype(bool)
    n_rows, T, n = len(mask), 25, 3
    if n_rows % ((T + 1) * n) or mask.reshape(-1, T + 1)[:, -1].any():
        raise SystemExit("the sampled batch holds episode chunks: rerun with another --seed")
    E = n_rows // ((T + 1) * n)

    def grid(x: np.ndarray) -> np.ndarray:  # rows (e, agent, t) → [E, T + 1, n, ...]
        return np.swapaxes(x.reshape(E, n, T + 1, *x.shape[1:]), 1, 2)

    e, i, t = np.unravel_index(np.arange(n_rows), (E, n, T + 1))
    flat = np.where(t < T, e * T * n + t * n + i, -1)  # the reference's flat row, or -1
    return {
        "obs": grid(b["obs"]).astype(np.float32),
        "state": grid(b["critic_obs"]).astype(np.float32),
        "actions": grid(b["actions"])[:, :T],
        "logp": grid(b["action_logp"])[:, :T].astype(np.float32),
        "rewards": grid(b["rewards"])[:, :T].astype(np.float32),
        "adv_ours": grid(b["advantages"])[:, :T],
        "target_ours": grid(b["value_targets"])[:, :T],
        "flat": flat,
        "E": np.array(E),
    }


def reference_side(initial: Any, arr: dict[str, np.ndarray]) -> dict[str, Any]:
    """The reference's nets (our initial weights), its advantages and targets, flat columns."""
    import torch

    from experiments.spread_reference import advantages, net
    from trainers.learners.value_norm import ValueNorm

    obs_dim, state_dim = arr["obs"].shape[-1], arr["state"].shape[-1]
    actor, critic = net(obs_dim, 5, 0.01), net(state_dim, 1, 1.0)
    copy_weights(initial, actor, critic)
    with torch.no_grad():
        V = critic(torch.as_tensor(arr["state"])).squeeze(-1).numpy()
    adv, target = advantages(arr["rewards"], V, ValueNorm())

    def flat(x: np.ndarray, dtype: Any = torch.float32) -> Any:
        return torch.as_tensor(np.ascontiguousarray(x).reshape(-1, *x.shape[3:])).to(dtype)

    cols = {
        "obs": flat(arr["obs"][:, :-1]),
        "state": flat(arr["state"][:, :-1]),
        "actions": flat(arr["actions"], torch.int64),
        "logp": flat(arr["logp"]),
        "adv": flat(adv),
        "target": flat(target),
    }
    return {"actor": actor, "critic": critic, "adv": adv, "target": target, "cols": cols}


def reference_update(
    initial: Any, ref: dict[str, Any], cols: dict[str, Any], minibatches: list[np.ndarray]
) -> tuple[Any, list[dict[str, Any]]]:
    """The reference's update from ``initial``'s weights over ``minibatches``; per minibatch
    its terms and actor gradients."""
    import torch

    from experiments.spread_reference import net, update

    actor = net(ref["cols"]["obs"].shape[-1], 5, 0.01)
    critic = net(ref["cols"]["state"].shape[-1], 1, 1.0)
    copy_weights(initial, actor, critic)
    params = list(actor.parameters()) + list(critic.parameters())
    optim = torch.optim.Adam(params, lr=5e-4, eps=1e-5)
    steps: list[dict[str, Any]] = []

    def record(**terms: float) -> None:
        grads = {k: p.grad.detach().numpy().copy() for k, p in actor.named_parameters()}
        steps.append({**terms, "grads": grads})

    update(actor, critic, optim, params, cols, minibatches, record)
    return actor, steps


def policy_stats(logits_fn: Any, obs: Any, start_logits: Any) -> tuple[float, float]:
    """Mean entropy of the policy on ``obs`` and mean KL(start ‖ policy)."""
    import torch

    with torch.no_grad():
        logits = logits_fn(obs)
        p = torch.distributions.Categorical(logits=logits)
        q = torch.distributions.Categorical(logits=start_logits)
        return float(p.entropy().mean()), float(torch.distributions.kl_divergence(q, p).mean())


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def flat_grads(g: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([g[k].ravel() for k in REF_ACTOR])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    taps, _episodes, initial, final = run_ours(args.seed)
    arr = arrays(taps)
    ref = reference_side(initial, arr)
    mask = taps.batch["loss_mask"].astype(bool)

    # 1. the batch
    a_ours, a_ref = arr["adv_ours"], ref["adv"]
    boot = taps.batch["advantages"][~mask]
    print("## 1. batch (our rows, valid = loss mask)")
    print(f"rows {len(mask)}, valid {mask.sum()}, bootstrap {(~mask).sum()} ({(~mask).mean():.1%})")
    print(f"our advantages, valid rows: mean {a_ours.mean():+.4f} std {a_ours.std():.4f}")
    print(f"our advantages, bootstrap rows: mean {boot.mean():+.4f} std {boot.std():.4f}")
    print(f"reference advantages: mean {a_ref.mean():+.4f} std {a_ref.std():.4f}")
    corr = np.corrcoef(a_ours.ravel(), a_ref.ravel())[0, 1]
    slope = float(np.polyfit(a_ref.ravel(), a_ours.ravel(), 1)[0])
    print(
        f"ours − reference: max |Δadv| {np.abs(a_ours - a_ref).max():.4f}, "
        f"ours ≈ {slope:.4f}·reference + c, corr {corr:.6f}"
    )
    print(f"value targets: max |Δ| {np.abs(arr['target_ours'] - ref['target']).max():.2e}")
    terms, truncs = (int(taps.batch[k].sum()) for k in ("terminateds", "truncateds"))
    print(
        f"rows flagged terminated {terms}, truncated {truncs} (time limits: 0 terminated, else "
        "GAE drops V(s_T); trainers.learners.time_limits)"
    )

    # 2. per minibatch, the same rows in the same order
    flat = arr["flat"]
    minibatches = [flat[s["rows"]][flat[s["rows"]] >= 0] for s in taps.steps]
    variants = {"ref adv": ref["cols"]}
    ours_cols = dict(ref["cols"], adv=torch.as_tensor(a_ours.reshape(-1).astype(np.float32)))
    ours_cols["target"] = torch.as_tensor(arr["target_ours"].reshape(-1).astype(np.float32))
    variants["our adv"] = ours_cols
    results = {k: reference_update(initial, ref, c, minibatches) for k, c in variants.items()}
    ref_steps = results["our adv"][1]
    print(f"\n## 2. per minibatch ({len(taps.steps)} SGD steps ours; reference on the same rows,")
    print("##    our advantages and targets; cos/ratio: actor gradients ours vs reference)")
    print(
        f"{'step':>4} {'rows':>5} {'valid':>5} | {'pi ours':>8} {'pi ref':>8} | {'ent ours':>8} "
        f"{'ent ref':>8} | {'vf ours':>8} {'vf ref':>8} | {'cos':>6} {'|g| o/r':>7}"
    )
    for k, (s, r) in enumerate(zip(taps.steps, ref_steps, strict=True)):
        go, gr = flat_grads(s["grads"]), flat_grads(r["grads"])
        print(
            f"{k:>4} {len(s['rows']):>5} {len(minibatches[k]):>5} | {s['policy_loss']:+8.4f} "
            f"{r['policy_loss']:+8.4f} | {s['entropy']:8.4f} {r['entropy']:8.4f} | "
            f"{s['vf_loss']:8.4f} {r['vf_loss']:8.4f} | {cos(go, gr):6.3f} "
            f"{np.linalg.norm(go) / np.linalg.norm(gr):7.3f}"
        )
    print("\nfirst minibatch, per actor parameter (ours vs reference):")
    for name in REF_ACTOR:
        go, gr = taps.steps[0]["grads"][name], ref_steps[0]["grads"][name]
        print(
            f"  {name:<9} cos {cos(go, gr):.4f}  "
            f"|g| ratio {np.linalg.norm(go) / np.linalg.norm(gr):.4f}"
        )

    # 3. over the update
    obs = ref["cols"]["obs"]
    start_actor = reference_update(initial, ref, ref["cols"], [])[0]
    with torch.no_grad():
        start_logits = start_actor(obs)
    E = int(arr["E"])
    own = [np.arange(E * 75).reshape(4, -1)[j] for j in range(4)] * 15
    results["own minibatches"] = reference_update(initial, ref, ref["cols"], own)
    print("\n## 3. after the update, on the batch's observations")
    print(f"{'policy':<40} {'SGD steps':>9} {'entropy':>8} {'KL(start‖·)':>12}")
    ent0, _ = policy_stats(start_actor, obs, start_logits)
    print(f"{'initial':<40} {0:>9} {ent0:8.4f} {0.0:12.5f}")

    def ours_logits(x: Any) -> Any:
        from ray.rllib.core.columns import Columns

        return final.forward_inference({Columns.OBS: x})[Columns.ACTION_DIST_INPUTS]

    ent, kl = policy_stats(ours_logits, obs, start_logits)
    print(f"{'ours (lean learner)':<40} {len(taps.steps):>9} {ent:8.4f} {kl:12.5f}")
    for name, (actor, steps) in results.items():
        ent, kl = policy_stats(actor, obs, start_logits)
        label = (
            f"reference, our minibatches, {name}"
            if name != "own minibatches"
            else ("reference, own minibatches (4/epoch)")
        )
        print(f"{label:<40} {len(steps):>9} {ent:8.4f} {kl:12.5f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
