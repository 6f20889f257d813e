"""Solve: the tensor-parallel candidate of a training plan, priced by what DTensor does.

N ranks train the model and its loss, every rank on the whole batch, each matmul's weight split
(``emit.distributed.tensor_train``). ``solve.tensor.observe`` with the optimizer runs the step on
N fake ranks: rank 0's share of each op, the collectives of the forward and those of the
backward, each charged to the op whose backward dispatched them (a column's input gradient
all-reduced, say). ``tensor_step_problem`` is ``train.step_problem`` of rank 0's forward
(``solve.tensor.tensor_problem``, without its collectives), then each collective added to the
node that waits for it, forward or backward, priced as the forward's are. The backward's
compute is not observed op by op: it is the forward's times the backward factor, the one a
plan's step takes (``train.graph``: 2x, or ``profile.backward``'s), or, where the ranks are this
machine's CPU workers, the backward over the forward measured under DTensor here; there the
forward and the update are measured too (``Observed.forward_s``, ``update_s``).
docs/training.md, "Tensor-parallel training".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from autoplace.ir import Problem
from autoplace.simulate.schedules import BACKWARD
from autoplace.solve.tensor import (
    OUTPUTS,
    Observed,
    measured_scale,
    ring_pricer,
    tensor_problem,
)
from autoplace.train import step_problem
from autoplace.train.graph import trained_bytes
from autoplace.train.recompute import recompute_units
from autoplace.train.updates import after_backward, with_measured_forward, with_measured_updates

__all__ = ["tensor_step_problem"]


def tensor_step_problem(problem: Problem, observed: Observed, devices: tuple[str, ...], *,
                        optimizer: str, factors: Mapping[str, float] | None = None,
                        measured: bool = False, collectives_s: float | None = None,
                        dtype: str = "float32",
                        data_parallel: Callable[[Problem], Problem] | None = None,
                        recompute: bool = False) -> Problem:
    """The training step of ``problem`` (the forward of the model and its loss on the whole
    batch) as rank 0 of ``devices`` runs it (see the module's docstring): its forward scaled
    by its shares, its backward ``factors[device]`` times that (2x where absent), its
    updates on rank 0's part of each parameter, and every collective the forward and the
    backward waited for added where it waited, each a ring over ``devices`` or, with
    ``collectives_s`` (all of a step's measured), shared by the rings' times. ``measured``:
    the devices are this machine's CPU workers, whose passes ``observed`` timed.
    ``data_parallel``: what a dp dimension adds to the step (``pipeline.tensor``'s mesh),
    applied last but for the updates' move after the backward. ``recompute``: each unit's
    forward runs again before its backward, its collectives included
    (``train.recompute.recompute_units``: per-block activation checkpointing)."""
    device = devices[0]
    rank0 = tensor_problem(problem, replace(observed, collectives={}), devices,
                           measured=measured)
    factor = {d: f for d, f in (factors or {}).items() if d == device}
    if measured and observed.forward_s and observed.backward_s:
        rank0 = with_measured_forward(rank0, {device: observed.forward_s})
        factor = {device: observed.backward_s / observed.forward_s}
    step = step_problem(rank0, optimizer, backward_factor=factor, dtype=dtype)
    trained = sum(trained_bytes(step.graph).values())
    if measured and observed.update_s is not None and trained:
        step = with_measured_updates(step, {device: observed.update_s / trained})
    step = _with_collectives(step, problem, observed, devices, collectives_s)
    if recompute:
        step = recompute_units(step)
    if data_parallel is not None:
        step = data_parallel(step)
    return after_backward(step) if measured else step


def _with_collectives(step: Problem, forward: Problem, observed: Observed,
                      devices: tuple[str, ...], collectives_s: float | None) -> Problem:
    """``step`` with each observed collective's time added to the node that waited for it:
    a forward op's to its node, a backward's to its node's backward (the loss's own, and the
    outputs' gathers, to the last node's)."""
    ring = ring_pricer(forward, devices)
    scale = measured_scale(ring, [observed.collectives, observed.backward_collectives],
                           collectives_s)
    node_of = {op: n.name for n in forward.graph.nodes for op in n.ops}
    last = forward.graph.nodes[-1].name
    compute = {name: dict(per) for name, per in step.costs.compute_s.items()}
    device = devices[0]
    for table, suffix in ((observed.collectives, ""), (observed.backward_collectives, BACKWARD)):
        for op, per in table.items():
            node = (last if op == OUTPUTS else node_of.get(op, last)) + suffix
            if node not in compute:  # a backward of a node that needs no gradient
                node = node.removesuffix(suffix)
            compute[node][device] += scale * sum(ring(kind, nbytes) for kind, nbytes in per)
    return replace(step, costs=replace(step.costs, compute_s=compute))
