"""The IR refuses graphs that no stage could make sense of, naming the offending edge (and the
cycle, when there is one); ``graphs`` sorts and names cycles; ``OpGraph.to_networkx``."""

from __future__ import annotations

import networkx as nx
import pytest

from autoplace.errors import GraphError
from autoplace.ir import Edge, OpGraph, OpNode
from autoplace.ir.graphs import find_cycle, longest_path_length, topological_order


def _graph(edges: list[Edge]) -> OpGraph:
    return OpGraph(nodes=(OpNode("a", output_bytes=100), OpNode("b", output_bytes=10)),
                   edges=tuple(edges))


def test_an_edge_cannot_carry_more_than_its_source_outputs():
    with pytest.raises(GraphError, match=r"'a' -> 'b' carries 101 bytes.*only 100"):
        _graph([Edge("a", "b", 101)])


def test_a_repeated_edge_is_refused():
    with pytest.raises(GraphError, match=r"'a' -> 'b' appears twice"):
        _graph([Edge("a", "b", 10), Edge("a", "b", 20)])


def test_a_backward_edge_names_the_cycle_or_order():
    with pytest.raises(GraphError, match="goes backwards"):
        _graph([Edge("b", "a", 1)])


def test_a_cycle_is_named_node_by_node():
    with pytest.raises(GraphError, match=r"goes backwards.*form no cycle: sort the node list"):
        _graph([Edge("b", "a", 1)])
    with pytest.raises(GraphError, match=r"'b' -> 'a' goes backwards.*cycle: b -> a -> b\)"):
        _graph([Edge("a", "b", 1), Edge("b", "a", 1)])


def test_topological_order_is_stable_and_names_a_cycle():
    assert topological_order(["c", "b", "a"], [("b", "a")]) == ["c", "b", "a"]
    assert topological_order(["a", "b", "c"], [("c", "a")]) == ["b", "c", "a"]
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "a")]
    # Named as the graph file reader always has: ending at the node listed first.
    with pytest.raises(GraphError, match=r"cycle: a -> b -> d -> a; a task graph must be"):
        topological_order(["d", "a", "b", "c"], edges)
    assert find_cycle(nx.DiGraph([("x", "y"), ("y", "z"), ("z", "y")])) == ["z", "y"]


def test_colocation_groups_that_overlap_merge_in_node_order():
    nodes = tuple(OpNode(n) for n in "abcde")
    graph = OpGraph(nodes=nodes, edges=(), colocate=(("d", "b"), ("e", "d"), ("c",)))
    assert graph.colocation_of == {"a": ("a",), "b": ("b", "d", "e"), "c": ("c",),
                                   "d": ("b", "d", "e"), "e": ("b", "d", "e")}


def test_to_networkx_keeps_nodes_edges_and_order_and_is_built_once():
    graph = _graph([Edge("a", "b", 10)])
    digraph = graph.to_networkx()
    assert list(digraph) == ["a", "b"] and digraph.nodes["a"]["node"] is graph.nodes[0]
    assert digraph.edges["a", "b"]["bytes"] == 10
    assert graph.to_networkx() is digraph
    with pytest.raises(nx.NetworkXError, match="Frozen"):
        digraph.add_edge("b", "a")


def test_longest_path_weighs_nodes():
    # a (1) -> b (5) -> d (1) is 7; a -> c (2) -> d is 4; e (8) alone is 8.
    weights = {"a": 1, "b": 5, "c": 2, "d": 1}
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    assert longest_path_length(weights, edges) == 7
    assert longest_path_length({**weights, "e": 8}, edges) == 8
    assert longest_path_length({}, []) == 0
