"""The pipeline, wired: trace -> cost -> fold -> solve (simulating every candidate) -> emit ->
verify -> report. The plan's problem is the folded traced graph (only zero-cost ops folded, so
lossless): its makespan, memory, bound, gap and baselines hold for the traced graph. The solver
coarsens it to ``max_nodes`` for CP-SAT only as an aid. ``plan`` is the Python API behind
``autoplace plan`` and ``solve_graph`` the one behind ``autoplace solve``; each returns a
``Plan`` and writes nothing. ``save`` writes a plan's output directory (``plan.json``, the
report, the emitted model), all at once. ``forward.py`` traces, profiles, costs and folds a
model (its forward problem); ``step.py`` plans a training step from it and checks the emitted
model by training it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

import autoplace.emit
import autoplace.report as report
from autoplace.cluster import resolve_cluster
from autoplace.emit import emit_and_verify
from autoplace.emit.distributed.ddp import microbatching, replicas_of, write_train_script
from autoplace.emit.distributed.ranks import write_launch_script
from autoplace.emit.files.checkpoint import load_checkpoint
from autoplace.errors import EmitError, PinError
from autoplace.fold import DEFAULT_MAX_NODES
from autoplace.formats.output import atomic_output_dir
from autoplace.formats.plan import BaselineResult, Plan
from autoplace.formats.records import Coarsening, MinGain, PinsRecord, ProfileRecord
from autoplace.ir import Cluster, Placement, Problem
from autoplace.pipeline.forward import Tracing, traced_problem
from autoplace.pipeline.step import Step, check_step, plan_step
from autoplace.progress import phase, stage
from autoplace.simulate import simulate
from autoplace.simulate.schedules import microbatch_name
from autoplace.solve import DEFAULT_TIME_LIMIT_S, SolveOptions, SolveResult, solve
from autoplace.solve.baselines import (
    DEFAULT_MIN_GAIN,
    check_min_gain,
    prefer_single,
    split_gain,
)
from autoplace.solve.baselines.accelerate import (
    AccelerateMap,
    accelerate_baselines,
    baselines_on,
    on_graph,
)
from autoplace.solve.pins import Pins
from autoplace.solve.whatif import plan_row, solve_after_whatif, whatif_options, whatif_table
from autoplace.trace.load import normalize_inputs
from autoplace.train import TRAINING_NOTE, check_training, loss_model, training_targets
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
    recompute: str = "auto",
    dtype: str = "float32",
    pins: Mapping[str, str | int] | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
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
    table): for inference before the plan, within half of ``time_limit_s``, the plan's solve
    starting from the best of those plans and having the rest (``solve.whatif``); for training
    after it. accelerate's sequential and balanced device maps, where accelerate is installed, are
    among the baselines. A split that gains less than ``min_gain`` (a fraction) over the best
    single device is not made: the plan is that device, and says why (``Plan.min_gain``).

    ``mode="training"`` plans one training step with ``optimizer`` (``autoplace.train``): the
    model followed by ``loss(outputs, *example_targets)`` (or, without ``loss``, the model's
    own scalar loss) is traced, and each forward node gets a colocated backward and optimizer
    step. The emitted model computes the loss; verifying it also trains it beside the original
    (``emit.check.training.verify_training``: losses, gradients and parameters after 3 steps).
    With ``microbatches`` M > 1 the batch is cut into M micro-batches
    (``emit.train.microbatch.split_batch``), one micro-batch is traced, and the step runs M of them
    in ``schedule``'s order: ``gpipe``, ``1f1b`` or ``auto`` (each solved with half the time,
    the faster kept); the emitted model runs them so (``emit.train.microbatch.train_step``).
    ``replicas`` (``auto``, or a whole number R): data-parallel replicas of the step, each
    placed on its group of the devices with its shard of the batch and the gradients'
    all-reduce (``train.dataparallel``); ``auto`` plans every R the devices, the batch and
    the loss allow and keeps the fastest step. The plan is one replica's. ``recompute``
    (with micro-batches): ``auto`` recomputes each micro-batch's activations in its backward
    on the devices a placement overflows without it (``train.recompute``), ``all`` on every
    device, ``off`` never.

    ``dtype`` (``float32``, ``bfloat16``, ``float16``): a copy of the model and the floating
    example inputs and targets are cast to it before tracing (``train.precision``); a training
    plan in a half dtype is mixed precision (``emit.train.optimizer.MasterWeights``), one replica.

    ``pins`` (``{"model.layers.0": "cuda:1", "lm_head": "cpu", "0": 0}``: module paths as in
    ``model.named_modules()`` to devices, an integer being the i-th GPU as in a Hugging Face
    ``device_map``) fixes those modules' ops and parameters to those devices; the solver places
    the rest (``autoplace.solve.pins``). The model is also solved without them, and ``Plan.pins``
    says what they cost. Inference plans only.

    ``checkpoint`` (a safetensors file, or a directory ``save_pretrained`` wrote): the model's
    weights, loaded into it before tracing (``emit.files.checkpoint.load_checkpoint``: every tensor
    checked first, the missing and mis-shaped named); the emitted model refers to the
    checkpoint instead of holding a copy, and ``load_model`` reads each segment's tensors
    from it onto its device.
    """
    check_min_gain(min_gain)
    check_training(mode, optimizer, microbatches, schedule, replicas, recompute)
    if pins and mode == "training":
        raise PinError("pins apply to inference plans (--mode inference) for now: plan the "
                       "training step without --pin/--pin-map")
    dtype = check_dtype(dtype)
    options = SolveOptions(time_limit_s=time_limit_s, seed=seed, deterministic=deterministic,
                           objective=objective, contiguous=contiguous, solver=solver,
                           max_nodes=max_nodes)
    cluster, found = resolve_cluster(spec=devices if isinstance(devices, str) else None,
                                     cluster=devices if isinstance(devices, Cluster) else None,
                                     cluster_file=cluster_file)
    notes: list[str] = list(found)
    args, kwargs = normalize_inputs(example_inputs, where="example_inputs")
    source = None
    if checkpoint is not None:
        source, checkpoint_notes = load_checkpoint(model, checkpoint)
        notes += checkpoint_notes
    model.eval()
    model, (args, kwargs, example_targets) = cast(model, (args, kwargs, example_targets), dtype)
    notes += cast_notes(dtype, training=mode == "training")
    # A training step's loss check (train.loss_model, below) runs the model on its inputs, so
    # tracing does not run it once more per replica count.
    trace = Tracing(name=name, profile=profile, cache=cache, progress=progress, pins=pins,
                    checked=mode == "training")
    fewer = None  # the inference what-if rows, solved before the plan
    pinned = None  # with pins, the pins and the plan without them
    if mode == "training":
        targets = training_targets(example_targets)
        model = loss_model(model, loss, args, kwargs, targets)
        notes.append(TRAINING_NOTE)
        step = plan_step(model, (args, {**kwargs, "targets": targets}), cluster, options,
                          trace, optimizer=optimizer, microbatches=microbatches,
                          schedule=schedule, replicas=replicas, recompute=recompute, dtype=dtype,
                          notes=notes)
        forward, problem, solved, (args, kwargs) = (step.forward, step.problem, step.solved,
                                                    step.batches[0])
    else:
        forward = traced_problem(model, args, kwargs, cluster, trace, notes)
        problem = forward.problem
        stage("solve")
        extra, accelerate_notes, maps = accelerate_baselines(model, forward.graph, problem)
        notes += accelerate_notes
        if whatif:
            solved, fewer = solve_after_whatif(problem, options, extra_baselines=extra)
        else:
            solved = solve(problem, options=options, extra_baselines=extra)
        if forward.pins is not None:  # accelerate's maps, made once, on the unpinned graph too
            pinned = unpinned_record(forward.pins, forward.unpinned, maps, options, min_gain,
                                     _carried(forward.unpinned, problem, solved))
    traced, profiled, folded = forward.traced, forward.profiled, forward.folded
    result, gain = _min_gain(solved, min_gain)
    if mode == "training" and result.schedule is not solved.schedule and step.single:
        # the single device chosen, with its own recomputing graph
        step = replace(step, problem=step.single.problem, recompute=step.single.devices)
        problem = step.problem
    notes += result.notes
    # After Ctrl-C the user wants the plan so far now, not more solving for the what-if table.
    # For inference the rows on fewer devices were solved before the plan (within its limit).
    recomputing = mode == "training" and bool(step.recompute)
    scaling = None
    if fewer is not None and result.solver.status != "INTERRUPTED":
        scaling = (*fewer.rows, plan_row(problem, result))
    elif whatif and result.solver.status != "INTERRUPTED" and not recomputing:
        scaling = whatif_table(problem, full=result, options=whatif_options(options))
    if whatif and recomputing:
        notes.append("no what-if table: the recomputing step's graph is its placement's")
    planned = _plan_of(result, problem, name=name, tracer=traced.tracer,
                       coarsening=Coarsening(traced_ops=folded.traced_ops,
                                             plan_nodes=len(problem.graph.nodes),
                                             steps=(*folded.steps, *result.coarsening)))
    planned = replace(planned, solver=replace(
        planned.solver, budget_s=time_limit_s, whatif_s=fewer.spent_s if fewer else None))
    if pinned is not None:
        planned = replace(planned, pins=pinned)
    if mode == "training":
        planned = replace(planned, training=step.record(optimizer, result.schedule))
        if step.problem.pipeline_schedule != planned.training.schedule and (
                step.microbatches > 1):
            notes.append("1F1B's order needs the devices to form stages, and these feed each "
                         "other both ways (a tied weight read at both ends, say): the step "
                         "runs GPipe's order")
    if emit:
        planned, emit_notes = _emit(planned, traced, model, args, kwargs,
                                    forward=forward.problem, verify=verify,
                                    check_memory=check_memory,
                                    step=step if mode == "training" else None,
                                    meta_weights=source is not None and mode == "inference")
        notes += emit_notes
        if source is not None and planned.emitted is not None:
            # train.LossModel holds the model as ``model``
            planned.emitted.checkpoint = source.under("model.") if mode == "training" else source
    return replace(planned, notes=tuple(notes), whatif=scaling, min_gain=gain,
                   profile=ProfileRecord.from_dict(profiled.to_dict()) if profiled else None)

