"""Micro-batches in a training step (``train.step_problem(microbatches=M)``) and the orders
GPipe and 1F1B give each device (``simulate.schedules``)."""

from __future__ import annotations

import pytest
from test_train import MLP, WithLoss, _forward_problem

from autoplace.formats.plan import Plan
from autoplace.ir import Placement
from autoplace.simulate import simulate, validate
from autoplace.simulate.schedules import microbatch_order, phase_of, schedule_run
from autoplace.train import step_problem


@pytest.mark.parametrize(("name", "parsed"), [
    ("linear", ("linear", "forward", None)),
    ("linear@backward", ("linear", "backward", None)),
    ("linear@step", ("linear", "step", None)),
    ("linear#3", ("linear", "forward", 3)),
    ("linear@backward#12", ("linear", "backward", 12)),
    # only the suffixes the step graph adds are read
    ("a#b", ("a#b", "forward", None)),
    ("x@backwardy#1", ("x@backwardy", "forward", 1)),
])
def test_phase_of_reads_only_the_step_graph_s_suffixes(name: str, parsed: tuple) -> None:
    assert phase_of(name) == parsed


def _split(problem, first: int):
    """The step's nodes on two devices: the first ``first`` forward nodes (and their backward
    and step) on the first device, the rest on the second."""
    forward = [n.name for n in problem.graph.nodes if phase_of(n.name)[1] == "forward"
               and phase_of(n.name)[2] in (0, None)]
    head = {phase_of(n)[0] for n in forward[:first]}
    a, b = problem.cluster.names[:2]
    return {n.name: a if phase_of(n.name)[0] in head else b for n in problem.graph.nodes}


def _blocks(order: tuple[str, ...]) -> list[tuple[str, int]]:
    """A device's order as its run of (phase, micro-batch) blocks."""
    runs: list[tuple[str, int]] = []
    for name in order:
        _, phase, k = phase_of(name)
        if phase != "step" and (not runs or runs[-1] != (phase[0], k)):
            runs.append((phase[0], k))
    return runs


def test_gpipe_runs_every_forward_then_every_backward_and_1f1b_alternates() -> None:
    forward = _forward_problem(WithLoss(MLP()), "2xcpu-thread")
    gpipe = step_problem(forward, "adam", microbatches=4, schedule="gpipe")
    device_of = _split(gpipe, 4)
    a, b = gpipe.cluster.names[:2]
    order = microbatch_order(gpipe.graph, device_of, "gpipe")
    assert _blocks(order[a]) == _blocks(order[b]) == [
        ("f", 0), ("f", 1), ("f", 2), ("f", 3), ("b", 0), ("b", 1), ("b", 2), ("b", 3)]
    order = microbatch_order(gpipe.graph, device_of, "1f1b")
    # the first stage warms up with one forward (one device after it), the last with none
    assert _blocks(order[a]) == [("f", 0), ("f", 1), ("b", 0), ("f", 2), ("b", 1), ("f", 3),
                                 ("b", 2), ("b", 3)]
    assert _blocks(order[b]) == [("f", 0), ("b", 0), ("f", 1), ("b", 1), ("f", 2), ("b", 2),
                                 ("f", 3), ("b", 3)]
    # the updates come last, after every micro-batch's backward
    phases = [phase_of(n)[1] for n in order[a]]
    assert "step" in phases and phases[phases.index("step"):] == ["step"] * phases.count("step")


def test_1f1b_holds_fewer_micro_batches_than_gpipe_and_both_are_valid_schedules() -> None:
    forward = _forward_problem(WithLoss(MLP()), "2xcpu-thread")
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        problem = step_problem(forward, "adam", microbatches=4, schedule=schedule)
        s = simulate(problem, Placement(device_of=_split(problem, 4)))
        validate(problem, s)
        assert s.placement.order == microbatch_order(problem.graph, s.placement.device_of,
                                                     schedule)
        peaks[schedule] = s.peak_bytes
    last = problem.cluster.names[1]
    assert peaks["1f1b"][last] < peaks["gpipe"][last]


def test_devices_that_feed_each_other_both_ways_run_gpipe_s_order_under_1f1b() -> None:
    forward = _forward_problem(WithLoss(MLP()), "2xcpu-thread")
    problem = step_problem(forward, "sgd", microbatches=2, schedule="1f1b")
    a, b = problem.cluster.names[:2]
    names = [n.name for n in forward.graph.nodes]
    cycle = {name: (a if i % 2 else b) for i, name in enumerate(names)}
    device_of = {n.name: cycle[phase_of(n.name)[0]] for n in problem.graph.nodes}
    assert microbatch_order(problem.graph, device_of, "1f1b") == microbatch_order(
        problem.graph, device_of, "gpipe")
    validate(problem, simulate(problem, Placement(device_of=device_of)))


