"""A plain-torch MAPPO on mpe2 simple_spread, outside the framework: the calibration point for
``experiments.spread_mappo`` (is a gap to the published curve ours, or the task's?).

Written here from the published recipe of the public MAPPO-MLP curve (Lizhi-sjtu
MARL-code-pytorch, ``1.MAPPO_MPE``; docs/results.md): one actor and one critic shared by the
agents, tanh MLPs [64, 64] with orthogonal initialisation (policy head gain 0.01), the critic on
the global state (mpe2's ``state()``: the agents' observations concatenated), 32 episodes (800
env steps) per update, 15 epochs of 4 minibatches, Adam (lr 5e-4, eps 1e-5), gradient norm 10,
entropy 0.01, γ 0.99, GAE λ 0.95, advantages standardised per batch, rewards divided by a
running std (``--reward-norm``), the time-limit step bootstrapped from the critic. Every
``--eval-every`` env steps: 32 greedy episodes on seeds 10,000… in EPyMARL's team-return
convention (:func:`experiments.epymarl.team_return`), as ``experiments.spread_mappo`` does.

``--reward env`` trains each agent on mpe2's own reward (``local_ratio`` 0.5, what
``experiments.spread_mappo`` trains on); ``--reward team`` on the agents' mean reward (the
shared reward the published MAPPO runs train on).

Run: ``python -m experiments.spread_reference --steps 250000 --reward env --seed 0`` (one JSON
line per evaluation to ``--out``, default ``experiments/results/spread_mappo/reference.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

KW = {"N": 3, "max_cycles": 25, "local_ratio": 0.5, "continuous_actions": False}
OUT = Path(__file__).resolve().parent / "results" / "spread_mappo" / "reference.jsonl"
EVAL_SEED = 10_000


def make_env() -> Any:
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(**KW)


def net(inputs: int, outputs: int, gain: float, orthogonal: bool = True) -> Any:
    """tanh MLP [64, 64] → ``outputs``, orthogonal weights, zero biases (head gain ``gain``);
    ``orthogonal`` False: torch's default initialisation."""
    from torch import nn

    layers = [
        nn.Linear(inputs, 64),
        nn.Tanh(),
        nn.Linear(64, 64),
        nn.Tanh(),
        nn.Linear(64, outputs),
    ]
    for layer in layers if orthogonal else []:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, gain=gain if layer is layers[-1] else 1.0)
            nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class RunningStd:
    """Running mean and variance (Welford) of a scalar stream."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, x: np.ndarray) -> None:
        for v in np.ravel(x):
            self.n += 1
            d = v - self.mean
            self.mean += d / self.n
            self.m2 += d * (v - self.mean)

    @property
    def std(self) -> float:
        return float(np.sqrt(self.m2 / self.n)) if self.n > 1 else 1.0


def greedy(actor: Any, episodes: int) -> float:
    """Mean EPyMARL team return of ``episodes`` greedy episodes on seeds ``EVAL_SEED…``."""
    import torch

    from experiments.epymarl import team_return

    env, out = make_env(), []
    for k in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED + k)
        total = 0.0
        while env.agents:
            agents = list(env.agents)
            with torch.no_grad():
                x = torch.as_tensor(np.stack([obs[a] for a in agents]), dtype=torch.float32)
                acts = actor(x).argmax(-1).numpy()
            obs, rew, *_ = env.step({a: int(u) for a, u in zip(agents, acts, strict=True)})
            total += float(sum(rew.values()))
        out.append(team_return(total))
    env.close()
    return float(np.mean(out))


def train(
    seed: int,
    steps: int,
    reward: str,
    reward_norm: bool,
    every: int,
    out: Path,
    orthogonal: bool = True,
    tag: str = "",
    value_norm: bool = False,
    shuffle_rows: bool = False,
) -> None:
    import torch

    from experiments.epymarl import team_return

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    env = make_env()
    agents = list(env.possible_agents)
    n, T, batch_eps, epochs, minibatches = len(agents), KW["max_cycles"], 32, 15, 4
    obs_dim = env.observation_space(agents[0]).shape[0]
    state_dim = obs_dim * n
    actor, critic = net(obs_dim, 5, 0.01, orthogonal), net(state_dim, 1, 1.0, orthogonal)
    params = list(actor.parameters()) + list(critic.parameters())
    optim = torch.optim.Adam(params, lr=5e-4, eps=1e-5)
    rstd = RunningStd()
    from trainers.learners.value_norm import ValueNorm

    vnorm, entropy = ValueNorm(), float("nan")
    done_steps, next_eval, start, train_returns = 0, 0, time.perf_counter(), []
    while True:
        if done_steps >= next_eval:
            row = {
                "impl": "reference",
                "reward": reward,
                "tag": tag,
                "seed": seed,
                "env_steps": done_steps,
                "team_return": greedy(actor, 32),
                "train_team_return": float(np.mean(train_returns[-32:])) if train_returns else None,
                "entropy": entropy,
                "wall_s": time.perf_counter() - start,
            }
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(row, flush=True)
            next_eval += every
        if done_steps >= steps:
            return
        OBS = np.zeros((batch_eps, T + 1, n, obs_dim), np.float32)
        A = np.zeros((batch_eps, T, n), np.int64)
        LP = np.zeros((batch_eps, T, n), np.float32)
        R = np.zeros((batch_eps, T, n), np.float32)
        for e in range(batch_eps):
            obs, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
            total = 0.0
            for t in range(T):
                OBS[e, t] = np.stack([obs[a] for a in agents])
                with torch.no_grad():
                    dist = torch.distributions.Categorical(logits=actor(torch.as_tensor(OBS[e, t])))
                    u = dist.sample()
                A[e, t], LP[e, t] = u.numpy(), dist.log_prob(u).numpy()
                obs, rew, *_ = env.step({a: int(x) for a, x in zip(agents, A[e, t], strict=True)})
                r = np.array([rew[a] for a in agents], np.float32)
                total += float(r.sum())
                R[e, t] = r if reward == "env" else np.full(n, r.mean(), np.float32)
            OBS[e, T] = np.stack([obs[a] for a in agents])  # time limit: bootstrap from here
            train_returns.append(team_return(total))
        done_steps += batch_eps * T
        if reward_norm:
            rstd.update(R)
            R = R / max(rstd.std, 1e-8)
        obs_t = torch.as_tensor(OBS)
        state_t = obs_t.reshape(batch_eps, T + 1, 1, state_dim).expand(-1, -1, n, -1)
        with torch.no_grad():
            V = critic(state_t).squeeze(-1).numpy()
        adv_np, target_np = advantages(R, V, vnorm if value_norm else None)
        adv_t, target = torch.as_tensor(adv_np), torch.as_tensor(target_np)
        a_t, lp_t = torch.as_tensor(A), torch.as_tensor(LP)
        B = batch_eps
        flat_obs = obs_t[:, :T].reshape(B * T * n, obs_dim)
        flat_state = state_t[:, :T].reshape(B * T * n, state_dim)
        flat_a, flat_lp = a_t.reshape(-1), lp_t.reshape(-1)
        flat_adv, flat_target = adv_t.reshape(-1), target.reshape(-1)
        for _ in range(epochs):
            # minibatches of whole episodes in a fixed order (the recipe's), or of rows
            # shuffled across episodes and agents every epoch (as RLlib's learner does)
            if shuffle_rows:
                order = np.random.default_rng(rng.integers(2**31)).permutation(B * T * n)
            else:  # row (e, t, i) of the flat arrays is e·T·n + t·n + i
                order = np.arange(B * T * n)
            split = np.array_split(order, minibatches)
            cols = {
                "obs": flat_obs,
                "state": flat_state,
                "actions": flat_a,
                "logp": flat_lp,
                "adv": flat_adv,
                "target": flat_target,
            }
            entropy = update(actor, critic, optim, params, cols, split)


def advantages(R: np.ndarray, V: np.ndarray, vnorm: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """``(advantages standardised over the batch, value targets)`` of rewards ``R`` ``[B, T, n]``
    and critic outputs ``V`` ``[B, T + 1, n]`` (the last step bootstraps the time limit): GAE
    (γ 0.99, λ 0.95). ``vnorm`` (the framework's ``ValueNorm``, ``--value-norm``): ``V`` is
    de-normalised first, the targets update it and come back normalised."""
    if vnorm is not None:
        V = vnorm.denormalize(V)
    B, T, n = R.shape
    adv = np.zeros((B, T, n), np.float32)
    gae = np.zeros((B, n), np.float32)
    for t in reversed(range(T)):
        delta = R[:, t] + 0.99 * V[:, t + 1] - V[:, t]
        gae = delta + 0.99 * 0.95 * gae
        adv[:, t] = gae
    target = adv + V[:, :T]
    if vnorm is not None:
        vnorm.update(target)
        target = vnorm.normalize(target)
    return (adv - adv.mean()) / (adv.std() + 1e-5), target


def update(
    actor: Any,
    critic: Any,
    optim: Any,
    params: list[Any],
    cols: dict[str, Any],
    minibatches: list[np.ndarray],
    record: Any = None,
) -> float:
    """One epoch of the recipe's update: per minibatch (row indices into the flat tensors of
    ``cols``: ``obs``, ``state``, ``actions``, ``logp``, ``adv``, ``target``) the clipped
    surrogate (0.2), entropy 0.01 and value loss (weight 1), each a mean over the minibatch's
    rows, one Adam step after clipping the gradient norm of ``params`` at 10. ``record``, when
    given, is called after ``backward`` (before the clip) with the minibatch's terms. Returns the
    last minibatch's entropy."""
    import torch

    entropy = float("nan")
    for idx in minibatches:
        index = torch.as_tensor(idx)
        o, st, a, lp, ad, tg = (
            cols[k][index] for k in ("obs", "state", "actions", "logp", "adv", "target")
        )
        dist = torch.distributions.Categorical(logits=actor(o))
        ratio = torch.exp(dist.log_prob(a) - lp)
        surr = torch.min(ratio * ad, ratio.clamp(0.8, 1.2) * ad)
        v = critic(st).squeeze(-1)
        ent = dist.entropy().mean()
        policy_loss, vf_loss = (-surr).mean(), ((v - tg) ** 2).mean()
        loss = policy_loss - 0.01 * ent + vf_loss
        entropy = float(ent.detach())
        optim.zero_grad()
        loss.backward()
        if record is not None:
            record(
                policy_loss=float(policy_loss.detach()),
                entropy=entropy,
                vf_loss=float(vf_loss.detach()),
            )
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        optim.step()
    return entropy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=250_000)
    p.add_argument("--reward", choices=("env", "team"), default="env")
    p.add_argument("--no-reward-norm", dest="reward_norm", action="store_false")
    p.add_argument(
        "--value-norm",
        action="store_true",
        help="normalise value targets with trainers' ValueNorm (use with --no-reward-norm)",
    )
    p.add_argument(
        "--shuffle-rows",
        action="store_true",
        help="minibatches of rows shuffled across episodes and agents (RLlib's) "
        "instead of whole episodes in a fixed order",
    )
    p.add_argument("--eval-every", type=int, default=25_000)
    p.add_argument("--default-init", dest="orthogonal", action="store_false")
    p.add_argument("--tag", default="", help="a label for this arm in the rows")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    train(
        args.seed,
        args.steps,
        args.reward,
        args.reward_norm,
        args.eval_every,
        args.out,
        args.orthogonal,
        args.tag,
        args.value_norm,
        args.shuffle_rows,
    )


if __name__ == "__main__":
    main()
