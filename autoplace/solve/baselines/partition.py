"""Partitioners that cut the topological order into consecutive pieces, one piece a device.

* ``balanced_fill``: accelerate's ``device_map="balanced"``: like ``heuristics.sequential_fill``,
  but each device takes only an even share of the parameter bytes before the fill moves on;
* ``contiguous_dp``: the classic pipeline partitioner, an exact dynamic program over contiguous
  splits of the topological order (PipeDream, Narayanan et al., SOSP 2019; the contiguous
  baseline of Tarnawski et al., NeurIPS 2020), for the ``throughput`` objective (the largest
  per-device load, as ``simulate.loads`` defines it) or, as a proxy, ``latency``.

Both return a ``Placement`` (or ``None`` when they cannot respect memory); the simulator scores
it. Memory is counted as in ``heuristics``: resident parameters plus the activation reserve.

Read ``balanced_fill``, then ``contiguous_dp`` and its helpers ``_cut_points`` (where a segment
may begin) and ``_sweep`` (the incremental loads the DP needs).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import networkx as nx
import numpy as np

from autoplace.config.choices import Objective
from autoplace.errors import AutoplaceError
from autoplace.ir import Edge, Placement, Problem
from autoplace.simulate import simulate
from autoplace.solve.baselines.heuristics import (
    _group_bytes,
    activation_reserve,
    group_devices,
    sequential_fill,
)

__all__ = ["balanced_fill", "contiguous_dp", "contiguous_split", "grouped_order"]

_OBJECTIVES = tuple(Objective)



def slowest_delay_s(problem: Problem, edge: Edge) -> float:
    """``edge``'s copy time over the slowest link between two distinct devices (0 with one
    device): what a placement-independent model (the contiguous-split and ideal DPs) charges a
    copy before it knows which devices the ends land on."""
    # Over the pairs of distinct figures, not every ordered pair: the same maximum, n * (n - 1)
    # times fewer (56 -> 1 on 8 alike GPUs; the DPs ask once per edge, 3,000 edges for
    # Llama-2-70B).
    return max((problem.delay_s(edge, a, b) for a, b in problem.cluster.distinct_links),
               default=0.0)


def balanced_fill(problem: Problem) -> Placement | None:
    """Fill devices in cluster order, nodes in topological order, each device but the last only
    up to an even share of the parameter bytes (accelerate's ``get_balanced_memory``: total
    bytes / devices; the last device keeps its whole capacity, as there).

    A node whose colocation group would take the device past its share (or past its capacity
    less the activation reserve) moves the fill on to the next device that can take it; when no
    later device can within its share, the first that can within its capacity. A node that
    cannot run on the device being filled goes to the first later one that can take it, without
    moving the fill on (as ``sequential_fill``). If a node still finds no device, the result is
    ``sequential_fill``'s (every device to capacity); ``None`` only when that fails too.
    """
    graph, cluster = problem.graph, problem.cluster
    reserve = activation_reserve(problem)
    group_bytes = _group_bytes(problem)
    runs_on = group_devices(problem)
    share = math.ceil(graph.total_param_bytes / len(cluster.devices))
    used = dict.fromkeys(cluster.names, 0)
    device_of: dict[str, str] = {}
    current = 0

    def fits(i: int, name: str, *, to_share: bool) -> bool:
        dev = cluster.devices[i]
        after = used[dev.name] + group_bytes[name]
        return (dev.name in runs_on[name] and after + reserve <= dev.memory_bytes
                and (not to_share or i == len(cluster.devices) - 1 or after <= share))

    def first(start: int, name: str) -> int | None:
        for to_share in (True, False):
            found = next((i for i in range(start, len(cluster.devices))
                          if fits(i, name, to_share=to_share)), None)
            if found is not None:
                return found
        return None

    for node in graph.nodes:
        if node.name in device_of:
            continue
        chosen = first(current, node.name)
        if chosen is None:
            return sequential_fill(problem)
        if cluster.devices[current].name in runs_on[node.name]:
            current = chosen
        dev_name = cluster.devices[chosen].name
        used[dev_name] += group_bytes[node.name]
        for member in graph.colocation_of[node.name]:
            device_of[member] = dev_name
    return Placement(device_of=device_of)


def contiguous_dp(
    problem: Problem, objective: str = "throughput", *, max_cuts: int = 2048,
    order: Sequence[str] | None = None,
) -> Placement | None:
    """The best split of the topological order into consecutive segments, segment ``t`` on the
    ``t``-th device in cluster order (a segment may be empty: devices may go unused).

    ``throughput`` minimises the largest per-device load exactly as ``simulate.loads`` defines
    it (compute, plus each copy's time once on the sending and once on the receiving device, on
    devices that charge transfers), among all such splits, when an edge's delay is the same on
    every link (fixed ``transfer_s``, or identical links); otherwise each copy is charged its
    slowest link, an upper bound, and the simulator scores the actual plan. ``latency``
    minimises the sum of the segments' loads, a proxy for a chain of stages run one after
    another; the simulator scores the plan.

    Constraints: a segment's parameters plus the activation reserve fit its device; a node runs
    only where its cost is finite; a colocation group is never cut (no segment boundary falls
    between its first and last member in topological order). ``None`` when no split meets them.

    ``order`` is the topological order to split (``graph.nodes``' by default; see
    ``grouped_order`` for one that keeps colocation groups together).

    Scope: optimal among contiguous splits *of that order* onto devices *in cluster order*;
    for a chain that is every contiguous split, for a general DAG other topological orders,
    device orders and non-contiguous placements may do better (``ideals.ideal_dp`` is exact
    over all contiguous splits, where it can run). The DP is O(k m^2) over
    m candidate cut points plus O(E m) to maintain loads; with more than ``max_cuts`` allowed
    cut points it keeps an even subsample of them (then it is exact only over those).
    """
    if objective not in _OBJECTIVES:
        raise AutoplaceError(f"unknown objective {objective!r}; valid objectives: "
                             f"{', '.join(_OBJECTIVES)}")
    graph, cluster, costs = problem.graph, problem.cluster, problem.costs
    names = [node.name for node in graph.nodes] if order is None else list(order)
    position = {v: i for i, v in enumerate(names)}
    if len(position) != len(graph.nodes) or any(
            position[e.src] >= position[e.dst] for e in graph.edges):
        raise AutoplaceError("contiguous_dp needs a topological order of every node once")
    devices = list(cluster.names)
    n, k = len(names), len(devices)
    cuts = _cut_points(problem, position, max_cuts=max_cuts)
    m = len(cuts)
    cut_rank = {int(p): c for c, p in enumerate(cuts)}

    # --- data: per device, prefix sums over the order (compute, nodes that cannot run there)
    cost = np.array([[costs.of(v, d) for v in names] for d in devices], dtype=float)
    cannot = ~np.isfinite(cost)
    zeros = np.zeros((k, 1))
    compute = np.concatenate([zeros, np.cumsum(np.where(cannot, 0.0, cost), axis=1)], axis=1)
    blocked = np.concatenate([zeros, np.cumsum(cannot, axis=1)], axis=1)
    params = np.concatenate([[0], np.cumsum([graph.node(v).param_bytes for v in names])])
    capacity = np.array([d.memory_bytes for d in cluster.devices]) - activation_reserve(problem)
    charged = [1.0 if d.charges_transfers else 0.0 for d in cluster.devices]

    # --- DP: best[t, c] = best value for nodes before cut c on devices 0..t; choice = start cut
    combine = np.maximum if objective == Objective.THROUGHPUT else np.add
    previous = np.full(m, np.inf)
    previous[0] = 0.0
    best = np.full((k, m), np.inf)
    best[:, 0] = 0.0  # nothing placed yet, every device empty
    choice = np.zeros((k, m), dtype=np.int64)
    for j, comm in _sweep(problem, names, position, cuts):
        c = cut_rank[j]
        starts = cuts[:c + 1]
        for t in range(k):
            prev = previous if t == 0 else best[t - 1]
            load = charged[t] * comm[:c + 1] + compute[t, j] - compute[t, starts]
            ok = (blocked[t, j] == blocked[t, starts]) & (params[j] - params[starts]
                                                          <= capacity[t])
            ok[c] = True  # the empty segment: no memory, no reserve
            load[c] = 0.0
            value = np.where(ok, combine(prev[:c + 1], load), np.inf)
            i = c - int(np.argmin(value[::-1]))  # ties: the latest start, devices fill in order
            best[t, c], choice[t, c] = value[i], i
    if not np.isfinite(best[k - 1, m - 1]):
        return None

    device_of: dict[str, str] = {}
    c = m - 1
    for t in range(k - 1, -1, -1):
        i = int(choice[t, c])
        for v in names[cuts[i]:cuts[c]]:
            device_of[v] = devices[t]
        c = i
    assert c == 0 and len(device_of) == n
    return Placement(device_of=device_of)


def grouped_order(problem: Problem, *, seed: int | None = None,
                  stages: Mapping[str, int] | None = None) -> list[str]:
    """A topological order in which each node comes right after the inputs it needs first
    (depth-first from the outputs), and each colocation group's members are consecutive when the
    groups form no cycle (they do in training graphs: a layer's forward and backward op).

    Orders matter to ``contiguous_dp``, which can only cut between groups: in ``graph.nodes``
    order a weight that feeds a deep op often comes first, and if the two share a group the
    group spans the whole order and leaves no cut at all (Tarnawski et al.'s operator graphs).
    Here the weight sits next to its reader. ``seed`` shuffles the order in which a node's
    inputs are visited, for a different order of the same kind. With ``stages`` (a stage number
    per node, non-decreasing along every edge: a contiguous split), the order is stage by stage,
    depth-first inside each, so that split is again a split of the order.
    """
    graph = problem.graph
    rng = None if seed is None else np.random.default_rng(seed)
    for grouped in (True, False):
        group_of = {v: (graph.colocation_of[v] if grouped else (v,)) for v in graph.index}
        stage_of = {g: 0 if stages is None else stages[g[0]] for g in group_of.values()}
        preds: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
        for group in dict.fromkeys(group_of.values()):
            inputs = dict.fromkeys(group_of[e.src] for v in group for e in graph.in_edges(v)
                                   if stage_of[group_of[e.src]] == stage_of[group])
            inputs.pop(group, None)
            preds[group] = sorted(inputs, key=lambda g: -max(graph.index[v] for v in g))
            if rng is not None:
                rng.shuffle(preds[group])
        roots = list(dict.fromkeys(group_of[n.name] for n in reversed(graph.nodes)))
        if rng is not None:
            rng.shuffle(roots)
        roots.sort(key=stage_of.__getitem__)  # stable: stage by stage
        order = _postorder(preds, roots=roots)
        if order is not None:
            return [v for group in order for v in sorted(group, key=graph.index.__getitem__)]
    raise AssertionError("single nodes cannot form a cycle in a DAG")


def _postorder(preds: Mapping[tuple[str, ...], list[tuple[str, ...]]],
               roots: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]] | None:
    """Depth-first postorder over ``preds`` (each item after its predecessors, visited in list
    order, from ``roots`` in order); ``None`` on a cycle."""
    inputs = nx.DiGraph()
    inputs.add_nodes_from(roots)  # networkx starts its searches in the order nodes were added
    inputs.add_edges_from((item, p) for item, ps in preds.items() for p in ps)
    if not nx.is_directed_acyclic_graph(inputs):
        return None
    return list(nx.dfs_postorder_nodes(inputs))


def contiguous_split(problem: Problem, objective: str = "throughput") -> Placement | None:
    """``contiguous_dp`` over ``graph.nodes``' order and over ``grouped_order``; the better
    split under the simulator's ``objective``."""
    found = [p for p in (contiguous_dp(problem, objective),
                         contiguous_dp(problem, objective, order=grouped_order(problem)))
             if p is not None]
    scored = [(s.objective_s(objective), i) for i, s in
              enumerate(simulate(problem, p) for p in found) if s.feasible]
    return found[min(scored)[1]] if scored else (found[0] if found else None)


def _cut_points(problem: Problem, position: Mapping[str, int], *,
                max_cuts: int) -> np.ndarray:
    """Positions p (a segment starts at node p) that cut no colocation group, 0 and n included;
    an even subsample if there are more than ``max_cuts``."""
    graph = problem.graph
    n = len(graph.nodes)
    covered = np.zeros(n + 2, dtype=np.int64)  # difference array over positions
    for group in {tuple(g) for g in graph.colocation_of.values() if len(g) > 1}:
        first = min(position[v] for v in group)
        last = max(position[v] for v in group)
        covered[first + 1] += 1
        covered[last + 1] -= 1
    allowed = np.flatnonzero(np.cumsum(covered)[:n + 1] == 0)
    if len(allowed) > max(max_cuts, 2):
        keep = np.unique(np.linspace(0, len(allowed) - 1, max(max_cuts, 2)).round().astype(int))
        allowed = allowed[keep]
    return allowed


def _sweep(problem: Problem, names: Sequence[str], position: Mapping[str, int],
           cuts: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(j, comm)`` for every cut ``j > 0``: ``comm[c]`` is the communication load of the
    segment from ``cuts[c]`` to ``j`` (copies it receives plus copies it sends), for every
    ``c`` with ``cuts[c] <= j``.

    Adding node w to the right end of every segment at once: w sends to everything after it
    (its longest out-edge's delay, to every segment holding w); each in-edge (x, w) turns
    internal for segments that hold x (x's send drops to its longest remaining out-edge) and
    is received by segments that start after x (a copy from x costs the longest edge from x
    into the segment: kept per source x, dropped after x's last out-edge).
    """
    graph = problem.graph
    n = len(graph.nodes)
    m = len(cuts)
    up_to = np.searchsorted(cuts, np.arange(n + 1), side="right")  # cuts c with cuts[c] <= p
    delay = {(e.src, e.dst): slowest_delay_s(problem, e) for e in graph.edges}
    # x's outgoing delays in order of destination, and suffix maxima: x's send when its edges
    # to destinations before some point have turned internal.
    outs: dict[str, list[float]] = {}
    for node in graph.nodes:
        ds = [delay[(e.src, e.dst)]
              for e in sorted(graph.out_edges(node.name), key=lambda e: position[e.dst])]
        outs[node.name] = list(np.maximum.accumulate(ds[::-1])[::-1]) + [0.0] if ds else [0.0]
    sent = dict.fromkeys(outs, 0)  # how many of x's out-edges have turned internal
    received: dict[str, np.ndarray] = {}
    comm = np.zeros(m)
    is_cut = np.zeros(n + 1, dtype=bool)
    is_cut[cuts] = True
    for w, name in enumerate(names):
        comm[:up_to[w]] += outs[name][0]
        for e in graph.in_edges(name):
            x = position[e.src]
            before = outs[e.src][sent[e.src]]
            sent[e.src] += 1
            comm[:up_to[x]] += outs[e.src][sent[e.src]] - before
            lo, hi = up_to[x], up_to[w]
            if lo < hi:
                row = received.setdefault(e.src, np.zeros(m))
                grown = np.maximum(row[lo:hi], delay[(e.src, e.dst)])
                comm[lo:hi] += grown - row[lo:hi]
                row[lo:hi] = grown
            if sent[e.src] == len(outs[e.src]) - 1:
                received.pop(e.src, None)
        if is_cut[w + 1]:
            yield w + 1, comm
