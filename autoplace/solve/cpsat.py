"""The exact placement model in OR-Tools CP-SAT, built in the order of OR-Tools' flexible job-shop
sample: data, variables, constraints, objective, solve, read back.

Variables: ``x[n, d]`` (node ``n`` runs on device ``d``), ``start[n]``, ``end[n]``, and for every
``(n, d)`` an optional interval present iff ``x[n, d]``. Constraints:

* every node on exactly one device (``add_exactly_one``);
* nodes on one device do not overlap (``add_no_overlap`` of its optional intervals);
* an edge ``u -> v`` delays ``v`` by the transfer time of the link between their devices: for each
  device ``d2`` of ``v``, ``start[v] >= end[u] + sum_d1 c(d1, d2) * x[u, d1]`` enforced by
  ``x[v, d2]`` — linear and exact, since exactly one ``x[u, d1]`` is true;
* resident parameters plus an activation allowance fit each device's capacity;
* no-good cuts from the caller: a set of nodes the simulator found overflowing a device may not
  all sit on that device (nor on any device identical to it) again;
* colocated nodes share a device;
* identical devices are interchangeable, so node ``i`` (in topological order) may use only the
  first ``i + 1`` devices of each class of identical devices (symmetry breaking).

Objective: the makespan. Times are integers in units of ``TIME_QUANTUM_S``; durations are rounded
up, so a schedule of the integer model is feasible in seconds, and the returned order is re-scored
by the simulator in exact seconds.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from autoplace.ir import Placement, Problem, Schedule

__all__ = ["TIME_QUANTUM_S", "CpSatResult", "solve_cpsat"]

# One nanosecond: fine enough that rounding is negligible against kernel launch overheads
# (microseconds), coarse enough that an hour-long makespan still fits CP-SAT's int64 domains.
TIME_QUANTUM_S = 1e-9


@dataclass(frozen=True)
class CpSatResult:
    """``progress``: (seconds since the start, best objective or None, best bound), one entry
    per improvement of either, in seconds of makespan."""

    placement: Placement | None
    status: str
    objective_s: float | None
    bound_s: float
    wall_s: float
    progress: tuple[tuple[float, float | None, float], ...] = field(default_factory=tuple)


class _Progress(cp_model.CpSolverSolutionCallback):
    """Records every improving solution and bound while CP-SAT runs."""

    def __init__(self, slack_ticks: int) -> None:
        super().__init__()
        self.began = time.perf_counter()
        self.slack = slack_ticks
        self.objective: float | None = None
        self.bound = 0.0
        self.points: list[tuple[float, float | None, float]] = []

    def _record(self) -> None:
        self.points.append((time.perf_counter() - self.began, self.objective, self.bound))

    def on_solution_callback(self) -> None:
        self.objective = self.objective_value * TIME_QUANTUM_S
        self.bound = max(self.bound, _bound_s(self.best_objective_bound, self.slack))
        self._record()

    def on_bound(self, bound: float) -> None:
        self.bound = max(self.bound, _bound_s(bound, self.slack))
        self._record()


def _bound_s(bound_ticks: float, slack_ticks: int) -> float:
    """CP-SAT's bound in seconds, less the rounding slack of the integer model."""
    return max(0.0, (bound_ticks - slack_ticks) * TIME_QUANTUM_S)


def _ticks(seconds: float) -> int:
    return math.ceil(seconds / TIME_QUANTUM_S - 1e-6)


