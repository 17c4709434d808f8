"""PPO as RLlib runs it, except that an update's weight sync leaves frozen modules out.

RLlib's ``PPO.training_step`` syncs every module named in the learner's results to the env
runners after each update, and a frozen module (not in ``policies_to_train``) shows there
too: RLlib logs its learning rate, entropy coefficient and parameter count. Its weights never
change, so the copy is pure cost — the whole state of a frozen LLM pool every iteration,
and a ``sampler: vllm`` pool reloading it into its engine. :class:`PPO` (what
``algorithm: {name: PPO | MAPPO | IPPO}`` builds) and :class:`~trainers.grpo.algorithm.GRPO`
sync only the modules they train (:func:`sync_trained`). A sync that names no modules
(restoring a checkpoint, RLlib's start) still copies every module, frozen ones included.

Example:
    >>> class Config:
    ...     policies_to_train = ["orchestrator"]
    >>> sorted(trained_modules(Config(), {"orchestrator", "worker", "__all_modules__"}))
    ['orchestrator']
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from ray.rllib.algorithms.ppo import PPO as RLlibPPO
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core import ALL_MODULES
from typing_extensions import override


def trains(config: Any, module_id: str) -> bool:
    """Whether ``module_id`` is in the algorithm config's ``policies_to_train`` (``None``:
    every module)."""
    which = config.policies_to_train
    if which is None:
        return True
    return which(module_id, None) if callable(which) else module_id in which


def trained_modules(config: Any, modules: Iterable[str]) -> set[str]:
    """The modules of ``modules`` the algorithm trains (``ALL_MODULES`` left out)."""
    return {m for m in modules if m != ALL_MODULES and trains(config, m)}


def sync_trained(
    sync: Callable[..., None], config: Any, modules: Iterable[str], **kwargs: Any
) -> None:
    """``sync(policies=<the trained ones of modules>, **kwargs)``, or nothing when none of
    them is trained: RLlib reads an empty list of policies as "every module"."""
    trained = trained_modules(config, modules)
    if trained:
        sync(policies=trained, **kwargs)


class PPO(RLlibPPO):
    """RLlib's PPO whose syncs after an update copy only trained modules to the env runners."""

    @classmethod
    @override
    def get_default_config(cls) -> PPOConfig:
        return PPOConfig(cls)  # RLlib's default config would build RLlib's class

    @override
    def training_step(self) -> None:
        group = self.env_runner_group
        if group is None:
            return super().training_step()
        sync, patched = group.sync_weights, "sync_weights" in vars(group)

        def trained_only(*args: Any, policies: Any = None, **kwargs: Any) -> None:
            if policies is None:  # every module (RLlib names the modules of an update's sync)
                sync(*args, **kwargs)
            else:
                sync_trained(functools.partial(sync, *args), self.config, policies, **kwargs)

        group.sync_weights = trained_only  # this step's syncs only
        try:
            return super().training_step()
        finally:
            if patched:
                group.sync_weights = sync
            else:
                del group.sync_weights  # the class's method again
