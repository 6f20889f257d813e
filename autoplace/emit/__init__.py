"""Emit stage: cut the traced model along the plan into device segments, run, save and check it.

Input is the traced fx module and a device per op (from the plan); output is a
``PartitionedModel`` whose segments ``seg0``, ``seg1``, ... each run on one device. Read
``emit_and_verify`` (below: the stage as the pipeline runs it; ``train_emitted`` and
``check_step_memory`` check a training plan's emitted model), then the parts, each importing
only those listed before it:

1. ``device_map``: where planned devices run on this machine (``local_device_map``, remaps).
2. ``runtime/``: the engine generated models import, and the threaded runtime's program.
3. ``codegen/``: the cut (``codegen.model.emit_model``), the generated source and forwards.
4. ``files/``: ``save_model`` and ``load_model``, the user's checkpoint, Hugging Face maps.
5. ``train/``: a training step of M micro-batches, and the optimizer with master weights.
6. ``check/``: outputs against the original, measured memory, the program replayed, training.
7. ``distributed/``: what runs under torchrun (``OUT/train.py``, ``OUT/launch.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import torch

from autoplace.emit.check.memory import (
    PeakMeasurement,
    comparable_peak_bytes,
    measure,
    measure_peak_bytes,
    measure_step,
)
from autoplace.emit.check.outputs import ENFORCE_PEAK_DEFAULT, PeakCheck, check_peak, verify
from autoplace.emit.check.replay import replay
from autoplace.emit.check.training import verify_training
from autoplace.emit.codegen.model import PartitionedModel, SegmentInfo, emit_model
from autoplace.emit.device_map import local_device_map
from autoplace.emit.distributed.ddp import write_train_script
from autoplace.emit.distributed.devices import emitted_devices
from autoplace.emit.distributed.replicas import verify_replicas
from autoplace.emit.files.saving import load_model, load_segments, save_model
from autoplace.formats.plan import Verification
from autoplace.ir import Problem, Schedule
from autoplace.progress import stage
from autoplace.progress.notes import note
from autoplace.simulate.memory import start_order
from autoplace.trace import TracedModel
from autoplace.train.layers import kept_state, no_dropout, zero_dropout

__all__ = [
    "ENFORCE_PEAK_DEFAULT",
    "PartitionedModel",
    "SegmentInfo",
    "check_step_memory",
    "emit_and_verify",
    "emit_model",
    "load_model",
    "load_segments",
    "local_device_map",
    "measure_peak_bytes",
    "op_order",
    "save_model",
    "train_emitted",
    "verify",
    "verify_replicas",
    "write_train_script",
]


# The bound on how far the emitted program, replayed, may be from the simulator.
REPLAY_TOLERANCE = 0.05


def emit_and_verify(
    traced: TracedModel,
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    problem: Problem,
    schedule: Schedule,
    device_of_op: Mapping[str, str],
    check_outputs: bool,
    check_memory: bool | None = None,
    meta_weights: bool = False,
    units: Mapping[str, str] | None = None,
) -> tuple[PartitionedModel | None, Verification]:
    """Emit ``traced`` as the plan places it and, with ``check_outputs``, verify it against
    ``model`` on ``args``/``kwargs``: ``(emitted model or None, verification)``, the
    verification being the plan's record (``formats.plan.Verification``); notes go to the open
    collector (``progress.notes``).

    Verifying also measures the emitted model's peak bytes per device and records them beside
    the plan's (``peak_bytes``); a measurement above the plan's figure raises
    ``VerificationError`` when ``check_memory`` is on (``None``: ``ENFORCE_PEAK_DEFAULT``); off,
    it is recorded as ``exceeded``.
    ``problem``, ``schedule`` and ``device_of_op`` are the plan's; devices absent from this
    machine are materialized on the CPU, and a note says so. The example inputs travel with the
    emitted model (``example_inputs``) so that ``save_model`` writes them for ``autoplace run``.
    With ``meta_weights`` (the weights come from a checkpoint when the emitted model is
    loaded) a model on the meta device is emitted, on meta, and not verified.
    ``units``: FSDP2's unit of each op that has one (``train.sharded``), each cut into segments
    of its own (``codegen.model.emit_model``).
    """
    if traced.has_meta_params and not meta_weights:
        note("the partitioned model was not emitted: the parameters are on the meta device")
        return None, Verification(
            detail="parameters are on the meta device: no weights to emit or run")
    torch_device = emitted_devices(problem.cluster.devices)
    device_of = {op: torch_device[dev] for op, dev in device_of_op.items()}
    order = op_order(traced.module, problem, schedule)
    remap = local_device_map(sorted(set(device_of.values())))
    moved = sorted(k for k, v in remap.items() if k != v)
    if moved:
        note(f"{', '.join(moved)} not present here: the emitted model was materialized on cpu "
             "for verification; `autoplace.emit.load_model(dir)` puts it on the planned devices")
    emitted = emit_model(traced.module, device_of, order=order, device_map=remap,
                         meta_weights=traced.has_meta_params, units=units)
    emitted.example_inputs = (args, kwargs)
    played = replay(emitted.program, [seg.nodes for seg in emitted.segment_info],
                    problem=problem, schedule=schedule)
    if played.error(schedule.makespan_s) > REPLAY_TOLERANCE:
        note(f"the emitted model's launch order, replayed under the plan's costs, takes "
             f"{played.makespan_s * 1e6:.1f} us against the simulator's "
             f"{schedule.makespan_s * 1e6:.1f} us: the makespan may not hold as emitted")
    if not check_outputs:
        return emitted, Verification(detail="verification disabled (--no-verify)")
    if traced.has_meta_params:
        return emitted, Verification(
            detail="parameters are on the meta device: the emitted model reads its weights "
            "from the checkpoint when loaded; not verified")
    stage("verify")
    # A model in train() (a training plan's, ``train.layers``) is compared with its dropout
    # probabilities at zero, and neither side's batch norm statistics move.
    with kept_state(model, emitted):
        with no_dropout(), zero_dropout(emitted):
            # ``verify`` is looked up here, in this package, so that tests can replace it.
            outcome = verify(model, emitted, args, kwargs)
        detail = outcome.detail
        if moved:
            detail += " (planned devices remapped to cpu)"
        peak = _check_memory(emitted, lambda: measure(emitted, args, kwargs), problem=problem,
                             schedule=schedule, enforce=ENFORCE_PEAK_DEFAULT
                             if check_memory is None else check_memory)
    return emitted, replace(outcome, detail=f"{detail}; {peak.detail}",
                            memory_status=peak.status, peak_bytes=peak.peak_bytes,
                            peak_method=peak.method)


def _check_memory(
    emitted: PartitionedModel,
    measuring: Callable[[], PeakMeasurement],
    *,
    problem: Problem,
    schedule: Schedule,
    enforce: bool,
) -> PeakCheck:
    """Measure the emitted model's peak per planned device (``measuring()``) and check it
    against the plan's."""
    name_of: dict[str, str] = {}
    for name, torch_device in emitted_devices(problem.cluster.devices).items():
        if torch_device in name_of:
            return PeakCheck(status="not measured", detail=(
                f"memory not measured: {name_of[torch_device]} and {name} are "
                f"both {torch_device}, so their segments cannot be told apart"))
        name_of[torch_device] = name
    measured = measuring()
    by_name = {name_of[d]: b for d, b in measured.peak_bytes.items()}
    return check_peak(by_name, comparable_peak_bytes(problem, schedule),
                      method=measured.method, enforce=enforce)


