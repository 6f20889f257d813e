"""Emit: a training step of M micro-batches, run segment by segment in the plan's order.

The emitted model of a training plan with micro-batches computes the loss of one micro-batch.
A step (``train_step``) runs each segment's forward and backward of each micro-batch as its own
*action*, in the order the plan's schedule starts them (``action_order``: the simulated start of
the first plan node of each action, GPipe's or 1F1B's per-device order,
``simulate.schedules``), so that it holds what the plan holds. A segment's inputs from another
segment enter it detached (a leaf that needs a gradient, as ``torch.distributed.pipelining``'s
stages take them), so its backward is its own: ``torch.autograd.backward`` on its outputs with
the gradients its readers' backwards gave them, which leaves the gradients of its inputs on
those leaves for their producers. Parameters accumulate their gradient over the micro-batches
in ``.grad``, and the caller steps the optimizer once.

The loss of the batch is the mean (or the sum) of the micro-batches' losses (``loss_rule``
checks which on the example); each micro-batch's backward starts from ``1/M`` (or 1).

``split_batch`` cuts the example inputs and targets into micro-batches (and, for data-parallel
replicas, ``ddp.py``, into shards): the batch size is the first dimension of the first tensor
among the inputs (``batch_size``), and every tensor whose first dimension has that size is cut
along it; the others are passed whole to every part.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import _pytree as fx_pytree
from torch.utils import _pytree as pytree

from autoplace.emit.saving import input_names
from autoplace.errors import AutoplaceError, EmitError
from autoplace.ir import Problem, Schedule
from autoplace.simulate.schedules import microbatch_name, phase_of

__all__ = ["Action", "action_order", "batch_size", "loss_rule", "split_batch", "train_step"]

Batch = tuple[tuple[Any, ...], dict[str, Any]]


def batch_size(inputs: Batch, *, parts: int, what: str = "micro-batches") -> int:
    """B, the batch: dimension 0 of the first tensor input with a dimension (args before
    kwargs, in their pytree order; ``kwargs["targets"]`` after the inputs), which must divide
    into ``parts`` equal ``what``. ``split_batch`` cuts every tensor whose dimension 0 is B
    (inputs and targets) and passes the others whole (scalars, a mask without a batch
    dimension): a tensor that is not batched yet has B rows is cut too, and a batch laid along
    another dimension (a sequence-first model) is not found; the training check then fails."""
    names = input_names(*inputs)
    leaves = pytree.tree_leaves(inputs)
    found = [(n, t) for n, t in zip(names, leaves) if isinstance(t, torch.Tensor) and t.dim()]
    if not found:
        raise AutoplaceError(f"the example inputs hold no tensor with a batch dimension: there "
                             f"is no batch to cut into {parts} {what}")
    name, first = found[0]
    size = int(first.shape[0])
    if parts < 1 or size == 0 or size % parts:
        raise AutoplaceError(
            f"the batch of {size} (dimension 0 of {name}, the first tensor input) does not "
            f"divide into {parts} {what}: use a batch that is a multiple of {parts}, or "
            f"fewer {what}")
    return size


def split_batch(args: tuple[Any, ...], kwargs: dict[str, Any], count: int, *,
                what: str = "micro-batches") -> list[Batch]:
    """``(args, kwargs)`` cut into ``count`` equal parts along the batch (``batch_size``'s
    rule): rows ``k * B/count`` to ``(k + 1) * B/count`` of every batched tensor, the other
    values whole. Raises ``AutoplaceError`` when the batch does not divide by ``count``."""
    size = batch_size((args, kwargs), parts=count, what=what)
    rows = size // count

    def part(k: int) -> Batch:
        def take(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == size:
                return x.narrow(0, k * rows, rows)
            return x

        a, kw = pytree.tree_map(take, (args, kwargs))
        return tuple(a), dict(kw)

    return [part(k) for k in range(count)]


def loss_rule(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              batches: Sequence[Batch]) -> str:
    """``mean`` or ``sum``: how the batch's loss combines the micro-batches' losses on the
    example (``model`` returns the loss). Raises ``AutoplaceError`` when neither does."""
    with torch.no_grad():
        whole = model(*args, **kwargs).detach().double()
        parts = torch.stack([model(*a, **k).detach().double() for a, k in batches])
    for rule, combined in (("mean", parts.mean()), ("sum", parts.sum())):
        if torch.allclose(whole, combined, rtol=1e-5, atol=1e-6 * float(abs(whole))):
            return rule
    raise AutoplaceError(
        f"the loss does not split over {len(batches)} micro-batches: the batch's loss is "
        f"{float(whole):.6g}, the micro-batches' mean {float(parts.mean()):.6g} and sum "
        f"{float(parts.sum()):.6g}; use a loss that averages or sums over the samples, or "
        "train without --microbatches")


@dataclass(frozen=True, order=True)
class Action:
    """The forward or the backward of one segment on one micro-batch."""

    segment: int
    microbatch: int
    phase: str  # "forward" or "backward"


def action_order(model: torch.nn.Module, problem: Problem, schedule: Schedule,
                 count: int) -> tuple[Action, ...]:
    """Every action of a step of ``count`` micro-batches, each after those it needs (a forward
    after its inputs' forwards, a backward after its forward and its readers' backwards), and
    otherwise in the order the plan's ``schedule`` of ``problem`` (the step graph) starts
    them."""
    segments = model.segment_info
    segment_of = {op: s.index for s in segments for op in s.nodes}
    ops = {phase_of(n.name)[0]: n.ops for n in problem.graph.nodes
           if phase_of(n.name)[1:] == ("forward", 0)}
    start: dict[Action, float] = {}
    for node in problem.graph.nodes:
        base, phase, k = phase_of(node.name)
        if phase == "step" or k is None:
            continue
        for op in ops.get(base, ()):
            if op in segment_of:
                action = Action(segment_of[op], k, phase)
                start[action] = min(start.get(action, float("inf")),
                                    schedule.start_s[microbatch_name(base, k)
                                                     if phase == "forward" else node.name])
    producer = {name: s.index for s in segments for name in s.outputs}
    needs: dict[Action, set[Action]] = {}
    for s in segments:
        sources = {producer[name] for name in s.inputs if name in producer} - {s.index}
        readers = {r.index for r in segments if r.index != s.index
                   and set(r.inputs) & set(s.outputs)}
        for k in range(count):
            needs[Action(s.index, k, "forward")] = {Action(p, k, "forward") for p in sources}
            needs[Action(s.index, k, "backward")] = {Action(s.index, k, "forward"), *(
                Action(r, k, "backward") for r in readers)}
    waiting = {a: len(n) for a, n in needs.items()}
    unblocks: dict[Action, list[Action]] = {a: [] for a in needs}
    for a, n in needs.items():
        for b in n:
            unblocks[b].append(a)
    ready = [(start.get(a, float("inf")), a) for a, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    order: list[Action] = []
    while ready:
        _, action = heapq.heappop(ready)
        order.append(action)
        for a in unblocks[action]:
            waiting[a] -= 1
            if waiting[a] == 0:
                heapq.heappush(ready, (start.get(a, float("inf")), a))
    if len(order) != len(needs):
        raise EmitError("the emitted model's segments read each other in a cycle: no order "
                        "runs their micro-batches")
    return tuple(order)


def train_step(model: torch.nn.Module, batches: Sequence[Batch], order: Sequence[Action],
               rule: str) -> torch.Tensor:
    """Run the forward and backward of every micro-batch in ``batches`` through ``model``'s
    segments in ``order`` (``action_order``), accumulating the parameters' gradients; returns
    the batch's loss (detached), the ``rule`` (``mean`` or ``sum``) of the micro-batches'."""
    info, spec = model.segment_info, model._in_spec
    if spec is None or not model.input_names:
        raise EmitError("micro-batches need an emitted model traced by torch.export (its input "
                        "structure); this one has none: plan it again")
    scale = 1.0 / len(batches) if rule == "mean" else 1.0
    values = [dict(zip(model.input_names, fx_pytree.tree_flatten_spec((list(a), k), spec)))
              for a, k in batches]
    grads: list[dict[str, torch.Tensor]] = [{} for _ in batches]
    fed: dict[tuple[int, int], list[tuple[str, torch.Tensor]]] = {}
    made: dict[tuple[int, int], Sequence[Any]] = {}
    losses = []
    for action in order:
        s, k = action.segment, action.microbatch
        segment, seg = getattr(model, f"seg{s}"), info[s]
        if action.phase == "forward":
            inputs, leaves = [], []
            for name in seg.inputs:
                value = values[k][name]
                if isinstance(value, torch.Tensor):
                    value = value.to(segment.device)
                    if value.requires_grad:
                        value = value.detach().requires_grad_(True)
                        leaves.append((name, value))
                inputs.append(value)
            outputs = segment(*inputs)
            fed[(s, k)], made[(s, k)] = leaves, outputs
            values[k].update(zip(seg.outputs, outputs))
            for name, out in zip(seg.outputs, outputs):
                if name in model.output_names:
                    losses.append(out.detach())
                    grads[k][name] = torch.full_like(out, scale)
            continue
        pairs = [(out, grads[k].pop(name)) for name, out in zip(seg.outputs, made.pop((s, k)))
                 if name in grads[k] and isinstance(out, torch.Tensor) and out.requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs],
                                    [g.to(o.device) for o, g in pairs])
        for name, leaf in fed.pop((s, k)):
            if leaf.grad is not None:
                held = grads[k].get(name)
                grads[k][name] = leaf.grad if held is None else held + leaf.grad.to(held.device)
        for name in seg.outputs:
            values[k].pop(name, None)
    total = sum(loss.to("cpu").double() for loss in losses)
    return (total * scale).float() if rule == "mean" else total.float()
