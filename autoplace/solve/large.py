"""Graphs larger than CP-SAT solves whole: coarsen, solve, expand, then refine on the full graph.

The full graph is the folded one (``fold.fold``); the coarse graph is only an aid to CP-SAT, and
every number the solve keeps is the simulator's on the full graph. Multilevel, in order:

1. **coarsen** to ``max_nodes`` (``autoplace.fold``: runs of a topological order, by module);
2. **solve** the coarse problem with CP-SAT, hinted with the best baseline projected onto it;
3. **expand** the coarse placement and simulate it;
4. **refine** on the full graph: where the exact model takes it (``EXACT_MAX_NODES``), CP-SAT
   warm-started with the best plan so far (the solve's ``_solve_exact``); otherwise
5. **local moves** (``improve``), scored by the one simulator: a colocation group of a node that
   decides the objective (on the critical path, or on the busiest device) moved to another device,
   kept when the simulated objective drops.

Each step's objective on the full graph is recorded, so a plan says what every step gained.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from autoplace.config.choices import Objective
from autoplace.fold import Coarsened, coarsen
from autoplace.ir import Placement, Problem, Schedule
from autoplace.simulate import simulate
from autoplace.solve.baselines.heuristics import group_devices, majority_devices
from autoplace.solve.cpsat import CpSatResult, node_activation_bytes, solve_cpsat

__all__ = ["EXACT_MAX_NODES", "LargeResult", "coarse_solve", "improve"]

# Above these sizes the exact model is built on a coarsened graph instead.
EXACT_MAX_NODES = {Objective.LATENCY: 250, Objective.THROUGHPUT: 2500}


@dataclass(frozen=True)
class LargeResult:
    schedule: Schedule | None
    cpsat: CpSatResult | None
    coarse_nodes: int
    steps: tuple[tuple[str, float], ...]
    coarsening: tuple[str, ...] = ()


def _max_group_bytes(problem: Problem) -> int:
    """A group never holds more than a quarter of the smallest device's memory in parameters,
    so coarsening cannot make a model unplaceable."""
    return max(min(d.memory_bytes for d in problem.cluster.devices) // 4, 1)


def _project(small: Problem, coarse: Coarsened, device_of: Mapping[str, str]) -> Schedule | None:
    """A full-graph placement on the coarse graph: each coarse node where most of its members
    are (its colocation group with it); ``None`` where that is not allowed."""
    coarse_of = majority_devices(small, coarse.members, device_of)
    if not all(coarse_of[n] in small.allowed[n] for n in coarse_of):
        return None
    return simulate(small, Placement(device_of=coarse_of))


def _expand(coarse: Coarsened, placement: Placement) -> Placement:
    return Placement(device_of={m: placement.device_of[name]
                                for name, members in coarse.members.items() for m in members})


def coarse_solve(
    problem: Problem,
    *,
    max_nodes: int,
    objective: str,
    contiguous: bool,
    hint: Schedule | None,
    time_limit_s: float,
    **cpsat_options,
) -> LargeResult:
    """Steps 1-3: CP-SAT on a coarsened copy of ``problem``, expanded back and simulated on
    ``problem``. The coarse model's memory working sets are the coarse nodes' own."""
    coarse = coarsen(problem.graph, problem.costs, max_nodes=max_nodes,
                     max_group_bytes=_max_group_bytes(problem))
    small = Problem(graph=coarse.graph, cluster=problem.cluster, costs=coarse.costs)
    coarse_hint = _project(small, coarse, hint.placement.device_of) if hint else None
    result = solve_cpsat(small, time_limit_s=time_limit_s, objective=objective,
                         contiguous=contiguous, hint=coarse_hint,
                         activation_bytes=node_activation_bytes(small), **cpsat_options)
    size = len(small.graph.nodes)
    if result.placement is None:
        return LargeResult(schedule=None, cpsat=result, coarse_nodes=size, steps=(),
                           coarsening=coarse.steps)
    schedule = simulate(problem, _expand(coarse, result.placement))
    return LargeResult(schedule=schedule, cpsat=result, coarse_nodes=size,
                       steps=((f"CP-SAT on {size} coarse nodes, expanded",
                               schedule.objective_s(objective)),),
                       coarsening=coarse.steps)


def _deciding_nodes(problem: Problem, schedule: Schedule, objective: str) -> list[str]:
    """Nodes whose device decides the objective: the critical path, or the busiest device."""
    device_of = schedule.placement.device_of
    if objective == Objective.THROUGHPUT:
        busiest = max(schedule.load_s, key=schedule.load_s.__getitem__)
        return [n.name for n in problem.graph.nodes if device_of[n.name] == busiest]
    graph = problem.graph
    node = max(schedule.end_s, key=schedule.end_s.__getitem__)
    path = [node]
    while True:
        # The input that arrived last, else the node that ran just before on the same device.
        start = schedule.start_s[node]
        arrivals = [(schedule.end_s[e.src] + problem.delay_s(e, device_of[e.src],
                                                              device_of[node]), e.src)
                    for e in graph.in_edges(node)]
        late = [src for t, src in arrivals if abs(t - start) <= 1e-12 + 1e-9 * start]
        if late:
            node = late[0]
        else:
            before = [n for n, d in device_of.items()
                      if d == device_of[node] and abs(schedule.end_s[n] - start) <= 1e-12]
            if not before:
                break
            node = before[0]
        if node in path:
            break
        path.append(node)
    return path


def _candidates(problem: Problem, schedule: Schedule, objective: str) -> list[str]:
    """The nodes a local move tries: those that decide the objective and, where a launcher
    pays a segment call and a handover at every copy (``ir.HostCosts``), both ends of each copy
    between devices: moving one may save that copy."""
    nodes = _deciding_nodes(problem, schedule, objective)
    if problem.launchers:
        device_of = schedule.placement.device_of
        for e in problem.graph.edges:
            if device_of[e.src] != device_of[e.dst]:
                nodes += [e.src, e.dst]
    return list(dict.fromkeys(nodes))


def improve(
    problem: Problem,
    schedule: Schedule,
    *,
    objective: str,
    deadline: float,
    accept: Callable[[Schedule], bool] = lambda s: s.feasible,
    max_evaluations: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[Schedule, int]:
    """Step 4: first-improvement local search until ``deadline`` (a ``clock`` value; the
    solve's ``Budget`` hands it out), ``max_evaluations`` simulations (which makes it
    deterministic) or a local optimum. Returns the best schedule and the number of moves kept."""
    graph = problem.graph
    runs_on = group_devices(problem)
    best, moves = schedule, 0
    evaluations_left = max_evaluations if max_evaluations is not None else float("inf")
    last = 0.0  # how long the last simulation took: the next must end before the deadline

    def out_of_time() -> bool:
        return clock() + last >= deadline or evaluations_left <= 0

    improved = True
    while improved and not out_of_time():
        improved = False
        tried: set[tuple[str, ...]] = set()
        for name in _candidates(problem, best, objective):
            group = graph.colocation_of[name]
            if group in tried:
                continue
            tried.add(group)
            here = best.placement.device_of[name]
            for dev in runs_on[name]:
                if dev == here or out_of_time():
                    continue
                evaluations_left -= 1
                device_of = dict(best.placement.device_of)
                for m in group:
                    device_of[m] = dev
                began = clock()
                candidate = simulate(problem, Placement(device_of=device_of))
                last = clock() - began
                if (candidate.objective_s(objective) < best.objective_s(objective) * (1 - 1e-12)
                        and accept(candidate)):
                    best, moves, improved = candidate, moves + 1, True
                    break
            if improved:
                break
    return best, moves
