"""The solver: exact where the optimum is known by hand, never worse than a baseline, and clear
about memory it cannot meet."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import zoo
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autoplace.errors import AutoplaceError, InfeasibleError
from autoplace.ir import Costs, Placement
from autoplace.simulate import simulate, validate
from autoplace.solve import Budget, SolveOptions, is_contiguous, options, solve
from autoplace.solve.baselines.heuristics import heft, sequential_fill
from autoplace.solve.baselines.stages import stage_order
from autoplace.solve.bounds import lower_bound_s
from autoplace.solve.cpsat import solve_cpsat
from autoplace.solve.whatif import WHATIF_TIME_LIMIT_S, whatif_options


def test_fork_join_reaches_the_hand_computed_optimum():
    p = zoo.fork_join(zoo.cluster(2))
    r = solve(p, time_limit_s=10, workers=1)
    assert r.schedule.makespan_s == pytest.approx(13.0)
    assert r.solver.status == "OPTIMAL"
    assert r.lower_bound_s == pytest.approx(13.0, abs=1e-6)
    assert r.baselines["single-device"].makespan_s == pytest.approx(22.0)
    assert validate(p, r.schedule) == []


def test_chain_stays_on_one_device():
    p = zoo.chain(zoo.cluster(2))
    r = solve(p, time_limit_s=10, workers=1)
    assert r.schedule.makespan_s == pytest.approx(3.0)
    assert len(set(r.schedule.placement.device_of.values())) == 1


def test_heterogeneous_devices_use_the_fast_one():
    # d1 is 4x faster: the chain runs there in 0.75 s.
    p = zoo.problem([("a", 1, 0), ("b", 1, 0), ("c", 1, 0)], [("a", "b", 100), ("b", "c", 100)],
                    zoo.cluster(2), speed={"d1": 4.0})
    r = solve(p, time_limit_s=10, workers=1)
    assert set(r.schedule.placement.device_of.values()) == {"d1"}
    assert r.schedule.makespan_s == pytest.approx(0.75)
    assert r.best_single_device == "d1"


def test_model_too_big_for_one_device_is_split_within_capacity():
    # Three nodes of 400 param bytes; devices hold 1000: at most two per device.
    p = zoo.chain(zoo.cluster(2, memory_bytes=1000), params=400)
    r = solve(p, time_limit_s=10, workers=1)
    assert r.baselines["single-device"] is None
    assert r.schedule.feasible
    assert max(r.schedule.peak_bytes.values()) <= 1000
    assert len(set(r.schedule.placement.device_of.values())) == 2
    # One transfer of 100 bytes (1 s) on top of 3 s of compute.
    assert r.schedule.makespan_s == pytest.approx(4.0)


def test_colocated_nodes_share_a_device():
    p = zoo.problem([("a", 1, 0), ("b", 10, 0), ("c", 10, 0), ("d", 1, 0)],
                    [("a", "b", 100), ("a", "c", 100), ("b", "d", 100), ("c", "d", 100)],
                    zoo.cluster(2), colocate=(("b", "c"),))
    r = solve(p, time_limit_s=10, workers=1)
    device_of = r.schedule.placement.device_of
    assert device_of["b"] == device_of["c"]
    assert r.schedule.makespan_s == pytest.approx(22.0)


def test_not_fitting_anywhere_says_how_many_bytes_are_missing():
    p = zoo.chain(zoo.cluster(2, memory_bytes=500), params=400)
    with pytest.raises(InfeasibleError, match=r"short") as info:
        solve(p, time_limit_s=5, workers=1)
    assert "200 bytes" in str(info.value)


def test_one_node_larger_than_every_device_names_the_node():
    p = zoo.problem([("a", 1, 0), ("big", 1, 5000)], [("a", "big", 10)],
                    zoo.cluster(2, memory_bytes=3000))
    with pytest.raises(InfeasibleError, match=r"node 'big'.*d0.*2000 bytes\) short"):
        solve(p, time_limit_s=5, workers=1)


def test_unknown_solver_lists_the_valid_ones():
    with pytest.raises(AutoplaceError, match="valid solvers: cpsat, balanced, contiguous-dp, heft"):
        solve(zoo.chain(zoo.cluster(2)), solver="magic")


@st.composite
def random_problems(draw):
    n = draw(st.integers(2, 9))
    devices = draw(st.integers(1, 3))
    durations = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    params = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    edges = []
    for dst in range(1, n):
        for src in draw(st.sets(st.integers(0, dst - 1), max_size=2)):
            edges.append((f"n{src}", f"n{dst}", draw(st.integers(0, 500))))
    speeds = draw(st.lists(st.sampled_from([1.0, 2.0]), min_size=devices, max_size=devices))
    colocate = ()
    if n >= 3 and draw(st.booleans()):
        colocate = ((f"n{draw(st.integers(0, n - 1))}", f"n{draw(st.integers(0, n - 1))}"),)
    cl = zoo.cluster(devices, memory_bytes=draw(st.integers(600, 3000)),
                     latency=draw(st.sampled_from([0.0, 0.5])))
    return zoo.problem([(f"n{i}", float(durations[i]), params[i]) for i in range(n)], edges, cl,
                       speed={f"d{i}": s for i, s in enumerate(speeds)},
                       colocate=tuple(g for g in colocate if g[0] != g[1]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_problems(), st.sampled_from(["latency", "throughput"]), st.booleans())
def test_random_graphs_give_valid_plans_no_worse_than_any_baseline(p, objective, contiguous):
    try:
        r = solve(p, objective=objective, contiguous=contiguous, time_limit_s=2, workers=1)
    except InfeasibleError:
        # Then no heuristic may have found a plan within memory either (a contiguous one, when
        # the stages must be contiguous).
        for heuristic in (heft, sequential_fill):
            placement = heuristic(p)
            assert (placement is None or not simulate(p, placement).feasible
                    or (contiguous and not is_contiguous(p, placement.device_of)))
        return
    assert validate(p, r.schedule) == []
    if contiguous:
        assert is_contiguous(p, r.schedule.placement.device_of)
    for name, baseline in r.baselines.items():
        if baseline is not None and baseline.feasible:
            assert r.objective_s <= baseline.objective_s(objective) + 1e-9, name
    assert r.lower_bound_s <= r.objective_s + 1e-6
    assert lower_bound_s(p, objective) <= r.objective_s + 1e-9


@st.composite
def tiny_problems(draw):
    """Up to 5 nodes on up to 3 devices, with awkward non-integer times and plenty of memory:
    small enough to enumerate every placement."""
    n = draw(st.integers(2, 5))
    devices = draw(st.integers(2, 3))
    times = st.sampled_from([1e-6, 3.7e-6, 0.013, 0.25, 1.0, 2.5, 7.3])
    edges = []
    for dst in range(1, n):
        for src in draw(st.sets(st.integers(0, dst - 1), max_size=2)):
            edges.append((f"n{src}", f"n{dst}", draw(st.integers(0, 400))))
    speeds = draw(st.lists(st.sampled_from([1.0, 1.5, 3.0]), min_size=devices,
                           max_size=devices))
    cl = zoo.cluster(devices, memory_bytes=10**9, bandwidth=draw(st.sampled_from([100.0, 1e4])),
                     latency=draw(st.sampled_from([0.0, 1e-5, 0.5])))
    return zoo.problem([(f"n{i}", draw(times), 0) for i in range(n)], edges, cl,
                       speed={f"d{i}": s for i, s in enumerate(speeds)})


def _one_worker_stall():
    """Found by hypothesis: one CP-SAT worker, hinted with HEFT's 1.0833 s plan, shaved one 1 ns
    tick of idle time per solution for the whole limit and ended 0.25 s off the optimum
    (0.8333 s: n4 alone on a fast device); the simulator made its placement 0.833334 s."""
    cl = zoo.cluster(3, memory_bytes=10**9, bandwidth=100.0, latency=0.0)
    return zoo.problem([("n0", 1e-6, 0), ("n1", 1.0, 0), ("n2", 0.25, 0), ("n3", 1e-6, 0),
                        ("n4", 2.5, 0)], [("n0", "n2", 100), ("n1", "n2", 67)], cl,
                       speed={"d0": 3.0, "d1": 1.5, "d2": 3.0})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_problems())
@example(_one_worker_stall())
def test_tiny_graphs_match_enumeration_of_every_placement(p):
    # Any placement list-scheduled by the simulator is a feasible schedule, so neither the plan
    # nor the proven lower bound may be worse than the best of them (a wrong OPTIMAL would be).
    names = [n.name for n in p.graph.nodes]
    best = min(
        simulate(p, Placement(device_of=dict(zip(names, combo)))).makespan_s
        for combo in itertools.product(p.cluster.names, repeat=len(names))
    )
    r = solve(p, time_limit_s=5, workers=1)
    assert r.schedule.makespan_s <= best * (1 + 1e-9) + 1e-12
    assert r.lower_bound_s <= best * (1 + 1e-9) + 1e-12


def test_nogood_keeps_a_node_set_off_every_identical_device():
    # The chain fits one device (3 s); forbidding {a, b, c} together on d0 forbids it on d1 too,
    # since d0 and d1 are identical: the best split pays one 1 s transfer.
    p = zoo.chain(zoo.cluster(2, memory_bytes=10_000))
    r = solve_cpsat(p, time_limit_s=5, workers=1, nogoods=[("d0", frozenset("abc"))])
    assert r.status == "OPTIMAL"
    assert len(set(r.placement.device_of.values())) == 2
    assert simulate(p, r.placement).makespan_s == pytest.approx(4.0)


def test_cpsat_records_its_progress():
    r = solve(zoo.fork_join(zoo.cluster(2)), time_limit_s=5, workers=1)
    times = [t for t, _, _ in r.solver.progress]
    assert times and times == sorted(times)
    assert r.solver.progress[-1][1] == pytest.approx(r.solver.objective_s)
    assert all(b <= r.schedule.makespan_s + 1e-9 for _, _, b in r.solver.progress)


def test_a_bound_above_a_feasible_plan_is_discarded(monkeypatch):
    # Stands in for a solver bug such as google/or-tools#5293 (a wrong OPTIMAL certificate).
    import autoplace.solve as solve_module

    def inflated(*args, **kwargs):
        return dataclasses.replace(solve_cpsat(*args, **kwargs), bound_s=1e6)

    monkeypatch.setattr(solve_module, "solve_cpsat", inflated)
    p = zoo.fork_join(zoo.cluster(2))
    r = solve(p, time_limit_s=5, workers=1)
    assert r.lower_bound_s == pytest.approx(lower_bound_s(p))
    assert r.solver.status == "FEASIBLE"
    assert any("discarded" in note for note in r.notes)


def test_overflow_found_by_the_simulator_is_cut_off_not_declared_infeasible(monkeypatch):
    # CP-SAT's memory model counts one node's working set; the simulator can find more live at
    # once. Here the first CP-SAT plan is made to overflow (its model sees capacity as larger);
    # the cut must lead to a plan, never to "no placement fits".
    import autoplace.solve as solve_module

    calls = []

    def recording(problem, **kwargs):
        calls.append(list(kwargs["nogoods"]))
        return solve_cpsat(problem, **kwargs)

    monkeypatch.setattr(solve_module, "solve_cpsat", recording)
    # a -> {b, c}, b -> f, c -> g; every output 300 bytes, 50 param bytes each, f and g are
    # the model's outputs. On one device whichever of f and g runs last does so while the
    # other's output, its input and its own output are live: 250 + 900 > 1100. CP-SAT's model
    # sees one node's working set (250 + 600) and, with transfers dear (30 s), prefers one
    # device. Split a, b, f | c, g: 150 + 900 and 100 + 900 fit.
    p = zoo.problem([("a", 1, 50), ("b", 5, 50), ("c", 5, 50), ("f", 1, 50), ("g", 1, 50)],
                    [("a", "b", 300), ("a", "c", 300), ("b", "f", 300), ("c", "g", 300)],
                    zoo.cluster(2, memory_bytes=1100, bandwidth=10), outputs=("f", "g"),
                    output_bytes={"f": 300, "g": 300})
    r = solve(p, time_limit_s=10, workers=1)
    assert len(calls) >= 2 and calls[1], "the first CP-SAT plan should have overflowed"
    assert r.schedule.feasible and validate(p, r.schedule) == []
    assert len(set(r.schedule.placement.device_of.values())) == 2


def test_nodes_run_only_where_they_can():
    # b cannot run on the fast device d1, so the chain pays two transfers or runs slowly on d0.
    p = zoo.problem([("a", 4, 0), ("b", 1, 0), ("c", 4, 0)], [("a", "b", 100), ("b", "c", 100)],
                    zoo.cluster(2), speed={"d1": 4.0})
    p = dataclasses.replace(p, costs=Costs(compute_s={**p.costs.compute_s,
                                                      "b": {"d0": 1.0, "d1": math.inf}}))
    r = solve(p, time_limit_s=5, workers=1)
    assert r.schedule.placement.device_of["b"] == "d0"
    # All on d0: 9 s. a, c on d1 and b on d0: 1 + 1 + 1 + 1 + 1 = 5 s.
    assert r.schedule.makespan_s == pytest.approx(5.0)
    assert validate(p, r.schedule) == []


def test_a_group_with_no_common_device_is_named():
    p = zoo.problem([("a", 1, 0), ("b", 1, 0)], [("a", "b", 10)], zoo.cluster(2),
                    colocate=(("a", "b"),))
    p = dataclasses.replace(p, costs=Costs(compute_s={"a": {"d0": 1.0, "d1": math.inf},
                                                      "b": {"d0": math.inf, "d1": 1.0}}))
    with pytest.raises(InfeasibleError, match=r"colocation group \['a', 'b'\].*no device"):
        solve(p, time_limit_s=5, workers=1)


def test_throughput_balances_the_loads_of_fork_join():
    # Split {a, b} | {c, d}: each device computes 11 s and moves two 1 s copies: 13. One
    # device: 22. Any other split puts 12 s of compute and 2 s of copies on one device.
    p = zoo.fork_join(zoo.cluster(2))
    r = solve(p, objective="throughput", time_limit_s=10, workers=1)
    assert r.objective == "throughput"
    assert r.objective_s == pytest.approx(13.0)
    assert r.schedule.max_load_s == pytest.approx(13.0)
    assert r.solver.status == "OPTIMAL"
    assert r.lower_bound_s <= 13.0 + 1e-9


def test_contiguous_stages_cost_throughput_on_a_chain():
    # a (2) -> b (5) -> c (2), copies free. Best split {a, c} | {b}: loads 4 and 5. Contiguous
    # stages cannot leave b's device and come back: {a, b} | {c} or {a} | {b, c}: 7.
    p = zoo.problem([("a", 2, 0), ("b", 5, 0), ("c", 2, 0)], [("a", "b", 10), ("b", "c", 10)],
                    zoo.cluster(2, bandwidth=1e30))
    free = solve(p, objective="throughput", time_limit_s=10, workers=1)
    staged = solve(p, objective="throughput", contiguous=True, time_limit_s=10, workers=1)
    assert free.objective_s == pytest.approx(5.0)
    assert staged.objective_s == pytest.approx(7.0)
    assert is_contiguous(p, staged.schedule.placement.device_of)
    assert not is_contiguous(p, free.schedule.placement.device_of)


def test_stage_order_puts_the_used_devices_in_pipeline_order_and_refuses_a_return():
    p = zoo.problem([("a", 1, 0), ("b", 1, 0), ("c", 1, 0)], [("a", "b", 1), ("b", "c", 1)],
                    zoo.cluster(3))
    first, second, spare = p.cluster.names
    # b and c on the first device, a on the second: the second feeds the first.
    assert stage_order(p, {"a": second, "b": first, "c": first}) == [second, first, spare]
    assert stage_order(p, {"a": first, "b": second, "c": first}) is None


def test_deterministic_runs_give_the_same_plan():
    p = zoo.problem([(f"n{i}", 1 + (i * 7) % 5, 0) for i in range(12)],
                    [(f"n{i}", f"n{j}", 10 * ((i + j) % 4)) for i in range(12)
                     for j in range(i + 1, min(12, i + 3))], zoo.cluster(3))
    runs = [solve(p, time_limit_s=1, deterministic=True) for _ in range(2)]
    assert runs[0].schedule.placement == runs[1].schedule.placement
    assert runs[0].schedule.makespan_s == runs[1].schedule.makespan_s


def test_unknown_objective_is_named():
    with pytest.raises(AutoplaceError, match="unknown objective 'speed'.*latency, throughput"):
        solve(zoo.chain(zoo.cluster(2)), objective="speed")


def test_options_are_checked_when_made():
    with pytest.raises(AutoplaceError, match=r"unknown solver 'magic'; valid solvers: cpsat, "):
        SolveOptions(solver="magic")
    with pytest.raises(AutoplaceError, match="unknown objective 'speed'.*latency, throughput"):
        SolveOptions(objective="speed")
    with pytest.raises(AutoplaceError, match=r"time limit must be positive, got 0 s"):
        SolveOptions(time_limit_s=0)
    with pytest.raises(AutoplaceError, match=r"time limit must be positive, got -1 s"):
        solve(zoo.chain(zoo.cluster(2)), time_limit_s=-1)
    with pytest.raises(TypeError):
        SolveOptions(10.0)  # keyword-only
    with pytest.raises(AutoplaceError, match=r"max_nodes must be at least 2, got 1"):
        SolveOptions(max_nodes=1)
    options = SolveOptions(time_limit_s=2, seed=3, objective="throughput")
    assert options.to_dict() == {"time_limit_s": 2, "seed": 3, "deterministic": False,
                                 "objective": "throughput", "contiguous": False,
                                 "workers": None, "solver": "cpsat", "max_nodes": None}
    assert SolveOptions(workers=4).cpsat_workers == 4
    assert SolveOptions(workers=4, deterministic=True).cpsat_workers == 1


def test_options_or_keywords_give_the_same_plan():
    p = zoo.fork_join(zoo.cluster(2))
    by_keywords = solve(p, time_limit_s=1, deterministic=True, objective="throughput")
    by_options = solve(p, options=SolveOptions(time_limit_s=1, deterministic=True,
                                               objective="throughput"))
    on_top = solve(p, options=SolveOptions(time_limit_s=1, deterministic=True),
                   objective="throughput")
    assert by_keywords.schedule.placement == by_options.schedule.placement
    assert by_keywords.schedule.placement == on_top.schedule.placement
    assert by_options.objective == on_top.objective == "throughput"


class _Clock:
    def __init__(self, now_s: float = 100.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def test_the_budget_hands_out_the_named_shares_of_the_limit():
    clock = _Clock()
    budget = Budget(SolveOptions(time_limit_s=10), clock=clock)
    assert budget.baselines_deadline() == pytest.approx(100 + 10 * options.BASELINE_SHARE)
    clock.now_s = 104.0
    assert budget.elapsed_s() == pytest.approx(4.0)
    assert budget.remaining_s() == pytest.approx(6.0)
    assert not budget.expired(budget.baselines_deadline())
    assert budget.exact_round_s() == pytest.approx(6.0 - options.RESULT_MARGIN_S)
    assert budget.coarse_solve_s() == pytest.approx(6.0 * options.COARSE_SHARE)
    assert budget.moves_deadline() == pytest.approx(
        100 + 10 * options.MOVES_SHARE - options.MOVES_MARGIN_S)
    assert budget.moves_evaluations(1000) is None
    clock.now_s = 109.95  # too little left to start CP-SAT again; the coarse model gets a floor
    assert budget.expired(budget.baselines_deadline())
    assert budget.exact_round_s() is None
    assert budget.coarse_solve_s() == options.MIN_CPSAT_S


def test_a_deterministic_budget_ignores_the_clock():
    clock = _Clock()
    budget = Budget(SolveOptions(time_limit_s=6, deterministic=True), clock=clock)
    clock.now_s = 1e6
    assert not budget.expired(budget.baselines_deadline())
    assert budget.moves_deadline() == math.inf
    assert budget.exact_round_s() == 6 / options.MEMORY_ROUNDS
    assert budget.coarse_solve_s() == 6 / options.COARSE_PARTS
    assert budget.moves_evaluations(1000) == int(options.MOVES_PER_NODE_S * 6 / 1000)
    assert budget.moves_evaluations(10**9) == options.MIN_MOVES


def test_whatif_rows_get_a_tenth_of_the_limit_at_most_one_second():
    assert whatif_options(SolveOptions(time_limit_s=5, seed=2)) == SolveOptions(
        time_limit_s=0.5, seed=2)
    assert whatif_options(SolveOptions(time_limit_s=60)).time_limit_s == WHATIF_TIME_LIMIT_S


def test_cpsat_stops_when_asked_and_says_it_was_interrupted():
    p = zoo.fork_join(zoo.cluster(2))
    asked = []

    def stop() -> bool:
        asked.append(1)
        return True

    r = solve_cpsat(p, time_limit_s=10, workers=1, stop=stop)
    assert r.interrupted and asked == [1]
    assert r.placement is not None or r.status == "UNKNOWN"


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_large_graphs_coarsen_solve_expand_and_improve(monkeypatch, objective):
    # Force the large-graph path on a 30-node graph: coarsened to 8 nodes, then local moves.
    import autoplace.solve as solve_module

    monkeypatch.setitem(solve_module.EXACT_MAX_NODES, objective, 8)
    n = 30
    p = zoo.problem([(f"n{i}", 1 + (i * 7) % 5, 10) for i in range(n)],
                    [(f"n{i}", f"n{j}", 10 * (1 + (i + j) % 3)) for i in range(n)
                     for j in (i + 3, i + 5) if j < n], zoo.cluster(3, memory_bytes=10_000),
                    speed={"d1": 2.0})
    r = solve(p, objective=objective, time_limit_s=5, workers=1)
    assert validate(p, r.schedule) == []
    assert r.solver.name == "cpsat (coarsened) + local moves"
    assert r.solver.scope["graph"] == "coarsened" and r.solver.scope["folded_nodes"] == n
    assert r.solver.scope["nodes"] <= 8
    # OPTIMAL only when proven for the full graph: the plan meets its bound.
    assert (r.solver.status == "OPTIMAL") == (r.objective_s <= r.lower_bound_s * (1 + 1e-9))
    steps = dict(r.solver.steps)
    assert any(step.startswith("CP-SAT on") for step in steps)
    assert r.objective_s == pytest.approx(list(steps.values())[-1])
    for baseline in r.baselines.values():
        if baseline is not None and baseline.feasible:
            assert r.objective_s <= baseline.objective_s(objective) + 1e-9
    assert r.lower_bound_s <= r.objective_s


def test_graphs_over_max_nodes_are_warm_started_coarse_then_solved_whole():
    # 30 nodes with max_nodes 8: CP-SAT on <= 8 coarse nodes first, then on all 30 (the exact
    # model takes them), so the status and the bound are the full graph's own.
    n = 30
    p = zoo.problem([(f"n{i}", 1 + (i * 7) % 5, 10) for i in range(n)],
                    [(f"n{i}", f"n{j}", 10 * (1 + (i + j) % 3)) for i in range(n)
                     for j in (i + 3, i + 5) if j < n], zoo.cluster(3, memory_bytes=10_000),
                    speed={"d1": 2.0})
    r = solve(p, time_limit_s=4, workers=1, max_nodes=8)
    assert validate(p, r.schedule) == []
    assert r.solver.scope == {"graph": "folded", "nodes": n, "folded_nodes": n}
    steps = [step for step, _ in r.solver.steps]
    assert steps[-1] == "CP-SAT on the full graph" and any("coarse nodes" in s for s in steps)
    assert r.coarsening and r.objective_s == pytest.approx(r.solver.steps[-1][1])
    for baseline in r.baselines.values():
        if baseline is not None and baseline.feasible:
            assert r.objective_s <= baseline.objective_s("latency") + 1e-9
    assert r.lower_bound_s <= r.objective_s * (1 + 1e-9)


def test_status_text_says_which_graph_cpsat_solved():
    from autoplace.formats.plan import SolverRecord

    coarse = {"graph": "coarsened", "nodes": 68, "folded_nodes": 134, "status": "OPTIMAL"}
    assert SolverRecord("cpsat", "FEASIBLE", 1.0, scope=coarse).status_text == (
        "FEASIBLE (optimal for the coarsened graph, 68 nodes)")
    assert SolverRecord("cpsat", "OPTIMAL", 1.0, scope=coarse).status_text.startswith(
        "OPTIMAL (meets the lower bound; CP-SAT solved the coarsened graph, 68 nodes")
    whole = {"graph": "folded", "nodes": 134, "folded_nodes": 134}
    assert SolverRecord("cpsat", "OPTIMAL", 1.0, scope=whole).status_text == "OPTIMAL"
    record = SolverRecord("cpsat", "FEASIBLE", 1.0, scope=coarse)
    assert SolverRecord.from_dict(record.to_dict()) == record


def test_work_bound_counts_speeds_and_memory():
    # Four 1 s nodes of 100 parameter bytes; d1 is 3x faster. Spread by speed: 4 units over
    # speeds 1 + 3 = 1 s. If d1 holds only 120 bytes, at most 1.2 nodes' work goes there
    # (0.4 s) and d0 keeps 2.8 s; a real plan puts one node on d1 and three on d0: 3 s.
    p = zoo.problem([(f"n{i}", 1, 100) for i in range(4)], [], zoo.cluster(2, memory_bytes=1000),
                    speed={"d1": 3.0})
    assert lower_bound_s(p) == pytest.approx(1.0, rel=1e-6)
    devices = (p.cluster.devices[0], dataclasses.replace(p.cluster.devices[1], memory_bytes=120))
    small = dataclasses.replace(p, cluster=dataclasses.replace(p.cluster, devices=devices))
    assert lower_bound_s(small) == pytest.approx(2.8, rel=1e-6)
    r = solve(small, time_limit_s=5, workers=1)
    assert r.schedule.makespan_s == pytest.approx(3.0)


def test_deterministic_large_graph_path_repeats_itself(monkeypatch):
    import autoplace.solve as solve_module

    monkeypatch.setitem(solve_module.EXACT_MAX_NODES, "latency", 8)
    n = 24
    p = zoo.problem([(f"n{i}", 1 + (i * 7) % 5, 10) for i in range(n)],
                    [(f"n{i}", f"n{j}", 10 * (1 + (i + j) % 3)) for i in range(n)
                     for j in (i + 3, i + 5) if j < n], zoo.cluster(3, memory_bytes=10_000),
                    speed={"d1": 2.0})
    runs = [solve(p, time_limit_s=1, deterministic=True) for _ in range(2)]
    assert runs[0].schedule.placement == runs[1].schedule.placement
    assert runs[0].solver.steps == runs[1].solver.steps


def test_throughput_charges_a_copy_only_for_the_edges_read_on_its_device():
    # Fan-out a -> b (100 bytes: 1 s) and a -> c (800 bytes: 8 s); a 1 s, b and c 5 s each.
    # {a, c} on d0, {b} on d1: d0 computes 6 s and sends a's copy to d1 (only the edge to b
    # is read there: 1 s) = 7; d1 computes 5 and receives 1 = 6. Max load 7 s. One device: 11.
    # Charging the 8 s edge to the copy to d1 (it is read on d0) made this 14 and the model
    # chose one device (11 s) as "OPTIMAL".
    p = zoo.problem([("a", 1, 0), ("b", 5, 0), ("c", 5, 0)],
                    [("a", "b", 100), ("a", "c", 800)], zoo.cluster(2))
    r = solve_cpsat(p, time_limit_s=10, objective="throughput", workers=1)
    assert r.status == "OPTIMAL"
    assert r.objective_s == pytest.approx(7.0)
    assert simulate(p, r.placement).max_load_s == pytest.approx(r.objective_s)
    assert r.bound_s <= simulate(p, r.placement).max_load_s + 1e-9


def test_a_model_too_large_for_cpsat_is_not_built_and_the_heuristics_plan_stands(monkeypatch):
    # 512 devices make each edge of a coarse graph 261,632 delays; here the limit is cut to 1
    import autoplace.solve.cpsat as cpsat

    p = zoo.fork_join(zoo.cluster(2))
    assert cpsat.delay_terms(p) == 4 * len(p.graph.edges)  # both ends on either device
    monkeypatch.setattr(cpsat, "MAX_DELAY_TERMS", 1)
    r = solve(p, time_limit_s=10, workers=1)
    assert r.solver.status == "TOO_LARGE"
    said = (f"CP-SAT not run: its model of {len(p.graph.nodes)} nodes on 2 devices would hold "
            f"{4 * len(p.graph.edges)} transfer delays")
    assert any(n.startswith(said) for n in r.notes)
    assert validate(p, r.schedule) == []
    best = min(b.makespan_s for b in r.baselines.values() if b is not None and b.feasible)
    assert r.schedule.makespan_s <= best and r.lower_bound_s <= r.schedule.makespan_s


def test_a_time_to_beat_at_or_below_the_lower_bound_stops_the_solve_before_any_placement(
        monkeypatch):
    import autoplace.solve as solving
    from autoplace.solve import Outpaced

    p = zoo.fork_join(zoo.cluster(2))
    bound = lower_bound_s(p)
    tried = []
    monkeypatch.setattr(solving, "run_within", lambda *a, **k: tried.append(a) or 1 / 0)
    with pytest.raises(Outpaced, match=f"at least {bound:.6g} s") as beaten:
        solve(p, time_limit_s=10, workers=1, beat_s=bound)
    assert (beaten.value.bound_s, beaten.value.beat_s) == (bound, bound) and not tried
    monkeypatch.undo()
    r = solve(p, time_limit_s=10, workers=1, beat_s=bound * 1.5)
    assert r.lower_bound_s >= bound and validate(p, r.schedule) == []
    # The bound is of the latency objective: a throughput solve ignores a time to beat.
    assert solve(p, time_limit_s=10, workers=1, objective="throughput", beat_s=0.0) is not None
