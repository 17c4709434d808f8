"""Torch RLModules for pools and the one function that turns a pool into an ``RLModuleSpec``.

* ``mlp`` pools use the algorithm's own default module (RLlib's ``DefaultPPOTorchRLModule`` for
  PPO/IMPALA, the APPO variant for APPO) with ``fcnet_hiddens`` = the pool's sizes: the fastest
  path and exactly what a hand-written RLlib config would build.
* with a centralised critic (model config ``critic_dim > 0``; :mod:`marl_agents.critics`),
  ``mlp`` pools use :class:`CentralCriticMLPModule` (the same actor layers, a separate value
  network over the learner's critic column), and ``gru``/``mpnn`` modules swap their value
  head for that network; the actors' forwards are unchanged.
* ``mlp`` pools with ``input_norm: true`` use :class:`MLPModule` (the same layers as RLlib's
  default, a separate value MLP over the observation, each network's input through a
  ``LayerNorm``: MAPPO's ``use_feature_normalization``), or :class:`CentralCriticMLPModule`
  with that input norm on the actor and the centralised critic.
* agents whose observations carry an action mask (the masked ``Dict`` of
  :mod:`scenarios.pz_spaces`: PettingZoo's classic games) are served by modules built here
  (``mlp``: :class:`MLPModule`; RLlib's default module takes no ``Dict``) that read the
  observation part only and, with ``model.action_mask`` (default), mask the logits in
  ``_forward`` (:mod:`marl_agents.action_mask`).
* ``gru`` pools use :class:`GRUModule` (recurrent actor-critic for partial observability).
* ``mpnn`` pools use :class:`MessagePassingModule`: one round of message passing over the
  topology's channels, applied to the agent's own observation (see its docstring).
* ``llm`` pools use :class:`~marl_agents.llm.rl_module.CausalLMModule` (a Hugging Face causal
  LM sampling token ids with transformers wherever the module runs: env runners, learners).
* ``scripted`` pools use :class:`marl_agents.scripted.ScriptedModule`.
* ``checkpoint`` pools rebuild the module class stored in an earlier run's checkpoint and load
  its weights at build time (``load_state_path``) on the learner and every env runner.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import (
    TorchCategorical,
    TorchDiagGaussian,
    TorchMultiCategorical,
)
from ray.rllib.core.learner.utils import make_target_network
from ray.rllib.core.rl_module.apis import TargetNetworkAPI, ValueFunctionAPI
from ray.rllib.core.rl_module.apis.target_network_api import TARGET_NETWORK_ACTION_DIST_INPUTS
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch import nn
from typing_extensions import override

from marl_agents.action_mask import mask_of, masked_logits, own_observation, own_space
from marl_agents.critics import central_critic, central_values
from marl_agents.pools import (
    AgentPool,
    CheckpointModel,
    GRUModel,
    LLMModel,
    MLPModel,
    ModelConfig,
    MPNNModel,
    PoolError,
    ScriptedModel,
)
from marl_agents.scripted import ScriptedModule
from scenarios.env_spec import EnvSpec
from scenarios.pz_spaces import has_action_mask

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "elu": nn.ELU,
    "linear": nn.Identity,
}


def mlp(inputs: int, sizes: list[int], activation: str) -> tuple[nn.Sequential, int]:
    """A plain MLP ``inputs → sizes…`` with ``activation`` after each layer; returns its width."""
    layers: list[nn.Module] = []
    width = inputs
    for size in sizes:
        layers += [nn.Linear(width, size), _ACTIVATIONS[activation]()]
        width = size
    return nn.Sequential(*layers), width


def action_head(space: gym.Space) -> tuple[int, Any]:
    """Logit width and RLlib distribution class for an action space."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n), TorchCategorical
    if isinstance(space, gym.spaces.MultiDiscrete):
        lens = [int(n) for n in space.nvec.ravel()]
        return sum(lens), TorchMultiCategorical.get_partial_dist_cls(input_lens=lens)
    if isinstance(space, gym.spaces.Box):
        return 2 * int(gym.spaces.flatdim(space)), TorchDiagGaussian
    raise PoolError(
        f"action space {space} is not supported by marl_agents modules: use Discrete, "
        "MultiDiscrete or Box"
    )


