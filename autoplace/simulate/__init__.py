"""The one event-driven simulator: every placement, the solver's or a baseline's, is scored here.

The model is the one ``plan.json`` documents, so anyone can re-check a plan; its rules are written
out in ``docs/concepts.md``, "The simulator's rules". In short: a device runs one node at a time; a
node starts once its inputs have arrived (``latency_s + bytes / bandwidth``, or an edge's
``transfer_s``, after the producer ends; one copy per other device that reads it; copies crossing a
shared resource split it max-min fair, ``contention``); a device runs its nodes in
``Placement.order``, else its ready node of highest upward rank (list scheduling, as HEFT ranks),
or in a training step's schedule (``schedules``: GPipe, 1F1B); where ``costs.host`` gives devices a
launcher, ``launch.launched`` times the schedule again with it; memory is the resident bytes plus
values live as the emitted model holds them (``memory``). For pipelined execution a device's
**load** is its compute plus its communication, as PipeDream and Tarnawski et al. (NeurIPS 2020)
define it (``loads``; each copy paid by both ends, no communication on a device with
``charges_transfers=False``). Read ``simulate`` first, then ``_run`` (the event loop),
``launch.launched`` and ``memory.memory``; ``validate`` re-checks a schedule independently.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Mapping

from autoplace.errors import GraphError
from autoplace.ir import (
    Edge,
    OpGraph,
    Placement,
    Problem,
    Schedule,
    Transfer,
)
from autoplace.simulate.contention import Copies, replay
from autoplace.simulate.launch import Contended, as_delays, launched, timed
from autoplace.simulate.memory import memory, start_order
from autoplace.simulate.schedules import microbatch_order

__all__ = ["copies", "loads", "simulate", "upward_rank", "validate"]

_EPS = 1e-12


def upward_rank(
    problem: Problem,
    device_of: Mapping[str, str] | None = None,
    *,
    edge_s: Callable[[Edge], float] | None = None,
) -> dict[str, float]:
    """Longest time from a node's start to the end of the graph (HEFT's upward rank).

    With ``device_of`` the node's own device and the actual links are used; without it, the
    mean over the devices it can run on, and ``edge_s(edge)`` per edge (HEFT's rank before
    placement: the mean over links), no communication when that is ``None``.
    """
    # Hand-written, not networkx: its longest paths give one path, not every node's rank, and
    # this runs in every simulation (a walk up the topological order the graph is kept in).
    graph, costs = problem.graph, problem.costs
    if device_of is not None:
        def edge_s(e: Edge) -> float:
            return problem.delay_s(e, device_of[e.src], device_of[e.dst])
    rank: dict[str, float] = {}
    for node in reversed(graph.nodes):
        if device_of is None:
            allowed = problem.allowed[node.name]
            own = sum(costs.of(node.name, d) for d in allowed) / len(allowed)
        else:
            own = costs.of(node.name, device_of[node.name])
        tail = 0.0
        for e in graph.out_edges(node.name):
            comm = 0.0 if edge_s is None else edge_s(e)
            tail = max(tail, comm + rank[e.dst])
        rank[node.name] = own + tail
    return rank


def copies(
    problem: Problem, device_of: Mapping[str, str]
) -> dict[tuple[str, str], tuple[int, float]]:
    """The copies a placement makes: (node, other device) -> (bytes, seconds), the largest read
    there."""
    moved: dict[tuple[str, str], tuple[int, float]] = {}
    for e in problem.graph.edges:
        src_dev, dst_dev = device_of[e.src], device_of[e.dst]
        if src_dev != dst_dev:
            nbytes, secs = moved.get((e.src, dst_dev), (0, 0.0))
            moved[(e.src, dst_dev)] = (max(nbytes, e.bytes),
                                       max(secs, problem.delay_s(e, src_dev, dst_dev)))
    return moved


def loads(
    problem: Problem,
    device_of: Mapping[str, str],
    moved: Mapping[tuple[str, str], tuple[int, float]] | None = None,
) -> dict[str, float]:
    """Each device's compute plus communication per pass (see the module docstring);
    ``moved`` is ``copies(problem, device_of)`` when the caller has it already."""
    load = dict.fromkeys(problem.cluster.names, 0.0)
    for node in problem.graph.nodes:
        load[device_of[node.name]] += problem.costs.of(node.name, device_of[node.name])
    sent: dict[str, float] = {}
    charged = {d.name for d in problem.cluster.devices if d.charges_transfers}
    if moved is None:
        moved = copies(problem, device_of)
    for (src, dst_dev), (_, secs) in moved.items():
        if dst_dev in charged:
            load[dst_dev] += secs
        sent[src] = max(sent.get(src, 0.0), secs)
    for src, secs in sent.items():
        if device_of[src] in charged:
            load[device_of[src]] += secs
    return load


def simulate(problem: Problem, placement: Placement) -> Schedule:
    """Run ``placement`` through the event-driven model and return its ``Schedule``."""
    cluster = problem.cluster
    device_of = _checked_devices(problem, placement)
    moved = copies(problem, device_of)
    moved_from = _by_source(moved)
    order = placement.order
    if problem.pipeline_schedule is not None:  # the schedule's order, whoever placed it
        order = microbatch_order(problem.graph, device_of, problem.pipeline_schedule) or order
    start, end, transfers = _run(problem, device_of, order, moved_from)
    if len(end) != len(problem.graph.nodes) and problem.pipeline_schedule == "1f1b":
        # 1F1B's warm-ups follow the devices' stages, which should not deadlock; GPipe's
        # order, a subsequence of one topological order on every device, cannot.
        order = microbatch_order(problem.graph, device_of, "gpipe") or order
        start, end, transfers = _run(problem, device_of, order, moved_from)
    if len(end) != len(problem.graph.nodes):
        stuck = [n.name for n in problem.graph.nodes if n.name not in end][:5]
        raise GraphError(
            f"the placement's device order deadlocks: {stuck} never start (an order that runs a "
            "node before one of its inputs on the same device)"
        )
    launch_order: tuple[str, ...] = ()
    if problem.launchers:
        launch_order, start, end, transfers = timed(
            problem, device_of, start_order(problem.graph, start, end), moved_from)
    makespan = max(end.values(), default=0.0)
    resident, peak, timeline = memory(problem, device_of, start, end, transfers, makespan,
                                       launch_order)
    over = {d: peak[d] - cluster.device(d).memory_bytes for d in cluster.names
            if peak[d] > cluster.device(d).memory_bytes}
    return Schedule(
        placement=Placement(device_of=device_of, order=order),
        makespan_s=makespan,
        start_s=start,
        end_s=end,
        transfers=tuple(sorted(transfers, key=lambda t: (t.start_s, t.src, t.dst_device))),
        resident_bytes=resident,
        peak_bytes=peak,
        memory_timeline=timeline,
        over_capacity=over,
        load_s=loads(problem, device_of, moved),
        launch_order=launch_order,
    )


def _by_source(
    moved: Mapping[tuple[str, str], tuple[int, float]],
) -> dict[str, list[tuple[str, int, float]]]:
    """``copies``' result per producer: each other device its output goes to, with the bytes
    and seconds (what ``_run`` and ``launch.launched`` take)."""
    moved_from: dict[str, list[tuple[str, int, float]]] = defaultdict(list)
    for (src, dst_dev), (nbytes, secs) in moved.items():
        moved_from[src].append((dst_dev, nbytes, secs))
    return moved_from


def _checked_devices(problem: Problem, placement: Placement) -> dict[str, str]:
    """The placement's devices, each node's checked; and its order, if any, checked to list
    every node once, each under its own device."""
    device_of = dict(placement.device_of)
    names = problem.cluster.names
    for node in problem.graph.nodes:
        dev = device_of.get(node.name)
        if dev is None:
            raise GraphError(f"placement has no device for node {node.name!r}")
        if dev not in names:
            raise GraphError(f"node {node.name!r} is placed on unknown device {dev!r}")
        if dev not in problem.allowed[node.name]:
            raise GraphError(f"node {node.name!r} is placed on {dev!r}, where it cannot run")
    order = placement.order
    if order is not None:
        listed = sorted(n for seq in order.values() for n in seq)
        if listed != sorted(device_of):
            raise GraphError("placement order must list every node exactly once")
        for dev, seq in order.items():
            if any(device_of[n] != dev for n in seq):
                raise GraphError(f"placement order for {dev!r} lists a node placed elsewhere")
    return device_of


def _run(
    problem: Problem,
    device_of: dict[str, str],
    order: Mapping[str, tuple[str, ...]] | None,
    moved_from: Mapping[str, list[tuple[str, int, float]]],
) -> tuple[dict[str, float], dict[str, float], list[Transfer]]:
    """The event loop: each node's start and end (nodes that never start have none), and the
    copies made (``moved_from[node]``: each other device its output goes to, with the bytes and
    seconds). A node becomes ready when its last input has arrived; a device that falls idle
    starts the next node of its ``order``, or its ready node of highest upward rank."""
    # Hand-written, not networkx: the loop is a timed list schedule, not a topological sort,
    # and local search runs it thousands of times (0.1 s a pass on 10,000 nodes).
    graph, cluster, costs = problem.graph, problem.cluster, problem.costs
    pointer = dict.fromkeys(cluster.names, 0)
    priority = upward_rank(problem, device_of) if order is None else {}
    ready_heap: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    ready: set[str] = set()
    busy = dict.fromkeys(cluster.names, False)
    pending = _input_counts(graph)
    data_ready = dict.fromkeys(pending, 0.0)
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    transfers: list[Transfer] = []
    events: list[tuple[float, int, int, str]] = []  # (time, kind: 0 finish / 1 ready, seq, node)
    seq = itertools.count()  # ties at one time and kind go first in, first out
    # Copies over shared resources (none without them): their readers wait for ``arrivals``.
    copying = Copies(problem, device_of)
    awaiting = dict.fromkeys(pending, 0)

    def dispatch(dev: str, now: float) -> None:
        if busy[dev]:
            return
        if order is not None:
            seq_d = order.get(dev, ())
            if pointer[dev] >= len(seq_d) or seq_d[pointer[dev]] not in ready:
                return
            name = seq_d[pointer[dev]]
            pointer[dev] += 1
        else:
            if not ready_heap[dev]:
                return
            name = heapq.heappop(ready_heap[dev])[2]
        ready.discard(name)
        busy[dev] = True
        start[name] = now
        end[name] = now + costs.of(name, dev)
        heapq.heappush(events, (end[name], 0, next(seq), name))

    for node in graph.nodes:
        if pending[node.name] == 0:
            heapq.heappush(events, (0.0, 1, next(seq), node.name))
    while events or copying.busy:
        due = copying.due_s()
        if due <= (events[0][0] if events else math.inf):
            for _, succ, t_in in copying.arrivals(due):
                data_ready[succ] = max(data_ready[succ], t_in)
                awaiting[succ] -= 1
                _when_ready(succ, pending, awaiting, data_ready, events, seq)
            continue
        now, kind, _, name = heapq.heappop(events)
        dev = device_of[name]
        if kind == 1:
            ready.add(name)
            if order is None:
                heapq.heappush(ready_heap[dev], (-priority[name], graph.index[name], name))
            dispatch(dev, now)
            continue
        busy[dev] = False
        transfers += _send(problem, device_of, name, now, moved_from[name], copying,
                           data_ready, awaiting)
        for succ in dict.fromkeys(e.dst for e in graph.out_edges(name)):
            pending[succ] -= 1
            _when_ready(succ, pending, awaiting, data_ready, events, seq)
        dispatch(dev, now)
    return start, end, transfers + copying.transfers


def _when_ready(name: str, pending: Mapping[str, int], awaiting: Mapping[str, int],
                data_ready: Mapping[str, float], events: list[tuple[float, int, int, str]],
                seq: itertools.count) -> None:
    """Queue ``name``'s ready event once no input node is pending and no edge over a shared
    resource is awaited."""
    if pending[name] == 0 and awaiting[name] == 0:
        heapq.heappush(events, (data_ready[name], 1, next(seq), name))


def _send(problem: Problem, device_of: Mapping[str, str], name: str, now: float,
          moved: list[tuple[str, int, float]], copying: Copies,
          data_ready: dict[str, float], awaiting: dict[str, int]) -> list[Transfer]:
    """``name`` ended at ``now``: its copies start. Each reader's ``data_ready`` takes its own
    edge's arrival (plan.json's re-check rule), or, for an edge over a shared resource, one
    more edge ``awaiting`` ``copying``'s arrivals. Returns the copies that share nothing."""
    flowing, waits = copying.send(name, now, moved)
    dev = device_of[name]
    for e in problem.graph.out_edges(name):
        if e.dst in waits:
            awaiting[e.dst] += 1
        else:
            data_ready[e.dst] = max(data_ready[e.dst],
                                    now + problem.delay_s(e, dev, device_of[e.dst]))
    return [Transfer(src=name, src_device=dev, dst_device=dst_dev, bytes=nbytes, start_s=now,
                     end_s=now + secs) for dst_dev, nbytes, secs in moved if dst_dev not in flowing]


