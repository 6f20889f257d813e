"""The baselines: every heuristic of ``HEURISTICS``, the best single device and the caller's
``extra`` placements (accelerate's device maps, ``accelerate.py``), each scored by the
simulator. They are the plans CP-SAT must beat, its hints, and the report's comparison rows. A
heuristic that does not apply at this size raises ``NotRun``: it is listed as not run, with why,
not as a placement that does not fit.

Read ``run_baselines`` (the public call) and ``run_within`` (the same within a ``Budget``:
the heuristics still to run once the baselines' share of the time limit has passed, or after
Ctrl-C, are skipped); then ``best_baseline``, and ``prefer_single``, the ``--min-gain`` policy
(a split that gains too little over the best single device is not worth making). A training
plan's recipes written by hand (DDP, FSDP, Megatron-style, FSDP + TP) are read off its meshes
and replica counts in ``recipes.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from autoplace.config.defaults import DEFAULT_MIN_GAIN
from autoplace.ir import Placement, Problem, Schedule
from autoplace.simulate import simulate
from autoplace.solve.baselines.heuristics import NotRun, single_device
from autoplace.solve.baselines.stages import stage_order
from autoplace.solve.options import Budget, SolveOptions
from autoplace.solve.registry import HEURISTICS

__all__ = ["DEFAULT_MIN_GAIN", "Baselines", "best_baseline", "is_contiguous",
           "prefer_single", "run_baselines", "run_within", "split_gain"]


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
    # Deterministic: no deadline, every heuristic runs.
    options = SolveOptions(objective=objective, contiguous=contiguous, deterministic=True)
    ran = run_within(problem, options, Budget(options))
    return ran.schedules, ran.best_single


@dataclass(frozen=True)
class Baselines:
    schedules: dict[str, Schedule | None]
    best_single: str | None
    skipped: tuple[str, ...] = ()  # not run: the deadline passed, or Ctrl-C
    interrupted: bool = False
    not_run: Mapping[str, str] = field(default_factory=dict)  # name -> why it does not apply


def _single_devices(problem: Problem) -> dict[str, Schedule]:
    """Every device that holds the whole model alone, with its simulated plan."""
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
    return singles


def run_within(problem: Problem, options: SolveOptions, budget: Budget, *,
               extra: Mapping[str, Placement] | None = None) -> Baselines:
    """``run_baselines``, skipping the heuristics still to run once the baselines' deadline
    (``Budget.baselines_deadline``) has passed or Ctrl-C was pressed. ``extra`` placements
    (by name) are simulated first: one simulation each, never skipped."""
    objective = options.objective
    singles = _single_devices(problem)
    best_single = min(singles, key=lambda d: singles[d].objective_s(objective), default=None)
    baselines: dict[str, Schedule | None] = {
        "single-device": singles[best_single] if best_single else None}
    for name, placement in (extra or {}).items():
        baselines[name] = (None if options.contiguous
                           and not is_contiguous(problem, placement.device_of)
                           else simulate(problem, placement))
    deadline = budget.baselines_deadline()
    skipped: list[str] = []
    not_run: dict[str, str] = {}
    interrupted = False
    for name, heuristic in HEURISTICS.items():
        if interrupted or budget.expired(deadline):
            skipped.append(name)
            continue
        try:
            budget.checkpoint("baseline")
            placement = heuristic(problem, objective)
            if placement is None or (options.contiguous
                                     and not is_contiguous(problem, placement.device_of)):
                baselines[name] = None
            else:
                baselines[name] = simulate(problem, placement)
        except NotRun as why:
            not_run[name] = str(why)
        except KeyboardInterrupt:
            interrupted = True
            skipped.append(name)
    return Baselines(baselines, best_single, tuple(skipped), interrupted, not_run)


def best_baseline(schedules: Mapping[str, Schedule | None],
         objective: str) -> tuple[str, Schedule] | None:
    """The feasible schedule with the lowest objective, and its name (ties: the first name in
    sorted order)."""
    feasible = [(s.objective_s(objective), name) for name, s in schedules.items()
                if s is not None and s.feasible]
    if not feasible:
        return None
    name = min(feasible)[1]
    schedule = schedules[name]
    assert schedule is not None
    return name, schedule


def prefer_single(schedule: Schedule, schedules: Mapping[str, Schedule | None], objective: str,
                  min_gain: float) -> tuple[Schedule, str | None]:
    """The best single device's schedule instead of ``schedule`` when ``schedule`` splits the
    model across devices and gains less than ``min_gain`` over it, with why; else
    ``schedule`` and ``None``."""
    gain = split_gain(schedule, schedules, objective)
    if gain is None or gain >= min_gain:
        return schedule, None
    single = schedules["single-device"]
    device = next(iter(single.placement.device_of.values()), "?")
    return single, (f"splitting across {len(set(schedule.placement.device_of.values()))} "
                    f"devices ({schedule.objective_s(objective):.6g} s) gains {gain:.1%} over "
                    f"{device} alone ({single.objective_s(objective):.6g} s), less than "
                    f"--min-gain {min_gain:.0%}: the plan is the single device")


def split_gain(schedule: Schedule, schedules: Mapping[str, Schedule | None],
               objective: str) -> float | None:
    """What ``schedule``, split over two or more devices, gains over the best single device
    (0.05: 5% faster); ``None`` when it uses one device or no single device fits."""
    single = schedules.get("single-device")
    split_s = schedule.objective_s(objective)
    if (single is None or not single.feasible
            or len(set(schedule.placement.device_of.values())) < 2):
        return None
    return single.objective_s(objective) / split_s - 1 if split_s > 0 else 0.0
