"""The exact placement model in OR-Tools CP-SAT, built in the order of OR-Tools' flexible job-shop
sample: data, variables, constraints, objective, solve, read back.

Variables: ``x[n, d]`` (node ``n`` on device ``d``), ``start[n]``, ``end[n]``, an optional interval
per ``(n, d)`` present iff ``x[n, d]``. Constraints: one device per node (``add_exactly_one``); no
overlap on a device (``add_no_overlap`` of its intervals); an edge ``u -> v``'s transfer delay,
``start[v] >= end[u] + sum_d1 c(d1, d2) * x[u, d1]`` for each device ``d2`` of ``v``, enforced by
``x[v, d2]`` (exact: one ``x[u, d1]`` is true); memory (resident parameters plus an activation
allowance); the caller's no-good cuts; colocation; shared links (``contention.add_shared_volume``);
symmetry between identical devices. Each in full: ``docs/architecture.md``, "Stage 4, solve".

Objective: the makespan, in integer ticks of the coarsest of 1 s, 1 ms and 1 us in which every
duration and delay is whole (then exact), else of ``TIME_QUANTUM_S`` with durations rounded up, so
a schedule of the integer model is feasible in seconds; the simulator re-scores the order.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from autoplace.config.choices import Objective
from autoplace.ir import Placement, Problem, Schedule
from autoplace.progress import current_reporter
from autoplace.solve.baselines.stages import stage_order
from autoplace.solve.contention import add_shared_volume
from autoplace.solve.launcher import add_launchers

__all__ = ["TIME_QUANTUM_S", "CpSatResult", "node_activation_bytes", "solve_cpsat"]

# One nanosecond: fine enough that rounding is negligible against kernel launch overheads
# (microseconds), coarse enough that an hour-long makespan still fits CP-SAT's int64 domains.
TIME_QUANTUM_S = 1e-9
# CP-SAT is never given less than this (wall or deterministic seconds): a limit of zero or less,
# left after building a large model, would stop it before it reads the hint.
_MIN_LIMIT_S = 0.01
# CP-SAT ends a search without proof (FEASIBLE, UNKNOWN) only at its limit or on SIGINT, which it
# catches: a search that used less than this share of its limit, less the slack (its own
# start-up and wind-down), was stopped by Ctrl-C.
_STOPPED_SHARE = 0.9
_STOPPED_SLACK_S = 0.05
# Conflicts allowed to each probe of the single worker's binary search on the makespan
# (``solve_cpsat``): enough to settle small models, cheap for large ones (about 40 probes).
_BINARY_SEARCH_CONFLICTS = 100

# The most (edge, source, destination device) delays a model may hold; their table alone takes
# 145 bytes each here (0.7 GB at the limit). 300 edges on 64 devices are 1.2 million, on 512
# devices 79 million (``TOO_LARGE``: not run).
MAX_DELAY_TERMS = 5_000_000


@dataclass(frozen=True)
class CpSatResult:
    """``progress``: (seconds since the start, best objective or None, best bound), one entry
    per improvement of either, in seconds of makespan. ``interrupted``: the search was stopped
    by Ctrl-C (CP-SAT catches SIGINT and returns its best solution so far) or by ``stop``."""

    placement: Placement | None
    status: str
    objective_s: float | None
    bound_s: float
    wall_s: float
    progress: tuple[tuple[float, float | None, float], ...] = field(default_factory=tuple)
    interrupted: bool = False
    delay_terms: int = 0  # where ``TOO_LARGE``: the delays the model would have held


class _Progress(cp_model.CpSolverSolutionCallback):
    """Records every improving solution and bound while CP-SAT runs, and stops the search when
    ``stop`` asks to (as SIGINT would)."""

    def __init__(self, slack_ticks: int, quantum_s: float, solver: cp_model.CpSolver,
                 stop: Callable[[], bool] | None) -> None:
        super().__init__()
        self.began = time.perf_counter()
        self.slack = slack_ticks
        self.quantum = quantum_s
        self.objective: float | None = None
        self.bound = 0.0
        self.points: list[tuple[float, float | None, float]] = []
        self.solver = solver
        self.stop = stop
        self.stopped = False
        self.shown = current_reporter()  # taken here: the callbacks run on CP-SAT's threads

    def _record(self) -> None:
        self.points.append((time.perf_counter() - self.began, self.objective, self.bound))
        if self.shown is not None:
            self.shown.solver(self.objective, self.bound)
        if self.stop is not None and not self.stopped and self.stop():
            self.stopped = True
            self.solver.stop_search()

    def on_solution_callback(self) -> None:
        self.objective = self.objective_value * self.quantum
        self.bound = max(self.bound,
                         _bound_s(self.best_objective_bound, self.slack, self.quantum))
        self._record()

    def on_bound(self, bound: float) -> None:
        self.bound = max(self.bound, _bound_s(bound, self.slack, self.quantum))
        self._record()


def _bound_s(bound_ticks: float, slack_ticks: int, quantum_s: float) -> float:
    """CP-SAT's bound in seconds, less the rounding slack of the integer model."""
    return max(0.0, (bound_ticks - slack_ticks) * quantum_s)


