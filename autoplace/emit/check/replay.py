"""Emit: the runtime's program (``runtime.program.Program``) played back under the plan's costs, to
hold against the simulator: the check that the emitted launch order realises the simulated
schedule (``emit_and_verify`` notes a replay more than ``REPLAY_TOLERANCE`` off, and
``benchmarks/replay.py`` tabulates every example).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autoplace.emit.distributed.devices import emitted_devices
from autoplace.emit.runtime.program import Handover, Program, Run
from autoplace.ir import Problem, Schedule
from autoplace.simulate.launch import take_interpreter

__all__ = ["Replay", "replay"]


@dataclass(frozen=True)
class Replay:
    """The program played back under the plan's costs: when each segment starts and ends, and
    the makespan, to hold against the simulator's."""

    makespan_s: float
    start_s: Mapping[int, float]
    end_s: Mapping[int, float]

    def error(self, simulated_s: float) -> float:
        """``|replayed - simulated| / simulated`` (0 when both are 0)."""
        if simulated_s <= 0:
            return 0.0 if self.makespan_s <= 0 else float("inf")
        return abs(self.makespan_s - simulated_s) / simulated_s


def replay(
    program: Program,
    segment_ops: Sequence[Sequence[str]],
    *,
    problem: Problem,
    schedule: Schedule,
    copy_streams: bool = False,
    segment_s: Sequence[float] | None = None,
) -> Replay:
    """Play ``program`` back under ``problem``'s op and link costs on the schedule's devices.

    ``segment_ops[i]`` are the fx op names of segment ``i`` (``SegmentInfo.nodes``). A segment
    takes the time of the plan's nodes it runs (a node whose ops fall in several segments is
    split among them by op count); it starts when its worker is free and the handovers it waits
    for have arrived, and a model input it moves itself arrives when the simulator says the
    input node's edge does. A handover arrives the link's delay after its producer segment ends,
    as the simulator sends a node's output when the node ends; it does not hold its worker (a
    reference on worker threads, a copy stream on GPUs). Workers run their steps in order, and
    the segments' order is topological, so the replay takes the segments in that order.

    With ``copy_streams`` a GPU's handovers also queue on its one copy stream, as the runtime
    issues them; the simulator lets copies overlap each other, so this measures what that
    assumption is worth on a plan. ``segment_s`` replaces the segments' durations (measured
    ones, say), keeping the plan's handover delays.

    Where the plan has launcher costs (``costs.host``: GPUs), the devices that have a launcher
    share one host clock, as the runtime launches them from the caller's thread in segment
    order: a segment costs the clock its call and its nodes' launches, and cannot end before
    its last launch plus its last node's share; each handover it issues costs a handover and
    queues on its device's copy stream. A CPU worker (``own_thread``) pays its segment's call
    once the inputs are there, and each handover after the segment, on its own time, holding
    its interpreter (shared by the ``cpu-thread`` workers of a process) for them and for its
    ops' dispatch.
    """
    graph, costs = problem.graph, problem.costs
    device_of = schedule.placement.device_of
    by_torch = {emitted: name for name, emitted
                in emitted_devices(problem.cluster.devices).items()}
    op_node = {op: node.name for node in graph.nodes for op in node.ops}

    def node_of(value: str) -> str | None:
        return op_node.get(program.origin.get(value, value))

    cost, launch, last, last_launch = _segment_costs(problem, device_of, segment_ops)
    host = costs.host
    if segment_s is not None:  # measured durations instead of the plan's
        cost = list(segment_s)
    device_of_segment: dict[int, str] = {}
    runs: dict[int, Run] = {}
    for worker, steps in program.workers.items():
        for step in steps:
            if isinstance(step, Run):
                runs[step.segment] = step
                device_of_segment[step.segment] = by_torch.get(worker, worker)
    arrival: dict[int, float] = {}
    free = dict.fromkeys(device_of_segment.values(), 0.0)
    start: dict[int, float] = {}
    end: dict[int, float] = {}
    issued: dict[int, list[Handover]] = {}
    engine_free: dict[str, float] = {}
    for h in program.handovers:
        issued.setdefault(h.after, []).append(h)
    launchers = problem.launchers
    clock = dict.fromkeys(launchers.values(), 0.0)  # each host's launching thread's time
    holder: dict[str, str] = {}  # each CPU worker's interpreter: who took it last
    source_device = {h.id: device_of_segment[h.after] for h in program.handovers}
    copied = _copy_times(schedule) if problem.cluster.shared else {}
    for index in sorted(runs):
        run, device = runs[index], device_of_segment[index]
        ready = max((arrival[w] for w in run.waits), default=0.0)
        for name in run.inputs_from_caller:
            ready = max(ready, _input_arrival_s(problem, device_of, node_of(name), device))
        start[index] = max(free[device], ready)
        own = host is not None and device in host.own_thread
        if own:  # a CPU worker calls it once its inputs are there, holding its interpreter
            lock = launchers[device]  # for the call and its ops' dispatch
            start[index] = clock[lock] = (
                take_interpreter(host, clock, holder, lock, device, start[index])
                + host.call_s[device])
            clock[lock] += launch[index]
        end[index] = start[index] + cost[index]
        if device in launchers and not own:
            host_of = launchers[device]
            # It waits on the host for a value from a CPU (no launcher, or its own).
            clock[host_of] = max([clock[host_of], *(
                arrival[w] for w in run.waits if source_device[w] not in launchers
                or source_device[w] in host.own_thread)])
            clock[host_of] += host.call_s[device]
            start[index] = max(start[index], clock[host_of])
            clock[host_of] += launch[index]
            # Its last node starts once its launch begins: the launches before it are paid.
            end[index] = max(start[index] + cost[index],
                             clock[host_of] - last_launch[index] + last[index])
        free[device] = end[index]
        for h in issued.get(index, ()):
            took = _handover_s(problem, device_of, node_of(h.value), device,
                               by_torch[h.dst_device], copied)
            began = end[index]
            queued = (device in launchers and not own) or (
                copy_streams and h.src_device.startswith("cuda"))
            if own:  # it hands the value over itself, then goes on
                began = free[device] = clock[lock] = (
                    take_interpreter(host, clock, holder, lock, device, max(free[device], began))
                    + host.handover_s[device])
            elif device in launchers:
                clock[launchers[device]] += host.handover_s[device]
                began = max(began, clock[launchers[device]])
            if queued:
                # One copy stream per GPU: its copies run one after another, in issue order.
                began = max(began, engine_free.get(h.src_device, 0.0))
                engine_free[h.src_device] = began + took
            arrival[h.id] = began + took
    return Replay(makespan_s=max(end.values(), default=0.0), start_s=start, end_s=end)


