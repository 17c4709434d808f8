"""``mlp`` pools' ``model.input_norm``: a LayerNorm in front of the actor and the critic
(MAPPO's ``use_feature_normalization``), with a local critic and with a centralised one
(training, resuming and evaluating with it: ``tests/test_mappo.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from configs import tiny_config
from ray.rllib.core.columns import Columns

from marl_agents.critics import CRITIC_OBS
from trainers.configs.typed import ConfigError

NORMED = {"model": {"type": "mlp", "hidden": [16], "input_norm": True}}


def spec(tmp_path: Path, algorithm: str, model: dict[str, Any]) -> tuple[Any, Any, int]:
    """The orchestrator's module spec in a tiny ``algorithm`` run with ``model``, its pool, and
    its critic column's width (0: its own critic)."""
    from marl_agents.modules import module_spec
    from trainers.plan import resolve

    cfg = tiny_config(tmp_path, algorithm=algorithm, pools={"orchestrator": {"model": model}})
    plan = resolve(cfg)
    pool = plan.pools["orchestrator"]
    dim = plan.critic_dims.get("orchestrator", 0)
    return module_spec(pool, plan.env, dim), pool, dim


@pytest.mark.parametrize(
    ("algorithm", "norms"), [("PPO", [True]), ("MAPPO", [True, False])], ids=["PPO", "MAPPO"]
)
def test_the_policy_and_the_values_see_each_input_vector_standardised(
    tmp_path: Path, algorithm: str, norms: list[bool]
) -> None:
    """With input_norm, scaling and shifting an observation (or a critic input) changes
    neither the action logits nor the values; without it (MAPPO's module is ours either way),
    both change."""
    for norm in norms:
        model = {**NORMED["model"], "input_norm": norm}
        built, pool, dim = spec(tmp_path, algorithm, model)
        module = built.build()
        assert any(isinstance(m, torch.nn.LayerNorm) for m in module.modules()) == norm
        obs = torch.randn(5, pool.observation_space.shape[0])
        batch = {Columns.OBS: obs, CRITIC_OBS: torch.randn(5, dim)} if dim else {Columns.OBS: obs}
        moved = {k: 3.0 * v + 0.7 for k, v in batch.items()}
        with torch.no_grad():
            logits = [
                module.forward_inference(b)[Columns.ACTION_DIST_INPUTS] for b in (batch, moved)
            ]
            values = [module.compute_values(b) for b in (batch, moved)]
        assert torch.allclose(logits[0], logits[1], atol=1e-5) == norm
        assert torch.allclose(values[0], values[1], atol=1e-5) == norm
        assert values[0].shape == (5,)


def test_without_input_norm_an_mlp_pool_keeps_rllibs_default_module(tmp_path: Path) -> None:
    from marl_agents.modules import CentralCriticMLPModule, MLPModule

    plain, _, _ = spec(tmp_path, "PPO", {"type": "mlp", "hidden": [16]})
    assert plain.module_class is None  # the algorithm's own default module fills it in
    assert spec(tmp_path, "PPO", NORMED["model"])[0].module_class is MLPModule
    assert spec(tmp_path, "MAPPO", NORMED["model"])[0].module_class is CentralCriticMLPModule


def test_bad_input_norm_and_appo_are_refused_with_the_fix(tmp_path: Path) -> None:
    from trainers.plan import resolve

    bad = {"orchestrator": {"model": {"type": "mlp", "input_norm": "yes"}}}
    with pytest.raises(ConfigError, match=r"model\.input_norm must be true or false, got 'yes'"):
        resolve(tiny_config(tmp_path, pools=bad))
    appo = tiny_config(tmp_path, algorithm="APPO", pools={"orchestrator": NORMED})
    with pytest.raises(ConfigError, match=r"input_norm .* no target network for APPO"):
        resolve(appo)
