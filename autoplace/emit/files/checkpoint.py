"""Emit: weights that stay in the user's checkpoint instead of a second copy beside the model.

A checkpoint is a safetensors file, or a directory as ``save_pretrained`` writes it (one
``model.safetensors``, or shards listed by ``model.safetensors.index.json``). Only headers are
read to plan: ``open_checkpoint`` lists every tensor's file, shape and dtype; ``match`` pairs
each of the model's tensors (every name of a tied one) with its checkpoint key and names the
missing and mis-shaped ones before anything is traced or written; buffers the checkpoint lacks
(rotary ``inv_freq``) are taken as the model computed them. ``fill_model`` loads the checkpoint
into the user's model so that the emitted model can be verified against it. ``references`` is
what ``meta.json`` records, ``check_unchanged`` compares a checkpoint with it at load time, and
``read_segment`` loads one segment's tensors straight onto its device.

``load_checkpoint`` is what ``autoplace.plan`` calls. Read ``Checkpoint``, ``open_checkpoint``,
``match``, ``fill_model``, ``load_checkpoint``, then ``references``, ``check_unchanged`` and
``read_segment``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from autoplace.errors import EmitError, ModelLoadError
from cost_models.units import format_bytes

__all__ = [
    "INDEX_NAME",
    "Checkpoint",
    "Referred",
    "Entry",
    "check_unchanged",
    "fill_model",
    "fits_in_memory",
    "load_checkpoint",
    "match",
    "model_bytes",
    "open_checkpoint",
    "read_segment",
    "references",
    "safetensors_device",
    "sha256_of",
]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_SHOWN = 5  # missing or mis-shaped tensors named in an error, before "and N more"
# Materialise a meta model for verification only below this share of the available memory: the
# original and its outputs, the emitted model's activations and the allocator's slack need room.
_FIT_SHARE = 0.6

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class Entry:
    """One checkpoint tensor: the file holding it (relative to ``Checkpoint.root``), its shape
    and its dtype (torch's name, ``float32``)."""

    file: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Referred:
    """What an emitted model planned with a checkpoint refers to (its ``checkpoint``
    attribute, which ``save_model`` reads): the checkpoint, the key of each tensor name, and
    the values of the buffers it lacks where the model is on the meta device (``extras``,
    kept before the model went there)."""

    checkpoint: Checkpoint
    keys: Mapping[str, str]
    extras: Mapping[str, torch.Tensor]

    def under(self, prefix: str) -> Referred:
        """The same, the names under ``prefix`` (``train.LossModel`` holds the model as
        ``model``)."""
        return Referred(self.checkpoint, {prefix + k: v for k, v in self.keys.items()},
                        {prefix + k: v for k, v in self.extras.items()})


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's tensors by key, read from the safetensors headers only. ``path`` is what
    the user named (a file or a directory), ``root`` the directory its files are in."""

    path: Path
    root: Path
    entries: Mapping[str, Entry]
    index: str | None  # the index file's name, for a sharded directory

    @property
    def files(self) -> list[str]:
        return sorted({e.file for e in self.entries.values()})

    def fingerprint(self) -> dict[str, Any]:
        """What ``check_unchanged`` compares: each file's size and modification time, and the
        index's SHA-256."""
        files = {name: _stat(self.root / name) for name in self.files}
        index = sha256_of(self.root / self.index) if self.index else None
        return {"files": files, "index_sha256": index}


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The tensors of the checkpoint at ``path`` (a ``.safetensors`` file, or a directory with
    ``model.safetensors.index.json`` or ``model.safetensors``), from the headers alone."""
    given = Path(path).expanduser().resolve()
    if given.is_dir():
        if (given / INDEX_NAME).is_file():
            return _sharded(given)
        if (given / SINGLE_NAME).is_file():
            return Checkpoint(given, given, _entries(given, [SINGLE_NAME]), None)
        raise ModelLoadError(
            f"checkpoint directory {given} has neither {INDEX_NAME} nor {SINGLE_NAME}: pass a "
            "directory written by save_pretrained(..., safe_serialization=True) or a "
            ".safetensors file")
    if not given.is_file():
        raise ModelLoadError(f"checkpoint {given} does not exist: pass a .safetensors file or a "
                             "directory written by save_pretrained")
    return Checkpoint(given, given.parent, _entries(given.parent, [given.name]), None)


def _sharded(root: Path) -> Checkpoint:
    try:
        index = json.loads((root / INDEX_NAME).read_text())
        weight_map = dict(index["weight_map"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
            ValueError) as error:
        raise ModelLoadError(f"{root / INDEX_NAME} is not a safetensors index (a JSON object "
                             f"with a weight_map): {error}") from error
    entries = _entries(root, sorted(set(weight_map.values())))
    listed = sorted(k for k, f in weight_map.items() if entries.get(k, Entry(f, (), "")).file
                    != f)
    if listed:
        raise ModelLoadError(f"{root / INDEX_NAME} lists {_names(listed)} in files that do not "
                             "hold them: the checkpoint is incomplete or its shards were mixed up")
    return Checkpoint(root, root, {k: entries[k] for k in weight_map}, INDEX_NAME)


def _entries(root: Path, files: list[str]) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for name in files:
        try:
            with safe_open(str(root / name), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    part = f.get_slice(key)
                    entries[key] = Entry(name, tuple(part.get_shape()),
                                         _dtype_name(_DTYPES.get(part.get_dtype())))
        except Exception as error:  # SafetensorError, OSError: unreadable all the same
            raise ModelLoadError(f"cannot read checkpoint file {root / name}: {error}") from error
    return entries


def _dtype_name(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.") if dtype is not None else "unknown"


def _names(keys: list[str]) -> str:
    """The first few of ``keys`` and how many more."""
    shown = ", ".join(keys[:_SHOWN])
    return f"{len(keys)} tensor(s): {shown}" + (f" and {len(keys) - _SHOWN} more"
                                                 if len(keys) > _SHOWN else "")


def _tensors(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, bool]]:
    """Every name of every parameter and buffer (tied ones under each of their names), with
    whether it is a parameter."""
    found: dict[str, tuple[torch.Tensor, bool]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        found[name] = (p, True)
    for name, b in model.named_buffers(remove_duplicate=False):
        found[name] = (b, False)
    return found


def match(model: torch.nn.Module, checkpoint: Checkpoint) -> dict[str, str]:
    """The checkpoint key of each of ``model``'s tensor names (every name of a tied tensor maps
    to the one key it was saved under). Raises ``ModelLoadError`` naming the tensors the
    checkpoint lacks or holds with another shape, or of a dtype that is not a cast away
    (floating to floating), and the checkpoint. A buffer the checkpoint lacks is left out: the
    model's own value is used, unless it is on the meta device (then it is missing)."""
    tensors = _tensors(model)
    groups: dict[int, list[str]] = {}
    for name, (tensor, _) in tensors.items():
        groups.setdefault(id(tensor), []).append(name)
    keys: dict[str, str] = {}
    missing: list[str] = []
    unbuilt: list[str] = []
    wrong: list[str] = []
    for names in groups.values():
        tensor, is_param = tensors[names[0]]
        key = next((n for n in names if n in checkpoint.entries), None)
        if key is None:
            if is_param:
                missing.append(" = ".join(names))
            elif tensor.is_meta:
                unbuilt.append(" = ".join(names))
            continue
        entry = checkpoint.entries[key]
        expected = _dtype_name(tensor.dtype)
        castable = tensor.is_floating_point() and entry.dtype in (
            "float64", "float32", "float16", "bfloat16")
        if entry.shape != tuple(tensor.shape) or (entry.dtype != expected and not castable):
            wrong.append(f"{key} ({_shape(entry.shape)} {entry.dtype} in {entry.file}, the "
                         f"model's is {_shape(tuple(tensor.shape))} {expected})")
            continue
        keys.update(dict.fromkeys(names, key))
    problems = []
    if missing:
        problems.append(f"lacks {_names(missing)}")
    if wrong:
        problems.append(f"holds with the wrong shape or dtype {_names(wrong)}")
    if unbuilt:
        problems.append(f"lacks the buffers {_names(unbuilt)}, which the model built on the "
                        "meta device, so nothing holds their values: build the model under "
                        "accelerate's init_empty_weights() (buffers stay real) rather than "
                        "torch.device('meta')")
    if problems:
        raise ModelLoadError(
            f"checkpoint {checkpoint.path} does not match the model: it "
            f"{'; it '.join(problems)}. Pass the checkpoint saved from this model's "
            "architecture and config (save_pretrained), or build the model the checkpoint "
            "came from")
    return keys


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def model_bytes(model: torch.nn.Module) -> int:
    seen: dict[int, int] = {}
    for tensor, _ in _tensors(model).values():
        seen[id(tensor)] = tensor.numel() * tensor.element_size()
    return sum(seen.values())


