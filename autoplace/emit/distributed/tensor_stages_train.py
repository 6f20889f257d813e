"""Emit: a pp x tp mesh's training step: the model and its loss cut into pipeline stages, each
run by a tp group on DTensors, the micro-batches scheduled by ``torch.distributed.pipelining``
(``ScheduleGPipe`` or ``Schedule1F1B``, gradients averaged over the micro-batches).

Every rank holds the example batch and cuts it into the micro-batches (``split_batch``), so a
model input (the targets too) is read where it is needed and never crosses a stage: stage 0
is driven by the micro-batches' indices (``arange(M)``, which the schedule chunks), the others
count their forwards. What crosses is activations: each enters its stage as a replicated
DTensor (``DTensor.from_local``, which sums its gradient over the tp group) and leaves it whole
(``full_tensor``); the last stage returns the loss, whose gradient the schedule seeds. Rank 0
reports the mean loss and, for the check, every stage's gradients, parameters and optimizer
state gathered whole (``send_object_list`` from each stage's first rank), in one optimizer's
order, as ``replicas._compare`` reads them. ``tensor_train`` starts it for ``--pp``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autoplace.emit.distributed.dtensor import dtensor_rules
from autoplace.emit.distributed.ranks import Crossing, flat_inputs
from autoplace.emit.distributed.tensor_stages import keep_stage
from autoplace.errors import EmitError

__all__ = ["train_stages"]


def train_stages(model: torch.nn.Module, mesh: Any, split: Mapping[str, tuple[str, int]],
                 table_file: Path, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                 optimizer: str, lr: float | None, microbatches: int, schedule: str,
                 steps: int, recording: bool) -> tuple[list[float], list[float], dict[str, Any]]:
    """``steps`` steps of this rank's stage of ``model`` (the one-device model of the model and
    its loss, cut into stages) on a ``("pp", "tp")`` ``mesh``: the losses and step times (rank
    0's) and, with ``recording``, what ``replicas._compare`` reads (rank 0's; empty
    elsewhere)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from autoplace.emit.check.training import _named
    from autoplace.emit.train.microbatch import split_batch
    from autoplace.train.graph import make_optimizer

    saved = json.loads(Path(table_file).read_text())
    table = {c.value: c for c in map(Crossing.of, saved["crossings"])}
    stages, index = saved["stages"], mesh["pp"].get_local_rank()
    parts = [flat_inputs(model, a, k) for a, k in split_batch(args, kwargs, microbatches)]
    tied = saved.get("tied", {})  # a copy's name -> the tied weight's
    names = [n for n in _named(model, prefix=True) if n not in tied]  # one optimizer's order
    summed = _tied_groups(model, tied, stages, mesh)
    mine = _stage_segments(model, stages, index)
    keep_stage(model, mine, mesh["tp"], split)
    by_name = _named(model, prefix=True)
    summed = [(by_name[n], group) for n, group in summed]
    takes, gives = _cut(model, stages, index)
    module = _TrainStage(model, mine, takes, gives, parts, mesh["tp"], first=index == 0,
                         last=index == len(stages) - 1, constants={
                             c.value: c.constant for c in table.values() if c.shape is None})
    device = next((t.device for t in parts[0] if isinstance(t, torch.Tensor)),
                  torch.device("cpu"))
    stage = PipelineStage(
        module, index, len(stages), device,
        input_args=(torch.zeros(1, dtype=torch.long),) if index == 0 else _buffers(
            takes, table, device),
        output_args=(torch.empty(1),) if index == len(stages) - 1 else _buffers(
            gives, table, device), group=mesh["pp"].get_group())
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    run = kind(stage, n_microbatches=microbatches, loss_fn=lambda out, _: out.sum())
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(optimizer, params, lr)
    name_of = {id(p): n for n, p in _named(model, prefix=True).items()}
    own = [name_of[id(p)] for p in params]
    last = int(mesh.mesh[-1, 0])
    losses, times, record = [], [], []
    for _ in range(steps):
        began = time.perf_counter()
        opt.zero_grad()
        got: list[torch.Tensor] = []
        module.count = 0
        with _replicating(), dtensor_rules():
            if index == 0:
                run.step(torch.arange(microbatches))
            elif index == len(stages) - 1:
                run.step(target=torch.zeros(microbatches), losses=got)
            else:
                run.step()
            for param, group in summed:  # a tied weight's copies: their gradients summed
                dist.all_reduce(param.grad._local_tensor, group=group)
            opt.step()
        if device.type == "cuda":  # the step's kernels done before it is timed
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - began)
        losses.append(_loss_on_rank0(got, last))
        if recording:
            step = _gathered(model, opt, own, names, mesh, index)
            if step is not None:
                record.append(step | {"loss": torch.tensor(losses[-1])})
    return losses, times, ({"names": {n: i for i, n in enumerate(names)}, "steps": record}
                           if dist.get_rank() == 0 else {})


