"""The heuristics: hand-worked cases, then properties on random graphs.

Covers m-ETF and m-SCT (``solve.baselines.baechi``), balanced fill and the contiguous DP
(``solve.baselines.partition``). Every plan they return must run in the simulator with colocation
kept, nodes only where they can run, and resident parameters plus the activation reserve within
memory.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import zoo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplace.errors import AutoplaceError
from autoplace.ir import Cluster, Costs, Placement, Problem
from autoplace.simulate import loads, simulate, validate
from autoplace.solve.baselines.baechi import favourite_children, m_etf, m_sct
from autoplace.solve.baselines.heuristics import activation_reserve, heft, sequential_fill
from autoplace.solve.baselines.partition import balanced_fill, contiguous_dp

HEURISTICS = {
    "m_etf": m_etf,
    "m_sct": m_sct,
    "balanced_fill": balanced_fill,
    "contiguous_dp": contiguous_dp,
    "contiguous_dp_latency": lambda p: contiguous_dp(p, "latency"),
}


def _chain(times: list[float], cl: Cluster, *, edge_bytes: int = 0, params: int = 0) -> Problem:
    nodes = [(f"n{i}", t, params) for i, t in enumerate(times)]
    edges = [(f"n{i}", f"n{i + 1}", edge_bytes) for i in range(len(times) - 1)]
    return zoo.problem(nodes, edges, cl, output_bytes={name: edge_bytes for name, _, _ in nodes})


def _forbid(p: Problem, node: str, device: str) -> Problem:
    """``p`` with ``node`` unable to run on ``device``."""
    compute = {v: dict(per) for v, per in p.costs.compute_s.items()}
    compute[node][device] = math.inf
    return dataclasses.replace(p, costs=Costs(compute_s=compute))


def _check(p: Problem, placement: Placement) -> None:
    """What every heuristic guarantees of a plan it returns."""
    schedule = simulate(p, placement)
    assert [v for v in validate(p, schedule) if "over its capacity" not in v] == []
    for v, dev in placement.device_of.items():
        assert dev in p.allowed[v]
    for group in p.graph.colocation_of.values():
        assert len({placement.device_of[v] for v in group}) == 1
    reserve = activation_reserve(p)
    for dev in set(placement.device_of.values()):
        assert schedule.resident_bytes[dev] + reserve <= p.cluster.device(dev).memory_bytes


# --- m-ETF and m-SCT


def test_m_etf_puts_the_fork_join_branches_on_different_devices():
    # zoo.fork_join: a runs on d0 at 0..1; b starts there at 1 (rank ties, b first in order);
    # c starts at 2 on d1 (a's output arrives at 2) rather than at 11 on d0; d joins on d1 at
    # 12 (b's output arrives at 12): 13 s, the optimum, against 22 s on one device.
    p = zoo.fork_join(zoo.cluster(2))
    for heuristic in (m_etf, m_sct):
        placement = heuristic(p)
        assert placement.device_of["b"] != placement.device_of["c"]
        assert simulate(p, placement).makespan_s == pytest.approx(13.0)
        _check(p, placement)


def test_m_etf_order_is_the_schedule_it_computed():
    placement = m_etf(zoo.fork_join(zoo.cluster(2)))
    assert placement.order == {"d0": ("a", "b"), "d1": ("c", "d")}


def test_favourite_children_match_each_parent_with_at_most_one_child():
    # Both fork-join paths are 1 + 1 + 10 + 1 + 1 = 14 s long with mean communication; the tie
    # goes to the first edge in order, a -> b, and then b -> d; c -> d finds d taken.
    assert favourite_children(zoo.fork_join(zoo.cluster(2))) == {"a": "b", "b": "d"}
    assert favourite_children(zoo.fork_join(zoo.cluster(1))) == {}  # no communication at all


def test_m_sct_keeps_the_device_for_the_favourite_child():
    # a (1 s) feeds b (1 s, 1000 bytes = 10 s away) and y (3 s, 200 bytes = 2 s away). The
    # longest path through a -> b is 1 + 10 + 1 = 12 s, through a -> y 1 + 2 + 3 = 6 s: b is
    # a's favourite child. At t = 1, both b and y can start on d0; ETF takes y, of higher rank
    # (3 s to the end against 1 s), then b at 4. SCT keeps d0 for b: y is not urgent at 1
    # (its data reaches d1 only at 3), so b runs at 1 and y after it at 2. Both end at 5.
    p = zoo.problem([("a", 1, 0), ("b", 1, 0), ("y", 3, 0)],
                    [("a", "b", 1000), ("a", "y", 200)], zoo.cluster(2, memory_bytes=10_000))
    assert favourite_children(p) == {"a": "b"}
    etf, sct = m_etf(p), m_sct(p)
    assert etf.order["d0"] == ("a", "y", "b")
    assert sct.order["d0"] == ("a", "b", "y")
    for placement in (etf, sct):
        assert simulate(p, placement).makespan_s == pytest.approx(5.0)


def test_m_etf_keeps_a_colocation_group_together():
    # Colocating the two branches forces them onto one device: 1 + 10 + 10 + 1 = 22 s there,
    # and the join can run nowhere sooner.
    p = zoo.fork_join(zoo.cluster(2))
    p = dataclasses.replace(p, graph=dataclasses.replace(p.graph, colocate=(("b", "c"),)))
    for heuristic in (m_etf, m_sct):
        placement = heuristic(p)
        assert placement.device_of["b"] == placement.device_of["c"]
        assert simulate(p, placement).makespan_s == pytest.approx(22.0)
        _check(p, placement)


# --- balanced fill


def test_balanced_fill_stops_each_device_at_an_even_share():
    # Four nodes of 100 bytes on two devices of 1000: the share is 200 bytes, so a and b stay
    # on d0 and c and d go to d1; sequential_fill would keep all four on d0.
    p = _chain([1, 1, 1, 1], zoo.cluster(2, memory_bytes=1000), params=100)
    assert balanced_fill(p).device_of == {"n0": "d0", "n1": "d0", "n2": "d1", "n3": "d1"}
    assert set(sequential_fill(p).device_of.values()) == {"d0"}


def test_balanced_fill_fills_the_last_device_to_capacity_past_the_share():
    # Shares of ceil(500 / 2) = 250 bytes: n0 (200) fits d0's share, n1 (300) fits no share
    # and goes to d1 up to capacity, n2 (0) follows it there.
    nodes = [("n0", 1.0, 200), ("n1", 1.0, 300), ("n2", 1.0, 0)]
    p = zoo.problem(nodes, [("n0", "n1", 0), ("n1", "n2", 0)], zoo.cluster(2, memory_bytes=1000))
    assert balanced_fill(p).device_of == {"n0": "d0", "n1": "d1", "n2": "d1"}


# --- the contiguous DP


def test_contiguous_dp_finds_the_best_split_of_a_chain():
    # Times 4 2 3 5 1 3 (18 s), no communication, three devices. A max load of 7 would need
    # four segments ([4] [2 3] [5 1] [3]); 8 needs the first segment at most 8 and the last at
    # most 8 with the middle at most 8: only [4 2] [3 5] [1 3] (6, 8, 4).
    p = _chain([4, 2, 3, 5, 1, 3], zoo.cluster(3, memory_bytes=10_000))
    placement = contiguous_dp(p)
    assert [placement.device_of[f"n{i}"] for i in range(6)] == ["d0"] * 2 + ["d1"] * 2 + ["d2"] * 2
    assert simulate(p, placement).max_load_s == pytest.approx(8.0)


def test_contiguous_dp_counts_each_copy_on_both_ends():
    # The same chain with 1 s copies: a first or last segment pays 1 s, a middle one 2 s.
    # Max load 9 would need first + last <= 8 + 8 - 2 and a middle <= 7: the first is 4 or 6,
    # the last 3 or 4, leaving at least 8 for the middle. Two segments [4 2 3] [5 1 3] give
    # 10 + 10: the optimum is 10.
    p = _chain([4, 2, 3, 5, 1, 3], zoo.cluster(3, memory_bytes=10_000), edge_bytes=100)
    assert simulate(p, contiguous_dp(p)).max_load_s == pytest.approx(10.0)


def test_contiguous_dp_latency_keeps_a_chain_on_one_device():
    # Every cut adds 2 s of copies to the sum of loads: the proxy keeps the chain together.
    p = _chain([4, 2, 3, 5, 1, 3], zoo.cluster(3, memory_bytes=10_000), edge_bytes=100)
    assert set(contiguous_dp(p, "latency").device_of.values()) == {"d0"}


def test_contiguous_dp_may_leave_the_first_device_empty():
    # a (10 s) and b (3 s) on d0 (speed 1) or d1 (speed 2): in cluster order the best split is
    # everything on d1, 6.5 s; a alone on d0 would leave it at 10 s.
    p = zoo.problem([("a", 10, 0), ("b", 3, 0)], [], zoo.cluster(2, memory_bytes=1000),
                    speed={"d1": 2.0})
    assert contiguous_dp(p).device_of == {"a": "d1", "b": "d1"}


def test_contiguous_dp_does_not_cut_a_colocation_group():
    # n0 and n3 share a device, so no cut may fall between them: the whole chain on one device.
    p = _chain([4, 2, 3, 5], zoo.cluster(2, memory_bytes=10_000))
    p = dataclasses.replace(p, graph=dataclasses.replace(p.graph, colocate=(("n0", "n3"),)))
    assert len(set(contiguous_dp(p).device_of.values())) == 1


def test_contiguous_dp_rejects_an_unknown_objective():
    with pytest.raises(AutoplaceError, match="valid objectives: latency, throughput"):
        contiguous_dp(zoo.chain(zoo.cluster(2)), "speed")


# --- every heuristic


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_memory_forces_a_split(name):
    # Three 400-byte nodes, edges of 10 bytes: the activation reserve is 10 in + 10 out = 20,
    # so two nodes (820) fit a 1000-byte device and three (1220) do not.
    p = _chain([1, 1, 1], zoo.cluster(2, memory_bytes=1000), edge_bytes=10, params=400)
    placement = HEURISTICS[name](p)
    assert len(set(placement.device_of.values())) == 2
    _check(p, placement)


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_memory_that_cannot_be_met_gives_none(name):
    # Three 600-byte nodes need three devices; there are two.
    p = _chain([1, 1, 1], zoo.cluster(2, memory_bytes=1000), edge_bytes=10, params=600)
    assert HEURISTICS[name](p) is None


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_a_node_never_goes_where_it_cannot_run(name):
    # b cannot run on d0, where everything else would rather be (d0 is twice as fast).
    p = zoo.fork_join(zoo.cluster(2, memory_bytes=10_000))
    p = dataclasses.replace(p, costs=Costs(compute_s={
        v: {"d0": t["d0"] / 2, "d1": t["d1"]} for v, t in p.costs.compute_s.items()}))
    p = _forbid(p, "b", "d0")
    placement = HEURISTICS[name](p)
    assert placement.device_of["b"] == "d1"
    _check(p, placement)


# --- properties


@st.composite
def random_problems(draw):
    """Up to 9 nodes on up to 3 devices, with colocation, tight memory and nodes that cannot
    run on some device."""
    n = draw(st.integers(2, 9))
    k = draw(st.integers(1, 3))
    edges = []
    for dst in range(1, n):
        for src in draw(st.sets(st.integers(0, dst - 1), max_size=2)):
            edges.append((f"n{src}", f"n{dst}", draw(st.integers(0, 500))))
    colocate = ()
    if n >= 3 and draw(st.booleans()):
        pair = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
        colocate = (tuple(f"n{i}" for i in pair),)
    speeds = draw(st.lists(st.sampled_from([1.0, 2.0]), min_size=k, max_size=k))
    cl = zoo.cluster(k, memory_bytes=draw(st.integers(600, 3000)),
                     latency=draw(st.sampled_from([0.0, 0.5])))
    nodes = [(f"n{i}", float(draw(st.integers(1, 20))), draw(st.integers(0, 300)))
             for i in range(n)]
    p = zoo.problem(nodes, edges, cl, speed={f"d{i}": s for i, s in enumerate(speeds)},
                    colocate=colocate)
    if k > 1:
        for i in draw(st.sets(st.integers(0, n - 1), max_size=2)):
            p = _forbid(p, f"n{i}", f"d{draw(st.integers(0, k - 1))}")
    return p


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_problems())
def test_every_heuristic_gives_none_or_a_plan_the_simulator_accepts(p):
    for heuristic in (*HEURISTICS.values(), heft):
        placement = heuristic(p)
        if placement is not None:
            _check(p, placement)


def _contiguous_value(p: Problem, bounds: list[int], objective: str) -> float:
    """The objective of the split of p's order at ``bounds`` (segment t on device t), or inf
    if it breaks memory, colocation or where nodes can run."""
    names = [v.name for v in p.graph.nodes]
    reserve = activation_reserve(p)
    device_of = {}
    for dev, lo, hi in zip(p.cluster.names, bounds, bounds[1:]):
        segment = names[lo:hi]
        if segment and (sum(p.graph.node(v).param_bytes for v in segment) + reserve
                        > p.cluster.device(dev).memory_bytes
                        or any(dev not in p.allowed[v] for v in segment)):
            return math.inf
        device_of.update(dict.fromkeys(segment, dev))
    if any(len({device_of[v] for v in g}) > 1 for g in p.graph.colocate):
        return math.inf
    per_device = loads(p, device_of)
    return max(per_device.values()) if objective == "throughput" else sum(per_device.values())


@st.composite
def tiny_chains(draw):
    """Chains of up to 7 nodes on up to 3 identical-link devices, some charging no transfers:
    small enough to try every contiguous split."""
    n = draw(st.integers(1, 7))
    k = draw(st.integers(1, 3))
    nodes = [(f"n{i}", float(draw(st.integers(1, 20))), draw(st.integers(0, 400)))
             for i in range(n)]
    edges = [(f"n{i}", f"n{i + 1}", draw(st.integers(0, 500))) for i in range(n - 1)]
    speeds = draw(st.lists(st.sampled_from([1.0, 1.5, 2.0]), min_size=k, max_size=k))
    cl = zoo.cluster(k, memory_bytes=draw(st.integers(500, 2000)),
                     latency=draw(st.sampled_from([0.0, 0.5])))
    charges = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    cl = dataclasses.replace(cl, devices=tuple(
        dataclasses.replace(d, charges_transfers=c) for d, c in zip(cl.devices, charges)))
    colocate = ()
    if n >= 3 and draw(st.booleans()):
        pair = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
        colocate = (tuple(f"n{i}" for i in pair),)
    p = zoo.problem(nodes, edges, cl, speed={f"d{i}": s for i, s in enumerate(speeds)},
                    colocate=colocate)
    if k > 1 and draw(st.booleans()):
        p = _forbid(p, f"n{draw(st.integers(0, n - 1))}", f"d{draw(st.integers(0, k - 1))}")
    return p


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_chains(), st.sampled_from(["throughput", "latency"]))
def test_contiguous_dp_is_the_best_contiguous_split_of_a_chain(p, objective):
    n, k = len(p.graph.nodes), len(p.cluster.devices)
    brute = min(_contiguous_value(p, [0, *inner, n], objective)
                for inner in itertools.combinations_with_replacement(range(n + 1), k - 1))
    placement = contiguous_dp(p, objective)
    if placement is None:
        assert brute == math.inf
        return
    per_device = loads(p, placement.device_of)
    value = max(per_device.values()) if objective == "throughput" else sum(per_device.values())
    assert value == pytest.approx(brute, rel=1e-9, abs=1e-12)
    _check(p, placement)


def test_group_dp_loads_match_the_simulator_and_brute_force():
    # A training-like graph: forward f0 -> f1 -> f2, backward b2 -> b1 -> b0, fi -> bi, and
    # (fi, bi) share a parameter. contiguous_dp cannot cut it at all (f0 and b0 are at the two
    # ends of every topological order); group_dp cuts between layers.
    from autoplace.simulate import loads
    from autoplace.solve.baselines.stages import _segment_comm, group_dp

    times = {"f0": 3, "f1": 2, "f2": 4, "b2": 5, "b1": 3, "b0": 4}
    edges = [("f0", "f1", 100), ("f1", "f2", 100), ("f2", "b2", 100), ("b2", "b1", 100),
             ("b1", "b0", 100), ("f0", "b0", 100), ("f1", "b1", 100)]
    p = zoo.problem([(n, t, 0) for n, t in times.items()], edges, zoo.cluster(3),
                    colocate=(("f0", "b0"), ("f1", "b1"), ("f2", "b2")))
    groups = [("f0", "b0"), ("f1", "b1"), ("f2", "b2")]
    comm = _segment_comm(p, groups)
    best = math.inf
    for cuts in itertools.combinations_with_replacement(range(4), 2):
        bounds = (0, *cuts, 3)
        device_of = {v: f"d{t}" for t in range(3) for g in groups[bounds[t]:bounds[t + 1]]
                     for v in g}
        load = loads(p, device_of)
        for t in range(3):
            seg = groups[bounds[t]:bounds[t + 1]]
            if seg:
                compute = sum(times[v] for g in seg for v in g)
                assert load[f"d{t}"] == pytest.approx(compute + comm[bounds[t], bounds[t + 1]])
        best = min(best, max(load.values()))
    placement = group_dp(p, "throughput")
    assert placement is not None
    assert max(loads(p, placement.device_of).values()) == pytest.approx(best)
    assert best < sum(times.values())  # a real split, unlike contiguous_dp's