def fits_in_memory(model: torch.nn.Module) -> tuple[bool, int, int | None]:
    """Whether ``model``'s weights fit in this machine's available memory with room to verify:
    ``(fits, bytes, available bytes or None where unknown)``."""
    needed = model_bytes(model)
    try:
        text = Path("/proc/meminfo").read_text()
        line = next(x for x in text.splitlines() if x.startswith("MemAvailable:"))
        available = int(line.split()[1]) * 1024
    except (OSError, StopIteration, ValueError, IndexError):
        return True, needed, None  # not Linux: trust the user, as planning a real model does
    return needed <= _FIT_SHARE * available, needed, available


def fill_model(model: torch.nn.Module, checkpoint: Checkpoint, keys: Mapping[str, str]) -> None:
    """Load the checkpoint into ``model`` in place, file by file: each matched tensor gets the
    checkpoint's values (cast to its dtype), a meta one a fresh CPU tensor first; tied tensors
    stay tied. Buffers not in ``keys`` keep the model's values."""
    tensors = _tensors(model)
    owners = {name: model.get_submodule(name.rpartition(".")[0]) for name in tensors}
    replaced: dict[int, torch.Tensor] = {}
    by_file: dict[str, list[str]] = {}
    for name, key in keys.items():
        by_file.setdefault(checkpoint.entries[key].file, []).append(name)
    with torch.no_grad():
        for file, names in sorted(by_file.items()):
            with safe_open(str(checkpoint.root / file), framework="pt") as f:
                for name in names:
                    tensor, is_param = tensors[name]
                    if id(tensor) in replaced:
                        new = replaced[id(tensor)]
                    elif tensor.is_meta:
                        value = f.get_tensor(keys[name]).to(tensor.dtype)
                        new = torch.nn.Parameter(value, requires_grad=tensor.requires_grad) \
                            if is_param else value
                        replaced[id(tensor)] = new
                    else:
                        tensor.copy_(f.get_tensor(keys[name]))
                        continue
                    leaf = name.rpartition(".")[2]
                    table = owners[name]._parameters if is_param else owners[name]._buffers
                    table[leaf] = new


