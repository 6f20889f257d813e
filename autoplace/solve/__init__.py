"""Solve for a placement: baselines first, then CP-SAT hinted with the best of them.

``solve`` runs every baseline heuristic through the simulator, hints CP-SAT with the best
feasible one, simulates CP-SAT's answer, and keeps whichever is best, so the returned plan is never
worse than any baseline on the same simulator. When the simulator finds activations overflowing a
device that CP-SAT's memory model allowed, the set of nodes placed there is cut off (a no-good:
they may not all share that device again) and CP-SAT runs again. The lower bound is the best of
the analytic bounds and the first CP-SAT run's own (later runs carry cuts, so their bounds are not
bounds of the real problem); a CP-SAT bound above a plan the simulator accepts is dropped.

Baselines (``HEURISTICS``, each also a CP-SAT hint): accelerate-style sequential and balanced
fill, insertion-based HEFT, Baechi's memory-aware m-ETF and m-SCT, the exact dynamic program
over contiguous splits of a topological order (two orders: the graph's, and one that keeps
colocation groups together), the exact dynamic program over all contiguous splits (chains of
ideals, Tarnawski et al.; for graphs with few ideals), and the DP's variant over colocation
groups (pipeline stages of training graphs). Solvers are chosen by name (``SOLVERS``);
``cpsat`` is the default, the others return the corresponding heuristic's plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from autoplace.errors import AutoplaceError, InfeasibleError
from autoplace.ir import Placement, Problem, Schedule, optimality_gap
from autoplace.simulate import simulate
from autoplace.solve.baechi import m_etf, m_sct
from autoplace.solve.bounds import check_memory, lower_bound_s
from autoplace.solve.cpsat import TIME_QUANTUM_S, solve_cpsat
from autoplace.solve.heuristics import heft, sequential_fill, single_device
from autoplace.solve.ideals import ideal_dp
from autoplace.solve.large import EXACT_MAX_NODES, coarse_solve, improve
from autoplace.solve.partition import balanced_fill, contiguous_split
from autoplace.solve.stages import stage_dp, stage_order

__all__ = [
    "DEFAULT_TIME_LIMIT_S",
    "HEURISTICS",
    "OBJECTIVES",
    "SOLVERS",
    "SolveResult",
    "SolverInfo",
    "TIME_QUANTUM_S",
    "get_solver",
    "is_contiguous",
    "run_baselines",
    "solve",
]

DEFAULT_TIME_LIMIT_S = 10.0
BASELINE_SHARE = 0.5  # of the time limit, at most, before the remaining baselines are skipped
OBJECTIVES = ("latency", "throughput")
# Heuristic baselines: each takes (problem, objective) and returns a placement or None.
HEURISTICS: dict[str, Callable[[Problem, str], Placement | None]] = {
    # Cheap ones first: when the time limit cuts the baselines short, the slow list schedulers
    # are the ones skipped.
    "sequential": lambda p, _: sequential_fill(p),
    "balanced": lambda p, _: balanced_fill(p),
    "contiguous-dp": contiguous_split,
    "ideal-dp": ideal_dp,
    "stage-dp": stage_dp,
    "heft": lambda p, _: heft(p),
    "m-etf": lambda p, _: m_etf(p),
    "m-sct": lambda p, _: m_sct(p),
}
SOLVERS = ("cpsat", *sorted([*HEURISTICS, "single-device"]))
_MEMORY_ROUNDS = 3


@dataclass(frozen=True)
class SolverInfo:
    name: str
    status: str
    wall_s: float
    objective_s: float | None
    time_limit_s: float
    progress: tuple[tuple[float, float | None, float], ...] = ()
    steps: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "wall_s": self.wall_s,
                "objective_s": self.objective_s, "time_limit_s": self.time_limit_s,
                "progress": [{"t_s": t, "objective_s": obj, "bound_s": bound}
                             for t, obj, bound in self.progress],
                "steps": [{"step": step, "objective_s": value} for step, value in self.steps]}


@dataclass(frozen=True)
class SolveResult:
    schedule: Schedule
    solver: SolverInfo
    lower_bound_s: float
    baselines: Mapping[str, Schedule | None]
    best_single_device: str | None
    notes: tuple[str, ...] = field(default_factory=tuple)
    objective: str = "latency"
    contiguous: bool = False

    @property
    def objective_s(self) -> float:
        """The plan's value under its objective (makespan, or the largest load)."""
        return self.schedule.objective_s(self.objective)

    @property
    def gap(self) -> float | None:
        return optimality_gap(self.objective_s, self.lower_bound_s)


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


