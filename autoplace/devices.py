"""Which devices a plan is for: a ``--devices`` spec, a cluster file, or the GPUs found here.

Read ``resolve_cluster`` first: it picks one of the three sources and returns an
``autoplace.ir.Cluster`` with notes for the user. Then ``parse_device_spec`` (the spec grammar),
``load_cluster_file`` (the TOML format), ``detect_gpus`` and ``format_catalog``. Device figures
come from ``cost_models``; every ordered pair of devices gets a link from
``cost_models.default_link`` unless a cluster file overrides it.

A device spec is a comma-separated list of entries:

* ``2xA100-40GB`` -- a count and a catalog type (``autoplace devices`` lists the types; case and
  ``-``/``_`` do not matter). ``A100-40GB`` alone means one. GPUs are named ``cuda:0``,
  ``cuda:1``, ... in spec order; they need not exist on this machine (the plan is simulated).
* ``cpu`` -- the host CPU, named ``cpu`` (at most one).
* ``cuda:0`` -- a GPU on this machine, typed by ``detect_gpus``. Such entries cannot be mixed with
  catalog GPU types, since both would claim the names ``cuda:N``.

A cluster file describes several hosts, or devices that need overrides::

    [[hosts]]
    name = "node0"
    devices = ["2xA100-40GB", "cpu"]     # the spec syntax above, catalog types only

    [[hosts]]
    name = "node1"
    devices = ["A100-40GB"]

    [[devices]]                          # optional: one device with overrides
    host = "node1"                       # a [[hosts]] name; omit it when there are no [[hosts]]
    type = "A100-80GB"
    torch_device = "cuda:1"              # optional: default is the host's next free cuda:N
    memory_bytes = 75_000_000_000        # optional: default is the catalog's

    [[links]]                            # optional: override the default link of a pair
    src = "node0/cuda:0"
    dst = "node1/cuda:0"
    kind = "network"                     # optional: a link kind to start from (and its label)
    bandwidth_bytes_per_s = 25e9         # optional
    latency_s = 5e-6                     # optional
    symmetric = true                     # the default: dst -> src gets the same figures

With one host, devices are named as in a spec (``cuda:0``, ``cpu``); with several,
``host/cuda:0`` (``torch_device`` stays ``cuda:0``). Devices on different hosts default to a
``network`` link. Two GPUs of one NVLink-capable type on one host are assumed to share an NVLink
board (as in HGX/DGX systems), GPUs found here too: override the links of PCIe-only machines.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoplace.errors import DeviceSpecError
from autoplace.ir import Cluster, Device, Link
from cost_models import (
    DEVICE_CATALOG,
    LINK_CATALOG,
    DeviceType,
    UnknownDeviceTypeError,
    catalog_names,
    catalog_table,
    default_link,
    get_device_type,
    link_kind_names,
    match_gpu_name,
)

__all__ = [
    "DEFAULT_SIMULATED_SPEC",
    "DetectedGPU",
    "detect_gpus",
    "format_catalog",
    "load_cluster_file",
    "parse_device_spec",
    "resolve_cluster",
]

DEFAULT_SIMULATED_SPEC = "2xA100-40GB"
LOCAL_HOST = "localhost"

_CHOOSE_HINT = (
    "choose devices with --devices (e.g. '4xH100-80GB' or '2xT4-16GB,cpu') or --cluster FILE; "
    "`autoplace devices` lists the device types"
)


@dataclass(frozen=True, kw_only=True)
class DetectedGPU:
    """A GPU found on this machine. ``index`` is its ``cuda:N`` number as torch counts it;
    ``catalog_type`` is the matching catalog name, or None when the catalog has no such GPU."""

    index: int
    name: str
    memory_bytes: int
    catalog_type: str | None


# --- Detection -----------------------------------------------------------------------------------


def detect_gpus() -> list[DetectedGPU]:
    """The GPUs on this machine, numbered as torch numbers them; [] without a driver or GPU.

    NVML (``pynvml``) is asked first because it does not create a CUDA context; torch is asked
    when pynvml is missing, fails, or might number the GPUs differently from CUDA.
    """
    found = _detect_with_nvml()
    return found if found is not None else _detect_with_torch()


def _detect_with_nvml() -> list[DetectedGPU] | None:
    """None when NVML cannot answer for CUDA's numbering, so torch should be asked instead."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception:  # not installed, or no driver
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):  # pynvml before 11.5 returns bytes
                name = name.decode()
            memory_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpus.append((name, memory_bytes))
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    # NVML numbers GPUs by PCI bus; CUDA (and so torch's cuda:N) applies CUDA_VISIBLE_DEVICES and,
    # unless CUDA_DEVICE_ORDER=PCI_BUS_ID, puts the fastest first. Only follow NVML when the two
    # numberings provably agree.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    order = list(range(len(gpus)))
    if visible is not None:
        items = [item.strip() for item in visible.split(",") if item.strip()]
        if not all(item.isdigit() and int(item) < len(gpus) for item in items):
            return None  # UUIDs, MIG names or bad indices: let CUDA resolve them
        order = [int(item) for item in items]
    names = {gpus[i][0] for i in order}
    if len(names) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return None
    return [
        DetectedGPU(
            index=cuda_index,
            name=gpus[nvml_index][0],
            memory_bytes=gpus[nvml_index][1],
            catalog_type=match_gpu_name(gpus[nvml_index][0]),
        )
        for cuda_index, nvml_index in enumerate(order)
    ]


