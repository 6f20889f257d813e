"""Emit: save an emitted model to a directory and load it back, without pickle.

``save_model`` writes ``model.py`` (source from ``codegen.source``; imports torch, the standard
library and ``_runtime.py``, a copy of ``runtime/engine.py``, written beside it),
``weights.safetensors`` (every segment's tensors under ``seg<i>.<name>``; with a checkpoint,
only those it does not hold), ``meta.json`` (planned devices, node names, pytree specs, the
weights' SHA-256, with a checkpoint ``checkpoint.references``: the key and file each segment
tensor is read from) and, when the model carries its example inputs (``example_inputs``, set by
``emit_and_verify``), ``inputs.safetensors`` (each tensor input under its ``input_names`` name,
``args.0``, ``kwargs.input_ids``). ``load_model`` checks ``meta.json`` and the weights' hash,
imports only allow-listed modules for the pytree specs, executes ``model.py`` and ``_runtime.py``
(``_import_generated``), and loads each segment's tensors one segment at a time onto its
``device_map``-remapped device (``load_segments``); ``load_inputs`` reads the example inputs
back. Read ``save_model``, ``_weights``, ``_inputs``, ``_dump_spec``, then ``load_model``,
``load_segments``, ``_read_meta`` and ``load_inputs``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import uuid
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import safetensors.torch
import torch
from safetensors import safe_open
from torch.utils import _pytree as pytree

from autoplace.emit.codegen.model import PartitionedModel, SegmentInfo
from autoplace.emit.codegen.source import (
    MODEL_CLASS_NAME,
    RUNTIME_FILE,
    RUNTIME_MODULE,
    class_source,
    engine_source,
    merge_globals,
    model_source,
)
from autoplace.emit.device_map import check_device, remap
from autoplace.emit.files.checkpoint import (
    check_unchanged,
    read_segment,
    references,
    safetensors_device,
    sha256_of,
)
from autoplace.errors import AutoplaceError, EmitError, OutputError

__all__ = ["input_names", "load_inputs", "load_model", "load_segments", "planned_devices",
           "read_inputs_file", "save_model"]

_SPEC_MODULE_PREFIXES = ("transformers.", "torch.")
_FORMAT = "autoplace.emit/1"



def save_model(model: PartitionedModel, directory: str | Path, *, weights: bool = True) -> None:
    """Write ``model.py`` (generated source), the engine it imports (``RUNTIME_FILE``),
    ``weights.safetensors`` and ``meta.json``. A model planned with a checkpoint (its
    ``checkpoint`` attribute: the ``Checkpoint`` and the key of each tensor name, set by
    ``autoplace.plan``) refers to it for the tensors it holds instead of writing them again.
    Without ``weights`` none are written (a generation plan's decode pass holds its model's:
    ``emit.generate``); load it with ``segments=()``."""
    if not isinstance(model, PartitionedModel):
        raise EmitError(f"save_model needs a PartitionedModel from emit_model, not {type(model)}")
    classes: list[str] = []
    extra: dict[str, Any] = {}
    for seg in model.segment_info:
        doc = (
            f"Segment {seg.index}: {len(seg.nodes)} op(s) planned on {seg.planned_device}, "
            f"from {seg.nodes[0]!r} to {seg.nodes[-1]!r}."
        )
        found, needed = class_source(
            getattr(model, f"seg{seg.index}"), class_name=f"Segment{seg.index}", doc=doc
        )
        classes += found
        merge_globals(extra, needed)
    source = model_source(
        classes=classes,
        extra_globals=extra,
        planned_devices=model.planned_devices,
        forward=model.forward_source,
        threaded=model.threaded_source,
        runtime=model.runtime,
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
        "class_name": MODEL_CLASS_NAME,
        "segments": [seg.to_dict() for seg in model.segment_info],
        "input_names": list(model.input_names),
        "output_names": list(model.output_names),
        "runtime": model.runtime,
        "in_spec": in_spec,
        "out_spec": out_spec if structure == "pytree" else None,
        "output_structure": structure,
        "pytree_modules": sorted(set(in_modules) | set(out_modules if out_spec else [])),
    }
    states = {seg.index: getattr(model, f"seg{seg.index}").state_dict(keep_vars=True)
              for seg in model.segment_info}
    referred = getattr(model, "checkpoint", None)
    if referred is not None:
        meta["checkpoint"] = references(referred, {
            f"seg{index}.{name}": tensor for index, state in states.items()
            for name, tensor in state.items()})
    referenced = set(meta.get("checkpoint", {}).get("tensors", ()))
    if not weights:
        meta["weights"] = "none: the segments' tensors are another model's"
        referenced |= {f"seg{index}.{name}" for index, state in states.items() for name in state}
    tensors = _weights(states, referenced=referenced,
                       extras=referred.extras if referred is not None else {})
    inputs, meta["inputs"] = _inputs(getattr(model, "example_inputs", None))
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / "model.py").write_text(source)
        (path / RUNTIME_FILE).write_text(engine_source())
        safetensors.torch.save_file(
            tensors, str(path / "weights.safetensors"), metadata={"format": "pt"}
        )
        meta["weights_sha256"] = sha256_of(path / "weights.safetensors")
        if inputs is not None:
            safetensors.torch.save_file(
                inputs, str(path / "inputs.safetensors"), metadata={"format": "pt"}
            )
        (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    except OSError as error:
        raise OutputError(f"cannot write the emitted model to {path}: {error}") from error


def _weights(states: Mapping[int, Mapping[str, torch.Tensor]], *, referenced: set[str],
             extras: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every segment's tensors (``states``: its state dict by index) under ``seg<i>.<name>``,
    but those ``referenced`` in a
    checkpoint, a meta one from ``extras`` by name (``checkpoint.Referred``); safetensors
    refuses tensors that share memory, so a tensor whose storage was already taken is
    cloned."""
    weights: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for index, state in states.items():
        for name, tensor in state.items():
            if f"seg{index}.{name}" in referenced:
                continue
            if tensor.is_meta and name in extras:
                tensor = extras[name]
            if tensor.is_meta:
                raise EmitError(
                    f"seg{index}.{name} lives on the meta device (device_map sent it there); "
                    "emit onto real devices to save"
                )
            data = tensor.detach().to("cpu").contiguous()
            if data.untyped_storage().data_ptr() in storages:
                data = data.clone()
            storages.add(data.untyped_storage().data_ptr())
            weights[f"seg{index}.{name}"] = data
    return weights


