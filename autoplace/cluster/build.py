"""Entries into a ``Cluster``: name every device, then give every ordered pair a default link.

With one host, devices are named by their torch device (``cuda:0``, ``cpu``); with several,
``host/cuda:0`` (``torch_device`` stays ``cuda:0``). Links come from
``cost_models.default_link``: devices on different hosts talk over the ``network``; two GPUs of
one NVLink-capable type on one host are assumed to share an NVLink board (as in HGX/DGX systems),
GPUs found here too, so a cluster file overrides the links of PCIe-only machines.

Read ``build_cluster``; ``_assign_torch_devices`` says how ``cuda:N`` numbers are handed out.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoplace.cluster.spec import WORKER_TYPES, Entry
from autoplace.errors import DeviceSpecError
from autoplace.ir import Cluster, Device, Link
from cost_models import DeviceType, default_link

__all__ = ["LOCAL_HOST", "build_cluster"]

LOCAL_HOST = "localhost"


def build_cluster(hosts: Sequence[tuple[str, Sequence[Entry]]], *, where: str) -> Cluster:
    """The cluster of ``(host name, entries)`` pairs, named and linked as the module says."""
    several = len(hosts) > 1
    placed: list[tuple[Device, DeviceType]] = []
    for host, entries in hosts:
        torch_devices = _assign_torch_devices(entries, where=where)
        for torch_device, e in zip(torch_devices, entries, strict=True):
            name = f"{host}/{torch_device}" if several else torch_device
            reserved = e.type.reserved_bytes if e.reserved_bytes is None else e.reserved_bytes
            if reserved >= e.memory_bytes:
                raise DeviceSpecError(
                    f"{where}: {e.origin} ({e.type.name}) has memory_bytes={e.memory_bytes}, not "
                    f"more than the {reserved} bytes its runtime reserves; give more memory, or "
                    "set reserve_bytes (0 to plan for tensors alone)"
                )
            device = Device(
                name=name,
                type=e.type.name,
                memory_bytes=e.memory_bytes,
                host=host,
                torch_device=torch_device,
                reserved_bytes=reserved,
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


def _assign_torch_devices(entries: Sequence[Entry], *, where: str) -> list[str]:
    """Each entry's torch device. A spec's GPUs are ``cuda:0..N-1`` in order, as documented; then
    fixed ones claim theirs (a clash is an error, not a silent renumbering); the rest of a
    cluster file's ``[[devices]]`` take the lowest free numbers."""
    assigned: list[str | None] = [e.torch_device for e in entries]
    threads = [i for i, e in enumerate(entries) if e.torch_device is None
               and e.type.name in WORKER_TYPES]
    for n, i in enumerate(threads):
        assigned[i] = f"cpu:{n}"
    spec_gpus = [i for i, e in enumerate(entries) if assigned[i] is None and not e.from_table]
    for n, i in enumerate(spec_gpus):
        assigned[i] = f"cuda:{n}"
    owner = {assigned[i]: entries[i].origin for i in [*threads, *spec_gpus]}
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