def _detect_with_torch() -> list[DetectedGPU]:
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        return [
            DetectedGPU(
                index=i,
                name=p.name,
                memory_bytes=int(p.total_memory),
                catalog_type=match_gpu_name(p.name),
            )
            for i, p in enumerate(props)
        ]
    except Exception:
        # A broken driver or a CUDA build without a GPU: planning for simulated devices still works.
        return []


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


# --- Specs ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Entry:
    """One device before it is named: its type, memory, and its torch device if already fixed."""

    type: DeviceType
    memory_bytes: int
    torch_device: str | None = None
    origin: str = ""  # the spec token or table it came from, for error messages
    from_table: bool = False  # a cluster file's [[devices]] entry


_COUNTED = re.compile(r"(\d+)\s*[xX*]\s*(.*)")
_CUDA = re.compile(r"cuda:(\d+)", re.IGNORECASE)


def _valid_types_hint() -> str:
    return f"valid device types: {', '.join(catalog_names())}"


def _lookup_type(type_name: str, *, token: str, where: str) -> DeviceType:
    try:
        return get_device_type(type_name)
    except UnknownDeviceTypeError:
        hint = ""
        if type_name[:1] in ("x", "X", "*"):
            hint = " (a count goes before the 'x', e.g. '2xA100-40GB')"
        context = "" if type_name == token else f" in {token!r}"
        raise DeviceSpecError(
            f"{where}: unknown device type {type_name!r}{context}{hint}; {_valid_types_hint()}"
        ) from None