def _input_counts(graph: OpGraph) -> dict[str, int]:
    """How many distinct nodes each node reads from: what it waits for before it is ready."""
    # Not the in-degree of ``graph.to_networkx()``: building that graph costs more than a
    # simulation on a graph simulated once (a coarse graph), and the counts are the same.
    return {n.name: len({e.src for e in graph.in_edges(n.name)}) for n in graph.nodes}


def validate(problem: Problem, schedule: Schedule, *, tol_s: float = 1e-9) -> list[str]:
    """Re-check a schedule against the model: durations, precedence with transfer delays,
    no overlap on a device, colocation, and memory, simulated again from the schedule's times
    (within capacity, and equal to the peak the schedule records). Returns the violations."""
    graph, costs = problem.graph, problem.costs
    device_of = schedule.placement.device_of
    problems: list[str] = []
    for node in graph.nodes:
        dev = device_of[node.name]
        duration = schedule.end_s[node.name] - schedule.start_s[node.name]
        if abs(duration - costs.of(node.name, dev)) > tol_s + 1e-9 * duration:
            problems.append(f"{node.name}: runs {duration} s, costs {costs.of(node.name, dev)} s")
    # The contended copies played once, from the schedule's copy starts: their arrivals and
    # ends serve every check below.
    made = copies(problem, device_of)
    starts, arrival, contended_end = _contended(problem, schedule, made)
    for e in graph.edges:
        ready = arrival[e.src, e.dst] if (e.src, e.dst) in arrival else (
            schedule.end_s[e.src] + problem.delay_s(e, device_of[e.src], device_of[e.dst]))
        if schedule.start_s[e.dst] + tol_s < ready - _EPS * ready:
            problems.append(f"{e.dst} starts at {schedule.start_s[e.dst]} before its input from "
                            f"{e.src} arrives at {ready}")
    by_device: dict[str, list[str]] = defaultdict(list)
    for name, dev in device_of.items():
        by_device[dev].append(name)
    for dev, names in by_device.items():
        spans = sorted((schedule.start_s[n], schedule.end_s[n], n) for n in names)
        for (_, e1, n1), (s2, _, n2) in zip(spans, spans[1:]):
            if s2 + tol_s < e1:
                problems.append(f"{n1} and {n2} overlap on {dev}")
    for group in graph.colocate:
        if len({device_of[n] for n in group}) > 1:
            problems.append(f"colocation group {list(group)} is split across devices")
    contended = (as_delays(device_of, starts, arrival, contended_end)
                 if problem.cluster.shared and problem.launchers else None)
    return problems + _launcher_violations(problem, schedule, tol_s, made, contended) + (
        _memory_violations(problem, schedule, made, contended_end))


