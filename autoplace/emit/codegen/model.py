"""Emit: ``emit_model`` turns a placed fx graph into a runnable multi-device model.

Input is a ``torch.fx.GraphModule`` (from ``torch.export`` or ``torch.fx.symbolic_trace``) and a
device per compute node; output is a ``PartitionedModel`` whose children ``seg0``, ``seg1``, ...
are device-contiguous ``GraphModule`` segments, called by a generated top-level forward that
moves values between devices with explicit ``.to(device, non_blocking=False)`` copies; over
several devices the model runs the threaded forward instead (``threaded``). Either way a
``cpu-thread`` worker's segments run on one intra-op thread, as the plan profiled them
(``_under_worker_threads``).

Read ``emit_model`` first: ``lower`` -> ``run_order`` -> ``assign_devices`` -> ``partition`` ->
``build_segment`` per segment -> ``_top_forward`` (which values each segment call must copy to
its device) -> ``PartitionedModel``. Each step's rules (a device for nodes the plan names none
for, where a parameter lives, tied weights, device arguments) are in its own docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from autoplace.emit.codegen.fxgraph import build_segment
from autoplace.emit.codegen.lower import Lowered, lower
from autoplace.emit.codegen.segment import assign_devices, later_uses, owners, partition, run_order
from autoplace.emit.codegen.source import (
    SegmentCall,
    compile_forward,
    forward_source,
    literal_source,
    signature_source,
)
from autoplace.emit.codegen.threaded import threaded_forward_source
from autoplace.emit.device_map import check_device, remap
from autoplace.emit.runtime.program import Program, build_program
from autoplace.errors import EmitError

__all__ = ["PartitionedModel", "SegmentInfo", "emit_model"]


@dataclass(frozen=True)
class SegmentInfo:
    """One segment: where it was planned, where it runs, which fx nodes it holds and which
    values cross its boundary (by lowered node name)."""

    index: int
    planned_device: str
    device: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    unit: str | None = None  # the FSDP unit whose ops it holds (``train.sharded``)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "device": self.planned_device,
            "nodes": list(self.nodes),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
        } | ({"unit": self.unit} if self.unit is not None else {})


class PartitionedModel(torch.nn.Module):
    """Segments ``seg0..segN`` (fx ``GraphModule``s, each on its own device) and a generated
    top-level forward that calls them. ``segments`` lists ``(planned device, [fx node names])``;
    ``devices`` are the devices the segments actually live on (after ``device_map``).

    To run on other devices, emit again (or ``load_model``) with a ``device_map``: ``.to()``
    would move the tensors but not the segments' ``device`` attributes that factory ops read.
    """

    def __init__(
        self,
        segments: Sequence[torch.fx.GraphModule],
        *,
        info: Sequence[SegmentInfo],
        forward_source: str,
        in_spec: pytree.TreeSpec | None,
        out_spec: pytree.TreeSpec | None,
        program: Program | None = None,
        threaded_source: str = "",
        runtime: str = "sequential",
        input_names: Sequence[str] = (),
        output_names: Sequence[str] = (),
    ) -> None:
        super().__init__()
        for index, segment in enumerate(segments):
            self.add_module(f"seg{index}", segment)
        self.segment_info = tuple(info)
        self.segments = [(s.planned_device, list(s.nodes)) for s in info]
        self.planned_devices = [s.planned_device for s in info]
        self.devices = [s.device for s in info]
        self.forward_source = forward_source
        self._in_spec = in_spec
        self._out_spec = out_spec
        self._forward = compile_forward(forward_source)
        # The threaded runtime (codegen/threaded.py): GPUs launched from the caller's thread, a
        # worker thread per CPU device, running the ``program``; ``runtime`` picks which forward
        # runs.
        self.program = program
        self.threaded_source = threaded_source
        self._threaded = compile_forward(threaded_source) if threaded_source else None
        self.runtime = runtime if self._threaded is not None else "sequential"
        # The graph's inputs, as ``in_spec`` flattens the call's arguments, and its flat
        # outputs, by value name: what a caller that runs the segments itself
        # (``microbatch.py``) binds ``SegmentInfo.inputs`` and ``outputs`` to.
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.runtime == "threaded" and self._threaded is not None:
            return self._threaded(self, *args, **kwargs)
        return self._forward(self, *args, **kwargs)


def emit_model(
    gm: torch.fx.GraphModule,
    device_of: Mapping[str, str],
    *,
    order: Sequence[str] | None = None,
    device_map: Mapping[str, str] | None = None,
    runtime: str | None = None,
    meta_weights: bool = False,
    units: Mapping[str, str] | None = None,
) -> PartitionedModel:
    """Split ``gm`` into device-contiguous segments following ``device_of`` and ``order``.

    ``order`` is a topological order of fx node names (default: graph order); a new segment
    starts wherever the device changes along it. ``device_map`` remaps planned devices by glob
    (``{"cuda:*": "cpu"}``) so a plan for absent devices can be built and run here.
    ``runtime``: ``threaded`` (the schedule, ``threaded.py``) or
    ``sequential`` (the caller's thread calls the segments in order); by default threaded when
    the segments are planned on more than one device. ``meta_weights``: tensors on the meta
    device are kept there (the model is saved to be loaded from a checkpoint, not run).
    ``units``: FSDP2's unit of fx nodes (``train.sharded``; absent: the root's): a segment
    starts wherever the unit changes too (``segment.partition``), each segment records its
    unit, and a tensor one unit's segment holds is read by no other unit's (else
    ``EmitError``: ``fully_shard`` would have resharded it).
    """
    if runtime not in (None, "threaded", "sequential"):
        raise EmitError(f"runtime {runtime!r} is not one of 'threaded', 'sequential'")
    _check_names(gm, device_of, order)
    lowered = lower(gm, meta_weights=meta_weights)
    schedule = run_order(lowered, order)
    if not schedule:
        raise EmitError("the graph has no compute nodes; there is nothing to place")
    devices = assign_devices(lowered, schedule, device_of)
    unit_of = _node_units(lowered, schedule, units) if units else {}
    groups = partition(schedule, devices, unit_of)
    owner = owners(lowered, groups)
    group_units = [next((unit_of[n] or None for n in group if n in unit_of), None)
                   for group in groups]
    _check_units(owner, groups, group_units)
    planned = [devices[group[0]] for group in groups]
    actual = [remap(device, device_map) for device in planned]
    for device, plan in zip(actual, planned):
        check_device(device, planned=plan)

    output_node = next(n for n in lowered.graph.nodes if n.op == "output")
    segment_of = {node: i for i, group in enumerate(groups) for node in group}
    segment_of.update(owner)
    later_use = later_uses(lowered.graph, segment_of, output_node)
    segments, info = [], []
    for index, group in enumerate(groups):
        owned = [n for n, i in owner.items() if i == index]
        segment, inputs, outputs = build_segment(
            group, owned, attrs=lowered.attrs, crossing=later_use, index=index, device=actual[index]
        )
        names = dict.fromkeys(lowered.origin[n.name] for n in group)
        segments.append(segment)
        info.append(
            SegmentInfo(
                index=index,
                planned_device=planned[index],
                device=actual[index],
                nodes=tuple(names),
                inputs=tuple(n.name for n in inputs),
                outputs=tuple(n.name for n in outputs),
                unit=group_units[index],
            )
        )
    forward, threaded, program = _top_forward(lowered, info, segment_of, output_node)
    if runtime is None:
        runtime = "threaded" if len(set(planned)) > 1 else "sequential"
    return PartitionedModel(
        segments,
        info=info,
        forward_source=forward,
        in_spec=lowered.in_spec,
        out_spec=lowered.out_spec,
        program=program,
        threaded_source=threaded,
        runtime=runtime,
        input_names=[n.name for n in lowered.graph.nodes if n.op == "placeholder"],
        output_names=[n.name for n in pytree.tree_leaves(output_node.args[0])
                      if isinstance(n, torch.fx.Node)],
    )


def _node_units(lowered: Lowered, schedule: Sequence[torch.fx.Node],
                units: Mapping[str, str]) -> dict[torch.fx.Node, str]:
    """The unit of each scheduled node of a unit (by its fx op, ``units``), and ``""`` (the
    root's) for a node of none that reads a tensor attribute: that tensor is the root's, so its
    segment is cut apart from any unit's. Other nodes have none: they join the run they are in."""
    keyed = {}
    for node in schedule:
        op = lowered.origin.get(node.name)
        if op in units:
            keyed[node] = units[op]
        elif any(p.op == "get_attr" and isinstance(lowered.attrs.get(p.target), torch.Tensor)
                 for p in node.all_input_nodes):
            keyed[node] = ""
    return keyed


def _check_units(owner: Mapping[torch.fx.Node, int], groups: Sequence[Sequence[torch.fx.Node]],
                 units: Sequence[str | None]) -> None:
    """Every tensor a unit's segment holds is read by that unit's segments only."""
    segment_of = {n: i for i, group in enumerate(groups) for n in group}
    for attr, index in owner.items():
        if units[index] is None:
            continue
        others = sorted({units[segment_of[u]] or "the root" for u in attr.users
                         if u in segment_of and units[segment_of[u]] != units[index]})
        if others:
            raise EmitError(f"{attr.target} is held by FSDP unit {units[index]} and read by "
                            f"{', '.join(others)}: a tensor two units share must be the root's "
                            "(train.sharded.fsdp_units)")


def _check_names(
    gm: torch.fx.GraphModule, device_of: Mapping[str, str], order: Sequence[str] | None
) -> None:
    names = {node.name for node in gm.graph.nodes}
    for what, given in (("device_of", device_of), ("order", order or ())):
        unknown = [name for name in given if name not in names]
        if unknown:
            raise EmitError(
                f"{what} names {len(unknown)} node(s) that are not in the fx graph, e.g. "
                f"{unknown[:5]}; pass fx node names (node.name), as the trace stage reports them"
            )
    for name, device in device_of.items():
        try:
            torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise EmitError(f"device_of[{name!r}] = {device!r} is not a torch device") from error


def _top_forward(
    lowered: Lowered,
    info: Sequence[SegmentInfo],
    segment_of: Mapping[torch.fx.Node, int],
    output: torch.fx.Node,
) -> tuple[str, str, Program]:
    """The sequential forward's source, the threaded forward's source, and its program."""
    nodes = {n.name: n for n in lowered.graph.nodes}
    placeholders = [n for n in lowered.graph.nodes if n.op == "placeholder"]
    signature, bindings = signature_source(
        placeholders, orig_args=lowered.orig_args, in_spec=lowered.in_spec
    )
    used = set(nodes) | {"self"} | set(lowered.orig_args or [])
    moved: dict[tuple[str, str], str] = {}
    calls = []
    for seg in info:
        moves, args = [], []
        for name in seg.inputs:
            value = nodes[name]
            source = segment_of.get(value)
            if source is not None and info[source].planned_device == seg.planned_device:
                args.append(name)
                continue
            key = (name, seg.planned_device)
            if key not in moved:
                tag = "".join(c if c.isalnum() else "_" for c in seg.planned_device)
                moved[key] = _fresh(f"{name}_{tag}", used)
                is_tensor = isinstance(value.meta.get("val"), torch.Tensor) or (
                    value.op == "get_attr" and isinstance(lowered.attrs[value.target], torch.Tensor)
                )
                moves.append((moved[key], name, is_tensor))
            args.append(moved[key])
        calls.append(
            SegmentCall(
                index=seg.index,
                planned_device=seg.planned_device,
                moves=tuple(moves),
                args=tuple(args),
                outputs=seg.outputs,
            )
        )
    calls = _with_frees(calls, keep={n.name for n in output.all_input_nodes})
    name_of = {n: n.name for n in lowered.graph.nodes}
    result = literal_source(output.args[0], name_of)
    if lowered.out_spec is not None:
        flat = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
        result = f"_unflatten({literal_source(list(flat), name_of)}, self._out_spec)"
    sources = {name: segment_of.get(nodes[name]) for seg in info for name in seg.inputs}
    program = build_program([seg.planned_device for seg in info], [seg.inputs for seg in info],
                            sources, origin=dict(lowered.origin))
    threaded = threaded_forward_source(signature=signature, bindings=bindings, calls=calls,
                                       program=program, result=result)
    sequential = forward_source(signature=signature, bindings=bindings, calls=calls,
                                result=result)
    first = {seg.planned_device: seg.index for seg in reversed(info)}  # one segment a device
    return _under_worker_threads(sequential, sorted(first.values())), threaded, program


def _under_worker_threads(source: str, segments: Sequence[int]) -> str:
    """``source``, a generated ``def forward`` of one line's head, with its body under
    ``_WorkerThreads`` (``runtime.engine``) of ``segments``' devices: a ``cpu-thread`` worker's
    segments run on one intra-op thread, as the plan profiled them, in the sequential forward
    too, whether the model was emitted here or loaded (``model.py`` holds this source)."""
    head, *body = source.rstrip("\n").splitlines()
    devices = ", ".join(f"self.seg{index}.device" for index in segments)
    return "\n".join([head, f"    with _WorkerThreads({devices}):",
                      *(f"    {line}" if line else line for line in body)]) + "\n"


def _with_frees(calls: Sequence[SegmentCall], *, keep: set[str]) -> list[SegmentCall]:
    """``calls`` with each value freed right after its last use: after the copy that last reads
    it, or after the segment call that last reads (or made and nobody reads) it; values in
    ``keep`` (the model's outputs) are never freed."""
    last: dict[str, tuple[int, int]] = {}  # name -> (call, 0: read by a copy / 1: by the call)
    for k, call in enumerate(calls):
        for name in call.outputs:
            last.setdefault(name, (k, 1))
        for _, value, _ in call.moves:
            last[value] = (k, 0)
        for name in call.args:
            last[name] = (k, 1)
    frees: dict[tuple[int, int], list[str]] = {}
    for name, at in last.items():
        if name not in keep:
            frees.setdefault(at, []).append(name)
    return [replace(call, free_moved=tuple(frees.get((k, 0), ())),
                    free_after=tuple(frees.get((k, 1), ())))
            for k, call in enumerate(calls)]


def _fresh(name: str, used: set[str]) -> str:
    candidate, suffix = name, 1
    while candidate in used:
        candidate, suffix = f"{name}_{suffix}", suffix + 1
    used.add(candidate)
    return candidate