def _identical_classes(problem: Problem) -> list[list[str]]:
    """Groups of devices that no node, link or capacity can tell apart."""
    cluster, costs, graph = problem.cluster, problem.costs, problem.graph
    names = list(cluster.names)

    def same(a: str, b: str) -> bool:
        da, db = cluster.device(a), cluster.device(b)
        if (da.type, da.memory_bytes) != (db.type, db.memory_bytes):
            return False
        if any(costs.of(n.name, a) != costs.of(n.name, b) for n in graph.nodes):
            return False
        la, lb = cluster.link(a, b), cluster.link(b, a)
        if (la.bandwidth_bytes_per_s, la.latency_s) != (lb.bandwidth_bytes_per_s, lb.latency_s):
            return False
        for other in names:
            if other in (a, b):
                continue
            for x, y in ((cluster.link(a, other), cluster.link(b, other)),
                         (cluster.link(other, a), cluster.link(other, b))):
                if (x.bandwidth_bytes_per_s, x.latency_s) != (y.bandwidth_bytes_per_s,
                                                                y.latency_s):
                    return False
        return True

    classes: list[list[str]] = []
    for name in names:
        for cls in classes:
            if same(cls[0], name):
                cls.append(name)
                break
        else:
            classes.append([name])
    return [cls for cls in classes if len(cls) > 1]


def _canonical(device_of: Mapping[str, str], nodes: list[str],
               classes: list[list[str]]) -> dict[str, str]:
    """Relabel identical devices in order of first use, so a hint obeys the symmetry breaking."""
    relabel: dict[str, str] = {}
    for cls in classes:
        seen = list(dict.fromkeys(device_of[n] for n in nodes if device_of[n] in cls))
        rest = [d for d in cls if d not in seen]
        relabel.update(zip(seen + rest, cls))
    return {n: relabel.get(device_of[n], device_of[n]) for n in nodes}