def input_names(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[str]:
    """A name per leaf of ``(args, kwargs)``, in pytree order: ``args.0``, ``args.1.2``,
    ``kwargs.input_ids``; the keys of ``inputs.safetensors`` and of ``autoplace run --inputs``."""
    paths, _ = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))
    names = []
    for path, _leaf in paths:
        parts = [("args", "kwargs")[path[0].idx]]  # type: ignore[union-attr]
        for key in path[1:]:
            part = getattr(key, "idx", getattr(key, "key", getattr(key, "name", key)))
            parts.append(str(part))
        names.append(".".join(parts))
    return names


def _inputs(
    example: tuple[tuple[Any, ...], dict[str, Any]] | None,
) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any] | None]:
    """The example inputs as safetensors tensors and their ``meta.json`` entry (structure and
    non-tensor leaves), or ``(None, None)`` where they cannot be saved without pickle."""
    if example is None:
        return None, None
    args, kwargs = example
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    text, _, _ = _dump_spec(spec)
    if text is None:
        return None, None
    tensors: dict[str, torch.Tensor] = {}
    constants: dict[str, Any] = {}
    for name, leaf in zip(input_names(args, kwargs), leaves):
        if isinstance(leaf, torch.Tensor):
            tensors[name] = leaf.detach().to("cpu").contiguous().clone()
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            constants[name] = leaf
        else:
            return None, None  # not representable without pickle: `run` then needs --inputs
    return tensors, {"spec": text, "names": list(tensors), "constants": constants}


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
    directory: str | Path, *, device_map: Mapping[str, str] | None = None,
    segments: Iterable[int] | None = None, devices: Collection[str] | None = None,
) -> torch.nn.Module:
    """Rebuild a model written by ``save_model``, each segment on its ``device_map``-remapped
    device. Executes the generated ``model.py`` and the engine saved with it, nothing else;
    weights come from safetensors (``weights.safetensors`` and, for a model planned with a
    checkpoint, the checkpoint), read one segment at a time onto its device. With ``segments``
    (indices) only those segments' weights are read; the others stay on the meta device
    (``load_segments`` loads them later). ``devices``: the same by planned device, the segments
    of those devices (one rank of ``OUT/launch.py`` loads its own part).
    """
    path = Path(directory)
    meta = _read_meta(path)
    planned = [str(seg["device"]) for seg in meta["segments"]]
    actual = [remap(device, device_map) for device in planned]
    for device, plan in zip(actual, planned):
        check_device(device, planned=plan)
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

    try:
        generated = _import_generated(path)
        model = getattr(generated, meta["class_name"])(actual, in_spec=in_spec, out_spec=out_spec)
    except AutoplaceError:
        raise
    except Exception as error:
        raise EmitError(f"{path / 'model.py'} failed to build the model: {error}") from error

    _check_weights(path, meta)
    if devices is not None:
        wanted = set(devices)
        segments = [i for i, device in enumerate(planned) if device in wanted]
    load_segments(model, path, range(len(actual)) if segments is None else segments,
                  meta=meta)
    model.segments = [(d, list(seg["nodes"])) for d, seg in zip(planned, meta["segments"])]
    model.planned_devices = planned
    model.devices = actual
    model.segment_info = tuple(
        SegmentInfo(index=seg["index"], planned_device=seg["device"], device=device,
                    nodes=tuple(seg["nodes"]), inputs=tuple(seg["inputs"]),
                    outputs=tuple(seg["outputs"]), unit=seg.get("unit"))
        for seg, device in zip(meta["segments"], actual))
    model.input_names = tuple(meta.get("input_names", ()))
    model.output_names = tuple(meta.get("output_names", ()))
    return model


