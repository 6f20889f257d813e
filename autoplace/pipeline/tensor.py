"""The tensor-parallel candidate of a plan (``--tp N``, ``Config.parallel.tp``): the model
emitted on one device, its matmuls split as columns and rows
(``emit.distributed.tensor.column_row``), observed under DTensor on N fake ranks and simulated
as rank 0 runs it (``solve.tensor``), then run on N gloo ranks against the original and timed
there (``verify_tensor_parallel``). A training plan's (``tensor_step_candidate``) is the model
and its loss on the whole batch, its step observed forward and backward and priced with its
optimizer (``solve.tensor_train``), trained 3 steps on the gloo ranks against the original
(``verify_tensor_training``). The plan records it beside its placement (``plan.tensor_parallel``)
and says which is faster; ``save`` writes the one-device model with its split and ranks' entry
point (``launch.py``, or ``train.py``) to ``OUT/tensor_parallel/``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from autoplace.config import Config
from autoplace.emit import PartitionedModel, emit_model
from autoplace.emit.device_map import local_device_map
from autoplace.emit.distributed.tensor import (
    column_row,
    divisible,
    matmuls,
    verify_tensor_parallel,
)
from autoplace.emit.distributed.tensor_train import verify_tensor_training
from autoplace.errors import ConfigError
from autoplace.formats.plan import Plan
from autoplace.formats.records import TensorParallelRecord
from autoplace.ir import Cluster, Device, Placement, Problem
from autoplace.progress import stage
from autoplace.progress.notes import collecting, note
from autoplace.simulate import simulate
from autoplace.solve.tensor import Observed, SplitError, observe, tensor_problem
from autoplace.solve.tensor_train import tensor_step_problem
from autoplace.trace import TracedModel

__all__ = ["TIMED_PASSES", "tensor_candidate", "tensor_degrees", "tensor_devices",
           "tensor_step_candidate"]

TIMED_PASSES = 5  # passes timed on the gloo ranks, after the checked one
_NOT_WEIGHED = ("tensor parallelism not weighed (--tp auto): the first two devices are not "
                "alike, or there is one device")


def tensor_step_candidate(planned: Plan, solved: Any, cluster: Cluster, config: Config
                          ) -> tuple[Plan, PartitionedModel | None]:
    """``tensor_candidate`` of a training plan's ``solved`` step (``pipeline.training``): the
    model and its loss on the whole batch (every rank sees it all; traced again where the
    plan's step traced a replica's shard or a micro-batch), with the plan's optimizer."""
    from autoplace.pipeline.forward import Tracing, traced_problem
    from autoplace.pipeline.measured import backward_factors
    from autoplace.train.layers import kept_state

    step, model = solved.step, solved.model
    args, kwargs = step.whole
    if not tensor_degrees(cluster, config.parallel.tp):
        note(_NOT_WEIGHED)
        return planned, None
    if step.forward.traced.has_meta_params:
        note("tensor-parallel training not weighed: the model is on the meta device, and "
             "training a candidate on fake tensors is not built yet (inference plans weigh "
             "one)")
        return planned, None
    with kept_state(model):  # tracing, observing and checking run it in train()
        forward = step.forward
        if step.replicas > 1 or step.microbatches > 1:
            with collecting():  # the plan's step said what tracing finds
                forward = traced_problem(model, args, kwargs, cluster,
                                         Tracing.of(config, checked=True))
        with collecting():
            factors, _ = backward_factors(forward.profiled, model, args, kwargs, cluster)
        return tensor_candidate(planned, forward.problem, forward.traced, model, args, kwargs,
                                ranks=config.parallel.tp, verify=config.emit.verify,
                                training=(config.training.optimizer, factors, config.dtype))


