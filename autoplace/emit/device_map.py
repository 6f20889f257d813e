"""Where planned devices run on this machine: the ``device_map`` that emit and load apply.

A plan names the devices it was made for (``cuda:1``); the emitted model may run elsewhere.
``local_device_map`` keeps each planned device that is present here and sends the rest to the
CPU (how the pipeline verifies a GPU plan on a laptop); ``remap`` applies a user's glob mapping
(``{"cuda:*": "cpu"}``, a command line's ``--device-map``: ``parse_device_map``); ``check_device``
fails, with the mapping to pass, when a device is absent. How a ``cpu-thread`` worker runs here
(one intra-op thread) is ``autoplace.cluster.local``'s, which the profiler shares.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence

import torch

from autoplace.errors import EmitError

__all__ = ["check_device", "local_device_map", "parse_device_map", "remap"]


def local_device_map(torch_devices: Sequence[str]) -> dict[str, str]:
    """Where each planned torch device lives on this machine: itself when present, else ``cpu``,
    so a plan made for GPUs runs (and is verified) on a machine without them."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mapping = {}
    for dev in torch_devices:
        parsed = torch.device(dev)
        present = parsed.type == "cpu" or (parsed.type == "cuda" and (parsed.index or 0) < count)
        mapping[dev] = dev if present else "cpu"
    return mapping


def remap(device: str, device_map: Mapping[str, str] | None) -> str:
    """The first ``device_map`` pattern (fnmatch glob, in mapping order) that matches wins."""
    for pattern, target in (device_map or {}).items():
        if fnmatch.fnmatchcase(device, pattern):
            try:
                return str(torch.device(target))
            except RuntimeError as error:
                raise EmitError(f"device_map[{pattern!r}] = {target!r} is not a device") from error
    return device


def parse_device_map(text: str) -> dict[str, str]:
    """``--device-map``'s JSON object (glob of planned torch devices -> device here, in the
    order given, as ``remap`` applies it), every target checked to be a torch device."""
    try:
        mapping = json.loads(text)
    except json.JSONDecodeError as error:
        raise EmitError(f"--device-map {text!r} is not JSON ({error}): give an object of "
                        'planned devices (globs) to devices here, e.g. \'{"cuda:*": "cpu"}\''
                        ) from None
    if not isinstance(mapping, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise EmitError(f"--device-map {text!r} must be a JSON object of strings, e.g. "
                        '\'{"cuda:*": "cpu"}\'')
    for pattern, target in mapping.items():
        try:
            torch.device(target)
        except RuntimeError:
            raise EmitError(f"--device-map: {pattern!r} -> {target!r}, which is not a device "
                            "(cpu, cuda:1, ...)") from None
    return mapping


def check_device(device: str, *, planned: str, option: str = "device_map=") -> None:
    """Fail unless ``device`` can hold tensors here; the message names the ``device_map`` that
    would place its segments on the CPU instead (as ``option`` takes it: ``--device-map`` on a
    command line)."""
    kind = torch.device(device).type
    value = f'{{"{kind}:*": "cpu"}}'
    hint = (f"pass {option}{value}" if option.endswith("=") else f"pass {option} '{value}'") \
        + " to place those segments on the CPU"
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
