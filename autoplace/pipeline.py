"""The pipeline, wired: trace -> cost -> coarsen -> solve (simulating every candidate) -> emit ->
verify. ``plan`` is the Python API behind ``autoplace plan``; it returns a ``Plan`` and writes
nothing (``Plan.save`` does).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from autoplace.cluster import resolve_cluster
from autoplace.coarsen import DEFAULT_MAX_NODES, coarsen
from autoplace.cost import costs as cost_nodes
from autoplace.errors import AutoplaceError
from autoplace.ir import Cluster, Problem
from autoplace.loader import normalize_inputs
from autoplace.planfile import BaselineResult, Plan
from autoplace.solve import DEFAULT_TIME_LIMIT_S, SolveResult, solve
from autoplace.trace import TracedModel, trace_model
from autoplace.whatif import WHATIF_TIME_LIMIT_S, whatif_table

__all__ = ["local_device_map", "plan", "solve_graph"]


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
    cluster, found = resolve_cluster(spec=devices if isinstance(devices, str) else None,
                                     cluster=devices if isinstance(devices, Cluster) else None,
                                     cluster_file=cluster_file)
    notes: list[str] = list(found)
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
        planned = Plan(**{**_fields(planned), "emitted": emitted,
                          "verification": verification})
    return Plan(**{**_fields(planned), "notes": tuple(notes), "whatif": scaling,
                   "profile": profiled.to_dict() if profiled else None})


def solve_graph(
    problem: Problem,
    *,
    objective: str = "latency",
    contiguous: bool = False,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    solver: str = "cpsat",
    seed: int = 0,
    deterministic: bool = False,
    notes: Sequence[str] = (),
) -> Plan:
    """Place a task graph read with ``autoplace.graphfile`` (no model to trace or emit): the
    Python API behind ``autoplace solve``. ``notes`` (from ``resolve_cluster``) lead the plan's."""
    if time_limit_s <= 0:
        raise AutoplaceError(f"time limit must be positive, got {time_limit_s} s")
    result = solve(problem, solver=solver, objective=objective, contiguous=contiguous,
                   time_limit_s=time_limit_s, seed=seed, deterministic=deterministic)
    planned = _plan_of(result, problem, name=problem.graph.name, tracer="graph",
                       coarsening={"traced_ops": len(problem.graph.nodes),
                                   "plan_nodes": len(problem.graph.nodes), "steps": []})
    return Plan(**{**_fields(planned), "notes": (*notes, *result.notes)})


def _plan_of(result: SolveResult, problem: Problem, *, name: str, tracer: str,
             coarsening: Mapping[str, Any]) -> Plan:
    return Plan(
        problem=problem,
        schedule=result.schedule,
        lower_bound_s=result.lower_bound_s,
        solver=result.solver.to_dict(),
        baselines={k: BaselineResult.of(v) for k, v in result.baselines.items()},
        best_single_device=result.best_single_device,
        model=name,
        objective=result.objective,
        contiguous=result.contiguous,
        tracer=tracer,
        coarsening=coarsening,
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )


def _fields(p: Plan) -> Mapping[str, Any]:
    return {f: getattr(p, f) for f in p.__dataclass_fields__}
