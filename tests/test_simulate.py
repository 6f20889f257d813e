"""The simulator against schedules worked out by hand (see tests/zoo.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import zoo

from autoplace.errors import GraphError
from autoplace.ir import Costs, Edge, Placement
from autoplace.simulate import simulate, validate


def test_single_device_runs_nodes_back_to_back():
    p = zoo.fork_join(zoo.cluster(2))
    s = simulate(p, Placement(device_of=dict.fromkeys("abcd", "d0")))
    assert s.makespan_s == pytest.approx(22.0)
    assert s.transfers == ()
    assert validate(p, s) == []


def test_split_branches_pay_transfers():
    p = zoo.fork_join(zoo.cluster(2))
    s = simulate(p, Placement(device_of={"a": "d0", "b": "d0", "c": "d1", "d": "d1"}))
    # a 0..1, b 1..11 on d0; c 2..12 on d1 (a's output arrives at 2); b's output arrives at 12.
    assert s.start_s["c"] == pytest.approx(2.0)
    assert s.start_s["d"] == pytest.approx(12.0)
    assert s.makespan_s == pytest.approx(13.0)
    assert {(t.src, t.dst_device) for t in s.transfers} == {("a", "d1"), ("b", "d1")}
    assert validate(p, s) == []


def test_explicit_order_is_followed_and_deadlock_detected():
    p = zoo.fork_join(zoo.cluster(2))
    device_of = dict.fromkeys("abcd", "d0")
    s = simulate(p, Placement(device_of=device_of, order={"d0": ("a", "c", "b", "d"), "d1": ()}))
    assert s.start_s["c"] < s.start_s["b"]
    with pytest.raises(GraphError, match="deadlock"):
        simulate(p, Placement(device_of=device_of, order={"d0": ("b", "a", "c", "d"), "d1": ()}))


def test_memory_peak_counts_params_and_live_activations():
    # chain a -> b -> c, 10 param bytes each, every output 100 bytes, all on d0.
    p = zoo.chain(zoo.cluster(1, memory_bytes=10_000), params=10)
    s = simulate(p, Placement(device_of=dict.fromkeys("abc", "d0")))
    assert s.resident_bytes["d0"] == 30
    # While b runs, a's output (100) and b's output (100) are live; a's is freed when b ends.
    # c is the model output and stays: peak = 30 + 200.
    assert s.peak_bytes["d0"] == 230
    assert s.feasible


def test_memory_over_capacity_is_reported():
    p = zoo.chain(zoo.cluster(1, memory_bytes=100), params=10)
    s = simulate(p, Placement(device_of=dict.fromkeys("abc", "d0")))
    assert not s.feasible
    assert s.over_capacity == {"d0": 130}
    assert any("over its capacity" in v for v in validate(p, s))


def test_received_copy_occupies_destination_memory():
    p = zoo.chain(zoo.cluster(2, memory_bytes=10_000))
    s = simulate(p, Placement(device_of={"a": "d0", "b": "d1", "c": "d1"}))
    # On d1 b and c form one emitted segment, which holds its input (a's copy, 100) until it
    # returns: while c runs, a's copy, b's output (100, c reads it) and c's (10) are live.
    assert s.peak_bytes["d1"] == 210


def test_a_value_read_across_an_emitted_cut_lives_until_the_later_segment_returns():
    # h (1 s) -> a (2 s) -> c (1 s) -> d (1 s) on d0, h -> b (1 s) -> c with b on d1; copies
    # take no time. h 0..1, b 1..2, a 1..3, c 3..4, d 4..5. The emitted model cuts d0's work
    # into [h] (h is read on d1), [a] and [c, d] (c reads b from d1): a (100 bytes) is an input
    # of [c, d] and is held until it returns, so while d runs d0 holds a, b's copy (100), c (100)
    # and d's output (1000): 1300. One segment [a, c, d] would free a after c: 1210 (with h).
    p = zoo.problem([("h", 1, 0), ("b", 1, 0), ("a", 2, 0), ("c", 1, 0), ("d", 1, 0)],
                    [("h", "b", 10), ("h", "a", 10), ("a", "c", 100), ("b", "c", 100),
                     ("c", "d", 100)],
                    zoo.cluster(2, memory_bytes=10_000, bandwidth=1e30),
                    outputs=("d",), output_bytes={"d": 1000})
    s = simulate(p, Placement(device_of={"h": "d0", "b": "d1", "a": "d0", "c": "d0", "d": "d0"}))
    assert [s.start_s[n] for n in "hbacd"] == pytest.approx([0, 1, 1, 3, 4])
    assert s.peak_bytes["d0"] == 1300
    assert validate(p, s) == []


def test_zero_duration_node_counts_its_output_and_inputs():
    # a (1 s) -> b (0 s): b reads a's 100 bytes and writes 300 that nobody reads. At t = 1 both
    # buffers exist at once, however briefly: the peak is 400 plus the 20 resident bytes.
    p = zoo.problem([("a", 1, 10), ("b", 0, 10)], [("a", "b", 100)], zoo.cluster(1),
                    output_bytes={"b": 300})
    s = simulate(p, Placement(device_of={"a": "d0", "b": "d0"}))
    assert s.peak_bytes["d0"] == 420
    assert all(level >= s.resident_bytes["d0"] for _, level in s.memory_timeline["d0"])
    assert s.memory_timeline["d0"][-1][1] == s.resident_bytes["d0"]


def test_memory_timeline_never_drops_below_resident_bytes():
    # Zero-time nodes and transfers in a row, across two devices with free links.
    p = zoo.problem([("a", 0, 5), ("b", 0, 5), ("c", 0, 5), ("d", 1, 5)],
                    [("a", "b", 100), ("b", "c", 50), ("a", "c", 70), ("c", "d", 10)],
                    zoo.cluster(2, bandwidth=1e30))
    for device_of in ({"a": "d0", "b": "d1", "c": "d0", "d": "d1"}, dict.fromkeys("abcd", "d0")):
        s = simulate(p, Placement(device_of=device_of))
        for dev, points in s.memory_timeline.items():
            assert all(level >= s.resident_bytes[dev] for _, level in points), dev
            assert s.peak_bytes[dev] >= s.resident_bytes[dev] + 100 * (dev == device_of["b"])


def test_validate_catches_a_tampered_schedule():
    p = zoo.fork_join(zoo.cluster(2))
    s = simulate(p, Placement(device_of={"a": "d0", "b": "d0", "c": "d1", "d": "d1"}))
    early = dict(s.start_s, d=11.0)
    bad = type(s)(**{**s.__dict__, "start_s": early})
    assert any("before its input" in v or "runs" in v for v in validate(p, bad))


def test_unknown_device_and_missing_node_are_errors():
    p = zoo.chain(zoo.cluster(2))
    with pytest.raises(GraphError, match="unknown device"):
        simulate(p, Placement(device_of={"a": "d0", "b": "gpu9", "c": "d0"}))
    with pytest.raises(GraphError, match="no device for node 'c'"):
        simulate(p, Placement(device_of={"a": "d0", "b": "d0"}))


def test_fixed_edge_transfer_time_overrides_the_link():
    p = zoo.chain(zoo.cluster(2))
    p = dataclasses.replace(p, graph=dataclasses.replace(p.graph, edges=(
        Edge("a", "b", 100, transfer_s=5.0), Edge("b", "c", 100))))
    s = simulate(p, Placement(device_of={"a": "d0", "b": "d1", "c": "d1"}))
    assert s.start_s["b"] == pytest.approx(6.0)
    assert [(t.src, t.end_s - t.start_s) for t in s.transfers] == [("a", 5.0)]
    assert validate(p, s) == []


def test_a_node_cannot_be_placed_where_it_cannot_run():
    p = zoo.chain(zoo.cluster(2))
    p = dataclasses.replace(p, costs=Costs(compute_s={**p.costs.compute_s,
                                                      "b": {"d0": math.inf, "d1": 1.0}}))
    assert p.allowed["b"] == ("d1",)
    with pytest.raises(GraphError, match="'b' is placed on 'd0', where it cannot run"):
        simulate(p, Placement(device_of=dict.fromkeys("abc", "d0")))


def test_loads_count_compute_and_each_copy_once_per_end():
    # a -> b, a -> c, b -> d, c -> d; edges 100 bytes = 1 s. a, b on d0; c, d on d1.
    # d0: a 1 + b 10, sends a's output (1) and b's output (1) = 13.
    # d1: c 10 + d 1, receives a's and b's outputs (1 + 1) = 13.
    p = zoo.fork_join(zoo.cluster(2))
    s = simulate(p, Placement(device_of={"a": "d0", "b": "d0", "c": "d1", "d": "d1"}))
    assert s.load_s == pytest.approx({"d0": 13.0, "d1": 13.0})
    assert s.max_load_s == pytest.approx(13.0)
    one = simulate(p, Placement(device_of=dict.fromkeys("abcd", "d0")))
    assert one.load_s == pytest.approx({"d0": 22.0, "d1": 0.0})


def test_validate_resimulates_memory_instead_of_trusting_the_recorded_peak():
    # Chain a -> b -> c on one 100-byte device: 30 resident + 200 live = 230 bytes (see
    # test_memory_peak_counts_params_and_live_activations). A plan edited to record 100 bytes
    # and no overflow must still fail validation, naming the real figure.
    p = zoo.chain(zoo.cluster(1, memory_bytes=100), params=10)
    s = simulate(p, Placement(device_of=dict.fromkeys("abc", "d0")))
    edited = dataclasses.replace(s, peak_bytes={"d0": 100}, over_capacity={})
    found = validate(p, edited)
    assert "d0 is 130 bytes over its capacity" in found
    assert "d0 records a peak of 100 bytes; its schedule needs 230" in found


def test_validate_accepts_what_the_simulator_recorded_with_copies():
    p = zoo.chain(zoo.cluster(2, memory_bytes=10_000))
    s = simulate(p, Placement(device_of={"a": "d0", "b": "d1", "c": "d1"}))
    assert validate(p, s) == []


def test_workspace_is_held_while_the_node_runs_and_the_reserve_is_resident():
    # chain a -> b -> c on d0 (outputs 100, 100, 10); b needs 500 bytes of scratch while it runs;
    # the device reserves 1,000 bytes for its runtime. While b runs: 1,000 + a 100 + b 100 + 500.
    p = zoo.chain(zoo.cluster(1, memory_bytes=10_000))
    nodes = tuple(dataclasses.replace(n, workspace_bytes=500) if n.name == "b" else n
                  for n in p.graph.nodes)
    devices = tuple(dataclasses.replace(d, reserved_bytes=1000) for d in p.cluster.devices)
    p = dataclasses.replace(p, graph=dataclasses.replace(p.graph, nodes=nodes),
                            cluster=dataclasses.replace(p.cluster, devices=devices))
    s = simulate(p, Placement(device_of=dict.fromkeys("abc", "d0")))
    assert s.resident_bytes["d0"] == 1000
    assert s.peak_bytes["d0"] == 1700
    assert s.memory_timeline["d0"][-1][1] == 1000


def test_a_value_copied_late_stays_on_its_device_until_the_copy():
    # d0 runs a (0-1 s, 100 bytes), b (1-2 s) and e (2-12 s, 1,000 bytes); d1 runs x (0-20 s) and
    # then c, which reads a. By start the emitted model runs [a] [x] [b e] [c]: a is copied to d1
    # only when c's segment starts at 20 s, so a's 100 bytes sit on d0 while e runs (1,100), even
    # though the simulated copy finished at 2 s.
    p = zoo.problem([("a", 1, 0), ("b", 1, 0), ("e", 10, 0), ("x", 20, 0), ("c", 1, 0)],
                    [("a", "c", 100)], zoo.cluster(2, memory_bytes=10_000),
                    outputs=("c",), output_bytes={"e": 1000})
    order = {"d0": ("a", "b", "e"), "d1": ("x", "c")}
    s = simulate(p, Placement(device_of={"a": "d0", "b": "d0", "e": "d0", "x": "d1", "c": "d1"},
                              order=order))
    assert s.start_s["c"] == pytest.approx(20.0)
    assert s.peak_bytes["d0"] == 1100


def test_profiled_gpu_workspace_is_charged_while_the_op_runs():
    # A profile that measured b's workspace as 300 bytes on one GPU and 700 on another: the
    # graph takes the larger, and while b runs d0 holds a 100 + b 100 + 700.
    from autoplace.profile import ProfileResult
    from autoplace.profile.ops import DeviceProfile, OpProfile

    def measured(device: str, workspace: int | None) -> DeviceProfile:
        op = OpProfile(node="b", signature="s", median_s=1.0, spread=0.0, samples=1,
                       param_bytes=0, output_bytes=100, workspace_bytes=workspace,
                       method="isolated")
        return DeviceProfile(device=device, torch_device=device, device_key=device,
                             device_type="T", ops={"b": op}, whole_forward=None)

    p = zoo.chain(zoo.cluster(1, memory_bytes=10_000))
    profiled = ProfileResult(devices=(measured("cuda:0", 300), measured("cuda:1", 700),
                                      measured("cpu", None)))
    graph = profiled.with_workspace(p.graph)
    assert [n.workspace_bytes for n in graph.nodes] == [0, 700, 0]
    s = simulate(dataclasses.replace(p, graph=graph),
                 Placement(device_of=dict.fromkeys("abc", "d0")))
    assert s.peak_bytes["d0"] == 900
