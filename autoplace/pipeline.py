"""The pipeline, wired: trace -> cost -> coarsen -> solve (simulating every candidate) -> emit ->
verify -> report. ``plan`` is the Python API behind ``autoplace plan`` and ``solve_graph`` the one
behind ``autoplace solve``; each returns a ``Plan`` and writes nothing. ``save`` writes a plan's
output directory (``plan.json``, the report, the emitted model), all at once.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

import autoplace.report as report
from autoplace.coarsen import DEFAULT_MAX_NODES, coarsen
from autoplace.cost import costs as cost_nodes
from autoplace.devices import parse_device_spec, resolve_cluster
from autoplace.errors import AutoplaceError
from autoplace.formats.output import atomic_output_dir
from autoplace.formats.plan import BaselineResult, Plan, SolverRecord, Verification
from autoplace.ir import Cluster, Problem
from autoplace.loader import normalize_inputs
from autoplace.solve import DEFAULT_TIME_LIMIT_S, SolveResult, solve
from autoplace.trace import TracedModel, trace_model
from autoplace.whatif import WHATIF_TIME_LIMIT_S, whatif_table

__all__ = ["local_device_map", "plan", "save", "solve_graph"]


def local_device_map(torch_devices: list[str]) -> dict[str, str]:
    """Where each planned torch device lives on this machine: itself when present, else ``cpu``,
    so a plan made for GPUs runs (and is verified) on a machine without them."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mapping = {}
    for dev in torch_devices:
        parsed = torch.device(dev)
        present = parsed.type == "cpu" or (parsed.type == "cuda" and (parsed.index or 0) < count)
        mapping[dev] = dev if present else "cpu"
    return mapping


def _emit_and_verify(
    traced: TracedModel,
    result_plan: Plan,
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    *,
    verify: bool,
) -> tuple[Any, dict[str, Any], list[str]]:
    from autoplace.emit import emit_model
    from autoplace.emit import verify as verify_outputs

    notes: list[str] = []
    if traced.has_meta_params:
        return None, {"status": "skipped", "max_abs_diff": None,
                      "detail": "parameters are on the meta device: no weights to emit or run"}, [
            "the partitioned model was not emitted: the parameters are on the meta device"]
    cluster = result_plan.problem.cluster
    schedule = result_plan.schedule
    graph = result_plan.problem.graph
    torch_device = {d.name: d.torch_device for d in cluster.devices}
    device_of = {op: torch_device[dev] for op, dev in result_plan.device_of_op.items()}
    # Ops in order of their coarse node's simulated start: a topological order (a consumer
    # starts no earlier than its producer ends) that keeps each device's work contiguous.
    position = {n.name: i for i, n in enumerate(traced.module.graph.nodes)}
    keyed = []
    for coarse_index, node in enumerate(graph.nodes):
        for op in node.ops:
            keyed.append(((schedule.start_s[node.name], schedule.end_s[node.name], coarse_index,
                           position.get(op, 0)), op))
    order = [op for _, op in sorted(keyed)]
    remap = local_device_map(sorted(set(device_of.values())))
    moved = sorted(k for k, v in remap.items() if k != v)
    if moved:
        notes.append(f"{', '.join(moved)} not present here: the emitted model was materialized "
                     "on cpu for verification; `autoplace.emit.load_model(dir)` puts it on the "
                     "planned devices")
    emitted = emit_model(traced.module, device_of, order=order, device_map=remap)
    if not verify:
        return emitted, {"status": "skipped", "max_abs_diff": None,
                         "detail": "verification disabled (--no-verify)"}, notes
    outcome = verify_outputs(model, emitted, args, kwargs)
    detail = outcome.detail
    if moved:
        detail += " (planned devices remapped to cpu)"
    return emitted, {"status": outcome.status, "max_abs_diff": outcome.max_abs_diff,
                     "detail": detail}, notes


