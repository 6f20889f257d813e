"""The device spec grammar: ``2xA100-40GB,cuda:1,cpu`` into device entries, not yet named.

A device spec is a comma-separated list of entries:

* ``2xA100-40GB`` -- a count and a catalog type (``autoplace devices`` lists the types; case and
  ``-``/``_`` do not matter). ``A100-40GB`` alone means one. GPUs are named ``cuda:0``,
  ``cuda:1``, ... in spec order; they need not exist on this machine (the plan is simulated).
* ``cpu`` -- the host CPU, named ``cpu`` (at most one).
* ``2xcpu-thread`` -- worker threads of this machine's CPU, named ``cpu:0``, ``cpu:1``, ...;
  the emitted model runs each one's segments in its own thread (``emit/runtime.py``).
* ``cuda:0`` -- a GPU on this machine, typed by ``detect.detect_gpus``. Such entries cannot be
  mixed with catalog GPU types, since both would claim the names ``cuda:N``.

Read ``parse_tokens`` first (one spec into ``Entry`` values), then ``detected_entry`` (a GPU
found here, costed as its catalog type or, when the catalog lacks it, the closest one, with a
note). ``build.build_cluster`` names the entries and links them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autoplace.cluster.detect import DetectedGPU
from autoplace.errors import DeviceSpecError
from cost_models import (
    DEVICE_CATALOG,
    DeviceType,
    UnknownDeviceTypeError,
    catalog_names,
    get_device_type,
)

__all__ = [
    "CHOOSE_HINT",
    "CUDA_NAME",
    "DEFAULT_SIMULATED_SPEC",
    "THREAD_TYPE",
    "Entry",
    "detected_entry",
    "lookup_type",
    "parse_tokens",
    "valid_types_hint",
]

DEFAULT_SIMULATED_SPEC = "2xA100-40GB"

CHOOSE_HINT = (
    "choose devices with --devices (e.g. '4xH100-80GB' or '2xT4-16GB,cpu') or --cluster FILE; "
    "`autoplace devices` lists the device types"
)

# Worker threads of this machine's CPU: named ``cpu:0``, ``cpu:1``, ... (torch accepts and ignores
# the index), so each is its own device to the plan and to the emitted model's runtime.
THREAD_TYPE = "cpu-thread"

CUDA_NAME = re.compile(r"cuda:(\d+)", re.IGNORECASE)
_COUNTED = re.compile(r"(\d+)\s*[xX*]\s*(.*)")


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One device before it is named: its type, memory, and its torch device if already fixed."""

    type: DeviceType
    memory_bytes: int
    torch_device: str | None = None
    origin: str = ""  # the spec token or table it came from, for error messages
    from_table: bool = False  # a cluster file's [[devices]] entry
    reserved_bytes: int | None = None  # a cluster file's reserve_bytes; None: the type's default


def valid_types_hint() -> str:
    return f"valid device types: {', '.join(catalog_names())}"


def lookup_type(type_name: str, *, token: str, where: str) -> DeviceType:
    """The catalog type ``type_name``; an error naming ``token`` and the valid types if none."""
    try:
        return get_device_type(type_name)
    except UnknownDeviceTypeError:
        hint = ""
        if type_name[:1] in ("x", "X", "*"):
            hint = " (a count goes before the 'x', e.g. '2xA100-40GB')"
        context = "" if type_name == token else f" in {token!r}"
        raise DeviceSpecError(
            f"{where}: unknown device type {type_name!r}{context}{hint}; {valid_types_hint()}"
        ) from None


