"""The tensor-parallel candidate of a plan (``--tp N``, ``Config.parallel.tp``): the model
emitted on one device, its matmuls split as columns and rows
(``emit.distributed.tensor.column_row``), observed under DTensor on N fake ranks and simulated
as rank 0 runs it (``solve.tensor``), then run on N gloo ranks against the original and timed
there (``verify_tensor_parallel``). A training plan's (``tensor_step_candidate``) is the model
and its loss on the whole batch, its step observed forward and backward and priced with its
optimizer (``solve.tensor_train``), trained 3 steps on the gloo ranks against the original
(``verify_tensor_training``). With ``--dp`` the ranks are a dp x tp mesh (``pipeline.mesh``;
``auto``: each mesh ``_weighed``, the fastest ``keep_fastest``). The plan records it beside its
placement (``plan.tensor_parallel``) and says which is faster; ``save`` writes the one-device
model with its split and ranks' entry point (``launch.py``, ``train.py``) to
``OUT/tensor_parallel/``. ``pipeline.staged`` (pp x tp) builds on its public helpers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from autoplace.config import Config
from autoplace.emit import PartitionedModel, emit_model
from autoplace.emit.codegen.lower import lower
from autoplace.emit.device_map import local_device_map
from autoplace.emit.distributed.tensor import (
    column_row,
    divisible,
    matmuls,
    verify_tensor_parallel,
)
from autoplace.emit.distributed.tensor_train import verify_tensor_training
from autoplace.errors import ConfigError, InfeasibleError
from autoplace.formats.plan import (
    NO_FASTER_PLACEMENT,
    NO_PLACEMENT_FITS,
    Plan,
)
from autoplace.formats.records import (
    SHARDING_SAID,
    ReplicaOption,
    TensorParallelRecord,
    mesh_key,
    mesh_said,
)
from autoplace.ir import Cluster, Device, Placement, Problem, Schedule
from autoplace.pipeline.mesh import (
    SHARDINGS,
    Mesh,
    dp_shard,
    dp_values,
    mesh_faster,
    mesh_plan,
    over_dp,
    renamed,
    stretch,
    stretched,
    tensor_degrees,
    tensor_devices,
)
from autoplace.progress import stage
from autoplace.progress.notes import collecting, note
from autoplace.simulate import simulate
from autoplace.solve.baselines.recipes import recipe_baselines, recipes_said
from autoplace.solve.repeats import Unlike
from autoplace.solve.tensor import Observed, SplitError, observe, tensor_problem
from autoplace.solve.tensor_train import tensor_step_problem
from autoplace.trace import TracedModel
from autoplace.train.sharded import fsdp_op_units

__all__ = ["TIMED_PASSES", "Priced", "Unplaced", "Weighed", "bytes_over", "keep_fastest",
           "measured_collectives_s", "observe_split", "on_workers_here", "one_device_copy",
           "tensor_pass_candidate", "tensor_step_candidate"]

TIMED_PASSES = 5  # passes timed on the gloo ranks, after the checked one
_NOT_WEIGHED = ("tensor parallelism not weighed (--tp auto): the first two devices are not "
                "alike, or there is one device")


def tensor_step_candidate(planned: Plan | None, model: torch.nn.Module,
                          whole: tuple[tuple[Any, ...], dict[str, Any]], cluster: Cluster,
                          config: Config, *, found: list[Weighed | None],
                          failure: str | None = None, outpaced: bool = False,
                          options: tuple[ReplicaOption, ...] = ()
                          ) -> tuple[Plan, PartitionedModel | None]:
    """The tensor-parallel candidate of a training plan's step (``pipeline.training``):
    ``model`` (the model and its loss) on the ``whole`` batch, its meshes ``found`` by
    ``weigh_step_meshes``, the fastest kept and checked, and the recipes written by hand
    among the plan's baselines (``solve.baselines.recipes``). ``planned`` ``None``: no placement of
    the step fits (``failure`` says why; ``outpaced``: none can beat the mesh; ``options``:
    each replica count tried), and the plan is the mesh (``keep_fastest``)."""
    from autoplace.train.layers import kept_state

    args, kwargs = whole
    unplaced = Unplaced(failure, config.name, config.dtype, outpaced=outpaced)
    if not found:
        return keep_fastest(planned, [], model, args, kwargs, verify=False, unplaced=unplaced)
    if planned is not None and planned.training is not None:
        options = planned.training.replica_options or ()
    with kept_state(model):  # checking runs it in train()
        made, one = keep_fastest(planned, found, model, args, kwargs,
                                 verify=config.emit.verify, optimizer=config.training.optimizer,
                                 unplaced=unplaced)
    record = made.tensor_parallel  # None where no degree could be weighed
    if record is not None and not made.is_mesh and record.fits and (
            record.makespan_s < made.makespan_s):
        kept = min((w for w in found if w is not None), key=lambda w: _first(w.record))
        made = mesh_faster(made, kept.priced.rank0, kept.priced.schedule, name=config.name,
                           tracer=kept.tracer, dtype=config.dtype, traced_ops=kept.traced_ops)
    recipes = recipe_baselines(found, options, cluster)
    note(recipes_said(recipes))
    return replace(made, baselines={**made.baselines, **recipes}), one



def weigh_step_meshes(model: torch.nn.Module, whole: tuple[tuple[Any, ...], dict[str, Any]],
                      cluster: Cluster, config: Config) -> list[Weighed | None]:
    """The meshes of a training plan's step, weighed, not checked (``[]``: no degree): ``model``
    (the model and its loss) on the ``whole`` batch (every rank sees it all; traced here,
    before the plan's own step, whose trace of the same batch reuses it:
    ``forward.reusing_traces``), with the plan's optimizer; with ``parallel.dp`` a dp x tp
    mesh, each tp group traced and priced on its share of the batch (``Mesh``; ``auto``: each
    of ``dp_values``)."""
    from autoplace.pipeline.forward import Tracing, traced_problem
    from autoplace.pipeline.measured import backward_factors
    from autoplace.train.layers import kept_state

    args, kwargs = whole
    dps = dp_values(cluster, config, args, kwargs)
    if not any(tensor_degrees(cluster, config.parallel.tp, dp=dp) for dp in dps):
        return []
    found = []
    with kept_state(model):  # tracing and observing run it in train()
        for dp in dps:
            shard = dp_shard(args, kwargs, dp)
            with collecting():  # the plan's step says what tracing finds
                traced = traced_problem(model, *shard, cluster, Tracing.of(config, checked=True))
            with collecting():
                factors, _ = backward_factors(traced.profiled, model, *shard, cluster)
            mesh = None if dp == 1 else Mesh(
                dp=dp, shardings=SHARDINGS[str(config.training.fsdp)],
                profiled=traced.profiled, cache=config.cost.cache)
            found.append(_weighed(traced.problem, traced.traced, args, kwargs,
                                  ranks=config.parallel.tp, mesh=mesh,
                                  training=(config.training.optimizer, factors, config.dtype,
                                            str(config.training.recompute)),
                                  cache=config.cost.cache))
    return found


def fastest_fit_s(found: list[Weighed | None] | None) -> float | None:
    """The step of the fastest of the meshes ``found`` that fits; ``None`` where none does."""
    fits = [w.record.makespan_s for w in found or () if w is not None and w.record.fits]
    return min(fits, default=None)


def tensor_pass_candidate(planned: Plan | None, loaded: Any, cluster: Cluster, config: Config,
                          *, forward: Any = None, failure: str | None = None
                          ) -> tuple[Plan, PartitionedModel | None]:
    """The tensor-parallel candidate of an inference plan's pass of ``loaded`` (the model and
    its inputs; ``forward``, the plan's trace, else traced here); with ``parallel.dp`` a dp x
    tp mesh, each tp group traced and priced on its share of the batch (the groups run apart:
    no collective between them; ``auto``: each of ``dp_values`` weighed, the fastest kept,
    checked). ``planned`` ``None``: no placement fits (``failure`` says why); the mesh is it."""
    from autoplace.pipeline.forward import Tracing, traced_problem

    args, kwargs = loaded.args, loaded.kwargs
    found = []
    for dp in dp_values(cluster, config, args, kwargs):
        traced = forward
        if traced is None or dp > 1:
            with collecting():  # the plan's pass said what tracing finds
                traced = traced_problem(loaded.model, *dp_shard(args, kwargs, dp), cluster,
                                        Tracing.of(config, checked=True))
        found.append(_weighed(traced.problem, traced.traced, args, kwargs,
                              ranks=config.parallel.tp,
                              mesh=Mesh(dp=dp, shardings=()) if dp > 1 else None,
                              cache=config.cost.cache))
    return keep_fastest(planned, found, loaded.model, args, kwargs, verify=config.emit.verify,
                        unplaced=Unplaced(failure, config.name, config.dtype))


@dataclass(frozen=True)
class Priced:
    """One degree of a mesh priced (``_weigh``): its record (unchecked), what DTensor did,
    rank 0's problem and simulated schedule, which every rank's mirrors, and for a training
    step over dp each sharding's step and bytes over memory (``shardings``, with the kept
    recomputation: ``solve.baselines.recipes`` reads them)."""

    record: TensorParallelRecord
    observed: Observed
    rank0: Problem
    schedule: Schedule
    shardings: Mapping[str, tuple[float, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Weighed:
    """A mesh weighed (``_weighed``): its fastest degree ``priced`` (``degrees``: each one
    weighed), the one-device model its ranks split, and the cluster."""

    priced: Priced
    one: PartitionedModel
    cluster: Cluster
    tracer: str
    traced_ops: int
    degrees: Mapping[int, Priced] = field(default_factory=dict)

    @property
    def record(self) -> TensorParallelRecord:
        return self.priced.record


def _weighed(problem: Problem, traced: TracedModel, args: tuple[Any, ...],
             kwargs: dict[str, Any], *, ranks: int | str,
             training: tuple[str, Mapping[str, float], str, str] | None = None,
             mesh: Mesh | None = None, cache: Any = None) -> Weighed | None:
    """The candidate of ``ranks`` ranks on the first devices of ``problem``'s cluster
    (``mesh``: ``mesh.dp`` such groups, ``problem`` one group's share of the batch;
    ``"auto"``: each degree ``tensor_degrees`` gives, the fastest kept), weighed, not checked;
    ``None`` where ``auto`` finds no degree. ``training``: a training step's optimizer,
    backward factors (per device, ``train.step_problem``'s) and dtype; ``problem`` is then the
    forward of the model and its loss, ``kwargs`` holding the ``targets``. ``cache``: the
    profile cache that keeps what was measured here (the default one where ``None``)."""
    dp = mesh.dp if mesh is not None else 1
    degrees = tensor_degrees(problem.cluster, ranks, dp=dp)
    if not degrees:
        return None
    stage("tensor parallel")
    units = fsdp_op_units(problem.graph) if training is not None else None  # FSDP2's, AC's
    one = one_device_copy(traced, units=units)  # each FSDP2 unit's ops a segment of their own
    # The same for every degree, found on the whole graph (every matmul's inputs), and named
    # as ``one`` holds each weight.
    pairs = renamed(column_row(lower(traced.module, meta_weights=traced.has_meta_params)), one)
    one.example_inputs = (tuple(args), dict(kwargs))  # saved with it: what its ranks run
    observed_on = dp_shard(args, kwargs, dp)
    weighed: dict[int, Priced] = {}
    for degree in degrees:
        try:
            weighed[degree] = _weigh(problem, traced, one, pairs, degree, *observed_on,
                                     training=training, mesh=mesh, units=units, cache=cache)
        except ConfigError as refused:
            if ranks != "auto":
                raise
            note(f"tensor parallel over {degree} ranks not weighed (--tp auto): {refused}")
    if not weighed:
        return None
    best = weighed[min(weighed, key=lambda d: _first(weighed[d].record))]
    record = replace(best.record, weighed={d: p.record.makespan_s for d, p in weighed.items()}
                     if ranks == "auto" else {})
    return Weighed(priced=replace(best, record=record), one=one, cluster=problem.cluster,
                   tracer=traced.tracer, traced_ops=len(traced.graph.nodes), degrees=weighed)


@dataclass(frozen=True)
class Unplaced:
    """What a plan of the mesh alone needs (``mesh_plan``): why no placement fits
    (``failure``; ``None``: one does, and the mesh is weighed beside it; ``outpaced``: none
    was solved that could beat the mesh), the model's name and the dtype."""

    failure: str | None
    name: str
    dtype: str
    outpaced: bool = False


def keep_fastest(planned: Plan | None, found: list[Weighed | None], model: torch.nn.Module,
                 args: tuple[Any, ...], kwargs: dict[str, Any], *, verify: bool,
                 optimizer: str | None = None, unplaced: Unplaced
                 ) -> tuple[Plan, PartitionedModel | None]:
    """``planned`` with the fastest of the meshes ``found`` that fits (any, where none does)
    as its ``tensor_parallel`` record (``meshes``: each one's prediction, where several were
    weighed), checked on gloo ranks with ``verify`` (a training step's with ``optimizer``), and
    the one-device model its ranks split (``None`` for a model on the meta device: planned,
    not emitted). ``planned`` ``None``: no placement fits, and the plan is the mesh
    (``mesh_plan``), or ``InfeasibleError`` where it does not fit either."""
    found = [w for w in found if w is not None]
    if not found and planned is None:
        raise InfeasibleError(f"{unplaced.failure.rstrip('. ')}. The tensor-parallel "
                              "candidate (--tp) was not weighed either: "
                              + _NOT_WEIGHED.split(": ", 1)[1])
    if not found:
        note(_NOT_WEIGHED)
        return planned, None
    kept = min(found, key=lambda w: _first(w.record))
    record, one = kept.record, kept.one
    if planned is None and not record.fits:
        raise InfeasibleError(
            f"{unplaced.failure.rstrip('. ')}. The tensor-parallel candidate (--tp) does not "
            "fit either: "
            f"{record.mesh_text} peaks at {record.peak_bytes} bytes on rank 0, "
            f"{record.over_bytes} bytes over {record.devices[0]}'s memory (the least of "
            "those weighed): add devices"
            + ("" if record.sharding == "fsdp" or "fsdp" in record.weighed_sharding
               else ", or shard the model over a dp dimension of the mesh (--dp with --fsdp "
               "on)"))
    meta = any(p.is_meta for p in one.parameters())  # planned on fake tensors, not emitted
    if len(found) > 1:
        record = replace(record, meshes={mesh_key(w.record): w.record.makespan_s
                                         for w in found})
    ranks, dp = record.ranks, record.dp
    if verify and not meta and optimizer is not None:
        inputs = {k: v for k, v in kwargs.items() if k != "targets"}
        check = verify_tensor_training(one, model, args, inputs, kwargs.get("targets", ()),
                                       ranks=ranks, optimizer=optimizer, split=record.split,
                                       dp=dp, sharding=record.sharding or "ddp",
                                       recompute=record.recompute, pp=record.pp,
                                       microbatches=record.microbatches,
                                       schedule=record.schedule or "gpipe")
        record = replace(record, check="passed", measured_s=check["measured_s"],
                         max_abs_diff=max(check["max_abs_diff_gradients"],
                                          check["max_abs_diff_parameters"]))
        note(_trained(check, ranks))
    elif verify and not meta:
        check = verify_tensor_parallel(one, model, args, kwargs, ranks=ranks,
                                       repeats=TIMED_PASSES, split=record.split, dp=dp,
                                       pp=record.pp)
        record = replace(record, check="passed", max_abs_diff=check["max_abs_diff"],
                         measured_s=check["measured_s"])
    if planned is None:
        failure = unplaced.failure.rstrip(". ")
        note(("" if failure.startswith("no placement") else "no placement fits: ")
             + f"{failure}. The plan is the tensor-parallel candidate, which fits: "
             f"{record.mesh_text}, rank 0's {'step' if optimizer else 'pass'} simulated as "
             "the plan's schedule; no lower bound is proven for it")
        planned = mesh_plan(record, kept.priced.rank0, kept.priced.schedule,
                            name=unplaced.name, tracer=kept.tracer, dtype=unplaced.dtype,
                            traced_ops=kept.traced_ops,
                            status=NO_FASTER_PLACEMENT if unplaced.outpaced
                            else NO_PLACEMENT_FITS)
    note(_said(record, planned, kept.priced.observed,
               here=on_workers_here(tensor_devices(kept.cluster, ranks, dp=dp)), meta=meta))
    return replace(planned, tensor_parallel=record), None if meta else one


def _weigh(problem: Problem, traced: TracedModel, one: PartitionedModel,
           pairs: Mapping[str, tuple[str, int]], ranks: int, args: tuple[Any, ...],
           kwargs: dict[str, Any], *,
           training: tuple[str, Mapping[str, float], str, str] | None = None,
           mesh: Mesh | None = None, units: Mapping[str, str] | None = None,
           cache: Any = None) -> Priced:
    """The candidate of ``ranks`` ranks, unchecked: ``one`` split as ``pairs`` (its
    ``column_row``) where the ranks divide the split dimension, observed under DTensor on fake
    ranks and rank 0 simulated (``training``: its step, ``tensor_candidate``'s; ``mesh``: with
    its data-parallel collectives, each sharding priced, the faster kept); ``ConfigError``
    where DTensor cannot run it."""
    dp = mesh.dp if mesh is not None else 1
    chosen = tensor_devices(problem.cluster, ranks, dp=dp)
    split, whole = divisible(one, pairs, ranks)
    if whole:
        note(f"tensor parallel over {ranks} ranks: {', '.join(whole)} kept whole, their split "
             f"dimension not a multiple of {ranks}")
    observed = observe_split(problem, traced, split, ranks, args, kwargs,
                             optimizer=training[0] if training else None, units=units)
    everyone = tuple(d.name for d in chosen)
    names = everyone[:ranks]  # rank 0's tp group; its dp group is everyone[::ranks]
    here = on_workers_here(chosen)
    measured_s = (measured_collectives_s(observed, ranks, chosen[0].torch_device, cache)
                  if here else None)
    priced: dict[str, tuple[float, int]] = {}
    recompute, kept = False, None
    if training is None:
        rank0 = tensor_problem(problem, observed, names, measured=here, collectives_s=measured_s)
        rank0 = stretched(rank0, stretch(len(everyone)) if here else 1.0)
        schedule = simulate(rank0, _on(rank0, names[0]))
    else:
        rank0, schedule, kept, priced, recompute = _step_of(
            problem, observed, everyone, ranks=ranks, training=training, mesh=mesh,
            here=here, collectives_s=measured_s)
    moved = [c for table in (observed.collectives, observed.backward_collectives)
             for per in table.values() for c in per]
    columns, rows = matmuls(split)
    return Priced(record=TensorParallelRecord(
        ranks=ranks, devices=everyone, makespan_s=schedule.makespan_s,
        peak_bytes=schedule.peak_bytes[names[0]], columns=columns, rows=rows,
        collectives=len(moved), collective_bytes=sum(b for _, b in moved),
        split=split, optimizer=training[0] if training else None, dp=dp,
        torch_devices=tuple(d.torch_device for d in chosen),
        sharding=kept if mesh is not None else None,
        weighed_sharding={s: t for s, (t, _) in priced.items()}
        if mesh is not None and len(priced) > 1 else {},
        over_bytes=bytes_over(schedule), recompute=recompute),
        observed=observed, rank0=rank0, schedule=schedule, shardings=priced)


def observe_split(problem: Problem, traced: TracedModel, split: Mapping[str, tuple[str, int]],
                  ranks: int, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                  optimizer: str | None = None, units: Mapping[str, str] | None = None
                  ) -> Observed:
    """``traced`` emitted on one device (its ``units`` cut apart) and split as ``split``,
    observed under DTensor on ``ranks`` fake ranks (``solve.tensor.observe``; ``optimizer``:
    a training step's); ``ConfigError`` naming the op DTensor cannot run."""
    try:
        try:  # observe shards the copy; alike segments given unlike inputs: each observed
            return observe(one_device_copy(traced, units), split, ranks, args, kwargs,
                           optimizer=optimizer)
        except Unlike:
            return observe(one_device_copy(traced, units), split, ranks, args, kwargs,
                           optimizer=optimizer, repeated=False)
    except SplitError as failed:
        module = next((n.module for n in problem.graph.nodes if failed.op in n.ops), None)
        first = str(failed.error).strip().splitlines()[0].rstrip(".")
        raise ConfigError(
            f"{{parallel.tp={ranks}}}: DTensor cannot run {failed.op}"
            + (f" ({module})" if module else "") + f" split over {ranks} ranks: {first}; "
            + (failed.remedy or "choose a degree that divides the model's attention heads "
               "(key/value heads included) and hidden sizes")) from None


def _step_of(problem: Problem, observed: Observed, everyone: tuple[str, ...], *, ranks: int,
             training: tuple[str, Mapping[str, float], str, str], mesh: Mesh | None,
             here: bool, collectives_s: float | None
             ) -> tuple[Problem, Schedule, str | None, dict[str, tuple[float, int]], bool]:
    """Rank 0's training step (``tensor_step_problem``) over ``everyone`` (a dp x ``ranks``
    mesh in rank order), each of ``mesh``'s shardings priced, and again with each unit
    recomputed where ``training``'s recompute is ``auto`` and none fits without: the kept
    step (one that fits, the fastest; else the least over) and its simulation, its sharding,
    each sharding's time and bytes over memory with the kept recomputation, and whether it
    recomputes."""
    optimizer, factors, dtype, recompute = training
    names, dp = everyone[:ranks], len(everyone) // ranks
    factor = stretch(len(everyone)) if here else 1.0

    def priced_with(again: bool) -> dict[tuple[str | None, bool], tuple[Problem, Schedule]]:
        found = {}
        for sharding in mesh.shardings if mesh is not None else (None,):
            step = stretched(tensor_step_problem(
                problem, observed, names, optimizer=optimizer, factors=factors, measured=here,
                collectives_s=collectives_s, dtype=dtype, recompute=again,
                data_parallel=over_dp(problem.cluster, everyone[::ranks], sharding, mesh,
                                      optimizer)), factor)
            found[sharding, again] = step, simulate(step, _on(step, names[0]))
        return found

    found = priced_with(False)
    if recompute == "auto" and all(bytes_over(schedule) for _, schedule in found.values()):
        found |= priced_with(True)
    kept = min(found, key=lambda k: (bytes_over(found[k][1]), found[k][1].makespan_s,
                                     k[0] != "ddp", k[1]))
    mesh_name = f"dp {dp} x tp {ranks}" if dp > 1 else f"tp {ranks}"
    for (sharding, again), (_, schedule) in found.items():
        if bytes_over(schedule) and (sharding, again) != kept:
            note(f"{mesh_name}" + (f" with {SHARDING_SAID[sharding]} over dp" if sharding else "")
                 + (", each block recomputed" if again else "")
                 + f": rank 0 peaks {bytes_over(schedule)} bytes over {names[0]}'s memory")
    if kept[1]:
        note(f"{mesh_name}: each unit's forward runs again before its backward (activation "
             "checkpointing per block, torch.utils.checkpoint), which rank 0 needs to fit: "
             f"{found[kept][1].makespan_s * 1e3:.3f} ms a step with it")
    return (*found[kept], kept[0],
            {s: (found[s, again][1].makespan_s, bytes_over(found[s, again][1]))
             for s, again in found if again == kept[1]},
            kept[1])


def bytes_over(schedule: Any) -> int:
    """How many bytes a rank's simulated ``schedule`` peaks over its device's memory."""
    return sum(schedule.over_capacity.values())


def _first(record: TensorParallelRecord) -> tuple[int, float]:
    """The order candidates are kept in: those that fit, the fastest first; where none does,
    the one that overflows least (the closest to fitting says the most)."""
    return record.over_bytes, record.makespan_s


def _on(problem: Problem, device: str) -> Placement:
    """Every node of ``problem`` on ``device``."""
    return Placement(device_of={n.name: device for n in problem.graph.nodes})


def on_workers_here(devices: tuple[Device, ...]) -> bool:
    """Whether ``devices`` are this machine's CPU workers (their ops and collectives are
    measured here)."""
    return all(d.torch_device.startswith("cpu") for d in devices)


def _said(record: TensorParallelRecord, planned: Plan, observed: Observed, *, here: bool,
          meta: bool) -> str:
    """The candidate's note: what is split, what DTensor moves, the prediction against the
    placement's, where it runs, and what was measured."""
    ranks, training = record.ranks, record.optimizer is not None
    faster = record.fits and (planned.is_mesh or record.makespan_s < planned.makespan_s)
    script = "train.py" if training else "launch.py"
    if not record.fits:
        where = (f"it does not fit: rank 0 peaks at {record.peak_bytes} bytes, "
                 f"{record.over_bytes} over {record.devices[0]}'s memory")
    elif meta:
        where = ("planned on fake tensors (the parameters are on the meta device: DTensor's "
                 f"dispatch priced at {(observed.dispatch_s or 0) * 1e6:.0f} us an op, "
                 "measured here), not emitted: there are no weights to run")
    elif faster:
        where = f"run it as ranks with tensor_parallel/{script} beside plan.json"
    else:
        where = "tensor_parallel/ beside plan.json runs the candidate all the same"
    weighed = "" if not record.weighed else "weighed (--tp auto) " + ", ".join(
        f"tp {d} {s * 1e3:.3f} ms" for d, s in sorted(record.weighed.items())) + "; kept "
    if record.meshes:
        weighed = (f"meshes weighed (--{'pp' if record.pp > 1 else 'dp'} auto) " + ", ".join(
            f"{mesh_said(key)} {s * 1e3:.3f} ms" for key, s in record.meshes.items())
            + "; kept " + weighed)
    unit = "step" if training else "pass"
    moved = (f"{record.collectives} collectives of {record.collective_bytes} bytes a {unit} "
             f"(DTensor's, observed on {ranks} fake ranks"
             + (f": {sum(map(len, observed.collectives.values()))} in the forward, "
                f"{sum(map(len, observed.backward_collectives.values()))} in the backward, "
                "which ran under the same observation" if training else "") + ")")
    if training:
        moved += ("; the backward's compute " + (
            f"measured under DTensor here, {observed.backward_s / observed.forward_s:.2f}x "
            "the forward's" if here and observed.forward_s and observed.backward_s else
            "the plan's backward factor times the rank's share of the forward (2x unless "
            "profiled: train.graph's rule, not observed op by op)")
            + f", the {record.optimizer} update on rank 0's shards")
    weighed += record.stages_text
    if record.dp > 1:
        weighed += (f"a dp {record.dp} x tp {ranks} mesh ({', '.join(record.devices)}), each "
                    f"tp group on 1/{record.dp} of the batch"
                    + (f", {SHARDING_SAID[record.sharding]} over dp" if record.sharding else "")
                    + ("" if not record.weighed_sharding else " (weighed: " + ", ".join(
                        f"{SHARDING_SAID[k]} {v * 1e3:.3f} ms"
                        for k, v in record.weighed_sharding.items())
                        + ")") + "; ")
    return (f"{weighed}tensor parallel {'training ' if training else ''}over {ranks} ranks"
            + ("" if record.dp > 1 else f" ({', '.join(record.devices)}), " + (
                "the batch through the stages" if record.pp > 1 else "each on the whole "
                "batch")) + ": " if training else
            f"{weighed}tensor parallel over {ranks} ranks ({', '.join(record.devices)}): ") + (
            f"{record.columns} column and {record.rows} row matmuls, {moved}; "
            f"{record.makespan_s * 1e3:.3f} ms a {unit} predicted"
            + (f": {planned.unplaced}, and this is the plan; " if planned.is_mesh else
               f" against the {'plan' if training else 'placement'}'s "
               f"{planned.makespan_s * 1e3:.3f} ms: "
               + ("faster; " if faster else "" if not record.fits
                  else f"the {'plan' if training else 'placement'} is faster; "))
            + where
            + (f"; {'steps' if training else 'outputs'} equal on {record.world} gloo ranks, "
               f"{record.measured_s * 1e3:.3f} ms a {unit} measured there"
               + ("" if here else " (this machine's CPU, not the planned devices)")
               if record.measured_s is not None else ""))


def _trained(check: Mapping[str, Any], ranks: int) -> str:
    """The training check's note (``verify_tensor_training``'s record)."""
    dp = check.get("dp", 1)
    mesh = (f"{dp * ranks} gloo ranks, a dp {dp} x tp {ranks} mesh ("
            + ("FSDP2" if check.get("sharding") == "fsdp" else "gradients averaged")
            + " over dp, DTensor over tp" if dp > 1 else f"{ranks} gloo ranks (DTensor")
    return (f"tensor-parallel training check passed: {check['steps']} {check['optimizer']} "
            f"steps on {mesh}, every dropout at zero"
            + (", each unit's forward recomputed in the backward" if check.get("recompute")
               else "") + ") give the original's "
            f"losses ({', '.join(f'{v:.6g}' for v in check['losses'])}), gradients (gathered "
            f"whole) and updated parameters"
            + (f"; dropout is active in the step: its {check['dropout_ops']} dropout(s) on, "
               f"the first loss is {check['loss_with_dropout']:.6g}"
               if check.get("dropout_ops") else ""))


def measured_collectives_s(observed: Observed, ranks: int, worker: str, cache: Any) -> float | None:
    """A pass's collectives, in order, measured on ``ranks`` gloo processes here
    (``profile.allreduce``, mode ``collectives``) and kept in the profile ``cache`` under the
    CPU behind ``worker`` (a torch device), as the gradients' averaging is; ``None`` where
    that fails (the ring formulas price them then)."""
    from autoplace.cluster import device_key, inventory
    from autoplace.profile import open_cache
    from autoplace.profile.allreduce import COLLECTIVES, allreduce_s

    sequence = [[COLLECTIVES.index(kind), nbytes]
                for table in (observed.collectives, observed.backward_collectives)
                for per in table.values() for kind, nbytes in per]
    if not sequence:
        return 0.0
    try:
        seconds, before = allreduce_s(sequence, replicas=ranks, mode="collectives",
                                      cache=cache if cache is not None else open_cache(),
                                      device_key=device_key(worker, inventory()))
    except Exception as exc:  # noqa: BLE001 - the ring formulas still price them
        note(f"the tensor-parallel collectives could not be measured ({type(exc).__name__}: "
             f"{exc}); the ring formulas price them")
        return None
    note(f"the {len(sequence)} collectives of a tensor-parallel "
         f"{'step' if observed.backward_collectives else 'pass'} measured"
         f"{' before' if before else ''} on {ranks} gloo processes here: "
         f"{seconds * 1e3:.3f} ms")
    return seconds


def one_device_copy(traced: TracedModel, units: Mapping[str, str] | None = None) -> Any:
    """``traced`` emitted whole on this machine's CPU (a fresh copy each call: ``observe``
    replaces its parameters), each FSDP2 unit's ops (``units``) cut into segments of their
    own."""
    here = local_device_map(["cpu"])["cpu"]
    return emit_model(traced.module, {n.name: here for n in traced.module.graph.nodes
                                      if n.op == "call_function"}, runtime="sequential",
                      meta_weights=traced.has_meta_params, units=units)

