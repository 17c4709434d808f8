"""The topology IR: agent graphs from LangGraph or named generators.

Names load on first use (:mod:`topologies.lazy`): ``import topologies`` does not load LangGraph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topologies.lazy import export_lazily

if TYPE_CHECKING:  # the exports (topologies.lazy): loaded on first use
    from topologies.errors import MarlError as MarlError
    from topologies.generators import TeamState as TeamState
    from topologies.generators import chain as chain
    from topologies.generators import from_spec as from_spec
    from topologies.generators import merge_routes as merge_routes
    from topologies.generators import mesh as mesh
    from topologies.generators import single as single
    from topologies.generators import star as star
    from topologies.generators import to_langgraph as to_langgraph
    from topologies.generators import tree as tree
    from topologies.langgraph_import import from_langgraph as from_langgraph
    from topologies.topology import EDGE_KINDS as EDGE_KINDS
    from topologies.topology import END as END
    from topologies.topology import MAX_AGENTS as MAX_AGENTS
    from topologies.topology import MAX_CHANNELS as MAX_CHANNELS
    from topologies.topology import NODE_KINDS as NODE_KINDS
    from topologies.topology import ROLES as ROLES
    from topologies.topology import START as START
    from topologies.topology import Topology as Topology
    from topologies.topology import TopologyError as TopologyError
    from topologies.validate import validate as validate

__all__ = export_lazily(__name__)
