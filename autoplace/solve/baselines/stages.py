"""Pipeline stages over colocation groups: the split ``contiguous_dp`` cannot make.

``partition.contiguous_dp`` never cuts inside a colocation group's span in topological order, and a
training graph's layer has its forward and backward (one group: they share a parameter) at the two
ends of every such order: no cut. ``group_dp`` instead orders the *groups* (by first member, or by
the Fiedler vector of the traffic between them, so that groups that talk a lot sit close) and cuts
that order into consecutive segments, one device each: the pipeline stages people build by hand for
training (PipeDream, Narayanan et al., SOSP 2019; layer ``i``'s forward and backward on one stage).
A segment's load, as ``simulate.loads``, depends on no order: its compute, plus a copy's time once
for each member read outside it and once for each outside node it reads (a node's copy time is its
longest out-edge's delay, exact when all its copies cost the same, as in profiled graphs). The
O(m^2) segments' loads are built incrementally (an extension touches only the added node's edges),
the DP over devices in cluster order is O(k m^2) with numpy, exact among these splits; above
``max_groups``, ``None``. ``stage_order`` says whether a placement is such a chain of stages, and
in which device order (``solve.is_contiguous``; CP-SAT's stage ranks are hinted with it).
"""

from __future__ import annotations

from collections.abc import Mapping

import networkx as nx
import numpy as np

from autoplace.config.choices import Objective
from autoplace.ir import Placement, Problem
from autoplace.simulate import simulate
from autoplace.solve.baselines.heuristics import activation_reserve
from autoplace.solve.baselines.partition import slowest_delay_s

__all__ = ["group_dp", "stage_dp", "stage_order"]


def stage_dp(problem: Problem, objective: str = "throughput") -> Placement | None:
    """``group_dp`` over two orders of the groups (by first member, and spectral), the better
    under the simulator's ``objective``."""
    found = [p for p in (group_dp(problem, objective, key=key) for key in ("first", "spectral"))
             if p is not None]
    scored = [(simulate(problem, p), p) for p in found]
    feasible = [(s.objective_s(objective), i) for i, (s, _) in enumerate(scored) if s.feasible]
    return scored[min(feasible)[1]][1] if feasible else None


def group_dp(problem: Problem, objective: str = "throughput", *,
             max_groups: int = 1500, key: str = "first") -> Placement | None:
    """Split the groups, in order of their first member (``key="first"``) or spectrally
    (``key="spectral"``), into consecutive segments on the devices in cluster order,
    minimising the largest load (``throughput``) or the sum of loads (``latency``, a proxy).
    ``None`` if memory or allowed devices cannot be met, or with more than ``max_groups``
    groups."""
    graph, cluster = problem.graph, problem.cluster
    groups = sorted({tuple(g) for g in graph.colocation_of.values()},
                    key=lambda g: min(graph.index[v] for v in g))
    m, k = len(groups), len(cluster.devices)
    if m > max_groups or m < 2:
        return None
    if key == "spectral":
        groups = _spectral_order(problem, groups)
    comm = _segment_comm(problem, groups)

    devices = list(cluster.names)
    cost = np.array([[sum(problem.costs.of(v, d) for v in g) for g in groups] for d in devices])
    cannot = ~np.isfinite(cost)
    zeros = np.zeros((k, 1))
    compute = np.concatenate([zeros, np.cumsum(np.where(cannot, 0.0, cost), axis=1)], axis=1)
    blocked = np.concatenate([zeros, np.cumsum(cannot, axis=1)], axis=1)
    params = np.concatenate([[0], np.cumsum([sum(graph.node(v).param_bytes for v in g)
                                             for g in groups])])
    capacity = np.array([d.memory_bytes for d in cluster.devices]) - activation_reserve(problem)
    charged = [1.0 if d.charges_transfers else 0.0 for d in cluster.devices]
    combine = np.maximum if objective == Objective.THROUGHPUT else np.add

    # best[t, j]: groups before j on devices 0..t; choice[t, j]: where device t's segment starts.
    best = np.full((k, m + 1), np.inf)
    choice = np.zeros((k, m + 1), dtype=np.int64)
    first = np.full(m + 1, np.inf)
    first[0] = 0.0
    for t in range(k):
        prev = first if t == 0 else best[t - 1]
        for j in range(m + 1):
            starts = np.arange(j + 1)
            load = compute[t, j] - compute[t, starts] + charged[t] * comm[starts, j]
            ok = (blocked[t, j] == blocked[t, starts]) & (params[j] - params[starts]
                                                          <= capacity[t])
            ok[j], load[j] = True, 0.0  # an empty segment
            value = np.where(ok, combine(prev[:j + 1], load), np.inf)
            i = j - int(np.argmin(value[::-1]))
            best[t, j], choice[t, j] = value[i], i
    if not np.isfinite(best[k - 1, m]):
        return None
    device_of: dict[str, str] = {}
    j = m
    for t in range(k - 1, -1, -1):
        i = int(choice[t, j])
        for g in groups[i:j]:
            for v in g:
                device_of[v] = devices[t]
        j = i
    return Placement(device_of=device_of)


