"""The topology IR: agent graphs from LangGraph or named generators."""

from topologies.generators import TeamState, chain, from_spec, mesh, single, star, to_langgraph, tree
from topologies.topology import END, START, Topology, TopologyError

__all__ = [
    "END",
    "START",
    "TeamState",
    "Topology",
    "TopologyError",
    "chain",
    "from_spec",
    "mesh",
    "single",
    "star",
    "to_langgraph",
    "tree",
]