def is_contiguous(problem: Problem, device_of: Mapping[str, str]) -> bool:
    """True when the devices' node sets form a chain of pipeline stages (``stage_order``): no
    path leaves a device's node set and comes back to it, and no two devices feed each other,
    so the stages can run one after another."""
    return stage_order(problem, device_of) is not None


def run_baselines(
    problem: Problem, objective: str = "latency", contiguous: bool = False
) -> tuple[dict[str, Schedule | None], str | None]:
    """Every baseline, simulated; ``None`` where the heuristic could not respect memory (or,
    with ``contiguous``, made a split that is not contiguous)."""
    ran = _run_baselines(problem, objective, contiguous)
    return ran.schedules, ran.best_single


@dataclass(frozen=True)
class _Baselines:
    schedules: dict[str, Schedule | None]
    best_single: str | None
    skipped: tuple[str, ...] = ()  # not run: the deadline passed, or Ctrl-C
    interrupted: bool = False


def _run_baselines(problem: Problem, objective: str, contiguous: bool, *,
                   deadline: float = float("inf")) -> _Baselines:
    """``run_baselines``, skipping the heuristics still to run once ``deadline`` (a
    ``time.perf_counter`` value) has passed or Ctrl-C was pressed."""
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
    best_single = min(singles, key=lambda d: singles[d].objective_s(objective), default=None)
    baselines: dict[str, Schedule | None] = {
        "single-device": singles[best_single] if best_single else None}
    skipped: list[str] = []
    interrupted = False
    for name, heuristic in HEURISTICS.items():
        if interrupted or time.perf_counter() > deadline:
            skipped.append(name)
            continue
        try:
            placement = heuristic(problem, objective)
            if placement is None or (contiguous
                                     and not is_contiguous(problem, placement.device_of)):
                baselines[name] = None
            else:
                baselines[name] = simulate(problem, placement)
        except KeyboardInterrupt:
            interrupted = True
            skipped.append(name)
    return _Baselines(baselines, best_single, tuple(skipped), interrupted)


def _best(schedules: Mapping[str, Schedule | None],
          objective: str) -> tuple[str, Schedule] | None:
    feasible = [(s.objective_s(objective), name) for name, s in schedules.items()
                if s is not None and s.feasible]
    if not feasible:
        return None
    name = min(feasible)[1]
    schedule = schedules[name]
    assert schedule is not None
    return name, schedule


