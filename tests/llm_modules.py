"""The tiny LLM as an RLlib module, and a GRPO learner over a trained and a frozen copy."""

from __future__ import annotations

from typing import Any

from scenarios.text_space import TextSpaces


def module_spec(spaces: TextSpaces, seed: int = 0, **config: Any) -> Any:
    """A ``CausalLMModule`` spec of the in-code tiny model (``seed``: its weights)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from marl_agents.llm.rl_module import CausalLMModule

    return RLModuleSpec(
        module_class=CausalLMModule,
        observation_space=spaces.observation_space,
        action_space=spaces.action_space,
        model_config={"model": "tiny", "tiny_seed": seed, **config},
    )


def learner_config(
    spaces: TextSpaces,
    trained: dict[str, Any] | None = None,
    frozen: dict[str, Any] | None = None,
    minibatch_size: int = 6,
    **grpo: Any,
) -> Any:
    """GRPO over modules ``trained`` (learns) and ``frozen`` (their ``module_spec`` kwargs)."""
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec

    from trainers.grpo.algorithm import GRPOAlgorithmConfig

    specs = {"trained": module_spec(spaces, **(trained or {}))}
    specs["frozen"] = module_spec(spaces, **(frozen if frozen is not None else {"seed": 1}))
    return (
        GRPOAlgorithmConfig()
        .framework("torch")
        .multi_agent(
            policies=["trained", "frozen"],
            policy_mapping_fn=lambda aid, *a, **k: aid,
            policies_to_train=["trained"],
        )
        .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs=specs))
        .training(
            lr=1e-2, train_batch_size_per_learner=6, minibatch_size=minibatch_size, num_epochs=1
        )
        .grpo(**grpo)
    )


def build_learner(spaces: TextSpaces, **kwargs: Any) -> Any:
    """The learner of :func:`learner_config` (both modules see the same spaces)."""
    both = (spaces.observation_space, spaces.action_space)
    return learner_config(spaces, **kwargs).build_learner(spaces={"trained": both, "frozen": both})
