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

__all__ = ["Contended", "as_delays", "contended_times", "launched", "timed"]

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
    calls earlier (``_next_device``).

    A node starts once its launcher begins to launch it, its device is free and its inputs are
    there. (Its time on the device, ``compute_s``, includes its launches: a lone device is never
    slower for its launcher, and the launches of several devices add up on the one thread.)
    After a segment the launcher issues its values' copies to other devices, a handover each,
    on the sending device's one copy stream: a copy starts once issued, once its producer has
    ended and once the stream's previous copy is done. A launcher that needs a value from a
    device without one (a CPU worker) waits for it on the host. Devices without a launcher run
    as in ``_run``, their nodes taken as soon as their inputs are launched: their own thread
    does all their work.
    """
    graph, costs, host = problem.graph, problem.costs, problem.costs.host
    assert host is not None
    edge_s, copy_s = contended or ({}, {})
    launchers = problem.launchers
    clock = dict.fromkeys(launchers.values(), 0.0)  # each launcher thread's time
    free = dict.fromkeys(problem.cluster.names, 0.0)
    engine = dict.fromkeys(problem.cluster.names, 0.0)  # each device's copy stream
    copied: dict[tuple[str, str], float] = {}  # (value, device) -> when its copy there began
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    transfers: list[Transfer] = []
    segment: list[str] = []  # the open segment's nodes
    cuts = Cuts(graph, device_of)
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
                secs = copy_s.get((u, dst), secs)
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
                                          bytes=nbytes, start_s=0.0,
                                          end_s=copy_s.get((name, dst), secs)))
            return
        if segment and cuts.before(name, segment):
            close()
        ready, blocking = _arrivals(problem, device_of, name, end, copied, edge_s)
        launcher = launchers.get(dev)
        if launcher is None:
            start[name] = max(free[dev], ready)
        else:
            # The runtime waits for a CPU worker's value before the segment call (``_wait``).
            clock[launcher] = max(clock[launcher], blocking)
            if not segment:
                clock[launcher] += host.call_s[dev]
            start[name] = max(clock[launcher], free[dev], ready)
            clock[launcher] += host.launch_of(name, dev)
        end[name] = free[dev] = start[name] + costs.of(name, dev)
        segment.append(name)

    while len(order) < len(first_pass):
        ready_devices = [d for d, q in queues.items()
                         if pointer[d] < len(q) and waiting[q[pointer[d]]] == 0]
        if fixed:  # the order is given: its next node, which must be at its device's head
            dev = _given_device(fixed[len(order)], device_of, ready_devices, queues, pointer)
        else:
            current = device_of[segment[-1]] if segment else None
            dev = _next_device(ready_devices, current, free, launchers, host,
                               [graph.node(queues[d][pointer[d]]) for d in ready_devices])
        take(queues[dev][pointer[dev]])
    close()
    return tuple(order), start, end, transfers


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
    without a launcher is (its launcher waits for that one on the host)."""
    dev, launchers = device_of[name], problem.launchers
    ready, blocking = 0.0, 0.0
    for e in problem.graph.in_edges(name):
        src = device_of[e.src]
        arrive = end[e.src] if src == dev else (
            copied[(e.src, dev)] + edge_s.get((e.src, name), problem.delay_s(e, src, dev)))
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