def unpinned_record(pins: Pins, free: Problem, maps: Sequence[AccelerateMap],
                    options: SolveOptions, min_gain: float,
                    starts: Mapping[str, Placement] | None = None) -> PinsRecord:
    """``plan.json``'s ``pins`` record: the ``pins`` and the plan the model gets without them
    (``free``, solved with the same options, accelerate's ``maps`` and ``--min-gain``, from
    ``starts``), which ``Plan.pins_cost_s`` compares the pinned plan with."""
    extra, _ = baselines_on(free, maps)
    phase("the plan without the pins")
    unpinned, _ = _min_gain(solve(free, options=options, extra_baselines=extra, starts=starts),
                            min_gain)
    return PinsRecord(modules=dict(pins.modules), ops=len(pins.device_of_op),
                      unpinned_makespan_s=unpinned.schedule.makespan_s,
                      unpinned_objective_s=unpinned.objective_s)


def _carried(onto: Problem, problem: Problem, solved: SolveResult) -> dict[str, Placement]:
    """``solved``'s plan of ``problem`` carried onto ``onto``, a folding of the same traced ops
    (each node where most of its ops are, ``accelerate.on_graph``), as a start: a pinned plan
    is a plan without pins too. None where it would put a node where it cannot run."""
    device_of = solved.schedule.placement.device_of
    placement, _ = on_graph(onto, {op: device_of[n.name] for n in problem.graph.nodes
                                   for op in n.ops})
    return {} if placement is None else {"the pinned plan": placement}


