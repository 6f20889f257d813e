"""The launcher threads (``ir.HostCosts``): a GPU's work is launched from one host thread per
host, so the launches of several GPUs add up there while their kernels overlap."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from zoo import TwoBranch, chain, cluster, fork_join

from autoplace.config import Config, Emit, Solve
from autoplace.formats.plan import read_plan
from autoplace.ir import HostCosts, Placement, Problem
from autoplace.pipeline import plan, save
from autoplace.simulate import simulate, validate
from autoplace.solve.cpsat import solve_cpsat


def _launched(problem: Problem, *, launch: float | None = None, call: float = 0.0,
              handover: float = 0.0) -> Problem:
    """``problem`` with every device launched from one thread: each node's launches take
    ``launch`` seconds (default: all of its time, a launch-bound model)."""
    names = problem.cluster.names
    launch_s = {n.name: {d: problem.costs.of(n.name, d) if launch is None else launch
                         for d in names} for n in problem.graph.nodes}
    host = HostCosts(launch_s=launch_s, call_s=dict.fromkeys(names, call),
                     handover_s=dict.fromkeys(names, handover))
    return dataclasses.replace(problem, costs=dataclasses.replace(problem.costs, host=host))


SPLIT = {"a": "d0", "b": "d0", "c": "d1", "d": "d1"}


def _workers(problem: Problem, *, call: float, handover: float,
             launch: float | None = None, switch: float = 0.0) -> Problem:
    """``problem`` with every device a CPU worker (``own_thread``): each a process of its own,
    or, with ``launch`` (each node's dispatch), threads of one process sharing its
    interpreter."""
    names = problem.cluster.names
    own = ({d: d for d in names} if launch is None else dict.fromkeys(names, "python"))
    launch_s = {} if launch is None else {n.name: dict.fromkeys(names, launch)
                                          for n in problem.graph.nodes}
    host = HostCosts(launch_s=launch_s, call_s=dict.fromkeys(names, call),
                     handover_s=dict.fromkeys(names, handover), own_thread=own,
                     switch_s=dict.fromkeys(names, switch))
    return dataclasses.replace(problem, costs=dataclasses.replace(problem.costs, host=host))


def test_a_cpu_worker_pays_its_calls_and_handovers_between_its_own_ops() -> None:
    # a -> b -> c, 1 s each, edges 1 s; a, c on d0 and b on d1, calls 2 s, handovers 3 s, each
    # on the worker that makes it. d0: call 0..2, a 2..3, hands a over 3..6 (copy 6..7); d1
    # waits for it, call 7..9, b 9..10, hands it over 10..13 (copy 13..14); d0: call 14..16,
    # c 16..17. (One launcher for both would pay the same, but never wait for its own work.)
    problem = _workers(chain(cluster(2)), call=2.0, handover=3.0)
    assert problem.launchers == {"d0": "d0", "d1": "d1"}
    schedule = simulate(problem, Placement(device_of={"a": "d0", "b": "d1", "c": "d0"}))
    assert [schedule.start_s[n] for n in "abc"] == pytest.approx([2.0, 9.0, 16.0])
    assert schedule.makespan_s == pytest.approx(17.0)
    copies = [x for t in schedule.transfers for x in (t.start_s, t.end_s)]
    assert copies == pytest.approx([6.0, 7.0, 13.0, 14.0])
    assert validate(problem, schedule) == []
    lone = simulate(problem, Placement(device_of=dict.fromkeys("abc", "d0")))
    assert lone.makespan_s == pytest.approx(5.0)  # one segment: one call


def test_cpu_workers_pay_their_calls_in_parallel() -> None:
    # fork_join split, calls 0.1 s: d0 calls a's segment (0..0.1, a 0.1..1.1) and hands a
    # over (arrives 2.1); d1 calls c's at 2.1 (c 2.2..12.2) while d0 calls b's at 1.1 (b
    # 1.2..11.2, handed over at 11.2, there at 12.2); d1 calls d's (12.2..12.3, d ..13.3).
    problem = _workers(fork_join(cluster(2)), call=0.1, handover=0.0)
    schedule = simulate(problem, Placement(device_of=SPLIT))
    assert [schedule.start_s[n] for n in "abcd"] == pytest.approx([0.1, 1.2, 2.2, 12.3])
    assert schedule.makespan_s == pytest.approx(13.3)
    assert validate(problem, schedule) == []


def test_cpu_worker_threads_of_one_process_share_its_interpreter() -> None:
    # x on d0 and y on d1, 2 s each, all of it dispatch: as processes of their own they run
    # together (2 s); as threads of one process each holds the interpreter for its dispatch,
    # so y waits for x (4 s). Its calls hold it too: 1 s each, before each node.
    from zoo import problem

    two = problem([("x", 2, 0), ("y", 2, 0)], [], cluster(2), outputs=("x", "y"))
    split = Placement(device_of={"x": "d0", "y": "d1"})
    processes = _workers(two, call=0.0, handover=0.0)
    threads = _workers(two, call=0.0, handover=0.0, launch=2.0)
    assert processes.launchers == {"d0": "d0", "d1": "d1"}
    assert threads.launchers == {"d0": "python", "d1": "python"}
    assert simulate(processes, split).makespan_s == pytest.approx(2.0)
    schedule = simulate(threads, split)
    assert schedule.makespan_s == pytest.approx(4.0)
    assert validate(threads, schedule) == []
    called = simulate(_workers(two, call=1.0, handover=0.0, launch=2.0), split)
    assert called.makespan_s == pytest.approx(6.0)  # call, x, call, y: all on the one lock
    # Taking the lock from the other thread costs a hand-off: y wants it at 0, x holds it to 2.
    switched = _workers(two, call=0.0, handover=0.0, launch=2.0, switch=0.5)
    schedule = simulate(switched, split)
    assert schedule.makespan_s == pytest.approx(4.5)
    assert validate(switched, schedule) == []
    lone = simulate(switched, Placement(device_of={"x": "d0", "y": "d0"}))
    assert lone.makespan_s == pytest.approx(4.0)  # its own thread: no hand-off


def test_launch_bound_work_gains_nothing_from_a_second_device() -> None:
    # fork_join: 22 s on one device; split, 13 s when nothing is launched (see tests/zoo.py).
    # With every second of it launched from the one host thread, the launches alone take 22 s,
    # so no split can beat the single device.
    free = fork_join(cluster(2))
    bound = _launched(free)
    assert simulate(free, Placement(device_of=SPLIT)).makespan_s == pytest.approx(13.0)
    one = simulate(bound, Placement(device_of=dict.fromkeys(SPLIT, "d0")))
    assert one.makespan_s == pytest.approx(22.0)  # a lone device never waits for its launcher
    split = simulate(bound, Placement(device_of=SPLIT))
    assert split.makespan_s >= 22.0 - 1e-9
    assert validate(bound, split) == [] and validate(bound, one) == []


def test_free_launches_leave_the_schedule_as_it_was() -> None:
    free = fork_join(cluster(2))
    split = simulate(_launched(free, launch=0.0), Placement(device_of=SPLIT))
    assert split.makespan_s == pytest.approx(13.0)
    assert dict(split.start_s) == dict(simulate(free, Placement(device_of=SPLIT)).start_s)


def test_segment_calls_and_handovers_are_paid_on_the_host() -> None:
    # a -> b -> c, 1 s each, edges 1 s. a, c on d0 and b on d1: three segments (3 calls of 2 s)
    # and two handovers of 3 s. a: call 0..2, runs 2..3; its handover is issued 2..5 and the
    # copy takes 5..6; b's call 5..7, b runs 7..8; handover 7..10, copy 10..11; c's call
    # 10..12, c runs 12..13.
    problem = _launched(chain(cluster(2)), launch=0.0, call=2.0, handover=3.0)
    schedule = simulate(problem, Placement(device_of={"a": "d0", "b": "d1", "c": "d0"}))
    assert [schedule.start_s[n] for n in "abc"] == pytest.approx([2.0, 7.0, 12.0])
    assert schedule.makespan_s == pytest.approx(13.0)
    copies = [x for t in schedule.transfers for x in (t.start_s, t.end_s)]
    assert copies == pytest.approx([5.0, 6.0, 10.0, 11.0])  # pytest 9: approx is flat only
    assert validate(problem, schedule) == []


def test_the_launch_order_keeps_each_device_s_order_and_runs_a_device_s_work_together() -> None:
    problem = _launched(fork_join(cluster(2)), launch=0.5, call=1.0)
    schedule = simulate(problem, Placement(device_of=SPLIT))
    order = schedule.launch_order
    assert sorted(order) == sorted(SPLIT)
    position = {n: i for i, n in enumerate(order)}
    assert all(position[e.src] < position[e.dst] for e in problem.graph.edges)
    for device in ("d0", "d1"):
        mine = [n for n in order if SPLIT[n] == device]
        assert mine == sorted(mine, key=lambda n: schedule.start_s[n])
    # Two segments, one per device: the launcher does not switch back and forth.
    switches = sum(SPLIT[a] != SPLIT[b] for a, b in zip(order, order[1:]))
    assert switches == 1


@pytest.mark.parametrize("launch", [0.0, 0.5, 0.9, None])
def test_cpsat_bound_holds_under_the_launcher(launch: float | None) -> None:
    problem = _launched(fork_join(cluster(2)), launch=launch, call=0.25, handover=0.5)
    result = solve_cpsat(problem, time_limit_s=5, deterministic=True)
    assert result.placement is not None
    placements = [result.placement, Placement(device_of=SPLIT),
                  Placement(device_of=dict.fromkeys(SPLIT, "d0"))]
    for placement in placements:
        assert result.bound_s <= simulate(problem, placement).makespan_s + 1e-9
    if launch is None:  # launch-bound: the launches alone take 22 s
        assert result.bound_s >= 22.0 - 1e-6


def _side_launches() -> Problem:
    # Four launch-bound nodes s0..s3 (1 s each, all of it launches) feed j beside the path
    # p0 -> p1 -> j (1 s each, 0.1 s of launches). Critical path 3 s, work 7 s over two
    # devices 3.5 s; but the one thread launches all of j's ancestors before j: a call (0.25)
    # + 4 + 0.2 = 4.45 s, then j's 1 s: no placement ends before 5.45 s.
    from zoo import problem

    names = ["s0", "s1", "s2", "s3", "p0", "p1", "j"]
    p = problem([(n, 1.0, 0) for n in names],
                [*((f"s{i}", "j", 10) for i in range(4)), ("p0", "p1", 10), ("p1", "j", 10)],
                cluster(2), outputs=("j",))
    launch_s = {n: dict.fromkeys(p.cluster.names, 1.0 if n.startswith("s") else 0.1)
                for n in names}
    host = HostCosts(launch_s=launch_s, call_s=dict.fromkeys(p.cluster.names, 0.25),
                     handover_s=dict.fromkeys(p.cluster.names, 0.5))
    return dataclasses.replace(p, costs=dataclasses.replace(p.costs, host=host))


def test_a_node_is_released_once_the_thread_has_launched_its_ancestors() -> None:
    import itertools

    from autoplace.solve.bounds import launch_release_s, lower_bound_s

    p = _side_launches()
    release = launch_release_s(p)
    assert release["s0"] == pytest.approx(0.25) and release["p1"] == pytest.approx(0.35)
    assert release["j"] == pytest.approx(4.45)
    bound = lower_bound_s(p)
    assert bound == pytest.approx(5.45, rel=1e-6)
    names = [n.name for n in p.graph.nodes]
    best = min(simulate(p, Placement(device_of=dict(zip(names, devices)))).makespan_s
               for devices in itertools.product(p.cluster.names, repeat=len(names)))
    assert bound <= best + 1e-9
    # Two host threads (say, CPU workers with their own) release nothing: the ancestors'
    # launches need not add up on one thread.
    two = dataclasses.replace(p, cluster=dataclasses.replace(p.cluster, devices=tuple(
        dataclasses.replace(d, host=f"h{i}") for i, d in enumerate(p.cluster.devices))))
    assert two.sole_launcher is None and launch_release_s(two) == {}
    assert lower_bound_s(two) == pytest.approx(3.5)


@pytest.mark.parametrize("devices", ["2xA100-40GB", "2xcpu-thread"])
def test_plan_json_keeps_the_launcher_and_re_simulates_the_same(tmp_path, devices) -> None:
    planned = plan(
        TwoBranch(),
        (torch.randn(8, 16),),
        Config(
            devices=devices,
            solve=Solve(time_limit_s=1, whatif=False, min_gain=0.0),
            emit=Emit(verify=False),
        ),
    )
    save(planned, tmp_path)
    planned = planned.plan
    assert planned.problem.costs.host is not None
    again = read_plan(tmp_path)
    assert again.problem.costs.host == planned.problem.costs.host
    assert again.schedule.launch_order == planned.schedule.launch_order
    resimulated = simulate(again.problem, again.schedule.placement)
    assert resimulated.makespan_s == pytest.approx(planned.makespan_s)
    assert validate(again.problem, again.schedule) == []


@pytest.mark.parametrize("call, handover", [(0.0, 0.0), (2.0, 3.0), (0.5, 4.0)])
def test_optimal_means_the_plan_meets_its_bound_under_the_launcher(call, handover) -> None:
    # CP-SAT bounds the launcher's calls and handovers but does not schedule them: where its
    # model is looser than the simulator, its OPTIMAL must not reach the plan.
    from autoplace.solve import solve

    problem = _launched(fork_join(cluster(2)), launch=0.5, call=call, handover=handover)
    result = solve(problem, time_limit_s=5, deterministic=True)
    assert result.lower_bound_s <= result.objective_s + 1e-9
    if result.solver.status == "OPTIMAL":
        assert result.objective_s <= result.lower_bound_s * (1 + 1e-3) + 1e-9


def test_a_measured_launcher_replaces_the_catalog_estimates() -> None:
    from autoplace.cluster import resolve_cluster
    from autoplace.profile.cost import costs
    from autoplace.trace import trace_model
    from cost_models.devices import GPU_HANDOVER_S, GPU_SEGMENT_CALL_S

    traced = trace_model(TwoBranch(), (torch.randn(8, 16),))
    cluster, _ = resolve_cluster(spec="A100-40GB,cpu")
    estimated = costs(traced.graph, cluster).host
    measured = costs(traced.graph, cluster, launcher=(3e-6, 7e-6)).host
    assert estimated is not None and measured is not None
    assert set(estimated.call_s) == {"cuda:0"}  # the CPU has no launcher: its thread does all
    assert (estimated.call_s["cuda:0"], estimated.handover_s["cuda:0"]) == (
        GPU_SEGMENT_CALL_S, GPU_HANDOVER_S)
    assert (measured.call_s["cuda:0"], measured.handover_s["cuda:0"]) == (3e-6, 7e-6)
    for node in traced.graph.nodes:  # launches never exceed the node's own time
        if node.name in measured.launch_s:
            assert 0 < measured.launch_s[node.name]["cuda:0"] <= costs(
                traced.graph, cluster).of(node.name, "cuda:0")


def test_cpu_workers_get_their_threads_and_threads_of_one_process_one_interpreter() -> None:
    from autoplace.cluster import resolve_cluster
    from autoplace.emit.codegen.source import runtime_namespace
    from autoplace.profile.cost import costs
    from autoplace.profile.launcher import measure_worker
    from autoplace.trace import trace_model
    from cost_models.devices import CPU_WORKER_CALL_S, CPU_WORKER_DISPATCH_S

    traced = trace_model(TwoBranch(), (torch.randn(8, 16),))
    threads, _ = resolve_cluster(spec="2xcpu-thread")
    host = costs(traced.graph, threads).host
    assert host is not None and set(host.own_thread) == {"cpu:0", "cpu:1"}
    assert len(set(host.own_thread.values())) == 1  # one process: one interpreter
    assert host.call_s["cpu:0"] == CPU_WORKER_CALL_S
    dispatch = {n.name: host.launch_of(n.name, "cpu:0") for n in traced.graph.nodes
                if n.launches}
    assert dispatch and all(0 < t <= CPU_WORKER_DISPATCH_S * 4 for t in dispatch.values())
    processes, _ = resolve_cluster(spec="2xcpu-process")
    own = costs(traced.graph, processes).host
    assert own is not None and {d: t for d, t in own.own_thread.items()} == {
        "cpu:0": "cpu:0", "cpu:1": "cpu:1"}  # each rank a process: its own interpreter
    assert not any(own.launch_s.values())
    measured = measure_worker(engine=runtime_namespace(), calls=50, rounds=3)
    assert len(measured) == 4 and all(0 <= t < 1e-3 for t in measured)
    assert measured[1] > 0 and measured[2] > 0
    given = costs(traced.graph, threads, worker=(1e-6, 2e-6, 3e-6, 4e-6)).host
    assert (given.call_s["cpu:1"], given.handover_s["cpu:1"]) == (1e-6, 2e-6)
    assert given.switch_s == {"cpu:0": 4e-6, "cpu:1": 4e-6}
    assert not own.switch_s  # a process of its own: nobody to take the interpreter from


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_launcher_is_measured_on_a_gpu() -> None:
    from autoplace.emit.codegen.source import runtime_namespace
    from autoplace.profile.launcher import measure_launcher

    call_s, handover_s = measure_launcher("cuda:0", engine=runtime_namespace(), calls=100,
                                          rounds=3)
    assert 0 <= call_s < 1e-3 and 0 < handover_s < 1e-3


def test_local_moves_take_back_a_copy_the_launcher_pays_for() -> None:
    # a -> b -> c split d0, d1, d0 takes 13 s under the launcher (see above); b is no node of
    # the critical path's last arrivals alone, but it is an end of both copies, and moving it
    # home saves two handovers and two segment calls: 2 + 3 * 1 = 5 s on one device.
    import math

    from autoplace.solve.large import improve

    problem = _launched(chain(cluster(2)), launch=0.0, call=2.0, handover=3.0)
    split = simulate(problem, Placement(device_of={"a": "d0", "b": "d1", "c": "d0"}))
    best, moves = improve(problem, split, objective="latency", deadline=math.inf,
                          max_evaluations=20)
    assert moves >= 1 and best.makespan_s == pytest.approx(5.0)
    assert set(best.placement.device_of.values()) == {"d0"}


def test_a_launcher_nothing_is_placed_on_costs_nothing_in_the_bound() -> None:
    # a -> b -> c: 1 s each on d1 (no launcher, a CPU), 100 s each on d0 (launched; a segment
    # call 5 s, a launch 1 s). All on d1 takes 3 s, and CP-SAT's bound may not exceed it: the
    # launcher's call and launches count only for what is placed on its devices.
    base = chain(cluster(2, types=["G", "C"]))
    base = dataclasses.replace(base, costs=dataclasses.replace(base.costs, compute_s={
        n: {"d0": 100 * t["d0"], "d1": t["d1"]} for n, t in base.costs.compute_s.items()}))
    host = HostCosts(launch_s={n: {"d0": 1.0} for n in "abc"}, call_s={"d0": 5.0},
                     handover_s={"d0": 0.0})
    problem = dataclasses.replace(base, costs=dataclasses.replace(base.costs, host=host))
    on_cpu = simulate(problem, Placement(device_of=dict.fromkeys("abc", "d1")))
    assert on_cpu.makespan_s == pytest.approx(3.0) and validate(problem, on_cpu) == []
    result = solve_cpsat(problem, time_limit_s=5, deterministic=True)
    assert result.bound_s <= on_cpu.makespan_s + 1e-9
    assert simulate(problem, result.placement).makespan_s == pytest.approx(3.0)


def test_launches_longer_than_the_node_are_refused() -> None:
    from autoplace.errors import GraphError

    with pytest.raises(GraphError, match="more than its"):
        _launched(fork_join(cluster(2)), launch=2.0)


def test_validate_re_times_a_schedule_in_its_launch_order() -> None:
    # The launcher-free schedule of the split chain (5 s) is not what the launcher gives (13 s):
    # validate must say so, even with the right launch order written on it.
    problem = _launched(chain(cluster(2)), launch=0.0, call=2.0, handover=3.0)
    placement = Placement(device_of={"a": "d0", "b": "d1", "c": "d0"})
    right = simulate(problem, placement)
    free = simulate(chain(cluster(2)), placement)
    forged = dataclasses.replace(free, launch_order=right.launch_order)
    assert validate(problem, right) == []
    problems = validate(problem, forged)
    assert any("launched in its order" in p for p in problems)
    backwards = dataclasses.replace(right, launch_order=tuple(reversed(right.launch_order)))
    assert any("before one of its inputs" in p for p in validate(problem, backwards))