def plan(
    model: torch.nn.Module,
    example_inputs: Any,
    *,
    devices: str | Cluster | None = None,
    cluster_file: str | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    solver: str = "cpsat",
    max_nodes: int = DEFAULT_MAX_NODES,
    emit: bool = True,
    verify: bool = True,
    seed: int = 0,
    name: str = "model",
    whatif: bool = True,
    objective: str = "latency",
    contiguous: bool = False,
    deterministic: bool = False,
    profile: bool = False,
    cache: Any = None,
    progress: bool = False,
) -> Plan:
    """Plan ``model`` on ``devices`` (a spec such as ``"2xA100-40GB"``, a ``Cluster``, or
    ``None`` for the GPUs found / the default simulated set).

    With ``profile`` the devices that are here are profiled (``autoplace.profile``): their ops
    and links are measured, and devices that are not here get calibrated costs where the cache
    (``cache``, an ``autoplace.profile.ProfileCache``; default: the one at its documented
    location) holds a fit for their kind. Without it, costs are analytic.

    The model is switched to ``eval()`` mode: autoplace plans inference. With ``emit`` the
    partitioned model is built (``Plan.emitted``) and, with ``verify``, checked against the
    original with ``torch.testing.assert_close``. With ``whatif`` the model is also re-solved,
    briefly, on the first 1, 2, ... of the devices (``Plan.whatif``, the report's what-if table).
    """
    if time_limit_s <= 0:
        raise AutoplaceError(f"time limit must be positive, got {time_limit_s} s")
    if max_nodes < 2:
        raise AutoplaceError(f"max_nodes must be at least 2, got {max_nodes}")
    notes: list[str] = []
    if isinstance(devices, Cluster):
        cluster = devices
    elif isinstance(devices, str) and cluster_file is None:
        cluster = parse_device_spec(devices)
    else:
        cluster, found = resolve_cluster(spec=devices, cluster_file=cluster_file)
        notes += found
    args, kwargs = normalize_inputs(example_inputs, where="example_inputs")
    model.eval()

    traced = trace_model(model, args, kwargs, name=name)
    notes += traced.notes
    profiled = None
    if profile:
        from autoplace.profile import open_cache, profile_model

        cache = cache if cache is not None else open_cache()
        profiled = profile_model(traced, model, args, kwargs, cluster, cache=cache,
                                 progress=progress)
        notes += profiled.notes
        cluster = profiled.apply_links(cluster)
    costs = cost_nodes(traced.graph, cluster,
                       measured=profiled.measured() if profiled else None,
                       fits=profiled.fits if profiled else None)
    smallest = min(d.memory_bytes for d in cluster.devices)
    coarse = coarsen(traced.graph, costs, max_nodes=max_nodes,
                     max_group_bytes=max(smallest // 4, 1))
    problem = Problem(graph=coarse.graph, cluster=cluster, costs=coarse.costs)
    result = solve(problem, solver=solver, time_limit_s=time_limit_s, seed=seed,
                   objective=objective, contiguous=contiguous, deterministic=deterministic)
    notes += result.notes
    # After Ctrl-C the user wants the plan so far now, not more solving for the what-if table.
    scaling = whatif_table(problem, full=result, solver=solver, seed=seed, objective=objective,
                           contiguous=contiguous, deterministic=deterministic,
                           time_limit_s=min(WHATIF_TIME_LIMIT_S, time_limit_s / 10)
                           ) if whatif and result.solver.status != "INTERRUPTED" else None
    planned = _plan_of(result, problem, name=name, tracer=traced.tracer,
                       coarsening={"traced_ops": coarse.traced_ops,
                                   "plan_nodes": len(coarse.graph.nodes),
                                   "steps": list(coarse.steps)})
    if emit:
        emitted, verification, emit_notes = _emit_and_verify(traced, planned, model, args,
                                                             kwargs, verify=verify)
        notes += emit_notes
        planned = replace(planned, emitted=emitted,
                          verification=Verification.from_dict(verification))
    return replace(planned, notes=tuple(notes), whatif=scaling,
                   profile=profiled.to_dict() if profiled else None)


def solve_graph(
    problem: Problem,
    *,
    objective: str = "latency",
    contiguous: bool = False,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    solver: str = "cpsat",
    seed: int = 0,
    deterministic: bool = False,
) -> Plan:
    """Place a task graph read with ``autoplace.formats.graph`` (no model to trace or emit): the
    Python API behind ``autoplace solve``."""
    if time_limit_s <= 0:
        raise AutoplaceError(f"time limit must be positive, got {time_limit_s} s")
    result = solve(problem, solver=solver, objective=objective, contiguous=contiguous,
                   time_limit_s=time_limit_s, seed=seed, deterministic=deterministic)
    planned = _plan_of(result, problem, name=problem.graph.name, tracer="graph",
                       coarsening={"traced_ops": len(problem.graph.nodes),
                                   "plan_nodes": len(problem.graph.nodes), "steps": []})
    return replace(planned, notes=tuple(result.notes))


def _plan_of(result: SolveResult, problem: Problem, *, name: str, tracer: str,
             coarsening: Mapping[str, Any]) -> Plan:
    return Plan(
        problem=problem,
        schedule=result.schedule,
        lower_bound_s=result.lower_bound_s,
        solver=SolverRecord.from_dict(result.solver.to_dict()),
        baselines={k: BaselineResult.of(v) for k, v in result.baselines.items()},
        best_single_device=result.best_single_device,
        model=name,
        objective=result.objective,
        contiguous=result.contiguous,
        tracer=tracer,
        coarsening=coarsening,
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )


def save(plan: Plan, directory: str | os.PathLike[str]) -> Path:
    """Write ``plan.json``, the report (``report.html``, ``summary.md``, ``summary.txt``) and,
    when the plan carries an emitted model, ``model/`` into ``directory``, atomically: into a
    temporary directory beside it, renamed into place (an older one is replaced); on any
    failure nothing is left behind. Returns the directory."""
    data = plan.to_dict()

    def write(tmp: Path) -> None:
        (tmp / "plan.json").write_text(json.dumps(data, indent=1) + "\n")
        report.write_report(tmp, plan)
        if plan.emitted is not None:
            from autoplace.emit import save_model  # deferred like the rest of emitting

            save_model(plan.emitted, tmp / "model")

    return atomic_output_dir(directory, write)