def solve_cpsat(
    problem: Problem,
    *,
    time_limit_s: float,
    hint: Schedule | None = None,
    activation_bytes: Mapping[str, int] | None = None,
    nogoods: Sequence[tuple[str, frozenset[str]]] = (),
    workers: int | None = None,
    seed: int = 0,
) -> CpSatResult:
    """Minimise the makespan of ``problem`` with CP-SAT within ``time_limit_s``.

    ``activation_bytes[n]`` is the working set node ``n`` needs on its device beside the
    resident parameters. ``nogoods`` are ``(device, nodes)`` pairs: those nodes may not all run
    on that device (the caller adds one when the simulator finds such a set overflowing).
    """
    graph, cluster, costs = problem.graph, problem.cluster, problem.costs
    devices = list(cluster.names)
    nodes = [n.name for n in graph.nodes]
    capacity = {d.name: d.memory_bytes for d in cluster.devices}
    activation = activation_bytes or {}

    # --- data
    allowed = problem.allowed
    duration = {(n, d): _ticks(costs.of(n, d)) for n in nodes for d in allowed[n]}
    delay = {(e.src, e.dst, a, b): _ticks(problem.delay_s(e, a, b))
             for e in graph.edges for a in allowed[e.src] for b in allowed[e.dst]}
    horizon = sum(max(duration[n, d] for d in allowed[n]) for n in nodes) + sum(
        max(delay[e.src, e.dst, a, b] for a in allowed[e.src] for b in allowed[e.dst])
        for e in graph.edges)
    if hint is not None:
        # The optimum is no later than the hint; rounding each duration and delay up adds less
        # than one quantum each, and a path has fewer than 2n of them.
        horizon = min(horizon, _ticks(hint.makespan_s) + 2 * len(nodes) + 2)

    # --- variables
    model = cp_model.CpModel()
    x = {(n, d): model.new_bool_var(f"x[{n},{d}]") for n in nodes for d in devices}
    start = {n: model.new_int_var(0, horizon, f"start[{n}]") for n in nodes}
    end = {n: model.new_int_var(0, horizon, f"end[{n}]") for n in nodes}
    intervals = {
        (n, d): model.new_optional_interval_var(start[n], duration[n, d], end[n], x[n, d],
                                                f"iv[{n},{d}]")
        for n in nodes for d in allowed[n]
    }
    for n in nodes:
        for d in devices:
            if d not in allowed[n]:
                model.add(x[n, d] == 0)
    makespan = model.new_int_var(0, horizon, "makespan")

    # --- constraints
    for n in nodes:
        model.add_exactly_one(x[n, d] for d in devices)
        model.add(makespan >= end[n])
    for d in devices:
        model.add_no_overlap(intervals[n, d] for n in nodes if d in allowed[n])
    for e in graph.edges:
        model.add(start[e.dst] >= end[e.src])
        if len(devices) > 1:
            for d2 in allowed[e.dst]:
                model.add(start[e.dst] >= end[e.src] + sum(
                    delay[e.src, e.dst, d1, d2] * x[e.src, d1]
                    for d1 in allowed[e.src] if d1 != d2
                )).only_enforce_if(x[e.dst, d2])
    for group in graph.colocate:
        for other in group[1:]:
            for d in devices:
                model.add(x[group[0], d] == x[other, d])
    for d in devices:
        peak_activation = model.new_int_var(0, max(capacity[d], 0), f"act[{d}]")
        for n in nodes:
            if activation.get(n, 0):
                model.add(peak_activation >= activation[n]).only_enforce_if(x[n, d])
        model.add(sum(graph.node(n).param_bytes * x[n, d] for n in nodes)
                  + peak_activation <= capacity[d])
    classes = _identical_classes(problem)
    for cls in classes:
        for i, n in enumerate(nodes[: len(cls) - 1]):
            for d in cls[i + 1:]:
                model.add(x[n, d] == 0)
    # A no-good holds on every device identical to its own, so the symmetry breaking above
    # stays valid: relabelling identical devices maps a placement that obeys the cuts to one
    # that does too.
    class_of = {d: cls for cls in classes for d in cls}
    for device, members in nogoods:
        for d in class_of.get(device, [device]):
            model.add(sum(x[n, d] for n in members) <= len(members) - 1)

    # --- objective
    model.minimize(makespan)

    if hint is not None:
        hinted = _canonical(hint.placement.device_of, nodes, classes)
        for n in nodes:
            for d in devices:
                model.add_hint(x[n, d], hinted[n] == d)
            model.add_hint(start[n], _ticks(hint.start_s[n]))
            model.add_hint(end[n], _ticks(hint.start_s[n]) + duration[n, hinted[n]])

    # --- solve
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s, 0.01)
    solver.parameters.num_workers = workers or max(1, min(8, os.cpu_count() or 1))
    solver.parameters.random_seed = seed
    # OR-Tools 9.15 can certify a wrong optimum through inclusion-detection presolve
    # (google/or-tools#5293); switching that family off is the documented workaround.
    solver.parameters.presolve_inclusion_work_limit = 0
    # The integer model rounds every duration and delay up by less than one quantum, and a path
    # has fewer than 2n of them, so the true optimum is at most 2n quanta below its bound.
    slack = 2 * len(nodes)
    progress = _Progress(slack)
    solver.best_bound_callback = progress.on_bound
    began = time.perf_counter()
    status = solver.solve(model, progress)
    wall = time.perf_counter() - began
    status_name = solver.status_name(status)

    # --- read back
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CpSatResult(placement=None, status=status_name, objective_s=None,
                           bound_s=0.0, wall_s=wall, progress=tuple(progress.points))
    device_of = {n: next(d for d in devices if solver.boolean_value(x[n, d])) for n in nodes}
    starts = {n: solver.value(start[n]) for n in nodes}
    order = {d: tuple(sorted((n for n in nodes if device_of[n] == d),
                             key=lambda n: (starts[n], solver.value(end[n]), graph.index[n])))
             for d in devices}
    return CpSatResult(placement=Placement(device_of=device_of, order=order),
                       status=status_name,
                       objective_s=solver.objective_value * TIME_QUANTUM_S,
                       bound_s=_bound_s(solver.best_objective_bound, slack), wall_s=wall,
                       progress=tuple(progress.points))