def node_activation_bytes(problem: Problem) -> dict[str, int]:
    """What must be live on a node's device while it runs: its output, its workspace and one
    copy of each input (the simulator's memory model), so resident bytes plus this bound every
    device's peak from below. ``solve_cpsat``'s ``activation_bytes``."""
    graph = problem.graph
    working: dict[str, int] = {}
    for n in graph.nodes:
        inputs: dict[str, int] = {}
        for e in graph.in_edges(n.name):
            inputs[e.src] = max(inputs.get(e.src, 0), e.bytes)
        working[n.name] = n.output_bytes + n.workspace_bytes + sum(inputs.values())
    return working


def delay_terms(problem: Problem) -> int:
    """How many transfer delays CP-SAT's model of ``problem`` holds: one per edge and pair of
    devices its ends may run on."""
    allowed = problem.allowed
    return sum(len(allowed[e.src]) * len(allowed[e.dst]) for e in problem.graph.edges)


def _quantum(problem: Problem) -> tuple[float, bool]:
    """The time unit of the integer model, and whether every time is a whole number of it."""
    values = [t for per in problem.costs.compute_s.values() for t in per.values()
              if math.isfinite(t)]
    links = problem.cluster.distinct_links  # every delay an edge can take, once
    for e in problem.graph.edges:
        if e.transfer_s is not None:
            values.append(e.transfer_s)
        else:
            values.extend(problem.delay_s(e, a, b) for a, b in links)
    for quantum in (1.0, 1e-3, 1e-6):
        if all(abs(v / quantum - round(v / quantum)) <= 1e-9 * max(1.0, v / quantum)
               for v in values) and sum(values) / quantum < 2**50:
            return quantum, True
    return TIME_QUANTUM_S, False


def _ticks(seconds: float, quantum_s: float = TIME_QUANTUM_S) -> int:
    return math.ceil(seconds / quantum_s - 1e-6)


