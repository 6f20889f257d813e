"""Which device each rank of ``OUT/launch.py`` runs on, for plans over one host or several.

``launch_devices`` maps the plan's devices to ranks: rank r plays the cluster's r-th device,
named in the emitted model by its torch device, or, where another host took that torch device
first, by the type's next free index (``node1/cuda:0`` is ``cuda:1``). ``rank_devices`` says
where each rank runs under torchrun: all on one machine, on those names; across machines
(``torchrun --nnodes``), each on its planned torch device on its own host, its ``LOCAL_RANK``
checked. ``ranks.py`` writes them into ``launch.py`` and runs the ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autoplace.errors import EmitError

__all__ = ["LaunchDevices", "emitted_devices", "launch_devices", "rank_devices"]


@dataclass(frozen=True)
class LaunchDevices:
    """The plan's devices as ranks, in the cluster's order: rank r plays ``names[r]`` on host
    ``hosts[r]``, where it runs on its planned torch device ``devices[r]``; its segments carry
    ``ranks[r]`` in the emitted model, which is ``devices[r]`` unless another host's device
    took that torch device first (``launch_devices``)."""

    ranks: tuple[str, ...]
    devices: tuple[str, ...]
    names: tuple[str, ...]
    hosts: tuple[str, ...]


def launch_devices(devices: Sequence[Any]) -> LaunchDevices | str:
    """``devices`` (the plan's ``ir.Device``s) as ranks, or why they cannot run as one process
    per device. Two hosts may both plan ``cuda:0``: each rank runs its own host's ``cuda:0``,
    and in the emitted model the second takes the type's next free index (``cuda:1``, its
    stand-in where one machine runs the whole model, and the rank's name for its segments).
    Two devices of one host on one torch device cannot be told apart."""
    if len(devices) < 2:
        return f"{len(devices)} device(s): one process runs the plan"
    taken: dict[tuple[str, int], str] = {}
    on_host: dict[tuple[str, str], str] = {}
    ranks = []
    for d in devices:
        if (d.host, d.torch_device) in on_host:
            return (f"{on_host[d.host, d.torch_device]} and {d.name} are both {d.torch_device} "
                    f"on host {d.host}: give each its own torch_device in the cluster file "
                    "([[devices]])")
        on_host[d.host, d.torch_device] = d.name
        parsed = torch.device(d.torch_device)
        index = parsed.index or 0
        if (parsed.type, index) in taken:  # another host's: the next free index of the type
            index = next(i for i in range(len(taken) + 1) if (parsed.type, i) not in taken)
            ranks.append(f"{parsed.type}:{index}")
        else:
            ranks.append(d.torch_device)
        taken[parsed.type, index] = d.name
    return LaunchDevices(tuple(ranks), tuple(d.torch_device for d in devices),
                         tuple(d.name for d in devices), tuple(d.host for d in devices))


def emitted_devices(devices: Sequence[Any]) -> dict[str, str]:
    """Each of the plan's ``devices`` (by name) as the emitted model names its segments: its
    rank's name where the devices run as ranks (``launch_devices``: two hosts' ``cuda:0`` are
    ``cuda:0`` and ``cuda:1``), else its torch device."""
    found = launch_devices(devices)
    if isinstance(found, str):
        return {d.name: d.torch_device for d in devices}
    return dict(zip(found.names, found.ranks))


def rank_devices(rank: int, *, ranks: Sequence[str], devices: Sequence[str],
                 hosts: Sequence[str], names: Sequence[str], local_rank: int,
                 local_world: int) -> list[str]:
    """The torch device each rank runs on, before ``--device-map``, as rank ``rank`` sees it.
    Every rank on one machine (torchrun's ``LOCAL_WORLD_SIZE`` is the world): ``ranks``,
    distinct, as the emitted model names them. Across machines (``torchrun --nnodes``): each
    its planned torch device on its own host (``devices``), rank ``rank``'s being its host's
    ``LOCAL_RANK``-th device in the plan, which ``local_rank`` must be."""
    if local_world == len(ranks):
        return list(ranks)
    place = sum(1 for r in range(rank) if hosts[r] == hosts[rank])
    if local_rank != place:
        count = sum(1 for h in hosts if h == hosts[rank])
        raise EmitError(
            f"rank {rank} ({names[rank]}) is device {place} of the {count} of host "
            f"{hosts[rank]} in the plan, but torchrun gave it LOCAL_RANK {local_rank}: start "
            "each host in the plan's order (" + ", ".join(dict.fromkeys(hosts)) + ") with "
            "--node-rank its place and --nproc-per-node its device count")
    return list(devices)