def tensor_candidate(planned: Plan, problem: Problem, traced: TracedModel,
                     model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                     ranks: int | str, verify: bool,
                     training: tuple[str, Mapping[str, float], str] | None = None
                     ) -> tuple[Plan, PartitionedModel | None]:
    """``planned`` with its ``tensor_parallel`` record for ``ranks`` ranks on the first
    devices of ``problem``'s cluster (``"auto"``: each degree ``tensor_degrees`` gives, the
    fastest kept), and the one-device model they split (``None`` for a model on the meta
    device: planned, not emitted; and where ``auto`` finds no degree); ``verify``: run the
    kept one on gloo ranks. ``training``: a training step's optimizer, backward factors (per
    device, ``train.step_problem``'s) and dtype; ``problem`` is then the forward of the model
    and its loss, ``kwargs`` holding the ``targets``."""
    degrees = tensor_degrees(problem.cluster, ranks)
    if not degrees:
        note(_NOT_WEIGHED)
        return planned, None
    stage("tensor parallel")
    meta = traced.has_meta_params
    one = _one_device(traced)
    one.example_inputs = (tuple(args), dict(kwargs))  # saved with it: what its ranks run
    pairs = column_row(one)  # the same for every degree
    weighed: dict[int, tuple[TensorParallelRecord, Observed]] = {}
    for degree in degrees:
        try:
            weighed[degree] = _weigh(problem, traced, one, pairs, degree, args, kwargs,
                                     training=training)
        except ConfigError as refused:
            if ranks != "auto":
                raise
            note(f"tensor parallel over {degree} ranks not weighed (--tp auto): {refused}")
    if not weighed:
        return planned, None
    best = min(weighed, key=lambda d: weighed[d][0].makespan_s)
    record, observed = weighed[best]
    record = replace(record, weighed={d: r.makespan_s for d, (r, _) in weighed.items()}
                     if ranks == "auto" else {})
    if verify and not meta and training is not None:
        inputs = {k: v for k, v in kwargs.items() if k != "targets"}
        check = verify_tensor_training(one, model, args, inputs, kwargs.get("targets", ()),
                                       ranks=best, optimizer=training[0], split=record.split)
        record = replace(record, check="passed", measured_s=check["measured_s"],
                         max_abs_diff=max(check["max_abs_diff_gradients"],
                                          check["max_abs_diff_parameters"]))
        note(_trained(check, best))
    elif verify and not meta:
        check = verify_tensor_parallel(one, model, args, kwargs, ranks=best,
                                       repeats=TIMED_PASSES, split=record.split)
        record = replace(record, check="passed", max_abs_diff=check["max_abs_diff"],
                         measured_s=check["measured_s"])
    note(_said(record, planned, observed, here=_on_workers(tensor_devices(problem.cluster, best)),
               meta=meta))
    return replace(planned, tensor_parallel=record), None if meta else one


def tensor_degrees(cluster: Cluster, ranks: int | str) -> list[int]:
    """The degrees to weigh: ``[ranks]`` (its devices checked by ``tensor_devices``), or for
    ``"auto"`` every degree of 2 or more that divides the number of leading devices alike
    (the first's type and memory)."""
    if ranks != "auto":
        tensor_devices(cluster, int(ranks))
        return [int(ranks)]
    devices = cluster.devices
    alike = next((i for i, d in enumerate(devices)
                  if (d.type, d.memory_bytes) != (devices[0].type, devices[0].memory_bytes)),
                 len(devices))
    return [d for d in range(2, alike + 1) if alike % d == 0]


def _weigh(problem: Problem, traced: TracedModel, one: PartitionedModel,
           pairs: Mapping[str, tuple[str, int]], ranks: int, args: tuple[Any, ...],
           kwargs: dict[str, Any], *,
           training: tuple[str, Mapping[str, float], str] | None = None
           ) -> tuple[TensorParallelRecord, Observed]:
    """The candidate of ``ranks`` ranks, unchecked: ``one`` split as ``pairs`` (its
    ``column_row``) where the ranks divide the split dimension, observed under DTensor on fake
    ranks and rank 0 simulated (``training``: its step, ``tensor_candidate``'s);
    ``ConfigError`` where DTensor cannot run it."""
    chosen = tensor_devices(problem.cluster, ranks)
    split, whole = divisible(one, pairs, ranks)
    if whole:
        note(f"tensor parallel over {ranks} ranks: {', '.join(whole)} kept whole, their split "
             f"dimension not a multiple of {ranks}")
    try:
        observed = observe(_one_device(traced), split, ranks, args, kwargs,  # a copy: it shards
                           optimizer=training[0] if training else None)
    except SplitError as failed:
        module = next((n.module for n in problem.graph.nodes if failed.op in n.ops), None)
        first = str(failed.error).strip().splitlines()[0].rstrip(".")
        raise ConfigError(
            f"{{parallel.tp={ranks}}}: DTensor cannot run {failed.op}"
            + (f" ({module})" if module else "") + f" split over {ranks} ranks: {first}; "
            "choose a degree that divides the model's attention heads (key/value heads "
            "included) and hidden sizes") from None
    names = tuple(d.name for d in chosen)
    here = _on_workers(chosen)
    measured_s = _collectives_s(observed, ranks) if here else None
    if training is None:
        rank0 = tensor_problem(problem, observed, names, measured=here, collectives_s=measured_s)
    else:
        optimizer, factors, dtype = training
        rank0 = tensor_step_problem(problem, observed, names, optimizer=optimizer,
                                    factors=factors, measured=here, collectives_s=measured_s,
                                    dtype=dtype)
    schedule = simulate(rank0, Placement(device_of={n.name: names[0]
                                                    for n in rank0.graph.nodes}))
    moved = [c for table in (observed.collectives, observed.backward_collectives)
             for per in table.values() for c in per]
    columns, rows = matmuls(split)
    return TensorParallelRecord(
        ranks=ranks, devices=names, makespan_s=schedule.makespan_s,
        peak_bytes=schedule.peak_bytes[names[0]], columns=columns, rows=rows,
        collectives=len(moved), collective_bytes=sum(b for _, b in moved),
        split=split, optimizer=training[0] if training else None), observed


def _on_workers(devices: tuple[Device, ...]) -> bool:
    """Whether ``devices`` are this machine's CPU workers (their ops and collectives are
    measured here)."""
    return all(d.torch_device.startswith("cpu") for d in devices)