def _tied_groups(model: torch.nn.Module, tied: Mapping[str, str], stages: Sequence[str],
                 mesh: Any) -> list[tuple[Any, Any]]:
    """For each tied weight whose copies later stages hold (``tied``), a process group per tp
    rank of the ranks that hold it or a copy (every rank makes each, in one order); this
    rank's parameters among them, each with its group. Called before the other stages'
    segments are dropped; the parameters are looked up again once this stage is split."""
    stage_of = {}
    for name, _ in model.named_parameters():
        seg, rest = name.split(".", 1)
        stage_of[rest] = stages.index(model.segment_info[int(seg[3:])].planned_device)
    copies: dict[str, list[str]] = {}
    for copy, original in tied.items():
        copies.setdefault(original, [original]).append(copy)
    tp, found = mesh["tp"].size(), []
    for holders in copies.values():
        held = sorted({stage_of[n] for n in holders})
        for t in range(tp):
            group = dist.new_group([s * tp + t for s in held])
            here = [n for n in holders if stage_of[n] * tp + t == dist.get_rank()]
            found += [(n, group) for n in here]
    return found


def _stage_segments(model: torch.nn.Module, stages: Sequence[str], index: int) -> list[int]:
    return [s.index for s in model.segment_info if s.planned_device == stages[index]]


