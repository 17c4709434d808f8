"""Scripted agents: named python policies served as RLlib modules that never learn.

A scripted policy is a function ``(agent, observation) -> action`` (the
:data:`scenarios.counterfactual.Policy` contract), built per scenario instance by a factory
``scenario -> policy``. A scenario declares its own in ``Scenario.scripted_policies``
(:class:`scenarios.base.ScriptedPolicy`), named ``"<scenario name>.<policy>"`` here; policies
that work on any scenario (``default``, ``random``, or yours) are registered with
:func:`register_scripted`. :func:`scripted_factory` resolves a name against a scenario class;
:class:`ScriptedModule` wraps the policy in a ``TorchRLModule`` that maps a batch of
observations to actions row by row, reports zero values (``ValueFunctionAPI``) and has no
trainable parameter, so it is frozen by construction.

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

from marl_agents.pools import PoolError

Policy = Callable[[str, Any], Any]
PolicyFactory = Callable[[Any], Policy]


@dataclasses.dataclass(frozen=True)
class ScriptedEntry:
    """A scripted policy, as listed by :func:`list_scripted`.

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


#: policies registered with :func:`register_scripted` (scenarios declare theirs themselves).
SCRIPTED: dict[str, ScriptedEntry] = {}


def register_scripted(
    name: str, factory: PolicyFactory, *, default_for: tuple[str, ...] = (), summary: str = ""
) -> None:
    """Register a scripted policy factory under ``name`` (a bare name, or
    ``"<scenario>.<policy>"`` for a scenario you cannot edit).

    Raises:
        ValueError: ``name`` is taken by a different factory.
    """
    entry = ScriptedEntry(name, factory, tuple(default_for), summary)
    old = SCRIPTED.get(name)
    if old is not None and old.factory is not factory:
        raise ValueError(f"scripted policy {name!r} is already registered: pick another name")
    SCRIPTED[name] = entry


def declared(scenario_cls: type) -> list[ScriptedEntry]:
    """The policies ``scenario_cls`` declares, as entries named ``"<name>.<policy>"``, plus
    those registered under its name."""
    name = scenario_cls.name
    own = [
        ScriptedEntry(f"{name}.{p.name}", p.factory, tuple(p.default_for), p.summary)
        for p in scenario_cls.scripted_policies
    ]
    return own + [e for e in SCRIPTED.values() if e.scenario == name]


def scripted_factory(name: str, scenario_cls: type) -> PolicyFactory:
    """The factory of scripted policy ``name`` for a scenario of class ``scenario_cls``.

    Raises:
        PoolError: an unknown name, or one that belongs to another scenario.
    """
    for entry in [*declared(scenario_cls), *SCRIPTED.values()]:
        if entry.name == name and entry.scenario in (None, scenario_cls.name):
            return entry.factory
    owner = name.split(".", 1)[0] if "." in name else None
    if owner is not None and owner != scenario_cls.name:
        raise PoolError(
            f"scripted policy {name!r} belongs to scenario {owner!r}, not "
            f"{scenario_cls.name!r}: use one of {', '.join(_names(scenario_cls))}"
        )
    raise PoolError(
        f"unknown scripted policy {name!r}; available for {scenario_cls.name!r} are "
        f"{', '.join(_names(scenario_cls))} (declare yours in Scenario.scripted_policies or "
        "register it with marl_agents.scripted.register_scripted)"
    )


def _names(scenario_cls: type) -> list[str]:
    return sorted({e.name for e in declared(scenario_cls)} | {e.name for e in _generic()})


def _generic() -> list[ScriptedEntry]:
    return [e for e in SCRIPTED.values() if e.scenario is None]


def get_scripted(name: str) -> PolicyFactory:
    """The factory of ``name``: a registered policy, or ``"<scenario>.<policy>"`` declared by
    the registered scenario ``<scenario>``.

    Raises:
        KeyError: an unknown name; the message lists the known ones.
    """
    entries = {e.name: e for e in list_scripted()}
    if name not in entries:
        raise KeyError(f"unknown scripted policy {name!r}: known are {', '.join(entries)}")
    return entries[name].factory


def list_scripted() -> list[ScriptedEntry]:
    """Registered scripted policies and those the registered scenarios declare, by name."""
    from scenarios.registry import list_scenarios

    entries = {e.name: e for e in SCRIPTED.values()}
    for cls in list_scenarios():
        entries.update((e.name, e) for e in declared(cls))
    return [entries[k] for k in sorted(entries)]


def frozen_defaults(scenario_cls: type) -> dict[str, str]:
    """Role → scripted policy name that serves a frozen pool of that role in a scenario of
    class ``scenario_cls``."""
    out: dict[str, str] = {}
    for entry in declared(scenario_cls):
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
            from scenarios.env_spec import EnvSpec

            scenario = EnvSpec.of(self._env_config).build_scenario()
            self._policy = scripted_factory(self._policy_name, type(scenario))(scenario)
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