def _solve_large(problem: Problem, *, objective: str, contiguous: bool, time_limit_s: float,
                 began: float, baselines: Mapping[str, Schedule | None],
                 best: tuple[str, Schedule] | None, best_single: str | None, bound: float,
                 notes: list[str], **cpsat_options) -> SolveResult:
    """Coarsen, CP-SAT, expand, improve (``large``); every step scored by the simulator."""
    steps: list[tuple[str, float]] = []
    if best is not None:
        steps.append((f"best baseline ({best[0]})", best[1].objective_s(objective)))
    deterministic = cpsat_options.get("deterministic", False)
    budget = time_limit_s / 2 if deterministic else max(
        0.05, (began + time_limit_s - time.perf_counter()) * 0.6)
    try:
        large = coarse_solve(problem, objective=objective, contiguous=contiguous,
                             hint=best[1] if best else None, time_limit_s=budget,
                             known_bound_s=bound, **cpsat_options)
    except KeyboardInterrupt:
        if best is None:
            raise
        return _interrupted(best[1], best[0], problem=problem, began=began,
                            time_limit_s=time_limit_s, bound=bound, baselines=baselines,
                            best_single=best_single, notes=notes, objective=objective,
                            contiguous=contiguous, steps=tuple(steps))
    candidates = [s for s in (large.schedule, best[1] if best else None)
                  if s is not None and s.feasible
                  and (not contiguous or is_contiguous(problem, s.placement.device_of))]
    if not candidates:
        raise InfeasibleError(
            "no placement within memory was found: every heuristic overflowed a device and "
            f"CP-SAT on the coarsened graph returned {large.cpsat.status if large.cpsat else '-'}"
            f" in {time_limit_s:g} s; raise --time-limit, or add devices")
    steps += large.steps
    start = min(candidates, key=lambda s: s.objective_s(objective))
    cp = large.cpsat
    if cp is not None and cp.interrupted:
        return _interrupted(start, "cpsat (coarsened)", problem=problem, began=began,
                            time_limit_s=time_limit_s, bound=bound, baselines=baselines,
                            best_single=best_single, notes=notes, objective=objective,
                            contiguous=contiguous, progress=cp.progress,
                            cp_objective=cp.objective_s, steps=tuple(steps))
    # Local moves: the rest of the time; when deterministic, a number of simulations that
    # takes about half the limit (a simulation costs about 0.1 ms a node here), not wall time.
    try:
        chosen, moves = improve(
            problem, start, objective=objective,
            # A margin for what follows the moves (the result, the notes) within the limit.
            deadline=float("inf") if deterministic else began + time_limit_s * 0.99 - 0.2,
            max_evaluations=max(10, int(5000 * time_limit_s / len(problem.graph.nodes)))
            if deterministic else None,
            accept=lambda s: s.feasible and (not contiguous
                                             or is_contiguous(problem, s.placement.device_of)))
    except KeyboardInterrupt:
        return _interrupted(start, "cpsat (coarsened)", problem=problem, began=began,
                            time_limit_s=time_limit_s, bound=bound, baselines=baselines,
                            best_single=best_single, notes=notes, objective=objective,
                            contiguous=contiguous, steps=tuple(steps))
    steps.append((f"local moves on the full graph ({moves} kept)", chosen.objective_s(objective)))
    notes.append(f"{len(problem.graph.nodes)} nodes are more than the exact model takes "
                 f"({EXACT_MAX_NODES[objective]}): " + "; ".join(
                     f"{step}: {value:.6g} s" for step, value in steps))
    # The coarse model's status says nothing about the full graph: the plan is proven optimal
    # only when it meets the lower bound.
    proven = chosen.objective_s(objective) <= bound * (1 + 1e-9)
    info = SolverInfo(name="cpsat (coarsened) + local moves",
                      status="OPTIMAL" if proven else "FEASIBLE",
                      wall_s=time.perf_counter() - began,
                      objective_s=cp.objective_s if cp is not None else None,
                      time_limit_s=time_limit_s,
                      progress=cp.progress if cp is not None else (), steps=tuple(steps))
    return SolveResult(schedule=chosen, solver=info, lower_bound_s=bound, baselines=baselines,
                       best_single_device=best_single, notes=tuple(notes),
                       objective=objective, contiguous=contiguous)


