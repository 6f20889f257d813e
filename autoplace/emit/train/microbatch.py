"""Emit: a training step of M micro-batches, run segment by segment in the plan's order.

The emitted model of a training plan with micro-batches computes the loss of one micro-batch.
A step (``train_step``) runs each segment's forward and backward of each micro-batch as its own
*action*, in the order the plan's schedule starts them (``action_order``: GPipe's or 1F1B's
per-device order, ``simulate.schedules``), so that it holds what the plan holds. A segment's
inputs from another segment enter it detached (as ``torch.distributed.pipelining``'s stages take
them), so its backward is its own; parameters accumulate their gradient over the micro-batches,
and the caller steps the optimizer once. The batch's loss is the mean (or the sum, ``loss_rule``)
of the micro-batches' losses; each backward starts from ``1/M`` (or 1), times float16's scale.

``split_batch`` cuts the example inputs and targets into micro-batches (and, for data-parallel
replicas, ``distributed.ddp``, into shards): the batch size is the first dimension of the first
tensor among the inputs (``batch_size``), and every tensor whose first dimension has that size
is cut along it; the others are passed whole to every part.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import threading
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import _pytree as fx_pytree
from torch.utils import _pytree as pytree

from autoplace.emit.files.saving import input_names
from autoplace.errors import AutoplaceError, EmitError
from autoplace.ir import Problem, Schedule
from autoplace.progress.notes import note
from autoplace.simulate.schedules import phase_of
from autoplace.train.layers import in_eval

__all__ = ["Action", "action_order", "batch_size", "loss_rule", "split_batch", "stepper",
           "train_step"]

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
    if count == 1:
        return [(tuple(args), dict(kwargs))]
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
    example (``model`` returns the loss). Raises ``AutoplaceError`` when neither does. A model
    on the meta device has no values to compare: ``mean`` is taken, and a note says so. The
    rule is the loss's: it is found with the layers in ``eval()`` (``train.layers.in_eval``),
    where a sample's loss is its own (in ``train()`` batch norm normalizes by the batch, and
    dropout draws other masks for each run)."""
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        note(f"the loss over {len(batches)} parts is taken as the mean of theirs, not checked: "
             "the model is on the meta device (a loss that averages over the samples, as "
             "transformers' do where no label is ignored, splits so)")
        return "mean"
    with torch.no_grad(), in_eval(model):
        loss = model(*args, **kwargs).detach()
        whole = loss.double()
        parts = torch.stack([model(*a, **k).detach().double() for a, k in batches])
    # a half loss (--dtype) is rounded to its precision: 2 eps of it (float16 2e-3)
    rtol = max(1e-5, 2 * torch.finfo(loss.dtype).eps) if loss.is_floating_point() else 1e-5
    for rule, combined in (("mean", parts.mean()), ("sum", parts.sum())):
        if torch.allclose(whole, combined, rtol=rtol, atol=1e-6 * float(abs(whole))):
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
    """Every action of a step of ``count`` micro-batches, each after those it needs
    (``_needs``), and otherwise in the order the plan's ``schedule`` of ``problem`` (the step
    graph; with one micro-batch, its nodes carry no ``#k``) starts them."""
    segments = model.segment_info
    segment_of = {op: s.index for s in segments for op in s.nodes}
    ops = {phase_of(n.name)[0]: n.ops for n in problem.graph.nodes
           if phase_of(n.name)[1] == "forward" and phase_of(n.name)[2] in (0, None)}
    start: dict[Action, float] = {}
    for node in problem.graph.nodes:
        base, phase, k = phase_of(node.name)
        if phase == "step":
            continue
        for op in ops.get(base, ()):
            if op in segment_of:
                action = Action(segment_of[op], k or 0, phase)
                start[action] = min(start.get(action, math.inf), schedule.start_s[node.name])
    needs = _needs(segments, count)
    waiting = {a: len(n) for a, n in needs.items()}
    unblocks: dict[Action, list[Action]] = {a: [] for a in needs}
    for a, n in needs.items():
        for b in n:
            unblocks[b].append(a)
    # An action no plan node stands for (a segment of ops the plan folded away, or a backward
    # with nothing to do) runs as soon as it may: last, it would hold back its producers'.
    ready = [(start.get(a, 0.0), a) for a, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    order: list[Action] = []
    while ready:
        _, action = heapq.heappop(ready)
        order.append(action)
        for a in unblocks[action]:
            waiting[a] -= 1
            if waiting[a] == 0:
                heapq.heappush(ready, (start.get(a, 0.0), a))
    if len(order) != len(needs):
        raise EmitError("the emitted model's segments read each other in a cycle: no order "
                        "runs their micro-batches")
    return tuple(order)


def _needs(segments: Sequence[Any], count: int) -> dict[Action, set[Action]]:
    """What each action waits for: a forward, its inputs' forwards; a backward, its own
    forward and its readers' backwards (the gradients of its outputs)."""
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
    return needs


def stepper(model: torch.nn.Module, problem: Problem, schedule: Schedule,
            batches: Sequence[Batch], rule: str,
            recompute: Collection[str] = ()) -> Callable[[], torch.Tensor]:
    """One step of ``batches`` through ``model`` in the order of the plan's ``schedule`` of
    ``problem`` (``action_order``, found once), as a function to call each step; the
    segments on the planned devices ``recompute`` recompute (``train_step``)."""
    order = action_order(model, problem, schedule, len(batches))

    def step(*, loss_scale: float = 1.0) -> torch.Tensor:
        return train_step(model, batches, order, rule, recompute=recompute,
                          loss_scale=loss_scale)

    return step


def train_step(model: torch.nn.Module, batches: Sequence[Batch], order: Sequence[Action],
               rule: str, *, threads: bool | None = None, loss_scale: float = 1.0,
               recompute: Collection[str] = (),
               charge: Callable[[str], AbstractContextManager[Any]] | None = None
               ) -> torch.Tensor:
    """Run the forward and backward of every micro-batch in ``batches`` through ``model``'s
    segments in ``order`` (``action_order``), accumulating the parameters' gradients; returns
    the batch's loss (detached), the ``rule`` (``mean`` or ``sum``) of the micro-batches'.
    ``loss_scale``: float16's loss scale (``optimizer.MasterWeights``), by which each
    micro-batch's backward seed is multiplied (the loss returned is not scaled).

    A segment on one of the planned devices ``recompute`` (``train.recompute``) runs its
    forward with nothing saved for autograd, keeping its inputs, and runs it again with
    autograd at the start of its backward; an input that needs a gradient and was made by a
    recomputing segment on the same device is not kept but made again, by running that
    segment's forward again first (its backward, later, uses what that made).

    With ``threads`` (by default, where every segment is on a CPU device and there are
    several), each planned device runs its own actions in that order on a worker thread of
    one intra-op thread, as the threaded forward does (``codegen.threaded``), waiting for the
    actions each one needs: autograd runs a CPU backward on the thread that calls it, so the
    devices' backwards overlap as their forwards do. Otherwise the caller's thread runs every
    action (GPU work is queued asynchronously, so GPUs still overlap)."""
    info = model.segment_info
    if model._in_spec is None or not model.input_names:
        raise EmitError("micro-batches need an emitted model traced by torch.export (its input "
                        "structure); this one has none: plan it again")
    needs = _needs(info, len(batches))
    seen: set[Action] = set()
    for action in order:
        if not needs[action] <= seen:
            raise EmitError(f"the order runs {action} before {sorted(needs[action] - seen)[0]}, "
                            "which it needs: use action_order's")
        seen.add(action)
    if seen != set(needs):
        raise EmitError(f"the order leaves out {len(set(needs) - seen)} of the step's actions, "
                        f"e.g. {sorted(set(needs) - seen)[0]}: use action_order's")
    step = _Actions(model, batches, 1.0 / len(batches) if rule == "mean" else 1.0,
                    {s.index for s in info if s.planned_device in recompute}, charge,
                    loss_scale=loss_scale)
    if threads is None:
        threads = (len({s.planned_device for s in info}) > 1
                   and all(torch.device(s.device).type == "cpu" for s in info))
    if threads:
        _threaded(order, step.run, {s.index: s.planned_device for s in info}, needs)
    else:
        for action in order:
            step.run(action)
    return step.loss()


@dataclass(frozen=True)
class _Remade:
    """A recomputing segment's input that is not kept: it needs a gradient and is made on the
    same device by another recomputing segment, ``producer``, which is run again (with
    autograd) when this segment's backward needs it, as the plan's ``g@recompute#k`` nodes
    feed ``f@recompute#k`` (``train.recompute``)."""

    producer: int


def _drop(_: torch.Tensor) -> None:
    """``saved_tensors_hooks``' pack: what autograd would save is not kept."""
    return None


def _never(_: None) -> torch.Tensor:
    raise EmitError("a recomputing segment's first forward was differentiated: its backward "
                    "runs it again")


class _Actions:
    """The state of one step while its actions run: each micro-batch's values by name, the
    gradients its backwards hand on, and each forward's detached inputs and outputs (its
    kept inputs alone, in a segment that recomputes: one of ``again``). ``charge(device)``:
    a context each backward runs in (``memory.measure_step`` charges what it allocates)."""

    def __init__(self, model: torch.nn.Module, batches: Sequence[Batch], scale: float,
                 again: Collection[int] = (),
                 charge: Callable[[str], AbstractContextManager[Any]] | None = None, *,
                 loss_scale: float = 1.0) -> None:
        self.model, self.scale, self.again = model, scale, set(again)
        self.seed = scale * loss_scale
        self.charge = charge or (lambda _: contextlib.nullcontext())
        info = model.segment_info
        self.producer = {name: seg.index for seg in info for name in seg.outputs}
        self.values = [dict(zip(model.input_names,
                                fx_pytree.tree_flatten_spec((list(a), k), model._in_spec)))
                       for a, k in batches]
        self.grads: list[dict[str, torch.Tensor]] = [{} for _ in batches]
        # A value is dropped once its last reader's forward has taken it (as the plan frees
        # it), not kept until its producer's backward: a backward reads its outputs from
        # ``made`` (or makes them again), never from ``values``.
        readers = Counter(name for seg in info for name in set(seg.inputs))
        self.unread = [dict(readers) for _ in batches]
        self.fed: dict[tuple[int, int], list[tuple[str, torch.Tensor]]] = {}
        self.made: dict[tuple[int, int], Sequence[Any]] = {}
        # A recomputing segment's inputs as its forward took them (a leaf, a value, or
        # ``_Remade``), whether it has a backward to run, and what a reader's backward made
        # again of it ahead of its own backward (outputs and input leaves).
        self.kept: dict[tuple[int, int], list[Any]] = {}
        self.differentiable: dict[tuple[int, int], bool] = {}
        self.remade: dict[tuple[int, int], tuple[Sequence[Any], list[Any]]] = {}
        self.losses: list[torch.Tensor] = []
        self.adding = threading.Lock()  # two readers' backwards may add into one gradient

    def run(self, action: Action) -> None:
        if action.phase == "forward":
            self.forward(action.segment, action.microbatch)
        else:
            with self.charge(self.model.segment_info[action.segment].planned_device):
                self.backward(action.segment, action.microbatch)

    def forward(self, s: int, k: int) -> None:
        segment, seg = getattr(self.model, f"seg{s}"), self.model.segment_info[s]
        inputs, leaves = [], []
        for name in seg.inputs:
            value = self.values[k][name]
            if isinstance(value, torch.Tensor):
                value = value.to(segment.device)
                if value.requires_grad:
                    value = value.detach().requires_grad_(True)
                    leaves.append((name, value))
            inputs.append(value)
        if s in self.again:
            # Autograd on, so that the outputs say which need a gradient, but nothing saved
            # for a backward: it runs the forward again (``_recompute``).
            with torch.autograd.graph.saved_tensors_hooks(_drop, _never):
                outputs = segment(*inputs)
            kept = [_Remade(self.producer[name]) if self._remade_input(s, name, value)
                    else value for name, value in zip(seg.inputs, inputs)]
            self.kept[(s, k)] = kept
            held = {id(value) for value in kept}
            leaves = [(name, leaf) for name, leaf in leaves if id(leaf) in held]
            self.differentiable[(s, k)] = any(
                isinstance(out, torch.Tensor) and out.requires_grad for out in outputs)
        else:
            outputs = segment(*inputs)
            self.made[(s, k)] = outputs
        self.fed[(s, k)] = leaves
        with self.adding:
            for name in set(seg.inputs):
                self.unread[k][name] -= 1
                if not self.unread[k][name]:
                    self.values[k].pop(name, None)
        self.values[k].update(zip(seg.outputs, outputs))
        for name, out in zip(seg.outputs, outputs):
            if name in self.model.output_names:
                self.losses.append(out.detach())
                self.grads[k][name] = torch.full_like(out, self.seed)

    def _remade_input(self, s: int, name: str, value: Any) -> bool:
        """Whether recomputing segment ``s`` makes input ``name`` again instead of keeping it:
        it needs a gradient and a recomputing segment on the same device made it."""
        p = self.producer.get(name)
        info = self.model.segment_info
        return (isinstance(value, torch.Tensor) and value.requires_grad and p in self.again
                and info[p].planned_device == info[s].planned_device)

    def _recompute(self, s: int, k: int) -> tuple[Sequence[Any], list[Any]]:
        """Segment ``s``'s forward of micro-batch ``k`` again, with autograd: its outputs and
        its input leaves (``(name, leaf)``). An input ``_Remade`` comes from its producer's
        forward, made again first (and kept for that producer's backward)."""
        if (s, k) in self.remade:
            return self.remade.pop((s, k))
        seg = self.model.segment_info[s]
        fed = {id(leaf) for _, leaf in self.fed[(s, k)]}
        inputs, leaves = [], []
        for name, value in zip(seg.inputs, self.kept.pop((s, k))):
            if isinstance(value, _Remade):
                p = value.producer
                if (p, k) not in self.remade:
                    self.remade[(p, k)] = self._recompute(p, k)
                made = self.remade[(p, k)][0]
                value = made[self.model.segment_info[p].outputs.index(name)]
                value = value.detach().requires_grad_(True)
                leaves.append((name, value))
            elif id(value) in fed:
                leaves.append((name, value))
            inputs.append(value)
        return getattr(self.model, f"seg{s}")(*inputs), leaves

    def backward(self, s: int, k: int) -> None:
        seg, grads = self.model.segment_info[s], self.grads[k]
        if s in self.again:
            if self.differentiable.pop((s, k)):
                made, self.fed[(s, k)] = self._recompute(s, k)
            else:  # nothing of it needs a gradient: nothing to run again
                self.kept.pop((s, k))
                made = ()
        else:
            made = self.made.pop((s, k))
        with self.adding:
            pairs = [(out, grads.pop(name))
                     for name, out in zip(seg.outputs, made)
                     if name in grads and isinstance(out, torch.Tensor) and out.requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g.to(o.device) for o, g in pairs])
        for name, leaf in self.fed.pop((s, k)):
            if leaf.grad is not None:
                with self.adding:
                    held = grads.get(name)
                    grads[name] = leaf.grad if held is None else held + leaf.grad.to(held.device)
        for name in seg.outputs:
            self.values[k].pop(name, None)

    def loss(self) -> torch.Tensor:
        total = sum(loss.to("cpu").double() for loss in self.losses)
        return (total * self.scale).float()


def _threaded(order: Sequence[Action], run: Callable[[Action], None],
              device_of: Mapping[int, str], needs: Mapping[Action, set[Action]]) -> None:
    """``run`` every action of ``order``, each planned device's in that order on a worker
    thread of its own, each once the actions it ``needs`` are done; the first error is raised
    here, after every worker has stopped."""
    done = {a: threading.Event() for a in order}
    failed: list[BaseException] = []

    def work(actions: list[Action]) -> None:
        try:
            for action in actions:
                for before in needs[action]:
                    done[before].wait()
                if failed:
                    return
                run(action)
                done[action].set()
        except BaseException as exc:  # handed to the caller, which raises it
            failed.append(exc)
            for event in done.values():
                event.set()

    per_device: dict[str, list[Action]] = {}
    for action in order:
        per_device.setdefault(device_of[action.segment], []).append(action)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        workers = [threading.Thread(target=work, args=(a,), daemon=True)
                   for a in per_device.values()]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        torch.set_num_threads(threads)
    if failed:
        raise failed[0]
