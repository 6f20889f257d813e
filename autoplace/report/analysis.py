"""What a report says, worked out from a ``Plan`` alone: the numbers behind every chart and
table, before any of them is drawn. What the plan already derives (its value, gap, speed-ups,
each baseline's result) is read from it, not worked out again.

Read in this order:

* ``overview``: the summary facts (speed-ups, gap, solver, costs, what-if rows, the critical
  path, ``report.advice``'s sentence), the one object that the HTML page, the markdown summary
  and the terminal summary all render.
* ``critical_path``: the chain of nodes and transfers that sets the makespan, walked back from
  the last node to finish; computed once, by ``overview``.
* ``memory_timelines``: bytes in use per device over time.
* ``training_facts`` and ``schedule_blocks``: a training plan's step (optimizer, micro-batches,
  schedule, replicas) and its schedule as blocks of one phase and micro-batch per device.
* ``module_tree``: time and bytes per module, rolled up from the nodes, in execution order.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoplace.config.choices import Objective
from autoplace.formats.plan import BaselineResult, Plan, SolverRecord, Verification
from autoplace.formats.records import GenerationRecord, PinsRecord, TensorParallelRecord
from autoplace.ir import Device, OpNode, Transfer
from autoplace.report.advice import advice, no_speedup_reason
from autoplace.report.devicemap import DeviceMapFacts, device_map_facts
from autoplace.simulate import simulate
from autoplace.simulate.schedules import phase_of
from autoplace.train.breakdown import memory_breakdown

__all__ = [
    "Block", "Comparison",
    "ModuleRow",
    "Overview",
    "PathStep",
    "TrainingFacts",
    "WhatIfRow",
    "advice",
    "critical_path",
    "memory_timelines",
    "module_tree",
    "no_speedup_reason",
    "overview",
    "schedule_blocks",
    "training_facts",
]


@dataclass(frozen=True)
class Comparison:
    """A baseline next to the plan: ``speedup`` is how many times better the plan is under its
    objective (``Plan.speedup_over``), ``value_s`` the baseline's value under it."""

    name: str
    baseline: BaselineResult
    value_s: float | None
    speedup: float | None

    @property
    def makespan_s(self) -> float | None:
        return self.baseline.makespan_s

    @property
    def feasible(self) -> bool:
        return self.baseline.feasible

    @property
    def fits_text(self) -> str:
        return self.baseline.fits_text

    @property
    def missing_text(self) -> str:
        """What the value column says when there is no value."""
        return "not run" if self.baseline.not_run is not None else "not scheduled"

    @property
    def peak_bytes(self) -> Mapping[str, int]:
        return self.baseline.peak_bytes


@dataclass(frozen=True)
class WhatIfRow:
    """The makespan with only the first ``len(devices)`` devices; ``None`` when nothing fits."""

    devices: tuple[str, ...]
    types: tuple[str, ...]
    makespan_s: float | None
    value_s: float | None  # under the plan's objective: the makespan, or the largest load
    status: str
    detail: str
    speedup_over_first: float | None
    is_plan: bool


@dataclass(frozen=True)
class TrainingFacts:
    """A training plan's step, as ``plan.training`` records it: plans made before micro-batches
    and replicas were built say neither, and mean one of each."""

    optimizer: str
    microbatches: int
    schedule: str
    replicas: int
    check: str  # the training check of the emitted model: passed, or skipped
    recompute: tuple[str, ...] = ()  # the devices that recompute their activations
    dtype: str = "float32"  # a half one: mixed precision (train.precision)
    sharding: str = "ddp"  # how the replicas hold the model (train.sharded)
    layers: str = "eval"  # how the step ran the layers (train.layers); older plans: eval

    @property
    def text(self) -> str:
        """``"adam, 4 micro-batches (1f1b), 2 replicas"``; ``"adam in bfloat16 mixed
        precision, ..."``; ``"2 replicas (FSDP2, ZeRO-3)"`` where they shard the model;
        ``", recomputing on cpu:0"``, ``", layers in train()"`` after, where they apply."""
        m, r = self.microbatches, self.replicas
        mixed = f" in {self.dtype} mixed precision" if self.dtype != "float32" else ""
        return (f"{self.optimizer}{mixed}, {m} micro-batch{'es' if m != 1 else ''} "
                f"({self.schedule}), {r} replica{'s' if r != 1 else ''}"
                + (" (FSDP2, ZeRO-3)" if self.sharding == "fsdp" else "")
                + (f", recomputing on {', '.join(self.recompute)}" if self.recompute else "")
                + (", layers in train()" if self.layers == "train" else ""))


