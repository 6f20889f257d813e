"""Simulate: the launcher threads (``ir.HostCosts``). Where one host thread launches the work of
several devices (GPUs), ``launched`` times the schedule again with that thread's work: the
launch order it picks, which the emitted model keeps, each node's start and end, and the copies.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from autoplace.errors import GraphError
from autoplace.ir import HostCosts, OpNode, Problem, Transfer
from autoplace.simulate.contention import replay
from autoplace.simulate.memory import Cuts

__all__ = ["Contended", "as_delays", "contended_times", "launched", "take_interpreter", "timed"]

# The copies over shared resources: each such edge's delay from its copy's start, and each
# such copy's time (``contention``), keyed (producer, reader) and (producer, device).
Contended = tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]
# How many times ``timed`` re-times a schedule at most before it takes the last one.
_ROUNDS = 50


def launched(
    problem: Problem,
    device_of: Mapping[str, str],
    first_pass: tuple[str, ...],
    moved_from: Mapping[str, list[tuple[str, int, float]]],
    fixed: tuple[str, ...] = (),
    contended: Contended | None = None,
) -> tuple[tuple[str, ...], dict[str, float], dict[str, float], list[Transfer]]:
    """The schedule again with the host threads that launch the devices' work (``costs.host``):
    the launch order, start, end and the copies made. With ``fixed`` the launch order is that
    one (``validate`` re-times a recorded schedule so); it must take each device's nodes in
    ``first_pass``'s order, each after its inputs. ``contended`` gives the copies over shared
    resources their times (``timed``): each such edge's delay from its copy's start, and each
    such copy's time.

    Each device keeps its order of ``first_pass`` (the first pass's order of start). The emitted
    runtime launches the nodes in one order, cut into segments as the emitter cuts them
    (``Cuts``), and a launcher thread pays each segment's call and each node's launches in turn;
    so the order is chosen here, and the emitted program keeps it (``Schedule.launch_order``).
    The launcher stays on its device while that device has work queued; it moves to another
    device whose next node's inputs are launched once that device's queue runs out two segment
    calls earlier (``_next_device``). CPU workers keep the first pass's order.

    A node starts once its launcher begins to launch it, its device is free and its inputs are
    there. (Its time on the device, ``compute_s``, includes its launches: a lone device is never
    slower for its launcher, and the launches of several devices add up on the one thread.)
    After a segment the launcher issues its values' copies to other devices, a handover each,
    on the sending device's one copy stream: a copy starts once issued, once its producer has
    ended and once the stream's previous copy is done. A launcher that needs a value from a
    CPU (a device without a launcher, or its own) waits for it on the host. A CPU worker
    (``HostCosts.own_thread``) is its own launcher: at a segment's first node it waits for the
    node's inputs and its own last work, then pays the call; after the segment it pays a
    handover per value it sends, which leaves when that is done. Its calls, handovers and ops'
    dispatch hold its interpreter (``own_thread``), taken from another thread at a hand-off.
    Devices without a launcher run as in ``_run``, their nodes taken as soon as their inputs
    are launched.
    """
    run = _Pass(problem, device_of, moved_from, contended)
    queues: dict[str, list[str]] = defaultdict(list)
    for name in first_pass:
        queues[device_of[name]].append(name)
    pointer = dict.fromkeys(queues, 0)
    waiting = {name: len({e.src for e in problem.graph.in_edges(name)}) for name in first_pass}
    position = {name: i for i, name in enumerate(first_pass)}
    while len(run.order) < len(first_pass):
        ready_devices = [d for d, q in queues.items()
                         if pointer[d] < len(q) and waiting[q[pointer[d]]] == 0]
        if fixed:  # the order is given: its next node, which must be at its device's head
            dev = _given_device(fixed[len(run.order)], device_of, ready_devices, queues, pointer)
        else:
            current = device_of[run.segment[-1]] if run.segment else None
            dev = _next_device(ready_devices, current, run.free, run.launchers, run.host,
                               [problem.graph.node(queues[d][pointer[d]])
                                for d in ready_devices], position)
        name = queues[dev][pointer[dev]]
        pointer[dev] += 1
        for succ in dict.fromkeys(e.dst for e in problem.graph.out_edges(name)):
            waiting[succ] -= 1
        run.take(name)
    run.close()
    return tuple(run.order), run.start, run.end, run.transfers


class _Pass:
    """One pass of ``launched``: the launchers' clocks, the devices', the copies, and the open
    segment, as the nodes are taken in launch order (``take``)."""

    def __init__(self, problem: Problem, device_of: Mapping[str, str],
                 moved_from: Mapping[str, list[tuple[str, int, float]]],
                 contended: Contended | None) -> None:
        assert problem.costs.host is not None
        self.problem, self.device_of, self.moved_from = problem, device_of, moved_from
        self.host, self.launchers = problem.costs.host, problem.launchers
        self.edge_s, self.copy_s = contended or ({}, {})
        self.clock = dict.fromkeys(self.launchers.values(), 0.0)  # each launcher's time
        self.holder: dict[str, str] = {}  # each CPU worker's interpreter: who took it last
        self.free = dict.fromkeys(problem.cluster.names, 0.0)  # each device's (its thread's)
        self.engine = dict.fromkeys(problem.cluster.names, 0.0)  # each device's copy stream
        self.copied: dict[tuple[str, str], float] = {}  # (value, device) -> its copy's start
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.transfers: list[Transfer] = []
        self.segment: list[str] = []  # the open segment's nodes
        self.cuts = Cuts(problem.graph, device_of)
        self.order: list[str] = []

    def take(self, name: str) -> None:
        """Launch ``name`` next: an input is there at once, a node starts as ``begin`` says."""
        dev = self.device_of[name]
        self.order.append(name)
        if self.problem.graph.node(name).is_input:  # a segment that reads it moves it
            self.start[name] = self.end[name] = 0.0
            for dst, nbytes, secs in self.moved_from[name]:
                self.copied[(name, dst)] = 0.0
                self.transfers.append(Transfer(src=name, src_device=dev, dst_device=dst,
                                               bytes=nbytes, start_s=0.0,
                                               end_s=self.copy_s.get((name, dst), secs)))
            return
        if self.segment and self.cuts.before(name, self.segment):
            self.close()
        self.start[name] = self.begin(name, dev, *_arrivals(
            self.problem, self.device_of, name, self.end, self.copied, self.edge_s))
        self.end[name] = self.free[dev] = (self.start[name]
                                           + self.problem.costs.of(name, dev))
        self.segment.append(name)

    def begin(self, name: str, dev: str, ready: float, blocking: float) -> float:
        """When ``name`` starts on ``dev``, its inputs there at ``ready`` (a launcher waits on
        the host for those from a CPU until ``blocking``), its launcher's time paid."""
        host, clock, free = self.host, self.clock, self.free
        launcher = self.launchers.get(dev)
        if launcher is None:
            return max(free[dev], ready)
        if dev in host.own_thread:
            # A CPU worker waits for the segment's inputs, then calls it (``engine._work``); the
            # call and each op's dispatch hold its launcher (its process's interpreter).
            if not self.segment:
                clock[launcher] = free[dev] = (self.acquire(dev, max(free[dev], ready))
                                               + host.call_s[dev])
            at = self.acquire(dev, max(free[dev], ready))
            clock[launcher] = at + host.launch_of(name, dev)
            return at
        # The runtime waits for a CPU worker's value before the segment call (``_wait``).
        clock[launcher] = max(clock[launcher], blocking)
        if not self.segment:
            clock[launcher] += host.call_s[dev]
        at = max(clock[launcher], free[dev], ready)
        clock[launcher] += host.launch_of(name, dev)
        return at

    def acquire(self, dev: str, wanted: float) -> float:
        """When CPU worker ``dev``'s thread holds its interpreter, wanted from ``wanted``: once
        the thread that holds it lets go, plus the hand-off (``switch_s``) where that thread is
        another's."""
        return take_interpreter(self.host, self.clock, self.holder, self.launchers[dev], dev,
                                wanted)

    def close(self) -> None:
        """End the open segment: its values handed over to the devices that read them."""
        for u in self.segment:
            src = self.device_of[u]
            for dst, nbytes, secs in self.moved_from[u]:
                secs = self.copy_s.get((u, dst), secs)
                began = self.copied[(u, dst)] = self.issue(src, self.end[u], secs)
                self.transfers.append(Transfer(src=u, src_device=src, dst_device=dst,
                                               bytes=nbytes, start_s=began,
                                               end_s=began + secs))
        self.segment.clear()

    def issue(self, src: str, began: float, secs: float) -> float:
        """When a copy of a value ``src`` made by ``began`` may start, as its device's launcher
        hands it over: a CPU worker's thread itself, holding its launcher; a GPU's launcher, on
        the device's copy stream."""
        host, clock = self.host, self.clock
        launcher = self.launchers.get(src)
        if src in host.own_thread:
            clock[launcher] = self.free[src] = (self.acquire(src, max(self.free[src], began))
                                                + host.handover_s[src])
            return clock[launcher]
        if launcher is not None:
            clock[launcher] += host.handover_s[src]
            began = max(began, clock[launcher], self.engine[src])
            self.engine[src] = began + secs
        return began


def take_interpreter(host: HostCosts, clock: dict[str, float], holder: dict[str, str],
                     lock: str, device: str, wanted: float) -> float:
    """When CPU worker ``device``'s thread holds interpreter ``lock`` (``clock[lock]``: when its
    holder lets go; ``holder[lock]``: who took it last, updated), wanted from ``wanted``: once
    it is free, plus the hand-off (``switch_s``) where another thread held it then."""
    at = max(clock[lock], wanted)
    if clock[lock] > wanted and holder.get(lock, device) != device:
        at += host.switch_s.get(device, 0.0)
    holder[lock] = device
    return at


def _given_device(name: str, device_of: Mapping[str, str], ready: list[str],
                  queues: Mapping[str, list[str]], pointer: Mapping[str, int]) -> str:
    """``name``'s device, checked to be ready with ``name`` next in its order."""
    dev = device_of[name]
    if dev not in ready or queues[dev][pointer[dev]] != name:
        raise GraphError(f"the launch order takes {name!r} before one of its inputs or out of "
                         "its device's order")
    return dev


def _arrivals(problem: Problem, device_of: Mapping[str, str], name: str,
              end: Mapping[str, float],
              copied: Mapping[tuple[str, str], float],
              edge_s: Mapping[tuple[str, str], float]) -> tuple[float, float]:
    """When ``name``'s last input is on its device, and when its last input from a device
    without a launcher, or that is its own launcher (a CPU worker), is (a launcher waits for
    that one on the host)."""
    dev, launchers = device_of[name], problem.launchers
    own_thread = problem.costs.host.own_thread if problem.costs.host else frozenset()
    ready, blocking = 0.0, 0.0
    for e in problem.graph.in_edges(name):
        src = device_of[e.src]
        arrive = end[e.src] if src == dev else (
            copied[(e.src, dev)] + edge_s.get((e.src, name), problem.delay_s(e, src, dev)))
        ready = max(ready, arrive)
        if src != dev and (src not in launchers or src in own_thread):
            blocking = max(blocking, arrive)
    return ready, blocking


def _next_device(ready: list[str], current: str | None, free: Mapping[str, float],
                 launchers: Mapping[str, str], host: HostCosts, nodes: list[OpNode],
                 position: Mapping[str, int]) -> str:
    """Which of the ``ready`` devices (each with the next node of its order, ``nodes``, whose
    inputs are launched) the launch order takes next: an input, or a device without a launcher,
    first (they cost no launcher time); then a CPU worker, the one whose node comes first in
    the first pass (``position``: the runtime runs each worker's steps on its own thread, so
    its order is time's); else the open segment's device, unless another device runs out of
    work more than two segment calls earlier; else the one that runs out first."""
    for d, node in zip(ready, nodes):
        if d not in launchers or node.is_input:
            return d
    workers = [(position[node.name], d) for d, node in zip(ready, nodes) if d in host.own_thread]
    if workers:
        return min(workers)[1]
    soonest = min(ready, key=lambda d: (free[d], d != current))
    if current in ready and free[soonest] + 2 * host.call_s[soonest] >= free[current]:
        return current
    return soonest


def contended_times(problem: Problem, device_of: Mapping[str, str], transfers: list[Transfer],
                    moved_from: Mapping[str, list[tuple[str, int, float]]]) -> Contended:
    """The copies over shared resources played from the starts of ``transfers``
    (``contention.replay``), as delays from those starts."""
    starts = {(t.src, t.dst_device): t.start_s for t in transfers}
    return as_delays(device_of, starts, *replay(problem, device_of, starts, moved_from))


def as_delays(device_of: Mapping[str, str], starts: Mapping[tuple[str, str], float],
              arrival: Mapping[tuple[str, str], float],
              ends: Mapping[tuple[str, str], float]) -> Contended:
    """``contention.replay``'s arrivals and ends, played from ``starts``, as delays from those
    starts (what ``launched`` takes)."""
    return ({(u, v): t - starts[(u, device_of[v])] for (u, v), t in arrival.items()},
            {key: t - starts[key] for key, t in ends.items()})


def timed(
    problem: Problem,
    device_of: Mapping[str, str],
    first_pass: tuple[str, ...],
    moved_from: Mapping[str, list[tuple[str, int, float]]],
) -> tuple[tuple[str, ...], dict[str, float], dict[str, float], list[Transfer]]:
    """``launched``, with copies over shared resources (``Cluster.shared``) taking their fair
    share: the launcher's pass fixes when each copy starts, the copies' times follow from
    those starts (``contention.replay``), and the pass runs again with them, until the starts
    no longer change (a schedule consistent with the rule, which ``validate`` re-checks), at
    most ``_ROUNDS`` times."""
    result = launched(problem, device_of, first_pass, moved_from)
    if not problem.cluster.shared:
        return result
    seen = None
    for _ in range(_ROUNDS):
        times = contended_times(problem, device_of, result[3], moved_from)
        if times == seen:
            break
        seen = times
        result = launched(problem, device_of, first_pass, moved_from, contended=times)
    return result
