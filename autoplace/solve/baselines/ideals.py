"""The exact dynamic program over contiguous splits of a DAG: chains of ideals (Tarnawski,
Phanishayee, Devanur, Mahajan, Nina Paravecino; NeurIPS 2020, section 4).

A split of a DAG into stages that run one after another, no path leaving a stage and coming back,
is a chain of ideals ``{} = I0 <= I1 <= ... <= Ik = V`` (an ideal is closed under predecessors),
stage ``t`` being ``It - I(t-1)`` on the ``t``-th device in cluster order. The DP ``best[t][J] =
min over ideals I <= J of combine(best[t-1][I], load_t(J - I))``, ``combine`` the max
(``throughput``: the largest load) or the sum (``latency``: a proxy) is exact among all contiguous
splits, ``partition.contiguous_dp`` only among one topological order's. It costs the number of
ideals squared, exponential in the graph's width, so above ``max_ideals`` it returns ``None``.
Units are colocation groups. Where their quotient graph has a cycle (a training graph: a layer's
forward and backward in one group), ideals follow the quotient's edges that go forward in
``partition.grouped_order`` (the forward edges), as the authors' DP for training does. A segment's
load is exactly ``simulate.loads``': its compute, plus (where the device charges transfers) each
member's longest edge out of it and each outside node's longest into it.
"""

from __future__ import annotations

import functools
import operator

import networkx as nx
import numpy as np

from autoplace.config.choices import Objective
from autoplace.ir import Placement, Problem
from autoplace.solve.baselines.heuristics import NotRun, activation_reserve
from autoplace.solve.baselines.partition import grouped_order, slowest_delay_s

__all__ = ["ideal_dp"]


def ideal_dp(problem: Problem, objective: str = "throughput", *,
             max_ideals: int = 600, max_states: int = 512) -> Placement | None:
    """The best contiguous split (a chain of ideals of the colocation groups' graph), each stage
    on its own device; ``None`` when no split meets memory and the devices each node may run
    on. Raises ``NotRun`` with more than ``max_ideals`` ideals or more than ``max_states``
    combinations of device counts per class (the DP's time grows with both)."""

    graph, cluster = problem.graph, problem.cluster
    if len(set(graph.colocation_of.values())) + 1 > max_ideals:
        # Every prefix of a topological order is an ideal.
        raise NotRun(f"more than {max_ideals} ideals (the graph has "
                     f"{len(set(graph.colocation_of.values()))} units)")
    groups, preds = _units(problem)
    unit_of = {v: i for i, g in enumerate(groups) for v in g}
    of_node = np.array([unit_of[n.name] for n in graph.nodes])
    ideals = _ideals(preds, max_ideals)
    if ideals is None:
        raise NotRun(f"more than {max_ideals} ideals (the graph has {len(groups)} units)")
    if len(ideals) < 2:
        return None

    # --- data: membership of each ideal, and per group its cost on each device and its bytes
    member = np.array([[(ideal >> g) & 1 for g in range(len(groups))] for ideal in ideals],
                      dtype=bool)
    cost = np.zeros((len(groups), len(cluster.devices)))
    for n, g in zip(graph.nodes, of_node, strict=True):
        cost[g] += [problem.costs.of(n.name, d) for d in cluster.names]
    cannot = ~np.isfinite(cost)
    cost[cannot] = 0.0
    params = np.zeros(len(groups))
    np.add.at(params, of_node, [n.param_bytes for n in graph.nodes])
    edges = _edges(problem, unit_of)

    # --- per ideal J: the ideals I <= J and the segments J - I (shared by every device)
    segments = []
    for j in range(len(ideals)):
        subs = np.flatnonzero(~(member[:j + 1] & ~member[j]).any(axis=1))
        inside = member[j] & ~member[subs]  # (subsets, groups)
        segments.append((subs, inside @ cost, inside @ cannot > 0, inside @ params,
                         _comm(inside, *edges)))

    classes = _classes(problem)
    states = int(np.prod([len(members) + 1 for members in classes]))
    if states > max_states:
        raise NotRun(f"{states} combinations of device counts, more than {max_states}")
    chain = _chain_dp(problem, segments, classes, objective)
    if chain is None:
        return None
    device_of: dict[str, str] = {}
    for device, j, i in chain:
        for g in np.flatnonzero(member[j] & ~member[i]):
            for v in groups[g]:
                device_of[v] = device
    return Placement(device_of=device_of)


def _chain_dp(problem: Problem, segments: list[tuple], classes: list[list[int]],
              objective: str) -> list[tuple[str, int, int]] | None:
    """The DP over how many devices of each class are used; returns the best chain's stages as
    (device, ideal it ends at, ideal it starts after), or ``None`` when no chain fits.

    A class is a set of interchangeable devices (same costs, memory, transfer charging), so
    which of them takes a stage does not matter, and stages may use the classes in any order (a
    CPU stage between accelerators)."""
    cluster = problem.cluster
    m = len(segments)
    capacity = np.array([d.memory_bytes for d in cluster.devices]) - activation_reserve(problem)
    charged = np.array([1.0 if d.charges_transfers else 0.0 for d in cluster.devices])
    shape = tuple(len(members) + 1 for members in classes)
    combine = np.maximum if objective == Objective.THROUGHPUT else np.add
    best = np.full((*shape, m), np.inf)
    best[(0,) * len(shape)][0] = 0.0
    choice: dict[tuple[int, ...], np.ndarray] = {}
    for used in sorted(np.ndindex(*shape), key=sum):
        if not any(used):
            continue
        here = best[used]
        came = np.full((m, 2), -1, dtype=np.int64)  # (class, start ideal) of the last stage
        for q, members in enumerate(classes):
            if used[q] == 0:
                continue
            before = best[tuple(c - (i == q) for i, c in enumerate(used))]
            t = members[0]
            for j, (subs, compute, blocked, size, comm) in enumerate(segments):
                load = compute[:, t] + charged[t] * comm
                ok = ~blocked[:, t] & (size <= capacity[t]) & (subs != j)
                value = np.where(ok, combine(before[subs], load), np.inf)
                at = int(np.argmin(value))
                if value[at] < here[j]:
                    here[j], came[j] = value[at], (q, subs[at])
        choice[used] = came
    finals = [(best[used][m - 1], used) for used in np.ndindex(*shape)]
    value, used = min(finals)
    if not np.isfinite(value):
        return None

    chain: list[tuple[str, int, int]] = []
    j = m - 1
    while any(used):
        q, i = (int(x) for x in choice[used][j])
        chain.append((cluster.names[classes[q][used[q] - 1]], j, i))
        used = tuple(c - (x == q) for x, c in enumerate(used))
        j = i
    return chain


