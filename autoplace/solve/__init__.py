"""Solve for a placement: baselines first, then CP-SAT hinted with the best of them.

``solve`` runs every baseline heuristic (``HEURISTICS``, ``docs/concepts.md``) through the
simulator, hints CP-SAT with the best feasible one, simulates CP-SAT's answer and keeps the best,
so the plan is never worse than a baseline on the same simulator. Where the simulator finds a
device overflowing that CP-SAT's memory model allowed, the nodes placed there are cut off (a
no-good) and CP-SAT runs again. The lower bound is the best of the analytic bounds and the first
CP-SAT run's (later runs carry cuts); a CP-SAT bound above a plan the simulator accepts is dropped.
All it reports is of ``problem``, the full (folded) graph (CP-SAT's bound only when it solved that
graph whole); ``SolverRecord.scope`` says which graph CP-SAT solved.

Read ``solve``; its steps, in order, each may end the solve: ``_start`` (the baselines and the
analytic bound), ``_heuristic`` (``--solver`` names one), ``_baseline_at_bound``, ``_solve_exact``
(``_cpsat_rounds``, ``_check_bound``, ``_choose``), ``_solve_large`` (over ``max_nodes``:
``large.py``). They share a ``_SolveState`` (``_interrupted``: after Ctrl-C) and a ``Budget``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from autoplace import progress as display
from autoplace.config.choices import Objective
from autoplace.errors import InfeasibleError
from autoplace.formats.plan import SolverRecord
from autoplace.ir import Placement, Problem, Schedule, optimality_gap
from autoplace.simulate import simulate
from autoplace.solve.baselines import best_baseline, is_contiguous, run_baselines, run_within
from autoplace.solve.bounds import check_memory, lower_bound_s
from autoplace.solve.cpsat import (
    MAX_DELAY_TERMS,
    TIME_QUANTUM_S,
    CpSatResult,
    node_activation_bytes,
    solve_cpsat,
)
from autoplace.solve.large import EXACT_MAX_NODES, coarse_solve, improve
from autoplace.solve.options import (
    DEFAULT_TIME_LIMIT_S,
    LAUNCHER_MOVES_SHARE,
    MEMORY_ROUNDS,
    Budget,
    Clock,
    SolveOptions,
    StopCheck,
)
from autoplace.solve.registry import HEURISTICS, OBJECTIVES, SOLVERS, get_solver

__all__ = [
    "DEFAULT_TIME_LIMIT_S",
    "HEURISTICS",
    "OBJECTIVES",
    "SOLVERS",
    "Budget",
    "Outpaced",
    "SolveOptions",
    "SolveResult",
    "TIME_QUANTUM_S",
    "get_solver",
    "is_contiguous",
    "run_baselines",
    "solve",
]


@dataclass(frozen=True)
class SolveResult:
    schedule: Schedule
    solver: SolverRecord
    lower_bound_s: float
    baselines: Mapping[str, Schedule | None]
    best_single_device: str | None
    notes: tuple[str, ...] = field(default_factory=tuple)
    objective: str = "latency"
    contiguous: bool = False
    not_run: Mapping[str, str] = field(default_factory=dict)  # baseline -> why it did not run
    coarsening: tuple[str, ...] = ()  # the steps that made the coarsened graph, if any

    @property
    def objective_s(self) -> float:
        """The plan's value under its objective (makespan, or the largest load)."""
        return self.schedule.objective_s(self.objective)

    @property
    def gap(self) -> float | None:
        return optimality_gap(self.objective_s, self.lower_bound_s)


