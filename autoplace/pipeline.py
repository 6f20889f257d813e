"""The pipeline, wired: trace -> cost -> fold -> solve (simulating every candidate) -> emit ->
verify -> report. The plan's problem is the folded traced graph (only zero-cost ops folded, so
lossless): its makespan, memory, bound, gap and baselines hold for the traced graph. The solver
coarsens it to ``max_nodes`` for CP-SAT only as an aid. ``plan`` is the Python API behind
``autoplace plan`` and ``solve_graph`` the one behind ``autoplace solve``; each returns a
``Plan`` and writes nothing. ``save`` writes a plan's output directory (``plan.json``, the
report, the emitted model), all at once.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

import autoplace.emit
import autoplace.report as report
from autoplace.cluster import resolve_cluster
from autoplace.coarsen import DEFAULT_MAX_NODES, fold
from autoplace.cost import analytic_cpu_note
from autoplace.cost import costs as cost_nodes
from autoplace.emit import emit_and_verify, train_emitted
from autoplace.emit.ddp import REPLICA_SHARDS, replicas_of, write_train_script
from autoplace.emit.microbatch import batch_size, loss_rule, split_batch, stepper
from autoplace.emit.replicas import verify_replicas
from autoplace.errors import AutoplaceError, InfeasibleError
from autoplace.formats.output import atomic_output_dir
from autoplace.formats.plan import BaselineResult, Plan, SolverRecord, Verification
from autoplace.ir import Cluster, OpGraph, Placement, Problem, Schedule
from autoplace.load import normalize_inputs
from autoplace.simulate import simulate
from autoplace.simulate.schedules import SCHEDULES, microbatch_name, schedule_run
from autoplace.solve import DEFAULT_TIME_LIMIT_S, SolveOptions, SolveResult, solve
from autoplace.solve.accelerate import accelerate_baselines
from autoplace.solve.baselines import DEFAULT_MIN_GAIN, check_min_gain, prefer_single
from autoplace.solve.whatif import restrict, whatif_options, whatif_table
from autoplace.trace import trace_model
from autoplace.train import (
    TRAINING_NOTE,
    check_training,
    loss_model,
    step_problem,
    training_memory,
    training_targets,
)
from autoplace.train.dataparallel import replica_groups, with_allreduce
from autoplace.train.precision import cast, cast_notes, check_dtype

__all__ = ["plan", "save", "solve_graph"]


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
    check_memory: bool | None = None,
    seed: int = 0,
    name: str = "model",
    whatif: bool = True,
    objective: str = "latency",
    contiguous: bool = False,
    deterministic: bool = False,
    profile: bool = False,
    cache: Any = None,
    progress: bool = False,
    min_gain: float = DEFAULT_MIN_GAIN,
    mode: str = "inference",
    optimizer: str = "adam",
    loss: Callable[..., torch.Tensor] | None = None,
    example_targets: Any = (),
    microbatches: int = 1,
    schedule: str = "auto",
    replicas: int | str = "auto",
    dtype: str = "float32",
) -> Plan:
    """Plan ``model`` on ``devices`` (a spec such as ``"2xA100-40GB"``, a ``Cluster``, or
    ``None`` for the GPUs found / the default simulated set).

    With ``profile`` the devices that are here are profiled (``autoplace.profile``): their ops
    and links are measured, and devices that are not here get calibrated costs where the cache
    (``cache``, an ``autoplace.profile.ProfileCache``; default: the one at its documented
    location) holds a fit for their kind. Without it, costs are analytic.

    The model is switched to ``eval()`` mode: autoplace plans inference. With ``emit`` the
    partitioned model is built (``Plan.emitted``) and, with ``verify``, checked against the
    original with ``torch.testing.assert_close`` and its peak memory per device measured against
    the plan's (failing above it with ``check_memory``; ``None`` means
    ``autoplace.emit.ENFORCE_PEAK_DEFAULT``). With ``whatif`` the model is also re-solved,
    briefly, on the first 1, 2, ... of the devices (``Plan.whatif``, the report's what-if
    table). accelerate's sequential and balanced device maps, where accelerate is installed, are
    among the baselines. A split that gains less than ``min_gain`` (a fraction) over the best
    single device is not made: the plan is that device, and says why (``Plan.min_gain``).

    ``mode="training"`` plans one training step with ``optimizer`` (``autoplace.train``): the
    model followed by ``loss(outputs, *example_targets)`` (or, without ``loss``, the model's
    own scalar loss) is traced, and each forward node gets a colocated backward and optimizer
    step. The emitted model computes the loss; verifying it also trains it beside the original
    (``emit.training.verify_training``: losses, gradients and parameters after 3 steps).
    With ``microbatches`` M > 1 the batch is cut into M micro-batches
    (``emit.microbatch.split_batch``), one micro-batch is traced, and the step runs M of them
    in ``schedule``'s order: ``gpipe``, ``1f1b`` or ``auto`` (each solved with half the time,
    the faster kept); the emitted model runs them so (``emit.microbatch.train_step``).
    ``replicas`` (``auto``, or a whole number R): data-parallel replicas of the step, each
    placed on its group of the devices with its shard of the batch and the gradients'
    all-reduce (``train.dataparallel``); ``auto`` plans every R the devices, the batch and
    the loss allow and keeps the fastest step. The plan is one replica's.

    ``dtype`` (``float32``, ``bfloat16``, ``float16``): a copy of the model and the floating
    example inputs and targets are cast to it before tracing (``train.precision``); a training
    plan in a half dtype is mixed precision (``emit.optimizer.MasterWeights``), one replica.
    """
    check_min_gain(min_gain)
    check_training(mode, optimizer, microbatches, schedule, replicas)
    dtype = check_dtype(dtype)
    options = SolveOptions(time_limit_s=time_limit_s, seed=seed, deterministic=deterministic,
                           objective=objective, contiguous=contiguous, solver=solver,
                           max_nodes=max_nodes)
    cluster, found = resolve_cluster(spec=devices if isinstance(devices, str) else None,
                                     cluster=devices if isinstance(devices, Cluster) else None,
                                     cluster_file=cluster_file)
    notes: list[str] = list(found)
    args, kwargs = normalize_inputs(example_inputs, where="example_inputs")
    model.eval()
    model, (args, kwargs, example_targets) = cast(model, (args, kwargs, example_targets), dtype)
    notes += cast_notes(dtype, training=mode == "training")
    trace = _Tracing(name=name, profile=profile, cache=cache, progress=progress)
    if mode == "training":
        targets = training_targets(example_targets)
        model = loss_model(model, loss, args, kwargs, targets)
        notes.append(TRAINING_NOTE)
        step = _plan_step(model, (args, {**kwargs, "targets": targets}), cluster, options,
                          trace, optimizer=optimizer, microbatches=microbatches,
                          schedule=schedule, replicas=replicas, dtype=dtype, notes=notes)
        forward, problem, solved, (args, kwargs) = (step.forward, step.problem, step.solved,
                                                    step.batches[0])
    else:
        forward = _traced_problem(model, args, kwargs, cluster, trace, notes)
        problem = forward.problem
        extra, accelerate_notes = accelerate_baselines(model, forward.graph, problem)
        notes += accelerate_notes
        solved = solve(problem, options=options, extra_baselines=extra)
    traced, profiled, folded = forward.traced, forward.profiled, forward.folded
    result, gain = _min_gain(solved, min_gain)
    notes += result.notes
    # After Ctrl-C the user wants the plan so far now, not more solving for the what-if table.
    scaling = whatif_table(problem, full=result, options=whatif_options(options)
                           ) if whatif and result.solver.status != "INTERRUPTED" else None
    planned = _plan_of(result, problem, name=name, tracer=traced.tracer,
                       coarsening={"traced_ops": folded.traced_ops,
                                   "plan_nodes": len(problem.graph.nodes),
                                   "steps": [*folded.steps, *result.coarsening]})
    if mode == "training":
        planned = replace(planned, training=step.record(optimizer, result.schedule))
        if step.problem.pipeline_schedule != planned.training["schedule"] and (
                step.microbatches > 1):
            notes.append("1F1B's order needs the devices to form stages, and these feed each "
                         "other both ways (a tied weight read at both ends, say): the step "
                         "runs GPipe's order")
    if emit:
        planned, emit_notes = _emit(planned, traced, model, args, kwargs,
                                    forward=forward.problem, verify=verify,
                                    check_memory=check_memory,
                                    step=step if mode == "training" else None)
        notes += emit_notes
    return replace(planned, notes=tuple(notes), whatif=scaling, min_gain=gain,
                   profile=profiled.to_dict() if profiled else None)


@dataclass(frozen=True)
class _Tracing:
    """How ``plan`` traces and costs a model (``_traced_problem``): the plan's name, and
    whether and how the devices here are profiled."""

    name: str
    profile: bool
    cache: Any
    progress: bool


@dataclass(frozen=True)
class _Forward:
    """A traced model, costed and folded: the forward problem the solver (or, for training,
    ``train.step_problem``) takes."""

    traced: Any
    profiled: Any
    graph: OpGraph
    folded: Any
    problem: Problem


def _traced_problem(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                    cluster: Cluster, how: _Tracing, notes: list[str]) -> _Forward:
    """Trace, profile (with ``how.profile``), cost and fold ``model`` on ``args``/``kwargs``:
    its forward problem on ``cluster`` (with the links measured here, when profiled)."""
    traced = trace_model(model, args, kwargs, name=how.name)
    notes += traced.notes
    profiled, graph = None, traced.graph
    if how.profile:
        from autoplace.profile import open_cache, profile_model

        cache = how.cache if how.cache is not None else open_cache()
        profiled = profile_model(traced, model, args, kwargs, cluster, cache=cache,
                                 progress=how.progress)
        notes += profiled.notes
        cluster = profiled.apply_links(cluster)
        graph = profiled.with_workspace(graph)
    costs = cost_nodes(graph, cluster,
                       measured=profiled.measured() if profiled else None,
                       fits=profiled.fits if profiled else None,
                       launcher=profiled.launcher if profiled else None)
    notes += [n for n in [analytic_cpu_note(graph, cluster, costs)] if n]
    folded = fold(graph, costs)
    return _Forward(traced=traced, profiled=profiled, graph=graph, folded=folded,
                    problem=Problem(graph=folded.graph, cluster=cluster, costs=folded.costs))


Batch = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class _Step:
    """A training step as planned: ``replicas`` data-parallel replicas (each on its
    ``groups`` entry, ``groups[0]`` the planned one), each on its shard of the ``whole`` batch
    cut into ``microbatches`` (``batches``: replica 0's), the loss the ``rule`` of theirs;
    the forward, the step's problem and its solve; ``options``, every replica count tried."""

    groups: tuple[tuple[str, ...], ...]
    torch_groups: tuple[tuple[str, ...], ...]
    whole: Batch
    batches: tuple[Batch, ...]
    rule: str | None
    forward: _Forward
    problem: Problem
    solved: SolveResult
    dtype: str = "float32"
    options: tuple[dict[str, Any], ...] = ()

    @property
    def replicas(self) -> int:
        return len(self.groups)

    @property
    def microbatches(self) -> int:
        return len(self.batches)

    def record(self, optimizer: str, schedule: Schedule) -> dict[str, Any]:
        """``plan.json``'s ``training`` object (its check still to run) for the plan's
        ``schedule``: the order it runs, which is GPipe's where 1F1B was asked of devices that
        feed each other both ways (``simulate.schedules.schedule_run``)."""
        return {"optimizer": optimizer, "dtype": self.dtype, "layers_mode": "eval",
                "microbatches": self.microbatches,
                "schedule": schedule_run(self.problem.graph, schedule.placement.device_of,
                                         self.problem.pipeline_schedule or "gpipe"),
                "replicas": self.replicas,
                **({"microbatch_loss": self.rule} if self.microbatches > 1 else {}),
                **({"replica_groups": [list(g) for g in self.groups],
                    "replica_torch_devices": [list(g) for g in self.torch_groups]}
                   if self.replicas > 1 else {}),
                "replica_options": [dict(o) for o in self.options],
                "check": {"status": "skipped"}}


def _plan_step(model: torch.nn.Module, whole: Batch, cluster: Cluster, options: SolveOptions,
               how: _Tracing, *, optimizer: str, microbatches: int, schedule: str,
               replicas: int | str, dtype: str, notes: list[str]) -> _Step:
    """The training step of ``model`` (a ``train.LossModel``) on the ``whole`` batch: for each
    replica count R (``replicas``, or ``auto``: every R that divides the devices into alike
    groups, ``train.dataparallel``), one replica's shard cut into micro-batches, one
    micro-batch traced on ``cluster``, the replica's step solved on its devices with the
    gradients' all-reduce (``_solve_step``, the time limit shared among the R); the fastest
    step that fits kept, and why said."""
    counts = _replica_counts(model, whole, cluster, replicas, microbatches, dtype, notes)
    share = replace(options, time_limit_s=options.time_limit_s / len(counts))
    found: dict[int, tuple[_Step, list[str]]] = {}
    failure: InfeasibleError | None = None
    for r, groups in counts:
        mine: list[str] = []
        shard = split_batch(*whole, r, what=REPLICA_SHARDS)[0]
        batches, rule = split_batch(*shard, microbatches), None
        if microbatches > 1:
            rule = loss_rule(model, *shard, batches)
            mine.append(f"{microbatches} micro-batches of {batch_size(batches[0], parts=1)}: "
                        f"the batch's loss is the {rule} of theirs")
        forward = _traced_problem(model, *batches[0], cluster, how, mine)
        full = forward.problem.cluster
        if r > 1:
            forward = replace(forward, problem=restrict(forward.problem, groups[0]))
        factors = _backward_factors(forward.profiled, model, *batches[0], full, mine)
        try:
            problem, solved = _solve_step(forward.problem, share, optimizer=optimizer,
                                          factors=factors, microbatches=microbatches,
                                          schedule=schedule, dtype=dtype, notes=mine,
                                          replicated=(full, groups))
        except InfeasibleError as exc:
            if len(counts) == 1:
                raise
            failure = failure or exc  # R=1's, over every device, says the most
            continue
        torch_groups = tuple(tuple(full.device(d).torch_device for d in g) for g in groups)
        found[r] = _Step(groups=tuple(groups), torch_groups=torch_groups, whole=whole,
                         batches=tuple(batches), rule=rule, forward=forward, problem=problem,
                         solved=solved, dtype=dtype), mine
    if not found:
        raise failure  # type: ignore[misc]
    best = min(found, key=lambda r: (not found[r][0].solved.schedule.feasible,
                                     found[r][0].solved.schedule.makespan_s))
    table = tuple(
        {"replicas": r, "devices_per_replica": len(groups[0]),
         **({"step_s": found[r][0].solved.schedule.makespan_s,
             "fits": found[r][0].solved.schedule.feasible} if r in found else {"fits": False})}
        for r, groups in counts)
    step, mine = found[best]
    frozen = sum(n.param_bytes - n.trainable_bytes for n in step.forward.problem.graph.nodes)
    if frozen:
        mine.append(f"{frozen} bytes of parameters and buffers are not trained (frozen "
                    "parameters, or buffers): no gradient or optimizer state is planned for "
                    "them")
    notes += mine
    single = found[1][0].solved.baselines.get("single-device") if 1 in found else None
    if best > 1 and single is not None and single.feasible:
        notes.append(f"{best} data-parallel replicas: the plan's graph is one replica's, on "
                     f"1/{best} of the batch with its all-reduce, and its makespan is the "
                     "step's (the replicas run at once); its speed-up is over one device on "
                     f"1/{best} of the batch. One device on the whole batch takes "
                     f"{single.makespan_s * 1e3:.3f} ms, "
                     f"{single.makespan_s / step.solved.schedule.makespan_s:.2f}x the step")
    if len(counts) > 1:
        notes.append("data-parallel replicas: " + ", ".join(
            f"R={o['replicas']} ({o['devices_per_replica']} device"
            f"{'s' if o['devices_per_replica'] > 1 else ''} each) "
            + (f"{o['step_s'] * 1e3:.3f} ms" if "step_s" in o else "fits no device")
            + ("" if o["fits"] or "step_s" not in o else " (over memory)")
            for o in table) + f" per step; R={best} kept, the fastest step that fits")
    notes.append("accelerate's device maps are inference maps: not among a training plan's "
                 "baselines")
    return replace(step, options=table)


def _replica_counts(model: torch.nn.Module, whole: Batch, cluster: Cluster,
                    replicas: int | str, microbatches: int, dtype: str,
                    notes: list[str]) -> list[tuple[int, list[tuple[str, ...]]]]:
    """The replica counts to plan, each with its device groups: ``replicas``, or with
    ``auto`` every R that divides the devices into alike groups, the batch into equal
    shards, and whose loss is the mean of the shards' (DDP averages the gradients); the
    others are said in ``notes``. An asked-for R that cannot be is an error."""
    asked = replicas != "auto"
    count = len(cluster.devices)
    wanted = [int(replicas)] if asked else [r for r in range(1, count + 1) if count % r == 0]
    if microbatches > 1 and any(r > 1 for r in wanted):
        if asked:
            raise AutoplaceError("data-parallel replicas of a micro-batched step are not built "
                                 "yet: use --replicas 1 or --microbatches 1")
        notes.append("data-parallel replicas of a micro-batched step are not built yet: "
                     "one replica over every device (R=1)")
        wanted = [1]
    if dtype != "float32" and any(r > 1 for r in wanted):
        # train.py (emit/ddp.py) steps a float32 optimizer: its replicas would need
        # MasterWeights and, for float16, one loss scale agreed on by every rank.
        if asked:
            raise AutoplaceError(f"data-parallel replicas in {dtype} (mixed precision) are not "
                                 "built yet: use --replicas 1 or --dtype float32")
        notes.append(f"data-parallel replicas in {dtype} (mixed precision) are not built yet: "
                     "one replica over every device (R=1)")
        wanted = [1]
    kept = []
    for r in wanted:
        if r == 1:
            kept.append((1, [cluster.names]))
            continue
        groups = replica_groups(cluster, r)
        why = None
        if count % r:
            why = f"{r} does not divide the {count} devices into equal groups"
        elif groups is None:
            why = (f"the {count} devices do not form {r} alike groups (the same device types "
                   "and the same links inside each)")
        else:
            try:
                shards = split_batch(*whole, r, what=REPLICA_SHARDS)
                if loss_rule(model, *whole, shards) != "mean":
                    why = ("the loss is the sum of the shards' losses, and "
                           "DistributedDataParallel averages the replicas' gradients")
            except AutoplaceError as exc:
                why = str(exc)
        if why is None:
            kept.append((r, groups))
        elif asked:
            raise AutoplaceError(f"--replicas {r}: {why}")
        else:
            notes.append(f"{r} data-parallel replicas not considered: {why}")
    return kept


def _solve_step(forward: Problem, options: SolveOptions, *, optimizer: str,
                factors: Mapping[str, float], microbatches: int, schedule: str, dtype: str,
                notes: list[str], replicated: tuple[Cluster, Sequence[Sequence[str]]]
                ) -> tuple[Problem, SolveResult]:
    """The training step's problem and its solve: with micro-batches under each schedule
    ``schedule`` names (``auto``: GPipe and 1F1B, each with half the time), the faster step
    that fits kept; with the all-reduce of the ``replicated`` groups of the whole cluster
    (``train.dataparallel.with_allreduce``). A step that fits nowhere says what it holds
    beyond inference."""
    names = SCHEDULES if schedule == "auto" and microbatches > 1 else (
        (schedule if schedule != "auto" else "gpipe"),)
    share = replace(options, time_limit_s=options.time_limit_s / len(names))
    found: dict[str, tuple[Problem, SolveResult]] = {}
    failure: InfeasibleError | None = None
    for name in names:
        problem = with_allreduce(step_problem(forward, optimizer, backward_factor=factors,
                                              microbatches=microbatches, schedule=name,
                                              dtype=dtype),
                                 *replicated)
        try:
            found[name] = problem, solve(problem, options=share)
        except InfeasibleError as exc:
            failure = exc
    if not found:
        capacity = sum(d.memory_bytes - d.reserved_bytes for d in forward.cluster.devices)
        raise InfeasibleError(
            f"{failure} "
            f"{training_memory(forward.graph, optimizer, capacity, microbatches, dtype)}"
        ) from failure
    best = min(found, key=lambda n: (not found[n][1].schedule.feasible,
                                      found[n][1].schedule.makespan_s))
    if len(names) > 1:
        notes.append("schedule: " + ", ".join(
            f"{n} {found[n][1].schedule.makespan_s * 1e3:.3f} ms"
            + ("" if found[n][1].schedule.feasible else " (over memory)")
            if n in found else f"{n} fits no device" for n in names)
            + f" per step; {best} kept")
    return found[best]


def _backward_factors(profiled: Any, model: torch.nn.Module, args: tuple[Any, ...],
                      kwargs: dict[str, Any], cluster: Cluster,
                      notes: list[str]) -> dict[str, float]:
    """The backward's time over the forward's, measured through autograd on each profiled
    device (one measurement per kind of device), for ``train.step_problem``."""
    if profiled is None:
        return {}
    from autoplace.profile.backward import measure_backward_factor

    factors: dict[str, float] = {}
    by_key: dict[str, float] = {}
    for dp in profiled.devices:
        if dp.device_key not in by_key:
            by_key[dp.device_key] = measure_backward_factor(
                model, args, kwargs, cluster.device(dp.device).torch_device)
        factors[dp.device] = by_key[dp.device_key]
    if factors:
        notes.append("backward measured through autograd: " + ", ".join(
            f"{f:.2f}x the forward on {d}" for d, f in factors.items())
            + " (the analytic model's 2x elsewhere)")
    return factors


def _emit(planned: Plan, traced: Any, model: torch.nn.Module, args: tuple[Any, ...],
          kwargs: dict[str, Any], *, forward: Problem, verify: bool,
          check_memory: bool | None, step: _Step | None) -> tuple[Plan, list[str]]:
    """The partitioned model of ``planned``, verified. A training plan (its ``step``) emits
    its forward nodes (of micro-batch 0, of replica 0) as placed (backward and optimizer steps
    follow them: autograd and ``torch.optim`` run where the forward ran and the weights live);
    its outputs and forward memory are checked against that forward alone (on ``args``,
    ``kwargs``: one micro-batch of one replica's shard), and then it is trained beside the
    original on the whole batch: its micro-batches in the plan's order, its replicas as
    processes under DistributedDataParallel."""
    problem, schedule, device_of_op = planned.problem, planned.schedule, planned.device_of_op
    count = step.microbatches if step is not None else 1
    if step is not None:
        device_of = {n.name: planned.schedule.placement.device_of[
            microbatch_name(n.name, 0) if count > 1 else n.name] for n in forward.graph.nodes}
        problem = forward
        schedule = simulate(forward, Placement(device_of=device_of))
        device_of_op = {op: device_of[n.name] for n in forward.graph.nodes for op in n.ops}
    emitted, verification, notes = emit_and_verify(
        traced, model, args, kwargs, problem=problem, schedule=schedule,
        device_of_op=device_of_op, check_outputs=verify, check_memory=check_memory)
    planned = replace(planned, emitted=emitted, verification=Verification.from_dict(verification))
    if step is None or emitted is None:
        return planned, notes
    emitted.example_inputs = step.whole  # `autoplace run --train` cuts the whole batch again
    if not verify:
        return planned, notes
    args, kwargs = step.whole
    inputs = {k: v for k, v in kwargs.items() if k != "targets"}
    optimizer = planned.training["optimizer"]
    if step.replicas > 1:
        check = verify_replicas(emitted, model, args, inputs, kwargs["targets"],
                                optimizer=optimizer, replicas=step.replicas,
                                groups=step.torch_groups)
        how = (f"steps of {step.replicas} data-parallel replicas (DistributedDataParallel, one "
               "process each) ")
    else:
        # micro-batches: segment by segment, in the plan's order
        run = stepper(emitted, planned.problem, planned.schedule, step.batches,
                      step.rule) if count > 1 else None
        check = train_emitted(emitted, model, args, inputs, kwargs["targets"],
                              optimizer=optimizer, emitted_step=run, dtype=step.dtype,
                              microbatches=count, rule=step.rule)
        how = (f"steps of {count} micro-batches ({planned.training['schedule']}) "
               if count > 1 else "steps ")
    precision = f"{step.dtype} mixed-precision " if step.dtype != "float32" else ""
    notes.append(f"training check passed: {check['steps']} {precision}{optimizer} {how}"
                 "of the emitted "
                 "model give the original's losses "
                 f"({', '.join(f'{v:.6g}' for v in check['losses'])}), gradients and parameters")
    return replace(planned, training={**planned.training, "check": check}), notes


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
    min_gain: float = DEFAULT_MIN_GAIN,
) -> Plan:
    """Place a task graph read with ``autoplace.formats.graph`` (no model to trace or emit): the
    Python API behind ``autoplace solve``. ``notes`` (from ``resolve_cluster``) lead the plan's;
    ``min_gain`` as for ``plan``."""
    check_min_gain(min_gain)
    options = SolveOptions(time_limit_s=time_limit_s, seed=seed, deterministic=deterministic,
                           objective=objective, contiguous=contiguous, solver=solver)
    result, gain = _min_gain(solve(problem, options=options), min_gain)
    planned = _plan_of(result, problem, name=problem.graph.name, tracer="graph",
                       coarsening={"traced_ops": len(problem.graph.nodes),
                                   "plan_nodes": len(problem.graph.nodes), "steps": []})
    return replace(planned, notes=(*notes, *result.notes), min_gain=gain)


