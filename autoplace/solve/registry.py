"""The solver's names: the heuristic baselines (``HEURISTICS``), the solvers a user may choose
(``SOLVERS``) and the objectives (``OBJECTIVES``).

Read ``HEURISTICS`` first: its order is the order the baselines run in. ``get_solver`` is the one
check of a solver's name (``SolveOptions`` calls it), so the error always lists the valid names.
"""

from __future__ import annotations

from collections.abc import Callable

from autoplace.config.choices import Objective
from autoplace.errors import AutoplaceError
from autoplace.ir import Placement, Problem
from autoplace.solve.baselines.baechi import m_etf, m_sct
from autoplace.solve.baselines.heuristics import heft, sequential_fill
from autoplace.solve.baselines.ideals import ideal_dp
from autoplace.solve.baselines.partition import balanced_fill, contiguous_split
from autoplace.solve.baselines.stages import stage_dp

__all__ = ["HEURISTICS", "OBJECTIVES", "SOLVERS", "get_solver"]

OBJECTIVES = tuple(Objective)
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


def get_solver(name: str) -> str:
    if name not in SOLVERS:
        raise AutoplaceError(f"unknown solver {name!r}; valid solvers: {', '.join(SOLVERS)}")
    return name