def references(referred: Referred, segments: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """``meta.json``'s ``checkpoint`` object: the checkpoint's path and fingerprint, and for
    each segment tensor (``seg<i>.<name>``, in ``segments``) whose name the checkpoint holds,
    its key, file, and the dtype the segment holds it in."""
    checkpoint, keys = referred.checkpoint, referred.keys
    tensors = {}
    for full, tensor in segments.items():
        name = full.partition(".")[2]
        if name in keys:
            entry = checkpoint.entries[keys[name]]
            tensors[full] = {"key": keys[name], "file": entry.file, "shape": list(entry.shape),
                             "dtype": _dtype_name(tensor.dtype)}
    return {"path": str(checkpoint.root), "fingerprint": checkpoint.fingerprint(),
            "tensors": tensors}


def check_unchanged(record: Mapping[str, Any], *, where: Path) -> None:
    """Raise ``EmitError`` if the checkpoint ``record`` (``references``) names has gone or
    changed since planning: a file's size or modification time, or the index's content."""
    root = Path(record["path"])
    recorded = record["fingerprint"]
    changed = []
    for name, stat in recorded["files"].items():
        try:
            now = _stat(root / name)
        except OSError:
            changed.append(f"{name} (missing)")
            continue
        if now != stat:
            changed.append(f"{name} (size or modification time)")
    if recorded.get("index_sha256") and (
            not (root / INDEX_NAME).is_file() or sha256_of(root / INDEX_NAME)
            != recorded["index_sha256"]):
        changed.append(INDEX_NAME)
    if changed:
        raise EmitError(
            f"the checkpoint {root} that {where / 'meta.json'} refers to changed since it was "
            f"planned: {', '.join(changed)}. Plan the model again with --checkpoint {root}")


def read_segment(record: Mapping[str, Any], prefix: str, device: str) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of the segment whose keys in ``record["tensors"]`` start with
    ``prefix`` (``seg0.``), read straight onto ``device`` (``safe_open(..., device=...)``), one
    file at a time, under their names without the prefix."""
    root = Path(record["path"])
    by_file: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for full, ref in record["tensors"].items():
        if full.startswith(prefix):
            by_file.setdefault(ref["file"], []).append((full[len(prefix):], ref))
    state: dict[str, torch.Tensor] = {}
    for file, refs in sorted(by_file.items()):
        try:
            with safe_open(str(root / file), framework="pt",
                           device=safetensors_device(device)) as f:
                for name, ref in refs:
                    tensor = f.get_tensor(ref["key"])
                    if list(tensor.shape) != list(ref["shape"]):
                        raise EmitError(f"checkpoint tensor {ref['key']} in {root / file} has "
                                        f"shape {list(tensor.shape)}, planned {ref['shape']}: "
                                        "plan the model again")
                    state[name] = tensor.to(getattr(torch, ref["dtype"]))
        except EmitError:
            raise
        except Exception as error:  # SafetensorError (a key gone), OSError, ...
            raise EmitError(f"cannot read the checkpoint's {root / file}: {error}") from error
    return state


def safetensors_device(device: str) -> str:
    """``device`` as ``safe_open`` takes it: it refuses ``cpu:0`` (a CPU worker thread's
    device, ``2xcpu-thread``), which is the CPU all the same."""
    return "cpu" if torch.device(device).type == "cpu" else str(device)


def _stat(path: Path) -> dict[str, int]:
    info = path.stat()
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns}


def sha256_of(path: Path) -> str:
    """The file's SHA-256, read 1 MiB at a time (weights files are large)."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_checkpoint(model: torch.nn.Module, path: str | os.PathLike[str]
                    ) -> tuple[Referred, list[str]]:
    """Check ``model`` against the checkpoint at ``path`` (``match``) and load it into the
    model (``fill_model``) where that fits in memory: a model with real tensors always (they
    are overwritten in place), a meta one only below ``_FIT_SHARE`` of the available memory
    (else all of it goes to meta, its real buffers kept aside for ``save_model``, and it is
    emitted on meta but not verified). Returns what the emitted model refers to and the
    plan's notes."""
    checkpoint = open_checkpoint(path)
    if getattr(model, "_tied_weights_keys", None) and callable(getattr(model, "tie_weights",
                                                                            None)):
        # A transformers model: from_pretrained ties its weights after building it, since
        # building under accelerate's init_empty_weights unties them; so must we.
        model.tie_weights()
    keys = match(model, checkpoint)
    on_meta = any(t.is_meta for t, _ in _tensors(model).values())
    where = f"{len(checkpoint.files)} file(s) in {checkpoint.root}"
    # Only a model on meta needs room to be filled here (reading /proc/meminfo, sizing it).
    fits, needed, available = fits_in_memory(model) if on_meta else (True, 0, None)
    if not fits:
        extras = {name: t.detach().clone() for name, (t, _) in _tensors(model).items()
                  if name not in keys and not t.is_meta}
        model.to("meta")  # its real buffers too: tracing wants one device
        return Referred(checkpoint, keys, extras), [
            f"checkpoint {where} matches the model, but its {format_bytes(needed)} are more "
            f"than {_FIT_SHARE:.0%} of the {format_bytes(available or 0)} available here: "
            "the model stays on the meta device: it is not verified, and its emitted model "
            "(inference only) reads the weights from the checkpoint when loaded"]
    fill_model(model, checkpoint, keys)
    return Referred(checkpoint, keys, {}), [
        f"weights loaded from the checkpoint ({len(set(keys.values()))} tensors, {where}); "
        "the emitted model reads them from there instead of keeping a copy"]