def _min_gain(result: SolveResult, min_gain: float) -> tuple[SolveResult, dict[str, Any]]:
    """The ``--min-gain`` policy (``baselines.prefer_single``) applied to a solve's result, and
    the record ``plan.json`` keeps of it."""
    chosen, why = prefer_single(result.schedule, result.baselines, result.objective, min_gain)
    record = {"threshold": min_gain, "single_device_chosen": why is not None, "reason": why}
    if why is None:
        return result, record
    return replace(result, schedule=chosen, notes=(*result.notes, why)), record


def _plan_of(result: SolveResult, problem: Problem, *, name: str, tracer: str,
             coarsening: Mapping[str, Any]) -> Plan:
    return Plan(
        problem=problem,
        schedule=result.schedule,
        lower_bound_s=result.lower_bound_s,
        solver=SolverRecord(**{f.name: getattr(result.solver, f.name)
                               for f in dataclasses.fields(result.solver)}),
        baselines={k: BaselineResult.of(v) for k, v in result.baselines.items()}
        | {k: BaselineResult.of(None, not_run=why) for k, why in result.not_run.items()},
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
    when the plan carries an emitted model, ``model/`` (and ``train.py``, the torchrun entry
    point of a training plan's data-parallel replicas) into ``directory``, atomically: into a
    temporary directory beside it, renamed into place (an older one is replaced); on any
    failure nothing is left behind. Returns the directory."""
    data = plan.to_dict()

    def write(tmp: Path) -> None:
        (tmp / "plan.json").write_text(json.dumps(data, indent=1) + "\n")
        report.write_report(tmp, plan)
        if plan.emitted is not None:
            autoplace.emit.save_model(plan.emitted, tmp / "model")
            if replicas_of(plan.training) > 1:  # their torchrun entry point
                write_train_script(tmp, optimizer=plan.training["optimizer"],
                                   replicas=replicas_of(plan.training),
                                   groups=plan.training.get("replica_torch_devices"))

    return atomic_output_dir(directory, write)
