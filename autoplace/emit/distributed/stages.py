"""Emit: a plan whose ranks form a chain of stages, run by ``torch.distributed.pipelining``.

With M > 1 micro-batches, ``OUT/launch.py`` (``ranks.rank_main``) runs the plan through
``PipelineStage`` and ``ScheduleGPipe`` where it can (``chain_of``): every rank's segments are
one run of the emitted order, the runs in rank order (rank 0 first), and every value that
crosses a cut between stages, the model's inputs and outputs included, is a tensor cut along
the batch (dimension 0 is the micro-batch's rows), which is what the schedule splits and
merges. A stage's module (``StageModule``) takes the values that cross the cut before it and
returns those that cross the cut after it (a value made early and read late passes through
the stages between); the last stage returns the model's outputs, which it then sends to rank
0 through ``ranks.Exchange``, as every other crossing goes (``gather_outputs``: they land on
rank 0's GPU under nccl). Anything else (GPT-2's tied embedding makes rank 0 run first and
last: no chain) runs on ``ranks.run_pass``'s send/recv, in the same GPipe order.

Read ``chain_of``, then ``run_stages`` and ``gather_outputs``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Chain", "StageModule", "buffers", "chain_of", "gather_outputs", "run_stages"]


@dataclass(frozen=True)
class Chain:
    """Stage ``rank`` of a chain: its segments, the values it takes (from the stage before,
    or the model's inputs on rank 0) and those it hands on (the model's outputs on the last);
    ``shapes`` of every value it takes or hands on, for one micro-batch."""

    rank: int
    index: int  # this rank's stage
    order: tuple[int, ...]  # the rank of each stage
    segments: tuple[int, ...]
    takes: tuple[str, ...]
    gives: tuple[str, ...]
    shapes: Mapping[str, tuple[tuple[int, ...], str]]
    constants: Mapping[str, Any]


def chain_of(model: torch.nn.Module, table: Sequence[Any], *, rank: int, ranks: Sequence[str],
             first: Sequence[Any], rows: int | None) -> Chain | None:
    """Rank ``rank``'s stage where the plan's ranks form a chain (the module says when), else
    ``None``. ``table``: the ``ranks.Crossing`` rows; ``first``: micro-batch 0's flat inputs;
    ``rows``: its batch (``None``: one micro-batch, the batch not cut, so any tensor crosses
    as it is)."""
    info = model.segment_info
    runs = [seg.planned_device for i, seg in enumerate(info)
            if i == 0 or info[i - 1].planned_device != seg.planned_device]
    if list(runs) != list(ranks):
        # A rank that runs twice (or not at all) makes no chain. A chain in another order
        # than the ranks' is left to send/recv too: with PipelineStage told the order
        # (``stage_index_to_group_rank``), stage 0 on rank 1 waited on a receive until the
        # timeout (torch 2.13, gloo).
        return None
    crossing = {c.value: c for c in table}
    constants = {c.value: c.constant for c in table if c.shape is None}
    made = {name: 0 for name in model.input_names}  # stage that makes (or first has) each value
    last_read: dict[str, int] = {}
    stage_of = {d: i for i, d in enumerate(runs)}
    for seg in info:
        r = stage_of[seg.planned_device]
        made.update({n: r for n in seg.outputs})
        for n in seg.inputs:
            last_read[n] = max(last_read.get(n, 0), r)
    world = len(runs)
    for n in model.output_names:
        last_read[n] = world  # read after the last stage

    def cut(after: int) -> tuple[str, ...]:
        """The values that cross the cut after stage ``after`` (in a fixed order)."""
        return tuple(n for n in made if n not in constants and made[n] <= after < last_read.get(
            n, -1))

    index = stage_of[ranks[rank]]
    takes = tuple(model.input_names) if index == 0 else cut(index - 1)
    gives = tuple(model.output_names) if index == world - 1 else cut(index)
    shapes = {}
    for n in (*takes, *gives):
        spec = _shape(n, crossing, dict(zip(model.input_names, first)))
        if spec is None or (rows is not None and (not spec[0] or spec[0][0] != rows)):
            return None  # not a tensor cut along the batch: the schedule could not split it
        shapes[n] = spec
    return Chain(rank, index, tuple(ranks.index(d) for d in runs),
                 tuple(s.index for s in info if s.planned_device == ranks[rank]),
                 takes, gives, shapes, constants)


def _shape(name: str, crossing: Mapping[str, Any],
           inputs: Mapping[str, Any]) -> tuple[tuple[int, ...], str] | None:
    """A value's shape and dtype: from the crossings, or a model input's own."""
    c = crossing.get(name)
    if c is not None:
        return None if c.shape is None else (tuple(c.shape), str(c.dtype))
    value = inputs.get(name)
    if not isinstance(value, torch.Tensor):
        return None
    return tuple(value.shape), str(value.dtype).removeprefix("torch.")


class StageModule(torch.nn.Module):
    """One rank's segments as a module: the values it takes in, those it gives out."""

    def __init__(self, model: torch.nn.Module, chain: Chain) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(getattr(model, f"seg{i}") for i in chain.segments)
        self.info = [model.segment_info[i] for i in chain.segments]
        self.chain = chain

    def forward(self, *taken: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values: dict[str, Any] = {**self.chain.constants, **dict(zip(self.chain.takes, taken))}
        for part, seg in zip(self.parts, self.info):
            values.update(zip(seg.outputs, part(*(values[n] for n in seg.inputs))))
        return tuple(values[n] for n in self.chain.gives)


def run_stages(model: torch.nn.Module, batches: Sequence[list[Any]], chain: Chain,
               exchange: Any) -> dict[str, list[Any]]:
    """One pass of ``batches`` (each micro-batch's flat inputs) through ``ScheduleGPipe``;
    rank 0 returns each micro-batch's outputs by name (the last stage sends them). Stage i runs
    on rank i (``chain_of`` takes no other order)."""
    # Imported here: torch.distributed.pipelining takes about 0.9 s to import, which every
    # `autoplace plan` would pay for a schedule only launch.py's ranks run.
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    count = len(batches)
    device = getattr(model, f"seg{chain.segments[0]}").device  # where its segments run
    world = len(chain.order)
    stage = PipelineStage(StageModule(model, chain), chain.index, world, device,
                          input_args=buffers(chain, chain.takes, device),
                          output_args=buffers(chain, chain.gives, device))
    schedule = ScheduleGPipe(stage, n_microbatches=count)
    with exchange.named(None):
        if chain.index == 0:
            names = dict(zip(model.input_names, range(len(model.input_names))))
            whole = [torch.cat([b[names[n]] for b in batches]) for n in chain.takes]
            merged = schedule.eval(*whole)
        else:
            merged = schedule.eval()
    return gather_outputs(model, chain, merged, exchange, count=count)


def buffers(chain: Chain, names: Sequence[str], device: Any) -> tuple[torch.Tensor, ...]:
    """Empty tensors shaped as ``chain`` says each of ``names`` is, on ``device``: what
    ``PipelineStage`` is told a stage takes and gives."""
    return tuple(torch.empty(chain.shapes[n][0], dtype=getattr(torch, chain.shapes[n][1]),
                             device=device) for n in names)


def gather_outputs(model: torch.nn.Module, chain: Chain, merged: Any, exchange: Any, *,
                   count: int) -> dict[str, list[Any]]:
    """Rank 0's outputs of a pass, each micro-batch's by name: the last stage's ``merged``
    (its schedule's outputs, all micro-batches in one tensor each) sent to rank 0 through
    ``exchange``, which receives them where its backend puts tensors (``ranks.Exchange``:
    the rank's GPU under nccl). Empty on the other ranks."""
    outputs: dict[str, list[Any]] = {n: [] for n in model.output_names}
    last = chain.order[-1]
    if chain.rank == last:
        merged = merged if isinstance(merged, tuple) else (merged,)
        if last == 0:
            return {n: list(t.chunk(count)) for n, t in zip(chain.gives, merged)}
        for position, t in enumerate(merged):
            exchange.send_tensor(t, dsts=(0,), tag=exchange.gathered_tag(position))
        exchange.finish()
    elif chain.rank == 0:
        for position, n in enumerate(model.output_names):
            shape, dtype = chain.shapes.get(n) or _output_shape(n, exchange)
            whole = exchange.receive_tensor(src=last, tag=exchange.gathered_tag(position),
                                            shape=(shape[0] * count, *shape[1:]), dtype=dtype)
            outputs[n] = list(whole.chunk(count))
    return outputs


def _output_shape(name: str, exchange: Any) -> tuple[tuple[int, ...], str]:
    c = exchange.crossings[name]
    return tuple(c.shape), str(c.dtype)
