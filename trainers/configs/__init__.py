"""Configuration: the typed-config engine (:mod:`~trainers.configs.typed`, which knows no
config kinds) below one schema module per config family: algorithms, GRPO, credit,
curriculum, monitors, rewards, and the experiment that holds them all. Nothing here imports
Ray or torch, nor any other part of ``trainers``.
"""
