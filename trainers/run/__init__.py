"""The run: the training loop (:func:`~trainers.run.loop.train`), run directories and
checkpoints, metric rows, the episode log, display, failures, exact resume, transcripts and
Hugging Face exports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topologies.lazy import export_lazily

if TYPE_CHECKING:  # the exports (topologies.lazy): loaded on first use
    from trainers.run.loop import train as train
    from trainers.run.outcome import RunFailed as RunFailed
    from trainers.run.outcome import TrainResult as TrainResult

__all__ = export_lazily(__name__)