def _parse_tokens(
    spec: str,
    *,
    where: str,
    detected: Callable[[], list[DetectedGPU]] | None,
    notes: list[str],
) -> list[_Entry]:
    """The entries of a spec, in order. ``detected`` is None where ``cuda:N`` is not allowed."""
    if not spec.strip():
        raise DeviceSpecError(f"{where}: the device spec is empty; {_CHOOSE_HINT}")
    entries: list[_Entry] = []
    typed_token = explicit_token = None
    gpus: list[DetectedGPU] | None = None
    for raw in spec.split(","):
        token = raw.strip()
        if not token:
            raise DeviceSpecError(f"{where}: empty entry in device spec {spec!r} (a stray comma?)")
        cuda = _CUDA.fullmatch(token)
        if cuda is not None:
            if detected is None:
                raise DeviceSpecError(
                    f"{where}: {token!r} names a GPU of this machine, which a cluster file cannot; "
                    f"name a catalog type instead, e.g. '2xA100-40GB'; {_valid_types_hint()}"
                )
            gpus = detected() if gpus is None else gpus
            entries.append(_explicit_entry(int(cuda.group(1)), gpus, where=where, notes=notes))
            explicit_token = explicit_token or token
            continue
        count, type_name = 1, token
        counted = _COUNTED.fullmatch(token)
        if counted is not None:
            count, type_name = int(counted.group(1)), counted.group(2).strip()
            if not type_name:
                raise DeviceSpecError(
                    f"{where}: {token!r} has a count but no device type, e.g. '2xA100-40GB'; "
                    f"{_valid_types_hint()}"
                )
            if count < 1:
                raise DeviceSpecError(
                    f"{where}: {token!r} asks for 0 devices: use 1 or more; {_valid_types_hint()}"
                )
        device_type = _lookup_type(type_name, token=token, where=where)
        cpu = device_type.kind == "cpu"
        if cpu and count > 1:
            raise DeviceSpecError(f"{where}: {token!r}: a host has one CPU device, 'cpu'")
        typed_token = typed_token or (None if cpu else token)
        entries.extend(
            _Entry(
                type=device_type,
                memory_bytes=device_type.memory_bytes,
                torch_device="cpu" if cpu else None,
                origin=token,
            )
            for _ in range(count)
        )
    if typed_token is not None and explicit_token is not None:
        raise DeviceSpecError(
            f"{where}: {spec!r} mixes GPUs of this machine ({explicit_token!r}) with catalog GPU "
            f"types ({typed_token!r}); both would be named cuda:N. Use one or the other "
            "('cpu' may join either)"
        )
    return entries


def _explicit_entry(index: int, gpus: list[DetectedGPU], *, where: str, notes: list[str]) -> _Entry:
    gpu = next((g for g in gpus if g.index == index), None)
    if gpu is None:
        found = ", ".join(f"cuda:{g.index} ({g.name})" for g in gpus) or "no GPU"
        raise DeviceSpecError(
            f"{where}: device 'cuda:{index}' is not present on this machine (found: {found}). "
            f"To plan for GPUs you do not have, name a catalog type instead, e.g. "
            f"'{DEFAULT_SIMULATED_SPEC}'; {_valid_types_hint()}"
        )
    device_type, note = _type_for_detected(gpu)
    if note is not None:
        notes.append(note)
    return _Entry(
        type=device_type,
        memory_bytes=gpu.memory_bytes,
        torch_device=f"cuda:{index}",
        origin=f"cuda:{index}",
    )


def _assign_torch_devices(entries: Sequence[_Entry], *, where: str) -> list[str]:
    """Each entry's torch device. A spec's GPUs are ``cuda:0..N-1`` in order, as documented; then
    fixed ones claim theirs (a clash is an error, not a silent renumbering); the rest of a
    cluster file's ``[[devices]]`` take the lowest free numbers."""
    assigned: list[str | None] = [e.torch_device for e in entries]
    spec_gpus = [i for i, e in enumerate(entries) if e.torch_device is None and not e.from_table]
    for n, i in enumerate(spec_gpus):
        assigned[i] = f"cuda:{n}"
    owner = {assigned[i]: entries[i].origin for i in spec_gpus}
    for entry in entries:
        if entry.torch_device is not None:
            if entry.torch_device in owner:
                raise DeviceSpecError(
                    f"{where}: {entry.torch_device} is defined twice "
                    f"({owner[entry.torch_device]} and {entry.origin})"
                )
            owner[entry.torch_device] = entry.origin
    free = (f"cuda:{n}" for n in range(len(entries) + len(owner) + 1))
    for i, name in enumerate(assigned):
        if name is None:
            assigned[i] = next(d for d in free if d not in owner)
    return [name for name in assigned if name is not None]


