"""Simulate: transfers that share a resource (``ir.SharedLink``: a host's NIC, a PCIe switch).

Exact and event-driven like the rest of the simulator (``docs/cli.md``, "Shared links"): a copy (a
node's output to another device, ``simulate.copies``) moves its bytes from its start (its
producer's end, or when its launcher issues it) at its **max-min fair share** of the shared
resources it crosses (progressive filling: Bertsekas & Gallager, *Data Networks*, 2nd ed., section
6.5.2), capped by its own link's bandwidth: a copy crossing two gets the smaller share, leaving the
rest of the other to its copies. Rates change only when a copy starts or finishes on a shared
resource, so between those events every rate is constant and every time exact. An edge reading
``b`` of the copy's bytes arrives the link's latency (paid once) after ``b`` bytes have moved:
alone, ``latency + b / min(bandwidth, shared bandwidths)``, ``Cluster.transfer_s``. A copy crossing
no shared resource, or an edge with a fixed ``transfer_s``, shares nothing and keeps its time.

Read ``Flows`` (the fair-share clock), then ``Copies`` (what ``_run`` drives) and ``replay`` (the
same rule over copies whose start times are known: ``validate``, ``launch.launched``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from autoplace.ir import Edge, Problem, Transfer

__all__ = ["Copies", "Flows", "fair_rates", "replay"]



def fair_rates(capacity: Mapping[str, float],
               flows: Mapping[object, tuple[float, Sequence[str]]]) -> dict[object, float]:
    """Max-min fair rates by progressive filling. ``capacity[r]``: resource ``r``'s bytes/s;
    ``flows[k] = (cap, resources)``: flow ``k``'s own cap (its link) and the resources it
    crosses. Every unfixed flow's rate rises together until a resource is full or a flow
    reaches its cap; those flows are fixed at that rate, and the rest go on."""
    left = dict(capacity)
    unfixed = dict(flows)
    rates: dict[object, float] = {}
    while unfixed:
        count: dict[str, int] = {}
        for _, on in unfixed.values():
            for r in on:
                count[r] = count.get(r, 0) + 1
        share = {r: max(left[r], 0.0) / n for r, n in count.items()}
        level = min([*share.values(), *(cap for cap, _ in unfixed.values())])
        full = {r for r, s in share.items() if s <= level * (1 + 1e-12)}
        fixed = [k for k, (cap, on) in unfixed.items()
                 if cap <= level * (1 + 1e-12) or full.intersection(on)]
        for k in fixed:
            rates[k] = level
            for r in unfixed[k][1]:
                left[r] -= level
            del unfixed[k]
    return rates


@dataclass
class _Flow:
    cap: float
    on: tuple[str, ...]
    marks: list[int]  # byte counts still to reach, ascending
    sent: float = 0.0
    rate: float = 0.0


@dataclass
class Flows:
    """The copies moving on shared resources, advanced from event to event."""

    capacity: dict[str, float]
    now: float = 0.0
    active: dict[object, _Flow] = field(default_factory=dict)

    def add(self, key: object, now: float, *, cap: float, on: Iterable[str],
            marks: Iterable[int]) -> None:
        """Start flow ``key`` at ``now``: it reports each of ``marks`` (bytes) as it reaches
        them. The others move on to ``now`` first; the caller has taken every mark reached
        before it (``advance``), and adds flows in time order."""
        assert now >= self.now - 1e-12 * max(1.0, now), "flows are added in time order"
        self._move(max(self.now, now))
        self.active[key] = _Flow(cap=cap, on=tuple(on), marks=sorted(set(marks)))
        self._rerate()

    def next_s(self) -> float:
        """When the next mark is reached (``inf`` with no flow)."""
        if not self.active:  # the common case, asked at every event of the simulator's loop
            return math.inf
        return min(self._due().values())

    def _due(self) -> dict[object, float]:
        return {k: self.now + max(f.marks[0] - f.sent, 0.0) / f.rate
                for k, f in self.active.items()}

    def advance(self, until: float) -> list[tuple[object, int, float, bool]]:
        """Move every flow on to ``until``; the marks reached on the way, in time order, as
        ``(key, bytes, when, finished)``. A flow whose mark falls due is taken to it, not
        compared with it: rounding cannot leave it a hair short, and each step reaches one
        mark at least."""
        reached: list[tuple[object, int, float, bool]] = []
        while self.active:
            due = self._due()
            t = min(due.values())
            if t > until:
                break
            self._move(t)
            done = False
            for key in [k for k, d in due.items() if d <= t]:
                f = self.active[key]
                mark = f.marks.pop(0)
                f.sent = float(mark)
                reached.append((key, mark, t, not f.marks))
                if not f.marks:
                    del self.active[key]
                    done = True
            if done:
                self._rerate()
        self._move(max(until, self.now) if math.isfinite(until) else self.now)
        return reached

    def _move(self, t: float) -> None:
        for f in self.active.values():
            f.sent += f.rate * (t - self.now)
        self.now = t

    def _rerate(self) -> None:
        rates = fair_rates(self.capacity, {k: (f.cap, f.on) for k, f in self.active.items()})
        for k, f in self.active.items():
            f.rate = rates[k]


@dataclass(frozen=True)
class _Copy:
    src: str
    src_device: str
    dst_device: str
    bytes: int
    start_s: float
    fixed_end_s: float  # the end of its edges that share nothing (its start when none)
    latency_s: float
    readers: dict[int, tuple[str, ...]]  # bytes -> the readers whose edges read that many


class Copies:
    """The contended copies of a simulation run: ``send`` starts a node's copies, ``due_s``
    says when the next edge arrives, ``arrivals`` hands over the edges arrived by then, and
    ``transfers`` lists the finished copies."""

    def __init__(self, problem: Problem, device_of: Mapping[str, str]) -> None:
        self.problem, self.device_of = problem, device_of
        self.flows = Flows({r.name: r.bandwidth_bytes_per_s for r in problem.cluster.shared})
        self.open: dict[tuple[str, str], _Copy] = {}
        self.transfers: list[Transfer] = []

    def contended(self, e: Edge) -> bool:
        """Whether edge ``e``'s data crosses a shared resource (and so arrives via ``Flows``)."""
        a, b = self.device_of[e.src], self.device_of[e.dst]
        return a != b and e.transfer_s is None and bool(self.problem.cluster.shared_on(a, b))

    def send(self, name: str, now: float,
             moved: Sequence[tuple[str, int, float]]) -> tuple[set[str], set[str]]:
        """Start ``name``'s copies at ``now`` (``moved``: ``simulate.copies``' entries for
        it); returns the devices whose copy goes through ``Flows`` (its transfer is recorded
        when it finishes) and the readers whose edge does (they wait for ``arrivals``)."""
        problem, src_dev = self.problem, self.device_of[name]
        devices: set[str] = set()
        readers: set[str] = set()
        if not problem.cluster.shared:
            return devices, readers
        shared_to: dict[str, list[Edge]] = {}  # by the reader's device: edges over Flows
        plain_to: dict[str, list[Edge]] = {}  # ... and edges that share nothing
        for e in problem.graph.out_edges(name):
            split = shared_to if self.contended(e) else plain_to
            split.setdefault(self.device_of[e.dst], []).append(e)
        for dst_dev, nbytes, _ in moved:
            shared = shared_to.get(dst_dev)
            if not shared:
                continue
            by_bytes: dict[int, tuple[str, ...]] = {}
            for e in shared:
                by_bytes[e.bytes] = (*by_bytes.get(e.bytes, ()), e.dst)
            fixed = max((now + problem.delay_s(e, src_dev, dst_dev)
                         for e in plain_to.get(dst_dev, ())), default=now)
            cluster = problem.cluster
            self.open[(name, dst_dev)] = _Copy(
                src=name, src_device=src_dev, dst_device=dst_dev, bytes=nbytes, start_s=now,
                fixed_end_s=fixed, latency_s=cluster.link(src_dev, dst_dev).latency_s,
                readers=by_bytes)
            self.flows.add((name, dst_dev), now, cap=cluster.rate_cap(src_dev, dst_dev),
                           on=[r.name for r in cluster.shared_on(src_dev, dst_dev)],
                           marks=by_bytes)
            devices.add(dst_dev)
            readers.update(e.dst for e in shared)
        return devices, readers

    @property
    def busy(self) -> bool:
        return bool(self.flows.active)

    def due_s(self) -> float:
        """When ``Flows`` next reaches a mark (an edge's bytes are sent; it arrives a latency
        later)."""
        return self.flows.next_s()

    def arrivals(self, until: float) -> list[tuple[str, str, float]]:
        """The edges whose bytes are sent by ``until``: ``(producer, reader, arrival_s)``."""
        arrived = []
        for key, mark, when, finished in self.flows.advance(until):
            copy = self.open[key]  # type: ignore[index]
            arrived += [(copy.src, v, when + copy.latency_s) for v in copy.readers[mark]]
            if finished:
                del self.open[key]  # type: ignore[arg-type]
                self.transfers.append(Transfer(
                    src=copy.src, src_device=copy.src_device, dst_device=copy.dst_device,
                    bytes=copy.bytes, start_s=copy.start_s,
                    end_s=max(when + copy.latency_s, copy.fixed_end_s)))
        return arrived


def replay(problem: Problem, device_of: Mapping[str, str],
           starts: Mapping[tuple[str, str], float],
           moved_from: Mapping[str, list[tuple[str, int, float]]],
           ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """The contended copies again from their known start times (``starts[(node, device)]``,
    every copy of the placement; ``moved_from``: ``simulate.copies`` by producer): when each
    contended edge ``(producer, reader)`` arrives, and when each contended copy ends. What
    ``validate`` re-checks a schedule with, and ``launch.timed`` times copies with."""
    copying = Copies(problem, device_of)
    arrival: dict[tuple[str, str], float] = {}
    for (name, dst_dev), t in sorted(starts.items(), key=lambda item: item[1]):
        arrival.update(((u, v), s) for u, v, s in copying.arrivals(t))
        copying.send(name, t, [m for m in moved_from[name] if m[0] == dst_dev])
    arrival.update(((u, v), s) for u, v, s in copying.arrivals(math.inf))
    ends = {(t.src, t.dst_device): t.end_s for t in copying.transfers}
    return arrival, ends