def op_order(module: torch.fx.GraphModule, problem: Problem, schedule: Schedule) -> list[str]:
    """Ops in the order the simulator launches their plan nodes (``Schedule.launch_order``), or
    in the simulator's order of start without one (``simulate.memory.start_order``, the order
    its memory model cuts segments in): a topological order (a consumer starts no earlier than
    its producer ends) that keeps each device's work contiguous."""
    position = {n.name: i for i, n in enumerate(module.graph.nodes)}
    rank = {name: i for i, name in enumerate(schedule.launch_order or start_order(
        problem.graph, schedule.start_s, schedule.end_s))}
    keyed = [((rank[node.name], position.get(op, 0)), op)
             for node in problem.graph.nodes for op in node.ops]
    return [op for _, op in sorted(keyed)]


def check_step_memory(emitted: PartitionedModel, run: Callable[[Any], Any], *,
                      optimizer: str, dtype: str = "float32", problem: Problem,
                      schedule: Schedule,
                      check_memory: bool | None = None) -> PeakCheck:
    """A training step's peak per planned device (``check.memory.measure_step``: ``run(charge)``,
    the step's forward and backward on this thread, then ``optimizer``'s update, after one
    step unmeasured) against the step plan's (``problem``, ``schedule``), failing above it
    with ``check_memory`` (``None``: ``ENFORCE_PEAK_DEFAULT``). ``emitted``'s weights and
    gradients are left as they were."""
    with _untrained(emitted):
        return _check_memory(emitted, lambda: measure_step(emitted, run, optimizer=optimizer,
                                                           dtype=dtype),
                             problem=problem, schedule=schedule,
                             enforce=ENFORCE_PEAK_DEFAULT if check_memory is None
                             else check_memory)


def train_emitted(emitted: PartitionedModel, model: torch.nn.Module, args: tuple[Any, ...],
                  kwargs: dict[str, Any], targets: tuple[Any, ...], *,
                  optimizer: str, emitted_step: Callable[..., torch.Tensor] | None = None,
                  dtype: str = "float32", microbatches: int = 1,
                  rule: str | None = "mean") -> dict[str, Any]:
    """``check.training.verify_training`` of ``emitted`` against ``model`` (a ``train.LossModel``),
    leaving ``emitted``'s weights as they were (what ``save_model`` writes is untrained)."""
    with _untrained(emitted):
        return verify_training(emitted, model, args, kwargs, targets, optimizer=optimizer,
                               emitted_step=emitted_step, dtype=dtype,
                               microbatches=microbatches, rule=rule)


@contextlib.contextmanager
def _untrained(emitted: PartitionedModel) -> Iterator[None]:
    """``emitted`` trained inside, its weights and buffers put back and its gradients dropped
    afterwards: what ``save_model`` writes is the untrained model."""
    saved = {k: v.detach().clone() for k, v in emitted.state_dict().items()}
    try:
        yield
    finally:
        with torch.no_grad():
            emitted.load_state_dict(saved)
        for p in emitted.parameters():
            p.grad = None
