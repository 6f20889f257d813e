"""What if the plan had fewer devices: the makespan on the first 1, 2, ... of the given devices.

Each prefix of the cluster's device list is a smaller ``Problem`` (same graph, those devices, their
links and costs) solved again with a short time limit, so a row is the best plan that quick solve
found: an upper bound on what those devices can do. A prefix the model does not fit gives
``makespan_s`` ``None`` and the reason. Each row's solve starts from the best plan of the rows
before it (a plan on fewer devices is one on more): rows never worsen as devices are added.

``fewer_devices`` solves the rows short of the whole set; the pipeline runs it before the plan's
own solve, within ``WHATIF_SHARE`` of the time limit, and hands the best row's plan to that solve
as a start, so the plan is never worse than a row of its own table, at no time beyond the limit.
``whatif_table`` is every row, the whole set's solved again unless ``full`` (the plan) is given.
Each row is a ``WhatIfRecord`` (``devices``, ``makespan_s``, ``objective_s``: the value under
the plan's objective, ``status``, ``detail``, ``wall_s``): ``plan.json``'s ``whatif``, the
report's table (``docs/concepts.md``, "The what-if table").
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from autoplace.errors import AutoplaceError
from autoplace.formats.records import WhatIfRecord
from autoplace.ir import Cluster, Costs, Placement, Problem, SharedLink
from autoplace.progress import phase
from autoplace.solve import SolveOptions, SolveResult, solve
from autoplace.solve.bounds import check_memory

__all__ = ["WHATIF_PARTS", "WHATIF_SHARE", "WHATIF_TIME_LIMIT_S", "FewerDevices",
           "fewer_devices", "plan_row", "restrict", "solve_after_whatif", "whatif_options",
           "whatif_table"]

# Per re-solve, at most; the rows are a rough guide, not a second full solve per device count.
WHATIF_TIME_LIMIT_S = 1.0
# ... and at most a tenth of the plan's own limit, so a short solve stays short.
WHATIF_PARTS = 10
# ... and all the rows together at most half of it, when they run within the plan's limit;
WHATIF_SHARE = 0.5
# ... but never less than this each (a row still runs its baselines).
MIN_ROW_S = 0.05


def restrict(problem: Problem, devices: tuple[str, ...]) -> Problem:
    """``problem`` on ``devices`` only (a subset of its cluster's devices)."""
    keep = set(devices)
    cluster = problem.cluster
    sub = Cluster(devices=tuple(d for d in cluster.devices if d.name in keep),
                  links=tuple(lk for lk in cluster.links if lk.src in keep and lk.dst in keep),
                  shared=_restricted_shared(cluster, keep))
    costs = Costs(compute_s={node: {d: t for d, t in per_device.items() if d in keep}
                             for node, per_device in problem.costs.compute_s.items()},
                  source=problem.costs.source,
                  host=problem.costs.host and problem.costs.host.restricted(keep))
    return Problem(graph=problem.graph, cluster=sub, costs=costs,
                   pipeline_schedule=problem.pipeline_schedule)


def _restricted_shared(cluster: Cluster, keep: set[str]) -> tuple[SharedLink, ...]:
    """``cluster``'s shared links over the kept devices' pairs (those still crossed)."""
    kept = ((r, tuple((a, b) for a, b in r.pairs if a in keep and b in keep))
            for r in cluster.shared)
    return tuple(replace(r, pairs=pairs) for r, pairs in kept if pairs)


def whatif_options(options: SolveOptions) -> SolveOptions:
    """The plan's own options (so the rows compare like with like), with the short time limit
    of a what-if row."""
    return replace(options,
                   time_limit_s=min(WHATIF_TIME_LIMIT_S, options.time_limit_s / WHATIF_PARTS))


@dataclass(frozen=True)
class FewerDevices:
    """The what-if rows short of the whole device set. ``best``: the name and placement of the
    best row's plan (a plan on every device too), ``None`` where no prefix fits; ``spent_s``:
    the time they take from the plan's limit (their limits' sum when deterministic, else the
    wall time); ``solved``: how many rows a solve ran for (the others' devices cannot hold the
    model); ``interrupted``: Ctrl-C stopped them, the rows after it not run."""

    rows: tuple[WhatIfRecord, ...]
    best: tuple[str, Placement] | None = None
    spent_s: float = 0.0
    solved: int = 0
    interrupted: bool = False


def fewer_devices(problem: Problem, options: SolveOptions, *,
                  within_s: float | None = None) -> FewerDevices:
    """One row per prefix of ``problem``'s devices short of the whole set, smallest first, each
    solved with ``options`` (``whatif_options`` of the plan's) from the best row before it. With
    ``within_s``, each row's limit is also at most an even share of what is left of that
    (``_spent``: by the limits when deterministic, else by the clock), and at least
    ``MIN_ROW_S``."""
    names = problem.cluster.names
    prefixes = [names[:k] for k in range(1, len(names))]
    fits = [_restricted(problem, devices) for devices in prefixes]
    planned = to_solve = sum(sub is not None for sub, _ in fits)
    row_options = options
    rows: list[WhatIfRecord] = []
    best: tuple[str, Placement] | None = None
    best_s = float("inf")
    began, limits_s = time.perf_counter(), 0.0
    for devices, (sub, why) in zip(prefixes, fits):
        row_began = time.perf_counter()
        if sub is None:
            rows.append(WhatIfRecord(devices=devices, makespan_s=None, status="INFEASIBLE",
                                     detail=why or "", wall_s=time.perf_counter() - row_began))
            continue
        if within_s is not None:
            left_s = within_s - _spent(options, began, limits_s)
            row_options = replace(options, time_limit_s=min(
                options.time_limit_s, max(MIN_ROW_S, left_s / to_solve)))
        to_solve -= 1
        limits_s += row_options.time_limit_s
        phase(f"what-if on {len(devices)} of {len(names)} devices")
        try:
            result = solve(sub, options=row_options, starts=dict([best]) if best else None)
        except KeyboardInterrupt:
            return FewerDevices(tuple(rows), best, _spent(options, began, limits_s),
                                planned - to_solve, True)
        except AutoplaceError as exc:  # no plan within memory found in the time
            rows.append(WhatIfRecord(devices=devices, makespan_s=None, status="INFEASIBLE",
                                     detail=str(exc), wall_s=time.perf_counter() - row_began))
            continue
        rows.append(WhatIfRecord(devices=devices, makespan_s=result.schedule.makespan_s,
                                 objective_s=result.objective_s, status=result.solver.status,
                                 wall_s=time.perf_counter() - row_began))
        if result.solver.status == "INTERRUPTED":
            return FewerDevices(tuple(rows), best, _spent(options, began, limits_s),
                                planned - to_solve, True)
        if result.objective_s < best_s:
            best_s = result.objective_s
            best = (f"what-if on {len(devices)} device{'s' if len(devices) > 1 else ''}",
                    result.schedule.placement)
    spent_s = _spent(options, began, limits_s) if planned else 0.0
    return FewerDevices(tuple(rows), best, spent_s, planned)


def _restricted(problem: Problem, devices: tuple[str, ...]) -> tuple[Problem | None, str | None]:
    """``problem`` on ``devices``, or ``None`` and why they cannot hold the model
    (``bounds.check_memory``) or run some node of it (a pin elsewhere)."""
    try:
        sub = restrict(problem, devices)
        check_memory(sub)
    except AutoplaceError as exc:
        return None, str(exc)
    return sub, None


def _spent(options: SolveOptions, began: float, limits_s: float) -> float:
    return limits_s if options.deterministic else time.perf_counter() - began


def plan_row(problem: Problem, full: SolveResult) -> WhatIfRecord:
    """The last row: the plan, on every device of ``problem``."""
    return WhatIfRecord(devices=problem.cluster.names, makespan_s=full.schedule.makespan_s,
                        objective_s=full.objective_s, status=full.solver.status,
                        detail="the plan", wall_s=full.solver.wall_s)


def solve_after_whatif(problem: Problem, options: SolveOptions, *,
                       extra_baselines: Mapping[str, Placement] | None = None,
                       ) -> tuple[SolveResult, FewerDevices]:
    """The what-if rows short of the whole device set (``fewer_devices``, within
    ``WHATIF_SHARE`` of ``options``' limit), then the plan's own solve in the rest of the limit
    (at least the other share), starting from the best row's plan. After Ctrl-C in the rows the
    solve stops at once, with the best plan so far (``INTERRUPTED``). The result's notes say
    what the rows took."""
    limit_s = options.time_limit_s
    fewer = fewer_devices(problem, whatif_options(options), within_s=limit_s * WHATIF_SHARE)
    rest = replace(options, time_limit_s=max(limit_s - fewer.spent_s,
                                             limit_s * (1 - WHATIF_SHARE)))
    phase(f"the plan on {len(problem.cluster.names)} devices")
    result = solve(problem, options=rest, extra_baselines=extra_baselines,
                   starts=dict([fewer.best]) if fewer.best else None,
                   stop=(lambda stage: True) if fewer.interrupted else None)
    if not fewer.solved:
        return result, fewer
    one = len(fewer.rows) == 1
    started = "" if fewer.best is None else (
        f", {'its plan' if one else 'the best of their plans'} ({fewer.best[0]}) among the "
        "solve's starting points")
    rows = "row (the first device)" if one else (
        f"rows (the first 1 to {len(fewer.rows)} devices)")
    note = (f"the what-if {rows} took "
            f"{fewer.spent_s:.2f} s of the {limit_s:g} s time limit; the plan's solve had the "
            f"rest ({rest.time_limit_s:.2f} s){started}")
    return replace(result, notes=(*result.notes, note)), fewer


def whatif_table(
    problem: Problem,
    *,
    full: SolveResult | None = None,
    options: SolveOptions | None = None,
    **fields: Any,
) -> tuple[WhatIfRecord, ...]:
    """Every row, smallest first, each solved with ``options`` (``whatif_options`` of the
    plan's), or with ``SolveOptions`` fields given as keywords (``time_limit_s`` defaults to
    ``WHATIF_TIME_LIMIT_S``). ``full``, the result already found for every device, stands in
    for the last row instead of solving it again."""
    if options is None:
        options = SolveOptions(**{"time_limit_s": WHATIF_TIME_LIMIT_S, **fields})
    elif fields:
        options = replace(options, **fields)
    fewer = fewer_devices(problem, options)
    if fewer.interrupted:  # Ctrl-C after the plan's own solve: nothing is written
        raise KeyboardInterrupt
    if full is not None:
        return (*fewer.rows, plan_row(problem, full))
    began = time.perf_counter()
    try:
        full = solve(problem, options=options, starts=dict([fewer.best]) if fewer.best else None)
    except AutoplaceError as exc:
        return (*fewer.rows, WhatIfRecord(devices=problem.cluster.names, makespan_s=None,
                                          status="INFEASIBLE", detail=str(exc),
                                          wall_s=time.perf_counter() - began))
    return (*fewer.rows, replace(plan_row(problem, full), detail=""))
