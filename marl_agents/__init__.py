"""Policies: torch RLModules, scripted and frozen agents, LLM backends, agent pools."""