def _segment_costs(problem: Problem, device_of: Mapping[str, str],
                   segment_ops: Sequence[Sequence[str]]) -> tuple[list[float], ...]:
    """Each segment's time and launches under the plan's costs (a node whose ops fall in
    several segments split among them by op count), and the share of its last node in both."""
    costs, host = problem.costs, problem.costs.host
    segment_of_op = {op: i for i, ops in enumerate(segment_ops) for op in ops}
    cost = [0.0] * len(segment_ops)
    launch = [0.0] * len(segment_ops)
    last = [0.0] * len(segment_ops)  # the share of the segment's last node there ...
    last_launch = [0.0] * len(segment_ops)  # ... and of its launches
    for node in problem.graph.nodes:  # in topological order: the last one seen is the last run
        here = [segment_of_op[op] for op in node.ops if op in segment_of_op]
        share = costs.of(node.name, device_of[node.name]) / max(len(here), 1)
        launched = 0.0 if host is None else (
            host.launch_of(node.name, device_of[node.name]) / max(len(here), 1))
        for i in here:
            cost[i] += share
            last[i] = share
            launch[i] += launched
            last_launch[i] = launched
    return cost, launch, last, last_launch


def _input_arrival_s(problem: Problem, device_of: Mapping[str, str], node: str | None,
                     device: str) -> float:
    """When the simulator has model input ``node`` on ``device``: its edge's delay from the
    device the plan put the input on (0 there, or for an input the graph does not hold)."""
    if node is None:
        return 0.0
    return max((problem.delay_s(e, device_of[node], device)
                for e in problem.graph.out_edges(node) if device_of[e.dst] == device),
               default=0.0)


def _copy_times(schedule: Schedule) -> dict[tuple[str, str], float]:
    """The longest time a copy of each node's output to each device took in ``schedule``."""
    took: dict[tuple[str, str], float] = {}
    for t in schedule.transfers:
        key = (t.src, t.dst_device)
        took[key] = max(took.get(key, t.end_s - t.start_s), t.end_s - t.start_s)
    return took


def _handover_s(problem: Problem, device_of: Mapping[str, str], node: str | None, src: str,
                dst: str, copied: Mapping[tuple[str, str], float]) -> float:
    """The simulator's delay for ``node``'s value from ``src`` to ``dst``: the largest over its
    edges read on ``dst`` (``simulate.copies``); a value no edge carries (a parameter two
    devices share) costs the link's latency. Over a shared link (``Cluster.shared``) a copy's
    time depends on every copy beside it, so it is the time the schedule's copy took there
    (``copied``, by node and device: ``_copy_times``)."""
    if node is not None and problem.cluster.shared and problem.cluster.shared_on(src, dst):
        if (node, dst) in copied:
            return copied[(node, dst)]
    if node is not None:
        delays = [problem.delay_s(e, src, dst) for e in problem.graph.out_edges(node)
                  if device_of[e.dst] == dst]
        if delays:
            return max(delays)
    return problem.cluster.transfer_s(src, dst, 0)