@dataclass
class _SolveState:
    """What the steps of one solve share. ``bound`` (the best lower bound proven so far) and
    ``notes`` change as the steps run."""

    problem: Problem
    options: SolveOptions
    budget: Budget
    baselines: dict[str, Schedule | None]
    best_single: str | None
    best: tuple[str, Schedule] | None  # the best feasible baseline or start: name, schedule
    analytic: float  # the analytic lower bound (``bounds.lower_bound_s``)
    bound: float
    notes: list[str]
    not_run: Mapping[str, str] = field(default_factory=dict)
    scope: dict[str, Any] = field(default_factory=dict)
    coarsening: tuple[str, ...] = ()
    starts: dict[str, Schedule] = field(default_factory=dict)  # plans found elsewhere

    @property
    def objective(self) -> str:
        return self.options.objective

    def acceptable(self, schedule: Schedule | None) -> bool:
        """Feasible, and contiguous where the options ask for it."""
        return schedule is not None and schedule.feasible and (
            not self.options.contiguous
            or is_contiguous(self.problem, schedule.placement.device_of))

    def info(self, name: str, status: str, objective_s: float | None, *,
             progress: tuple = (), steps: tuple = ()) -> SolverRecord:
        return SolverRecord(name=name, status=status, wall_s=self.budget.elapsed_s(),
                            objective_s=objective_s, time_limit_s=self.options.time_limit_s,
                            progress=progress, steps=steps)

    def result(self, chosen: Schedule, info: SolverRecord) -> SolveResult:
        return SolveResult(schedule=chosen, solver=replace(info, scope=dict(self.scope)),
                           lower_bound_s=self.bound,
                           baselines=self.baselines, best_single_device=self.best_single,
                           notes=tuple(self.notes), objective=self.options.objective,
                           contiguous=self.options.contiguous, not_run=self.not_run,
                           coarsening=self.coarsening)


