"""``Plan``: the result of the pipeline as typed data, its ``plan.json`` form, and the one
reader of that file.

A plan written to JSON can be read back, re-simulated, reported and emitted again without
re-tracing: ``read_plan(dir).problem`` is the exact problem that was solved, and
``read_plan(dir).schedule`` its schedule. The layout is documented by ``plan.schema.json``
beside this module (``SCHEMA_VERSION``).

Read in this order: the records a plan holds (``BaselineResult``, ``SolverRecord``,
``Verification``; its other parts are in ``records``), then ``Plan`` (its fields are data; its
properties derive everything else, each in one place), its JSON form (``to_dict`` /
``from_dict``), and ``read_plan``, which checks a file against the schema (``plan_check``) before
building the plan. Writing a plan with its report and model is the pipeline's job
(``autoplace.pipeline.save``), not this module's.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from autoplace._version import __version__
from autoplace.config.choices import Objective
from autoplace.errors import AutoplaceError, OutputError
from autoplace.formats.plan_check import count_problems, plan_problems
from autoplace.formats.records import (
    Coarsening,
    DeviceMapRecord,
    GenerationRecord,
    MinGain,
    PinsRecord,
    ProfileRecord,
    TensorParallelRecord,
    TrainingRecord,
    WhatIfRecord,
)
from autoplace.ir import (
    Cluster,
    Costs,
    Device,
    Edge,
    HostCosts,
    Link,
    OpGraph,
    OpNode,
    Placement,
    Problem,
    Schedule,
    SharedLink,
    Transfer,
    optimality_gap,
)

__all__ = ["MESH_SOLVER", "NO_FASTER_PLACEMENT", "NO_PLACEMENT_FITS", "PLACEMENT_SLOWER",
           "SCHEMA_VERSION", "BaselineResult", "Plan", "SolverRecord", "Verification",
           "plan_path", "read_plan"]

SCHEMA_VERSION = 1
R = TypeVar("R")


@dataclass(frozen=True)
class BaselineResult:
    """A baseline placement as the simulator scored it: what a plan keeps of its schedule."""

    makespan_s: float | None  # None when the heuristic found no placement at all
    feasible: bool
    peak_bytes: Mapping[str, int] = field(default_factory=dict)
    max_load_s: float | None = None
    not_run: str | None = None  # why the baseline did not run (too large for it), if it did not

    @classmethod
    def of(cls, schedule: Schedule | None, *, not_run: str | None = None) -> BaselineResult:
        if not_run is not None:
            return cls(makespan_s=None, feasible=False, not_run=not_run)
        if schedule is None:
            return cls(makespan_s=None, feasible=False)
        return cls(makespan_s=schedule.makespan_s, feasible=schedule.feasible,
                   peak_bytes=dict(schedule.peak_bytes), max_load_s=schedule.max_load_s)

    def objective_s(self, objective: str) -> float | None:
        return self.max_load_s if objective == Objective.THROUGHPUT else self.makespan_s

    @property
    def fits_text(self) -> str:
        """The report's "fits memory" cell: yes, no, or "not run" for a baseline that did not
        run (it says nothing about memory)."""
        return "not run" if self.not_run is not None else "yes" if self.feasible else "no"

    def to_dict(self) -> dict[str, Any]:
        data = {"makespan_s": self.makespan_s, "max_load_s": self.max_load_s,
                "feasible": self.feasible, "peak_bytes": dict(self.peak_bytes)}
        return data | ({"not_run": self.not_run} if self.not_run is not None else {})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BaselineResult:
        return cls(makespan_s=data.get("makespan_s"), feasible=data.get("feasible", False),
                   peak_bytes=dict(data.get("peak_bytes", {})), max_load_s=data.get("max_load_s"),
                   not_run=data.get("not_run"))


@dataclass(frozen=True)
class SolverRecord:
    """What the solver reported: its name and status, the time it took and was given, its own
    objective before re-simulation, CP-SAT's progress as ``(t_s, objective_s, bound_s)`` and,
    for coarsened graphs, each step as ``(step, objective_s)``. The gap is the plan's.

    ``status`` is of the plan's own graph (``OPTIMAL`` only when proven optimal for it);
    ``scope`` says which graph CP-SAT solved (``{"graph": "folded" | "coarsened", "nodes",
    "folded_nodes"}``, and on a coarsened graph CP-SAT's ``status`` there); ``status_text`` is
    how every summary shows the two. ``solve.solve`` returns this record and the plan keeps it,
    one record from the solver to ``plan.json``."""

    name: str
    status: str
    wall_s: float
    objective_s: float | None = None
    time_limit_s: float | None = None
    progress: tuple[tuple[float, float | None, float], ...] = ()
    steps: tuple[tuple[str, float], ...] = ()
    scope: Mapping[str, Any] | None = None
    # The time limit the plan was given, and what of it the what-if rows took before this solve
    # had the rest (``time_limit_s``); None where the plan did not record them.
    budget_s: float | None = None
    whatif_s: float | None = None

    @property
    def status_text(self) -> str:
        """The status, qualified where CP-SAT solved a coarsened graph: "FEASIBLE (optimal for
        the coarsened graph, 68 nodes)"."""
        scope = self.scope or {}
        if scope.get("graph") != "coarsened":
            return self.status
        coarse = f"the coarsened graph, {scope.get('nodes')} nodes"
        if self.status == "OPTIMAL":
            return f"OPTIMAL (meets the lower bound; CP-SAT solved {coarse})"
        return f"{self.status} ({str(scope.get('status', '')).lower()} for {coarse})"

    def to_dict(self) -> dict[str, Any]:
        data = {"name": self.name, "status": self.status, "wall_s": self.wall_s,
                "objective_s": self.objective_s, "time_limit_s": self.time_limit_s,
                "progress": [{"t_s": t, "objective_s": obj, "bound_s": bound}
                             for t, obj, bound in self.progress],
                "steps": [{"step": step, "objective_s": value} for step, value in self.steps]}
        if self.scope is not None:
            data["scope"] = dict(self.scope)
        data |= {k: v for k, v in (("budget_s", self.budget_s), ("whatif_s", self.whatif_s))
                 if v is not None}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SolverRecord:
        return cls(name=data["name"], status=data["status"], wall_s=data["wall_s"],
                   objective_s=data.get("objective_s"), time_limit_s=data.get("time_limit_s"),
                   progress=tuple((p["t_s"], p["objective_s"], p["bound_s"])
                                  for p in data.get("progress") or ()),
                   steps=tuple((s["step"], s["objective_s"]) for s in data.get("steps") or ()),
                   scope=dict(data["scope"]) if data.get("scope") is not None else None,
                   budget_s=data.get("budget_s"), whatif_s=data.get("whatif_s"))