def _identical_classes(problem: Problem) -> list[list[str]]:
    """Groups of devices that no node, link or capacity can tell apart: swapping two of them
    changes no cost, launch, memory, link or shared resource. Each device is keyed by what
    it alone decides (its type, memory, costs and launches) and by the pairs each shared
    resource holds it in, so that a swap is checked only against what it touches (512
    devices, 64 hosts' NICs: 1.6 s here; ``tests/test_contention.py`` checks the classes
    against the definition)."""
    cluster, costs, graph = problem.cluster, problem.costs, problem.graph
    names = list(cluster.names)
    host = costs.host

    def thread(d: str) -> str | None:  # a CPU worker's own interpreter: alike all the same
        own = host is not None and host.own_thread.get(d) == d
        return "own" if own else problem.launchers.get(d)

    def own(d: str) -> tuple:  # what swapping d with another must keep: d's alone
        device = cluster.device(d)
        return (device.type, device.memory_bytes, thread(d),
                tuple(costs.of(n.name, d) for n in graph.nodes),
                None if host is None else (
                    host.call_s.get(d), host.handover_s.get(d),
                    tuple(host.launch_of(n.name, d) for n in graph.nodes)))

    holds = [_incidence(r.pairs) for r in cluster.shared]
    # A swap keeps a resource only if both devices send on it, or neither, and both receive
    # on it, or neither: which resources hold a device is part of its key.
    key = {d: (own(d), tuple((i, d in outs, d in ins) for i, (outs, ins) in enumerate(holds)
                             if d in outs or d in ins)) for d in names}

    speeds: dict[str, list[tuple]] = {}

    def speed(d: str) -> list[tuple]:  # (bandwidth, latency) to and from each device
        if d not in speeds:
            speeds[d] = [(None,) if o == d else tuple((k.bandwidth_bytes_per_s, k.latency_s)
                         for k in (cluster.link(d, o), cluster.link(o, d))) for o in names]
        return speeds[d]

    none: set[str] = set()

    def same(a: str, b: str) -> bool:
        if key[a] != key[b]:
            return False
        for outs, ins in holds:  # swapping a and b maps each resource onto itself
            if (b in outs.get(a, none)) != (a in outs.get(b, none)) or outs.get(
                    a, none) - {b} != outs.get(b, none) - {a} or ins.get(
                    a, none) - {b} != ins.get(b, none) - {a}:
                return False  # on different NICs or switches
        row_a, row_b = speed(a), speed(b)
        if row_a[names.index(b)][0] != row_b[names.index(a)][0]:
            return False  # a -> b and b -> a differ
        return all(x == y for o, x, y in zip(names, row_a, row_b) if o not in (a, b))

    classes: list[list[str]] = []
    keyed: dict[tuple, list[list[str]]] = {}  # the classes of each key, in the order made
    for name in names:
        for cls in keyed.setdefault(key[name], []):
            if same(cls[0], name):
                cls.append(name)
                break
        else:
            classes.append([name])
            keyed[key[name]].append(classes[-1])
    return [cls for cls in classes if len(cls) > 1]


