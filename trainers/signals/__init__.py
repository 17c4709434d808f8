"""What episodes and iterations report, on the env runners and the driver alike: the episode
metrics callback and its journal, the reward-hacking and collapse monitors, the curriculum's
task schedule, per-source reward normalisation and the phase timers. Imports only
:mod:`trainers.configs` (and the packages below ``trainers``).
"""
