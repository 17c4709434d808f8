"""The lean PPO learner's array batch (``trainers/learners/batch.py``) against RLlib's learner
connector pipeline on real sampled episodes: the same modules in the same order, the same
columns in the same order, dtypes, shapes and values (advantages and value targets included),
for cut and finished chunks, credit with per-agent normalisation, scripted pools, RLlib's own
sampler, and a recurrent pool (which falls back to RLlib's pieces). One update's weights are
compared in ``tests/test_lean_learner.py``."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from configs import tiny_config

from trainers.learners.batch import ArrayPPOPipeline
from trainers.learners.lean import LeanPPOLearner

pytestmark = pytest.mark.usefixtures("ray_session")


class PiecesLearner(LeanPPOLearner):
    """The lean learner on RLlib's connector pieces."""

    array_batch = False


def _batches(algo: Any, ref: Any, episodes: list[Any]) -> tuple[Any, Any]:
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    blob = pickle.dumps([e.get_state() for e in episodes])
    out = []
    for a in (algo, ref):
        copies = [MultiAgentEpisode.from_state(s) for s in pickle.loads(blob)]
        for c, e in zip(copies, episodes, strict=True):
            c.__class__ = type(e)  # the sampler's episode class (agent order)
        learner = a.learner_group._learner
        out.append(learner._make_batch_if_necessary(TrainingData(episodes=copies)))
    return out[0], out[1]


def assert_same_batch(got: Any, want: Any) -> None:
    assert list(got.policy_batches) == list(want.policy_batches)
    assert got.env_steps() == want.env_steps()
    for mid, cols in want.policy_batches.items():
        mine = got.policy_batches[mid]
        assert list(mine.keys()) == list(cols.keys()), mid
        for key, value in cols.items():
            _assert_same(mine[key], value, (mid, key))


def _assert_same(got: Any, want: Any, where: tuple[str, ...]) -> None:
    if isinstance(want, dict):  # nested columns (a recurrent module's state_in)
        assert isinstance(got, dict) and list(got) == list(want), where
        for k, v in want.items():
            _assert_same(got[k], v, (*where, k))
        return
    assert isinstance(got, torch.Tensor), where
    assert got.dtype == want.dtype, where
    assert torch.equal(got, want), where


GRU = {"worker": {"model": {"type": "gru", "gru_size": 8}}}
SCRIPTED = {"worker": {"model": {"type": "scripted", "policy": "delegate.scripted_worker"}}}
CREDIT = {"credit": {"method": "loo", "normalize": True, "workers": 1}}
#: RLlib's own GAE piece (value-target normalisation off; on, the GAE piece is ValueNormGAE)
RAW_TARGETS = {
    "algorithm": {
        "train_batch_size": 128,
        "minibatch_size": 64,
        "num_epochs": 1,
        "value_norm": False,
    }
}


@pytest.mark.parametrize(
    ("sections", "covered"),
    [
        pytest.param({}, True, id="mlp"),
        pytest.param(CREDIT, True, id="credit"),
        pytest.param(RAW_TARGETS, True, id="no-value-norm"),
        pytest.param({"pools": SCRIPTED}, True, id="scripted"),
        pytest.param({"episodes": {"sampler": "rllib"}}, True, id="rllib-sampler"),
        pytest.param({"pools": GRU}, False, id="gru-falls-back"),
    ],
)
def test_array_batch_equals_rllibs_pipeline(
    tmp_path: Path, sections: dict[str, Any], covered: bool
) -> None:
    from trainers.algo import to_algorithm_config

    cfg = tiny_config(tmp_path, **sections)
    algo = to_algorithm_config(cfg).build_algo()
    ref = to_algorithm_config(cfg).learners(learner_class=PiecesLearner).build_algo()
    try:
        pipeline = algo.learner_group._learner._learner_connector
        assert isinstance(pipeline, ArrayPPOPipeline)
        pieces = ref.learner_group._learner._learner_connector.connectors
        assert [type(p) for p in pipeline.connectors] == [type(p) for p in pieces]
        runner = algo.env_runner_group.local_env_runner
        whole = "credit" in sections or sections.get("pools") is GRU
        cut = done = 0
        for _ in range(3):
            episodes = runner.sample(explore=True) if whole else runner.sample(num_timesteps=60)
            cut += sum(not e.is_done for e in episodes)
            done += sum(e.is_done for e in episodes)
            got, want = _batches(algo, ref, episodes)
            assert_same_batch(got, want)
        assert done and (cut or whole)
        assert pipeline.fallbacks == (0 if covered else 3)
    finally:
        algo.stop()
        ref.stop()


def test_install_leaves_other_pipelines_alone() -> None:
    from ray.rllib.connectors.learner import GeneralAdvantageEstimation
    from ray.rllib.connectors.learner.learner_connector_pipeline import (
        LearnerConnectorPipeline,
    )

    from trainers.learners.batch import install

    pipeline = LearnerConnectorPipeline(
        connectors=[GeneralAdvantageEstimation(gamma=0.99, lambda_=0.95)]
    )
    assert install(pipeline) is None
    assert install(None) is None


def test_pieces_added_after_install_fall_back(tmp_path: Path) -> None:
    """A piece appended to the pipeline later (not of RLlib's default shape): RLlib's run of
    the pieces, the new one included. Agent episodes whose columns differ are not covered."""
    from ray.rllib.connectors.connector_v2 import ConnectorV2
    from ray.rllib.core.columns import Columns

    from trainers.algo import to_algorithm_config
    from trainers.learners.batch import _covered

    seen: list[int] = []

    class Count(ConnectorV2):
        def __call__(self, *, batch: Any, episodes: list[Any], **kwargs: Any) -> Any:
            seen.append(len(episodes))
            return batch

    cfg = tiny_config(tmp_path)
    algo = to_algorithm_config(cfg).build_algo()
    ref = to_algorithm_config(cfg).learners(learner_class=PiecesLearner).build_algo()
    try:
        pipeline = algo.learner_group._learner._learner_connector
        pipeline.append(Count())
        ref.learner_group._learner._learner_connector.append(Count())
        episodes = algo.env_runner_group.local_env_runner.sample(num_timesteps=60)
        got, want = _batches(algo, ref, episodes)
        assert_same_batch(got, want)
        assert pipeline.fallbacks == 1 and seen == [len(episodes)] * 2
        # agent episodes of one module with different columns: not covered, nothing touched
        module = algo.learner_group._learner.module
        assert _covered(module, {}, episodes) is not None
        sa = next(iter(episodes[0].agent_episodes.values()))
        ids = [e.id_ for e in episodes]
        sa.extra_model_outputs["extra"] = sa.extra_model_outputs[Columns.ACTION_LOGP]
        assert _covered(module, {}, episodes) is None
        assert [e.id_ for e in episodes] == ids
    finally:
        algo.stop()
        ref.stop()
