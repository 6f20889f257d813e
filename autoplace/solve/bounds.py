"""Lower bounds on the makespan that hold for every placement, and the memory diagnosis.

* critical path: the longest path where every node takes its fastest time on any device that can
  hold it and transfers are free;
* total work: the work of every node at its fastest, spread perfectly over all devices, or the
  stronger fractional bound (an LP: nodes split among devices of different speeds, every
  device's share of the work at most the bound);
* colocation: a group sharing a device runs one after another on one device;
* the launcher (``launch_release_s``): where one host thread launches every device's work, a
  node starts no earlier than that thread has made a segment call and launched all of the
  node's ancestors, and the longest path from the node (its tail) runs after that;
* for the throughput objective (largest per-device load), total work, the largest node and
  colocation (the critical path does not bound a pipeline's load).
``check_memory`` fails fast, with the bytes missing and where, when no placement can fit: the
parameters, one device's share of them, or a training step's values kept across its loss.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from autoplace.config.choices import Objective
from autoplace.errors import InfeasibleError
from autoplace.ir import Problem
from autoplace.ir.graphs import longest_path_length
from autoplace.simulate.schedules import phase_of
from autoplace.solve.baselines.heuristics import group_devices

__all__ = ["check_memory", "launch_release_s", "lower_bound_s"]

# The launcher bound keeps each node's ancestors as a row of bits: n * n / 8 bytes (50 MB here).
_MAX_RELEASE_NODES = 20_000
# Rows unpacked at once to sum the ancestors' launches (rows * n bytes).
_RELEASE_CHUNK = 256


def _fmt(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB ({nbytes} bytes)"


def _holders(problem: Problem) -> dict[str, list[str]]:
    """Devices that can hold and run each node's whole colocation group, each group's worked
    out once with a set (looking each device up in each node's tuple: over 30 s, sampled, for a
    126-layer Llama's graph on 512 devices)."""
    graph, cluster = problem.graph, problem.cluster
    runs_on = group_devices(problem)
    found: dict[tuple[str, ...], list[str]] = {}
    holders: dict[str, list[str]] = {}
    for name, group in graph.colocation_of.items():
        if group not in found:
            need = sum(graph.node(m).param_bytes for m in group)
            runs = set(runs_on[name])
            found[group] = [d.name for d in cluster.devices
                            if d.memory_bytes >= need and d.name in runs]
        holders[name] = found[group]
    return holders


def check_memory(problem: Problem) -> None:
    """Raise ``InfeasibleError`` when the parameters cannot fit the devices at all, or a
    training step's resident bytes and the values it keeps across a loss (``kept_across``)
    cannot."""
    graph, cluster = problem.graph, problem.cluster
    total = graph.total_param_bytes
    capacity = sum(d.memory_bytes for d in cluster.devices)
    if total > capacity:
        raise InfeasibleError(
            f"the model's parameters and buffers need {_fmt(total)} but the "
            f"{len(cluster.devices)} devices hold {_fmt(capacity)} together: "
            f"{_fmt(total - capacity)} short. Add devices or use larger ones (--devices), or "
            "reduce the model (smaller dtype)."
        )
    runs_on = group_devices(problem)
    for name, group in graph.colocation_of.items():
        what = f"node {name!r}" if len(group) == 1 else (
            f"colocation group {list(group)[:4]} (nodes that must share a device)")
        if not runs_on[name]:
            raise InfeasibleError(
                f"{what} has no device that every member can run on (each member's allowed "
                "devices are those with a finite compute time, and pins): allow a common "
                "device, or split the group")
        need = sum(graph.node(m).param_bytes for m in group)
        largest = max((cluster.device(d) for d in runs_on[name]), key=lambda d: d.memory_bytes)
        if need > largest.memory_bytes:
            raise InfeasibleError(
                f"{what} needs {_fmt(need)} on one device, but the largest device it can run "
                f"on, {largest.name} ({largest.type}), has {_fmt(largest.memory_bytes)}: "
                f"{_fmt(need - largest.memory_bytes)} short. Use a device with more memory."
            )
    _check_forced(problem, runs_on)
    _check_turn(problem)


def kept_across(problem: Problem, cut: str) -> int:
    """The bytes of the values every placement holds at once when node ``cut`` starts, under
    the simulator's rule (``simulate.memory``): each value computed before it (an ancestor)
    and read after it (by a descendant) that takes time on every device, so that the read
    ends after ``cut`` starts and the value is not freed before. (A value that is a view of
    another's storage counts the bytes it allocates.)"""
    nodes = problem.graph
    compute = problem.costs.compute_s
    graph = nodes.to_networkx()
    before, after = nx.ancestors(graph, cut), nx.descendants(graph, cut)
    takes_time = {r for r in after if min(compute[r].values(), default=0.0) > 0.0}
    kept = 0
    for name in before:
        if any(e.dst in takes_time for e in nodes.out_edges(name)):
            node = nodes.node(name)
            kept += node.output_bytes - node.view_bytes
    return kept


def _check_turn(problem: Problem) -> None:
    """A training step's losses (forward nodes read by backward nodes only: one per
    micro-batch) each cut the step: what ``kept_across`` the one that keeps most, beside every
    parameter, gradient, optimizer state and runtime reserve, must fit the devices together."""
    nodes, cluster = problem.graph, problem.cluster
    losses = [n.name for n in nodes.nodes if phase_of(n.name)[1] == "forward" and (
        readers := nodes.out_edges(n.name)) and all(
            phase_of(e.dst)[1] == "backward" for e in readers)]
    if not losses or not any(phase_of(n.name)[1] == "step" for n in nodes.nodes):
        return
    kept, loss = max((kept_across(problem, cut), cut) for cut in losses)
    held = nodes.total_param_bytes + sum(d.reserved_bytes for d in cluster.devices)
    capacity = sum(d.memory_bytes for d in cluster.devices)
    if held + kept > capacity:
        raise InfeasibleError(
            f"the training step keeps {_fmt(kept)} of activations for its backward when its "
            f"loss ({loss!r}) starts, beside {_fmt(held)} of parameters, gradients, optimizer "
            f"state and runtime reserve on its {len(cluster.devices)} devices, which hold "
            f"{_fmt(capacity)} together: {_fmt(held + kept - capacity)} short, whatever the "
            "placement.")


def _check_forced(problem: Problem, runs_on: dict[str, tuple[str, ...]]) -> None:
    """Parameters that can go to one device only (pinned there, or runnable nowhere else) must
    fit it beside its runtime reserve."""
    forced: dict[str, int] = {}
    groups = {group for group in problem.graph.colocation_of.values()}
    for group in groups:
        devices = runs_on[group[0]]
        if len(devices) == 1:
            forced[devices[0]] = forced.get(devices[0], 0) + sum(
                problem.graph.node(m).param_bytes for m in group)
    for name, need in forced.items():
        device = problem.cluster.device(name)
        room = device.memory_bytes - device.reserved_bytes
        if need > room:
            raise InfeasibleError(
                f"the nodes that can run only on {name} ({device.type}; pinned there, or "
                f"runnable nowhere else) need {_fmt(need)} of parameters, but {name} has "
                f"{_fmt(room)} beside its runtime reserve: {_fmt(need - room)} short. Pin "
                "fewer modules to it, or pin them to a device with more memory.")


def _alike(problem: Problem) -> bool:
    """Whether every device has the same memory and every node the same time on every device.
    Then the LP of ``_fractional_work`` is the work spread evenly (each load is at least the
    mean, and an even split meets it, within memory whenever ``check_memory`` passed), which
    ``lower_bound_s`` has already: skipping it saves a GLOP solve of nodes x devices variables
    per solve, about a second for a 3,000-node Llama-2-70B on 8 GPUs (benchmarks/llama70b.py)."""
    devices = problem.cluster.devices
    if len({d.memory_bytes for d in devices}) > 1:
        return False
    return all(len(set(per.values())) == 1 and math.isfinite(next(iter(per.values())))
               for per in problem.costs.compute_s.values())


def _fractional_work(problem: Problem, max_terms: int = 400_000) -> float:
    """The least time in which the devices could do all the work if nodes could be split among
    them: an LP (min T, every device's share of work <= T), which on devices of different speeds
    is far stronger than the work at the fastest speed spread evenly. Each device's share of
    the parameters must fit its memory too, so a model too big for the fast device is bounded
    by the slow ones it must use (a memory-forced bound). 0 when too large, or when it cannot
    beat the even spread (``_alike``)."""
    from ortools.linear_solver import pywraplp

    graph, names = problem.graph, problem.cluster.names
    if _alike(problem):
        return 0.0
    if len(graph.nodes) * len(names) > max_terms:
        return 0.0
    lp = pywraplp.Solver.CreateSolver("GLOP")
    t = lp.NumVar(0.0, lp.infinity(), "T")
    load: dict[str, list] = {d: [] for d in names}
    memory: dict[str, list] = {d: [] for d in names}
    for n in graph.nodes:
        share = []
        for d in problem.allowed[n.name]:
            y = lp.NumVar(0.0, 1.0, "")
            share.append(y)
            load[d].append(problem.costs.of(n.name, d) * y)
            if n.param_bytes:
                memory[d].append(n.param_bytes * y)
        lp.Add(lp.Sum(share) == 1)
    for d in names:
        if load[d]:
            lp.Add(lp.Sum(load[d]) <= t)
        if memory[d]:
            lp.Add(lp.Sum(memory[d]) <= problem.cluster.device(d).memory_bytes)
    lp.Minimize(t)
    if lp.Solve() != pywraplp.Solver.OPTIMAL:
        return 0.0
    # LP solutions are accurate to about 1e-9 relative; stay on the safe side of the optimum.
    return max(0.0, t.solution_value() * (1 - 1e-7))


def launch_release_s(problem: Problem) -> dict[str, float]:
    """Where one host thread launches every device's work (``Problem.sole_launcher``): the
    earliest each node can start, whatever the placement. The thread launches the nodes one
    after another in a topological order (``simulate.launch.launched``), after one segment
    call, and a node starts no earlier than its launch begins; so a node starts after the
    cheapest segment call and each ancestor's cheapest launch. (A model input launches
    nothing.) Empty where there is no such thread, or the graph has more than
    ``_MAX_RELEASE_NODES`` nodes."""
    graph, host = problem.graph, problem.costs.host
    n = len(graph.nodes)
    if host is None or problem.sole_launcher is None or not n or n > _MAX_RELEASE_NODES:
        return {}
    # A model input launches nothing (``launch.launched`` takes it at once).
    launch = np.array([0.0 if node.is_input else min(
        host.launch_of(node.name, d) for d in problem.allowed[node.name]) for node in graph.nodes])
    ancestors = np.zeros((n, (n + 7) // 8), dtype=np.uint8)  # row v: v's ancestors, packed
    for v, node in enumerate(graph.nodes):
        for u in dict.fromkeys(graph.index[e.src] for e in graph.in_edges(node.name)):
            ancestors[v] |= ancestors[u]
            ancestors[v, u // 8] |= 0x80 >> (u % 8)  # unpackbits reads a byte's high bit first
    before = np.empty(n)
    for first in range(0, n, _RELEASE_CHUNK):
        rows = np.unpackbits(ancestors[first:first + _RELEASE_CHUNK], axis=1, count=n)
        before[first:first + len(rows)] = rows @ launch
    call = min(host.call_s.values())
    return {node.name: 0.0 if node.is_input else call + float(before[v])
            for v, node in enumerate(graph.nodes)}


def _launcher_bound(problem: Problem, fastest: dict[str, float]) -> float:
    """Each node's release (``launch_release_s``) plus its tail: the longest path from it at
    the fastest times. 0 without a sole launcher."""
    release = launch_release_s(problem)
    if not release:
        return 0.0
    graph = problem.graph
    tail: dict[str, float] = {}
    for node in reversed(graph.nodes):
        tail[node.name] = fastest[node.name] + max(
            (tail[e.dst] for e in graph.out_edges(node.name)), default=0.0)
    # The sums are in floating point: stay a little on the safe side of them.
    return max(0.0, max(release[v] + tail[v] for v in tail) * (1 - 1e-9))


def lower_bound_s(problem: Problem, objective: str = "latency") -> float:
    """The largest of the bounds that hold for ``objective``, in seconds.

    Latency: critical path, total work, colocation, the launcher. Throughput (the busiest
    device's load): total work, the largest single node, colocation; communication only adds
    to a load.
    """
    graph, cluster, costs = problem.graph, problem.cluster, problem.costs
    holders = _holders(problem)
    fastest = {
        n.name: min(costs.of(n.name, d) for d in holders[n.name] or problem.allowed[n.name])
        for n in graph.nodes
    }
    work = max(sum(fastest.values()) / len(cluster.devices), _fractional_work(problem))
    colocated = 0.0
    for group in {tuple(g) for g in graph.colocation_of.values() if len(g) > 1}:
        colocated = max(colocated, min(sum(costs.of(m, d) for m in group)
                                       for d in holders[group[0]] or cluster.names))
    if objective == Objective.THROUGHPUT:
        return max(work, max(fastest.values(), default=0.0), colocated)
    # float: when every path weighs 0, networkx's length is the int 0 (plan.json writes 0.0).
    critical = float(longest_path_length(fastest, ((e.src, e.dst) for e in graph.edges)))
    return max(critical, work, colocated, _launcher_bound(problem, fastest))