def parse_tokens(
    spec: str,
    *,
    where: str,
    detected: Callable[[], Sequence[DetectedGPU]] | None,
    notes: list[str],
) -> list[Entry]:
    """The entries of a spec, in order. ``detected`` is None where ``cuda:N`` is not allowed
    (a cluster file describes other machines); it is called once, at the first ``cuda:N``."""
    if not spec.strip():
        raise DeviceSpecError(f"{where}: the device spec is empty; {CHOOSE_HINT}")
    entries: list[Entry] = []
    typed_token = explicit_token = None
    gpus: Sequence[DetectedGPU] | None = None
    for raw in spec.split(","):
        token = raw.strip()
        if not token:
            raise DeviceSpecError(f"{where}: empty entry in device spec {spec!r} (a stray comma?)")
        cuda = CUDA_NAME.fullmatch(token)
        if cuda is not None:
            if detected is None:
                raise DeviceSpecError(
                    f"{where}: {token!r} names a GPU of this machine, which a cluster file cannot; "
                    f"name a catalog type instead, e.g. '2xA100-40GB'; {valid_types_hint()}"
                )
            gpus = detected() if gpus is None else gpus
            entries.append(detected_entry(int(cuda.group(1)), gpus, where=where, notes=notes))
            explicit_token = explicit_token or token
            continue
        typed = _typed_entries(token, where=where)
        if typed[0].type.kind != "cpu":
            typed_token = typed_token or token
        entries.extend(typed)
    if typed_token is not None and explicit_token is not None:
        raise DeviceSpecError(
            f"{where}: {spec!r} mixes GPUs of this machine ({explicit_token!r}) with catalog GPU "
            f"types ({typed_token!r}); both would be named cuda:N. Use one or the other "
            "('cpu' may join either)"
        )
    return entries


def _typed_entries(token: str, *, where: str) -> list[Entry]:
    """The entries of one ``[count x] type`` token."""
    count, type_name = 1, token
    counted = _COUNTED.fullmatch(token)
    if counted is not None:
        count, type_name = int(counted.group(1)), counted.group(2).strip()
        if not type_name:
            raise DeviceSpecError(
                f"{where}: {token!r} has a count but no device type, e.g. '2xA100-40GB'; "
                f"{valid_types_hint()}"
            )
        if count < 1:
            raise DeviceSpecError(
                f"{where}: {token!r} asks for 0 devices: use 1 or more; {valid_types_hint()}"
            )
    device_type = lookup_type(type_name, token=token, where=where)
    if device_type.name == THREAD_TYPE:  # torch devices cpu:0, cpu:1, ...: build numbers them
        return [Entry(type=device_type, memory_bytes=device_type.memory_bytes, origin=token)
                for _ in range(count)]
    cpu = device_type.kind == "cpu"
    if cpu and count > 1:
        raise DeviceSpecError(f"{where}: {token!r}: a host has one CPU device, 'cpu'")
    return [
        Entry(
            type=device_type,
            memory_bytes=device_type.memory_bytes,
            torch_device="cpu" if cpu else None,
            origin=token,
        )
        for _ in range(count)
    ]


def detected_entry(
    index: int, gpus: Sequence[DetectedGPU], *, where: str, notes: list[str]
) -> Entry:
    """The entry of ``cuda:index`` among the GPUs found here, with its real memory; a note when
    its type had to be guessed."""
    gpu = next((g for g in gpus if g.index == index), None)
    if gpu is None:
        found = ", ".join(f"cuda:{g.index} ({g.name})" for g in gpus) or "no GPU"
        raise DeviceSpecError(
            f"{where}: device 'cuda:{index}' is not present on this machine (found: {found}). "
            f"To plan for GPUs you do not have, name a catalog type instead, e.g. "
            f"'{DEFAULT_SIMULATED_SPEC}'; {valid_types_hint()}"
        )
    device_type, note = _type_for_detected(gpu)
    if note is not None:
        notes.append(note)
    return Entry(
        type=device_type,
        memory_bytes=gpu.memory_bytes,
        torch_device=f"cuda:{index}",
        origin=f"cuda:{index}",
    )


def _type_for_detected(gpu: DetectedGPU) -> tuple[DeviceType, str | None]:
    """The catalog type to cost a found GPU as, and a note when it had to be guessed."""
    if gpu.catalog_type is not None:
        return get_device_type(gpu.catalog_type), None
    gpus = [t for t in DEVICE_CATALOG.values() if t.kind == "gpu"]
    guess = min(gpus, key=lambda t: abs(t.memory_bytes - gpu.memory_bytes))
    return guess, (
        f"GPU cuda:{gpu.index} ({gpu.name}) is not in the device catalog; costing it as "
        f"{guess.name}, the catalog GPU closest in memory. To choose, pass --devices with a type"
    )