def _incidence(pairs: Iterable[tuple[str, str]]
               ) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """A shared resource's pairs as each device's destinations and sources."""
    outs: dict[str, set[str]] = {}
    ins: dict[str, set[str]] = {}
    for src, dst in pairs:
        outs.setdefault(src, set()).add(dst)
        ins.setdefault(dst, set()).add(src)
    return outs, ins


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
    objective: str = "latency",
    contiguous: bool = False,
    hint: Schedule | None = None,
    activation_bytes: Mapping[str, int] | None = None,
    nogoods: Sequence[tuple[str, frozenset[str]]] = (),
    workers: int | None = None,
    seed: int = 0,
    deterministic: bool = False,
    known_bound_s: float = 0.0,
    stop: Callable[[], bool] | None = None,
) -> CpSatResult:
    """Minimise ``objective`` (``latency``: the makespan; ``throughput``: the largest per-device
    load) of ``problem`` with CP-SAT within ``time_limit_s``.

    ``contiguous`` makes the devices' node sets a chain of pipeline stages (see
    ``_add_contiguity``). ``activation_bytes[n]`` is the working set node ``n`` needs on its
    device beside the resident parameters. ``nogoods`` are ``(device, nodes)`` pairs: those nodes
    may not all run on that device (the caller adds one when the simulator finds such a set
    overflowing). With ``deterministic``, ``time_limit_s`` is in CP-SAT's deterministic seconds
    (a work count, about a second each on a laptop core), so one worker with a fixed ``seed``
    stops at the same point on every run. ``known_bound_s`` is a lower bound proven elsewhere:
    CP-SAT stops as soon as it reaches it. ``stop`` is asked at every improvement; True stops
    the search as Ctrl-C does (the result is then ``interrupted``).
    """
    building = time.perf_counter()
    if (terms := delay_terms(problem)) > MAX_DELAY_TERMS:
        return CpSatResult(placement=None, status="TOO_LARGE", objective_s=None, bound_s=0.0,
                           wall_s=0.0, delay_terms=terms)
    quantum, exact = _quantum(problem)
    model = cp_model.CpModel()
    x, hinted = _add_placement(model, problem, activation_bytes or {}, nogoods, hint, contiguous)
    if objective == Objective.THROUGHPUT:
        goal = _add_loads(model, problem, x, quantum)
        # Every load is a sum of at most n compute and 2n copy times, each rounded up.
        slack = 0 if exact else 3 * len(problem.graph.nodes)
        start = None
    else:
        goal, start = _add_schedule(model, problem, x, hint, hinted, quantum)
        # Rounding adds less than one quantum per duration and delay; a path has fewer than 2n.
        slack = 0 if exact else 2 * len(problem.graph.nodes)
    if known_bound_s > 0:
        model.add(goal >= max(0, math.ceil(known_bound_s / quantum - 1e-6) - slack))
    model.minimize(goal)

    # --- solve
    solver = _solver(time_limit_s, deterministic=deterministic, workers=workers, seed=seed,
                     building=building)
    if objective == Objective.LATENCY and solver.parameters.num_workers == 1:
        # One worker minimises by linear scan: each solution need beat the last by one tick
        # only, and it keeps the last one's values, so it shaves one tick of idle time off the
        # same placement per solution: at 1 ns, 0.1 s is 1e8 solutions (a 5-node graph stayed
        # 0.25 s off its optimum for the whole limit). A binary search on the makespan first,
        # each probe cut off after a few conflicts, jumps those steps; with several workers
        # the LNS workers do. (Throughput is left alone: on the golden BERT-24 it cost 0.3%.)
        solver.parameters.binary_search_num_conflicts = _BINARY_SEARCH_CONFLICTS
    progress = _Progress(slack, quantum, solver, stop)
    solver.best_bound_callback = progress.on_bound
    began = time.perf_counter()
    status = solver.solve(model, progress)
    wall = time.perf_counter() - began
    used, limit = ((solver.deterministic_time, solver.parameters.max_deterministic_time)
                   if deterministic else (wall, solver.parameters.max_time_in_seconds))
    interrupted = progress.stopped or (status in (cp_model.FEASIBLE, cp_model.UNKNOWN)
                                       and used < _STOPPED_SHARE * limit - _STOPPED_SLACK_S)

    # --- read back
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CpSatResult(placement=None, status=solver.status_name(status), objective_s=None,
                           bound_s=0.0, wall_s=wall, progress=tuple(progress.points),
                           interrupted=interrupted)
    return CpSatResult(placement=_placement(solver, problem, x, start),
                       status=solver.status_name(status),
                       objective_s=solver.objective_value * quantum,
                       bound_s=_bound_s(solver.best_objective_bound, slack, quantum), wall_s=wall,
                       progress=tuple(progress.points), interrupted=interrupted)


Vars = dict[tuple[str, str], cp_model.IntVar]


def _add_placement(model: cp_model.CpModel, problem: Problem, activation: Mapping[str, int],
                   nogoods: Sequence[tuple[str, frozenset[str]]], hint: Schedule | None,
                   contiguous: bool) -> tuple[Vars, dict[str, str] | None]:
    """The placement variables ``x`` and their constraints, shared by both objectives; returns
    them with the hint's placement relabelled to obey the symmetry breaking."""
    graph, devices = problem.graph, list(problem.cluster.names)
    nodes = [n.name for n in graph.nodes]
    allowed = problem.allowed
    x = {(n, d): model.new_bool_var(f"x[{n},{d}]") for n in nodes for d in devices}
    for n in nodes:
        model.add_exactly_one(x[n, d] for d in devices)
        for d in devices:
            if d not in allowed[n]:
                model.add(x[n, d] == 0)
    for group in graph.colocate:
        for other in group[1:]:
            for d in devices:
                model.add(x[group[0], d] == x[other, d])
    _add_memory(model, problem, x, activation)
    classes = _add_symmetry_breaking(model, problem, x, nogoods)
    hinted = _canonical(hint.placement.device_of, nodes, classes) if hint is not None else None
    if contiguous:
        _add_contiguity(model, problem, x, hinted)
    if hinted is not None:
        for n in nodes:
            for d in devices:
                model.add_hint(x[n, d], hinted[n] == d)
    return x, hinted


def _add_symmetry_breaking(model: cp_model.CpModel, problem: Problem, x: Vars,
                           nogoods: Sequence[tuple[str, frozenset[str]]]) -> list[list[str]]:
    """Node ``i`` (in topological order) may use only the first ``i + 1`` devices of each class
    of identical devices; then the no-good cuts. Returns the classes."""
    nodes = [n.name for n in problem.graph.nodes]
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
    return classes