def obs_dim(space: gym.Space) -> int:
    """Flat size of a ``Box`` observation space (of a masked ``Dict``'s observation part:
    :mod:`marl_agents.action_mask`)."""
    space = own_space(space)
    if not isinstance(space, gym.spaces.Box):
        raise PoolError(f"observation space {space} is not supported: use a Box")
    return int(gym.spaces.flatdim(space))


class ActionMasking:
    """Mixin of the modules built here: their logits under the observation's action mask
    where the model config's ``action_mask`` is on (:mod:`marl_agents.action_mask`)."""

    model_config: Mapping[str, Any]

    def _masked(self, logits: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor:
        mask = mask_of(batch[Columns.OBS]) if self.model_config.get("action_mask") else None
        return logits if mask is None else masked_logits(logits, mask)


def input_normed(net: nn.Module, width: int, norm: bool) -> nn.Module:
    """``net`` behind a ``LayerNorm`` of its ``width`` inputs when ``norm`` (else ``net``)."""
    return nn.Sequential(nn.LayerNorm(width), net) if norm else net


def critic_net(cfg: Mapping[str, Any], own: int = 0) -> nn.Module | None:
    """The value network a model config asks for: with ``critic_dim > 0`` an MLP of its
    ``hidden`` sizes over the critic column (centralised), else, with ``own > 0``, the same over
    the module's own ``own``-wide input; each behind a ``LayerNorm`` with ``input_norm``. None
    (no ``critic_dim``, no ``own``): the module keeps its own value head."""
    dim = int(cfg.get("critic_dim", 0)) or own
    if dim <= 0:
        return None
    net, width = mlp(dim, list(cfg["hidden"]), cfg["activation"])
    return central_critic(input_normed(net, dim, bool(cfg.get("input_norm", False))), width)


class MLPModule(ActionMasking, TorchRLModule, ValueFunctionAPI, TargetNetworkAPI):
    """An ``mlp`` pool's actor-critic built here: actor MLP → policy head from the agent's own
    observation; values from a separate MLP (with a linear head) over the observation, or, with
    ``critic_dim > 0``, over the learner's critic column (:mod:`marl_agents.critics`).
    ``model_config``: ``hidden``, ``activation``, ``critic_dim``, ``input_norm`` (each network's
    input goes through a ``LayerNorm`` with its affine, as MAPPO's ``use_feature_normalization``
    does: the actor's over the observation, the critic's over its own input), ``action_mask``
    (a masked ``Dict`` observation's mask applied to the logits; both networks read its
    observation part only: :mod:`marl_agents.action_mask`). APPO's target network is a copy
    of the actor and its head (built only where APPO's learner asks for it), masked alike."""

    @override
    def setup(self) -> None:
        cfg = self.model_config
        width_in = obs_dim(self.observation_space)
        actor, width = mlp(width_in, list(cfg["hidden"]), cfg["activation"])
        self.actor = input_normed(actor, width_in, bool(cfg.get("input_norm", False)))
        logits, self.action_dist_cls = action_head(self.action_space)
        self.pi = nn.Linear(width, logits)
        self.critic = critic_net(cfg, own=width_in)

    @override
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        logits = self.pi(self.actor(own_observation(batch[Columns.OBS])))
        return {Columns.ACTION_DIST_INPUTS: self._masked(logits, batch)}

    @override
    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        if int(self.model_config.get("critic_dim", 0)) > 0:
            return central_values(self.critic, batch)
        return self.critic(own_observation(batch[Columns.OBS])).squeeze(-1)

    @override
    def make_target_networks(self) -> None:
        self._old_actor = make_target_network(self.actor)
        self._old_pi = make_target_network(self.pi)

    @override
    def get_target_network_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.actor, self._old_actor), (self.pi, self._old_pi)]

    @override
    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        logits = self._old_pi(self._old_actor(own_observation(batch[Columns.OBS])))
        return {TARGET_NETWORK_ACTION_DIST_INPUTS: self._masked(logits, batch)}

    @override
    def get_non_inference_attributes(self) -> list[str]:
        return [*super().get_non_inference_attributes(), "_old_actor", "_old_pi"]


class CentralCriticMLPModule(MLPModule):
    """:class:`MLPModule` with a centralised critic (``critic_dim > 0``: required), under the
    name runs and checkpoints have used for it."""