def _emit(planned: Plan, traced: Any, model: torch.nn.Module, args: tuple[Any, ...],
          kwargs: dict[str, Any], *, forward: Problem, verify: bool,
          check_memory: bool | None, step: Step | None,
          meta_weights: bool = False) -> tuple[Plan, list[str]]:
    """The partitioned model of ``planned``, verified. A training plan (its ``step``) emits
    its forward nodes (of micro-batch 0, of replica 0) as placed (backward and optimizer steps
    follow them: autograd and ``torch.optim`` run where the forward ran and the weights live);
    its outputs and forward memory are checked against that forward alone (on ``args``,
    ``kwargs``: one micro-batch of one replica's shard), and then it is trained beside the
    original on the whole batch: its micro-batches in the plan's order, its replicas as
    processes (under DistributedDataParallel, or each running its micro-batches and then
    averaging the gradients, ``emit.distributed.ddp``)."""
    stage("emit")
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
        device_of_op=device_of_op, check_outputs=verify, check_memory=check_memory,
        meta_weights=meta_weights)
    planned = replace(planned, emitted=emitted, verification=verification)
    if step is None or emitted is None:
        return planned, notes
    emitted.example_inputs = step.whole  # `autoplace run --train` cuts the whole batch again
    if not verify:
        return planned, notes
    planned, train_notes = check_step(planned, emitted, model, step, check_memory)
    return planned, notes + train_notes


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
                       coarsening=Coarsening(traced_ops=len(problem.graph.nodes),
                                             plan_nodes=len(problem.graph.nodes)))
    return replace(planned, notes=(*notes, *result.notes), min_gain=gain,
                   solver=replace(planned.solver, budget_s=time_limit_s))