def _spectral_order(problem: Problem, groups: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Groups sorted by the Fiedler vector of the communication graph between them: an order in
    which heavily communicating groups sit close, so consecutive segments cut little traffic."""
    graph = problem.graph
    where = {v: i for i, g in enumerate(groups) for v in g}
    m = len(groups)
    weight = np.zeros((m, m))
    for e in graph.edges:
        a, b = where[e.src], where[e.dst]
        if a != b:
            w = 1.0 + (e.transfer_s or 0.0)
            weight[a, b] += w
            weight[b, a] += w
    # numpy's dense eigh, not nx.fiedler_vector: that one refuses a disconnected graph, and
    # its iterative solver (tolerance 1e-8) ordered 2 of 40 random group graphs differently.
    laplacian = np.diag(weight.sum(axis=1)) - weight
    _, vectors = np.linalg.eigh(laplacian)
    fiedler = vectors[:, 1]
    first = [min(graph.index[v] for v in g) for g in groups]
    if np.corrcoef(fiedler, first)[0, 1] < 0:
        fiedler = -fiedler  # keep the graph's direction: inputs first
    return [groups[i] for i in np.argsort(fiedler, kind="stable")]


def _segment_comm(problem: Problem, groups: list[tuple[str, ...]]) -> np.ndarray:
    """``comm[i, j]``: the communication load of the segment of groups ``i .. j-1``."""
    graph = problem.graph
    m = len(groups)
    edge_delay = {(e.src, e.dst): slowest_delay_s(problem, e) for e in graph.edges}
    send = {n.name: max((edge_delay[(e.src, e.dst)] for e in graph.out_edges(n.name)),
                        default=0.0) for n in graph.nodes}
    readers = {n.name: [e.dst for e in graph.out_edges(n.name)] for n in graph.nodes}
    comm = np.zeros((m + 1, m + 1))
    for i in range(m):
        inside: set[str] = set()
        outside_readers: dict[str, int] = {}
        received: dict[str, float] = {}
        total = 0.0
        for j in range(i, m):
            for v in groups[j]:
                total -= received.pop(v, 0.0)  # v no longer receives: it is inside now
                out = sum(1 for r in readers[v] if r not in inside)
                outside_readers[v] = out
                if out:
                    total += send[v]
                inside.add(v)
                for e in graph.in_edges(v):
                    u = e.src
                    if u in inside:
                        outside_readers[u] -= 1
                        if outside_readers[u] == 0:
                            total -= send[u]
                    else:
                        grown = max(received.get(u, 0.0), edge_delay[(u, v)])
                        total += grown - received.get(u, 0.0)
                        received[u] = grown
            comm[i, j + 1] = total
    return comm


def stage_order(problem: Problem, device_of: Mapping[str, str]) -> list[str] | None:
    """The devices in an order in which no edge goes backwards, unused ones last; ``None`` if
    the placement is no chain of stages: some path leaves a device's node set and comes back,
    or two devices feed each other (d0 -> d1 on one path, d1 -> d0 on another).

    The order is breadth-first (Kahn's algorithm with a queue: networkx's topological
    generations, one after another), used devices first and by name, each device's successors
    by name; CP-SAT's rank hint follows it, so a change of order changes deterministic plans."""
    names = problem.cluster.names
    used = set(device_of.values())
    feeds = nx.DiGraph()
    feeds.add_nodes_from(sorted(names, key=lambda d: (d not in used, d)))
    crossing = {(device_of[e.src], device_of[e.dst]) for e in problem.graph.edges}
    feeds.add_edges_from(sorted((a, b) for a, b in crossing if a != b))
    try:
        order = [d for generation in nx.topological_generations(feeds) for d in generation]
    except nx.NetworkXUnfeasible:
        return None
    return [d for d in order if d in used] + [d for d in order if d not in used]