class GRUModule(ActionMasking, TorchRLModule, ValueFunctionAPI):
    """Recurrent actor-critic: MLP encoder → GRU → policy and value heads.

    ``model_config``: ``hidden`` (encoder sizes), ``activation``, ``gru_size``,
    ``max_seq_len`` (read by RLlib's time-dimension connector), ``critic_dim`` (> 0: a
    centralised critic, :func:`critic_net`, in place of the value head). RLlib adds the time
    axis, so ``obs`` is ``[B, T, D]`` and the state ``h`` is ``[B, gru_size]``.
    """

    @override
    def setup(self) -> None:
        cfg = self.model_config
        self.encoder, width = mlp(
            obs_dim(self.observation_space), list(cfg["hidden"]), cfg["activation"]
        )
        self.gru = nn.GRU(width, int(cfg["gru_size"]), batch_first=True)
        logits, self.action_dist_cls = action_head(self.action_space)
        self.pi = nn.Linear(int(cfg["gru_size"]), logits)
        self.critic = critic_net(cfg)
        if self.critic is None:
            self.vf = nn.Linear(int(cfg["gru_size"]), 1)

    @override
    def get_initial_state(self) -> dict[str, torch.Tensor]:
        return {"h": torch.zeros(int(self.model_config["gru_size"]))}

    def _core(self, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x = self.encoder(own_observation(batch[Columns.OBS]))
        out, h = self.gru(x, batch[Columns.STATE_IN]["h"].unsqueeze(0))
        return out, {"h": h.squeeze(0)}

    @override
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        emb, state = self._core(batch)
        return {
            Columns.ACTION_DIST_INPUTS: self._masked(self.pi(emb), batch),
            Columns.STATE_OUT: state,
        }

    @override
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        emb, state = self._core(batch)
        return {
            Columns.ACTION_DIST_INPUTS: self._masked(self.pi(emb), batch),
            Columns.STATE_OUT: state,
            Columns.EMBEDDINGS: emb,
        }

    @override
    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        if self.critic is not None:
            return central_values(self.critic, batch)
        if embeddings is None:
            embeddings, _ = self._core(batch)
        return self.vf(embeddings).squeeze(-1)


class MessagePassingModule(ActionMasking, TorchRLModule, ValueFunctionAPI):
    """Actor-critic with one round of message passing over the agent's neighbourhood.

    The observation is split into ``slots`` equal segments, one per neighbour channel (e.g.
    ``relay``'s inbox slots, after the agent's own features given by ``own``); each segment is
    embedded by a shared message MLP, messages are summed (permutation invariant, any number of
    neighbours), concatenated with the embedded own features and fed to the policy and value
    heads. ``model_config``: ``hidden``, ``activation``, ``own`` (leading own-feature width),
    ``slots`` (number of neighbour segments; 0 = plain MLP) and ``critic_dim`` (> 0: a
    centralised critic, :func:`critic_net`, in place of the value head).
    """

    @override
    def setup(self) -> None:
        cfg = self.model_config
        total = obs_dim(self.observation_space)
        self.own, self.slots = int(cfg.get("own", total)), int(cfg.get("slots", 0))
        rest = total - self.own
        if self.slots and rest % self.slots:
            raise PoolError(
                f"mpnn: the {rest} non-own observation features do not split into "
                f"{self.slots} equal neighbour slots: fix model own/slots"
            )
        hidden, act = list(cfg["hidden"]), cfg["activation"]
        self.own_net, width = mlp(self.own, hidden, act)
        if self.slots:
            self.msg_net, msg_width = mlp(rest // self.slots, hidden, act)
            width += msg_width
        logits, self.action_dist_cls = action_head(self.action_space)
        self.pi = nn.Linear(width, logits)
        self.critic = critic_net(cfg)
        if self.critic is None:
            self.vf = nn.Linear(width, 1)

    def _embed(self, batch: Mapping[str, Any]) -> torch.Tensor:
        obs = own_observation(batch[Columns.OBS])
        emb = self.own_net(obs[..., : self.own])
        if self.slots:
            msgs = obs[..., self.own :].reshape(*obs.shape[:-1], self.slots, -1)
            emb = torch.cat([emb, self.msg_net(msgs).sum(dim=-2)], dim=-1)
        return emb

    @override
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self._masked(self.pi(self._embed(batch)), batch)}

    @override
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        emb = self._embed(batch)
        return {
            Columns.ACTION_DIST_INPUTS: self._masked(self.pi(emb), batch),
            Columns.EMBEDDINGS: emb,
        }

    @override
    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        if self.critic is not None:
            return central_values(self.critic, batch)
        if embeddings is None:
            embeddings = self._embed(batch)
        return self.vf(embeddings).squeeze(-1)


def checkpoint_module_dir(path: str | Path, module: str) -> Path:
    """The directory of module ``module`` inside an algorithm checkpoint or a run directory.

    Accepts a run directory (uses its ``checkpoint``), an algorithm checkpoint, or the module
    directory itself.

    Raises:
        PoolError: nothing found; the message lists the modules that exist.
    """
    root = Path(path).expanduser().resolve()  # RLlib loads state from absolute paths only
    candidates = [root, root / "checkpoint"]
    for base in candidates:
        modules = base / "learner_group" / "learner" / "rl_module"
        if modules.is_dir():
            found = modules / module
            if found.is_dir():
                return found
            have = sorted(p.name for p in modules.iterdir() if p.is_dir())
            raise PoolError(
                f"checkpoint {base} has no module {module!r}: it holds {have}; set model.module"
            )
    if (root / "class_and_ctor_args.pkl").exists():
        return root
    raise PoolError(
        f"no algorithm checkpoint at {root}: pass a run directory, its checkpoint folder or a "
        "checkpoints/<iter> folder"
    )


def _checkpoint_spec(pool: AgentPool, env_config: Mapping[str, Any]) -> RLModuleSpec:
    model = pool.model
    assert isinstance(model, CheckpointModel)
    path = checkpoint_module_dir(model.path, model.module or pool.id)
    with open(path / "class_and_ctor_args.pkl", "rb") as f:
        ctor = pickle.load(f)
    kwargs = dict(ctor["ctor_args_and_kwargs"][1])
    saved_obs, saved_act = kwargs.get("observation_space"), kwargs.get("action_space")
    if saved_obs != pool.observation_space or saved_act != pool.action_space:
        raise PoolError(
            f"pool {pool.id!r}: checkpoint module at {path} was trained on spaces "
            f"({saved_obs}, {saved_act}), but the pool's agents have "
            f"({pool.observation_space}, {pool.action_space}): use a checkpoint from the same "
            "scenario settings"
        )
    return RLModuleSpec(
        module_class=ctor["class"],
        observation_space=pool.observation_space,
        action_space=pool.action_space,
        model_config=kwargs.get("model_config"),
        catalog_class=kwargs.get("catalog_class"),
        load_state_path=str(path),
    )


def _mlp_spec(pool: AgentPool, env_config: Mapping[str, Any]) -> RLModuleSpec:
    m = pool.model
    assert isinstance(m, MLPModel)
    if m.input_norm or has_action_mask(pool.observation_space):  # RLlib's takes no Dict
        return _layers_spec(pool, MLPModule)
    cfg = DefaultModelConfig(
        fcnet_hiddens=list(m.hidden),
        fcnet_activation=m.activation,
        head_fcnet_hiddens=[],
        vf_share_layers=False,
    )
    return RLModuleSpec(model_config=cfg, **_spaces(pool))


def _gru_spec(pool: AgentPool, env_config: Mapping[str, Any]) -> RLModuleSpec:
    m = pool.model
    assert isinstance(m, GRUModel)
    return _layers_spec(pool, GRUModule, gru_size=m.gru_size, max_seq_len=m.max_seq_len)


def _mpnn_spec(pool: AgentPool, env_config: Mapping[str, Any]) -> RLModuleSpec:
    return _layers_spec(pool, MessagePassingModule, **_mpnn_layout(pool, env_config))


def _layers_spec(pool: AgentPool, module_class: type, **extra: Any) -> RLModuleSpec:
    """A module built here (``mlp`` with ``input_norm``, masked observations or a critic
    column, ``gru``, ``mpnn``): its layers (and ``input_norm`` when set; ``action_mask`` for a
    masked observation space), plus ``extra`` model config."""
    m = pool.model
    assert isinstance(m, (MLPModel, GRUModel, MPNNModel))
    config = {"hidden": list(m.hidden), "activation": m.activation, **extra}
    if isinstance(m, MLPModel) and m.input_norm:
        config["input_norm"] = True
    if has_action_mask(pool.observation_space):
        config["action_mask"] = m.action_mask
    return RLModuleSpec(module_class=module_class, model_config=config, **_spaces(pool))


def _llm_spec(pool: AgentPool, env_config: Mapping[str, Any]) -> RLModuleSpec:
    from marl_agents.llm.rl_module import CausalLMModule

    m = pool.model
    assert isinstance(m, LLMModel)
    return RLModuleSpec(
        module_class=CausalLMModule,
        model_config={
            "model": m.path,
            "tiny_seed": m.tiny_seed,
            "dtype": m.dtype,
            "temperature": m.temperature,
            "top_p": m.top_p,
            "inference_temperature": m.inference_temperature,
            **_lora_config(pool.id, m),
            "sampler": m.sampler,
            "constrain": m.constrain,
        },
        **_spaces(pool),
    )


def _lora_config(pool: str, m: LLMModel) -> dict[str, Any]:
    """A LoRA pool's extra model config (:mod:`marl_agents.llm.lora`); ``{}`` otherwise."""
    if not m.is_lora:
        return {}
    lora = dataclasses.asdict(m.lora) if m.lora is not None else None
    return {"lora": lora, "adapter": m.adapter, "pool": pool}


def _scripted_spec(pool: AgentPool, env_config: Mapping[str, Any]) -> RLModuleSpec:
    m = pool.model
    assert isinstance(m, ScriptedModel)
    return RLModuleSpec(
        module_class=ScriptedModule,
        model_config={
            "policy": m.policy,
            "agent": pool.agents[0],
            "env_config": EnvSpec.of(env_config).plain(),
        },
        **_spaces(pool),
    )


def _spaces(pool: AgentPool) -> dict[str, gym.Space]:
    return {"observation_space": pool.observation_space, "action_space": pool.action_space}


_SPECS: dict[type[ModelConfig], Callable[[AgentPool, Mapping[str, Any]], RLModuleSpec]] = {
    MLPModel: _mlp_spec,
    GRUModel: _gru_spec,
    MPNNModel: _mpnn_spec,
    LLMModel: _llm_spec,
    ScriptedModel: _scripted_spec,
    CheckpointModel: _checkpoint_spec,
}


def module_spec(
    pool: AgentPool, env_config: EnvSpec | Mapping[str, Any], critic_dim: int = 0
) -> RLModuleSpec:
    """The ``RLModuleSpec`` serving ``pool`` (one builder per model config class).

    Args:
        pool: the resolved pool (its model and spaces).
        env_config: the environment (:class:`~scenarios.env_spec.EnvSpec`, or an env config:
            scripted policies and ``mpnn`` layouts build the scenario from it).
        critic_dim: > 0: a centralised critic over a critic column this wide
            (:mod:`marl_agents.critics`), for ``mlp``, ``gru`` and ``mpnn`` pools.

    Raises:
        PoolError: ``critic_dim`` for a pool of another model type.
    """
    if critic_dim <= 0:
        return _SPECS[type(pool.model)](pool, env_config)
    if isinstance(pool.model, MLPModel):
        return _layers_spec(pool, CentralCriticMLPModule, critic_dim=critic_dim)
    if not isinstance(pool.model, (GRUModel, MPNNModel)):
        raise PoolError(
            f"pool {pool.id!r} ({pool.model.type}) cannot have a centralised critic: only mlp, "
            "gru and mpnn pools can; use algorithm.critic: local"
        )
    spec = _SPECS[type(pool.model)](pool, env_config)
    spec.model_config = {**spec.model_config, "critic_dim": critic_dim}
    return spec


def _mpnn_layout(pool: AgentPool, env_config: Mapping[str, Any]) -> dict[str, int]:
    """Own-feature width and neighbour slots, from the scenario when it declares them."""
    scenario = EnvSpec.of(env_config).build_scenario()
    layout = scenario.message_layout(pool.agents[0])
    if layout is None:
        return {"own": obs_dim(pool.observation_space), "slots": 0}
    own, slots = layout
    return {"own": int(own), "slots": int(slots)}
