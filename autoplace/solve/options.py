"""How a solve is configured (``SolveOptions``) and how its time limit is shared out (``Budget``).

Read in order: the constants that split the time limit, each with its reason; ``SolveOptions``,
the frozen settings of one solve; ``Budget``, made once per solve from the options, which hands
every stage its deadline or its CP-SAT limit.

Two clocks exist. In wall mode the limit is in seconds of the ``clock`` (``time.perf_counter``)
and a stage is given what is left when it starts. With ``deterministic`` nothing may depend on the
machine's speed: no stage is cut short by the clock, CP-SAT is given fixed shares of the limit in
its own deterministic seconds (a work count), and the local moves a number of simulations.

A test injects the ``clock`` and a ``stop`` check (Ctrl-C at a named point) to exercise the
deadlines and the interruptions without real time passing; in real use Ctrl-C (SIGINT) does it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from autoplace.config.defaults import DEFAULT_TIME_LIMIT_S
from autoplace.errors import AutoplaceError
from autoplace.solve.registry import OBJECTIVES, get_solver

__all__ = [
    "BASELINE_SHARE",
    "DEFAULT_TIME_LIMIT_S",
    "MEMORY_ROUNDS",
    "Budget",
    "Clock",
    "SolveOptions",
    "StopCheck",
]

# MODULE_TIME_LIMIT_S (--granularity module, pipeline/modules.py): the module graph has tens of
# nodes (a layer, an embedding, a head each), which CP-SAT proves optimal well inside a second,
# and a device_map is asked for interactively.

# --- How the time limit is shared (wall mode unless said otherwise)
# The baselines may use half the limit at most: the rest is CP-SAT's, which improves on them.
# Once past it the remaining heuristics are skipped (the slow list schedulers come last).
BASELINE_SHARE = 0.5
# CP-SAT runs at most this many times: each later run cuts off a node set the simulator found
# overflowing a device. When deterministic, each run gets this fraction of the limit (in
# deterministic seconds), so the rounds together never exceed it.
MEMORY_ROUNDS = 3
# Kept back from CP-SAT in each exact round, to simulate and compare its plan within the limit.
RESULT_MARGIN_S = 0.1
# A CP-SAT call given less than this finds nothing worth the call: an exact round is not started,
# and the coarsened model gets at least this.
MIN_CPSAT_S = 0.05
# Large graphs: CP-SAT on the coarsened graph gets this share of what remains, the local moves on
# the full graph the rest. When deterministic, it gets 1 / COARSE_PARTS of the limit instead.
COARSE_SHARE = 0.6
COARSE_PARTS = 2
# When the full graph is small enough for the exact model, the coarse solve is only its warm
# start: it gets this share of what remains (when deterministic, of the limit), the exact model
# on the full graph the rest. Coarse models of the examples solve to optimality in well under it.
WARM_START_SHARE = 0.25
# The local moves end by this share of the limit, less a margin for what follows them (the
# result, the notes), so the solve as a whole stays within the limit.
MOVES_SHARE = 0.99
MOVES_MARGIN_S = 0.2
# When deterministic the local moves are counted in simulations, not seconds: a simulation costs
# about 0.1 ms a node, so 5000 simulations per node-second take about half the limit
# (0.5 / 1e-4), and at least MIN_MOVES are tried.
MOVES_PER_NODE_S = 5000
MIN_MOVES = 10
# Where a launcher runs the GPUs' work (``ir.HostCosts``), CP-SAT bounds its segment calls and
# handovers but does not schedule them, so its plan is refined by local moves scored by the
# simulator: the exact rounds leave them this share of the limit. (On Inception, 2xA100-40GB,
# deterministic, the first moves took its plan from 374.8 to 338.5 us in six simulations.)
LAUNCHER_MOVES_SHARE = 0.1

Clock = Callable[[], float]
# Asked at every checkpoint with its name ("baseline": before each heuristic; "cpsat": at each
# improvement CP-SAT reports); True stops the solve there as Ctrl-C would.
StopCheck = Callable[[str], bool]


@dataclass(frozen=True, kw_only=True)
class SolveOptions:
    """The settings of one solve.

    ``objective``: ``latency`` (the makespan of one pass) or ``throughput`` (the busiest device's
    load per pass, for pipelined execution). ``contiguous`` makes every device's node set a
    pipeline stage. ``deterministic`` gives the same plan for the same input on every run: one
    CP-SAT worker and a budget in CP-SAT's deterministic seconds instead of wall seconds.
    ``workers``: CP-SAT's worker threads (``None``: up to 8, one per core). ``solver``: ``cpsat``
    or the name of a baseline heuristic, whose plan is then returned as it is. ``max_nodes``:
    the largest graph CP-SAT solves whole; a larger one is coarsened to this size for CP-SAT and
    refined on the full graph (``None``: the exact model's own limit, ``EXACT_MAX_NODES``)."""

    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    seed: int = 0
    deterministic: bool = False
    objective: str = "latency"
    contiguous: bool = False
    workers: int | None = None
    solver: str = "cpsat"
    max_nodes: int | None = None

    def __post_init__(self) -> None:
        if self.time_limit_s <= 0:
            raise AutoplaceError(f"time limit must be positive, got {self.time_limit_s} s")
        if self.max_nodes is not None and self.max_nodes < 2:
            raise AutoplaceError(f"max_nodes must be at least 2, got {self.max_nodes}")
        get_solver(self.solver)
        if self.objective not in OBJECTIVES:
            raise AutoplaceError(f"unknown objective {self.objective!r}; valid objectives: "
                                 f"{', '.join(OBJECTIVES)}")

    @property
    def cpsat_workers(self) -> int | None:
        """One worker when deterministic: several race, and which wins depends on the machine."""
        return 1 if self.deterministic else self.workers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Budget:
    """The one time limit of a solve, handing out deadlines (``clock`` values) and CP-SAT limits
    to the stages. Made once per solve; ``began`` is when it was made."""

    def __init__(self, options: SolveOptions, *, clock: Clock = time.perf_counter,
                 stop: StopCheck | None = None) -> None:
        self.time_limit_s = options.time_limit_s
        self.deterministic = options.deterministic
        self.clock = clock
        self._stop = stop
        self.began = clock()
        self.moves_share = 0.0  # of the limit kept from the exact rounds for local moves

    def keep_for_moves(self, share: float) -> None:
        """Keep ``share`` of the limit from CP-SAT's exact rounds for local moves after them."""
        self.moves_share = share

    # --- the clock
    def elapsed_s(self) -> float:
        return self.clock() - self.began

    def remaining_s(self) -> float:
        return self.began + self.time_limit_s - self.clock()

    def deadline_for(self, share: float, *, margin_s: float = 0.0) -> float:
        """When a stage given ``share`` of the limit (less ``margin_s``) must end; never when
        deterministic, where which stages run may not depend on the machine's speed."""
        if self.deterministic:
            return math.inf
        return self.began + self.time_limit_s * share - margin_s

    def expired(self, deadline: float) -> bool:
        return self.clock() > deadline

    # --- Ctrl-C
    def stop_requested(self, stage: str) -> bool:
        """Whether the injected ``stop`` check asks to stop at this checkpoint of ``stage``."""
        return self._stop is not None and self._stop(stage)

    def checkpoint(self, stage: str) -> None:
        """Raise ``KeyboardInterrupt`` where the ``stop`` check asks to: the stage then handles
        it as it handles Ctrl-C."""
        if self.stop_requested(stage):
            raise KeyboardInterrupt

    # --- what each stage gets
    def baselines_deadline(self) -> float:
        return self.deadline_for(BASELINE_SHARE)

    def exact_round_s(self) -> float | None:
        """CP-SAT's limit for one round of the exact model; ``None`` when too little is left to
        start one."""
        kept_s = self.moves_share * self.time_limit_s
        if self.deterministic:
            return (self.time_limit_s - kept_s) / MEMORY_ROUNDS
        limit_s = self.remaining_s() - RESULT_MARGIN_S - kept_s
        return limit_s if limit_s > MIN_CPSAT_S else None

    def coarse_solve_s(self) -> float:
        """CP-SAT's limit for the coarsened model of a large graph."""
        if self.deterministic:
            return self.time_limit_s / COARSE_PARTS
        return max(MIN_CPSAT_S, self.remaining_s() * COARSE_SHARE)

    def warm_start_s(self) -> float:
        """CP-SAT's limit for the coarsened model when the full graph is solved after it."""
        base_s = self.time_limit_s if self.deterministic else self.remaining_s()
        return max(MIN_CPSAT_S, base_s * WARM_START_SHARE)

    def moves_deadline(self) -> float:
        return self.deadline_for(MOVES_SHARE, margin_s=MOVES_MARGIN_S)

    def moves_evaluations(self, nodes: int) -> int | None:
        """When deterministic, how many simulations the local moves may run on a graph of
        ``nodes`` nodes; ``None`` otherwise (the deadline decides)."""
        if not self.deterministic:
            return None
        return max(MIN_MOVES, int(MOVES_PER_NODE_S * self.time_limit_s / nodes))
