"""What every pipeline makes of a solve: the ``--min-gain`` policy applied (``min_gain``), the
``Plan`` of a solve's result (``plan_of``), and, with pins, the plan without them
(``unpinned_record``). The op-level, module-level and task-graph pipelines all use these."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import replace

from autoplace.formats.plan import BaselineResult, Plan
from autoplace.formats.records import Coarsening, MinGain, PinsRecord
from autoplace.ir import Placement, Problem
from autoplace.progress import phase
from autoplace.solve import SolveOptions, SolveResult, solve
from autoplace.solve.baselines import prefer_single, split_gain
from autoplace.solve.baselines.accelerate import AccelerateMap, baselines_on
from autoplace.solve.pins import Pins

__all__ = ["min_gain", "plan_of", "unpinned_record"]


def min_gain(result: SolveResult, threshold: float) -> tuple[SolveResult, MinGain]:
    """The ``--min-gain`` policy (``baselines.prefer_single``) applied to a solve's result, and
    the record ``plan.json`` keeps of it."""
    chosen, why = prefer_single(result.schedule, result.baselines, result.objective, threshold)
    record = MinGain(threshold=threshold, single_device_chosen=why is not None, reason=why,
                     split_devices=len(set(result.schedule.placement.device_of.values())),
                     split_gain=split_gain(result.schedule, result.baselines, result.objective))
    if why is None:
        return result, record
    return replace(result, schedule=chosen, notes=(*result.notes, why)), record


def plan_of(result: SolveResult, problem: Problem, *, name: str, tracer: str,
            coarsening: Coarsening, budget_s: float | None = None,
            whatif_s: float | None = None) -> Plan:
    """The ``Plan`` of ``result``, a solve of ``problem`` given ``budget_s`` (of which the
    what-if rows took ``whatif_s`` first)."""
    return Plan(
        problem=problem,
        schedule=result.schedule,
        lower_bound_s=result.lower_bound_s,
        solver=replace(result.solver, budget_s=budget_s, whatif_s=whatif_s),
        baselines={k: BaselineResult.of(v) for k, v in result.baselines.items()}
        | {k: BaselineResult.of(None, not_run=why) for k, why in result.not_run.items()},
        best_single_device=result.best_single_device,
        model=name,
        objective=result.objective,
        contiguous=result.contiguous,
        tracer=tracer,
        coarsening=coarsening,
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )


def unpinned_record(pins: Pins, free: Problem, maps: Sequence[AccelerateMap],
                    options: SolveOptions, threshold: float,
                    starts: Mapping[str, Placement] | None = None) -> PinsRecord:
    """``plan.json``'s ``pins`` record: the ``pins`` and the plan the model gets without them
    (``free``, solved with the same options, accelerate's ``maps`` and ``--min-gain``, from
    ``starts``), which ``Plan.pins_cost_s`` compares the pinned plan with."""
    extra, _ = baselines_on(free, maps)
    phase("the plan without the pins")
    unpinned, _ = min_gain(solve(free, options=options, extra_baselines=extra, starts=starts),
                           threshold)
    return PinsRecord(modules=dict(pins.modules), ops=len(pins.device_of_op),
                      unpinned_makespan_s=unpinned.schedule.makespan_s,
                      unpinned_objective_s=unpinned.objective_s)