def _min_gain(result: SolveResult, min_gain: float) -> tuple[SolveResult, MinGain]:
    """The ``--min-gain`` policy (``baselines.prefer_single``) applied to a solve's result, and
    the record ``plan.json`` keeps of it."""
    chosen, why = prefer_single(result.schedule, result.baselines, result.objective, min_gain)
    record = MinGain(threshold=min_gain, single_device_chosen=why is not None, reason=why,
                     split_devices=len(set(result.schedule.placement.device_of.values())),
                     split_gain=split_gain(result.schedule, result.baselines, result.objective))
    if why is None:
        return result, record
    return replace(result, schedule=chosen, notes=(*result.notes, why)), record


def _plan_of(result: SolveResult, problem: Problem, *, name: str, tracer: str,
             coarsening: Coarsening) -> Plan:
    return Plan(
        problem=problem,
        schedule=result.schedule,
        lower_bound_s=result.lower_bound_s,
        solver=result.solver,
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
    """Write ``plan.json``, the report (``report.html``, ``summary.md``, ``summary.txt``),
    ``device_map.json`` for a module-granularity plan, and, when the plan carries an emitted
    model, ``model/`` (and ``train.py``, the torchrun entry
    point of a training plan's data-parallel replicas) into ``directory``, atomically: into a
    temporary directory beside it, renamed into place (an older one is replaced); on any
    failure nothing is left behind. Returns the directory."""
    data = plan.to_dict()

    def write(tmp: Path) -> None:
        (tmp / "plan.json").write_text(json.dumps(data, indent=1) + "\n")
        report.write_report(tmp, plan)
        if plan.device_map is not None:  # --granularity module: the Hugging Face device_map
            (tmp / "device_map.json").write_text(
                json.dumps(dict(plan.device_map.map), indent=1) + "\n")
        if plan.emitted is not None:
            autoplace.emit.save_model(plan.emitted, tmp / "model")
            if replicas_of(plan.training) > 1:  # their torchrun entry point
                write_train_script(tmp, optimizer=plan.training.optimizer,
                                   replicas=replicas_of(plan.training),
                                   groups=plan.training.replica_torch_devices,
                                   microbatches=microbatching(plan.training, plan.emitted,
                                                              plan.problem, plan.schedule))
            _launch_script(plan, tmp)

    return atomic_output_dir(directory, write)


def _launch_script(plan: Plan, directory: Path) -> None:
    """``launch.py``, one process per device (``emit.distributed.ranks``), for an inference plan of
    two or more devices that each have a torch device of their own and an example to run. The values
    crossing ranks are sized by one pass of the emitted model, so a model emitted without its
    weights (a checkpoint too large to load here) gets none."""
    devices = plan.problem.cluster.devices
    example = getattr(plan.emitted, "example_inputs", None)
    if any(p.is_meta for p in plan.emitted.parameters()):
        return
    torch_devices = [d.torch_device for d in devices]
    if (plan.training is None and len(devices) > 1 and example is not None
            and len(set(torch_devices)) == len(devices)):
        try:
            write_launch_script(directory, plan.emitted, torch_devices=torch_devices,
                                names=[d.name for d in devices], example=example)
        except EmitError:  # a value launch.py cannot carry: the plan runs in one process
            (directory / "launch.py").unlink(missing_ok=True)
