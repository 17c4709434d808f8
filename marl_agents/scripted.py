"""Scripted agents: named python policies served as RLlib modules that never learn.

A scripted policy is a function ``(agent, observation) -> action`` (the
:data:`scenarios.engine.Policy` contract). Scenarios expose theirs as methods (they often need
the scenario's sizes), so the registry holds *factories* ``scenario -> policy`` under names
``"<scenario>.<policy>"``. :class:`ScriptedModule` wraps one in a ``TorchRLModule``: it maps a
batch of observations to actions row by row, reports zero values (``ValueFunctionAPI``) and has
no trainable parameter, so it is frozen by construction.

Example:
    >>> from scenarios.registry import build
    >>> policy = get_scripted("delegate.scripted_worker")(build("delegate", "star:3"))
    >>> policy("worker_0", [1, 0, 0] + [0] * 6).tolist()
    [1, 0, 0]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from typing_extensions import override

Policy = Callable[[str, Any], Any]
PolicyFactory = Callable[[Any], Policy]


@dataclasses.dataclass(frozen=True)
class ScriptedEntry:
    """A registered scripted policy.

    Attributes:
        name: ``"<scenario>.<policy>"``, or a bare name for scenario-independent policies.
        factory: ``scenario -> policy``.
        default_for: roles this policy serves by default when a pool of that role is frozen
            and no model is configured for it (e.g. ``("worker",)``).
        summary: one line for listings.
    """

    name: str
    factory: PolicyFactory
    default_for: tuple[str, ...] = ()
    summary: str = ""

    @property
    def scenario(self) -> str | None:
        """The scenario the policy belongs to (``None`` for scenario-independent ones)."""
        return self.name.split(".", 1)[0] if "." in self.name else None


SCRIPTED: dict[str, ScriptedEntry] = {}


def register_scripted(
    name: str, factory: PolicyFactory, *, default_for: tuple[str, ...] = (), summary: str = ""
) -> None:
    """Register a scripted policy factory under ``name`` (``"<scenario>.<policy>"``).

    Raises:
        ValueError: ``name`` is taken by a different factory.
    """
    entry = ScriptedEntry(name, factory, tuple(default_for), summary)
    old = SCRIPTED.get(name)
    if old is not None and old.factory is not factory:
        raise ValueError(f"scripted policy {name!r} is already registered: pick another name")
    SCRIPTED[name] = entry


def get_scripted(name: str) -> PolicyFactory:
    """The factory registered as ``name``.

    Raises:
        KeyError: an unknown name; the message lists the registered ones.
    """
    if name not in SCRIPTED:
        raise KeyError(
            f"unknown scripted policy {name!r}: registered are {', '.join(sorted(SCRIPTED))}"
        )
    return SCRIPTED[name].factory


def list_scripted() -> list[ScriptedEntry]:
    """Registered scripted policies, sorted by name."""
    return [SCRIPTED[k] for k in sorted(SCRIPTED)]


def frozen_defaults(scenario: str) -> dict[str, str]:
    """Role → scripted policy name that serves a frozen pool of that role in ``scenario``."""
    out: dict[str, str] = {}
    for entry in list_scripted():
        if entry.scenario == scenario:
            for role in entry.default_for:
                out.setdefault(role, entry.name)
    return out


def _default_action(scenario: Any) -> Policy:
    return lambda agent, obs: scenario.default_action(agent)


def _random(scenario: Any) -> Policy:
    rng = np.random.default_rng(0)

    def policy(agent: str, obs: Any) -> Any:
        space = scenario.action_space(agent)
        space.seed(int(rng.integers(2**31)))
        return space.sample()

    return policy


register_scripted(
    "default", _default_action, summary="the scenario's default (absent) action, every step"
)
register_scripted("random", _random, summary="uniform random actions (seeded)")
register_scripted(
    "delegate.scripted_worker",
    lambda s: s.scripted_worker,
    default_for=("worker",),
    summary="delegate worker: the method matching each assigned part's type",
)
register_scripted(
    "delegate.oracle",
    lambda s: s.oracle_policy,
    summary="delegate: skill-aware optimal orchestrator (and scripted workers)",
)
register_scripted(
    "relay.optimal",
    lambda s: s.optimal_policy(),
    summary="relay: the counting protocol (optimal when the alphabet suffices)",
)


# ----- the RLlib module ---------------------------------------------------------------------
class ScriptedModule(TorchRLModule, ValueFunctionAPI):
    """A registered scripted policy as an RLlib module (frozen by construction).

    ``model_config``: ``policy`` (registered name), ``env_config`` (the
    :class:`scenarios.rllib_env.RLlibGraphEnv` config the scenario is built from) and ``agent``
    (the id the policy is called with: the pool's first agent, so a policy may depend on the
    agent only through what all agents of the pool share). Outputs actions directly (no
    distribution to sample) with zero log-probabilities; values are zero.
    """

    def setup(self) -> None:
        cfg = self.model_config
        self._policy_name = cfg["policy"]
        self._agent = cfg["agent"]
        self._env_config = dict(cfg["env_config"])
        self._policy: Policy | None = None
        # optimizers need one parameter; it never receives a gradient
        self._frozen = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    @property
    def policy(self) -> Policy:
        """The python policy (the scenario is built on first use, in the process using it)."""
        if self._policy is None:
            from scenarios.registry import build

            env = self._env_config
            scenario = build(env["scenario"], env.get("topology"), **env.get("kwargs", {}))
            self._policy = get_scripted(self._policy_name)(scenario)
        return self._policy

    def _act(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        rows = obs.detach().cpu().numpy() if isinstance(obs, torch.Tensor) else np.asarray(obs)
        actions = np.stack([np.asarray(self.policy(self._agent, row)) for row in rows])
        return {
            Columns.ACTIONS: torch.as_tensor(actions),
            Columns.ACTION_LOGP: torch.zeros(len(rows)),
        }

    @override
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._act(batch)

    @override
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._act(batch)

    @override
    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        return torch.zeros(len(batch[Columns.OBS]))
