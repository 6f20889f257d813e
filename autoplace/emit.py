"""Emit stage: turn a placed fx graph into a runnable, saveable, multi-device model.

Input is a ``torch.fx.GraphModule`` (from ``torch.export`` or ``torch.fx.symbolic_trace``) and a
device per compute node; output is a ``PartitionedModel`` whose children ``seg0``, ``seg1``, ...
are device-contiguous ``GraphModule`` segments, called by a generated top-level forward that moves
values between devices with explicit ``.to(device, non_blocking=False)`` copies.

Read in this order: ``emit_model`` (``codegen.lower`` -> ``_schedule`` -> ``_assign_devices`` ->
``_partition`` -> ``codegen.build_segment`` per segment -> ``_top_forward``), then
``save_model``/``load_model`` (``model.py``, ``weights.safetensors``, ``meta.json``), then
``verify``. This module decides what runs where; ``autoplace.codegen`` writes the code.

Rules worth knowing:
- Nodes missing from ``device_of``: a compute node takes the device of its first producer that has
  one, else of its first consumer; a parameter/buffer (``get_attr``) lives in the segment of its
  first consumer and is passed (and copied, if needed) to later segments on other devices; model
  inputs are copied to every device that consumes them.
- ``call_module`` nodes (symbolic_trace) are inlined by tracing the module, so every segment is
  plain ``get_attr`` + ``call_function``/``call_method``; a module's training flag is baked in.
- A tensor reached under several names (tied weights) gets one name, so it is stored once.
- torch.export's ``_guards_fn`` input check is dropped: segments do not re-check input shapes.
- Every device argument is rewritten to read the segment's ``device`` attribute, so a segment
  runs where it was loaded, after any ``device_map`` remap.
"""

from __future__ import annotations

import fnmatch
import heapq
import importlib.util
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import safetensors.torch
import torch
import torch.fx
from torch.utils import _pytree as pytree

from autoplace import codegen
from autoplace.errors import EmitError, OutputError, VerificationError

__all__ = [
    "PartitionedModel",
    "SegmentInfo",
    "VerifyResult",
    "emit_model",
    "load_model",
    "save_model",
    "verify",
]

_SPEC_MODULE_PREFIXES = ("transformers.", "torch.")
_FORMAT = "autoplace.emit/1"


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "device": self.planned_device,
            "nodes": list(self.nodes),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
        }


@dataclass(frozen=True)
class VerifyResult:
    status: Literal["passed"]
    max_abs_diff: float
    detail: str


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
        self._forward = codegen.compile_forward(forward_source)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward(self, *args, **kwargs)


# ---------------------------------------------------------------------------------------------
# emit_model


def emit_model(
    gm: torch.fx.GraphModule,
    device_of: Mapping[str, str],
    *,
    order: Sequence[str] | None = None,
    device_map: Mapping[str, str] | None = None,
) -> PartitionedModel:
    """Split ``gm`` into device-contiguous segments following ``device_of`` and ``order``.

    ``order`` is a topological order of fx node names (default: graph order); a new segment
    starts wherever the device changes along it. ``device_map`` remaps planned devices by glob
    (``{"cuda:*": "cpu"}``) so a plan for absent devices can be built and run here.
    """
    _check_names(gm, device_of, order)
    lowered = codegen.lower(gm)
    schedule = _schedule(lowered, order)
    if not schedule:
        raise EmitError("the graph has no compute nodes; there is nothing to place")
    devices = _assign_devices(lowered, schedule, device_of)
    groups = _partition(schedule, devices)
    owner = _owners(lowered, groups)
    planned = [devices[group[0]] for group in groups]
    actual = [_remap(device, device_map) for device in planned]
    for device, plan in zip(actual, planned):
        _check_device(device, planned=plan)

    output_node = next(n for n in lowered.graph.nodes if n.op == "output")
    segment_of = {node: i for i, group in enumerate(groups) for node in group}
    segment_of.update(owner)
    later_use = _later_uses(lowered.graph, segment_of, output_node)
    segments, info = [], []
    for index, group in enumerate(groups):
        owned = [n for n, i in owner.items() if i == index]
        segment, inputs, outputs = codegen.build_segment(
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
            )
        )
    forward = _top_forward(lowered, info, segment_of, output_node)
    return PartitionedModel(
        segments,
        info=info,
        forward_source=forward,
        in_spec=lowered.in_spec,
        out_spec=lowered.out_spec,
    )


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


