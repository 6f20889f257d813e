"""Solve for a placement: baselines first, then CP-SAT hinted with the best of them.

``solve`` runs every baseline heuristic through the simulator, hints CP-SAT with the best
feasible one, simulates CP-SAT's answer, and keeps whichever is best, so the returned plan is never
worse than any baseline on the same simulator. When the simulator finds activations overflowing a
device that CP-SAT's memory model allowed, the set of nodes placed there is cut off (a no-good:
they may not all share that device again) and CP-SAT runs again. The lower bound is the best of
the analytic bounds and the first CP-SAT run's own (later runs carry cuts, so their bounds are not
bounds of the real problem); a CP-SAT bound above a plan the simulator accepts is dropped.

Solvers are chosen by name (``SOLVERS``); ``cpsat`` is the default, the others return the
corresponding heuristic's plan.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from autoplace.errors import AutoplaceError, InfeasibleError
from autoplace.ir import Problem, Schedule
from autoplace.simulate import simulate
from autoplace.solve.bounds import check_memory, lower_bound_s
from autoplace.solve.cpsat import TIME_QUANTUM_S, solve_cpsat
from autoplace.solve.heuristics import heft, sequential_fill, single_device

__all__ = [
    "DEFAULT_TIME_LIMIT_S",
    "SOLVERS",
    "SolveResult",
    "SolverInfo",
    "TIME_QUANTUM_S",
    "get_solver",
    "solve",
]

DEFAULT_TIME_LIMIT_S = 10.0
SOLVERS = ("cpsat", "heft", "sequential", "single-device")
_MEMORY_ROUNDS = 3


@dataclass(frozen=True)
class SolverInfo:
    name: str
    status: str
    wall_s: float
    objective_s: float | None
    time_limit_s: float
    progress: tuple[tuple[float, float | None, float], ...] = ()

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "wall_s": self.wall_s,
                "objective_s": self.objective_s, "time_limit_s": self.time_limit_s,
                "progress": [{"t_s": t, "objective_s": obj, "bound_s": bound}
                             for t, obj, bound in self.progress]}


@dataclass(frozen=True)
class SolveResult:
    schedule: Schedule
    solver: SolverInfo
    lower_bound_s: float
    baselines: Mapping[str, Schedule | None]
    best_single_device: str | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def gap(self) -> float | None:
        if self.schedule.makespan_s <= 0:
            return 0.0
        return max(0.0, (self.schedule.makespan_s - self.lower_bound_s) / self.schedule.makespan_s)


def get_solver(name: str) -> str:
    if name not in SOLVERS:
        raise AutoplaceError(f"unknown solver {name!r}; valid solvers: {', '.join(SOLVERS)}")
    return name


def _activation_bytes(problem: Problem) -> dict[str, int]:
    """What must be live on a node's device while it runs: its output and one copy of each
    input (the simulator's memory model), so resident bytes plus this bound every device's peak
    from below."""
    graph = problem.graph
    working: dict[str, int] = {}
    for n in graph.nodes:
        inputs: dict[str, int] = {}
        for e in graph.in_edges(n.name):
            inputs[e.src] = max(inputs.get(e.src, 0), e.bytes)
        working[n.name] = n.output_bytes + sum(inputs.values())
    return working


def run_baselines(problem: Problem) -> tuple[dict[str, Schedule | None], str | None]:
    """Every baseline, simulated; ``None`` where the heuristic could not respect memory."""
    singles: dict[str, Schedule] = {}
    seen: set[tuple] = set()
    for device in problem.cluster.devices:
        key = (device.memory_bytes,
               tuple(problem.costs.of(n.name, device.name) for n in problem.graph.nodes))
        if key in seen:
            continue  # devices with the same memory and costs give the same single-device plan
        seen.add(key)
        placement = single_device(problem, device.name)
        if placement is not None:
            schedule = simulate(problem, placement)
            if schedule.feasible:
                singles[device.name] = schedule
    best_single = min(singles, key=lambda d: singles[d].makespan_s, default=None)
    baselines: dict[str, Schedule | None] = {
        "single-device": singles[best_single] if best_single else None}
    for name, heuristic in (("sequential", sequential_fill), ("heft", heft)):
        placement = heuristic(problem)
        baselines[name] = simulate(problem, placement) if placement is not None else None
    return baselines, best_single


def _best(schedules: Mapping[str, Schedule | None]) -> tuple[str, Schedule] | None:
    feasible = [(s.makespan_s, name) for name, s in schedules.items()
                if s is not None and s.feasible]
    if not feasible:
        return None
    name = min(feasible)[1]
    schedule = schedules[name]
    assert schedule is not None
    return name, schedule


def solve(
    problem: Problem,
    *,
    solver: str = "cpsat",
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    seed: int = 0,
    workers: int | None = None,
) -> SolveResult:
    """Place ``problem``'s nodes on its devices, minimising the simulated makespan."""
    get_solver(solver)
    check_memory(problem)
    began = time.perf_counter()
    baselines, best_single = run_baselines(problem)
    bound = lower_bound_s(problem)
    notes: list[str] = []
    best = _best(baselines)

    if solver != "cpsat":
        chosen = baselines.get(solver)
        if chosen is None or not chosen.feasible:
            raise InfeasibleError(
                f"the {solver} heuristic found no placement within memory; try --solver cpsat")
        info = SolverInfo(name=solver, status="HEURISTIC", wall_s=time.perf_counter() - began,
                          objective_s=chosen.makespan_s, time_limit_s=time_limit_s)
        return SolveResult(schedule=chosen, solver=info, lower_bound_s=bound,
                           baselines=baselines, best_single_device=best_single)

    activation = _activation_bytes(problem)
    deadline = began + time_limit_s
    status, objective, cpsat_schedule = "NOT_RUN", None, None
    nogoods: list[tuple[str, frozenset[str]]] = []
    progress: list[tuple[float, float | None, float]] = []
    for round_ in range(_MEMORY_ROUNDS):
        remaining = deadline - time.perf_counter()
        if remaining <= 0.05:
            break
        result = solve_cpsat(problem, time_limit_s=remaining,
                             hint=best[1] if best else None, activation_bytes=activation,
                             nogoods=nogoods, workers=workers, seed=seed)
        status, objective = result.status, result.objective_s
        offset = time.perf_counter() - began - result.wall_s
        progress.extend((offset + t, obj, b) for t, obj, b in result.progress)
        if round_ == 0:
            # Only the uncut model's bound holds for the real problem. INFEASIBLE there is a
            # proof: every device must hold its parameters and any one node's working set.
            if result.placement is not None:
                bound = max(bound, result.bound_s)
            elif result.status == "INFEASIBLE" and best is None:
                raise InfeasibleError(
                    "no placement fits: the parameters can be split only in ways that overflow "
                    "some device once activations are counted; add devices or use larger ones")
        if result.placement is None:
            break
        candidate = simulate(problem, result.placement)
        if candidate.feasible:
            cpsat_schedule = candidate
            break
        device_of = result.placement.device_of
        for dev in candidate.over_capacity:
            nogoods.append((dev, frozenset(n for n, d in device_of.items() if d == dev)))
        notes.append(f"CP-SAT plan overflowed {sorted(candidate.over_capacity)} once activations "
                     "were simulated; re-solved with those node sets cut off")

    feasible_makespans = [s.makespan_s for s in (*baselines.values(), cpsat_schedule)
                          if s is not None and s.feasible]
    if feasible_makespans and bound > min(feasible_makespans) * (1 + 1e-9) + 1e-12:
        # A bound above a schedule the simulator accepts is wrong; keep only the analytic one.
        notes.append(f"CP-SAT reported a lower bound ({bound:.6g} s) above a feasible plan "
                     f"({min(feasible_makespans):.6g} s); it was discarded")
        bound = lower_bound_s(problem)
        status = "FEASIBLE" if status == "OPTIMAL" else status
    wall = time.perf_counter() - began
    if cpsat_schedule is not None and (best is None
                                       or cpsat_schedule.makespan_s <= best[1].makespan_s):
        chosen, name = cpsat_schedule, "cpsat"
    elif best is not None:
        chosen, name = best[1], f"cpsat ({best[0]} kept)"
        notes.append(f"CP-SAT ({status}) did not improve on the {best[0]} baseline within "
                     f"{time_limit_s:g} s; the plan is the {best[0]} placement")
    elif nogoods:
        raise InfeasibleError(
            "no placement within memory was found: every heuristic overflowed a device, and "
            f"CP-SAT's plans overflowed {sorted({d for d, _ in nogoods})} once activations were "
            f"simulated ({len(nogoods)} cuts in {time_limit_s:g} s); raise --time-limit, or add "
            "devices or larger ones")
    else:
        raise InfeasibleError(
            "no placement within memory was found: CP-SAT returned "
            f"{status} within {time_limit_s:g} s and every heuristic overflowed a device; "
            "raise --time-limit, or add devices")
    info = SolverInfo(name=name, status=status, wall_s=wall, objective_s=objective,
                      time_limit_s=time_limit_s, progress=tuple(progress))
    return SolveResult(schedule=chosen, solver=info, lower_bound_s=bound, baselines=baselines,
                       best_single_device=best_single, notes=tuple(notes))
