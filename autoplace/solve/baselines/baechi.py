"""Baechi's memory-aware list schedulers, m-ETF and m-SCT: baselines and hints for CP-SAT.

Jeon, Cai, Shetty, Kang, Gupta, "Baechi: fast device placement of machine learning graphs", SoCC
2020, makes two list schedulers memory-aware: **m-ETF**, earliest task first (Hwang, Chow, Anger,
Lee, SIAM J. Comput. 18(2), 1989), and **m-SCT**, small communication times (Hanen and Munier,
Discrete Appl. Math. 1995: ETF that keeps a device for the *favourite child* of the node it just
ran unless another node is *urgent*; both rules: ``docs/concepts.md``, "Baselines"). Memory as in
Baechi: a node's candidates are the devices where its colocation group's parameters and
``heuristics.activation_reserve`` fit (the first placed fixes the group's device); none: ``None``.

Read ``m_etf`` and ``m_sct``, then ``_list_schedule`` (one loop for both, on numpy arrays of nodes
x devices) and ``favourite_children``: a greedy matching, not Baechi's LP (why:
``docs/design-notes.md``, "solve"), over edges with non-zero communication in decreasing order of
the longest path through them (mean compute, mean communication), the first that keeps one
favourite child per parent and one favourite parent per child winning.
"""

from __future__ import annotations

import numpy as np

from autoplace.ir import Placement, Problem
from autoplace.simulate import upward_rank
from autoplace.solve.baselines.heuristics import (
    _group_bytes,
    activation_reserve,
    group_devices,
    mean_delay_s,
)

__all__ = ["favourite_children", "m_etf", "m_sct"]

_TIE = 1e-12  # relative: two start times this close count as equal


def m_etf(problem: Problem) -> Placement | None:
    """Memory-aware earliest task first (Baechi's m-ETF); ``None`` if memory cannot be met.

    Every node runs on a device where it can run (finite cost), colocation groups share one
    device, each device's parameters plus the activation reserve stay within its memory. The
    per-device ``order`` is the order ETF started the nodes in, so the simulator reproduces ETF's
    schedule exactly.
    """
    return _list_schedule(problem, favourite=None)


def m_sct(problem: Problem) -> Placement | None:
    """Memory-aware small communication times (Baechi's m-SCT): ETF that keeps a device for the
    favourite child of the node it just ran. Same guarantees as ``m_etf``."""
    return _list_schedule(problem, favourite=favourite_children(problem))


def favourite_children(problem: Problem) -> dict[str, str]:
    """Each parent's favourite child (parents without one are absent): a greedy matching over
    edges that cost communication, most critical first (see the module docstring)."""
    graph, costs = problem.graph, problem.costs
    runs_on = group_devices(problem)
    own = {n.name: sum(costs.of(n.name, d) for d in problem.allowed[n.name])
           / len(problem.allowed[n.name]) for n in graph.nodes}
    comm = {(e.src, e.dst): mean_delay_s(problem, e) for e in graph.edges}
    bottom = upward_rank(problem)  # own compute plus the longest path below, no communication
    # Longest path from a source to the node's start. Hand-written: networkx's longest path
    # gives the graph's one longest, not every node's.
    top: dict[str, float] = {}
    for node in graph.nodes:
        top[node.name] = max((top[e.src] + own[e.src] + comm[(e.src, e.dst)]
                              for e in graph.in_edges(node.name)), default=0.0)
    through = sorted(
        (e for e in graph.edges if comm[(e.src, e.dst)] > 0
         and set(runs_on[e.src]) & set(runs_on[e.dst])),
        key=lambda e: (-(top[e.src] + own[e.src] + comm[(e.src, e.dst)] + bottom[e.dst]),
                       -comm[(e.src, e.dst)], graph.index[e.src], graph.index[e.dst]))
    favourite: dict[str, str] = {}
    has_parent: set[str] = set()
    for e in through:
        if e.src not in favourite and e.dst not in has_parent:
            favourite[e.src] = e.dst
            has_parent.add(e.dst)
    return favourite


