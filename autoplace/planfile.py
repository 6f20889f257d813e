"""``Plan``: the result of the pipeline as data, and its ``plan.json`` form.

A plan written to JSON can be read back, re-simulated, reported and emitted again without
re-tracing: ``Plan.load(dir).problem`` is the exact problem that was solved, and
``Plan.load(dir).schedule`` its schedule. The JSON layout is documented by
``autoplace/schema/plan.schema.json`` (``SCHEMA_VERSION``).

``Plan.save`` writes into a temporary directory beside the target and renames it into place, so
a failure never leaves a half-written output directory.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autoplace.errors import OutputError
from autoplace.ir import (
    Cluster,
    Costs,
    Device,
    Edge,
    Link,
    OpGraph,
    OpNode,
    Placement,
    Problem,
    Schedule,
    Transfer,
)

__all__ = ["SCHEMA_VERSION", "BaselineResult", "Plan", "atomic_output_dir"]

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class BaselineResult:
    makespan_s: float | None
    feasible: bool
    peak_bytes: Mapping[str, int] = field(default_factory=dict)
    max_load_s: float | None = None

    @classmethod
    def of(cls, schedule: Schedule | None) -> BaselineResult:
        if schedule is None:
            return cls(makespan_s=None, feasible=False)
        return cls(makespan_s=schedule.makespan_s, feasible=schedule.feasible,
                   peak_bytes=dict(schedule.peak_bytes), max_load_s=schedule.max_load_s)

    def objective_s(self, objective: str) -> float | None:
        return self.max_load_s if objective == "throughput" else self.makespan_s


@dataclass(frozen=True)
class Plan:
    """A placement with everything needed to check, report and run it."""

    problem: Problem
    schedule: Schedule
    lower_bound_s: float
    solver: Mapping[str, Any]
    baselines: Mapping[str, BaselineResult]
    best_single_device: str | None
    model: str = "model"
    objective: str = "latency"
    contiguous: bool = False
    tracer: str = "graph"
    coarsening: Mapping[str, Any] = field(default_factory=dict)
    verification: Mapping[str, Any] = field(default_factory=lambda: {
        "status": "skipped", "detail": "not verified", "max_abs_diff": None})
    notes: tuple[str, ...] = ()
    created: str = ""
    whatif: tuple[Mapping[str, Any], ...] | None = None
    profile: Mapping[str, Any] | None = None
    emitted: Any = field(default=None, compare=False, repr=False)

    @property
    def makespan_s(self) -> float:
        return self.schedule.makespan_s

    @property
    def objective_s(self) -> float:
        """The plan's value under its objective: the makespan, or the largest load."""
        return self.schedule.objective_s(self.objective)

    @property
    def gap(self) -> float | None:
        if self.objective_s <= 0:
            return 0.0
        return max(0.0, (self.objective_s - self.lower_bound_s) / self.objective_s)

    @property
    def best_single_makespan_s(self) -> float | None:
        single = self.baselines.get("single-device")
        return single.makespan_s if single is not None else None

    @property
    def speedup_over_single(self) -> float | None:
        """How many times better than the best single device, under the plan's objective."""
        single = self.baselines.get("single-device")
        value = single.objective_s(self.objective) if single is not None else None
        if value is None or self.objective_s <= 0:
            return None
        return value / self.objective_s

    @property
    def device_of_op(self) -> dict[str, str]:
        """Each traced op's device: the plan expanded back from coarse nodes."""
        device_of = self.schedule.placement.device_of
        return {op: device_of[node.name] for node in self.problem.graph.nodes for op in node.ops}

    # ---- JSON form

    def to_dict(self) -> dict[str, Any]:
        graph, cluster, costs = self.problem.graph, self.problem.cluster, self.problem.costs
        s = self.schedule
        device_of = s.placement.device_of
        from autoplace import __version__

        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "objective": self.objective,
            "tracer": self.tracer,
            "contiguous": self.contiguous,
            "devices": [{"name": d.name, "type": d.type, "memory_bytes": d.memory_bytes,
                         "host": d.host, "torch_device": d.torch_device,
                         "charges_transfers": d.charges_transfers}
                        for d in cluster.devices],
            "links": [{"src": lk.src, "dst": lk.dst,
                       "bandwidth_bytes_per_s": lk.bandwidth_bytes_per_s,
                       "latency_s": lk.latency_s, "kind": lk.kind} for lk in cluster.links],
            "nodes": [{
                "name": n.name, "ops": list(n.ops), "targets": list(n.targets),
                "module": n.module, "is_input": n.is_input, "device": device_of[n.name],
                "start_s": s.start_s[n.name], "end_s": s.end_s[n.name],
                # JSON has no infinity: null marks a device the node cannot run on.
                "compute_s": {d: (t if math.isfinite(t) else None)
                              for d, t in costs.compute_s[n.name].items()},
                "memory_bytes": n.param_bytes, "output_bytes": n.output_bytes,
                "output_shapes": [list(x) for x in n.output_shapes],
                "output_dtypes": list(n.output_dtypes), "flops": n.flops,
                "bytes_accessed": n.bytes_accessed, "launches": n.launches, "dtype": n.dtype,
                "cost_source": costs.source_of(n.name, device_of[n.name]),
            } | ({"cost_sources": {d: costs.source_of(n.name, d) for d in cluster.names}}
                 if n.name in costs.device_source else {}) for n in graph.nodes],
            "edges": [{"src": e.src, "dst": e.dst, "bytes": e.bytes}
                      | ({} if e.transfer_s is None else {"transfer_s": e.transfer_s})
                      for e in graph.edges],
            "colocate": [list(g) for g in graph.colocate],
            "outputs": list(graph.outputs),
            "order": {d: list(seq) for d, seq in (s.placement.order or {}).items()},
            "transfers": [{"src": t.src, "src_device": t.src_device, "dst_device": t.dst_device,
                           "bytes": t.bytes, "start_s": t.start_s, "end_s": t.end_s}
                          for t in s.transfers],
            "makespan_s": s.makespan_s,
            "max_load_s": s.max_load_s,
            "loads": dict(s.load_s),
            "lower_bound_s": self.lower_bound_s,
            "solver": {**self.solver, "gap": self.gap},
            "baselines": {name: {"makespan_s": b.makespan_s, "max_load_s": b.max_load_s,
                                 "feasible": b.feasible, "peak_bytes": dict(b.peak_bytes)}
                          for name, b in self.baselines.items()},
            "best_single_device": {"device": self.best_single_device,
                                   "makespan_s": self.best_single_makespan_s},
            "speedup_over_single": self.speedup_over_single,
            "memory": {d.name: {"peak_bytes": s.peak_bytes[d.name],
                                "capacity_bytes": d.memory_bytes,
                                "resident_bytes": s.resident_bytes[d.name],
                                "timeline": [list(p) for p in s.memory_timeline[d.name]]}
                       for d in cluster.devices},
            "coarsening": dict(self.coarsening),
            "verification": dict(self.verification),
            "notes": list(self.notes),
            "created": self.created or _dt.datetime.now(_dt.UTC).isoformat(),
            "autoplace_version": __version__,
        } | ({} if self.whatif is None else {"whatif": [dict(row) for row in self.whatif]}) \
          | ({} if self.profile is None else {"profile": dict(self.profile)})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        devices = tuple(Device(name=d["name"], type=d["type"], memory_bytes=d["memory_bytes"],
                               host=d.get("host", "localhost"),
                               torch_device=d.get("torch_device", ""),
                               charges_transfers=d.get("charges_transfers", True))
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
            param_bytes=n["memory_bytes"], flops=n.get("flops", 0.0),
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
                                     if "cost_sources" in n})
        problem = Problem(graph=graph, cluster=Cluster(devices=devices, links=links), costs=costs)
        order = {d: tuple(seq) for d, seq in data.get("order", {}).items()} or None
        memory = data["memory"]
        schedule = Schedule(
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
        )
        solver = {k: v for k, v in data["solver"].items() if k != "gap"}
        best_single = data.get("best_single_device") or {}
        return cls(
            problem=problem, schedule=schedule, lower_bound_s=data["lower_bound_s"],
            solver=solver,
            baselines={name: BaselineResult(makespan_s=b.get("makespan_s"),
                                            feasible=b.get("feasible", False),
                                            peak_bytes=b.get("peak_bytes", {}),
                                            max_load_s=b.get("max_load_s"))
                       for name, b in data.get("baselines", {}).items()},
            best_single_device=best_single.get("device"),
            model=data.get("model", "model"), objective=data.get("objective", "latency"),
            contiguous=data.get("contiguous", False),
            tracer=data.get("tracer", "graph"), coarsening=data.get("coarsening", {}),
            verification=data.get("verification", {}), notes=tuple(data.get("notes", ())),
            created=data.get("created", ""),
            whatif=tuple(data["whatif"]) if "whatif" in data else None,
            profile=data.get("profile"),
        )

    def with_verification(self, verification: Mapping[str, Any]) -> Plan:
        return replace(self, verification=dict(verification))

    # ---- files

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``plan.json``, the report (``report.html``, ``summary.md``, ``summary.txt``)
        and (when emitted) ``model/`` into ``directory``, atomically."""
        from autoplace.report import write_report

        data = self.to_dict()

        def write(tmp: Path) -> None:
            (tmp / "plan.json").write_text(json.dumps(data, indent=1) + "\n")
            write_report(tmp, data)
            if self.emitted is not None:
                from autoplace.emit import save_model

                save_model(self.emitted, tmp / "model")

        return atomic_output_dir(directory, write)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Plan:
        """Read ``directory/plan.json`` (or a ``plan.json`` path) back into a ``Plan``."""
        path = Path(directory)
        if path.is_dir():
            path = path / "plan.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise OutputError(f"no plan file at {str(path)!r}: pass a directory written by "
                              "`autoplace plan` or a plan.json path") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise OutputError(f"{str(path)!r} is not valid JSON ({exc}); re-run "
                              "`autoplace plan` to write it again") from exc
        except OSError as exc:
            raise OutputError(f"cannot read the plan file {str(path)!r}: {exc}") from exc
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise OutputError(f"{str(path)!r} is not a plan file this version can read "
                              f"({type(exc).__name__}: {exc})") from exc


def check_writable(directory: str | os.PathLike[str]) -> Path:
    """Fail early, before any work, when ``directory`` cannot be created or written."""
    target = Path(directory).resolve()
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"cannot create the output directory {str(target)!r}: {str(parent)!r} "
                          "is a file, not a directory; choose another --out")
    if target.exists() and not target.is_dir():
        raise OutputError(f"output path {str(target)!r} exists and is not a directory: choose "
                          "another --out")
    if not os.access(parent, os.W_OK | os.X_OK) or (
            target.exists() and not os.access(target.parent, os.W_OK)):
        raise OutputError(f"cannot write the output directory {str(target)!r}: {str(parent)!r} "
                          "is not writable; choose another --out")
    return target


def atomic_output_dir(directory: str | os.PathLike[str], write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp)`` into a fresh temporary directory, then rename it to ``directory``
    (replacing an older one). On any failure nothing is left behind."""
    target = check_writable(directory)
    created = target.parent
    while not created.parent.exists():
        created = created.parent
    created = None if created.exists() else created  # the first parent this call creates
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the output is an ordinary dir
    except OSError as exc:
        raise OutputError(f"cannot create the output directory {str(target)!r}: {exc}; choose "
                          "another --out") from exc
    try:
        write(tmp)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    return target
