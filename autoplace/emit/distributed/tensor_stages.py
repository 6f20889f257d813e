"""Emit: a pp x tp mesh's pass, the model cut into pipeline stages, each stage run by a group of
tensor-parallel ranks under DTensor, the stages handed on by ``torch.distributed.pipelining``.

The model the ranks load is the one-device model emitted with each stage's ops planned on a
torch device of its own (``cpu:0``, ``cpu:1``, ...; ``pipeline.staged``), so its segments run
in stage order. ``write_stage_table`` writes ``stages.json`` beside it: those stage devices
and every value that crosses a stage (``ranks.crossings_of``, shaped by one pass). On a
``("pp", "tp")`` mesh of the ranks (rank = stage x tp + its tp rank), ``stage_runner`` keeps
the rank's stage only (the others' segments dropped), its weights split over its tp group as
``split.json`` says (``dtensor.shard_model``), and runs it as a ``PipelineStage`` of the pp
group under ``ScheduleGPipe`` with one micro-batch (a pass's latency; the batch is not cut):
every value a stage hands on is whole (a DTensor's ``full_tensor``), so a tp rank sends its
twin in the next stage the same tensor. The last stage's first rank sends the outputs to rank 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autoplace.emit.distributed.dtensor import dtensor_rules, shard_model
from autoplace.emit.distributed.ranks import Crossing, crossings_of, flat_inputs
from autoplace.emit.distributed.stages import StageModule, buffers, chain_of
from autoplace.errors import EmitError

__all__ = ["STAGES_FILE", "keep_stage", "stage_devices", "stage_runner", "write_stage_table"]

STAGES_FILE = "stages.json"


def stage_devices(model: torch.nn.Module) -> list[str]:
    """The planned device of each of ``model``'s stages, in order: its segments' devices, each
    once; ``EmitError`` where a stage's segments are not consecutive."""
    runs = [s.planned_device for i, s in enumerate(model.segment_info)
            if i == 0 or model.segment_info[i - 1].planned_device != s.planned_device]
    if len(set(runs)) != len(runs):
        raise EmitError("the stages' segments are not consecutive ("
                        + " -> ".join(runs) + "): a pipeline stage runs once a pass")
    return runs


def write_stage_table(directory: Path, model: torch.nn.Module,
                      example: tuple[tuple[Any, ...], Mapping[str, Any]]) -> Path:
    """``directory/stages.json``: ``model``'s stage devices in order, every value crossing
    stages, shaped by one pass of ``example``, and each copy of a tied weight a later stage
    holds (``model.tied``: its name -> the name of the weight it copies)."""
    stages = stage_devices(model)
    table = crossings_of(model, tuple(example[0]), dict(example[1]), ranks=stages)
    path = Path(directory) / STAGES_FILE
    path.write_text(json.dumps({"stages": stages, "crossings": [c.to_list() for c in table],
                                "tied": dict(getattr(model, "tied", {}))}, indent=1) + "\n")
    return path


class _TensorStage(StageModule):
    """A stage's segments run on DTensors (plain tensors taken as replicated), each value it
    hands on made whole and contiguous (gloo sends no view: a tied weight's transpose)."""

    def forward(self, *taken: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.experimental import implicit_replication

        with implicit_replication(), dtensor_rules():
            given = super().forward(*taken)
        whole = (x.full_tensor() if isinstance(x, DTensor) else x for x in given)
        return tuple(x.contiguous() if isinstance(x, torch.Tensor) else x for x in whole)


def stage_runner(model: torch.nn.Module, mesh: Any, split: Mapping[str, tuple[str, int]],
                 table_file: Path, args: tuple[Any, ...], kwargs: dict[str, Any]
                 ) -> Callable[[], list[torch.Tensor]]:
    """This rank's pass of ``model`` (a one-device model cut into stages) on a ``("pp", "tp")``
    ``mesh``: its stage kept and split over its tp group, the others dropped; each call runs
    one pass on ``args``/``kwargs`` and returns the model's output tensors (by output name,
    in ``model.output_names``' order) on rank 0, nothing elsewhere."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    saved = json.loads(Path(table_file).read_text())
    table = [Crossing.of(row) for row in saved["crossings"]]
    first = flat_inputs(model, args, kwargs)
    index = mesh["pp"].get_local_rank()
    chain = chain_of(model, table, rank=index, ranks=saved["stages"], first=first, rows=None)
    if chain is None:
        raise EmitError("the stages do not form a chain whose crossings are tensors: plan it "
                        "again with fewer stages (--pp)")
    keep_stage(model, chain.segments, mesh["tp"], split)
    device = first[0].device if first and isinstance(first[0], torch.Tensor) else "cpu"
    stage = PipelineStage(_TensorStage(model, chain), chain.index, len(chain.order), device,
                          input_args=buffers(chain, chain.takes, device),
                          output_args=buffers(chain, chain.gives, device),
                          group=mesh["pp"].get_group())
    schedule = ScheduleGPipe(stage, n_microbatches=1)
    inputs = dict(zip(model.input_names, first))
    shapes = {c.value: c for c in table}
    last = int(mesh.mesh[-1, 0])  # the last stage's first rank

    def once() -> list[torch.Tensor]:
        with torch.no_grad():
            merged = (schedule.eval(*(inputs[n] for n in chain.takes)) if chain.index == 0
                      else schedule.eval())
        return _to_rank0(merged, model.output_names, shapes, last=last, device=device)

    return once


def keep_stage(model: torch.nn.Module, segments: Sequence[int], tp: Any,
               split: Mapping[str, tuple[str, int]]) -> None:
    """``model`` reduced to this rank's stage: its ``segments`` split over the ``tp`` mesh as
    ``split`` says (``seg<i>.<name>``), every other segment dropped with its weights."""
    for i in range(len(model.segment_info)):
        name = f"seg{i}"
        if i in segments:
            prefix = name + "."
            shard_model(getattr(model, name), tp,
                        {k[len(prefix):]: v for k, v in split.items() if k.startswith(prefix)})
        else:  # another stage's: its weights go
            setattr(model, name, torch.nn.Module())


def _to_rank0(merged: Any, names: Sequence[str], shapes: Mapping[str, Crossing], *, last: int,
              device: Any) -> list[torch.Tensor]:
    """The outputs of a pass on rank 0, sent there by rank ``last`` (which has them in
    ``merged``); nothing on the other ranks."""
    rank = dist.get_rank()
    if rank == last:
        outputs = list(merged) if isinstance(merged, (tuple, list)) else [merged]
        if last == 0:
            return outputs
        for t in outputs:
            dist.send(t.contiguous(), dst=0)
    elif rank == 0:
        received = []
        for n in names:
            c = shapes[n]
            t = torch.empty(c.shape, dtype=getattr(torch, c.dtype), device=device)
            dist.recv(t, src=last)
            received.append(t)
        return received
    return []