def _solver(time_limit_s: float, *, deterministic: bool, workers: int | None, seed: int,
            building: float) -> cp_model.CpSolver:
    """CP-SAT's parameters; the wall limit counts from ``building`` (a ``time.perf_counter``
    value: when the model began to be built), as the limit covers building it too."""
    solver = cp_model.CpSolver()
    if deterministic:
        solver.parameters.max_deterministic_time = max(time_limit_s, _MIN_LIMIT_S)
    else:
        spent = time.perf_counter() - building
        solver.parameters.max_time_in_seconds = max(time_limit_s - spent, _MIN_LIMIT_S)
    solver.parameters.num_workers = workers or max(1, min(8, os.cpu_count() or 1))
    solver.parameters.random_seed = seed
    # OR-Tools 9.15 can certify a wrong optimum through inclusion-detection presolve
    # (google/or-tools#5293); switching that family off is the documented workaround.
    solver.parameters.presolve_inclusion_work_limit = 0
    # The model breaks the symmetry of identical devices itself; CP-SAT's own symmetry
    # reasoning on top of it declared feasible models INFEASIBLE (Tarnawski's ResNet-50
    # operator graph, 6 identical accelerators, OR-Tools 9.15), so it is switched off.
    solver.parameters.symmetry_level = 0
    return solver


def _placement(solver: cp_model.CpSolver, problem: Problem, x: Vars,
               start: Mapping[str, cp_model.IntVar] | None) -> Placement:
    """The solution's devices and, for the latency model, each device's order by start time."""
    graph, devices = problem.graph, list(problem.cluster.names)
    nodes = [n.name for n in graph.nodes]
    device_of = {n: next(d for d in devices if solver.boolean_value(x[n, d])) for n in nodes}
    order = None
    if start is not None:
        starts = {n: solver.value(start[n]) for n in nodes}
        order = {d: tuple(sorted((n for n in nodes if device_of[n] == d),
                                 key=lambda n: (starts[n], graph.index[n])))
                 for d in devices}
    return Placement(device_of=device_of, order=order)




def _add_memory(model: cp_model.CpModel, problem: Problem, x: Vars,
                activation: Mapping[str, int]) -> None:
    """Resident parameters plus the largest working set of a node placed there fit."""
    graph = problem.graph
    for dev in problem.cluster.devices:
        d = dev.name
        peak_activation = model.new_int_var(0, dev.memory_bytes, f"act[{d}]")
        for n in graph.nodes:
            if activation.get(n.name, 0):
                model.add(peak_activation >= activation[n.name]).only_enforce_if(x[n.name, d])
        model.add(sum(n.param_bytes * x[n.name, d] for n in graph.nodes)
                  + peak_activation <= dev.memory_bytes)


def _add_contiguity(model: cp_model.CpModel, problem: Problem, x: Vars,
                    hinted: Mapping[str, str] | None = None) -> None:
    """The devices' node sets form a chain of pipeline stages: each device gets a distinct rank,
    each node the rank of its device, and no edge goes to a lower rank. Then no path leaves a
    device and comes back and no two devices feed each other, so the stages run in rank order.

    Convexity is implied, but stated as well, because it propagates much better (without it
    CP-SAT proved far weaker bounds on Tarnawski et al.'s graphs): ``z[v, d]`` is at least
    "some ancestor-or-self of ``v`` is on ``d``", and a node feeding ``d`` from outside may not
    have such an ancestor (Tarnawski et al., NeurIPS 2020, section 4). A hinted placement that
    is a chain hints the ranks too."""
    graph, names = problem.graph, problem.cluster.names
    top = len(names) - 1
    rank = {d: model.new_int_var(0, top, f"rank[{d}]") for d in names}
    model.add_all_different(list(rank.values()))
    stage = {n.name: model.new_int_var(0, top, f"stage[{n.name}]") for n in graph.nodes}
    for n in graph.nodes:
        for d in names:
            model.add(stage[n.name] == rank[d]).only_enforce_if(x[n.name, d])
    for e in graph.edges:
        model.add(stage[e.src] <= stage[e.dst])
    for d in names:
        z = {n.name: model.new_bool_var(f"z[{n.name},{d}]") for n in graph.nodes}
        for n in graph.nodes:
            model.add(z[n.name] >= x[n.name, d])
        for e in graph.edges:
            model.add(z[e.dst] >= z[e.src])
            model.add(z[e.src] <= x[e.src, d] + 1 - x[e.dst, d])
    order = stage_order(problem, hinted) if hinted is not None else None
    if order is not None:
        for r, d in enumerate(order):
            model.add_hint(rank[d], r)
        for n in graph.nodes:
            model.add_hint(stage[n.name], order.index(hinted[n.name]))


