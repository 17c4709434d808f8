"""Training: experiment configs to RLlib, credit assignment, sweeps, evaluation."""
