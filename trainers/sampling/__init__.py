"""Sampling on the env runners: the batched env runner (one forward per module per step over
all acting rows), per-row action draws, episode building, one module forward, the GRPO group
schedule env and the runner's metrics. It imports no learner code (only the shared
categorical math of :mod:`trainers.learners.categorical`).
"""
