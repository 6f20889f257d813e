"""A cluster file's shared links (``ir.SharedLink``): the resources that several device pairs'
transfers cross and share, so that concurrent transfers on them divide their bandwidth
(``simulate.contention``). Two ways to say so (``autoplace.formats.cluster`` has the format):

* ``nic_bandwidth_bytes_per_s`` on a ``[[hosts]]`` table: the host's NIC. Every transfer that
  leaves the host crosses ``nic-out:HOST`` and every one that enters it crosses ``nic-in:HOST``,
  each of that bandwidth (a NIC is full duplex). So a transfer between two hosts with NICs
  crosses both: the sender's way out and the receiver's way in;
* ``[[shared]]`` tables: a name, a bandwidth, and which transfers cross it: ``devices`` (or the
  devices of ``hosts``): every transfer between one of them and a device not listed, both ways
  (a PCIe switch's uplink, as the GPUs below one switch share it); ``pairs``: those device
  pairs, both ways unless ``symmetric = false`` (a link two pairs share).

Nothing is shared unless the file says so: a cluster from ``--devices`` or a file without these
keys has independent links, as before. Read ``shared_links``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autoplace.errors import DeviceSpecError
from autoplace.ir import Cluster, SharedLink

__all__ = ["shared_links"]


def shared_links(data: Mapping[str, Any], *, cluster: Cluster,
                 device_name: Callable[..., str], where: str) -> tuple[SharedLink, ...]:
    """The shared links the parsed file ``data`` names, over ``cluster``'s devices;
    ``device_name(value, at=...)`` resolves a device name as ``[[links]]`` does."""
    on_host: dict[str, list[str]] = {}
    for d in cluster.devices:
        on_host.setdefault(d.host, []).append(d.name)
    shared: list[SharedLink] = []
    for i, table in enumerate(data.get("hosts", ())):
        if "nic_bandwidth_bytes_per_s" not in table:
            continue
        host, at = table["name"].strip(), f"{where}: hosts[{i}]"
        inside = set(on_host[host])  # never empty: the loader refuses a host without devices
        outside = [d for d in cluster.names if d not in inside]
        if not outside:
            raise DeviceSpecError(f"{at}: nic_bandwidth_bytes_per_s, but no transfer leaves "
                                  f"host {host!r} (it is the only host); remove it")
        bandwidth = float(table["nic_bandwidth_bytes_per_s"])
        out = tuple((a, b) for a in cluster.names if a in inside for b in outside)
        shared.append(SharedLink(name=f"nic-out:{host}", bandwidth_bytes_per_s=bandwidth,
                                 pairs=out))
        shared.append(SharedLink(name=f"nic-in:{host}", bandwidth_bytes_per_s=bandwidth,
                                 pairs=tuple((b, a) for a, b in out)))
    for i, table in enumerate(data.get("shared", ())):
        at = f"{where}: shared[{i}]"
        pairs = _pairs(table, cluster=cluster, on_host=on_host, device_name=device_name, at=at)
        shared.append(SharedLink(name=table["name"].strip(),
                                 bandwidth_bytes_per_s=float(table["bandwidth_bytes_per_s"]),
                                 pairs=pairs))
    return tuple(shared)  # a name used twice: ir.Cluster refuses it


def _pairs(table: Mapping[str, Any], *, cluster: Cluster, on_host: Mapping[str, list[str]],
           device_name: Callable[..., str], at: str) -> tuple[tuple[str, str], ...]:
    """The directed device pairs whose transfers cross the ``[[shared]]`` table's resource."""
    if not {"devices", "hosts", "pairs"} & table.keys():
        raise DeviceSpecError(f"{at}: say which transfers cross it: devices, hosts or pairs")
    listed = [device_name(v, at=f"{at}.devices") for v in table.get("devices", ())]
    for host in table.get("hosts", ()):
        if host.strip() not in on_host:
            raise DeviceSpecError(f"{at}.hosts: unknown host {host!r}; hosts: "
                                  f"{', '.join(on_host)}")
        listed += on_host[host.strip()]
    pairs: list[tuple[str, str]] = []
    group = set(listed)
    pairs += [(a, b) for a in cluster.names for b in cluster.names
              if (a in group) != (b in group)]
    if group and not pairs:
        raise DeviceSpecError(f"{at}: lists every device, so no transfer goes between one of "
                              "them and another device: list fewer, or give pairs")
    for j, pair in enumerate(table.get("pairs", ())):
        a, b = (device_name(v, at=f"{at}.pairs[{j}]") for v in pair)
        if a == b:
            raise DeviceSpecError(f"{at}.pairs[{j}]: both ends are {a!r}; a pair needs two "
                                  "devices")
        pairs += [(a, b), (b, a)] if table.get("symmetric", True) else [(a, b)]
    return tuple(dict.fromkeys(pairs))