def _contended(problem: Problem, schedule: Schedule,
               made: Mapping[tuple[str, str], tuple[int, float]],
               ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float],
                          dict[tuple[str, str], float]]:
    """The copies over shared resources played again (``contention.replay``) from their
    starts (their producers' ends; the recorded ones where a launcher issues them; ``made``:
    ``copies``): those starts, each contended edge's arrival and each contended copy's end.
    Empty without shared resources."""
    if not problem.cluster.shared:
        return {}, {}, {}
    device_of = schedule.placement.device_of
    if problem.launchers:
        recorded = {(t.src, t.dst_device): t.start_s for t in schedule.transfers}
        starts = {key: recorded.get(key, schedule.end_s[key[0]]) for key in made}
    else:
        starts = {key: schedule.end_s[key[0]] for key in made}
    return (starts, *replay(problem, device_of, starts, _by_source(made)))


def _launcher_violations(problem: Problem, schedule: Schedule, tol_s: float,
                         made: Mapping[tuple[str, str], tuple[int, float]],
                         contended: Contended | None) -> list[str]:
    """Where devices have a launcher: the schedule timed again in its recorded launch order
    (``launch.launched``), its contended copies taking ``contended`` (``_contended``'s replay
    as delays), must give its starts, ends and copies."""
    if not problem.launchers:
        return []
    device_of = schedule.placement.device_of
    if sorted(schedule.launch_order) != sorted(device_of):
        return ["the launch order does not list every node once"]
    moved_from = _by_source(made)
    try:  # each device's order is the launch order's (nodes of one start may tie otherwise)
        _, start, end, transfers = launched(problem, device_of, schedule.launch_order,
                                            moved_from, fixed=schedule.launch_order,
                                            contended=contended)
    except GraphError as error:
        return [str(error)]
    problems = [f"{n} starts at {schedule.start_s[n]} s; launched in its order it starts at "
                f"{start[n]} s" for n in device_of
                if abs(schedule.start_s[n] - start[n]) > tol_s + 1e-9 * start[n]]
    recorded = {(t.src, t.dst_device): t.start_s for t in schedule.transfers}
    problems += [f"the copy of {t.src} to {t.dst_device} starts at "
                 f"{recorded.get((t.src, t.dst_device))} s; launched in order, at {t.start_s} s"
                 for t in transfers
                 if abs(recorded.get((t.src, t.dst_device), math.inf) - t.start_s)
                 > tol_s + 1e-9 * t.start_s]
    return problems[:20]