def _import_generated(path: Path) -> ModuleType:
    """Execute ``path/model.py`` as module ``model`` of a package of its own, the engine saved
    next to it (``RUNTIME_FILE``) as that package's ``_runtime``, which ``model.py`` imports; a
    fresh package name on every call, so models saved by different versions never share an
    engine. Only these two files run, and neither is left in ``sys.modules``."""
    package = f"autoplace_generated_{uuid.uuid4().hex}"
    parent = ModuleType(package)
    parent.__path__ = []  # its modules are the two registered here, nothing found on a path
    sys.modules[package] = parent
    try:
        if (path / RUNTIME_FILE).is_file():
            _execute(f"{package}.{RUNTIME_MODULE}", path / RUNTIME_FILE)
        return _execute(f"{package}.model", path / "model.py")
    except ModuleNotFoundError as error:
        if error.name != f"{package}.{RUNTIME_MODULE}":
            raise
        raise EmitError(f"{path} is not a model written by save_model: missing {RUNTIME_FILE}, "
                        "the runtime model.py imports") from error
    finally:
        for name in [name for name in sys.modules if name.partition(".")[0] == package]:
            del sys.modules[name]


def _execute(name: str, file: Path) -> ModuleType:
    """The module ``name`` made by executing ``file``, registered while it runs."""
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise EmitError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_segments(model: torch.nn.Module, directory: str | Path, segments: Iterable[int], *,
                  meta: Mapping[str, Any] | None = None) -> None:
    """Load the weights of ``segments`` (indices) of ``model`` (built by ``load_model``) from
    wherever ``save_model`` put them, ``weights.safetensors`` or the checkpoint, one segment at
    a time and straight onto the segment's device (``safe_open(..., device=...)``): no other
    segment's tensors are read, and the whole state is never built in host memory."""
    path = Path(directory)
    meta = _read_meta(path) if meta is None else meta
    record = meta.get("checkpoint")
    count = len(meta["segments"])
    for index in segments:
        if not 0 <= index < count:
            raise EmitError(f"{path} has segments 0 to {count - 1}, not {index}")
        seg = getattr(model, f"seg{index}")
        prefix, device = f"seg{index}.", str(seg.device)
        state: dict[str, torch.Tensor] = {}
        try:
            with safe_open(str(path / "weights.safetensors"), framework="pt",
                           device=safetensors_device(device)) as f:
                for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    if key.startswith(prefix):
                        state[key[len(prefix):]] = f.get_tensor(key)
        except Exception as error:  # safetensors raises its own SafetensorError, OSError, ...
            raise EmitError(f"cannot read {path / 'weights.safetensors'}: {error}") from error
        if record:
            state.update(read_segment(record, prefix, device))
        try:
            seg.load_state_dict(state, strict=True, assign=True)
        except (RuntimeError, AttributeError) as error:
            saved = "weights.safetensors and the checkpoint do" if record else (
                "weights.safetensors does")
            raise EmitError(f"{saved} not match model.py for seg{index}: {error}") from error
        del state


def _check_weights(path: Path, meta: Mapping[str, Any]) -> None:
    """The emitted model's own weights are as written (a file safetensors can parse may still
    hold changed bytes: only the hash can tell), and its checkpoint, if any, is unchanged."""
    try:
        with safe_open(str(path / "weights.safetensors"), framework="pt"):
            pass  # the header parses: a safetensors file, not some other format
    except Exception as error:  # safetensors raises its own SafetensorError, OSError, ...
        raise EmitError(f"cannot read {path / 'weights.safetensors'}: {error}") from error
    expected = meta.get("weights_sha256")
    if expected and sha256_of(path / "weights.safetensors") != expected:
        raise EmitError(
            f"{path / 'weights.safetensors'} is corrupted: its SHA-256 differs from the one "
            "meta.json recorded when it was written; plan the model again")
    if meta.get("checkpoint"):
        try:
            check_unchanged(meta["checkpoint"], where=path)
        except (KeyError, TypeError, AttributeError) as error:  # a hand-edited meta.json
            raise EmitError(f"{path / 'meta.json'} holds an unreadable checkpoint record: "
                            f"{error}") from error


