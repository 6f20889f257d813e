"""What if the plan had fewer devices: the makespan on the first 1, 2, ... of the given devices.

Each prefix of the cluster's device list is a smaller ``Problem`` (same graph, the devices and
links among them, their costs) solved again with a short time limit, so a row is the best plan
that quick solve found: an upper bound on what those devices can do. The full device set reuses
the plan itself. A prefix the model does not fit gives ``makespan_s`` ``None`` and the reason.

The rows go into ``plan.json`` as ``whatif`` (``[{"devices", "makespan_s", "objective_s",
"status", "detail", "wall_s"}]``, ``objective_s`` being the value under the plan's objective:
the makespan, or the largest device load) for the report's what-if table.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from autoplace.errors import AutoplaceError
from autoplace.ir import Cluster, Costs, Problem, SharedLink
from autoplace.solve import SolveOptions, SolveResult, solve

__all__ = ["WHATIF_PARTS", "WHATIF_TIME_LIMIT_S", "restrict", "whatif_options", "whatif_table"]

# Per re-solve, at most; the rows are a rough guide, not a second full solve per device count.
WHATIF_TIME_LIMIT_S = 1.0
# ... and at most a tenth of the plan's own limit, so a short solve stays short.
WHATIF_PARTS = 10


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


def whatif_table(
    problem: Problem,
    *,
    full: SolveResult | None = None,
    options: SolveOptions | None = None,
    **fields: Any,
) -> tuple[dict[str, Any], ...]:
    """One row per prefix of ``problem``'s devices, smallest first, each solved with
    ``options`` (``whatif_options`` of the plan's), or with ``SolveOptions`` fields given as
    keywords (``time_limit_s`` defaults to ``WHATIF_TIME_LIMIT_S``). ``full``, the result
    already found for every device, stands in for the last row instead of solving it again."""
    if options is None:
        options = SolveOptions(**{"time_limit_s": WHATIF_TIME_LIMIT_S, **fields})
    elif fields:
        options = replace(options, **fields)
    names = problem.cluster.names
    rows = []
    for k in range(1, len(names) + 1):
        devices = names[:k]
        began = time.perf_counter()
        if k == len(names) and full is not None:
            result, detail = full, "the plan"
        else:
            try:
                result = solve(restrict(problem, devices), options=options)
                detail = ""
            except AutoplaceError as exc:
                rows.append({"devices": list(devices), "makespan_s": None,
                             "status": "INFEASIBLE", "detail": str(exc),
                             "wall_s": time.perf_counter() - began})
                continue
        rows.append({"devices": list(devices), "makespan_s": result.schedule.makespan_s,
                     "objective_s": result.objective_s,
                     "status": result.solver.status, "detail": detail,
                     "wall_s": result.solver.wall_s if result is full
                     else time.perf_counter() - began})
    return tuple(rows)

