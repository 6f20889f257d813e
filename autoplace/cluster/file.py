"""A cluster file into a ``Cluster``: hosts with device specs, ``[[devices]]`` with overrides,
``[[links]]`` that replace default links, and the shared links (``cluster.shared``: host NICs,
``[[shared]]``) whose bandwidth concurrent transfers share.

``autoplace.formats.cluster`` documents the format, reads the TOML and checks every field's type
and range against the schema; what is left here are the checks that need the device catalog or
the devices already defined: device types and link kinds exist, a ``torch_device`` fits its
device, host names are unique, a link names two distinct devices, once, and says its bandwidth
(its own, or its kind's from the link catalog, with a note).

Read ``load_cluster_file``, then ``_device_entry`` and ``_link_overrides``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from autoplace.cluster.build import LOCAL_HOST, build_cluster
from autoplace.cluster.shared import shared_links
from autoplace.cluster.spec import CUDA_NAME, WORKER_TYPES, Entry, lookup_type, parse_tokens
from autoplace.errors import DeviceSpecError
from autoplace.formats.cluster import read_cluster_file
from autoplace.ir import Cluster, Link
from cost_models import LINK_CATALOG, link_kind_names

__all__ = ["load_cluster_file"]

_LINK_FIGURES = ("kind", "bandwidth_bytes_per_s", "latency_s")


def load_cluster_file(
    path: str | os.PathLike[str], *, notes: list[str] | None = None
) -> Cluster:
    """The cluster the TOML file at ``path`` describes (``autoplace.formats.cluster``). What the
    user should be told (a link that took its kind's catalog figures) is added to ``notes``."""
    notes = [] if notes is None else notes
    where = f"cluster file {os.fspath(path)}"
    data = read_cluster_file(path)
    hosts: dict[str, list[Entry]] = {}
    for i, table in enumerate(data.get("hosts", ())):
        at = f"{where}: hosts[{i}]"
        name = table["name"].strip()
        if name in hosts:
            raise DeviceSpecError(f"{at}: host name {name!r} is used twice")
        hosts[name] = []
        for j, spec in enumerate(table.get("devices", ())):
            hosts[name] += parse_tokens(spec, where=f"{at}.devices[{j}]", detected=None,
                                        notes=notes)
        if "reserve_bytes" in table:
            hosts[name] = [replace(e, reserved_bytes=int(table["reserve_bytes"]))
                           for e in hosts[name]]

    if not hosts:
        hosts[LOCAL_HOST] = []  # [[devices]] alone describe one machine
    for i, table in enumerate(data.get("devices", ())):
        host, entry = _device_entry(table, hosts=list(hosts), where=where, index=i)
        hosts[host].append(entry)

    if not any(hosts.values()):
        raise DeviceSpecError(f"{where}: defines no devices; add [[hosts]] with devices")
    empty = [name for name, entries in hosts.items() if not entries]
    if empty:  # a host that holds nothing is a typo in a device's host, or a host left over
        raise DeviceSpecError(
            f"{where}: host(s) {', '.join(map(repr, empty))} have no devices: give each "
            "devices = [...] or a [[devices]] entry with its host, or remove it")
    cluster = build_cluster(list(hosts.items()), where=where)
    device_name = _device_resolver(cluster, list(hosts))
    overrides = _link_overrides(data.get("links", ()), cluster=cluster,
                                device_name=device_name, where=where, notes=notes)
    shared = shared_links(data, cluster=cluster, device_name=device_name, where=where)
    if not overrides and not shared:
        return cluster
    try:
        return Cluster(
            devices=cluster.devices,
            links=tuple(overrides.get((link.src, link.dst), link) for link in cluster.links),
            shared=shared,
        )
    except DeviceSpecError as error:  # what only the whole cluster shows: a name used twice
        nic = any(r.name.startswith("nic-") for r in shared) and "used twice" in str(error)
        hint = " (a host's NIC is named nic-in:HOST and nic-out:HOST)" if nic else ""
        raise DeviceSpecError(f"{where}: {error}{hint}") from error


def _device_entry(
    table: Mapping[str, Any], *, hosts: list[str], where: str, index: int
) -> tuple[str, Entry]:
    at = f"{where}: devices[{index}]"
    if "host" in table:
        host = table["host"].strip()
        if host not in hosts:
            raise DeviceSpecError(f"{at}: host {host!r} is not one of the [[hosts]]: {hosts}")
    elif len(hosts) == 1:
        host = hosts[0]
    else:
        raise DeviceSpecError(f"{at}: say which host it is on with host = one of {hosts}")
    type_name = table["type"].strip()
    device_type = lookup_type(type_name, token=type_name, where=at)
    torch_device = "cpu" if device_type.kind == "cpu" else None
    if "torch_device" in table:
        given = table["torch_device"].strip()
        cpu = device_type.kind == "cpu"
        # A cpu-thread worker may name its own cpu:N, so that workers on different hosts are
        # different torch devices (one process each: docs/multiprocess.md).
        thread = device_type.name in WORKER_TYPES and re.fullmatch(r"cpu:\d+", given)
        if not (given == "cpu" or thread if cpu else CUDA_NAME.fullmatch(given) is not None):
            expected = ("cpu or cpu:N" if device_type.name in WORKER_TYPES else "cpu") if cpu \
                else "cuda:N"
            raise DeviceSpecError(
                f"{at}: torch_device {given!r} does not fit a {device_type.kind} "
                f"({device_type.name}): use {expected!r}"
            )
        torch_device = given.lower()
    entry = Entry(
        type=device_type,
        # The schema lets a whole float through (75e9 is an integer to JSON Schema).
        memory_bytes=int(table.get("memory_bytes", device_type.memory_bytes)),
        torch_device=torch_device,
        origin=f"devices[{index}]",
        from_table=True,
        reserved_bytes=int(table["reserve_bytes"]) if "reserve_bytes" in table else None,
    )
    return host, entry


def _device_resolver(cluster: Cluster, hosts: list[str]) -> Callable[..., str]:
    """``device_name(value, at=...)``: the cluster's device that a ``[[links]]`` or
    ``[[shared]]`` entry names, or an error that lists the devices."""
    def device_name(value: str, *, at: str) -> str:
        value = value.strip()
        if value in cluster.names:
            return value
        # With one host, devices are named without it; accept "host/cuda:0" all the same.
        host, _, local = value.rpartition("/")
        if len(hosts) == 1 and host == hosts[0] and local in cluster.names:
            return local
        raise DeviceSpecError(
            f"{at}: unknown device {value!r}; devices: {', '.join(cluster.names)}"
        )
    return device_name


def _link_overrides(
    tables: Sequence[Mapping[str, Any]], *, cluster: Cluster, device_name: Callable[..., str],
    where: str, notes: list[str],
) -> dict[tuple[str, str], Link]:
    """The links the ``[[links]]`` tables give. A table gives its bandwidth, or a kind whose
    catalog figures it takes (one note per kind); a latency alone leaves the bandwidth unknown,
    which is an error rather than a silent guess."""
    overrides: dict[tuple[str, str], Link] = {}
    first_at: dict[tuple[str, str], str] = {}
    from_catalog: dict[tuple[str, bool], list[str]] = {}  # (kind, latency given) -> tables
    for i, table in enumerate(tables):
        at = f"{where}: links[{i}]"
        src = device_name(table["src"], at=at)
        dst = device_name(table["dst"], at=at)
        if src == dst:
            raise DeviceSpecError(f"{at}: src and dst are the same device {src!r}")
        label = f"links[{i}] ({src} - {dst})"
        base = cluster.link(src, dst)
        if "kind" not in table and "bandwidth_bytes_per_s" not in table:
            problem = ("gives no bandwidth_bytes_per_s and no kind, so its bandwidth is unknown"
                       if set(_LINK_FIGURES) & table.keys() else "overrides nothing")
            raise DeviceSpecError(
                f"{where}: {label} {problem}: add bandwidth_bytes_per_s, or a kind to take the "
                f"link catalog's figures (this pair's default is kind = {base.kind!r}, "
                f"{_gb_per_s(base.bandwidth_bytes_per_s)}); valid kinds: "
                f"{', '.join(link_kind_names())}"
            )
        bandwidth, latency, kind = base.bandwidth_bytes_per_s, base.latency_s, "custom"
        if "kind" in table:
            kind = table["kind"].strip()
            if kind not in LINK_CATALOG:
                raise DeviceSpecError(
                    f"{at}: unknown link kind {kind!r}; valid kinds: {', '.join(link_kind_names())}"
                )
            bandwidth = LINK_CATALOG[kind].bandwidth_bytes_per_s
            latency = LINK_CATALOG[kind].latency_s
            if "bandwidth_bytes_per_s" not in table:
                from_catalog.setdefault((kind, "latency_s" in table), []).append(label)
        bandwidth = float(table.get("bandwidth_bytes_per_s", bandwidth))
        latency = float(table.get("latency_s", latency))
        for a, b in [(src, dst), (dst, src)] if table.get("symmetric", True) else [(src, dst)]:
            if (a, b) in overrides:
                raise DeviceSpecError(
                    f"{at}: the link {a} -> {b} is already overridden by {first_at[(a, b)]}"
                )
            overrides[(a, b)] = Link(
                src=a, dst=b, bandwidth_bytes_per_s=bandwidth, latency_s=latency, kind=kind
            )
            first_at[(a, b)] = f"links[{i}]"
    for (kind, own_latency), labels in from_catalog.items():
        spec = LINK_CATALOG[kind]
        gives, takes = ("gives", "it takes") if len(labels) == 1 else ("give", "they take")
        figures = (
            f"bandwidth for kind {kind!r}, {_gb_per_s(spec.bandwidth_bytes_per_s)}, with its own "
            "latency_s; give bandwidth_bytes_per_s to use a measured figure" if own_latency else
            f"figures for kind {kind!r}, {_gb_per_s(spec.bandwidth_bytes_per_s)} and "
            f"{spec.latency_s * 1e6:.3g} us latency; give bandwidth_bytes_per_s (and latency_s) "
            "to use measured figures"
        )
        notes.append(f"{where}: {', '.join(labels)} {gives} no bandwidth_bytes_per_s: {takes} "
                     f"the link catalog's {figures}")
    return overrides


def _gb_per_s(bandwidth_bytes_per_s: float) -> str:
    return f"{bandwidth_bytes_per_s / 1e9:.3g} GB/s"
