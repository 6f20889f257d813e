"""The stages of an inference plan (``InferenceStages``): one forward pass traced, costed and
folded, solved beside accelerate's maps and the what-if rows on fewer devices (``solve``),
recorded as a ``Plan`` with its pins (``record``), and emitted as placed (``emitting``).
``pipeline.plan`` runs these in order; ``training.py`` has the same stages for a step."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from autoplace.config import Config
from autoplace.formats.plan import Plan
from autoplace.formats.records import Coarsening, MinGain, PinsRecord
from autoplace.ir import Cluster, Placement, Problem
from autoplace.pipeline.emitting import Emitting
from autoplace.pipeline.forward import Forward, Loaded, Tracing, traced_problem
from autoplace.pipeline.record import min_gain, plan_of, unpinned_record
from autoplace.progress import stage
from autoplace.progress.notes import note_all
from autoplace.solve import SolveResult, solve
from autoplace.solve.baselines.accelerate import accelerate_baselines, on_graph
from autoplace.solve.whatif import FewerDevices, plan_row, solve_after_whatif

__all__ = ["InferenceStages", "Solved"]


@dataclass(frozen=True)
class Solved:
    """A forward pass solved: its ``forward`` problem, the ``result`` after ``--min-gain``
    (``gain``, its record), the what-if rows solved first (``fewer``) and, with pins, the
    ``pins`` record."""

    forward: Forward
    result: SolveResult
    gain: MinGain
    fewer: FewerDevices | None = None
    pins: PinsRecord | None = None

    @property
    def problem(self) -> Problem:
        return self.forward.problem


@dataclass(frozen=True)
class InferenceStages:
    """An inference plan's stages, for ``config``."""

    config: Config

    def solve(self, loaded: Loaded, cluster: Cluster) -> Solved:
        """Stages trace, cost, fold and solve: with the what-if rows, inside the time limit,
        before the plan's solve (which starts from the best of them)."""
        solving = self.config.solving
        forward = traced_problem(loaded.model, loaded.args, loaded.kwargs, cluster,
                                 Tracing.of(self.config))
        problem = forward.problem
        stage("solve")
        extra, maps = accelerate_baselines(loaded.model, forward.graph, problem)
        options, fewer = solving.options(), None
        if solving.whatif:
            solved, fewer = solve_after_whatif(problem, options, extra_baselines=extra)
        else:
            solved = solve(problem, options=options, extra_baselines=extra)
        pins = None
        if forward.pins is not None:  # accelerate's maps, made once, on the unpinned graph too
            pins = unpinned_record(forward.pins, forward.unpinned, maps, options,
                                   solving.min_gain, _carried(forward.unpinned, problem, solved))
        result, gain = min_gain(solved, solving.min_gain)
        return Solved(forward=forward, result=result, gain=gain, fewer=fewer, pins=pins)

    def record(self, solved: Solved) -> Plan:
        """The plan, with its what-if table (none after Ctrl-C: the user wants the plan so far
        now) and pins."""
        result, folded, fewer = solved.result, solved.forward.folded, solved.fewer
        note_all(result.notes)
        planned = plan_of(result, solved.problem, name=self.config.name,
                          tracer=solved.forward.traced.tracer,
                          coarsening=Coarsening(traced_ops=folded.traced_ops,
                                                plan_nodes=len(solved.problem.graph.nodes),
                                                steps=(*folded.steps, *result.coarsening)),
                          budget_s=self.config.solving.time_limit_s,
                          whatif_s=fewer.spent_s if fewer else None)
        scaling = None
        if fewer is not None and result.solver.status != "INTERRUPTED":
            scaling = (*fewer.rows, plan_row(solved.problem, result))
        return replace(planned, whatif=scaling, pins=solved.pins, min_gain=solved.gain)

    def emitting(self, planned: Plan, solved: Solved, loaded: Loaded) -> Emitting:
        """What is emitted: the plan's own graph and placement, checked on the inputs."""
        return Emitting(problem=planned.problem, schedule=planned.schedule,
                        device_of_op=planned.device_of_op, args=loaded.args,
                        kwargs=loaded.kwargs, model=loaded.model,
                        meta_weights=loaded.checkpoint is not None)

    def check(self, planned: Plan, emitted: Any, solved: Solved) -> Plan:
        """Nothing more to check once the outputs are: the plan as it is."""
        return planned


def _carried(onto: Problem, problem: Problem, solved: SolveResult) -> Mapping[str, Placement]:
    """``solved``'s plan of ``problem`` carried onto ``onto``, a folding of the same traced ops
    (each node where most of its ops are, ``accelerate.on_graph``), as a start: a pinned plan
    is a plan without pins too. None where it would put a node where it cannot run."""
    device_of = solved.schedule.placement.device_of
    placement, _ = on_graph(onto, {op: device_of[n.name] for n in problem.graph.nodes
                                   for op in n.ops})
    return {} if placement is None else {"the pinned plan": placement}
