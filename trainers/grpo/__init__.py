"""GRPO: the loss (:mod:`~trainers.grpo.loss`), the learner, its connector pieces, turn
credit, asynchronous sampling, the lean learner step and the algorithm. Its settings are
:mod:`trainers.configs.grpo`; the env side is :mod:`trainers.sampling.grouped_env`.
"""
