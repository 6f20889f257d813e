"""The device spec grammar: ``2xA100-40GB,cuda:1,cpu`` into device entries, not yet named.

A spec is a comma-separated list of entries (spaces around one dropped), each one of: ``NxTYPE`` (a
count of 1 or more, ``x`` or ``X``, a catalog type; ``TYPE`` alone is one; GPUs named ``cuda:0``,
``cuda:1``, ... in spec order, simulated), ``cpu`` (the host CPU, at most one), ``Nxcpu-thread``
(worker threads of this CPU, ``cpu:0``, ...; ``emit/runtime/engine.py`` runs each one's segments
on its own thread; ``Nxcpu-process``: the same, as gloo ranks) or ``cuda:N`` (a GPU on this
machine, typed by ``detect.detect_gpus``; not mixed with catalog GPU types, which would claim
the same names). A type name is letters, digits, ``-`` and ``_``, case and ``-``/``_`` not
mattering. Any other form (``2*A100-40GB``, ``x2A100``, a space inside an entry) is an error
naming the entry, its position and what to write instead. Users: ``docs/cli.md`` ("Devices").

Read ``parse_tokens`` first (one spec into ``Entry`` values; ``_loose`` says what is wrong with an
entry that is not one of these), then ``detected_entry`` (a GPU found here, costed as its catalog
type or else the closest one, with a note); ``build.build_cluster`` names and links them.
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
    "WORKER_TYPES",
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
# the index), so each is its own device to the plan and to the emitted model's runtime. A
# ``cpu-process`` worker is one too, linked to the others by gloo (a rank of its own).
THREAD_TYPE = "cpu-thread"
WORKER_TYPES = frozenset({THREAD_TYPE, "cpu-process"})

CUDA_NAME = re.compile(r"cuda:(\d+)", re.IGNORECASE)
_COUNTED = re.compile(r"(\d+)[xX](.*)")
# The catalog's lookup ignores every separator; a spec allows only the ones its names use, so
# that '2*A100-40GB' or 'A100 40GB' is not read as something the user may not have meant.
_TYPE_NAME = re.compile(r"[A-Za-z0-9_-]+")
# What a count written some other way looks like: '2*T4', '2 x T4', '2T4'; and 'x2T4'.
_LOOSE_COUNTED = re.compile(r"(\d+)\s*([xX]|[^\w\s]|)\s*([A-Za-z].*)")
_COUNT_AFTER = re.compile(r"[xX*]\s*(\d+)\s*([A-Za-z].*)")
_EXAMPLE_TYPE = "A100-40GB"


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
    device_type = _catalog_type(type_name)
    if device_type is not None:
        return device_type
    context = "" if type_name == token else f" in {token!r}"
    if not _TYPE_NAME.fullmatch(type_name):
        fixed = _canonical(type_name) or _EXAMPLE_TYPE
        raise DeviceSpecError(
            f"{where}: {type_name!r}{context} is not a device type: a type name has only letters, "
            f"digits, '-' and '_', e.g. {fixed!r}; {valid_types_hint()}"
        )
    hint = ""
    if type_name[:1] in ("x", "X"):
        hint = f" (a count goes before the 'x', e.g. '2x{_EXAMPLE_TYPE}')"
    raise DeviceSpecError(
        f"{where}: unknown device type {type_name!r}{context}{hint}; {valid_types_hint()}"
    )


def _catalog_type(type_name: str) -> DeviceType | None:
    """The catalog type of a strictly written type name, or None."""
    if not _TYPE_NAME.fullmatch(type_name):
        return None
    try:
        return get_device_type(type_name)
    except UnknownDeviceTypeError:
        return None


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
    start = 0  # of the entry in spec
    for number, raw in enumerate(spec.split(","), start=1):
        token = raw.strip()
        first = start + len(raw) - len(raw.lstrip()) + 1  # counted from 1, as an editor does
        start += len(raw) + 1
        if not token:
            raise DeviceSpecError(
                f"{where}: empty entry {number} in device spec {spec!r} (a stray comma?)"
            )
        at = f"{where}: entry {number} of {spec!r} (characters {first}-{first + len(token) - 1})"
        cuda = CUDA_NAME.fullmatch(token)
        if cuda is not None:
            if detected is None:
                raise DeviceSpecError(
                    f"{at}: {token!r} names a GPU of this machine, which a cluster file cannot; "
                    f"name a catalog type instead, e.g. '2x{_EXAMPLE_TYPE}'; {valid_types_hint()}"
                )
            gpus = detected() if gpus is None else gpus
            entries.append(detected_entry(int(cuda.group(1)), gpus, where=at, notes=notes))
            explicit_token = explicit_token or token
            continue
        typed = _typed_entries(token, where=at)
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
        count, type_name = int(counted.group(1)), counted.group(2)
        if not type_name:
            raise DeviceSpecError(
                f"{where}: {token!r} has a count but no device type, e.g. '2x{_EXAMPLE_TYPE}'; "
                f"{valid_types_hint()}"
            )
        if count < 1:
            raise DeviceSpecError(
                f"{where}: {token!r} asks for 0 devices: use 1 or more; {valid_types_hint()}"
            )
    loose = _loose(token, counted=counted is not None)
    if loose is not None:
        raise DeviceSpecError(f"{where}: {loose}; {valid_types_hint()}")
    device_type = lookup_type(type_name, token=token, where=where)
    if device_type.name in WORKER_TYPES:  # torch devices cpu:0, cpu:1, ...: build numbers them
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


def _loose(token: str, *, counted: bool) -> str | None:
    """What is wrong with a token that is loosely what the grammar allows, and what to write
    instead; None for a token that is right, or wrong only in its type name."""
    loose = _LOOSE_COUNTED.fullmatch(token)
    if re.search(r"\s", token):
        if loose is not None:
            return f"{token!r} has a space in it: {_count_advice(loose[1], loose[3])}"
        compact = re.sub(r"\s+", "", token)
        fixed = compact if CUDA_NAME.fullmatch(compact) else _canonical(token) or _EXAMPLE_TYPE
        return f"{token!r} has a space in it: write it without spaces, e.g. {fixed!r}"
    if counted or _catalog_type(token) is not None:
        return None
    if loose is not None:
        sep = loose[2]
        problem = (f"joins the count and the type with {sep!r}, not 'x'" if sep
                   else "has no 'x' between the count and the type")
        return f"{token!r} {problem}: {_count_advice(loose[1], loose[3])}"
    after = _COUNT_AFTER.fullmatch(token)
    if after is not None:
        return f"{token!r} puts the count after the 'x': {_count_advice(after[1], after[2])}"
    return None


def _count_advice(count: str, type_text: str) -> str:
    """How to write a count of a type: with the user's own, where they are right."""
    fixed = _canonical(type_text) if int(count) > 0 else None
    example = f"{int(count)}x{fixed}" if fixed else f"2x{_EXAMPLE_TYPE}"
    return f"write a count, an 'x' and a type, e.g. {example!r}"


def _canonical(type_text: str) -> str | None:
    """The catalog name of a type written with spaces or other separators, or None."""
    found = _catalog_type(re.sub(r"[^A-Za-z0-9_]+", "-", type_text).strip("-"))
    return None if found is None else found.name


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