def _build_cluster(hosts: Sequence[tuple[str, Sequence[_Entry]]], *, where: str) -> Cluster:
    several = len(hosts) > 1
    placed: list[tuple[Device, DeviceType]] = []
    for host, entries in hosts:
        torch_devices = _assign_torch_devices(entries, where=where)
        for torch_device, e in zip(torch_devices, entries, strict=True):
            name = f"{host}/{torch_device}" if several else torch_device
            device = Device(
                name=name,
                type=e.type.name,
                memory_bytes=e.memory_bytes,
                host=host,
                torch_device=torch_device,
            )
            placed.append((device, e.type))
    links = []
    for src, src_type in placed:
        for dst, dst_type in placed:
            if src.name != dst.name:
                spec = default_link(src_type, dst_type, same_host=src.host == dst.host)
                links.append(
                    Link(
                        src=src.name,
                        dst=dst.name,
                        bandwidth_bytes_per_s=spec.bandwidth_bytes_per_s,
                        latency_s=spec.latency_s,
                        kind=spec.kind,
                    )
                )
    return Cluster(devices=tuple(d for d, _ in placed), links=tuple(links))


def _parse_spec(spec: str) -> tuple[Cluster, list[str]]:
    notes: list[str] = []
    entries = _parse_tokens(spec, where="device spec", detected=detect_gpus, notes=notes)
    return _build_cluster([(LOCAL_HOST, entries)], where="device spec"), notes


def parse_device_spec(spec: str) -> Cluster:
    """The cluster a spec like ``2xA100-40GB,cpu`` or ``cuda:0,cuda:1`` describes (one host)."""
    return _parse_spec(spec)[0]


# --- Cluster files -------------------------------------------------------------------------------


_TOP_KEYS = ("hosts", "devices", "links")
_HOST_KEYS = ("name", "devices")
_DEVICE_KEYS = ("host", "type", "torch_device", "memory_bytes")
_LINK_KEYS = ("src", "dst", "kind", "bandwidth_bytes_per_s", "latency_s", "symmetric")


