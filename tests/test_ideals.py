"""Contiguous splits of a DAG: ``partition.grouped_order`` and the ideal DP
(``solve.baselines.ideals``).

The ideal DP is checked against brute force: every placement of a tiny DAG whose device sets form
a chain of stages (``solve.is_contiguous``), within memory.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import zoo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplace.config import Solve
from autoplace.errors import AutoplaceError
from autoplace.ir import Costs, Problem
from autoplace.simulate import loads
from autoplace.solve import HEURISTICS, is_contiguous
from autoplace.solve.baselines.heuristics import NotRun, activation_reserve
from autoplace.solve.baselines.ideals import ideal_dp
from autoplace.solve.baselines.partition import contiguous_dp, contiguous_split, grouped_order


def _weights_first() -> Problem:
    # w is a weight read only by the last op, d; (w, d) share it, so they are colocated. In the
    # graph's order w comes first and the group spans everything: no cut is allowed.
    nodes = [("w", 0.0, 0), ("a", 4.0, 0), ("b", 4.0, 0), ("c", 4.0, 0), ("d", 4.0, 0)]
    edges = [("a", "b", 0), ("b", "c", 0), ("c", "d", 0), ("w", "d", 0)]
    return zoo.problem(nodes, edges, zoo.cluster(2), colocate=(("w", "d"),))


def test_grouped_order_keeps_a_group_together_and_is_topological():
    p = _weights_first()
    order = grouped_order(p)
    assert order.index("w") + 1 == order.index("d")
    position = {v: i for i, v in enumerate(order)}
    assert all(position[e.src] < position[e.dst] for e in p.graph.edges)
    assert sorted(order) == sorted(n.name for n in p.graph.nodes)


def test_the_grouped_order_lets_the_dp_cut_where_the_graph_order_cannot():
    p = _weights_first()
    one = contiguous_dp(p)
    assert len(set(one.device_of.values())) == 1  # the group spans the graph's order
    two = contiguous_dp(p, order=grouped_order(p))
    assert max(loads(p, two.device_of).values()) == pytest.approx(8.0)  # a, b | c, d, w


def test_contiguous_dp_refuses_an_order_that_is_not_topological():
    p = _weights_first()
    with pytest.raises(AutoplaceError, match="topological order"):
        contiguous_dp(p, order=["d", "w", "a", "b", "c"])


def test_grouped_order_with_seed_is_another_valid_order():
    p = zoo.fork_join(zoo.cluster(2))
    for seed in range(5):
        position = {v: i for i, v in enumerate(grouped_order(p, seed=seed))}
        assert all(position[e.src] < position[e.dst] for e in p.graph.edges)


def test_grouped_order_keeps_given_stages_consecutive():
    p = zoo.fork_join(zoo.cluster(2))
    names = [n.name for n in p.graph.nodes]
    stages = {v: int(i >= len(names) // 2) for i, v in enumerate(names)}
    order = grouped_order(p, seed=3, stages=stages)
    assert [stages[v] for v in order] == sorted(stages[v] for v in order)


def test_ideal_dp_finds_a_split_no_single_order_offers():
    # a -> {b, c, e} -> d, times 1, 4, 8, 4, 1, free copies, two devices. The best split is
    # {a, b, e} | {c, d} = 9 | 9; neither order contiguous_split tries has {a, b, e} as a
    # prefix, so the best it finds is {a, b, c} | {e, d} or the like: 13 | 5.
    nodes = [("a", 1.0, 0), ("b", 4.0, 0), ("c", 8.0, 0), ("e", 4.0, 0), ("d", 1.0, 0)]
    edges = [("a", x, 0) for x in "bce"] + [(x, "d", 0) for x in "bce"]
    p = zoo.problem(nodes, edges, zoo.cluster(2))
    by_order = contiguous_split(p)
    assert max(loads(p, by_order.device_of).values()) == pytest.approx(13.0)
    placement = ideal_dp(p, "throughput")
    assert max(loads(p, placement.device_of).values()) == pytest.approx(9.0)


def test_ideal_dp_splits_a_training_graph_by_layers():
    # Forward f0 -> f1 -> f2 -> loss, backward loss -> b2 -> b1 -> b0, layer i's forward and
    # backward share a parameter (colocated), and a gradient sum g (in no group) between b1 and
    # b0. The groups' graph has cycles; over the forward edges the DP gives each device layers.
    times = {"f0": 2, "f1": 2, "f2": 2, "loss": 0, "b2": 2, "b1": 2, "g": 0, "b0": 2}
    edges = [("f0", "f1", 0), ("f1", "f2", 0), ("f2", "loss", 0), ("loss", "b2", 0),
             ("b2", "b1", 0), ("b1", "g", 0), ("g", "b0", 0), ("f0", "b0", 0),
             ("f1", "b1", 0)]
    p = zoo.problem([(v, t, 0) for v, t in times.items()], edges, zoo.cluster(3),
                    colocate=(("f0", "b0"), ("f1", "b1"), ("f2", "loss", "b2")))
    placement = ideal_dp(p, "throughput")
    assert placement is not None
    assert max(loads(p, placement.device_of).values()) == pytest.approx(4.0)
    assert placement.device_of["g"] in (placement.device_of["b1"], placement.device_of["b0"])


def test_ideal_dp_uses_the_device_classes_in_any_stage_order():
    # contiguous_dp gives stage t to the t-th device in cluster order; the ideal DP may give
    # the first stage to the last device.
    nodes = [("a", 0.1, 0), ("b", 10.0, 0)]
    edges = [("a", "b", 0)]
    p = zoo.problem(nodes, edges, zoo.cluster(2), speed={"d0": 1.0, "d1": 0.1})
    # d1 is 10x slower: a on d1 takes 1.0, b on d0 takes 10.0; cluster order would put a's
    # stage on d0 and b's on d1 (100) or everything on d0 (10.1).
    placement = ideal_dp(p, "throughput")
    assert placement.device_of == {"a": "d1", "b": "d0"}
    assert max(loads(p, placement.device_of).values()) == pytest.approx(10.0)


def test_ideal_dp_is_not_run_past_its_limit():
    p = zoo.chain(zoo.cluster(2))
    with pytest.raises(NotRun, match="more than 2 ideals"):
        ideal_dp(p, "throughput", max_ideals=2)
    assert ideal_dp(p, "throughput") is not None


def test_ideal_dp_is_a_registered_baseline():
    assert "ideal-dp" in HEURISTICS


# --- brute force on tiny DAGs


@st.composite
def tiny_dags(draw):
    n = draw(st.integers(2, 6))
    k = draw(st.integers(1, 3))
    edges = []
    for dst in range(1, n):
        for src in draw(st.sets(st.integers(0, dst - 1), max_size=2)):
            edges.append((f"n{src}", f"n{dst}", draw(st.integers(0, 400))))
    nodes = [(f"n{i}", float(draw(st.integers(1, 20))), draw(st.integers(0, 300)))
             for i in range(n)]
    speeds = draw(st.lists(st.sampled_from([1.0, 2.0]), min_size=k, max_size=k))
    cl = zoo.cluster(k, memory_bytes=draw(st.integers(500, 2000)),
                     latency=draw(st.sampled_from([0.0, 0.5])))
    charges = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    cl = dataclasses.replace(cl, devices=tuple(
        dataclasses.replace(d, charges_transfers=c) for d, c in zip(cl.devices, charges)))
    p = zoo.problem(nodes, edges, cl, speed={f"d{i}": s for i, s in enumerate(speeds)})
    if k > 1 and draw(st.booleans()):
        v, d = f"n{draw(st.integers(0, n - 1))}", f"d{draw(st.integers(0, k - 1))}"
        compute = {u: dict(per) for u, per in p.costs.compute_s.items()}
        compute[v][d] = math.inf
        p = dataclasses.replace(p, costs=Costs(compute_s=compute))
    return p


def _value(p: Problem, device_of: dict[str, str], objective: str) -> float:
    load = loads(p, device_of)
    return max(load.values()) if objective == "throughput" else sum(load.values())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_dags(), st.sampled_from(["throughput", "latency"]))
def test_ideal_dp_is_the_best_contiguous_split(p, objective):
    names = [n.name for n in p.graph.nodes]
    reserve = activation_reserve(p)
    brute = math.inf
    for devices in itertools.product(p.cluster.names, repeat=len(names)):
        device_of = dict(zip(names, devices))
        if not is_contiguous(p, device_of):
            continue
        if any(d not in p.allowed[v] for v, d in device_of.items()):
            continue
        used = {d: sum(p.graph.node(v).param_bytes for v in names if device_of[v] == d)
                for d in set(devices)}
        if any(b + reserve > p.cluster.device(d).memory_bytes for d, b in used.items()):
            continue
        brute = min(brute, _value(p, device_of, objective))
    placement = ideal_dp(p, objective)
    if placement is None:
        assert brute == math.inf
        return
    assert is_contiguous(p, placement.device_of)
    assert _value(p, placement.device_of, objective) == pytest.approx(brute, rel=1e-9,
                                                                        abs=1e-12)


def test_ideal_dp_past_its_limit_is_reported_as_not_run_not_as_unfit():
    # Ten independent nodes: every subset is an ideal, 1024 > 600. The plan must say ideal-dp
    # did not run (and why) in the result, plan.json and every report, not "fits memory: no".
    from autoplace.formats.plan import BaselineResult
    from autoplace.formats.plan_check import validate_plan_dict
    from autoplace.pipeline import solve_graph
    from autoplace.report import render_html, render_markdown, summary_text

    p = zoo.problem([(f"n{i}", 1, 0) for i in range(10)], [], zoo.cluster(2))
    plan = solve_graph(p, Solve(time_limit_s=2, deterministic=True))
    why = "more than 600 ideals (the graph has 10 units)"
    assert plan.baselines["ideal-dp"] == BaselineResult(makespan_s=None, feasible=False,
                                                        not_run=why)
    data = plan.to_dict()
    validate_plan_dict(data)
    assert data["baselines"]["ideal-dp"]["not_run"] == why
    assert "| ideal-dp | not run |" in render_markdown(plan).replace("  ", " ")
    assert f'<span title="{why}">not run</span>' in render_html(plan)
    row = next(line for line in summary_text(plan).splitlines() if "ideal-dp" in line)
    assert row.count("not run") == 2 and " no " not in row
