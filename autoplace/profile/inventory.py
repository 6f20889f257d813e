"""What is here: the host CPU, the GPUs (name, memory total and free, PCIe link, NVLink peers)
and which plan devices can be profiled.

GPUs are read from NVML (``pynvml``, package ``nvidia-ml-py``, the optional ``gpu`` extra) when
it is installed and a driver answers; otherwise from torch; otherwise there are none. Every NVML
call may fail on some driver or GPU (topology queries on a single-GPU VM, NVLink on PCIe cards):
a failure leaves that field empty and is never reported, since a machine without NVIDIA hardware
(CI, laptops) is the ordinary case.

Read ``inventory`` first, then ``device_key`` (how the profile cache names a device) and
``present_devices`` (which devices of a cluster are here).
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field

from autoplace.ir import Cluster, Device
from cost_models import get_device_type, match_gpu_name

__all__ = ["GPUInfo", "HostInfo", "Inventory", "device_key", "inventory", "present_devices"]


@dataclass(frozen=True, kw_only=True)
class GPUInfo:
    """One GPU as CUDA numbers it. ``nvlink_peers`` are the ``cuda:N`` indices it has an active
    NVLink to; ``pcie_gen``/``pcie_width`` its current host link (None when unknown)."""

    index: int
    name: str
    memory_total_bytes: int
    memory_free_bytes: int | None = None
    catalog_type: str | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    nvlink_peers: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class HostInfo:
    cpu_model: str
    logical_cpus: int
    torch_threads: int


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """The host and its GPUs; ``source`` says who answered for the GPUs (``nvml``, ``torch`` or
    ``none``)."""

    host: HostInfo
    gpus: tuple[GPUInfo, ...] = ()
    source: str = "none"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def gpu(self, index: int) -> GPUInfo | None:
        return next((g for g in self.gpus if g.index == index), None)

    def lines(self) -> list[str]:
        """A few lines for the terminal."""
        h = self.host
        out = [f"cpu: {h.cpu_model}, {h.logical_cpus} logical CPUs, torch uses "
               f"{h.torch_threads} threads"]
        for g in self.gpus:
            free = ("" if g.memory_free_bytes is None
                    else f", {g.memory_free_bytes / 2**30:.1f} GiB free")
            pcie = "" if g.pcie_gen is None else f", PCIe gen{g.pcie_gen} x{g.pcie_width}"
            nvlink = ("" if not g.nvlink_peers
                      else ", NVLink to " + ", ".join(f"cuda:{p}" for p in g.nvlink_peers))
            out.append(f"cuda:{g.index}: {g.name}, {g.memory_total_bytes / 2**30:.1f} GiB"
                       f"{free}{pcie}{nvlink}")
        if not self.gpus:
            out.append("no GPU found")
        return out


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _host() -> HostInfo:
    import torch

    return HostInfo(cpu_model=_cpu_model(), logical_cpus=os.cpu_count() or 1,
                    torch_threads=torch.get_num_threads())


def _nvml_gpus() -> tuple[GPUInfo, ...] | None:
    """The GPUs NVML reports, in CUDA's numbering, or None when NVML cannot answer."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception:  # not installed, no driver, no library: silently ask torch instead
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        bus_ids = []
        for h in handles:
            bus = ""
            with contextlib.suppress(Exception):
                bus = pynvml.nvmlDeviceGetPciInfo(h).busId
                bus = bus.decode() if isinstance(bus, bytes) else bus
            bus_ids.append(bus.lower())
        gpus = []
        for i, h in enumerate(handles):
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            memory = pynvml.nvmlDeviceGetMemoryInfo(h)
            gen = width = None
            with contextlib.suppress(Exception):
                gen = int(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h))
                width = int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(h))
            peers: set[int] = set()
            for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
                try:
                    if not pynvml.nvmlDeviceGetNvLinkState(h, link):
                        continue
                    remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId
                except Exception:
                    break  # no NVLink on this GPU, or no more links
                remote = (remote.decode() if isinstance(remote, bytes) else remote).lower()
                if remote in bus_ids and bus_ids.index(remote) != i:
                    peers.add(bus_ids.index(remote))
            gpus.append(GPUInfo(index=i, name=name, memory_total_bytes=int(memory.total),
                                memory_free_bytes=int(memory.free),
                                catalog_type=match_gpu_name(name), pcie_gen=gen,
                                pcie_width=width, nvlink_peers=tuple(sorted(peers))))
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    # NVML numbers GPUs by PCI bus, CUDA by CUDA_VISIBLE_DEVICES and speed: follow NVML only
    # where the two provably agree (as autoplace.devices.detect_gpus does).
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return None
    if len({g.name for g in gpus}) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return None
    return tuple(gpus)


def _torch_gpus() -> tuple[GPUInfo, ...]:
    try:
        import torch

        if not torch.cuda.is_available():
            return ()
        gpus = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            free = None
            with contextlib.suppress(Exception):
                free = int(torch.cuda.mem_get_info(i)[0])
            gpus.append(GPUInfo(index=i, name=props.name,
                                memory_total_bytes=int(props.total_memory),
                                memory_free_bytes=free, catalog_type=match_gpu_name(props.name)))
        return tuple(gpus)
    except Exception:
        return ()


def inventory() -> Inventory:
    """The host CPU and the GPUs here (NVML first, then torch; none without a driver)."""
    gpus = _nvml_gpus()
    if gpus is not None:
        return Inventory(host=_host(), gpus=gpus, source="nvml")
    gpus = _torch_gpus()
    return Inventory(host=_host(), gpus=gpus, source="torch" if gpus else "none")


def device_key(torch_device: str, inv: Inventory) -> str:
    """How the profile cache names the hardware behind ``torch_device``: the GPU's name, or the
    CPU's model with torch's thread count (a measurement on 2 threads says little about 32)."""
    if torch_device.startswith("cuda"):
        index = int(torch_device.split(":", 1)[1]) if ":" in torch_device else 0
        gpu = inv.gpu(index)
        return f"gpu:{gpu.name if gpu else 'unknown'}"
    return f"cpu:{inv.host.cpu_model}:{inv.host.torch_threads}t"


def present_devices(cluster: Cluster, inv: Inventory) -> tuple[list[Device], list[str]]:
    """The devices of ``cluster`` that are on this machine and can be profiled, and one reason
    per device that cannot (simulated, on another host, or a different GPU than planned)."""
    present: list[Device] = []
    absent: list[str] = []
    several_hosts = len({d.host for d in cluster.devices}) > 1
    for d in cluster.devices:
        kind = get_device_type(d.type).kind
        if several_hosts:
            absent.append(f"{d.name} is on host {d.host}: only this machine's devices are "
                          "profiled")
        elif kind == "cpu" and d.torch_device == "cpu":
            present.append(d)
        elif kind == "gpu" and d.torch_device.startswith("cuda"):
            index = int(d.torch_device.split(":", 1)[1]) if ":" in d.torch_device else 0
            gpu = inv.gpu(index)
            if gpu is None:
                absent.append(f"{d.name} ({d.type}) is simulated: no {d.torch_device} here")
            elif gpu.catalog_type != get_device_type(d.type).name:
                absent.append(f"{d.name} is planned as {d.type} but {d.torch_device} here is "
                              f"{gpu.name}")
            else:
                present.append(d)
        else:
            absent.append(f"{d.name} ({d.type}) has torch device {d.torch_device!r}, which is "
                          "not this machine's")
    return present, absent


def describe_present(devices: Sequence[Device]) -> str:
    return ", ".join(f"{d.name} ({d.type})" for d in devices) or "none"
