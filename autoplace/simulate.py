"""The one event-driven simulator: every placement, the solver's or a baseline's, is scored here.

Model (the same one ``plan.json`` documents, so anyone can re-check a plan):

* a device runs one node at a time, for ``costs.compute_s[node][device]`` seconds;
* a node starts once every input has arrived on its device: an input read over edge ``(u, v)``
  from another device arrives ``latency_s + edge bytes / bandwidth`` (or the edge's fixed
  ``transfer_s``) after ``u`` ends (links are not shared resources: transfers overlap each other
  and compute). ``u``'s output is copied once to each other device that reads it, with the
  largest of those edges' bytes and times;
* with ``Placement.order`` each device runs its nodes in exactly that order; without it a device
  that falls idle starts its ready node of highest upward rank (list scheduling, as HEFT ranks).

Where ``costs.host`` gives devices a launcher (GPUs: one host thread launches all their work),
the schedule is timed again in ``_launched``: the launcher pays each node's launches, each
segment call and each handover in one launch order, a node starts no earlier than its launch
begins, and copies queue on their device's copy stream. ``Schedule.launch_order`` keeps that
order, and the emitted model launches in it.

Memory on a device is its resident bytes (the runtime's reserve, ``Device.reserved_bytes``, plus
parameters) plus live activations, as the emitted model holds them. The emitted model runs the nodes
in order of start, one segment per run of nodes on one device, cut also around values that cross
devices (``_segment_spans``); it frees each value right after the segment call that last reads it or
the copy that last reads it, and a segment's inputs stay referenced until it returns. So a node's
output is allocated when the node starts and freed once the segments of its readers on its device
have ended, its last outgoing transfer is done, and the first segment reading it on each other
device has started (the copy is made then); a copy received from another device lives from the
transfer's start until the segment of its last reader there ends; a node's ``workspace_bytes`` are
held while it runs; the model's inputs and outputs live to the end (the caller holds them).

For pipelined execution (the ``throughput`` objective) each device's **load** per pass is its
compute plus its communication, as PipeDream and Tarnawski et al. (NeurIPS 2020) define it: a
node whose output leaves its device pays the copy's time once on its own device (the longest
copy, when it goes to several) and once on each device that receives it; a device with
``charges_transfers=False`` (a host CPU, in their model) pays no communication.

Read ``simulate`` first, then ``_run`` (the event loop), ``_launched`` and ``_memory``;
``validate`` re-checks a schedule independently.
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
    HostCosts,
    OpGraph,
    OpNode,
    Placement,
    Problem,
    Schedule,
    Transfer,
)

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
    moved_from: dict[str, list[tuple[str, int, float]]] = defaultdict(list)
    for (src, dst_dev), (nbytes, secs) in moved.items():
        moved_from[src].append((dst_dev, nbytes, secs))
    start, end, transfers = _run(problem, device_of, placement.order, moved_from)
    if len(end) != len(problem.graph.nodes):
        stuck = [n.name for n in problem.graph.nodes if n.name not in end][:5]
        raise GraphError(
            f"the placement's device order deadlocks: {stuck} never start (an order that runs a "
            "node before one of its inputs on the same device)"
        )
    launch_order: tuple[str, ...] = ()
    if problem.launchers:
        launch_order, start, end, transfers = _launched(
            problem, device_of, _start_order(problem.graph, start, end), moved_from)
    makespan = max(end.values(), default=0.0)
    resident, peak, timeline = _memory(problem, device_of, start, end, transfers, makespan,
                                       launch_order)
    over = {d: peak[d] - cluster.device(d).memory_bytes for d in cluster.names
            if peak[d] > cluster.device(d).memory_bytes}
    return Schedule(
        placement=Placement(device_of=device_of, order=placement.order),
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
    while events:
        now, kind, _, name = heapq.heappop(events)
        dev = device_of[name]
        if kind == 1:
            ready.add(name)
            if order is None:
                heapq.heappush(ready_heap[dev], (-priority[name], graph.index[name], name))
            dispatch(dev, now)
            continue
        busy[dev] = False
        for dst_dev, nbytes, secs in moved_from[name]:
            transfers.append(Transfer(src=name, src_device=dev, dst_device=dst_dev,
                                      bytes=nbytes, start_s=now, end_s=now + secs))
        for e in graph.out_edges(name):
            # Each reader waits for its own edge's bytes, as plan.json's re-check rule states.
            t_in = now + problem.delay_s(e, dev, device_of[e.dst])
            data_ready[e.dst] = max(data_ready[e.dst], t_in)
        for succ in dict.fromkeys(e.dst for e in graph.out_edges(name)):
            pending[succ] -= 1
            if pending[succ] == 0:
                heapq.heappush(events, (data_ready[succ], 1, next(seq), succ))
        dispatch(dev, now)
    return start, end, transfers


def _start_order(graph: OpGraph, start: Mapping[str, float],
                 end: Mapping[str, float]) -> tuple[str, ...]:
    """The nodes in order of start: the order the emitted model runs (or launches) them in
    (``emit._op_order``'s key), a topological order that keeps each device's order."""
    return tuple(n.name for n in sorted(
        graph.nodes, key=lambda n: (start[n.name], end[n.name], graph.index[n.name])))


def _launched(
    problem: Problem,
    device_of: Mapping[str, str],
    first_pass: tuple[str, ...],
    moved_from: Mapping[str, list[tuple[str, int, float]]],
) -> tuple[tuple[str, ...], dict[str, float], dict[str, float], list[Transfer]]:
    """The schedule again with the host threads that launch the devices' work (``costs.host``):
    the launch order, start, end and the copies made.

    Each device keeps its order of ``first_pass`` (the first pass's order of start). The emitted
    runtime launches the nodes in one order, cutting a segment wherever the device changes; a
    launcher thread pays each segment's call and each node's launches in turn, so the order is
    chosen here, and the emitted program keeps it (``Schedule.launch_order``): the launcher
    stays on its device while that device has work queued, and moves to another device whose
    next node's inputs are launched once that device's queue runs out a switch's worth earlier
    (``_next_device``). A node starts once its launcher begins to launch it, its device is free
    and its inputs are there (its time on the device, ``compute_s``, includes its launches: a
    lone device is never slower for its launcher, and the launches of several devices add up on
    the one thread). After a segment the launcher issues its values' copies to other devices (a
    handover each), on the sending device's one copy stream: a copy starts once issued, its
    producer has ended and the stream's previous copy is done. A launcher that needs a value
    from a device without one (a CPU worker) waits for it on the host. Devices without a
    launcher run as in ``_run``, their nodes taken as soon as their inputs are launched: their
    thread does all their work.
    """
    graph, costs, host = problem.graph, problem.costs, problem.costs.host
    assert host is not None
    launchers = problem.launchers
    clock = dict.fromkeys(launchers.values(), 0.0)  # each launcher thread's time
    free = dict.fromkeys(problem.cluster.names, 0.0)
    engine = dict.fromkeys(problem.cluster.names, 0.0)  # each device's copy stream
    copied: dict[tuple[str, str], float] = {}  # (value, device) -> when its copy there began
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    transfers: list[Transfer] = []
    segment: list[str] = []  # the open segment's nodes
    cuts = _Cuts(graph, device_of)
    order: list[str] = []
    queues: dict[str, list[str]] = defaultdict(list)
    for name in first_pass:
        queues[device_of[name]].append(name)
    pointer = dict.fromkeys(queues, 0)
    waiting = {name: len({e.src for e in graph.in_edges(name)}) for name in first_pass}

    def close() -> None:
        for u in segment:
            src = device_of[u]
            for dst, nbytes, secs in moved_from[u]:
                began = end[u]
                if src in launchers:
                    clock[launchers[src]] += host.handover_s[src]
                    began = max(began, clock[launchers[src]], engine[src])
                    engine[src] = began + secs
                copied[(u, dst)] = began
                transfers.append(Transfer(src=u, src_device=src, dst_device=dst, bytes=nbytes,
                                          start_s=began, end_s=began + secs))
        segment.clear()

    def take(name: str) -> None:
        node, dev = graph.node(name), device_of[name]
        order.append(name)
        pointer[dev] += 1
        for succ in dict.fromkeys(e.dst for e in graph.out_edges(name)):
            waiting[succ] -= 1
        if node.is_input:  # the caller's: there at once; a segment that reads it moves it
            start[name] = end[name] = 0.0
            for dst, nbytes, secs in moved_from[name]:
                copied[(name, dst)] = 0.0
                transfers.append(Transfer(src=name, src_device=dev, dst_device=dst,
                                          bytes=nbytes, start_s=0.0, end_s=secs))
            return
        if segment and cuts.before(name, segment):
            close()
        ready, blocking = _arrivals(problem, device_of, name, end, copied)
        launcher = launchers.get(dev)
        if launcher is None:
            start[name] = max(free[dev], ready)
        else:
            if not segment:
                clock[launcher] += host.call_s[dev]
            clock[launcher] = max(clock[launcher], blocking)
            start[name] = max(clock[launcher], free[dev], ready)
            clock[launcher] += host.launch_of(name, dev)
        end[name] = free[dev] = start[name] + costs.of(name, dev)
        segment.append(name)

    while len(order) < len(first_pass):
        ready_devices = [d for d, q in queues.items()
                         if pointer[d] < len(q) and waiting[q[pointer[d]]] == 0]
        current = device_of[segment[-1]] if segment else None
        dev = _next_device(ready_devices, current, free, launchers, host,
                           [graph.node(queues[d][pointer[d]]) for d in ready_devices])
        take(queues[dev][pointer[dev]])
    close()
    return tuple(order), start, end, transfers


def _arrivals(problem: Problem, device_of: Mapping[str, str], name: str,
              end: Mapping[str, float],
              copied: Mapping[tuple[str, str], float]) -> tuple[float, float]:
    """When ``name``'s last input is on its device, and when its last input from a device
    without a launcher is (its launcher waits for that one on the host)."""
    dev, launchers = device_of[name], problem.launchers
    ready, blocking = 0.0, 0.0
    for e in problem.graph.in_edges(name):
        src = device_of[e.src]
        arrive = end[e.src] if src == dev else (
            copied[(e.src, dev)] + problem.delay_s(e, src, dev))
        ready = max(ready, arrive)
        if src != dev and src not in launchers:
            blocking = max(blocking, arrive)
    return ready, blocking


def _next_device(ready: list[str], current: str | None, free: Mapping[str, float],
                 launchers: Mapping[str, str], host: HostCosts, nodes: list[OpNode]) -> str:
    """Which of the ``ready`` devices (each with the next node of its order, ``nodes``, whose
    inputs are launched) the launch order takes next: an input, or a device without a launcher,
    first (they cost no launcher time); else the open segment's device, unless another device
    runs out of work more than two segment calls earlier; else the one that runs out first."""
    for d, node in zip(ready, nodes):
        if d not in launchers or node.is_input:
            return d
    soonest = min(ready, key=lambda d: (free[d], d != current))
    if current in ready and free[soonest] + 2 * host.call_s[soonest] >= free[current]:
        return current
    return soonest


def _input_counts(graph: OpGraph) -> dict[str, int]:
    """How many distinct nodes each node reads from: what it waits for before it is ready."""
    # Not the in-degree of ``graph.to_networkx()``: building that graph costs more than a
    # simulation on a graph simulated once (a coarse graph), and the counts are the same.
    return {n.name: len({e.src for e in graph.in_edges(n.name)}) for n in graph.nodes}


class _Cuts:
    """Where ``emit.segment.partition`` cuts the emitted segments: where the device changes,
    after a node whose value another device reads, and before a node that reads a value computed
    on another device (unless the segment so far reads no computed value: an ``arange`` waits
    with its consumer). Model inputs are placeholders in the emitted graph, not ops: reading
    one cuts nothing."""

    def __init__(self, graph: OpGraph, device_of: Mapping[str, str]) -> None:
        self.device_of = device_of
        self.sends: set[str] = set()
        self.receives: set[str] = set()
        self.reads_computed: set[str] = set()
        for e in graph.edges:
            if graph.node(e.src).is_input:
                continue
            self.reads_computed.add(e.dst)
            if device_of[e.src] != device_of[e.dst]:
                self.sends.add(e.src)
                self.receives.add(e.dst)

    def before(self, name: str, segment: list[str]) -> bool:
        """Whether a new segment starts at ``name`` after the (non-empty) ``segment``."""
        last = segment[-1]
        return (self.device_of[last] != self.device_of[name] or last in self.sends
                or (name in self.receives and any(n in self.reads_computed for n in segment)))


def _segment_spans(
    graph: OpGraph, device_of: Mapping[str, str], start: Mapping[str, float],
    end: Mapping[str, float], launch_order: tuple[str, ...] = (),
) -> tuple[dict[str, int], dict[str, float], dict[str, float]]:
    """Each node's emitted segment: its index, when it starts and when it ends. The emitted
    model runs the nodes in ``launch_order``, or in order of start without one
    (``emit._op_order``'s key), and cuts segments as ``emit.segment.partition`` does
    (``_Cuts``). A segment's inputs stay referenced until its call returns, so a cut keeps a
    value read across it alive until the later segment ends, where one segment would free it
    after its reader."""
    ordered = launch_order or _start_order(graph, start, end)
    cuts = _Cuts(graph, device_of)
    runs: list[list[str]] = []
    for name in ordered:
        if not runs or cuts.before(name, runs[-1]):
            runs.append([])
        runs[-1].append(name)
    seg: dict[str, int] = {}
    seg_start: dict[str, float] = {}
    seg_end: dict[str, float] = {}
    for index, run in enumerate(runs):
        first, last = min(start[n] for n in run), max(end[n] for n in run)
        for name in run:
            seg[name], seg_start[name], seg_end[name] = index, first, last
    return seg, seg_start, seg_end


def _memory(
    problem: Problem,
    device_of: dict[str, str],
    start: dict[str, float],
    end: dict[str, float],
    transfers: list[Transfer],
    makespan: float,
    launch_order: tuple[str, ...] = (),
) -> tuple[dict[str, int], dict[str, int], dict[str, tuple[tuple[float, int], ...]]]:
    """Resident bytes, peak bytes and the timeline per device, under the emitted model's rule:
    a value lives until the segment of its last reader returns (see ``_segment_spans``)."""
    graph, cluster = problem.graph, problem.cluster
    resident = {d.name: d.reserved_bytes for d in cluster.devices}
    for node in graph.nodes:
        resident[device_of[node.name]] += node.param_bytes
    seg, seg_start, seg_end = _segment_spans(graph, device_of, start, end, launch_order)
    # For each (buffer, device): when its last reader's segment there ends, and whether that
    # segment took no time (it still needs the buffer at that instant, see the ordering below);
    # and when the first segment reading it on another device starts: the emitted model copies
    # it there then, so the original lives at least until that copy.
    last_read: dict[tuple[str, str], float] = {}
    instant_read: set[tuple[str, str]] = set()
    first_copy: dict[tuple[str, str], float] = {}  # (value, other device): first reader there
    for e in graph.edges:
        # Read inside its own segment, a value goes when its reader is done (fx frees it); read
        # by another segment, when that segment returns; and it leaves its own segment at the end.
        inside = seg[e.src] == seg[e.dst]
        key = (e.src, device_of[e.dst])
        t = end[e.dst] if inside else max(seg_end[e.dst], seg_end[e.src])
        began = start[e.dst] if inside else seg_start[e.dst]
        if t > last_read.get(key, -1.0):
            last_read[key] = t
            instant_read.discard(key)
        if t == last_read[key] and began == t:
            instant_read.add(key)
        if device_of[e.dst] != device_of[e.src]:
            first_copy[key] = min(first_copy.get(key, math.inf), seg_start[e.dst])
    # A value is copied to each other device when its first reader there starts: the original
    # lives until the last of those copies.
    copied_at: dict[str, float] = {}
    for (src, _), copy_s in first_copy.items():
        copied_at[src] = max(copied_at.get(src, 0.0), copy_s)
    sent_until: dict[str, float] = {}
    for t in transfers:
        sent_until[t.src] = max(sent_until.get(t.src, 0.0), t.end_s)

    # Events (t, phase, +/-bytes). At one instant, frees of buffers whose last use ended before
    # it (phase 0) come before allocations (phase 1): a reader that has finished releases its
    # input before the next node allocates its output. A buffer still in use at that instant,
    # by a zero-time reader or because it was allocated then, is freed after them (phase 2).
    deltas: dict[str, list[tuple[float, int, int]]] = defaultdict(list)

    def add(dev: str, nbytes: int, alloc_at: float, free_at: float, instant: bool) -> None:
        if nbytes:
            deltas[dev].append((alloc_at, 1, nbytes))
            deltas[dev].append((free_at, 2 if instant or free_at == alloc_at else 0, -nbytes))

    # The caller holds the inputs and receives the outputs: both live to the end.
    kept = set(graph.outputs) | {n.name for n in graph.nodes if n.is_input}
    for node in graph.nodes:
        dev, key = device_of[node.name], (node.name, device_of[node.name])
        free_at = max(end[node.name], last_read.get(key, 0.0), sent_until.get(node.name, 0.0),
                      copied_at.get(node.name, 0.0))
        if node.name in kept:
            free_at = makespan
        add(dev, node.output_bytes, start[node.name], free_at,
            key in instant_read and free_at == last_read[key])
        # Scratch memory (a profiled op's workspace, a group's internal peak) while it runs.
        add(dev, node.workspace_bytes, start[node.name], end[node.name], False)
    for t in transfers:
        key = (t.src, t.dst_device)
        free_at = max(last_read.get(key, t.end_s), t.end_s)
        add(t.dst_device, t.bytes, t.start_s, free_at,
            key in instant_read and free_at == last_read[key])

    peak: dict[str, int] = {}
    timeline: dict[str, tuple[tuple[float, int], ...]] = {}
    for dev in cluster.names:
        level = resident[dev]
        best = level
        points = [(0.0, level)]
        for t, _, delta in sorted(deltas[dev]):
            level += delta
            best = max(best, level)
            points.append((t, level))
        assert level == resident[dev], f"memory on {dev} does not return to its resident bytes"
        peak[dev] = best
        timeline[dev] = tuple(points)
    return resident, peak, timeline


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
    for e in graph.edges:
        ready = schedule.end_s[e.src] + problem.delay_s(e, device_of[e.src], device_of[e.dst])
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
    return problems + _memory_violations(problem, schedule)


def _memory_violations(problem: Problem, schedule: Schedule) -> list[str]:
    """Memory re-simulated from the schedule's own start and end times, not read from its
    ``peak_bytes``: a hand-edited plan that lowers its figures is caught."""
    device_of = dict(schedule.placement.device_of)
    end = dict(schedule.end_s)
    problems: list[str] = []
    made = copies(problem, device_of)
    if problem.launchers:
        # A copy waits for its launcher and its copy stream (``_launched``): take the recorded
        # copies, each checked to be one the placement makes, no earlier than its producer.
        transfers = list(schedule.transfers)
        for t in transfers:
            nbytes, secs = made.get((t.src, t.dst_device), (None, 0.0))
            if (nbytes != t.bytes or t.start_s < end[t.src] - 1e-9
                    or abs(t.end_s - t.start_s - secs) > 1e-9 + 1e-9 * secs):
                problems.append(f"the copy of {t.src} to {t.dst_device} is not one the "
                                "placement makes, or it starts before its producer ends")
        if len({(t.src, t.dst_device) for t in transfers}) != len(made):
            problems.append("the schedule's copies are not the ones the placement makes")
    else:
        transfers = [Transfer(src=src, src_device=device_of[src], dst_device=dst_dev,
                              bytes=nbytes, start_s=end[src], end_s=end[src] + secs)
                     for (src, dst_dev), (nbytes, secs) in made.items()]
    _, peak, _ = _memory(problem, device_of, dict(schedule.start_s), end, transfers,
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
