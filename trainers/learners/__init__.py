"""Learners: the lean learner step (:mod:`~trainers.learners.lean`), the PPO batch built
with credit and value normalisation, the credit learner, value-target normalisation, and the
categorical math on logits shared with the sampler.
"""
