"""One typed description of an experiment's environment: :class:`EnvSpec`.

``trainers.plan.resolve`` builds it once, with the scenario it built to check the config
(:attr:`EnvSpec.built`), and hands it to RLlib as ``env_config={"spec": spec, ...}``; every
process that needs the environment (env runners, credit replay workers, evaluation, the
episode log) makes it with :meth:`EnvSpec.make_env`. A spec pickles without its built scenario
(each process rebuilds it from the name and kwargs, as Ray's workers must) and deep-copies as
itself (it is immutable). :meth:`EnvSpec.of` reads an env config: the spec under ``"spec"``,
or the spec's fields given as plain keys (``{"scenario": "delegate", "topology": "star:3"}``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from scenarios.engines import DEFAULT_EPISODE_TIMEOUT_S

#: the env-config key holding the :class:`EnvSpec`
SPEC_KEY = "spec"


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What builds the environment of an experiment, in any process.

    Attributes:
        scenario: a registered scenario name or an import reference ``package.module:attr``.
        topology: the topology it runs on (a spec string, a ``Topology``, or None: its own).
        kwargs: the scenario's keyword arguments.
        seed_once: a repeated ``reset(seed=s)`` continues the episode stream instead of
            replaying task ``s`` (what RLlib's env runners need: they pass their config seed
            at every reset).
        episode_timeout_s: the wall-clock limit per episode (None: none).
        engine: how episodes run (:data:`scenarios.engines.ENGINES`; None: the env's default).
        rewards: a reward-sources spec (:mod:`scenarios.reward_sources`; None: the verifier's
            reward).
        tool_latency: slow tools, ``{"seconds": L, "jitter": J}`` (:mod:`scenarios.tool_latency`;
            None: none).
        tool_timeout_s: a tool call's time limit (None: none).
        global_state: report the global state in every acting agent's infos
            (:mod:`scenarios.global_state`) where the scenario has one.
        check_action_masks: a turn-based PettingZoo env (:mod:`scenarios.pz_aec`) refuses an
            action its agent's ``action_mask`` forbids; False (a pool with ``model.action_mask:
            false``): the action reaches the env, whose own rule applies.
        built: the scenario already built from these fields in this process (never pickled).
    """

    scenario: str
    topology: Any = None
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    seed_once: bool = False
    episode_timeout_s: float | None = DEFAULT_EPISODE_TIMEOUT_S
    engine: str | None = None
    rewards: Mapping[str, Any] | None = None
    tool_latency: Mapping[str, Any] | None = None
    tool_timeout_s: float | None = None
    global_state: bool = True
    check_action_masks: bool = True
    built: Any = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, config: Mapping[str, Any] | EnvSpec) -> EnvSpec:
        """The spec of an env config: the spec under ``"spec"`` (or the spec itself), else one
        made of the config's plain keys (the spec's field names; others are ignored)."""
        if isinstance(config, EnvSpec):
            return config
        spec = config.get(SPEC_KEY)
        if spec is not None:
            return spec  # type: ignore[no-any-return]
        if "scenario" not in config:
            raise ValueError(
                "an env config needs {'spec': EnvSpec(...)} or the spec's fields, at least "
                "{'scenario': NAME or 'package.module:attr', 'topology': SPEC, 'kwargs': {...}}"
            )
        names = {f.name for f in dataclasses.fields(cls)} - {"built"}
        return cls(**{k: v for k, v in config.items() if k in names})

    def plain(self) -> dict[str, Any]:
        """The fields as a plain dict (without the built scenario): :meth:`of` reads it back."""
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "built"
        }

    def replace(self, **changes: Any) -> EnvSpec:
        """A copy with ``changes``; it keeps the built scenario unless the scenario's own
        fields (``scenario``, ``topology``, ``kwargs``) change."""
        built = self.built
        if {"scenario", "topology", "kwargs"} & changes.keys():
            built = None
        return dataclasses.replace(self, **{"built": built, **changes})

    def build_scenario(self) -> Any:
        """The scenario: the one built in this process, else built from the fields."""
        if self.built is not None:
            return self.built
        from scenarios.registry import build

        return build(self.scenario, topology=self.topology, **dict(self.kwargs))

    def env_settings(self, scenario: Any) -> dict[str, Any]:
        """The :class:`~scenarios.graph_env.GraphEnv` keyword arguments this spec sets."""
        settings: dict[str, Any] = {
            "episode_timeout_s": self.episode_timeout_s,
            "engine": self.engine,
        }
        if self.rewards:
            from scenarios.reward_sources import RewardSources

            settings["rewards"] = RewardSources.from_spec(dict(self.rewards), scenario)
        if self.tool_latency is not None or self.tool_timeout_s is not None:
            from scenarios.tool_latency import ToolSettings

            settings["tools"] = ToolSettings.of(self.tool_latency, self.tool_timeout_s)
        return settings

    def make_env(self) -> Any:
        """A fresh :class:`~scenarios.graph_env.GraphEnv` of this spec (its own scenario
        object: envs never share one, since a scenario may hold per-episode state)."""
        from scenarios.graph_env import GraphEnv

        scenario = self.replace(built=None).build_scenario()
        if hasattr(scenario, "check_mask"):  # scenarios.pz_aec.AECScenario
            scenario.check_mask = self.check_action_masks
        return GraphEnv(scenario, **self.env_settings(scenario))

    def __reduce__(self) -> Any:
        # every process rebuilds the scenario from its name and kwargs
        return (_rebuild, (self.plain(),))

    def __deepcopy__(self, memo: dict[int, Any]) -> EnvSpec:
        return self  # immutable: RLlib deep-copies its env config


def _rebuild(fields: dict[str, Any]) -> EnvSpec:
    return EnvSpec(**fields)


__all__ = ["SPEC_KEY", "EnvSpec"]