def _add_schedule(model: cp_model.CpModel, problem: Problem, x: Vars, hint: Schedule | None,
                  hinted: Mapping[str, str] | None,
                  quantum: float) -> tuple[cp_model.IntVar, dict]:
    """Start and end times, no overlap per device, transfer delays; returns the makespan."""
    graph, costs, allowed = problem.graph, problem.costs, problem.allowed
    devices = list(problem.cluster.names)
    nodes = [n.name for n in graph.nodes]
    duration = {(n, d): _ticks(costs.of(n, d), quantum) for n in nodes for d in allowed[n]}
    delay = {(e.src, e.dst, a, b): _ticks(problem.delay_s(e, a, b), quantum)
             for e in graph.edges for a in allowed[e.src] for b in allowed[e.dst]}
    horizon = sum(max(duration[n, d] for d in allowed[n]) for n in nodes) + sum(
        max(delay[e.src, e.dst, a, b] for a in allowed[e.src] for b in allowed[e.dst])
        for e in graph.edges)
    host = problem.costs.host
    if host is not None and problem.launchers:
        # Launchers may wait: their calls and handovers can outlast the delays.
        horizon += len(devices) * _ticks(max(host.call_s.values()), quantum) + len(nodes) * len(
            devices) * _ticks(max(host.handover_s.values()), quantum)
    hint_start: dict[str, int] = {}
    if hint is not None and hinted is not None:
        # Replay the hint in whole ticks (its order on each device, its devices), so that the
        # hint is a feasible solution of the integer model whatever the rounding.
        free = dict.fromkeys(devices, 0)
        for n in sorted(nodes, key=lambda n: (hint.start_s[n], graph.index[n])):
            d = hinted[n]
            ready = max((hint_start[e.src] + duration[e.src, hinted[e.src]]
                         + delay[e.src, n, hinted[e.src], d] for e in graph.in_edges(n)),
                        default=0)
            hint_start[n] = max(ready, free[d])
            free[d] = hint_start[n] + duration[n, d]
        # The optimum is no later than the hint (replayed without launchers or shared links:
        # with them, the hint may take longer, so the horizon stays).
        if not problem.launchers and not problem.cluster.shared:
            horizon = min(horizon, max(free.values()))

    start = {n: model.new_int_var(0, horizon, f"start[{n}]") for n in nodes}
    end = {n: model.new_int_var(0, horizon, f"end[{n}]") for n in nodes}
    intervals = {
        (n, d): model.new_optional_interval_var(start[n], duration[n, d], end[n], x[n, d],
                                                f"iv[{n},{d}]")
        for n in nodes for d in allowed[n]
    }
    makespan = model.new_int_var(0, horizon, "makespan")
    for n in nodes:
        model.add(makespan >= end[n])
    for d in devices:
        model.add_no_overlap(intervals[n, d] for n in nodes if d in allowed[n])
    if len(devices) > 1:
        # Redundant: at most one node per device runs at any time. The cumulative view lets
        # CP-SAT reason about all devices at once (energy, time-tabling): much stronger bounds.
        spans = []
        for n in nodes:
            times = [duration[n, d] for d in allowed[n]]
            size = model.new_int_var(min(times), max(times), f"size[{n}]")
            model.add(size == end[n] - start[n])
            spans.append(model.new_interval_var(start[n], size, end[n], f"span[{n}]"))
        model.add_cumulative(spans, [1] * len(spans), len(devices))
    for e in graph.edges:
        model.add(start[e.dst] >= end[e.src])
        if len(devices) > 1:
            for d2 in allowed[e.dst]:
                model.add(start[e.dst] >= end[e.src] + sum(
                    delay[e.src, e.dst, d1, d2] * x[e.src, d1]
                    for d1 in allowed[e.src] if d1 != d2
                )).only_enforce_if(x[e.dst, d2])
    for n, t in hint_start.items():
        model.add_hint(start[n], t)
        model.add_hint(end[n], t + duration[n, hinted[n]])
    add_launchers(model, problem, x, makespan, start, horizon, quantum)
    add_shared_volume(model, problem, x, makespan, quantum, start, end, horizon)
    return makespan, start