@dataclass(frozen=True)
class Verification:
    """The emitted model run against the original: ``passed``, ``failed`` or ``skipped``. The one
    record of it, from ``emit.check.outputs.verify`` (its outputs) and ``emit.emit_and_verify``
    (its memory) to ``plan.json``.

    ``peak_bytes`` maps each device to its measured and predicted peak
    (``{"measured_bytes", "predicted_bytes"}``, ``autoplace.emit.check.memory``); ``memory_status``
    is ``within``, ``exceeded`` (recorded with the check off) or ``not measured``."""

    status: str = "skipped"
    detail: str = "not verified"
    max_abs_diff: float | None = None
    memory_status: str = "not measured"
    peak_bytes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    peak_method: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "max_abs_diff": self.max_abs_diff,
                "memory_status": self.memory_status,
                "peak_bytes": {d: dict(v) for d, v in self.peak_bytes.items()},
                "peak_method": self.peak_method}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verification:
        return cls(status=data["status"], detail=data.get("detail", ""),
                   max_abs_diff=data.get("max_abs_diff"),
                   memory_status=data.get("memory_status", "not measured"),
                   peak_bytes={d: dict(v) for d, v in (data.get("peak_bytes") or {}).items()},
                   peak_method=data.get("peak_method"))


# The solver of a plan whose placement is a tensor-parallel mesh's rank 0, no placement having
# fit (``pipeline.mesh.mesh_plan``): no lower bound is proven for it. Its status: ``unplaced``.
MESH_SOLVER = "tensor-parallel mesh"
NO_PLACEMENT_FITS, NO_FASTER_PLACEMENT = "NO_PLACEMENT_FITS", "NO_FASTER_PLACEMENT"
PLACEMENT_SLOWER = "PLACEMENT_SLOWER"