def _memory_violations(problem: Problem, schedule: Schedule,
                       made: Mapping[tuple[str, str], tuple[int, float]],
                       contended_end: Mapping[tuple[str, str], float]) -> list[str]:
    """Memory re-simulated from the schedule's own start and end times, not read from its
    ``peak_bytes``: a hand-edited plan that lowers its figures is caught. ``made``: ``copies``;
    ``contended_end``: ``_contended``'s copy ends."""
    device_of = dict(schedule.placement.device_of)
    end = dict(schedule.end_s)
    problems: list[str] = []
    if problem.launchers:
        # A copy waits for its launcher and its copy stream (``launch.launched``): take the recorded
        # copies, each checked to be one the placement makes, no earlier than its producer.
        transfers = list(schedule.transfers)
        for t in transfers:
            nbytes, secs = made.get((t.src, t.dst_device), (None, 0.0))
            secs = contended_end.get((t.src, t.dst_device), t.start_s + secs) - t.start_s
            if (nbytes != t.bytes or t.start_s < end[t.src] - 1e-9
                    or abs(t.end_s - t.start_s - secs) > 1e-9 + 1e-9 * secs):
                problems.append(f"the copy of {t.src} to {t.dst_device} is not one the "
                                "placement makes, or it starts before its producer ends")
        if len({(t.src, t.dst_device) for t in transfers}) != len(made):
            problems.append("the schedule's copies are not the ones the placement makes")
    else:
        transfers = [Transfer(src=src, src_device=device_of[src], dst_device=dst_dev,
                              bytes=nbytes, start_s=end[src],
                              end_s=contended_end.get((src, dst_dev), end[src] + secs))
                     for (src, dst_dev), (nbytes, secs) in made.items()]
    _, peak, _ = memory(problem, device_of, dict(schedule.start_s), end, transfers,
                         max(end.values(), default=0.0), schedule.launch_order)
    for device in problem.cluster.devices:
        dev, needed = device.name, peak[device.name]
        recorded = schedule.peak_bytes.get(dev)
        if recorded is not None and recorded != needed:
            problems.append(f"{dev} records a peak of {recorded} bytes; its schedule needs "
                            f"{needed}")
        if needed > device.memory_bytes:
            problems.append(f"{dev} is {needed - device.memory_bytes} bytes over its capacity")
    return problems