class Outpaced(InfeasibleError):
    """No placement can be the plan: its lower bound is no less than the time of a plan of
    another kind already found (``solve(beat_s=...)``; ``bound_s`` and ``beat_s`` say so).
    Internal: the pipeline that passed ``beat_s`` keeps that plan, and no user sees it.
    ``options``: a training plan's replica counts, each with its bound (``pipeline.step``)."""

    def __init__(self, message: str, *, bound_s: float, beat_s: float,
                 options: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.bound_s, self.beat_s, self.options = bound_s, beat_s, options


def solve(
    problem: Problem,
    *,
    options: SolveOptions | None = None,
    clock: Clock = time.perf_counter,
    stop: StopCheck | None = None,
    extra_baselines: Mapping[str, Placement] | None = None,
    starts: Mapping[str, Placement] | None = None,
    beat_s: float | None = None,
    **fields: Any,
) -> SolveResult:
    """Place ``problem``'s nodes on its devices, minimising the simulated objective of
    ``options`` (a ``SolveOptions``, which says what each setting does). Its fields may be given
    as keywords instead (``solve(problem, time_limit_s=5, seed=1)``) or on top of ``options``.

    ``clock`` and ``stop`` are for tests: the clock the time limit is counted on, and a check
    asked at every checkpoint ("baseline", "cpsat") that stops the solve there as Ctrl-C does.
    ``extra_baselines`` (name -> placement, e.g. accelerate's maps) are scored, shown and used as
    hints like the heuristics' plans, so the plan is never worse than them either. ``starts``
    (name -> placement: plans found elsewhere, such as the what-if rows' on fewer of the
    devices) are the same to the search, but are not baselines: the result does not list
    them. ``beat_s``: the time of a plan of another kind (a tensor-parallel mesh's step): where
    the latency objective's lower bound is no less, ``Outpaced`` is raised before any
    placement is tried, as none could beat it."""
    options = replace(options, **fields) if options is not None else SolveOptions(**fields)
    check_memory(problem)
    analytic = None
    if beat_s is not None and options.objective == Objective.LATENCY:
        analytic = lower_bound_s(problem, options.objective)
        if analytic >= beat_s:
            raise Outpaced(f"no placement can beat {beat_s:.6g} s: every one takes at least "
                           f"{analytic:.6g} s (the lower bound)", bound_s=analytic,
                           beat_s=beat_s)
    budget = Budget(options, clock=clock, stop=stop)
    display.solving(None if options.deterministic else budget.remaining_s())
    if problem.launchers and options.objective == Objective.LATENCY:
        budget.keep_for_moves(LAUNCHER_MOVES_SHARE)
    state, interrupted = _start(problem, options, budget, extra_baselines, analytic)
    _add_starts(state, starts or {})
    display.solver(state.best[1].objective_s(options.objective) if state.best else None,
                   state.bound)
    if interrupted:
        if state.best is None:
            raise KeyboardInterrupt
        return _interrupted(state, state.best[1], state.best[0])
    if options.solver != "cpsat":
        return _heuristic(state)
    if state.best is not None and (state.best[1].objective_s(options.objective)
                                   <= state.bound * (1 + 1e-12)):
        return _baseline_at_bound(state)
    if len(problem.graph.nodes) > coarse_nodes(options):
        return _solve_large(state)
    return _solve_exact(state, node_activation_bytes(problem))


def coarse_nodes(options: SolveOptions) -> int:
    """The largest graph CP-SAT solves whole: ``max_nodes``, within the exact model's limit."""
    limit = EXACT_MAX_NODES[options.objective]
    return limit if options.max_nodes is None else min(options.max_nodes, limit)


def _start(problem: Problem, options: SolveOptions, budget: Budget,
           extra: Mapping[str, Placement] | None = None, analytic: float | None = None
           ) -> tuple[_SolveState, bool]:
    """Step 1: the baselines and the analytic bound (``analytic``, where the caller has it);
    whether Ctrl-C cut the baselines short."""
    ran = run_within(problem, options, budget, extra=extra)
    if analytic is None:
        analytic = lower_bound_s(problem, options.objective)
    notes: list[str] = []
    if ran.skipped:
        why = "Ctrl-C" if ran.interrupted else "past half the time limit"
        notes.append(f"baselines not run ({why}): " + ", ".join(ran.skipped))
    state = _SolveState(problem=problem, options=options, budget=budget,
                        baselines=ran.schedules, best_single=ran.best_single,
                        best=best_baseline(ran.schedules, options.objective),
                        analytic=analytic, bound=analytic, notes=notes, not_run=ran.not_run,
                        scope={"graph": "folded", "nodes": len(problem.graph.nodes),
                               "folded_nodes": len(problem.graph.nodes)})
    return state, ran.interrupted


def _add_starts(state: _SolveState, starts: Mapping[str, Placement]) -> None:
    """Simulate ``starts`` on the problem; the best acceptable one becomes the plan to beat (and
    CP-SAT's hint) where it beats the best baseline."""
    objective = state.objective
    for name, placement in starts.items():
        schedule = simulate(state.problem, placement)
        if not state.acceptable(schedule):
            continue
        state.starts[name] = schedule
        if state.best is None or (schedule.objective_s(objective)
                                  < state.best[1].objective_s(objective) * (1 - 1e-9)):
            state.best = (name, schedule)  # ties (to rounding) keep the baseline


def _kind(state: _SolveState, name: str) -> str:
    return "baseline" if name in state.baselines else "plan"


def _heuristic(state: _SolveState) -> SolveResult:
    """Step 2: the named heuristic's plan. (Its result carries no notes.)"""
    solver, contiguous = state.options.solver, state.options.contiguous
    chosen = state.baselines.get(solver)
    if solver in state.not_run:
        raise InfeasibleError(f"the {solver} heuristic does not run on this graph: "
                              f"{state.not_run[solver]}; try --solver cpsat")
    if chosen is None or not chosen.feasible:
        raise InfeasibleError(
            f"the {solver} heuristic found no placement within memory"
            f"{' that is contiguous' if contiguous else ''}; try --solver cpsat")
    info = state.info(solver, "HEURISTIC", chosen.objective_s(state.objective))
    return replace(state.result(chosen, info), notes=())


def _baseline_at_bound(state: _SolveState) -> SolveResult:
    """Step 3: a baseline meets the lower bound: it is optimal, and CP-SAT cannot improve on
    it."""
    assert state.best is not None
    name, schedule = state.best
    info = state.info(name, "OPTIMAL", schedule.objective_s(state.objective))
    state.notes.append(f"the {name} {_kind(state, name)} meets the lower bound, so it is "
                       "optimal; CP-SAT was not needed")
    return state.result(schedule, info)


@dataclass
class _Rounds:
    """What the CP-SAT rounds of the exact model found: the last round's status and objective,
    the first plan the simulator accepted, the no-goods cut, the progress of every round."""

    status: str = "NOT_RUN"
    cp_objective: float | None = None
    schedule: Schedule | None = None
    interrupted: bool = False
    nogoods: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    progress: list[tuple[float, float | None, float]] = field(default_factory=list)


def _solve_exact(state: _SolveState, activation: Mapping[str, int],
                 steps: tuple[tuple[str, float], ...] = ()) -> SolveResult:
    """Step 4: CP-SAT on the whole graph, then the better of its plan and the best baseline
    (or, after a coarse warm start, the best plan so far)."""
    rounds = _cpsat_rounds(state, activation)
    _check_bound(state, rounds)
    wall_s = state.budget.elapsed_s()
    chosen, name = _choose(state, rounds)
    if rounds.interrupted:
        return _interrupted(state, chosen, name, progress=tuple(rounds.progress),
                            cp_objective=rounds.cp_objective, steps=steps)
    if state.budget.moves_share:
        starts = {name: chosen}
        if rounds.schedule is not None and rounds.schedule.feasible:
            starts.setdefault("cpsat", rounds.schedule)
        if state.best is not None:
            starts.setdefault(*state.best)
        chosen, name, stopped = _launcher_moves(state, starts)
        if stopped:
            return _interrupted(state, chosen, name, progress=tuple(rounds.progress),
                                cp_objective=rounds.cp_objective, steps=steps)
        _check_bound(state, rounds, chosen)
    if steps:
        steps = (*steps, ("CP-SAT on the full graph", chosen.objective_s(state.objective)))
    status = rounds.status
    if status == "OPTIMAL" and rounds.cp_objective is not None and (
            chosen.objective_s(state.objective) > rounds.cp_objective * (1 + 1e-6) + 1e-12):
        # CP-SAT's model is exact for the simulator except where a launcher serialises the
        # launches (it keeps only their bound): optimal there is not optimal here.
        status = "FEASIBLE"
        state.notes.append("CP-SAT's model bounds the launcher's segment calls and handovers "
                           "but does not schedule them; its OPTIMAL is for that model, so the "
                           "plan is FEASIBLE, with the gap to its bound")
    info = SolverRecord(name=name, status=status, wall_s=wall_s,
                        objective_s=rounds.cp_objective, time_limit_s=state.options.time_limit_s,
                        progress=tuple(rounds.progress), steps=steps)
    return state.result(chosen, info)


def _launcher_moves(state: _SolveState,
                    starts: Mapping[str, Schedule]) -> tuple[Schedule, str, bool]:
    """Local moves scored by the simulator from each of ``starts`` (the chosen plan first, then
    CP-SAT's and the best baseline's), in the share of the limit kept for them: CP-SAT bounds
    the launcher's calls and handovers but does not schedule them, so a plan it ranks lower
    may refine to a better one. Returns the best, its name, and whether Ctrl-C stopped the
    moves."""
    budget, objective = state.budget, state.objective
    evaluations = budget.moves_evaluations(len(state.problem.graph.nodes))
    name, chosen = next(iter(starts.items()))
    best, best_name, stopped = chosen, name, False
    for start_name, start in starts.items():
        try:
            moved, moves = improve(
                state.problem, start, objective=objective, deadline=budget.moves_deadline(),
                max_evaluations=None if evaluations is None else evaluations // len(starts),
                accept=state.acceptable, clock=budget.clock)
        except KeyboardInterrupt:
            stopped = True
            break
        if moves and moved.objective_s(objective) < best.objective_s(objective) * (1 - 1e-12):
            best, best_name = moved, f"{start_name} + local moves"
    if best is not chosen:
        state.notes.append(f"local moves on the launcher's copies took the plan from "
                           f"{chosen.objective_s(objective):.6g} s ({name}) to "
                           f"{best.objective_s(objective):.6g} s ({best_name})")
    return best, best_name, stopped


def _cpsat_rounds(state: _SolveState, activation: Mapping[str, int]) -> _Rounds:
    """Up to ``MEMORY_ROUNDS`` CP-SAT runs: each plan the simulator finds overflowing a device
    is cut off (``_cut_overflow``) and CP-SAT runs again."""
    problem, options, budget = state.problem, state.options, state.budget
    rounds = _Rounds()
    for round_ in range(MEMORY_ROUNDS):
        limit_s = budget.exact_round_s()
        if limit_s is None:
            break
        result = solve_cpsat(problem, time_limit_s=limit_s, objective=options.objective,
                             contiguous=options.contiguous,
                             hint=state.best[1] if state.best else None,
                             activation_bytes=activation, nogoods=rounds.nogoods,
                             workers=options.cpsat_workers, seed=options.seed,
                             deterministic=options.deterministic,
                             known_bound_s=state.analytic,
                             stop=lambda: budget.stop_requested("cpsat"))
        rounds.status, rounds.cp_objective = result.status, result.objective_s
        rounds.interrupted = result.interrupted
        offset = budget.elapsed_s() - result.wall_s
        rounds.progress.extend((offset + t, obj, b) for t, obj, b in result.progress)
        if round_ == 0:
            _first_round(state, result)
        if result.placement is None:
            break
        candidate = simulate(problem, result.placement)
        if candidate.feasible:
            rounds.schedule = candidate
            break
        if rounds.interrupted:
            break
        _cut_overflow(state, rounds, result.placement, candidate)
    return rounds


def _first_round(state: _SolveState, result: CpSatResult) -> None:
    """Only the uncut model's bound holds for the real problem. INFEASIBLE there is a proof:
    every device must hold its parameters and any one node's working set."""
    if result.placement is not None:
        state.bound = max(state.bound, result.bound_s)
    elif result.status == "TOO_LARGE":
        _say_too_large(state, result, len(state.problem.graph.nodes))
    elif result.status == "INFEASIBLE" and state.best is not None:
        state.notes.append("CP-SAT reported INFEASIBLE although the "
                           f"{state.best[0]} baseline fits: a solver fault; the plan is the "
                           "best baseline")
    elif result.status == "INFEASIBLE":
        raise InfeasibleError(
            "no placement fits: the parameters can be split only in ways that overflow "
            "some device once activations are counted"
            f"{' (with contiguous stages)' if state.options.contiguous else ''}; add devices "
            "or use larger ones")


def _say_too_large(state: _SolveState, result: CpSatResult, nodes: int) -> None:
    """The note for a CP-SAT model not built (``cpsat.MAX_DELAY_TERMS``)."""
    state.notes.append(
        f"CP-SAT not run: its model of {nodes} nodes on {len(state.problem.cluster.devices)} "
        f"devices would hold {result.delay_terms} transfer delays (each edge by each pair of "
        f"devices its ends may run on), over {MAX_DELAY_TERMS}; the plan is the heuristics' "
        "best, and the bound the analytic one")


def _cut_overflow(state: _SolveState, rounds: _Rounds, placement: Placement,
                  simulated: Schedule) -> None:
    """A no-good for every device the simulator found overflowing under ``placement``."""
    device_of = placement.device_of
    for dev in simulated.over_capacity:
        rounds.nogoods.append((dev, frozenset(n for n, d in device_of.items() if d == dev)))
    state.notes.append(f"CP-SAT plan overflowed {sorted(simulated.over_capacity)} once "
                       "activations were simulated; re-solved with those node sets cut off")


def _check_bound(state: _SolveState, rounds: _Rounds, *also: Schedule) -> None:
    """A bound above a schedule the simulator accepts is wrong; keep only the analytic one."""
    feasible = [s.objective_s(state.objective)
                for s in (*state.baselines.values(), *state.starts.values(), rounds.schedule,
                          *also)
                if s is not None and s.feasible]
    if feasible and state.bound > min(feasible) * (1 + 1e-9) + 1e-12:
        state.notes.append(f"CP-SAT reported a lower bound ({state.bound:.6g} s) above a "
                           f"feasible plan ({min(feasible):.6g} s); it was discarded")
        state.bound = state.analytic
        rounds.status = "FEASIBLE" if rounds.status == "OPTIMAL" else rounds.status


def _choose(state: _SolveState, rounds: _Rounds) -> tuple[Schedule, str]:
    """CP-SAT's plan unless the best baseline is better; the solver's name for the result."""
    best, objective = state.best, state.objective
    time_limit_s = state.options.time_limit_s
    cpsat = rounds.schedule
    if cpsat is not None and (
            best is None or cpsat.objective_s(objective) <= best[1].objective_s(objective)):
        return cpsat, "cpsat"
    if best is not None:
        if not rounds.interrupted:
            what = best[0] if best[0] in state.baselines else f"{best[0]} plan"
            state.notes.append(f"CP-SAT ({rounds.status}) did not improve on the {what} "
                               f"{'baseline ' if best[0] in state.baselines else ''}within "
                               f"{time_limit_s:g} s; the plan is the {best[0]} placement")
        return best[1], f"cpsat ({best[0]} kept)"
    if rounds.interrupted:
        raise KeyboardInterrupt
    if rounds.nogoods:
        raise InfeasibleError(
            "no placement within memory was found: every heuristic overflowed a device, and "
            f"CP-SAT's plans overflowed {sorted({d for d, _ in rounds.nogoods})} once "
            f"activations were simulated ({len(rounds.nogoods)} cuts in {time_limit_s:g} s); "
            "raise --time-limit, or add devices or larger ones")
    raise InfeasibleError(
        "no placement within memory was found: CP-SAT returned "
        f"{rounds.status} within {time_limit_s:g} s and every heuristic overflowed a device; "
        "raise --time-limit, or add devices")


def _solve_large(state: _SolveState) -> SolveResult:
    """Step 5: coarsen, CP-SAT, expand (``large.coarse_solve``); then, where the exact model
    takes the full graph, CP-SAT on it warm-started with the best plan so far
    (``_solve_exact``), else ``_refine_large``. Every step is scored by the simulator on the
    full graph; CP-SAT's bound on a coarsened graph is no bound of the full one."""
    problem, options, budget, best = state.problem, state.options, state.budget, state.best
    steps: list[tuple[str, float]] = []
    if best is not None:
        steps.append((f"best {_kind(state, best[0])} ({best[0]})",
                      best[1].objective_s(state.objective)))
    fine = len(problem.graph.nodes) <= EXACT_MAX_NODES[options.objective]
    limit_s = budget.warm_start_s() if fine else budget.coarse_solve_s()
    try:
        large = coarse_solve(problem, max_nodes=coarse_nodes(options),
                             objective=options.objective,
                             contiguous=options.contiguous, hint=best[1] if best else None,
                             time_limit_s=limit_s, known_bound_s=state.bound,
                             seed=options.seed,
                             workers=options.cpsat_workers, deterministic=options.deterministic,
                             stop=lambda: budget.stop_requested("cpsat"))
    except KeyboardInterrupt:
        if best is None:
            raise
        return _interrupted(state, best[1], best[0], steps=tuple(steps))
    state.coarsening = large.coarsening
    if large.cpsat is not None and large.cpsat.status == "TOO_LARGE":
        _say_too_large(state, large.cpsat, large.coarse_nodes)
    candidates = [s for s in (large.schedule, best[1] if best else None) if state.acceptable(s)]
    if not candidates:
        raise InfeasibleError(
            "no placement within memory was found: every heuristic overflowed a device and "
            f"CP-SAT on the coarsened graph returned {large.cpsat.status if large.cpsat else '-'}"
            f" in {options.time_limit_s:g} s; raise --time-limit, or add devices")
    steps += large.steps
    start = min(candidates, key=lambda s: s.objective_s(state.objective))
    cp = large.cpsat
    coarse_scope = {"graph": "coarsened", "nodes": large.coarse_nodes,
                    "status": cp.status if cp is not None else "NOT_RUN"}
    if cp is not None and cp.interrupted:
        state.scope.update(coarse_scope)
        return _interrupted(state, start, "cpsat (coarsened)", progress=cp.progress,
                            cp_objective=cp.objective_s, steps=tuple(steps))
    if fine:
        if best is None or start is not best[1]:
            state.best = (f"CP-SAT on {large.coarse_nodes} coarse nodes", start)
        return _solve_exact(state, node_activation_bytes(problem), steps=tuple(steps))
    state.scope.update(coarse_scope)
    return _refine_large(state, start, steps, cp)


def _refine_large(state: _SolveState, start: Schedule, steps: list[tuple[str, float]],
                  cp: CpSatResult | None) -> SolveResult:
    """Local moves on the full graph from ``start`` (``large.improve``): until the budget's
    deadline, or, when deterministic, for a number of simulations."""
    problem, objective, budget = state.problem, state.objective, state.budget
    try:
        chosen, moves = improve(
            problem, start, objective=objective, deadline=budget.moves_deadline(),
            max_evaluations=budget.moves_evaluations(len(problem.graph.nodes)),
            accept=state.acceptable, clock=budget.clock)
    except KeyboardInterrupt:
        return _interrupted(state, start, "cpsat (coarsened)", steps=tuple(steps))
    steps.append((f"local moves on the full graph ({moves} kept)", chosen.objective_s(objective)))
    state.notes.append(f"{len(problem.graph.nodes)} nodes are more than CP-SAT solves whole "
                       f"({coarse_nodes(state.options)}, --max-nodes): " + "; ".join(
                           f"{step}: {value:.6g} s" for step, value in steps))
    # The coarse model's status says nothing about the full graph: the plan is proven optimal
    # only when it meets the full graph's lower bound.
    proven = chosen.objective_s(objective) <= state.bound * (1 + 1e-9)
    info = state.info("cpsat (coarsened) + local moves", "OPTIMAL" if proven else "FEASIBLE",
                      cp.objective_s if cp is not None else None,
                      progress=cp.progress if cp is not None else (), steps=tuple(steps))
    return state.result(chosen, info)


def _interrupted(state: _SolveState, chosen: Schedule, name: str, *, progress: tuple = (),
                 cp_objective: float | None = None, steps: tuple = ()) -> SolveResult:
    """The best plan found before Ctrl-C, marked as such (status ``INTERRUPTED``)."""
    wall_s = state.budget.elapsed_s()
    optimal = chosen.objective_s(state.objective) <= state.bound * (1 + 1e-9)
    state.notes.append(f"interrupted (Ctrl-C) after {wall_s:.1f} s: the plan ({name}) is the "
                       "best found so far"
                       + (", and it meets the lower bound: optimal" if optimal else ""))
    info = SolverRecord(name=name, status="INTERRUPTED", wall_s=wall_s,
                        objective_s=cp_objective, time_limit_s=state.options.time_limit_s,
                        progress=progress, steps=steps)
    return state.result(chosen, info)