def _is_compute(node: torch.fx.Node) -> bool:
    return node.op in codegen.COMPUTE_OPS


def _schedule(lowered: codegen.Lowered, order: Sequence[str] | None) -> list[torch.fx.Node]:
    """Compute nodes in run order: ``order`` where it speaks, dependencies everywhere.

    A node missing from ``order`` runs as soon as its inputs are ready, or, if it has no compute
    inputs at all (``arange``), just before its first consumer, so it never opens a segment.
    """
    nodes = [n for n in lowered.graph.nodes if _is_compute(n)]
    position = {n: i for i, n in enumerate(nodes)}
    if order is None:
        return nodes
    rank = {name: i for i, name in reversed(list(enumerate(order)))}
    key = {n: rank[lowered.origin[n.name]] for n in nodes if lowered.origin[n.name] in rank}
    producers = {n: [p for p in n.all_input_nodes if _is_compute(p)] for n in nodes}
    lazy: set[torch.fx.Node] = set()
    for n in nodes:
        if n not in key and all(p in lazy for p in producers[n]):
            lazy.add(n)
    waiting = {n: sum(p not in lazy for p in producers[n]) for n in nodes if n not in lazy}
    ready = [((key.get(n, -1), position[n]), n) for n, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    done: list[torch.fx.Node] = []
    emitted: set[torch.fx.Node] = set()

    def emit_lazy(n: torch.fx.Node) -> None:
        for p in producers[n]:
            if p in lazy and p not in emitted:
                emit_lazy(p)
        emitted.add(n)
        done.append(n)

    while ready:
        _, n = heapq.heappop(ready)
        emit_lazy(n)
        for user in n.users:
            if user in waiting:
                waiting[user] -= 1
                if waiting[user] == 0:
                    heapq.heappush(ready, ((key.get(user, -1), position[user]), user))
    for n in nodes:  # lazy nodes nobody consumes, e.g. a standalone assert
        if n not in emitted:
            emit_lazy(n)
    last = (-1, -1)
    for n in done:
        if n in key:
            if (key[n], position[n]) < last:
                raise EmitError(
                    f"order is not a topological order: {lowered.origin[n.name]!r} is listed at "
                    f"position {key[n]} but depends on a node listed at position {last[0]}"
                )
            last = (key[n], position[n])
    return done


def _assign_devices(
    lowered: codegen.Lowered, schedule: list[torch.fx.Node], device_of: Mapping[str, str]
) -> dict[torch.fx.Node, str]:
    """A device for every compute node: its own, else its first producer's, else its first
    consumer's, else its neighbour's in the schedule."""
    devices: dict[torch.fx.Node, str] = {}
    for n in schedule:
        origin = lowered.origin[n.name]
        if origin in device_of:
            devices[n] = str(torch.device(device_of[origin]))
    for n in schedule:
        if n not in devices:
            found = [devices[p] for p in n.all_input_nodes if p in devices]
            if found:
                devices[n] = found[0]
    step = {n: i for i, n in enumerate(schedule)}
    for n in reversed(schedule):
        if n not in devices:
            users = sorted((u for u in n.users if u in devices), key=step.__getitem__)
            if users:
                devices[n] = devices[users[0]]
    known = [devices[n] for n in schedule if n in devices]
    if not known:
        raise EmitError("device_of assigns no compute node; give at least one a device")
    previous = known[0]
    for n in schedule:
        previous = devices.setdefault(n, previous)
    return devices


def _partition(
    schedule: list[torch.fx.Node], devices: Mapping[torch.fx.Node, str]
) -> list[list[torch.fx.Node]]:
    groups: list[list[torch.fx.Node]] = []
    for n in schedule:
        if not groups or devices[groups[-1][0]] != devices[n]:
            groups.append([])
        groups[-1].append(n)
    return groups


def _owners(
    lowered: codegen.Lowered, groups: list[list[torch.fx.Node]]
) -> dict[torch.fx.Node, int]:
    """The segment that holds each tensor attribute: that of its first consumer."""
    segment_of = {n: i for i, group in enumerate(groups) for n in group}
    owner: dict[torch.fx.Node, int] = {}
    for node in lowered.graph.nodes:
        if node.op != "get_attr" or not node.users:
            continue
        if not isinstance(lowered.attrs[node.target], torch.Tensor):
            continue
        users = [segment_of[u] for u in node.users if u in segment_of]
        owner[node] = min(users) if users else len(groups) - 1
    return owner


def _later_uses(
    graph: torch.fx.Graph, segment_of: Mapping[torch.fx.Node, int], output: torch.fx.Node
) -> set[torch.fx.Node]:
    """Values that some other segment, or the model's output, reads."""
    crossing = set()
    for node, index in segment_of.items():
        for user in node.users:
            if user is output or segment_of.get(user, index) != index:
                crossing.add(node)
    return crossing


def _top_forward(
    lowered: codegen.Lowered,
    info: Sequence[SegmentInfo],
    segment_of: Mapping[torch.fx.Node, int],
    output: torch.fx.Node,
) -> str:
    nodes = {n.name: n for n in lowered.graph.nodes}
    placeholders = [n for n in lowered.graph.nodes if n.op == "placeholder"]
    signature, bindings = codegen.signature_source(
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
            codegen.SegmentCall(
                index=seg.index,
                planned_device=seg.planned_device,
                moves=tuple(moves),
                args=tuple(args),
                outputs=seg.outputs,
            )
        )
    name_of = {n: n.name for n in lowered.graph.nodes}
    result = codegen.literal_source(output.args[0], name_of)
    if lowered.out_spec is not None:
        flat = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
        result = f"_unflatten({codegen.literal_source(list(flat), name_of)}, self._out_spec)"
    return codegen.forward_source(
        signature=signature, bindings=bindings, calls=calls, result=result
    )


def _fresh(name: str, used: set[str]) -> str:
    candidate, suffix = name, 1
    while candidate in used:
        candidate, suffix = f"{name}_{suffix}", suffix + 1
    used.add(candidate)
    return candidate


def _remap(device: str, device_map: Mapping[str, str] | None) -> str:
    """The first ``device_map`` pattern (fnmatch glob, in mapping order) that matches wins."""
    for pattern, target in (device_map or {}).items():
        if fnmatch.fnmatchcase(device, pattern):
            try:
                return str(torch.device(target))
            except RuntimeError as error:
                raise EmitError(f"device_map[{pattern!r}] = {target!r} is not a device") from error
    return device


def _check_device(device: str, *, planned: str) -> None:
    kind = torch.device(device).type
    hint = f'pass device_map={{"{kind}:*": "cpu"}} to place those segments on the CPU'
    where = f"device {device!r}" + (f" (planned {planned!r})" if planned != device else "")
    if kind in ("cpu", "meta"):
        return
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (torch.device(device).index or 0) >= count:
            raise EmitError(
                f"{where} does not exist here: this machine has {count} CUDA device(s); {hint}"
            )
        return
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        raise EmitError(f"{where} is not usable here ({error}); {hint}") from error


# ---------------------------------------------------------------------------------------------
# save_model / load_model


def save_model(model: PartitionedModel, directory: str | Path) -> None:
    """Write ``model.py`` (generated source), ``weights.safetensors`` and ``meta.json``."""
    if not isinstance(model, PartitionedModel):
        raise EmitError(f"save_model needs a PartitionedModel from emit_model, not {type(model)}")
    classes: list[str] = []
    extra: dict[str, Any] = {}
    for seg in model.segment_info:
        doc = (
            f"Segment {seg.index}: {len(seg.nodes)} op(s) planned on {seg.planned_device}, "
            f"from {seg.nodes[0]!r} to {seg.nodes[-1]!r}."
        )
        found, needed = codegen.class_source(
            getattr(model, f"seg{seg.index}"), class_name=f"Segment{seg.index}", doc=doc
        )
        classes += found
        codegen.merge_globals(extra, needed)
    source = codegen.model_source(
        classes=classes,
        extra_globals=extra,
        planned_devices=model.planned_devices,
        forward=model.forward_source,
    )
    compile(source, "model.py", "exec")  # a SyntaxError here is an autoplace bug, not the user's

    in_spec, in_modules, why = _dump_spec(model._in_spec)
    if model._in_spec is not None and in_spec is None:
        raise EmitError(f"cannot save the model's input structure: {why}")
    out_spec, out_modules, _ = _dump_spec(model._out_spec)
    if model._out_spec is None:
        structure = "code"  # symbolic_trace: the structure is written out in forward
    else:
        structure = "pytree" if out_spec is not None else "flat"
    meta = {
        "format": _FORMAT,
        "class_name": codegen.MODEL_CLASS_NAME,
        "segments": [seg.to_dict() for seg in model.segment_info],
        "in_spec": in_spec,
        "out_spec": out_spec if structure == "pytree" else None,
        "output_structure": structure,
        "pytree_modules": sorted(set(in_modules) | set(out_modules if out_spec else [])),
    }
    weights = _weights(model)
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / "model.py").write_text(source)
        safetensors.torch.save_file(
            weights, str(path / "weights.safetensors"), metadata={"format": "pt"}
        )
        (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    except OSError as error:
        raise OutputError(f"cannot write the emitted model to {path}: {error}") from error


def _weights(model: PartitionedModel) -> dict[str, torch.Tensor]:
    """Every segment's tensors under ``seg<i>.<name>``; safetensors refuses tensors that share
    memory, so a tensor whose storage was already taken is cloned."""
    weights: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for seg in model.segment_info:
        module = getattr(model, f"seg{seg.index}")
        for name, tensor in module.state_dict(keep_vars=True).items():
            if tensor.is_meta:
                raise EmitError(
                    f"seg{seg.index}.{name} lives on the meta device (device_map sent it there); "
                    "emit onto real devices to save"
                )
            data = tensor.detach().to("cpu").contiguous()
            if data.untyped_storage().data_ptr() in storages:
                data = data.clone()
            storages.add(data.untyped_storage().data_ptr())
            weights[f"seg{seg.index}.{name}"] = data
    return weights


def _dump_spec(spec: pytree.TreeSpec | None) -> tuple[str | None, list[str], str]:
    """``(json, modules that must be imported to read it, why it is None)``."""
    if spec is None:
        return None, [], "no spec"
    try:
        text = pytree.treespec_dumps(spec)
    except Exception as error:  # unregistered custom types raise several kinds
        return None, [], f"{type(error).__name__}: {error}"
    types = getattr(pytree, "SERIALIZED_TYPE_TO_PYTHON_TYPE", {})
    modules: set[str] = set()
    pending = [json.loads(text)[1]]
    while pending:
        node = pending.pop()
        name = node.get("type")
        if name:
            kind = types.get(name)
            module = kind.__module__ if kind is not None else name.rpartition(".")[0]
            if module not in ("builtins", "collections"):
                modules.add(module)
        pending += node.get("children_spec") or []
    outside = sorted(m for m in modules if not m.startswith(_SPEC_MODULE_PREFIXES))
    if outside:
        return None, [], f"its types come from {outside}, which load_model will not import"
    return text, sorted(modules), ""


def load_model(
    directory: str | Path, *, device_map: Mapping[str, str] | None = None
) -> torch.nn.Module:
    """Rebuild a model written by ``save_model``, each segment on its ``device_map``-remapped
    device. Executes the generated ``model.py`` and nothing else; weights come from safetensors.
    """
    path = Path(directory)
    meta = _read_meta(path)
    planned = [str(seg["device"]) for seg in meta["segments"]]
    actual = [_remap(device, device_map) for device in planned]
    for device, plan in zip(actual, planned):
        _check_device(device, planned=plan)
    for module in meta.get("pytree_modules", []):
        if not module.startswith(_SPEC_MODULE_PREFIXES):
            raise EmitError(f"meta.json asks to import {module!r}, which is not allow-listed")
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise EmitError(
                f"the saved output structure needs {module!r}, which cannot be imported here "
                f"({error}); install it"
            ) from error
    try:
        in_spec = pytree.treespec_loads(meta["in_spec"]) if meta.get("in_spec") else None
        out_spec = pytree.treespec_loads(meta["out_spec"]) if meta.get("out_spec") else None
    except Exception as error:  # json, pytree and registry errors alike mean a bad meta.json
        raise EmitError(f"{path / 'meta.json'} holds an unreadable pytree spec: {error}") from error

    spec = importlib.util.spec_from_file_location(
        f"autoplace_generated_{uuid.uuid4().hex}", path / "model.py"
    )
    if spec is None or spec.loader is None:
        raise EmitError(f"cannot import {path / 'model.py'}")
    generated = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(generated)
        model = getattr(generated, meta["class_name"])(actual, in_spec=in_spec, out_spec=out_spec)
    except Exception as error:
        raise EmitError(f"{path / 'model.py'} failed to build the model: {error}") from error

    try:
        weights = safetensors.torch.load_file(str(path / "weights.safetensors"))
    except Exception as error:  # safetensors raises its own SafetensorError, OSError, ...
        raise EmitError(f"cannot read {path / 'weights.safetensors'}: {error}") from error
    for index, device in enumerate(actual):
        prefix = f"seg{index}."
        state = {k[len(prefix) :]: v.to(device) for k, v in weights.items() if k.startswith(prefix)}
        try:
            getattr(model, f"seg{index}").load_state_dict(state, strict=True, assign=True)
        except (RuntimeError, AttributeError) as error:
            raise EmitError(
                f"weights.safetensors does not match model.py for seg{index}: {error}"
            ) from error
    model.segments = [(d, list(seg["nodes"])) for d, seg in zip(planned, meta["segments"])]
    model.planned_devices = planned
    model.devices = actual
    return model


def _read_meta(path: Path) -> dict[str, Any]:
    names = ("model.py", "weights.safetensors", "meta.json")
    missing = [name for name in names if not (path / name).is_file()]
    if missing:
        raise EmitError(
            f"{path} is not a model written by save_model: missing {', '.join(missing)}"
        )
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise EmitError(f"{path / 'meta.json'} is unreadable or corrupt: {error}") from error
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise EmitError(f"{path / 'meta.json'} is not in the {_FORMAT} format")
    if not isinstance(meta.get("segments"), list) or not meta["segments"]:
        raise EmitError(f"{path / 'meta.json'} lists no segments")
    return meta


# ---------------------------------------------------------------------------------------------
# verify


def verify(
    original: torch.nn.Module,
    emitted: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> VerifyResult:
    """Run both models without gradients and compare their outputs on the CPU.

    ``rtol``/``atol`` go to ``torch.testing.assert_close`` (give both or neither). An emitted
    model saved with flat outputs is compared leaf by leaf.
    """
    if (rtol is None) != (atol is None):
        raise ValueError("pass both rtol and atol, or neither (as torch.testing.assert_close)")
    with torch.no_grad():
        expected = _to_cpu(original(*args, **kwargs))
        actual = _to_cpu(emitted(*args, **kwargs))
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    how = "outputs"
    if expected_spec != actual_spec:
        if not isinstance(actual, tuple) or len(actual_leaves) != len(expected_leaves):
            raise VerificationError(
                f"the emitted model returns a different structure: expected {expected_spec}, "
                f"got {actual_spec}"
            )
        expected, actual, how = expected_leaves, actual_leaves, "flattened outputs"
    diff = _max_abs_diff(expected_leaves, actual_leaves)
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    except AssertionError as error:
        found = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise VerificationError(
            f"the emitted model's {how} differ from the original's (max abs diff {diff:.3g}): "
            f"{found}. If the model is random at inference (sampling, added noise), its outputs "
            "cannot match: pass --no-verify (verify=False); otherwise this is an autoplace bug, "
            "please report it with the model"
        ) from error
    tensors = sum(isinstance(leaf, torch.Tensor) for leaf in expected_leaves)
    tolerance = "default tolerances" if rtol is None else f"rtol={rtol}, atol={atol}"
    detail = f"{tensors} tensor output(s) match with {tolerance}; max abs diff {diff:.3g}"
    return VerifyResult(status="passed", max_abs_diff=diff, detail=detail)


def _to_cpu(value: Any) -> Any:
    return pytree.tree_map(
        lambda x: x.detach().to("cpu") if isinstance(x, torch.Tensor) else x, value
    )


def _max_abs_diff(expected: list[Any], actual: list[Any]) -> float:
    largest = 0.0
    for a, b in zip(expected, actual):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        if a.shape != b.shape or a.numel() == 0:
            continue
        if a.is_complex() or b.is_complex():
            delta = (a.to(torch.complex128) - b.to(torch.complex128)).abs()
        else:
            delta = (a.to(torch.float64) - b.to(torch.float64)).abs()
        largest = max(largest, float(delta.max()))
    return largest