def _said(record: TensorParallelRecord, planned: Plan, observed: Observed, *, here: bool,
          meta: bool) -> str:
    """The candidate's note: what is split, what DTensor moves, the prediction against the
    placement's, where it runs, and what was measured."""
    ranks, training = record.ranks, record.optimizer is not None
    faster = record.makespan_s < planned.makespan_s
    script = "train.py" if training else "launch.py"
    if meta:
        where = ("planned on fake tensors (the parameters are on the meta device: DTensor's "
                 f"dispatch priced at {(observed.dispatch_s or 0) * 1e6:.0f} us an op, "
                 "measured here), not emitted: there are no weights to run")
    elif faster:
        where = f"run it as ranks with tensor_parallel/{script} beside plan.json"
    else:
        where = "tensor_parallel/ beside plan.json runs the candidate all the same"
    weighed = "" if not record.weighed else "weighed (--tp auto) " + ", ".join(
        f"tp {d} {s * 1e3:.3f} ms" for d, s in sorted(record.weighed.items())) + "; kept "
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
    return (f"{weighed}tensor parallel {'training ' if training else ''}over {ranks} ranks "
            f"({', '.join(record.devices)}), each on the whole batch: " if training else
            f"{weighed}tensor parallel over {ranks} ranks ({', '.join(record.devices)}): ") + (
            f"{record.columns} column and {record.rows} row matmuls, {moved}; "
            f"{record.makespan_s * 1e3:.3f} ms a {unit} predicted against the "
            f"{'plan' if training else 'placement'}'s {planned.makespan_s * 1e3:.3f} ms: "
            + ("faster" if faster else f"the {'plan' if training else 'placement'} is faster")
            + f"; {where}"
            + (f"; {'steps' if training else 'outputs'} equal on {ranks} gloo ranks, "
               f"{record.measured_s * 1e3:.3f} ms a {unit} measured there"
               + ("" if here else " (this machine's CPU, not the planned devices)")
               if record.measured_s is not None else ""))


def _trained(check: Mapping[str, Any], ranks: int) -> str:
    """The training check's note (``verify_tensor_training``'s record)."""
    return (f"tensor-parallel training check passed: {check['steps']} {check['optimizer']} "
            f"steps on {ranks} gloo ranks (DTensor, every dropout at zero) give the original's "
            f"losses ({', '.join(f'{v:.6g}' for v in check['losses'])}), gradients (gathered "
            f"whole) and updated parameters"
            + (f"; dropout is active in the step: its {check['dropout_ops']} dropout(s) on, "
               f"the first loss is {check['loss_with_dropout']:.6g}"
               if check.get("dropout_ops") else ""))


def tensor_devices(cluster: Cluster, ranks: int) -> tuple[Device, ...]:
    """The first ``ranks`` devices of ``cluster``, which must be alike; else ``ConfigError``."""
    devices = cluster.devices
    if ranks > len(devices):
        raise ConfigError(f"{{parallel.tp={ranks}}} asks for more ranks than the "
                          f"{len(devices)} devices: choose at most {len(devices)}")
    chosen = devices[:ranks]
    if len({(d.type, d.memory_bytes) for d in chosen}) > 1:
        raise ConfigError(f"{{parallel.tp={ranks}}} splits every op evenly, and "
                          f"{', '.join(d.name for d in chosen)} are not alike: plan it on "
                          "devices of one type")
    return chosen


def _collectives_s(observed: Observed, ranks: int) -> float | None:
    """A pass's collectives, in order, measured on ``ranks`` gloo processes here
    (``profile.allreduce``, mode ``collectives``); ``None`` where that fails (the ring
    formulas price them then)."""
    from autoplace.profile.allreduce import COLLECTIVES, measure_allreduce_s

    sequence = [[COLLECTIVES.index(kind), nbytes]
                for table in (observed.collectives, observed.backward_collectives)
                for per in table.values() for kind, nbytes in per]
    if not sequence:
        return 0.0
    try:
        seconds = measure_allreduce_s(sequence, replicas=ranks, mode="collectives")
    except Exception as exc:  # noqa: BLE001 - the ring formulas still price them
        note(f"the tensor-parallel collectives could not be measured ({type(exc).__name__}: "
             f"{exc}); the ring formulas price them")
        return None
    note(f"the {len(sequence)} collectives of a tensor-parallel "
         f"{'step' if observed.backward_collectives else 'pass'} measured on {ranks} gloo "
         f"processes here: {seconds * 1e3:.3f} ms")
    return seconds


def _one_device(traced: TracedModel) -> Any:
    """``traced`` emitted whole on this machine's CPU (a fresh copy each call: ``observe``
    replaces its parameters)."""
    here = local_device_map(["cpu"])["cpu"]
    return emit_model(traced.module, {n.name: here for n in traced.module.graph.nodes
                                      if n.op == "call_function"}, runtime="sequential",
                      meta_weights=traced.has_meta_params)
