"""The project's error family: :class:`MarlError`, the base of every error marl raises on bad
input or a failed run.

It lives in the lowest layer so that every package can derive from it. Each error also keeps
its builtin base (``class ConfigError(MarlError, ValueError)``), so ``except ValueError`` goes
on catching what it caught; ``except MarlError`` catches them all, and
:func:`trainers.run.outcome.describe_error` recognises the project's errors by this type.

The subfamilies, by layer (each message names the failing thing and the fix):

* topologies: :class:`~topologies.topology.TopologyError` (a graph that cannot run),
  :class:`~topologies.imports.ImportRefError` (a ``module:attr`` reference),
  ``topologies.cli.LoadError`` (a CLI target);
* scenarios: :class:`~scenarios.base.ScenarioError` (bad scenario arguments; its
  ``BridgeError`` for a graph that cannot be stepped as declared), ``JudgeError`` and
  ``ToolError`` (a reward judge or a tool failed), ``ToolTimeout`` and ``CallTimeout`` (a tool
  call or an env call ran past its limit);
* marl_agents: ``PoolError`` (a pool specification; its ``CheckpointError`` and
  ``MemoryBudgetError``), ``SamplingConfigError`` (tokens the learner cannot score),
  ``StaleWeightsError`` (an inference engine holding other weights);
* trainers: ``ConfigError`` (an experiment config; its ``ClusterError`` and
  ``RolloutDumpError``), ``CreditError``, ``EpisodeMetricsError``, ``RunFailed`` (every episode
  failed; its ``OutputError``: the run directory cannot be written).

Internal control-flow signals (an episode's timeout or abort thrown into a running graph, the
fast replay's fallbacks) are not in the family: they never reach a user, and several are
``BaseException`` on purpose so that a node's ``except Exception`` cannot swallow them.
``tests/test_errors.py`` lists them and checks that every other exception class is a
:class:`MarlError`.
"""

from __future__ import annotations

__all__ = ["MarlError"]


class MarlError(Exception):
    """An error marl raises on bad input or a failed run; the message names the fix.

    ``except MarlError`` catches every such error (config, topology, scenario, bridge, pool,
    checkpoint, credit, cluster, sampling, judge/tool and run failures). Subclasses also derive
    from the builtin they always were (``ValueError``, ``RuntimeError``, ``TimeoutError``).
    """