def _list_schedule(problem: Problem, *, favourite: dict[str, str] | None) -> Placement | None:
    graph, cluster, costs = problem.graph, problem.cluster, problem.costs
    names = [n.name for n in graph.nodes]
    devices = list(cluster.names)
    n, k = len(names), len(devices)
    index = graph.index

    # --- data, one row per node, one column per device
    cost = np.array([[costs.of(v, d) for d in devices] for v in names], dtype=float)
    runs_on = group_devices(problem)
    can_run = np.array([[d in runs_on[v] for d in devices] for v in names], dtype=bool)
    group_bytes = _group_bytes(problem)
    gbytes = np.array([group_bytes[v] for v in names], dtype=np.int64)
    capacity = np.array([dev.memory_bytes for dev in cluster.devices], dtype=np.int64)
    reserve = activation_reserve(problem)
    rank_map = upward_rank(problem)
    rank = np.array([rank_map[v] for v in names])
    members = {v: [index[m] for m in graph.colocation_of[v]] for v in names}
    fav = np.full(n, -1)
    for parent, child in (favourite or {}).items():
        fav[index[parent]] = index[child]

    # --- state
    pending = np.array([len({e.src for e in graph.in_edges(v)}) for v in names])
    ready = set(np.flatnonzero(pending == 0).tolist())
    data_ready = np.zeros((n, k))  # when a ready node's inputs are all on each device
    fixed = np.full(n, -1)  # the device a placed colocation group pins each member to
    device_of = np.full(n, -1)
    end = np.zeros(n)
    used = np.zeros(k, dtype=np.int64)
    free_at = np.zeros(k)
    last = np.full(k, -1)
    order: list[list[str]] = [[] for _ in devices]

    for _ in range(n):
        # Only the ready rows: one step costs O(ready x devices).
        rows = np.array(sorted(ready))
        fits = used[None, :] + gbytes[rows, None] + reserve <= capacity[None, :]
        pin = fixed[rows, None]
        eligible = can_run[rows] & np.where(pin >= 0, pin == np.arange(k)[None, :], fits)
        if not eligible.any(axis=1).all():
            return None  # memory only fills up: this node will never fit anywhere
        est = np.where(eligible, np.maximum(data_ready[rows], free_at[None, :]), np.inf)
        if favourite is not None:
            _keep_for_favourites(est, rows=rows, last=last, fav=fav,
                                 data_ready=data_ready, can_run=can_run)
        best = est.min()
        tied = est <= best + _TIE * max(best, 1.0)
        candidates = np.flatnonzero(tied.any(axis=1))
        # Highest static level, then first in topological order (rows are sorted).
        r = int(candidates[np.argmax(rank[rows[candidates]])])
        v = int(rows[r])
        cols = np.flatnonzero(tied[r])
        d = int(cols[np.argmin(est[r, cols] + cost[v, cols])])  # earliest finish, then first

        end[v] = est[r, d] + cost[v, d]
        free_at[d] = end[v]
        device_of[v] = d
        ready.discard(v)
        last[d] = v
        order[d].append(names[v])
        if fixed[v] < 0:
            used[d] += gbytes[v]
            fixed[members[names[v]]] = d
        for succ in dict.fromkeys(e.dst for e in graph.out_edges(names[v])):
            w = index[succ]
            pending[w] -= 1
            if pending[w] == 0:
                ready.add(w)
                data_ready[w] = [max((end[index[e.src]]
                                      + problem.delay_s(e, devices[device_of[index[e.src]]], dd)
                                      for e in graph.in_edges(succ)), default=0.0)
                                 for dd in devices]
    return Placement(device_of={v: devices[device_of[i]] for i, v in enumerate(names)},
                     order={d: tuple(seq) for d, seq in zip(devices, order)})


def _keep_for_favourites(
    est: np.ndarray,
    *,
    rows: np.ndarray,
    last: np.ndarray,
    fav: np.ndarray,
    data_ready: np.ndarray,
    can_run: np.ndarray,
) -> None:
    """SCT's rule, in place on ``est`` (one row per ready node in ``rows``, sorted): a device
    whose last node's favourite child is ready and starts there earliest is kept for that child;
    other nodes may take it first only if they are urgent."""
    # A node is urgent at t once its data would have reached every device it can run on.
    urgent_at = np.where(can_run[rows], data_ready[rows], -np.inf).max(axis=1)
    for d, parent in enumerate(last):
        if parent < 0 or fav[parent] < 0:
            continue
        r = int(np.searchsorted(rows, fav[parent]))
        if r == len(rows) or rows[r] != fav[parent] or not np.isfinite(est[r, d]):
            continue  # the child is not ready (or already placed), or cannot go on d
        if est[r, d] > est[r].min() + _TIE * max(float(est[r, d]), 1.0):
            continue  # another device starts the child sooner: no reason to wait for it here
        column = est[:, d]
        blocked = column + _TIE * np.maximum(np.abs(column), 1.0) < urgent_at
        blocked[r] = False
        column[blocked] = np.inf