def _cut(model: torch.nn.Module, stages: Sequence[str], index: int
         ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The activations stage ``index`` takes from the stage before and hands to the next
    (those made up to it and read after it, in the order they are made); the model's inputs
    are read where needed, never handed on."""
    stage_of = {d: i for i, d in enumerate(stages)}
    made: dict[str, int] = {}
    last_read: dict[str, int] = {}
    for seg in model.segment_info:
        s = stage_of[seg.planned_device]
        made.update({n: s for n in seg.outputs})
        for n in seg.inputs:
            last_read[n] = max(last_read.get(n, 0), s)

    def cut(after: int) -> tuple[str, ...]:
        return tuple(n for n in made if made[n] <= after < last_read.get(n, -1))

    return (() if index == 0 else cut(index - 1)), cut(index)


def _buffers(names: Sequence[str], table: Mapping[str, Crossing], device: Any
             ) -> tuple[torch.Tensor, ...]:
    """Empty tensors shaped as one micro-batch's ``names`` (the stage table's), floating ones
    needing their gradient."""
    out = []
    for n in names:
        c = table.get(n)
        if c is None or c.shape is None:
            raise EmitError(f"{n!r} crosses a stage and is not a tensor of the stage table: "
                            "plan it again")
        t = torch.empty(c.shape, dtype=getattr(torch, c.dtype), device=device)
        out.append(t.requires_grad_() if t.is_floating_point() else t)
    return tuple(out)


class _TrainStage(torch.nn.Module):
    """One rank's stage of the step: its segments on DTensors, the model's inputs of the
    micro-batch it runs read from ``parts``, the activations it takes made replicated
    DTensors and those it gives made whole; the last returns the loss as a 1-element tensor."""

    def __init__(self, model: torch.nn.Module, segments: Sequence[int], takes: Sequence[str],
                 gives: Sequence[str], parts: Sequence[Sequence[Any]], tp: Any, *,
                 first: bool, last: bool, constants: Mapping[str, Any]) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(getattr(model, f"seg{i}") for i in segments)
        self.info = [model.segment_info[i] for i in segments]
        self.inputs = [dict(zip(model.input_names, p)) for p in parts]
        self.takes, self.gives, self.tp = tuple(takes), tuple(gives), tp
        self.first, self.last, self.constants = first, last, dict(constants)
        self.loss = model.output_names[0]
        self.count = 0

    def forward(self, *taken: torch.Tensor) -> Any:
        from torch.distributed.tensor import DTensor, Replicate

        if self.first:
            k, taken = int(taken[0]), ()
        else:
            k, self.count = self.count, self.count + 1
        values = {**self.constants, **self.inputs[k], **{
            n: DTensor.from_local(t, self.tp, [Replicate()], run_check=False)
            if t.is_floating_point() else t for n, t in zip(self.takes, taken)}}
        for part, seg in zip(self.parts, self.info):
            values.update(zip(seg.outputs, part(*(values[n] for n in seg.inputs))))
        if self.last:
            return _whole(values[self.loss]).reshape(1)
        return tuple(_whole(values[n]).contiguous() for n in self.gives)


def _whole(value: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


class _replicating:
    """DTensor's implicit replication for a step (plain tensors taken as replicated), the
    flag put back as it was (``implicit_replication`` clears it on the way out, which would
    end it for the backward that follows a nested forward)."""

    def __enter__(self) -> None:
        from torch.distributed.tensor import DTensor

        self.before = DTensor._op_dispatcher._allow_implicit_replication
        DTensor._op_dispatcher._allow_implicit_replication = True

    def __exit__(self, *exc: object) -> None:
        from torch.distributed.tensor import DTensor

        DTensor._op_dispatcher._allow_implicit_replication = self.before


def _loss_on_rank0(got: Sequence[torch.Tensor], last: int) -> float:
    """The step's loss (the mean of its micro-batches'), sent by rank ``last`` to rank 0; 0.0
    on the other ranks."""
    loss = torch.zeros(1)
    if dist.get_rank() == last:
        loss[0] = torch.stack([t.detach().reshape(()) for t in got]).mean()
        if last != 0:
            dist.send(loss, dst=0)
    elif dist.get_rank() == 0:
        dist.recv(loss, src=last)
    return float(loss[0])


def _gathered(model: torch.nn.Module, opt: torch.optim.Optimizer, own: Sequence[str],
              names: Sequence[str], mesh: Any, index: int) -> dict[str, Any] | None:
    """This step's gradients, parameters and optimizer state of every stage, gathered whole
    on rank 0 in ``names``' order (one optimizer over them all); ``None`` elsewhere."""
    from torch.utils import _pytree as pytree

    def cpu(x: Any) -> Any:
        x = _whole(x)
        return x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x

    params = opt.param_groups[0]["params"]
    piece = {"names": list(own), "grads": [None if p.grad is None else cpu(p.grad)
                                           for p in params],
             "params": [cpu(p) for p in params],
             "state": pytree.tree_map(cpu, opt.state_dict())}
    leaders = [int(r) for r in mesh.mesh[:, 0]]
    if dist.get_rank() not in leaders:
        return None
    if dist.get_rank() != 0:
        dist.send_object_list([piece], dst=0)
        return None
    pieces = [piece]
    for src in leaders[1:]:
        box: list[Any] = [None]
        dist.recv_object_list(box, src=src)
        pieces.append(box[0])
    return _merged(pieces, names)


def _merged(pieces: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """The stages' pieces as one optimizer's record over ``names``."""
    at = {n: i for i, n in enumerate(names)}
    grads: list[Any] = [None] * len(names)
    params: list[Any] = [None] * len(names)
    state: dict[int, Any] = {}
    group: dict[str, Any] = {}
    for piece in pieces:
        group = {k: v for k, v in piece["state"]["param_groups"][0].items() if k != "params"}
        for j, n in enumerate(piece["names"]):
            if n not in at:  # a tied weight's copy: equal to the weight
                continue
            grads[at[n]], params[at[n]] = piece["grads"][j], piece["params"][j]
            if j in piece["state"]["state"]:
                state[at[n]] = piece["state"]["state"][j]
    return {"grads": grads, "params": params,
            "state": {"state": state, "param_groups": [group | {"params": list(range(len(
                names)))}]}}