def solve(
    problem: Problem,
    *,
    solver: str = "cpsat",
    objective: str = "latency",
    contiguous: bool = False,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    seed: int = 0,
    workers: int | None = None,
    deterministic: bool = False,
) -> SolveResult:
    """Place ``problem``'s nodes on its devices, minimising the simulated ``objective``:
    ``latency`` (the makespan of one pass) or ``throughput`` (the busiest device's load per pass,
    for pipelined execution). ``contiguous`` makes every device's node set a pipeline stage.
    ``deterministic`` gives the same plan for the same input on every run: one CP-SAT worker
    and a budget in CP-SAT's deterministic seconds instead of wall seconds."""
    get_solver(solver)
    if objective not in OBJECTIVES:
        raise AutoplaceError(f"unknown objective {objective!r}; valid objectives: "
                             f"{', '.join(OBJECTIVES)}")
    check_memory(problem)
    began = time.perf_counter()
    # Half the limit at most for the baselines (none is skipped when deterministic: which
    # would depend on the machine's speed).
    ran = _run_baselines(problem, objective, contiguous, deadline=float("inf") if deterministic
                         else began + time_limit_s * BASELINE_SHARE)
    baselines, best_single = ran.schedules, ran.best_single
    bound = analytic = lower_bound_s(problem, objective)
    notes: list[str] = []
    if ran.skipped:
        why = "Ctrl-C" if ran.interrupted else "past half the time limit"
        notes.append(f"baselines not run ({why}): " + ", ".join(ran.skipped))
    best = _best(baselines, objective)
    if ran.interrupted:
        if best is None:
            raise KeyboardInterrupt
        return _interrupted(best[1], best[0], problem=problem, began=began,
                            time_limit_s=time_limit_s, bound=bound, baselines=baselines,
                            best_single=best_single, notes=notes, objective=objective,
                            contiguous=contiguous)

    if solver != "cpsat":
        chosen = baselines.get(solver)
        if chosen is None or not chosen.feasible:
            raise InfeasibleError(
                f"the {solver} heuristic found no placement within memory"
                f"{' that is contiguous' if contiguous else ''}; try --solver cpsat")
        info = SolverInfo(name=solver, status="HEURISTIC", wall_s=time.perf_counter() - began,
                          objective_s=chosen.objective_s(objective), time_limit_s=time_limit_s)
        return SolveResult(schedule=chosen, solver=info, lower_bound_s=bound,
                           baselines=baselines, best_single_device=best_single,
                           objective=objective, contiguous=contiguous)

    if best is not None and best[1].objective_s(objective) <= bound * (1 + 1e-12):
        # A baseline meets the lower bound: it is optimal, and CP-SAT cannot improve on it.
        info = SolverInfo(name=best[0], status="OPTIMAL", wall_s=time.perf_counter() - began,
                          objective_s=best[1].objective_s(objective), time_limit_s=time_limit_s)
        notes.append(f"the {best[0]} baseline meets the lower bound, so it is optimal; CP-SAT "
                     "was not needed")
        return SolveResult(schedule=best[1], solver=info, lower_bound_s=bound,
                           baselines=baselines, best_single_device=best_single,
                           notes=tuple(notes), objective=objective, contiguous=contiguous)
    activation = _activation_bytes(problem)
    if len(problem.graph.nodes) > EXACT_MAX_NODES[objective]:
        return _solve_large(problem, objective=objective, contiguous=contiguous,
                            time_limit_s=time_limit_s, began=began, baselines=baselines,
                            best=best, best_single=best_single, bound=bound, notes=notes,
                            activation_bytes=activation, seed=seed,
                            workers=1 if deterministic else workers,
                            deterministic=deterministic)
    deadline = began + time_limit_s
    status, cp_objective, cpsat_schedule = "NOT_RUN", None, None
    interrupted = False
    nogoods: list[tuple[str, frozenset[str]]] = []
    progress: list[tuple[float, float | None, float]] = []
    for round_ in range(_MEMORY_ROUNDS):
        # Leave time to simulate and compare the result within the limit.
        remaining = deadline - time.perf_counter() - 0.1
        if deterministic:
            remaining = time_limit_s / _MEMORY_ROUNDS
        elif remaining <= 0.05:
            break
        result = solve_cpsat(problem, time_limit_s=remaining, objective=objective,
                             contiguous=contiguous, hint=best[1] if best else None,
                             activation_bytes=activation, nogoods=nogoods,
                             workers=1 if deterministic else workers, seed=seed,
                             deterministic=deterministic,
                             known_bound_s=analytic)
        status, cp_objective = result.status, result.objective_s
        interrupted = result.interrupted
        offset = time.perf_counter() - began - result.wall_s
        progress.extend((offset + t, obj, b) for t, obj, b in result.progress)
        if round_ == 0:
            # Only the uncut model's bound holds for the real problem. INFEASIBLE there is a
            # proof: every device must hold its parameters and any one node's working set.
            if result.placement is not None:
                bound = max(bound, result.bound_s)
            elif result.status == "INFEASIBLE" and best is not None:
                notes.append("CP-SAT reported INFEASIBLE although the "
                             f"{best[0]} baseline fits: a solver fault; the plan is the best "
                             "baseline")
            elif result.status == "INFEASIBLE":
                raise InfeasibleError(
                    "no placement fits: the parameters can be split only in ways that overflow "
                    "some device once activations are counted"
                    f"{' (with contiguous stages)' if contiguous else ''}; add devices or use "
                    "larger ones")
        if result.placement is None:
            break
        candidate = simulate(problem, result.placement)
        if candidate.feasible:
            cpsat_schedule = candidate
            break
        if interrupted:
            break
        device_of = result.placement.device_of
        for dev in candidate.over_capacity:
            nogoods.append((dev, frozenset(n for n, d in device_of.items() if d == dev)))
        notes.append(f"CP-SAT plan overflowed {sorted(candidate.over_capacity)} once activations "
                     "were simulated; re-solved with those node sets cut off")

    feasible = [s.objective_s(objective) for s in (*baselines.values(), cpsat_schedule)
                if s is not None and s.feasible]
    if feasible and bound > min(feasible) * (1 + 1e-9) + 1e-12:
        # A bound above a schedule the simulator accepts is wrong; keep only the analytic one.
        notes.append(f"CP-SAT reported a lower bound ({bound:.6g} s) above a feasible plan "
                     f"({min(feasible):.6g} s); it was discarded")
        bound = analytic
        status = "FEASIBLE" if status == "OPTIMAL" else status
    wall = time.perf_counter() - began
    if cpsat_schedule is not None and (
            best is None
            or cpsat_schedule.objective_s(objective) <= best[1].objective_s(objective)):
        chosen, name = cpsat_schedule, "cpsat"
    elif best is not None:
        chosen, name = best[1], f"cpsat ({best[0]} kept)"
        if not interrupted:
            notes.append(f"CP-SAT ({status}) did not improve on the {best[0]} baseline within "
                         f"{time_limit_s:g} s; the plan is the {best[0]} placement")
    elif interrupted:
        raise KeyboardInterrupt
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
    if interrupted:
        return _interrupted(chosen, name, problem=problem, began=began,
                            time_limit_s=time_limit_s, bound=bound, baselines=baselines,
                            best_single=best_single, notes=notes, objective=objective,
                            contiguous=contiguous, progress=tuple(progress),
                            cp_objective=cp_objective)
    info = SolverInfo(name=name, status=status, wall_s=wall, objective_s=cp_objective,
                      time_limit_s=time_limit_s, progress=tuple(progress))
    return SolveResult(schedule=chosen, solver=info, lower_bound_s=bound, baselines=baselines,
                       best_single_device=best_single, notes=tuple(notes),
                       objective=objective, contiguous=contiguous)


def _interrupted(chosen: Schedule, name: str, *, problem: Problem, began: float,
                 time_limit_s: float, bound: float, baselines: Mapping[str, Schedule | None],
                 best_single: str | None, notes: list[str], objective: str, contiguous: bool,
                 progress: tuple = (), cp_objective: float | None = None,
                 steps: tuple = ()) -> SolveResult:
    """The best plan found before Ctrl-C, marked as such (status ``INTERRUPTED``)."""
    wall = time.perf_counter() - began
    optimal = chosen.objective_s(objective) <= bound * (1 + 1e-9)
    notes.append(f"interrupted (Ctrl-C) after {wall:.1f} s: the plan ({name}) is the best found "
                 "so far" + (", and it meets the lower bound: optimal" if optimal else ""))
    info = SolverInfo(name=name, status="INTERRUPTED", wall_s=wall,
                      objective_s=cp_objective, time_limit_s=time_limit_s, progress=progress,
                      steps=steps)
    return SolveResult(schedule=chosen, solver=info, lower_bound_s=bound, baselines=baselines,
                       best_single_device=best_single, notes=tuple(notes),
                       objective=objective, contiguous=contiguous)
