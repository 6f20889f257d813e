"""What a report says, worked out from the plan dictionary alone: the numbers behind every
chart and table, before any of them is drawn.

Read in this order:

* ``overview``: the summary facts (speed-ups over the best single device and over each baseline,
  gap, solver, which costs were used, what-if rows), the one object that the HTML page, the
  markdown summary and the terminal summary all render.
* ``critical_path``: the chain of nodes and transfers that sets the makespan, walked back from
  the last node to finish.
* ``memory_timelines``: bytes in use per device over time.
* ``module_tree``: time and bytes per module, rolled up from the nodes, in execution order.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Comparison",
    "ModuleRow",
    "Overview",
    "PathStep",
    "WhatIfRow",
    "critical_path",
    "memory_timelines",
    "module_tree",
    "overview",
]

Plan = Mapping[str, Any]


@dataclass(frozen=True)
class Comparison:
    """A baseline next to the plan: ``speedup`` is how many times better the plan is under its
    objective (the baseline's ``value_s`` over the plan's)."""

    name: str
    makespan_s: float | None
    value_s: float | None
    feasible: bool
    speedup: float | None
    peak_bytes: Mapping[str, int]


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
class Overview:
    """Everything the summaries say, in the plan's units (seconds, bytes)."""

    model: str
    objective: str
    value_label: str  # what the objective measures: "makespan" or "largest device load"
    value_s: float  # the plan's value under its objective
    devices: tuple[Mapping[str, Any], ...]
    device_counts: tuple[tuple[str, int], ...]
    makespan_s: float
    best_single_device: str | None
    best_single_s: float | None
    speedup_over_single: float | None
    comparisons: tuple[Comparison, ...]
    lower_bound_s: float
    gap: float | None
    solver: Mapping[str, Any]
    cost_sources: tuple[tuple[str, int], ...]
    memory: tuple[Mapping[str, Any], ...]
    verification: Mapping[str, Any] | None
    whatif: tuple[WhatIfRow, ...] | None
    critical_path: tuple[PathStep, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    profiled_devices: tuple[str, ...] = ()

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
        """``"2x A100-40GB + 2x T4-16GB"``."""
        return " + ".join(f"{count}x {kind}" for kind, count in self.device_counts)

    @property
    def critical_compute_s(self) -> float:
        return sum(s.end_s - s.start_s for s in self.critical_path if s.kind == "node")

    @property
    def critical_transfer_s(self) -> float:
        return sum(s.end_s - s.start_s for s in self.critical_path if s.kind == "transfer")


def overview(plan: Plan) -> Overview:
    makespan = plan["makespan_s"]
    # A throughput plan minimises its busiest device's load; everything else, the makespan.
    key = "max_load_s" if plan["objective"] == "throughput" and "max_load_s" in plan \
        else "makespan_s"
    value = plan[key]
    best = plan.get("best_single_device") or {}
    single = plan.get("baselines", {}).get("single-device") or {}
    comparisons = []
    for name, b in sorted(plan.get("baselines", {}).items(),
                          key=lambda item: _baseline_key(item, key)):
        b_value = b.get(key)
        comparisons.append(Comparison(
            name=name, makespan_s=b.get("makespan_s"), value_s=b_value,
            feasible=bool(b.get("feasible", False)),
            speedup=b_value / value if b_value is not None and value > 0 else None,
            peak_bytes=dict(b.get("peak_bytes", {}))))
    memory = []
    for d in plan["devices"]:
        mem = plan.get("memory", {}).get(d["name"], {})
        peak = int(mem.get("peak_bytes", 0))
        cap = int(mem.get("capacity_bytes", d["memory_bytes"]))
        memory.append({"device": d["name"], "type": d["type"], "peak_bytes": peak,
                       "capacity_bytes": cap, "resident_bytes": int(mem.get("resident_bytes", 0)),
                       "fraction": peak / cap if cap else math.inf, "over": peak > cap})
    kinds = Counter(d["type"] for d in plan["devices"])
    return Overview(
        model=plan["model"], objective=plan["objective"],
        value_label="largest device load" if key == "max_load_s" else "makespan",
        value_s=value, devices=tuple(plan["devices"]),
        device_counts=tuple(kinds.items()), makespan_s=makespan,
        best_single_device=best.get("device"),
        best_single_s=single.get(key, best.get("makespan_s")),
        speedup_over_single=plan.get("speedup_over_single"), comparisons=tuple(comparisons),
        lower_bound_s=plan["lower_bound_s"], gap=_gap(plan, value), solver=plan["solver"],
        cost_sources=tuple(sorted(
            Counter(n.get("cost_source", "analytic") for n in plan["nodes"]).items(),
            key=lambda kv: (-kv[1], kv[0]))),
        profiled_devices=tuple(dp["device"] for dp in
                               (plan.get("profile") or {}).get("devices", ())),
        memory=tuple(memory), verification=plan.get("verification"),
        whatif=_whatif_rows(plan, key), critical_path=tuple(critical_path(plan)),
        notes=tuple(plan.get("notes", ())),
    )


def _gap(plan: Plan, value_s: float) -> float | None:
    gap = plan["solver"].get("gap")
    if gap is not None:
        return float(gap)
    # Derivable from the top-level numbers when the solver did not report one (e.g. a fallback).
    bound = plan["lower_bound_s"]
    return max(0.0, (value_s - bound) / value_s) if value_s > 0 else None


def _baseline_key(item: tuple[str, Mapping[str, Any]], key: str) -> tuple[float, str]:
    value = item[1].get(key)
    return (math.inf if value is None else value, item[0])


def _whatif_rows(plan: Plan, key: str) -> tuple[WhatIfRow, ...] | None:
    rows = plan.get("whatif")
    if rows is None:
        return None
    types = {d["name"]: d["type"] for d in plan["devices"]}
    all_devices = [d["name"] for d in plan["devices"]]

    def value(row: Mapping[str, Any]) -> float | None:
        return row.get("objective_s", row.get("makespan_s")) if key != "makespan_s" \
            else row.get("makespan_s")

    first = value(rows[0]) if rows else None
    out = []
    for row in rows:
        v = value(row)
        out.append(WhatIfRow(
            devices=tuple(row["devices"]), types=tuple(types.get(d, "?") for d in row["devices"]),
            makespan_s=row.get("makespan_s"), value_s=v, status=row.get("status", ""),
            detail=row.get("detail", ""), speedup_over_first=first / v if first and v else None,
            is_plan=list(row["devices"]) == all_devices))
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
    nodes = {n["name"]: n for n in plan["nodes"]}
    if not nodes:
        return []
    preds: dict[str, list[str]] = defaultdict(list)
    for e in plan["edges"]:
        preds[e["dst"]].append(e["src"])
    arrival = {(t["src"], t["dst_device"]): (i, t) for i, t in enumerate(plan["transfers"])}
    previous: dict[str, str] = {}
    by_device: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for n in plan["nodes"]:
        by_device[n["device"]].append(n)
    for lane in by_device.values():
        lane.sort(key=lambda n: (n["start_s"], n["end_s"]))
        for before, after in zip(lane, lane[1:]):
            previous[after["name"]] = before["name"]
    tol = 1e-9 * max(plan["makespan_s"], 1e-9)

    current = max(plan["nodes"], key=lambda n: (n["end_s"], n["start_s"]))
    path: list[PathStep] = []
    for _ in range(len(nodes)):  # each step moves to a strictly earlier node; bounds the walk
        path.append(PathStep(kind="node", name=current["name"], start_s=current["start_s"],
                             end_s=current["end_s"], device=current["device"]))
        if current["start_s"] <= tol:
            break
        waits: list[tuple[float, str, tuple[int, Mapping[str, Any]] | None]] = []
        for p in preds[current["name"]]:
            src = nodes[p]
            if src["device"] == current["device"]:
                waits.append((src["end_s"], p, None))
            elif (p, current["device"]) in arrival:
                i, t = arrival[(p, current["device"])]
                waits.append((t["end_s"], p, (i, t)))
        if current["name"] in previous:
            before = previous[current["name"]]
            waits.append((nodes[before]["end_s"] - tol / 2, before, None))
        if not waits:
            break
        _, name, transfer = max(waits, key=lambda w: w[0])
        if transfer is not None:
            i, t = transfer
            path.append(PathStep(kind="transfer", name=t["src"], start_s=t["start_s"],
                                 end_s=t["end_s"], src_device=t["src_device"],
                                 dst_device=t["dst_device"], index=i))
        current = nodes[name]
    path.reverse()
    return path


# ---------------------------------------------------------------------------------------------
# Memory


def memory_timelines(plan: Plan) -> dict[str, list[tuple[float, int]]]:
    """Bytes in use on each device as ``(t_s, bytes)`` steps (each holds until the next).

    ``plan.json`` carries the simulator's timeline; a plan without one is re-simulated from its
    placement and device order (the one simulator's memory model: resident parameters, plus each
    output from its producer's start until its last reader and outgoing transfer are done). A
    device with neither gets its resident bytes alone.
    """
    memory = plan.get("memory", {})
    out: dict[str, list[tuple[float, int]]] = {}
    missing = [d["name"] for d in plan["devices"] if not memory.get(d["name"], {}).get("timeline")]
    simulated = _resimulated_timelines(plan) if missing else {}
    for d in plan["devices"]:
        name = d["name"]
        points = memory.get(name, {}).get("timeline") or simulated.get(name)
        if not points:
            points = [(0.0, int(memory.get(name, {}).get("resident_bytes", 0)))]
        out[name] = [(float(t), int(b)) for t, b in points]
    return out


def _resimulated_timelines(plan: Plan) -> dict[str, Sequence[tuple[float, int]]]:
    from autoplace.planfile import Plan as PlanFile
    from autoplace.simulate import simulate

    try:
        loaded = PlanFile.from_dict(plan)
        return dict(simulate(loaded.problem, loaded.schedule.placement).memory_timeline)
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


def module_tree(plan: Plan) -> list[ModuleRow]:
    """Modules and their nodes in pre-order, siblings in order of their first start.

    A module's time and bytes are the sums over every node in it or below it; its devices are
    where that time was spent. The root is the model itself (nodes with no module sit there).
    """
    critical = {s.name for s in critical_path(plan) if s.kind == "node"}
    total = sum(n["end_s"] - n["start_s"] for n in plan["nodes"]) or 1.0
    members: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    children: dict[str, set[str]] = defaultdict(set)
    own: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for n in plan["nodes"]:
        parts = n["module"].split(".") if n["module"] else []
        own[n["module"]].append(n)
        for i in range(len(parts) + 1):
            members[".".join(parts[:i])].append(n)
            if i:
                children[".".join(parts[: i - 1])].add(".".join(parts[:i]))
    if not members:
        return []
    first = {path: min(n["start_s"] for n in ns) for path, ns in members.items()}

    rows: list[ModuleRow] = []

    def visit(path: str, parent: str | None, depth: int) -> None:
        key = f"m:{path}"
        kids: list[tuple[float, str, str | Mapping[str, Any]]] = [
            (first[c], c, c) for c in children[path]]
        kids += [(n["start_s"], n["name"], n) for n in own[path]]
        label = path.rsplit(".", 1)[-1] if path else plan["model"]
        rows.append(_row(key, parent, label, path, "module", depth, members[path], total,
                         has_children=bool(kids)))
        for _, _, kid in sorted(kids, key=lambda k: (k[0], k[1])):
            if isinstance(kid, str):
                visit(kid, key, depth + 1)
            else:
                rows.append(_row(f"n:{kid['name']}", key, kid["name"], path, "node", depth + 1,
                                 [kid], total, critical=kid["name"] in critical))

    visit("", None, 0)
    return rows


def _row(key: str, parent: str | None, label: str, path: str, kind: str, depth: int,
         nodes: Sequence[Mapping[str, Any]], total_s: float, *, critical: bool = False,
         has_children: bool = False) -> ModuleRow:
    per_device: dict[str, float] = defaultdict(float)
    for n in nodes:
        per_device[n["device"]] += n["end_s"] - n["start_s"]
    time_s = sum(per_device.values())
    if time_s > 0:
        shares = {d: t / time_s for d, t in per_device.items()}
    else:  # zero-time rows still say where they run
        counts = Counter(n["device"] for n in nodes)
        shares = {d: c / len(nodes) for d, c in counts.items()}
    return ModuleRow(
        key=key, parent=parent, label=label, path=path, kind=kind, depth=depth,
        devices=tuple(sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))),
        time_s=time_s, share=time_s / total_s,
        param_bytes=sum(n["memory_bytes"] for n in nodes),
        output_bytes=sum(n["output_bytes"] for n in nodes), nodes=len(nodes),
        start_s=min(n["start_s"] for n in nodes), critical=critical, has_children=has_children)
