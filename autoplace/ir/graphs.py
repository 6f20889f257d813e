"""Graph helpers on networkx that more than one stage needs: a stable topological order, a
cycle named node by node, and the longest path when nodes (not edges) take time.

Read ``topological_order`` (what the graph file reader sorts its nodes with), ``find_cycle``,
then ``longest_path_length`` (the lower bound's critical path, and the STG benchmarks').
``OpGraph.to_networkx`` (in ``ir``) gives the IR's graph as an ``nx.DiGraph``; this module
never imports the IR, so the IR can use it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

import networkx as nx

from autoplace.errors import GraphError

__all__ = ["cycle_text", "find_cycle", "longest_path_length", "topological_order"]

N = TypeVar("N", bound=Hashable)


def find_cycle(graph: nx.DiGraph) -> list | None:
    """The nodes of one cycle of ``graph``, ending at the one added to the graph first (as the
    graph file reader has always named them: ``a -> b -> d -> a`` for nodes listed ``d, a, b``);
    ``None`` when the graph is acyclic."""
    try:
        edges = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return None
    cycle = [u for u, _ in edges]
    position = {v: i for i, v in enumerate(graph)}
    first = min(range(len(cycle)), key=lambda i: position[cycle[i]])
    return cycle[first + 1:] + cycle[:first + 1]


def cycle_text(cycle: Sequence) -> str:
    """``a -> b -> a``: a cycle's nodes, back to the first."""
    return " -> ".join(str(v) for v in [*cycle, cycle[0]])


def topological_order(nodes: Sequence[N], edges: Iterable[tuple[N, N]]) -> list[N]:
    """``nodes`` in topological order along ``edges``, stable: of the nodes ready at any point,
    the one listed first in ``nodes`` comes first (Kahn's algorithm with that priority). A
    cycle raises ``GraphError`` naming it: ``the graph has a cycle: a -> b -> a; ...``. Every
    edge joins two of ``nodes``."""
    graph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from(edges)
    position = {v: i for i, v in enumerate(nodes)}
    try:
        return list(nx.lexicographical_topological_sort(graph, key=position.__getitem__))
    except nx.NetworkXUnfeasible:
        cycle = find_cycle(graph)
        assert cycle is not None, "networkx found no topological order but no cycle either"
        raise GraphError(f"the graph has a cycle: {cycle_text(cycle)}; a task graph must be "
                         "acyclic") from None


def longest_path_length(node_weight: Mapping[N, float], edges: Iterable[tuple[N, N]]) -> float:
    """The heaviest path of the DAG ``edges`` over the nodes of ``node_weight``, a path weighing
    the sum of its nodes' weights (edges weigh nothing); the int 0 when every path weighs 0.

    networkx weighs edges, not nodes: each edge here weighs its source, and an edge from every
    node to one extra sink adds the path's last node. The sums run in path order from 0, as a
    walk in topological order adds them, so the result is the same float."""
    sink = object()
    weighted = nx.DiGraph()
    weighted.add_weighted_edges_from((u, v, node_weight[u]) for u, v in edges)
    weighted.add_weighted_edges_from((v, sink, w) for v, w in node_weight.items())
    return nx.dag_longest_path_length(weighted)