def test_a_step_of_m_micro_batches_copies_forward_and_backward_but_not_the_update() -> None:
    forward = _forward_problem(WithLoss(MLP()), "2xcpu-thread")
    one = step_problem(forward, "adam")
    four = step_problem(forward, "adam", microbatches=4, schedule="1f1b")
    steps = [n for n in one.graph.nodes if phase_of(n.name)[1] == "step"]
    assert len(four.graph.nodes) == 4 * (len(one.graph.nodes) - len(steps)) + len(steps)
    assert four.graph.outputs == ()  # the caller keeps the losses' scalars only
    # parameters are counted once, on micro-batch 0's copy
    for field in ("param_bytes", "trainable_bytes"):
        assert sum(getattr(n, field) for n in four.graph.nodes) == sum(
            getattr(n, field) for n in one.graph.nodes)
    # every copy of a node shares its colocation group, with its backward and update
    group = next(g for g in four.graph.colocate if "linear#0" in g)
    assert {"linear#3", "linear@backward#2", "linear@step"} <= set(group)
    # each update waits for the backward of every micro-batch
    into = {e.src for e in four.graph.edges if e.dst == "linear@step"}
    assert into == {f"linear@backward#{k}" for k in range(4)}
    assert four.pipeline_schedule == "1f1b" and one.pipeline_schedule is None


def test_an_edge_between_two_updates_is_kept_once_across_the_micro_batches() -> None:
    """A step whose updates run in an order (the tensor-parallel step's: an edge from one
    update to the next) keeps that edge once, between the updates themselves, not as an edge
    from a micro-batch copy that does not exist."""
    from dataclasses import replace

    from autoplace.ir import Edge
    from autoplace.train.graph import microbatch_copies

    forward = _forward_problem(WithLoss(MLP()), "2xcpu-thread")
    one = step_problem(forward, "adam")
    updates = [n.name for n in one.graph.nodes if phase_of(n.name)[1] == "step"]
    ordered = replace(one, graph=replace(one.graph, edges=(
        *one.graph.edges, Edge(src=updates[0], dst=updates[1], bytes=0))))
    three = microbatch_copies(ordered, 3, "gpipe")
    between = [e for e in three.graph.edges if e.src == updates[0] and e.dst == updates[1]]
    assert len(between) == 1
    names = {n.name for n in three.graph.nodes}
    assert all(e.src in names and e.dst in names for e in three.graph.edges)


def test_the_schedule_and_trainable_bytes_survive_plan_json() -> None:
    forward = _forward_problem(WithLoss(MLP()), "2xcpu-thread")
    problem = step_problem(forward, "adam", microbatches=2, schedule="1f1b")
    s = simulate(problem, Placement(device_of=_split(problem, 4)))
    plan = Plan(problem=problem, schedule=s, lower_bound_s=0.0, solver=_record(),
                baselines={}, best_single_device=None)
    back = Plan.from_dict(plan.to_dict())
    assert back.problem.pipeline_schedule == "1f1b"
    assert [n.trainable_bytes for n in back.problem.graph.nodes] == [
        n.trainable_bytes for n in problem.graph.nodes]
    again = simulate(back.problem, Placement(device_of=s.placement.device_of))
    assert again.makespan_s == pytest.approx(s.makespan_s)


def _record():
    from autoplace.formats.plan import SolverRecord

    return SolverRecord(name="test", status="FEASIBLE", wall_s=0.0)


def test_inputs_on_the_last_stage_do_not_turn_1f1b_into_gpipe() -> None:
    # The targets go to the loss's device; an input reads nothing, so waits for no device:
    # its value makes no stage, and 1F1B keeps its warm-up.
    forward = _forward_problem(WithLoss(MLP()), "2xcpu-thread")
    problem = step_problem(forward, "adam", microbatches=4, schedule="1f1b")
    device_of = _split(problem, 4)
    a, b = problem.cluster.names[:2]
    device_of.update({n.name: b for n in problem.graph.nodes if phase_of(n.name)[0] == "y"})
    order = microbatch_order(problem.graph, device_of, "1f1b")
    assert _blocks(order[b])[:3] == [("f", 0), ("b", 0), ("f", 1)]
    assert schedule_run(problem.graph, device_of, "1f1b") == "1f1b"
    validate(problem, simulate(problem, Placement(device_of=device_of)))


def test_a_step_keeps_no_loss_to_its_end() -> None:
    # What the loss saves for its backward (its log-softmax) is freed by that backward: at the
    # end a device holds its resident bytes and the inputs, which the caller holds.
    forward = _forward_problem(WithLoss(MLP()), "cpu")
    for count, schedule in ((1, "gpipe"), (4, "1f1b")):
        problem = step_problem(forward, "sgd", microbatches=count, schedule=schedule)
        s = simulate(problem, Placement(device_of=dict.fromkeys(
            (n.name for n in problem.graph.nodes), "cpu")))
        inputs = sum(n.output_bytes for n in problem.graph.nodes if n.is_input)
        settled = dict(s.memory_timeline["cpu"])  # each time's last level
        last = max(t for t in settled if t < s.makespan_s)  # as the last update starts
        assert settled[last] == s.resident_bytes["cpu"] + inputs  # SGD: no workspace