def _add_loads(model: cp_model.CpModel, problem: Problem, x: Vars,
               quantum: float) -> cp_model.IntVar:
    """Per-device load (compute + copies sent and received, as ``simulate.loads``); returns the
    largest. ``pay[u, r]``: the time of ``u``'s copy to ``r`` (charged to ``r``); ``send[u, a]``
    is at least the time of every copy ``u`` makes from ``a``, and is charged to ``a``."""
    graph, costs, allowed = problem.graph, problem.costs, problem.allowed
    devices = list(problem.cluster.names)
    total = sum(max(_ticks(costs.of(n.name, d), quantum) for d in allowed[n.name])
                for n in graph.nodes)
    total += 2 * sum(_ticks(max(problem.delay_s(e, a, b) for a in allowed[e.src]
                                for b in allowed[e.dst]), quantum) for e in graph.edges)
    load_terms: dict[str, list] = {d: [] for d in devices}
    for n in graph.nodes:
        for d in allowed[n.name]:
            load_terms[d].append(_ticks(costs.of(n.name, d), quantum) * x[n.name, d])
    charged = {d.name for d in problem.cluster.devices if d.charges_transfers}
    if len(devices) > 1:
        for n in graph.nodes:
            if graph.out_edges(n.name):
                _add_copy_loads(model, problem, x, n.name, quantum, charged, load_terms)
    max_load = model.new_int_var(0, total, "max_load")
    for d in devices:
        model.add(max_load >= sum(load_terms[d]))
    return max_load


def _add_copy_loads(model: cp_model.CpModel, problem: Problem, x: Vars, node: str,
                    quantum: float, charged: set[str], load_terms: dict[str, list]) -> None:
    """The copies of ``node``'s output, added to ``load_terms`` of the devices that are
    ``charged`` for transfers: the sender pays its largest copy, each receiver its own.

    A copy from a to b takes the largest delay of the edges *read on b* (``simulate.copies``):
    ``pay[node, b]`` is at least the delay of every edge ``(node, v)`` with node on a and v on
    b, so an edge read on another device never prices the copy to b."""
    graph, allowed = problem.graph, problem.allowed
    devices = list(problem.cluster.names)
    out = graph.out_edges(node)
    sent: dict[str, cp_model.IntVar] = {}
    for a in allowed[node]:
        top = max((_ticks(problem.delay_s(e, a, b), quantum) for e in out
                   for b in allowed[e.dst] if b != a), default=0)
        if top and a in charged:
            sent[a] = model.new_int_var(0, top, f"send[{node},{a}]")
            load_terms[a].append(sent[a])
    for b in devices:
        # (sender a, reader v, copy ticks) for every edge that b may read from another device.
        reads = [(a, e.dst, _ticks(problem.delay_s(e, a, b), quantum))
                 for e in out if b in allowed[e.dst] for a in allowed[node] if a != b]
        reads = [(a, v, ticks) for a, v, ticks in reads if ticks]
        if not reads:
            continue
        pay = None
        if b in charged:
            pay = model.new_int_var(0, max(t for _, _, t in reads), f"pay[{node},{b}]")
            load_terms[b].append(pay)
        for a, v, ticks in reads:
            # Charged when node is on a and its reader v is on b.
            if pay is not None:
                model.add(pay >= ticks * (x[node, a] + x[v, b] - 1))
            if a in sent:
                model.add(sent[a] >= ticks * (x[node, a] + x[v, b] - 1))