def _tables(data: Mapping[str, Any], key: str, *, where: str) -> list[Mapping[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise DeviceSpecError(f"{where}: '{key}' must be an array of tables, written [[{key}]]")
    return value


def _check_keys(
    table: Mapping[str, Any], *, allowed: Sequence[str], required: Sequence[str], where: str
) -> None:
    for key in table:
        if key not in allowed:
            raise DeviceSpecError(
                f"{where}: unknown key {key!r}; allowed keys: {', '.join(allowed)}"
            )
    for key in required:
        if key not in table:
            raise DeviceSpecError(f"{where}: missing required key {key!r}")


def _string(table: Mapping[str, Any], key: str, *, where: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise DeviceSpecError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value.strip()


def _number(table: Mapping[str, Any], key: str, *, where: str, positive: bool) -> float:
    value = table[key]
    # TOML booleans are Python bools, which are ints: a number must not be one.
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise DeviceSpecError(f"{where}: {key} must be a number {bound}, got {value!r}")
    return float(value)


def load_cluster_file(path: str | os.PathLike[str]) -> Cluster:
    """The cluster a TOML file describes (the format is in this module's docstring)."""
    # Imported here: tomllib is stdlib from Python 3.11, and only cluster files need it.
    import tomllib

    where = f"cluster file {os.fspath(path)}"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise DeviceSpecError(f"{where}: no such file") from None
    except OSError as exc:
        raise DeviceSpecError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise DeviceSpecError(f"{where}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise DeviceSpecError(f"{where}: not UTF-8 text ({exc.reason})") from None
    _check_keys(data, allowed=_TOP_KEYS, required=(), where=where)

    hosts: dict[str, list[_Entry]] = {}
    for i, table in enumerate(_tables(data, "hosts", where=where)):
        at = f"{where}: hosts[{i}]"
        _check_keys(table, allowed=_HOST_KEYS, required=("name",), where=at)
        name = _string(table, "name", where=at)
        if "/" in name or name in hosts:
            problem = "contains '/'" if "/" in name else "is used twice"
            raise DeviceSpecError(f"{at}: host name {name!r} {problem}")
        specs = table.get("devices", [])
        if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
            raise DeviceSpecError(f"{at}: devices must be a list of spec strings, got {specs!r}")
        hosts[name] = []
        for spec in specs:
            hosts[name] += _parse_tokens(spec, where=f"{at}.devices", detected=None, notes=[])

    if not hosts:
        hosts[LOCAL_HOST] = []  # [[devices]] alone describe one machine
    for i, table in enumerate(_tables(data, "devices", where=where)):
        host, entry = _device_entry(table, hosts=list(hosts), where=where, index=i)
        hosts[host].append(entry)

    if not any(hosts.values()):
        raise DeviceSpecError(f"{where}: defines no devices; add [[hosts]] with devices")
    cluster = _build_cluster(list(hosts.items()), where=where)
    overrides = _link_overrides(
        _tables(data, "links", where=where), cluster=cluster, hosts=list(hosts), where=where
    )
    if not overrides:
        return cluster
    return Cluster(
        devices=cluster.devices,
        links=tuple(overrides.get((link.src, link.dst), link) for link in cluster.links),
    )


def _device_entry(
    table: Mapping[str, Any], *, hosts: list[str], where: str, index: int
) -> tuple[str, _Entry]:
    at = f"{where}: devices[{index}]"
    _check_keys(table, allowed=_DEVICE_KEYS, required=("type",), where=at)
    if "host" in table:
        host = _string(table, "host", where=at)
        if host not in hosts:
            raise DeviceSpecError(f"{at}: host {host!r} is not one of the [[hosts]]: {hosts}")
    elif len(hosts) == 1:
        host = hosts[0]
    else:
        raise DeviceSpecError(f"{at}: say which host it is on with host = one of {hosts}")
    type_name = _string(table, "type", where=at)
    device_type = _lookup_type(type_name, token=type_name, where=at)
    memory_bytes = device_type.memory_bytes
    if "memory_bytes" in table:
        memory = _number(table, "memory_bytes", where=at, positive=True)
        if not memory.is_integer():
            raise DeviceSpecError(f"{at}: memory_bytes must be a whole number, got {memory}")
        memory_bytes = int(memory)
    torch_device = "cpu" if device_type.kind == "cpu" else None
    if "torch_device" in table:
        given = _string(table, "torch_device", where=at)
        fits = given == "cpu" if device_type.kind == "cpu" else _CUDA.fullmatch(given) is not None
        if not fits:
            expected = "cpu" if device_type.kind == "cpu" else "cuda:N"
            raise DeviceSpecError(
                f"{at}: torch_device {given!r} does not fit a {device_type.kind} "
                f"({device_type.name}): use {expected!r}"
            )
        torch_device = given.lower()
    entry = _Entry(
        type=device_type,
        memory_bytes=memory_bytes,
        torch_device=torch_device,
        origin=f"devices[{index}]",
        from_table=True,
    )
    return host, entry


def _link_overrides(
    tables: list[Mapping[str, Any]], *, cluster: Cluster, hosts: list[str], where: str
) -> dict[tuple[str, str], Link]:
    def device_name(value: str, *, at: str) -> str:
        if value in cluster.names:
            return value
        # With one host, devices are named without it; accept "host/cuda:0" all the same.
        host, _, local = value.rpartition("/")
        if len(hosts) == 1 and host == hosts[0] and local in cluster.names:
            return local
        raise DeviceSpecError(
            f"{at}: unknown device {value!r}; devices: {', '.join(cluster.names)}"
        )

    overrides: dict[tuple[str, str], Link] = {}
    first_at: dict[tuple[str, str], str] = {}
    for i, table in enumerate(tables):
        at = f"{where}: links[{i}]"
        _check_keys(table, allowed=_LINK_KEYS, required=("src", "dst"), where=at)
        src = device_name(_string(table, "src", where=at), at=at)
        dst = device_name(_string(table, "dst", where=at), at=at)
        if src == dst:
            raise DeviceSpecError(f"{at}: src and dst are the same device {src!r}")
        if not {"kind", "bandwidth_bytes_per_s", "latency_s"} & table.keys():
            raise DeviceSpecError(
                f"{at}: overrides nothing; give kind, bandwidth_bytes_per_s or latency_s"
            )
        base = cluster.link(src, dst)
        bandwidth, latency, kind = base.bandwidth_bytes_per_s, base.latency_s, "custom"
        if "kind" in table:
            kind = _string(table, "kind", where=at)
            if kind not in LINK_CATALOG:
                raise DeviceSpecError(
                    f"{at}: unknown link kind {kind!r}; valid kinds: {', '.join(link_kind_names())}"
                )
            bandwidth = LINK_CATALOG[kind].bandwidth_bytes_per_s
            latency = LINK_CATALOG[kind].latency_s
        if "bandwidth_bytes_per_s" in table:
            bandwidth = _number(table, "bandwidth_bytes_per_s", where=at, positive=True)
        if "latency_s" in table:
            latency = _number(table, "latency_s", where=at, positive=False)
        symmetric = table.get("symmetric", True)
        if not isinstance(symmetric, bool):
            raise DeviceSpecError(f"{at}: symmetric must be true or false, got {symmetric!r}")
        for a, b in [(src, dst), (dst, src)] if symmetric else [(src, dst)]:
            if (a, b) in overrides:
                raise DeviceSpecError(
                    f"{at}: the link {a} -> {b} is already overridden by {first_at[(a, b)]}"
                )
            overrides[(a, b)] = Link(
                src=a, dst=b, bandwidth_bytes_per_s=bandwidth, latency_s=latency, kind=kind
            )
            first_at[(a, b)] = f"links[{i}]"
    return overrides


# --- Choosing and listing ------------------------------------------------------------------------


def resolve_cluster(*, spec: str | None, cluster_file: str | None) -> tuple[Cluster, list[str]]:
    """The devices to plan for, and notes telling the user where they came from.

    A spec or a cluster file (not both) wins; with neither, the GPUs found here; with none found,
    the simulated ``DEFAULT_SIMULATED_SPEC``.
    """
    if spec is not None and cluster_file is not None:
        raise DeviceSpecError(
            f"got both a device spec ({spec!r}) and a cluster file ({cluster_file}); give one"
        )
    if spec is not None:
        return _parse_spec(spec)
    if cluster_file is not None:
        return load_cluster_file(cluster_file), []
    gpus = detect_gpus()
    if not gpus:
        cluster = parse_device_spec(DEFAULT_SIMULATED_SPEC)
        return cluster, [
            f"no GPU found: planning for the simulated devices {DEFAULT_SIMULATED_SPEC} "
            f"({', '.join(cluster.names)}); {_CHOOSE_HINT}"
        ]
    notes: list[str] = []
    entries = [_explicit_entry(g.index, gpus, where="GPUs found", notes=notes) for g in gpus]
    cluster = _build_cluster([(LOCAL_HOST, entries)], where="GPUs found")
    found = ", ".join(
        f"cuda:{g.index} {g.name} ({entry.type.name})"
        for g, entry in zip(gpus, entries, strict=True)
    )
    plural = "GPU" if len(gpus) == 1 else f"{len(gpus)} GPUs"
    return cluster, [f"using the {plural} found: {found}", *notes]


def format_catalog(detected: list[DetectedGPU]) -> str:
    """A plain-text table of the device catalog and the GPUs found, for ``autoplace devices``."""
    lines = ["Device types:", catalog_table(indent="  "), ""]
    if not detected:
        lines.append(f"GPUs found: no GPU found (plans default to {DEFAULT_SIMULATED_SPEC}).")
    else:
        lines.append("GPUs found:")
        for gpu in detected:
            matched = gpu.catalog_type or "not in the catalog"
            lines.append(
                f"  cuda:{gpu.index}  {gpu.name}  {gpu.memory_bytes / 2**30:.1f} GiB  -> {matched}"
            )
    return "\n".join(lines) + "\n"
