"""Simulate: memory per device as the emitted model holds its values (see the package's
docstring for the rules): the emitted segments (``Cuts``, ``segment_spans``) and the timeline
of live bytes on each device (``memory``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from autoplace.ir import OpGraph, Problem, Transfer

__all__ = ["Cuts", "memory", "segment_spans", "start_order"]


def start_order(graph: OpGraph, start: Mapping[str, float],
                 end: Mapping[str, float]) -> tuple[str, ...]:
    """The nodes in order of start: the order the emitted model runs (or launches) them in
    (``emit._op_order``'s key), a topological order that keeps each device's order."""
    return tuple(n.name for n in sorted(
        graph.nodes, key=lambda n: (start[n.name], end[n.name], graph.index[n.name])))


class Cuts:
    """Where ``emit.codegen.segment.partition`` cuts the emitted segments: where the device changes,
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


def segment_spans(
    graph: OpGraph, device_of: Mapping[str, str], start: Mapping[str, float],
    end: Mapping[str, float], launch_order: tuple[str, ...] = (),
) -> tuple[dict[str, int], dict[str, float], dict[str, float]]:
    """Each node's emitted segment: its index, when it starts and when it ends. The emitted
    model runs the nodes in ``launch_order``, or in order of start without one
    (``emit._op_order``'s key), and cuts segments as ``emit.codegen.segment.partition`` does
    (``Cuts``). A segment's inputs stay referenced until its call returns, so a cut keeps a
    value read across it alive until the later segment ends, where one segment would free it
    after its reader."""
    ordered = launch_order or start_order(graph, start, end)
    cuts = Cuts(graph, device_of)
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


def memory(
    problem: Problem,
    device_of: dict[str, str],
    start: dict[str, float],
    end: dict[str, float],
    transfers: list[Transfer],
    makespan: float,
    launch_order: tuple[str, ...] = (),
) -> tuple[dict[str, int], dict[str, int], dict[str, tuple[tuple[float, int], ...]]]:
    """Resident bytes, peak bytes and the timeline per device, under the emitted model's rule:
    a value lives until the segment of its last reader returns (see ``segment_spans``)."""
    graph, cluster = problem.graph, problem.cluster
    resident = {d.name: d.reserved_bytes for d in cluster.devices}
    for node in graph.nodes:
        resident[device_of[node.name]] += node.param_bytes
    seg, seg_start, seg_end = segment_spans(graph, device_of, start, end, launch_order)
    # For each (buffer, device): when its last reader's segment there ends, and whether that
    # segment took no time (it still needs the buffer at that instant, see the ordering below);
    # and when the segments reading it on another device start: the emitted model copies it
    # there when the first of them starts, so the original lives at least until that copy.
    last_read: dict[tuple[str, str], float] = {}
    instant_read: set[tuple[str, str]] = set()
    remote_reads: dict[tuple[str, str], list[float]] = defaultdict(list)  # (value, other device)
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
            remote_reads[key].append(seg_start[e.dst])
    # A value is copied to each other device when its first reader there starts: the original
    # lives until the last of those copies. A node with several outputs (a folded group whose
    # members are read elsewhere: q, k and v sliced from one projection) is several values to
    # the emitted model, each copied when its own first reader starts, and views among them
    # keep the whole storage; an edge does not say which output it reads, so such a node lives
    # until its last reader there has started.
    copied_at: dict[str, float] = {}
    for (src, _), starts in remote_reads.items():
        copy_s = max(starts) if len(graph.node(src).output_shapes) > 1 else min(starts)
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
        # Views of storage held anyway (parameters, an expanded view's base) allocate nothing.
        add(dev, node.output_bytes - node.view_bytes, start[node.name], free_at,
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
