"""The pipeline, wired: load -> trace -> cost -> fold -> solve (simulating every candidate) ->
emit -> verify -> report. ``plan`` runs the stages in that order, each taking what the one before
returned; an inference plan's are in ``inference.py``, a training step's (the same stages with
the step's graph) in ``training.py``, the emit and verify stages they share in ``emitting.py``,
and ``modules.py`` is the pipeline at module granularity. The plan's problem is the folded traced
graph (only zero-cost ops folded, so lossless): its makespan, memory, bound, gap and baselines
hold for the traced graph. ``solve_graph`` is the Python API behind ``autoplace solve``. Each
returns what it planned and writes nothing; ``save`` writes a plan's output directory, all at
once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

import autoplace.emit
import autoplace.report as report
from autoplace.config import Config, Granularity, Mode, Solve
from autoplace.emit import PartitionedModel
from autoplace.emit.distributed.ddp import microbatching, replicas_of, write_train_script
from autoplace.emit.distributed.devices import launch_devices
from autoplace.emit.distributed.ranks import write_launch_script
from autoplace.emit.distributed.tensor import write_tensor_launch
from autoplace.emit.distributed.tensor_train import write_tensor_train
from autoplace.emit.generate import DECODE_DIR, save_decode
from autoplace.emit.train.microbatch import split_batch
from autoplace.errors import EmitError, InfeasibleError
from autoplace.formats.output import atomic_output_dir
from autoplace.formats.plan import Plan
from autoplace.formats.records import Coarsening, ProfileRecord
from autoplace.ir import Device, Problem
from autoplace.pipeline.emitting import emit_plan
from autoplace.pipeline.forward import load, reusing_traces
from autoplace.pipeline.generation import GenerationStages
from autoplace.pipeline.inference import InferenceStages
from autoplace.pipeline.mesh import dp_shard, tensor_degrees
from autoplace.pipeline.record import min_gain, plan_of
from autoplace.pipeline.staged import (
    pp_values,
    staged_pass_candidate,
    staged_step_candidate,
)
from autoplace.pipeline.tensor import (
    fastest_fit_s,
    tensor_pass_candidate,
    tensor_step_candidate,
    weigh_step_meshes,
)
from autoplace.pipeline.training import TrainingStages
from autoplace.progress.notes import collecting, note, note_all
from autoplace.solve import Outpaced, solve

__all__ = ["Planned", "plan", "save", "solve_graph"]


@dataclass(frozen=True)
class Planned:
    """What ``plan`` returns: the ``plan`` and, beside it, the partitioned ``model`` it
    emitted (``None`` without one), which ``plan, model = autoplace.plan(...)`` unpacks; with
    ``--tp N``, also the one-device model its ``tensor_parallel`` candidate splits
    (``tensor_model``). ``save(planned, directory)`` writes them all."""

    plan: Plan
    model: PartitionedModel | None = None
    tensor_model: PartitionedModel | None = None

    def __iter__(self) -> Iterator[Any]:
        return iter((self.plan, self.model))


def plan(model: torch.nn.Module, example_inputs: Any, config: Config | None = None, *,
         loss: Callable[..., torch.Tensor] | None = None,
         example_targets: Any = ()) -> Planned:
    """Plan ``model`` on its ``example_inputs`` (a tuple of positional arguments, or a dict of
    keyword ones) as ``config`` says (``autoplace.Config``; default: an inference plan on the
    GPUs found, or the simulated set). A training plan (``Config(mode="training")``) plans one
    step of the model followed by ``loss(outputs, *example_targets)`` (without ``loss``, the
    model's own scalar loss). ``docs/api.md`` walks through the configuration.

    The model is switched to ``eval()`` (a training plan's to ``train()``, unless
    ``Training(layers="eval")``: ``train.layers``). With ``config.emit.model`` the
    partitioned model is built and, with ``config.emit.verify``, checked against the original with
    ``torch.testing.assert_close`` (a training plan's is trained beside it for 3 steps:
    losses, gradients, parameters), its peak memory per device measured against the plan's.
    Returns ``Planned(plan, model)``; raises ``ConfigError``, ``InfeasibleError`` (the model
    does not fit: which device, how many bytes short), ``VerificationError``, ...
    """
    config = Config() if config is None else config
    if config.granularity == Granularity.MODULE:
        from autoplace.pipeline.modules import plan_modules

        return Planned(plan_modules(model, example_inputs, config))
    # every stage's notes, in order (progress.notes); a trace asked for again reused
    with collecting() as notes, reusing_traces():
        cluster, found = config.devices.resolve()
        note_all(found)
        if config.parallel.pp is not None:  # before the work: a clear error
            pp_values(cluster, config.parallel.pp, config.parallel.tp)
        elif config.parallel.tp is not None:
            tensor_degrees(cluster, config.parallel.tp,  # before the work: a clear error
                           dp=config.parallel.dp if isinstance(config.parallel.dp, int) else 1)
        loaded = load(model, example_inputs, config, loss=loss, example_targets=example_targets)
        if isinstance(config.parallel.dp, int):  # its groups divide the batch: a clear error
            dp_shard(loaded.args, loaded.kwargs, config.parallel.dp)
        stages = (TrainingStages(config) if config.mode == Mode.TRAINING
                  else GenerationStages(config) if config.generate is not None
                  else InferenceStages(config))
        meshes = None  # a training step's (no --pp): weighed first, a placement solved only to
        # beat them; a pp x tp one's are weighed after, given the plan's trace
        if config.mode == Mode.TRAINING and config.parallel.tp is not None and (
                not config.parallel.pp):
            meshes = weigh_step_meshes(*stages.step_model(loaded), cluster, config)
        try:
            solved = (stages.solve(loaded, cluster) if meshes is None else
                      stages.solve(loaded, cluster, beat_s=fastest_fit_s(meshes)))
        except InfeasibleError as failed:
            if config.parallel.tp is None:
                raise
            planned, tensor_model = _mesh_alone(str(failed), loaded, cluster, config, stages,
                                                meshes=meshes,
                                                outpaced=isinstance(failed, Outpaced),
                                                options=failed.options)
            return Planned(replace(planned, notes=tuple(notes)), None,
                           tensor_model if config.emit.model else None)
        planned = stages.record(solved)
        emitted = None
        if config.emit.model:
            planned, emitted = emit_plan(planned, solved.forward.traced,
                                         stages.emitting(planned, solved, loaded), config.emit)
            if emitted is not None:
                planned = stages.check(planned, emitted, solved)
                if config.mode == Mode.INFERENCE:
                    note(no_launch_script(cluster.devices))
                if loaded.checkpoint is not None:  # train.LossModel holds it as ``model``
                    emitted.checkpoint = (loaded.checkpoint.under("model.")
                                          if config.mode == Mode.TRAINING else loaded.checkpoint)
        tensor_model = None
        if config.parallel.tp is not None and config.mode == Mode.TRAINING:
            step = solved.step  # its trace, where it traced the whole batch
            planned, tensor_model = (
                staged_step_candidate(
                    planned, solved.model, step.whole, cluster, config,
                    forward=step.forward if step.replicas == step.microbatches == 1 else None)
                if meshes is None else
                tensor_step_candidate(planned, solved.model, step.whole, cluster, config,
                                      found=meshes))
            if planned.is_mesh:  # faster than the placement: its model is not the plan's
                emitted = None
        elif config.parallel.tp is not None:
            candidate = staged_pass_candidate if config.parallel.pp else tensor_pass_candidate
            planned, tensor_model = candidate(planned, loaded, cluster, config,
                                              forward=solved.forward)
    profiled = solved.forward.profiled
    return Planned(replace(planned, notes=tuple(notes),
                           profile=ProfileRecord.from_dict(profiled.to_dict()) if profiled
                           else None), emitted,
                   tensor_model if config.emit.model else None)


def _mesh_alone(failure: str, loaded: Any, cluster: Any, config: Config, stages: Any, *,
                meshes: Any = None, outpaced: bool = False, options: tuple[Any, ...] = ()
                ) -> tuple[Plan, PartitionedModel | None]:
    """The plan where no placement fits (``failure`` says why; ``outpaced``: none was solved
    that could beat the ``meshes`` weighed first) and ``--tp`` was asked: the tensor-parallel
    candidate, if it fits (``pipeline.tensor``; ``InfeasibleError`` naming both where it does
    not). A training plan's candidate takes the model and loss the placement's ``stages``
    traced, so their last trace serves it where it is the same; ``options``: the replica
    counts its step tried (the recipes read them)."""
    import time

    began = time.perf_counter()
    if config.mode != Mode.TRAINING:
        candidate = staged_pass_candidate if config.parallel.pp else tensor_pass_candidate
        planned, model = candidate(None, loaded, cluster, config, failure=failure)
    else:
        step_model, whole = stages.step_model(loaded)
        planned, model = (
            staged_step_candidate(None, step_model, whole, cluster, config, failure=failure)
            if meshes is None else
            tensor_step_candidate(None, step_model, whole, cluster, config, failure=failure,
                                  found=meshes, outpaced=outpaced, options=options))
    return replace(planned, solver=replace(  # the mesh's weighing and check took this
        planned.solver, wall_s=time.perf_counter() - began)), model


def solve_graph(problem: Problem, solving: Solve | None = None, *,
                notes: Sequence[str] = ()) -> Plan:
    """Place a task graph read with ``autoplace.formats.graph`` (no model to trace or emit): the
    Python API behind ``autoplace solve``. ``solving``: how (``autoplace.Solve``); ``notes``
    (from ``resolve_cluster``) lead the plan's."""
    solving = Solve() if solving is None else solving
    options = solving.options()
    result, gain = min_gain(solve(problem, options=options), solving.min_gain)
    planned = plan_of(result, problem, name=problem.graph.name, tracer="graph",
                      coarsening=Coarsening(traced_ops=len(problem.graph.nodes),
                                            plan_nodes=len(problem.graph.nodes)),
                      budget_s=options.time_limit_s)
    return replace(planned, notes=(*notes, *result.notes), min_gain=gain)


def save(plan: Plan | Planned, directory: str | os.PathLike[str],
         model: PartitionedModel | None = None) -> Path:
    """Write ``plan.json``, the report (``report.html``, ``summary.md``, ``summary.txt``),
    ``device_map.json`` for a module-granularity plan, and, with the ``model`` emitted for the
    plan (``plan, model = autoplace.plan(...)``), ``model/`` (and ``train.py``, the torchrun
    entry point of a training plan's data-parallel replicas; ``launch.py``, one process per
    device) into ``directory``, atomically: into a temporary directory beside it, renamed into
    place (an older one is replaced); on any failure nothing is left behind. Returns the
    directory. ``save(autoplace.plan(...), directory)`` writes both too, and, with ``--tp N``,
    ``tensor_parallel/`` (the one-device model, ``split.json`` and ``launch.py``, or a training
    plan's ``train.py``: its ranks' torchrun entry point)."""
    tensor_model = None
    if isinstance(plan, Planned):
        tensor_model = plan.tensor_model
        plan, model = plan.plan, model if model is not None else plan.model
    data = plan.to_dict()

    def write(tmp: Path) -> None:
        (tmp / "plan.json").write_text(json.dumps(data, indent=1) + "\n")
        report.write_report(tmp, plan)
        if plan.device_map is not None:  # --granularity module: the Hugging Face device_map
            (tmp / "device_map.json").write_text(
                json.dumps(dict(plan.device_map.map), indent=1) + "\n")
        if model is not None:
            autoplace.emit.save_model(model, tmp / "model")
            if getattr(model, "decode", None) is not None:  # --generate: its decode pass
                save_decode(model.decode, tmp / "model" / DECODE_DIR)
            if replicas_of(plan.training) > 1:  # their torchrun entry point
                write_train_script(tmp, optimizer=plan.training.optimizer,
                                   replicas=replicas_of(plan.training),
                                   groups=plan.training.replica_torch_devices,
                                   microbatches=microbatching(plan.training, model,
                                                              plan.problem, plan.schedule),
                                   sharding=plan.training.sharding or "ddp",
                                   recompute=plan.training.sharding == "fsdp"
                                   and bool(plan.training.recompute))
            _launch_script(plan, model, tmp)
        if tensor_model is not None and plan.tensor_parallel is not None:
            _tensor_parallel(plan, tensor_model, tmp / "tensor_parallel")

    return atomic_output_dir(directory, write)


def _tensor_parallel(plan: Plan, model: PartitionedModel, directory: Path) -> None:
    """``directory``: the one-device ``model`` that ``plan.tensor_parallel`` splits, its
    ``split.json`` and ``launch.py`` (``tensor_main`` on each rank's planned torch device),
    or for a training plan's ``train.py`` (``tensor_train_main``)."""
    record = plan.tensor_parallel
    device_of = {d.name: d.torch_device for d in plan.problem.cluster.devices}
    directory.mkdir()
    autoplace.emit.save_model(model, directory / "model")
    devices = list(record.torch_devices) or [device_of[n] for n in record.devices]
    if record.optimizer is not None:
        example = getattr(model, "example_inputs", None)
        write_tensor_train(directory, devices=devices, names=list(record.devices),
                           split=record.split, optimizer=record.optimizer, dp=record.dp,
                           sharding=record.sharding or "ddp", recompute=record.recompute,
                           pp=record.pp, microbatches=record.microbatches,
                           schedule=record.schedule or "gpipe", model=model,
                           example=example and split_batch(*example, record.microbatches)[0])
    else:
        write_tensor_launch(directory, devices=devices, names=list(record.devices),
                            split=record.split, dp=record.dp, pp=record.pp, model=model,
                            example=getattr(model, "example_inputs", None))


def _launch_script(plan: Plan, model: PartitionedModel, directory: Path) -> None:
    """``launch.py``, one process per device (``emit.distributed.ranks``), for an inference plan of
    two or more devices that run as ranks (``launch_devices``: on one host or several, each rank
    on its planned device of its own host) and an example to run. The values crossing ranks are
    sized by one pass of the emitted model, so a model emitted without its weights (a checkpoint
    too large to load here) gets none."""
    example = getattr(model, "example_inputs", None)
    if any(p.is_meta for p in model.parameters()) or plan.training is not None:
        return
    ranks = launch_devices(plan.problem.cluster.devices)
    if isinstance(ranks, str) or example is None:
        return
    try:
        write_launch_script(directory, model, torch_devices=ranks.ranks, names=ranks.names,
                            hosts=ranks.hosts, local_devices=ranks.devices, example=example)
    except EmitError:  # a value launch.py cannot carry: the plan runs in one process
        (directory / "launch.py").unlink(missing_ok=True)


def no_launch_script(devices: Sequence[Device]) -> str | None:
    """Why the plan's ``devices`` get no ``launch.py`` (one process per device) though they are
    several: two of one host share a torch device, which the emitted model files segments by.
    ``None`` otherwise (one device, or devices that run as ranks)."""
    if len(devices) < 2:
        return None
    why = launch_devices(devices)
    if not isinstance(why, str):
        return None
    return (f"no launch.py: {why}; the plan runs in one process")
