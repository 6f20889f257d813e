"""Task graphs from JSON (`autoplace solve`): what a user writes, and every mistake named."""

from __future__ import annotations

import copy
import json
import math

import pytest

from autoplace.config import Solve
from autoplace.errors import GraphError, InfeasibleError
from autoplace.formats.graph import load_graph_file, problem_from_dict
from autoplace.pipeline import solve_graph
from autoplace.simulate import validate

GRAPH = {
    "name": "fork",
    "devices": [{"name": "g0", "type": "G", "memory_bytes": 1000},
                {"name": "g1", "type": "G", "memory_bytes": 1000}],
    "default_link": {"bandwidth_bytes_per_s": 100.0, "latency_s": 0.0},
    # Listed out of order on purpose: d before its producers.
    "nodes": [{"name": "d", "compute_s": {"G": 1}},
              {"name": "a", "compute_s": {"G": 1}, "memory_bytes": 100},
              {"name": "b", "compute_s": {"G": 10}},
              {"name": "c", "compute_s": {"G": 10, "g0": None}}],
    "edges": [{"src": "a", "dst": "b", "bytes": 100}, {"src": "a", "dst": "c", "bytes": 100},
              {"src": "b", "dst": "d", "bytes": 100}, {"src": "c", "dst": "d", "transfer_s": 3}],
}


def _with(**changes) -> dict:
    data = copy.deepcopy(GRAPH)
    data.update(changes)
    return data


def test_a_graph_file_becomes_a_sorted_problem(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GRAPH))
    p = load_graph_file(path)
    names = [n.name for n in p.graph.nodes]
    assert names.index("a") < names.index("b") < names.index("d")
    assert p.allowed["c"] == ("g1",)
    assert p.graph.node("a").param_bytes == 100
    assert p.graph.node("a").output_bytes == 100
    assert p.costs.of("c", "g0") == math.inf
    assert [e.transfer_s for e in p.graph.edges if e.src == "c"] == [3.0]


def test_solving_a_graph_file_gives_a_checked_plan():
    p = problem_from_dict(GRAPH)
    plan = solve_graph(p, Solve(time_limit_s=5))
    assert validate(p, plan.schedule) == []
    # c must run on g1. a, b on g0 and c, d on g1: a 0-1, b 1-11 (+1 s copy), c 2-12, d 12-13.
    assert plan.makespan_s == pytest.approx(13.0)
    assert plan.to_dict()["edges"][-1]["transfer_s"] == 3.0
    nodes = {n["name"]: n for n in plan.to_dict()["nodes"]}
    assert nodes["c"]["compute_s"]["g0"] is None


@pytest.mark.parametrize(("change", "message"), [
    ({"edges": GRAPH["edges"] + [{"src": "d", "dst": "a", "bytes": 1}]},
     r"cycle: a -> b -> d -> a"),
    ({"edges": [{"src": "a", "dst": "zz", "bytes": 1}]}, r"unknown node 'zz'"),
    ({"nodes": [{"name": "a", "compute_s": {"G": -1}}], "edges": []},
     r"graph: nodes\[0\]\.compute_s\.G: -1 is less than the minimum of 0"),
    ({"nodes": [{"name": "a", "compute_s": {"G": True}}], "edges": []},
     r"nodes\[0\]\.compute_s\.G: True is not of type 'number', 'null'"),
    ({"nodes": [{"name": "a", "compute_s": {"G": float("inf")}}], "edges": []},
     r"nodes\[0\]\.compute_s\.G: inf is greater than the maximum"),
    ({"edges": [{"src": "a", "dst": "b", "bytes": "4 KiB"}]},
     r"edges\[0\]\.bytes: '4 KiB' is not of type 'number'"),
    ({"nodes": [{"name": "a", "compute_s": {"H": 1}}], "edges": []},
     r"'a' has no compute time for device"),
    ({"nodes": [{"name": "a"}], "edges": []}, r"nodes\[0\]: 'compute_s' is a required property"),
    ({"nodes": [{"name": "a", "compute_s": {"G": 1}, "pinned": "g9"}], "edges": []},
     r"'a' is pinned to unknown device 'g9'"),
    ({"nodes": [{"name": "a", "compute_s": {"G": 1}, "memroy_bytes": 1}], "edges": []},
     r"nodes\[0\]: Additional properties are not allowed \('memroy_bytes' was unexpected\)"),
    ({"default_link": {"bandwidth_bytes_per_s": 0}},
     r"default_link\.bandwidth_bytes_per_s: 0 is less than or equal to the minimum of 0"),
    ({"nodes": [{"name": "a", "compute_s": {"G": 1}}, {"name": "a", "compute_s": {"G": 1}}],
      "edges": []}, r"node name 'a' appears twice"),
    ({"devices": []}, r"devices: \[\] should be non-empty"),
    ({"nodes": []}, r"nodes: \[\] should be non-empty"),
    ([1, 2], r"the top level: \[1, 2\] is not of type 'object'"),
])
def test_bad_graphs_are_named(change, message):
    with pytest.raises(GraphError, match=message):
        problem_from_dict(_with(**change) if isinstance(change, dict) else change)


def test_a_node_no_device_can_hold_is_named():
    data = _with(nodes=[{"name": "a", "compute_s": {"G": 1}, "memory_bytes": 1500}], edges=[])
    with pytest.raises(InfeasibleError, match=r"node 'a' needs.*short"):
        solve_graph(problem_from_dict(data), Solve(time_limit_s=2))


def test_a_colocation_group_that_cannot_fit_together_is_named():
    data = _with(nodes=[{"name": "a", "compute_s": {"G": 1}, "memory_bytes": 600},
                        {"name": "b", "compute_s": {"G": 1}, "memory_bytes": 600}],
                 edges=[], colocate=[["a", "b"]])
    with pytest.raises(InfeasibleError, match=r"colocation group \['a', 'b'\].*short"):
        solve_graph(problem_from_dict(data), Solve(time_limit_s=2))


def test_not_json_and_missing_file_are_clear(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nodes: ")
    with pytest.raises(GraphError, match="not valid JSON"):
        load_graph_file(bad)
    with pytest.raises(Exception, match="does not exist"):
        load_graph_file(tmp_path / "nope.json")


def test_autoplace_solve_writes_a_throughput_plan(tmp_path, capsys):
    from autoplace.cli import main

    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(GRAPH))
    out = tmp_path / "out"
    code = main(["solve", str(graph), "--objective", "throughput", "--time-limit", "5",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    plan = json.loads((out / "plan.json").read_text())
    assert plan["objective"] == "throughput"
    assert plan["max_load_s"] == pytest.approx(max(plan["loads"].values()))
    assert plan["lower_bound_s"] <= plan["max_load_s"] + 1e-9
    assert (out / "report.html").exists()


def test_autoplace_solve_on_a_bad_graph_exits_2_and_writes_nothing(tmp_path, capsys):
    from autoplace.cli import main

    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(_with(edges=GRAPH["edges"] + [{"src": "d", "dst": "a"}])))
    out = tmp_path / "out"
    assert main(["solve", str(graph), "--out", str(out)]) == 2
    assert "cycle" in capsys.readouterr().err
    assert not out.exists()
