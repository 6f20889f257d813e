"""The IR refuses graphs that no stage could make sense of, naming the offending edge."""

from __future__ import annotations

import pytest

from autoplace.errors import GraphError
from autoplace.ir import Edge, OpGraph, OpNode


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