def _classes(problem: Problem) -> list[list[int]]:
    """Devices (indices in cluster order) grouped into classes interchangeable for the DP: the
    same costs, memory and transfer charging (copies are charged their slowest link anyway)."""
    cluster = problem.cluster
    keys: dict[tuple, list[int]] = {}
    for t, d in enumerate(cluster.devices):
        key = (d.memory_bytes, d.charges_transfers,
               tuple(problem.costs.of(n.name, d.name) for n in problem.graph.nodes))
        keys.setdefault(key, []).append(t)
    return list(keys.values())


def _units(problem: Problem) -> tuple[list[tuple[str, ...]], list[int]]:
    """The units a split moves whole (colocation groups, in ``grouped_order``), and each
    unit's predecessors as a bit mask.

    When the groups' graph has a cycle, only edges that go forward in the order count. A node
    in no group whose outputs all go back in the order (a gradient sum in a training graph's
    backward pass) would then be free to join any later stage and multiply the ideals, so it
    joins the unit that feeds it last instead."""
    graph = problem.graph
    position = {v: i for i, v in enumerate(grouped_order(problem))}
    units = sorted(dict.fromkeys(graph.colocation_of.values()),
                   key=lambda g: min(position[v] for v in g))
    while True:
        index = {v: i for i, g in enumerate(units) for v in g}
        ahead: list[set[int]] = [set() for _ in units]
        behind: list[set[int]] = [set() for _ in units]
        back = [False] * len(units)
        for e in graph.edges:
            a, b = index[e.src], index[e.dst]
            if a < b:
                ahead[b].add(a)
                behind[a].add(b)
            elif a > b:
                back[a] = True
        dangling = next((u for u in range(len(units))
                         if len(units[u]) == 1 and back[u] and not behind[u] and ahead[u]),
                        None)
        if dangling is None:
            break
        into = max(ahead[dangling])
        merged = units[into] + units[dangling]
        units = [merged if i == into else g for i, g in enumerate(units) if i != dangling]
    preds = [sum(1 << a for a in ahead[b]) for b in range(len(units))]
    return units, preds


def _ideals(preds: list[int], limit: int) -> list[int] | None:
    """Every ideal as a bit mask, by size (so a subset comes before its supersets); ``None``
    past ``limit``. ``preds[b]`` has bit ``a`` set for each predecessor ``a < b`` of unit ``b``.

    An ideal is the set of its maximal units and what lies below them, and those maximal units
    are an antichain, one ideal per antichain: networkx enumerates the antichains."""
    units = nx.DiGraph()
    units.add_nodes_from(range(len(preds)))
    units.add_edges_from((a, b) for b, need in enumerate(preds)
                         for a in range(b) if need >> a & 1)
    below = [1 << g | sum(1 << a for a in nx.ancestors(units, g)) for g in units]
    found: list[int] = []
    for antichain in nx.antichains(units, topo_order=range(len(preds))):
        found.append(functools.reduce(operator.or_, (below[g] for g in antichain), 0))
        if len(found) > limit:
            return None
    return sorted(found, key=lambda ideal: (ideal.bit_count(), ideal))


def _edges(problem: Problem, unit_of: dict[str, int]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Edges between units, sorted by source node: start of each source's run, the units at
    both ends, and the copy's time (the slowest link's when links differ)."""
    graph = problem.graph
    rows = []
    for e in graph.edges:
        a, b = unit_of[e.src], unit_of[e.dst]
        if a != b:
            rows.append((graph.index[e.src], a, b, slowest_delay_s(problem, e)))
    rows.sort()
    src = np.array([r[0] for r in rows], dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]]) if len(rows) else src
    return (starts, np.array([r[1] for r in rows], dtype=np.int64),
            np.array([r[2] for r in rows], dtype=np.int64), np.array([r[3] for r in rows]))


def _comm(inside: np.ndarray, starts: np.ndarray, src: np.ndarray, dst: np.ndarray,
          delay: np.ndarray) -> np.ndarray:
    """For each segment (a row of ``inside``): each node's longest edge out of it, plus each
    outside node's longest edge into it."""
    if len(delay) == 0:
        return np.zeros(len(inside))
    a, b = inside[:, src], inside[:, dst]
    out = np.maximum.reduceat(np.where(a & ~b, delay, 0.0), starts, axis=1).sum(axis=1)
    into = np.maximum.reduceat(np.where(~a & b, delay, 0.0), starts, axis=1).sum(axis=1)
    return out + into