def unplaced(solver: SolverRecord) -> str:
    """Why a mesh is the plan, as its ``solver`` record says: "no placement fits" (none was
    found within memory), "no placement can beat it" where none was solved, each one's lower
    bound no less than the mesh's step (``solve(beat_s=...)``), or "the placement solved is
    slower" (``PLACEMENT_SLOWER``: a training step's, ``pipeline.tensor``)."""
    return {NO_FASTER_PLACEMENT: "no placement can beat it",
            PLACEMENT_SLOWER: "the placement solved is slower"}.get(solver.status,
                                                                   "no placement fits")


@dataclass(frozen=True)
class Plan:
    """A placement with everything needed to check, report and run it.

    The fields are data and round-trip through ``plan.json``; the properties are derived from
    them, here and nowhere else. The partitioned model ``autoplace.plan`` emits is not plan
    data: it is returned beside the plan (``pipeline.Planned``).
    """

    problem: Problem
    schedule: Schedule
    lower_bound_s: float
    solver: SolverRecord
    baselines: Mapping[str, BaselineResult]
    best_single_device: str | None
    model: str = "model"
    objective: str = "latency"
    contiguous: bool = False
    tracer: str = "graph"
    # None (written as ``{}``) where the plan does not say how its graph was made.
    coarsening: Coarsening | None = None
    verification: Verification | None = field(default_factory=Verification)
    notes: tuple[str, ...] = ()
    created: str = ""
    whatif: tuple[WhatIfRecord, ...] | None = None
    profile: ProfileRecord | None = None
    # The --min-gain policy: its threshold, whether it chose the single device, and why.
    min_gain: MinGain | None = None
    # A training plan's step (``autoplace.train``): its optimizer and the training check of the
    # emitted model (``emit.check.training.verify_training``). None for an inference plan.
    training: TrainingRecord | None = None
    # Modules pinned by hand (``autoplace.solve.pins``): the pins, the ops they fixed, and the plan
    # the model gets without them (``unpinned_makespan_s``, ``unpinned_objective_s``).
    pins: PinsRecord | None = None
    # --granularity module: the Hugging Face device_map and accelerate's (pipeline/modules.py)
    device_map: DeviceMapRecord | None = None
    # --tp N: the tensor-parallel candidate beside the placement (``solve.tensor``)
    tensor_parallel: TensorParallelRecord | None = None
    # --generate N: the prefill, the decode step and the cache (``pipeline.generation``)
    generation: GenerationRecord | None = None
    autoplace_version: str = __version__

    # ---- derived

    @property
    def makespan_s(self) -> float:
        return self.schedule.makespan_s

    @property
    def objective_s(self) -> float:
        """The plan's value under its objective: the makespan, or the largest load."""
        return self.schedule.objective_s(self.objective)

    @property
    def gap(self) -> float | None:
        """How far the plan may be from the best placement (``None`` where no bound is proven:
        a plan of a tensor-parallel mesh, ``MESH_SOLVER``)."""
        if self.is_mesh:
            return None
        return optimality_gap(self.objective_s, self.lower_bound_s)

    @property
    def is_mesh(self) -> bool:
        """Whether the plan is a tensor-parallel mesh (``tensor_parallel``), no placement
        having fit: its problem and schedule are rank 0's."""
        return self.solver.name == MESH_SOLVER

    @property
    def unplaced(self) -> str:
        """Why a mesh is the plan (``is_mesh``): ``unplaced``'s words."""
        return unplaced(self.solver)

    @property
    def single_device(self) -> BaselineResult | None:
        """The best single device's result (``best_single_device`` names the device)."""
        return self.baselines.get("single-device")

    @property
    def best_single_makespan_s(self) -> float | None:
        single = self.single_device
        return single.makespan_s if single is not None else None

    def speedup_over(self, baseline: BaselineResult | None) -> float | None:
        """How many times better than ``baseline`` the plan is, under the plan's objective;
        ``None`` when the baseline has no value."""
        value = baseline.objective_s(self.objective) if baseline is not None else None
        if value is None or self.objective_s <= 0:
            return None
        return value / self.objective_s

    @property
    def speedup_over_single(self) -> float | None:
        """How many times better than the best single device, under the plan's objective."""
        return self.speedup_over(self.single_device)

    @property
    def device_of_op(self) -> dict[str, str]:
        """Each traced op's device: the plan expanded back from coarse nodes."""
        device_of = self.schedule.placement.device_of
        return {op: device_of[node.name] for node in self.problem.graph.nodes for op in node.ops}

    @property
    def pins_cost_s(self) -> float | None:
        """What the pins cost under the plan's objective: the pinned plan's value less the
        unpinned plan's (negative where the pinned solve happened on a better plan); ``None``
        without pins."""
        if self.pins is None:
            return None
        return self.objective_s - self.pins.unpinned_objective_s

    def with_verification(self, verification: Verification) -> Plan:
        return replace(self, verification=verification)

    # ---- JSON form

    def to_dict(self) -> dict[str, Any]:
        cluster, s = self.problem.cluster, self.schedule
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "objective": self.objective,
            "tracer": self.tracer,
            "contiguous": self.contiguous,
            "devices": [{"name": d.name, "type": d.type, "memory_bytes": d.memory_bytes,
                         "host": d.host, "torch_device": d.torch_device,
                         "charges_transfers": d.charges_transfers,
                         "reserved_bytes": d.reserved_bytes}
                        for d in cluster.devices],
            "links": [{"src": lk.src, "dst": lk.dst,
                       "bandwidth_bytes_per_s": lk.bandwidth_bytes_per_s,
                       "latency_s": lk.latency_s, "kind": lk.kind} for lk in cluster.links],
            **({"shared": [{"name": r.name, "bandwidth_bytes_per_s": r.bandwidth_bytes_per_s,
                            "pairs": [list(pair) for pair in r.pairs]} for r in cluster.shared]}
               if cluster.shared else {}),
            **_graph_dict(self.problem, s),
            "order": {d: list(seq) for d, seq in (s.placement.order or {}).items()},
            "transfers": [{"src": t.src, "src_device": t.src_device, "dst_device": t.dst_device,
                           "bytes": t.bytes, "start_s": t.start_s, "end_s": t.end_s}
                          for t in s.transfers],
            **_host_dict(self.problem, s),
            "makespan_s": s.makespan_s,
            "max_load_s": s.max_load_s,
            "loads": dict(s.load_s),
            "lower_bound_s": self.lower_bound_s,
            "solver": {**self.solver.to_dict(), "gap": self.gap},
            "baselines": {name: b.to_dict() for name, b in self.baselines.items()},
            "best_single_device": {"device": self.best_single_device,
                                   "makespan_s": self.best_single_makespan_s},
            "speedup_over_single": self.speedup_over_single,
            "memory": {d.name: {"peak_bytes": s.peak_bytes[d.name],
                                "capacity_bytes": d.memory_bytes,
                                "resident_bytes": s.resident_bytes[d.name],
                                "reserved_bytes": d.reserved_bytes,
                                "timeline": [list(p) for p in s.memory_timeline[d.name]]}
                       for d in cluster.devices},
            "coarsening": {} if self.coarsening is None else self.coarsening.to_dict(),
            "notes": list(self.notes),
            "created": self.created or _dt.datetime.now(_dt.UTC).isoformat(),
            "autoplace_version": self.autoplace_version,
        } | ({} if self.verification is None else {"verification": self.verification.to_dict()}) \
          | ({} if self.whatif is None else {"whatif": [row.to_dict() for row in self.whatif]}) \
          | ({} if self.profile is None else {"profile": self.profile.to_dict()}) \
          | ({} if self.min_gain is None else {"min_gain": self.min_gain.to_dict()}) \
          | ({} if self.training is None else {"training": self.training.to_dict()}) \
          | ({} if self.pins is None
             else {"pins": {**self.pins.to_dict(), "cost_s": self.pins_cost_s}}) \
          | ({} if self.device_map is None else {"device_map": self.device_map.to_dict()}) \
          | ({} if self.tensor_parallel is None
             else {"tensor_parallel": self.tensor_parallel.to_dict()}) \
          | ({} if self.generation is None else {"generation": self.generation.to_dict()})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """The plan in ``data`` (a ``plan.json`` dictionary, not checked: ``read_plan``
        checks files). Derived entries (``max_load_s``, ``speedup_over_single``, the solver's
        ``gap``, ...) are not read: the plan derives them again."""
        problem = _problem_from(data)
        verification, coarsening = data.get("verification"), data.get("coarsening")
        best_single = data.get("best_single_device") or {}
        return cls(
            problem=problem, schedule=_schedule_from(data), lower_bound_s=data["lower_bound_s"],
            solver=SolverRecord.from_dict(data["solver"]),
            baselines={name: BaselineResult.from_dict(b)
                       for name, b in data.get("baselines", {}).items()},
            best_single_device=best_single.get("device"),
            model=data.get("model", "model"), objective=data.get("objective", "latency"),
            contiguous=data.get("contiguous", False),
            tracer=data.get("tracer", "graph"),
            coarsening=Coarsening.from_dict(coarsening) if coarsening else None,
            verification=Verification.from_dict(verification) if verification else None,
            notes=tuple(data.get("notes", ())), created=data.get("created", ""),
            whatif=(tuple(WhatIfRecord.from_dict(row) for row in data["whatif"])
                    if "whatif" in data else None),
            profile=_part(ProfileRecord.from_dict, data, "profile"),
            min_gain=_part(MinGain.from_dict, data, "min_gain"),
            training=_part(TrainingRecord.from_dict, data, "training"),
            pins=_part(PinsRecord.from_dict, data, "pins"),  # its derived cost_s is not read
            device_map=_part(DeviceMapRecord.from_dict, data, "device_map"),
            tensor_parallel=_part(TensorParallelRecord.from_dict, data, "tensor_parallel"),
            generation=_part(GenerationRecord.from_dict, data, "generation"),
            autoplace_version=data.get("autoplace_version", __version__),
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """``read_plan(path)``: a checked ``plan.json``, or the directory holding one."""
        return read_plan(path)


def _part(read: Callable[[Mapping[str, Any]], R], data: Mapping[str, Any], key: str) -> R | None:
    """``data[key]`` read (by a record's ``from_dict``), ``None`` where the plan has none."""
    return read(data[key]) if data.get(key) is not None else None


def _graph_dict(problem: Problem, s: Schedule) -> dict[str, Any]:
    """The ``nodes``, ``edges``, ``colocate`` and ``outputs`` entries of ``plan.json``."""
    graph, cluster, costs = problem.graph, problem.cluster, problem.costs
    device_of = s.placement.device_of
    return {
        "nodes": [{
            "name": n.name, "ops": list(n.ops), "targets": list(n.targets),
            "module": n.module, "is_input": n.is_input, "device": device_of[n.name],
            "start_s": s.start_s[n.name], "end_s": s.end_s[n.name],
            # JSON has no infinity: null marks a device the node cannot run on.
            "compute_s": {d: (t if math.isfinite(t) else None)
                          for d, t in costs.compute_s[n.name].items()},
            "memory_bytes": n.param_bytes, "output_bytes": n.output_bytes,
            "view_bytes": n.view_bytes, "trainable_bytes": n.trainable_bytes,
            "workspace_bytes": n.workspace_bytes,
            "output_shapes": [list(x) for x in n.output_shapes],
            "output_dtypes": list(n.output_dtypes), "flops": n.flops,
            "bytes_accessed": n.bytes_accessed, "launches": n.launches, "dtype": n.dtype,
            "cost_source": costs.source_of(n.name, device_of[n.name]),
        } | ({"cost_sources": {d: costs.source_of(n.name, d) for d in cluster.names}}
             if n.name in costs.device_source else {})
          | ({"launch_s": dict(costs.host.launch_s[n.name])}
             if costs.host is not None and n.name in costs.host.launch_s else {})
          for n in graph.nodes],
        "edges": [{"src": e.src, "dst": e.dst, "bytes": e.bytes}
                  | ({} if e.transfer_s is None else {"transfer_s": e.transfer_s})
                  for e in graph.edges],
        "colocate": [list(g) for g in graph.colocate],
        "outputs": list(graph.outputs),
    } | ({} if problem.pipeline_schedule is None
         else {"pipeline_schedule": problem.pipeline_schedule})


def _host_dict(problem: Problem, s: Schedule) -> dict[str, Any]:
    """The ``host`` and ``launch_order`` entries: the launcher threads' costs (nodes carry their
    own ``launch_s``) and the order the emitted program launches the nodes in; none without."""
    host = problem.costs.host
    if host is None:
        return {}
    threads = ({"own_thread": dict(host.own_thread), "switch_s": dict(host.switch_s)}
               if host.own_thread else {})
    return {"host": {"call_s": dict(host.call_s), "handover_s": dict(host.handover_s),
                     **threads},
            "launch_order": list(s.launch_order)}


def _problem_from(data: Mapping[str, Any]) -> Problem:
    devices = tuple(Device(name=d["name"], type=d["type"], memory_bytes=d["memory_bytes"],
                           host=d.get("host", "localhost"),
                           torch_device=d.get("torch_device", ""),
                           charges_transfers=d.get("charges_transfers", True),
                           reserved_bytes=d.get("reserved_bytes", 0))
                    for d in data["devices"])
    links = tuple(Link(src=lk["src"], dst=lk["dst"],
                       bandwidth_bytes_per_s=lk["bandwidth_bytes_per_s"],
                       latency_s=lk["latency_s"], kind=lk.get("kind", ""))
                  for lk in data["links"])
    nodes = tuple(OpNode(
        name=n["name"], ops=tuple(n["ops"]), targets=tuple(n.get("targets", ())),
        module=n.get("module", ""), is_input=n.get("is_input", False),
        output_shapes=tuple(tuple(x) for x in n.get("output_shapes", ())),
        output_dtypes=tuple(n.get("output_dtypes", ())), output_bytes=n["output_bytes"],
        view_bytes=n.get("view_bytes", 0), param_bytes=n["memory_bytes"],
        trainable_bytes=n.get("trainable_bytes", 0),
        workspace_bytes=n.get("workspace_bytes", 0), flops=n.get("flops", 0.0),
        bytes_accessed=n.get("bytes_accessed", 0), launches=n.get("launches", 0),
        dtype=n.get("dtype", "float32"),
    ) for n in data["nodes"])
    graph = OpGraph(nodes=nodes,
                    edges=tuple(Edge(src=e["src"], dst=e["dst"], bytes=e["bytes"],
                                     transfer_s=e.get("transfer_s"))
                                for e in data["edges"]),
                    colocate=tuple(tuple(g) for g in data.get("colocate", ())),
                    outputs=tuple(data.get("outputs", ())), name=data.get("model", "model"))
    costs = Costs(compute_s={n["name"]: {d: math.inf if t is None else t
                                         for d, t in n["compute_s"].items()}
                             for n in data["nodes"]},
                  source={n["name"]: n.get("cost_source", "analytic") for n in data["nodes"]},
                  device_source={n["name"]: dict(n["cost_sources"]) for n in data["nodes"]
                                 if "cost_sources" in n},
                  host=None if "host" not in data else HostCosts(
                      launch_s={n["name"]: dict(n["launch_s"]) for n in data["nodes"]
                                if "launch_s" in n},
                      call_s=dict(data["host"]["call_s"]),
                      handover_s=dict(data["host"]["handover_s"]),
                      own_thread=dict(data["host"].get("own_thread", {})),
                      switch_s=dict(data["host"].get("switch_s", {}))))
    shared = tuple(SharedLink(name=r["name"], bandwidth_bytes_per_s=r["bandwidth_bytes_per_s"],
                              pairs=tuple((a, b) for a, b in r["pairs"]))
                   for r in data.get("shared", ()))
    return Problem(graph=graph, cluster=Cluster(devices=devices, links=links, shared=shared),
                   costs=costs,
                   pipeline_schedule=data.get("pipeline_schedule"))


def _schedule_from(data: Mapping[str, Any]) -> Schedule:
    order = {d: tuple(seq) for d, seq in data.get("order", {}).items()} or None
    memory = data["memory"]
    return Schedule(
        placement=Placement(device_of={n["name"]: n["device"] for n in data["nodes"]},
                            order=order),
        makespan_s=data["makespan_s"],
        start_s={n["name"]: n["start_s"] for n in data["nodes"]},
        end_s={n["name"]: n["end_s"] for n in data["nodes"]},
        transfers=tuple(Transfer(src=t["src"], src_device=t["src_device"],
                                 dst_device=t["dst_device"], bytes=t["bytes"],
                                 start_s=t["start_s"], end_s=t["end_s"])
                        for t in data.get("transfers", ())),
        resident_bytes={d: m["resident_bytes"] for d, m in memory.items()},
        peak_bytes={d: m["peak_bytes"] for d, m in memory.items()},
        memory_timeline={d: tuple(tuple(p) for p in m.get("timeline", ()))
                         for d, m in memory.items()},
        over_capacity={d: m["peak_bytes"] - m["capacity_bytes"] for d, m in memory.items()
                       if m["peak_bytes"] > m["capacity_bytes"]},
        load_s=dict(data.get("loads", {})),
        launch_order=tuple(data.get("launch_order", ())),
    )


# ---- the one reader


def plan_path(path: str | os.PathLike[str]) -> Path:
    """The ``plan.json`` that ``path`` names: itself, or the one in the directory it names."""
    given = Path(path)
    return given / "plan.json" if given.is_dir() else given


def read_plan(path: str | os.PathLike[str]) -> Plan:
    """Read and check ``path`` (a ``plan.json``, or the directory holding one).

    A missing file, a file that is not JSON, a plan the schema (or a cross-reference) rejects
    and a plan this version cannot build each raise ``OutputError`` with one paragraph naming
    the file and what to do.
    """
    where = plan_path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise OutputError(f"no plan file at {str(where)!r}: pass a plan.json written by "
                          "`autoplace plan`, or the directory that holds it") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise OutputError(f"cannot read the plan file {str(where)!r}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OutputError(f"{str(where)!r} is not valid JSON ({exc}); pass a plan.json written "
                          "by `autoplace plan`, or run `autoplace plan` again to rewrite it"
                          ) from exc
    if not isinstance(data, dict):
        raise OutputError(f"{str(where)!r} holds a JSON {type(data).__name__}, not a plan "
                          "object; pass a plan.json written by `autoplace plan`")
    problems = plan_problems(data)
    if problems:
        shown = "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
        raise OutputError(f"{str(where)!r} is not a valid plan ({count_problems(problems)}: "
                          f"{shown}); run `autoplace plan` again to rewrite it")
    try:
        return Plan.from_dict(data)
    except (KeyError, TypeError, ValueError, AutoplaceError) as exc:
        # The schema holds, yet the IR refuses it (an edge that goes backwards, ...).
        raise OutputError(f"{str(where)!r} is not a plan file this version can read "
                          f"({type(exc).__name__}: {exc})") from exc
