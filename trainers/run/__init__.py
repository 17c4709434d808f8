"""The run: the training loop (:func:`~trainers.run.loop.train`), run directories and
checkpoints, metric rows, the episode log, display, failures, exact resume, transcripts and
Hugging Face exports.
"""
