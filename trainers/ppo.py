"""PPO as RLlib runs it, except that an update's weight sync leaves frozen modules out.

RLlib's ``PPO.training_step`` syncs every module named in the learner's results to the env
runners after each update, and a frozen module (not in ``policies_to_train``) shows there
too: RLlib logs its learning rate, entropy coefficient and parameter count. Its weights never
change, so the copy is pure cost — the whole state of a frozen LLM pool every iteration,
and a ``sampler: vllm`` pool reloading it into its engine. :class:`PPO` (what
``algorithm: {name: PPO | MAPPO | IPPO}`` builds) and :class:`~trainers.grpo.algorithm.GRPO`
sync only the modules they train (:meth:`PPO.sync_trained`). A sync that names no modules
(restoring a checkpoint, RLlib's start) still copies every module, frozen ones included.

Where the driver both samples and learns (no remote env runners, a local learner: the
default on a small box), each LLM pool keeps **one copy of its weights**: the local env
runner's module is made of the learner module's tensors
(:meth:`~marl_agents.llm.rl_module.CausalLMModule.share_weights_from`, at setup). For a
trained pool an optimizer step is seen by the sampler at once and the update's sync leaves
that module out (it only counts the new version, which a vLLM sampler loads); a frozen pool
(RLlib builds it on the learner too) is simply not held twice. Before, the sampler held a
second copy of every pool and each update copied a trained pool's whole state into it: for a
0.36B-parameter model on the CPU box 0.4–0.6 s an update (6.4 s the first) and 1.4 GB more
memory per pool.

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


def share_local_weights(algo: Any) -> frozenset[str]:
    """The modules whose local env runner module now uses the learner module's tensors
    (module doc): none unless the driver both samples (no remote env runners) and learns
    (a local learner), and only modules that can share (LLM pools whose tensors match)."""
    group, learners = algo.env_runner_group, algo.learner_group
    if group is None or learners is None or not learners.is_local:
        return frozenset()
    runner = group.local_env_runner
    if group.num_remote_env_runners() > 0 or getattr(runner, "module", None) is None:
        return frozenset()
    shared: set[str] = set()

    def tie(learner: Any) -> None:  # the local learner: called in this process
        for mid in runner.module.keys():  # noqa: SIM118 (MultiRLModule iterates by index)
            if mid not in learner.module:
                continue
            share = getattr(runner.module[mid].unwrapped(), "share_weights_from", None)
            if share is not None and share(learner.module[mid].unwrapped()):
                shared.add(mid)

    learners.foreach_learner(tie)
    return frozenset(shared)


class PPO(RLlibPPO):
    """RLlib's PPO whose syncs after an update copy only trained modules to the env runners,
    and none that the sampler shares with the learner (module doc)."""

    @classmethod
    @override
    def get_default_config(cls) -> PPOConfig:
        return PPOConfig(cls)  # RLlib's default config would build RLlib's class

    @override
    def setup(self, config: Any) -> None:
        super().setup(config)
        #: modules whose sampler holds the learner's own tensors (no sync to copy)
        self.shared_modules = share_local_weights(self)

    def sync_trained(
        self, sync: Callable[..., None], modules: Iterable[str], **kwargs: Any
    ) -> None:
        """``sync(policies=<the trained ones of modules, shared ones left out>, **kwargs)``, or
        nothing when none is left: RLlib reads an empty list of policies as "every module".
        A shared module only counts its new weights (a vLLM sampler reloads them)."""
        trained = trained_modules(self.config, modules)
        for mid in trained & self.shared_modules:
            self.env_runner_group.local_env_runner.module[mid].unwrapped().weights_moved()
        rest = trained - self.shared_modules
        if rest:
            sync(policies=rest, **kwargs)

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
                self.sync_trained(functools.partial(sync, *args), policies, **kwargs)

        group.sync_weights = trained_only  # this step's syncs only
        try:
            return super().training_step()
        finally:
            if patched:
                group.sync_weights = sync
            else:
                del group.sync_weights  # the class's method again