def planned_devices(directory: str | Path) -> list[str]:
    """The planned device of each segment of the model ``save_model`` wrote, in segment order,
    read from ``meta.json`` without building the model."""
    return [str(seg["device"]) for seg in _read_meta(Path(directory))["segments"]]


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



def load_inputs(directory: str | Path) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The example inputs ``save_model`` wrote, as ``(args, kwargs)`` on the CPU, or ``None``
    when it wrote none."""
    path = Path(directory)
    entry = _read_meta(path).get("inputs")
    if not entry:
        return None
    try:
        tensors = safetensors.torch.load_file(str(path / "inputs.safetensors"))
    except Exception as error:  # a missing or damaged file: SafetensorError, OSError, ...
        raise EmitError(f"cannot read {path / 'inputs.safetensors'}: {error}") from error
    try:
        spec = pytree.treespec_loads(entry["spec"])
        names = list(entry["names"]) + list(entry["constants"])
        values = {**tensors, **entry["constants"]}
        example = spec.unflatten([values[name] for name in _in_order(spec, names)])
    except Exception as error:  # a hand-edited meta.json: KeyError, ValueError, ...
        raise EmitError(
            f"{path / 'meta.json'} and {path / 'inputs.safetensors'} do not describe the same "
            f"inputs ({type(error).__name__}: {error}); plan the model again") from error
    args, kwargs = example
    return tuple(args), dict(kwargs)


def _in_order(spec: pytree.TreeSpec, names: list[str]) -> list[str]:
    """The leaf names in the spec's order (``input_names`` of a structure like the saved one)."""
    placeholder = spec.unflatten(list(range(spec.num_leaves)))
    ordered = input_names(*placeholder)
    missing = sorted(set(ordered) - set(names))
    if missing:
        raise KeyError(f"no value for {', '.join(missing)}")
    return ordered


def read_inputs_file(
    path: str | os.PathLike[str],
    *,
    example: tuple[tuple[Any, ...], dict[str, Any]] | None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Read ``--inputs``: a safetensors file with one tensor per input of the example, named
    as ``input_names`` names them (``args.0``, ``kwargs.input_ids``), of the example's shapes
    and dtypes. Without a saved example, a file of ``args.0``, ``args.1``, ... only."""
    where = Path(path)
    try:
        tensors = safetensors.torch.load_file(str(where))
    except FileNotFoundError as error:
        raise AutoplaceError(f"inputs file {str(where)!r} does not exist") from error
    except Exception as error:  # SafetensorError, OSError, ... all mean an unreadable file
        raise AutoplaceError(f"cannot read the inputs file {str(where)!r} as safetensors: "
                             f"{error}") from error
    if example is None:
        count = len(tensors)
        expected = [f"args.{i}" for i in range(count)]
        if sorted(tensors) != sorted(expected):
            raise AutoplaceError(
                f"inputs file {str(where)!r} has tensors {sorted(tensors)}; with no saved "
                f"example to match, name positional inputs args.0 .. args.{count - 1}")
        return tuple(tensors[name] for name in expected), {}
    args, kwargs = example
    names = input_names(args, kwargs)
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    wanted = {n: leaf for n, leaf in zip(names, leaves) if isinstance(leaf, torch.Tensor)}
    missing = sorted(set(wanted) - set(tensors))
    extra = sorted(set(tensors) - set(wanted))
    if missing or extra:
        raise AutoplaceError(
            f"inputs file {str(where)!r} does not name the example's inputs: "
            + "; ".join(part for part in (
                f"missing {', '.join(missing)}" if missing else "",
                f"unexpected {', '.join(extra)}" if extra else "") if part)
            + f". Expected tensors: {', '.join(sorted(wanted))}")
    for name, leaf in wanted.items():
        given = tensors[name]
        if tuple(given.shape) != tuple(leaf.shape) or given.dtype != leaf.dtype:
            raise AutoplaceError(
                f"inputs file {str(where)!r}: tensor {name!r} is {_describe(given)}, but the "
                f"example the plan was made for has {_describe(leaf)}; the plan (costs, memory) "
                "holds for those shapes only: plan again with inputs of this shape")
    values = [tensors.get(n, leaf) for n, leaf in zip(names, leaves)]
    new_args, new_kwargs = pytree.tree_unflatten(values, spec)
    return tuple(new_args), dict(new_kwargs)


def _describe(tensor: torch.Tensor) -> str:
    return f"shape {list(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"
