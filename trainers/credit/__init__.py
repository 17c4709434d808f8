"""Credit assignment: the estimators (:mod:`~trainers.credit.values`: leave-one-out, Shapley),
the settings checked against a team, the replay trie and workers that value coalitions, and
the learner connector that rewrites rewards before GAE. The learner that normalises credit
per agent is :mod:`trainers.learners.credit_ppo`.
"""