@dataclass(frozen=True)
class Overview:
    """Everything the summaries say, in the plan's units (seconds, bytes)."""

    model: str
    objective: str
    value_label: str  # what the objective measures: "makespan" or "largest device load"
    value_s: float  # the plan's value under its objective
    devices: tuple[Device, ...]
    device_counts: tuple[tuple[str, int], ...]
    makespan_s: float
    best_single_device: str | None
    best_single_s: float | None
    speedup_over_single: float | None
    comparisons: tuple[Comparison, ...]
    lower_bound_s: float
    gap: float | None
    solver: SolverRecord
    cost_sources: tuple[tuple[str, int], ...]
    memory: tuple[Mapping[str, Any], ...]
    verification: Verification | None
    whatif: tuple[WhatIfRow, ...] | None
    critical_path: tuple[PathStep, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    profiled_devices: tuple[str, ...] = ()
    training: TrainingFacts | None = None  # None for an inference plan
    pins: PinsRecord | None = None  # Plan.pins: modules pinned by hand
    pins_cost_s: float | None = None  # Plan.pins_cost_s
    device_map: DeviceMapFacts | None = None  # --granularity module: the device_map section
    tensor_parallel: TensorParallelRecord | None = None  # --tp N: the candidate beside the plan
    generation: GenerationRecord | None = None  # --generate N: prefill, decode step, cache
    advice: str = ""  # what to do and why, in one sentence (``advice``): the summaries open with it

    @property
    def costs_text(self) -> str:
        """``"analytic"``, or ``"60 measured, 8 analytic"`` when sources are mixed; then the
        devices that were profiled, since a plan may use none of them."""
        if len(self.cost_sources) == 1:
            text = self.cost_sources[0][0]
        else:
            text = ", ".join(f"{count} {source}" for source, count in self.cost_sources)
        if self.profiled_devices:
            text += f" (measured on {', '.join(self.profiled_devices)})"
        return text

    @property
    def devices_text(self) -> str:
        """``"2x A100-40GB + 2x T4-16GB"``; a training plan of R > 1 data-parallel replicas
        says that these are one replica's, and how many devices the R take; a mesh's plan,
        that this is its rank 0."""
        text = " + ".join(f"{count}x {kind}" for kind, count in self.device_counts)
        if self.gap is None and self.tensor_parallel is not None:
            return f"{text}: rank 0 of the tensor-parallel mesh's {self.tensor_parallel.world}"
        replicas = self.training.replicas if self.training is not None else 1
        if replicas > 1:
            text += (f" per replica; {replicas} data-parallel replicas, "
                     f"{replicas * len(self.devices)} devices in all")
        return text

    @property
    def critical_compute_s(self) -> float:
        return sum(s.end_s - s.start_s for s in self.critical_path if s.kind == "node")

    @property
    def critical_transfer_s(self) -> float:
        return sum(s.end_s - s.start_s for s in self.critical_path if s.kind == "transfer")


def overview(plan: Plan) -> Overview:
    objective = plan.objective
    single = plan.single_device
    comparisons = sorted(
        (Comparison(name=name, baseline=b, value_s=b.objective_s(objective),
                    speedup=plan.speedup_over(b)) for name, b in plan.baselines.items()),
        key=lambda c: (math.inf if c.value_s is None else c.value_s, c.name))
    devices = plan.problem.cluster.devices
    device_of = plan.schedule.placement.device_of
    sources = Counter(plan.problem.costs.source_of(n.name, device_of[n.name])
                      for n in plan.problem.graph.nodes)
    return Overview(
        model=plan.model, objective=objective,
        # A throughput plan minimises its busiest device's load; everything else, the makespan.
        value_label="largest device load" if objective == Objective.THROUGHPUT else "makespan",
        value_s=plan.objective_s, devices=devices,
        device_counts=tuple(Counter(d.type for d in devices).items()),
        makespan_s=plan.makespan_s, best_single_device=plan.best_single_device,
        best_single_s=single.objective_s(objective) if single is not None else None,
        speedup_over_single=plan.speedup_over_single, comparisons=tuple(comparisons),
        lower_bound_s=plan.lower_bound_s, gap=plan.gap, solver=plan.solver,
        cost_sources=tuple(sorted(sources.items(), key=lambda kv: (-kv[1], kv[0]))),
        profiled_devices=plan.profile.device_names if plan.profile is not None else (),
        memory=_memory_rows(plan), verification=plan.verification,
        whatif=_whatif_rows(plan), critical_path=tuple(critical_path(plan)),
        notes=plan.notes, training=training_facts(plan), device_map=device_map_facts(plan),
        pins=plan.pins, pins_cost_s=plan.pins_cost_s, advice=advice(plan),
        tensor_parallel=plan.tensor_parallel, generation=plan.generation,
    )


def _memory_rows(plan: Plan) -> tuple[dict[str, Any], ...]:
    """Per device: peak, capacity and the parts of the peak (``train.breakdown``'s for a
    training plan; an inference plan's resident bytes are its reserve and parameters)."""
    s = plan.schedule
    parts = memory_breakdown(plan.problem, s) if plan.training is not None else {}
    rows = []
    for d in plan.problem.cluster.devices:
        peak, cap = int(s.peak_bytes.get(d.name, 0)), d.memory_bytes
        resident = int(s.resident_bytes.get(d.name, 0))
        rows.append({"device": d.name, "type": d.type, "peak_bytes": peak, "capacity_bytes": cap,
                     "resident_bytes": resident, "reserved_bytes": d.reserved_bytes,
                     "parameter_bytes": max(resident - d.reserved_bytes, 0),
                     "gradient_bytes": 0, "optimizer_state_bytes": 0,
                     "activation_bytes": max(peak - resident, 0),
                     "fraction": peak / cap if cap else math.inf, "over": peak > cap}
                    | parts.get(d.name, {}))
    return tuple(rows)


def training_facts(plan: Plan) -> TrainingFacts | None:
    """The step of a training plan (``None`` for an inference plan)."""
    training = plan.training
    if training is None:
        return None
    return TrainingFacts(optimizer=training.optimizer,
                         microbatches=int(training.microbatches or 1),
                         schedule=training.schedule or "gpipe",
                         replicas=int(training.replicas or 1),
                         dtype=training.dtype or "float32",
                         check=training.check.status,
                         recompute=tuple(training.recompute or ()),
                         sharding=training.sharding or "ddp",
                         layers=training.layers_mode or "eval")


def _whatif_rows(plan: Plan) -> tuple[WhatIfRow, ...] | None:
    rows = plan.whatif
    if rows is None:
        return None
    cluster = plan.problem.cluster
    types = {d.name: d.type for d in cluster.devices}
    all_devices = list(cluster.names)

    first = rows[0].value_s(plan.objective) if rows else None
    out = []
    for row in rows:
        v = row.value_s(plan.objective)
        out.append(WhatIfRow(
            devices=row.devices, types=tuple(types.get(d, "?") for d in row.devices),
            makespan_s=row.makespan_s, value_s=v, status=row.status,
            detail=row.detail, speedup_over_first=first / v if first and v else None,
            is_plan=list(row.devices) == all_devices))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Critical path


@dataclass(frozen=True)
class PathStep:
    """A node (``device`` set) or a transfer (``src_device`` -> ``dst_device``) on the path."""

    kind: str
    name: str
    start_s: float
    end_s: float
    device: str = ""
    src_device: str = ""
    dst_device: str = ""
    index: int = -1  # the transfer's index in plan["transfers"]


def critical_path(plan: Plan) -> list[PathStep]:
    """The chain that determines the makespan, in time order.

    Starting from the node that ends last, each step asks what the current node waited for: the
    input that arrived last (from a node on the same device, or a transfer from another) or the
    node before it on its device, whichever ended last (inputs win a tie). Walking back until a
    node starts at time zero gives a chain whose durations, plus any idle gaps between them,
    add up to the makespan: shortening anything off the chain cannot shorten the plan.
    """
    graph, s = plan.problem.graph, plan.schedule
    if not graph.nodes:
        return []
    device_of, start, end = s.placement.device_of, s.start_s, s.end_s
    arrival = {(t.src, t.dst_device): (i, t) for i, t in enumerate(s.transfers)}
    previous = _previous_on_device(plan)
    tol = 1e-9 * max(s.makespan_s, 1e-9)

    current = max(graph.nodes, key=lambda n: (end[n.name], start[n.name])).name
    path: list[PathStep] = []
    for _ in range(len(graph.nodes)):  # each step moves to a strictly earlier node; bounds it
        path.append(PathStep(kind="node", name=current, start_s=start[current],
                             end_s=end[current], device=device_of[current]))
        if start[current] <= tol:
            break
        waits: list[tuple[float, str, tuple[int, Transfer] | None]] = []
        for e in graph.in_edges(current):
            if device_of[e.src] == device_of[current]:
                waits.append((end[e.src], e.src, None))
            elif (e.src, device_of[current]) in arrival:
                i, t = arrival[(e.src, device_of[current])]
                waits.append((t.end_s, e.src, (i, t)))
        if current in previous:
            before = previous[current]
            waits.append((end[before] - tol / 2, before, None))
        if not waits:
            break
        _, name, transfer = max(waits, key=lambda w: w[0])
        if transfer is not None:
            i, t = transfer
            path.append(PathStep(kind="transfer", name=t.src, start_s=t.start_s, end_s=t.end_s,
                                 src_device=t.src_device, dst_device=t.dst_device, index=i))
        current = name
    path.reverse()
    return path


def _previous_on_device(plan: Plan) -> dict[str, str]:
    """The node that ran just before each node on its device."""
    s = plan.schedule
    by_device: dict[str, list[str]] = defaultdict(list)
    for n in plan.problem.graph.nodes:
        by_device[s.placement.device_of[n.name]].append(n.name)
    previous: dict[str, str] = {}
    for lane in by_device.values():
        lane.sort(key=lambda n: (s.start_s[n], s.end_s[n]))
        for before, after in zip(lane, lane[1:]):
            previous[after] = before
    return previous


# ---------------------------------------------------------------------------------------------
# A training step's schedule


@dataclass(frozen=True)
class Block:
    """Consecutive nodes of one phase and micro-batch on one device, drawn as one bar
    (``phase_of``: the micro-batch is ``None`` for an optimizer step, and in a step of one
    micro-batch). ``busy_s`` of its span ``start_s..end_s`` is compute, the rest idle gaps too
    short to draw."""

    device: str
    phase: str
    microbatch: int | None
    start_s: float
    end_s: float
    busy_s: float
    nodes: tuple[str, ...]


def schedule_blocks(plan: Plan, *, merge_gap_s: float = 0.0) -> list[Block]:
    """A training plan's schedule as blocks: on each device, in order of start, a node joins
    the block before it when it has the same phase and micro-batch and starts at most
    ``merge_gap_s`` after that block ends. Nodes that take no time (inputs) draw nothing and
    join no block. A thousand-node step becomes a few blocks per micro-batch and device."""
    s = plan.schedule
    graph = plan.problem.graph
    lanes: dict[str, list[str]] = defaultdict(list)
    for n in graph.nodes:
        if s.end_s[n.name] > s.start_s[n.name]:
            lanes[s.placement.device_of[n.name]].append(n.name)
    blocks: list[Block] = []
    for device in plan.problem.cluster.names:
        names = sorted(lanes[device], key=lambda n: (s.start_s[n], s.end_s[n], graph.index[n]))
        run: list[str] = []
        for name in names:
            if run and (phase_of(name)[1:] != phase_of(run[-1])[1:]
                        or s.start_s[name] - s.end_s[run[-1]] > merge_gap_s):
                blocks.append(_block(plan, device, run))
                run = []
            run.append(name)
        if run:
            blocks.append(_block(plan, device, run))
    return blocks


def _block(plan: Plan, device: str, names: Sequence[str]) -> Block:
    s = plan.schedule
    _, phase, microbatch = phase_of(names[0])
    return Block(device=device, phase=phase, microbatch=microbatch,
                 start_s=s.start_s[names[0]], end_s=max(s.end_s[n] for n in names),
                 busy_s=sum(s.end_s[n] - s.start_s[n] for n in names), nodes=tuple(names))


# ---------------------------------------------------------------------------------------------
# Memory


def memory_timelines(plan: Plan) -> dict[str, list[tuple[float, int]]]:
    """Bytes in use on each device as ``(t_s, bytes)`` steps (each holds until the next).

    A plan carries the simulator's timeline; one without (an older or hand-written plan file)
    is re-simulated from its placement and device order (the one simulator's memory model:
    resident parameters, plus each output from its producer's start until its last reader and
    outgoing transfer are done). A device with neither gets its resident bytes alone.
    """
    s = plan.schedule
    names = plan.problem.cluster.names
    simulated = _resimulated_timelines(plan) if any(
        not s.memory_timeline.get(name) for name in names) else {}
    out: dict[str, list[tuple[float, int]]] = {}
    for name in names:
        points = s.memory_timeline.get(name) or simulated.get(name)
        if not points:
            points = [(0.0, int(s.resident_bytes.get(name, 0)))]
        out[name] = [(float(t), int(b)) for t, b in points]
    return out


def _resimulated_timelines(plan: Plan) -> dict[str, Sequence[tuple[float, int]]]:
    try:
        return dict(simulate(plan.problem, plan.schedule.placement).memory_timeline)
    except Exception:  # a report still renders; the chart then shows resident bytes only
        return {}


# ---------------------------------------------------------------------------------------------
# Module tree


@dataclass(frozen=True)
class ModuleRow:
    """One row of the module tree: a module (its nodes rolled up) or a node under its module."""

    key: str
    parent: str | None
    label: str
    path: str
    kind: str  # "module" or "node"
    depth: int
    devices: tuple[tuple[str, float], ...]  # (device, share of the row's time), largest first
    time_s: float
    share: float  # of all nodes' time
    param_bytes: int
    output_bytes: int
    nodes: int
    start_s: float
    critical: bool = False
    has_children: bool = False

    @property
    def devices_text(self) -> str:
        if len(self.devices) == 1:
            return self.devices[0][0]
        return ", ".join(f"{dev} {share:.0%}" for dev, share in self.devices)


def module_tree(plan: Plan, path: Sequence[PathStep]) -> list[ModuleRow]:
    """Modules and their nodes in pre-order, siblings in order of their first start; nodes on
    ``path`` (the plan's ``critical_path``) are marked.

    A module's time and bytes are the sums over every node in it or below it; its devices are
    where that time was spent. The root is the model itself (nodes with no module sit there).
    """
    critical = {step.name for step in path if step.kind == "node"}
    s = plan.schedule
    total = sum(s.end_s[n.name] - s.start_s[n.name] for n in plan.problem.graph.nodes) or 1.0
    members: dict[str, list[OpNode]] = defaultdict(list)
    children: dict[str, set[str]] = defaultdict(set)
    own: dict[str, list[OpNode]] = defaultdict(list)
    for n in plan.problem.graph.nodes:
        parts = n.module.split(".") if n.module else []
        own[n.module].append(n)
        for i in range(len(parts) + 1):
            members[".".join(parts[:i])].append(n)
            if i:
                children[".".join(parts[: i - 1])].add(".".join(parts[:i]))
    if not members:
        return []
    first = {key: min(s.start_s[n.name] for n in ns) for key, ns in members.items()}

    rows: list[ModuleRow] = []

    def visit(module: str, parent: str | None, depth: int) -> None:
        key = f"m:{module}"
        kids: list[tuple[float, str, str | OpNode]] = [
            (first[c], c, c) for c in children[module]]
        kids += [(s.start_s[n.name], n.name, n) for n in own[module]]
        label = module.rsplit(".", 1)[-1] if module else plan.model
        rows.append(_row(plan, key, parent, label, module, "module", depth, members[module],
                         total, has_children=bool(kids)))
        for _, _, kid in sorted(kids, key=lambda k: (k[0], k[1])):
            if isinstance(kid, str):
                visit(kid, key, depth + 1)
            else:
                rows.append(_row(plan, f"n:{kid.name}", key, kid.name, module, "node",
                                 depth + 1, [kid], total, critical=kid.name in critical))

    visit("", None, 0)
    return rows


def _row(plan: Plan, key: str, parent: str | None, label: str, path: str, kind: str, depth: int,
         nodes: Sequence[OpNode], total_s: float, *, critical: bool = False,
         has_children: bool = False) -> ModuleRow:
    s = plan.schedule
    device_of = s.placement.device_of
    per_device: dict[str, float] = defaultdict(float)
    for n in nodes:
        per_device[device_of[n.name]] += s.end_s[n.name] - s.start_s[n.name]
    time_s = sum(per_device.values())
    if time_s > 0:
        shares = {d: t / time_s for d, t in per_device.items()}
    else:  # zero-time rows still say where they run
        counts = Counter(device_of[n.name] for n in nodes)
        shares = {d: c / len(nodes) for d, c in counts.items()}
    return ModuleRow(
        key=key, parent=parent, label=label, path=path, kind=kind, depth=depth,
        devices=tuple(sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))),
        time_s=time_s, share=time_s / total_s,
        param_bytes=sum(n.param_bytes for n in nodes),
        output_bytes=sum(n.output_bytes for n in nodes), nodes=len(nodes),
        start_s=min(s.start_s[n.name] for n in nodes), critical=critical,
        has_children=has_children)
