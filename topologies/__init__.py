"""The topology IR: agent graphs from LangGraph or named generators."""

from topologies.generators import (
    TeamState,
    chain,
    from_spec,
    merge_routes,
    mesh,
    single,
    star,
    to_langgraph,
    tree,
)
from topologies.langgraph_import import from_langgraph
from topologies.topology import EDGE_KINDS, END, NODE_KINDS, ROLES, START, Topology, TopologyError
from topologies.validate import validate

__all__ = [
    "EDGE_KINDS",
    "END",
    "NODE_KINDS",
    "ROLES",
    "START",
    "TeamState",
    "Topology",
    "TopologyError",
    "chain",
    "from_langgraph",
    "from_spec",
    "merge_routes",
    "mesh",
    "single",
    "star",
    "to_langgraph",
    "tree",
    "validate",
]
