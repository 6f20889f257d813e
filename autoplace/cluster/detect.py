"""What is here: the host CPU and the GPUs (name, memory, free memory, PCIe link, NVLink peers),
found once for every caller (``autoplace devices``, device specs naming ``cuda:N``, the default
cluster and the profiler), and which plan devices can be profiled (``docs/profiling.md``).

GPUs come from NVML (``pynvml``, package ``nvidia-ml-py``, the optional ``gpu`` extra) when it
is installed, a driver answers and its numbering provably matches CUDA's; else from torch; else
there are none. An extra NVML query (free memory, PCIe, NVLink) that fails on some driver or GPU
leaves its field empty, unreported: a machine without NVIDIA hardware (CI, laptops) is the
ordinary case. ``CUDA_VISIBLE_DEVICES`` follows torch's rule (``cuda:N`` in a plan is torch's
name): only the listed GPUs exist, renumbered from 0 in the listed order (``2,3`` makes NVML's
GPUs 2 and 3 ``cuda:0`` and ``cuda:1``), an empty value hides every GPU, and entries NVML cannot
map (UUIDs, MIG names, out-of-range indices) are left to torch, which asks CUDA itself.

Read ``detect_gpus`` first, then ``inventory`` (the host too, for the profiler), ``device_key``
(how the profile cache names a device) and ``present_devices`` (which cluster devices are here).
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoplace.ir import Cluster, Device
from cost_models import get_device_type, match_gpu_name
from cost_models.units import format_bytes

__all__ = [
    "DetectedGPU",
    "HostInfo",
    "Inventory",
    "describe_present",
    "detect_gpus",
    "device_key",
    "inventory",
    "present_devices",
]


@dataclass(frozen=True, kw_only=True)
class DetectedGPU:
    """A GPU found on this machine. ``index`` is its ``cuda:N`` number as torch counts it;
    ``catalog_type`` the matching catalog name, or None when the catalog has no such GPU;
    ``nvlink_peers`` the ``cuda:N`` indices it has an active NVLink to; ``pcie_gen`` and
    ``pcie_width`` its current host link. Optional fields are None (or empty) when unknown."""

    index: int
    name: str
    memory_bytes: int
    catalog_type: str | None
    memory_free_bytes: int | None = None
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
    gpus: tuple[DetectedGPU, ...] = ()
    source: str = "none"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def gpu(self, index: int) -> DetectedGPU | None:
        return next((g for g in self.gpus if g.index == index), None)

    def lines(self) -> list[str]:
        """A few lines for the terminal."""
        h = self.host
        out = [f"cpu: {h.cpu_model}, {h.logical_cpus} logical CPUs, torch uses "
               f"{h.torch_threads} threads"]
        for g in self.gpus:
            free = ("" if g.memory_free_bytes is None
                    else f", {format_bytes(g.memory_free_bytes)} free")
            pcie = "" if g.pcie_gen is None else f", PCIe gen{g.pcie_gen} x{g.pcie_width}"
            nvlink = ("" if not g.nvlink_peers
                      else ", NVLink to " + ", ".join(f"cuda:{p}" for p in g.nvlink_peers))
            out.append(f"cuda:{g.index}: {g.name}, {format_bytes(g.memory_bytes)}"
                       f"{free}{pcie}{nvlink}")
        if not self.gpus:
            out.append("no GPU found")
        return out


# --- Detection -----------------------------------------------------------------------------------


def detect_gpus() -> list[DetectedGPU]:
    """The GPUs on this machine, numbered as torch numbers them; [] without a driver or GPU.

    NVML is asked first because it creates no CUDA context; torch when NVML is missing, fails,
    or might number the GPUs differently from CUDA (see the module docstring). Free memory is
    not asked of torch here: that creates a CUDA context on every GPU (some hundreds of MiB
    each), so only ``inventory``, for the profiler about to use them, asks. NVML reports it
    anyway.
    """
    return list(_detect(free_memory=False)[0])


def _detect(*, free_memory: bool) -> tuple[tuple[DetectedGPU, ...], str]:
    """The GPUs and who answered for them: ``nvml``, ``torch`` or ``none``."""
    gpus = _detect_with_nvml()
    if gpus is not None:
        return gpus, "nvml"
    gpus = _detect_with_torch(free_memory=free_memory)
    return gpus, "torch" if gpus else "none"


def _visible_nvml_indices(count: int) -> list[int] | None:
    """NVML's indices of the GPUs CUDA shows, in CUDA's order; None when only CUDA can tell.

    NVML numbers GPUs by PCI bus; CUDA applies ``CUDA_VISIBLE_DEVICES`` (listed GPUs renumbered
    from 0, as torch shows them) and, unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, puts the fastest
    first. The mixed-model check is the caller's: it needs the names.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    items = [item.strip() for item in visible.split(",") if item.strip()]
    if not all(item.isdigit() and int(item) < count for item in items):
        return None  # UUIDs, MIG names or bad indices: let CUDA resolve them
    return [int(item) for item in items]


def _detect_with_nvml() -> tuple[DetectedGPU, ...] | None:
    """None when NVML cannot answer for CUDA's numbering, so torch should be asked instead."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception:  # not installed, no driver, no library: silently ask torch instead
        return None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                   for i in range(pynvml.nvmlDeviceGetCount())]
        order = _visible_nvml_indices(len(handles))
        if order is None:
            return None
        names = [_text(pynvml.nvmlDeviceGetName(h)) for h in handles]
        if (len({names[i] for i in order}) > 1
                and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID"):
            return None  # mixed models: CUDA may put the fastest first, NVML goes by bus
        bus_ids = [_bus_id(pynvml, h) for h in handles]
        cuda_index = {nvml_index: i for i, nvml_index in enumerate(order)}
        return tuple(
            _nvml_gpu(pynvml, handles[nvml_index], index=i, name=names[nvml_index],
                      bus_ids=bus_ids, cuda_index=cuda_index)
            for i, nvml_index in enumerate(order)
        )
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _nvml_gpu(pynvml: Any, handle: Any, *, index: int, name: str, bus_ids: Sequence[str],
              cuda_index: dict[int, int]) -> DetectedGPU:
    """One visible GPU; ``cuda_index`` maps NVML's numbers to CUDA's (hidden GPUs are absent)."""
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    gpu = DetectedGPU(index=index, name=name, memory_bytes=int(memory.total),
                      catalog_type=match_gpu_name(name))
    free = gen = width = None
    with contextlib.suppress(Exception):
        free = int(memory.free)
    with contextlib.suppress(Exception):
        gen = int(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))
        width = int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle))
    peers: set[int] = set()
    for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                continue
            remote = _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower()
        except Exception:
            break  # no NVLink on this GPU, or no more links
        if remote and remote in bus_ids:
            peer = cuda_index.get(bus_ids.index(remote))
            if peer is not None and peer != index:
                peers.add(peer)
    return replace(gpu, memory_free_bytes=free, pcie_gen=gen, pcie_width=width,
                   nvlink_peers=tuple(sorted(peers)))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value  # pynvml < 11.5 gives bytes


def _bus_id(pynvml: Any, handle: Any) -> str:
    with contextlib.suppress(Exception):
        return _text(pynvml.nvmlDeviceGetPciInfo(handle).busId).lower()
    return ""


def _detect_with_torch(*, free_memory: bool) -> tuple[DetectedGPU, ...]:
    try:
        import torch

        if not torch.cuda.is_available():
            return ()
        gpus = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            free = None
            if free_memory:
                with contextlib.suppress(Exception):
                    free = int(torch.cuda.mem_get_info(i)[0])
            gpus.append(DetectedGPU(index=i, name=props.name,
                                    memory_bytes=int(props.total_memory),
                                    catalog_type=match_gpu_name(props.name),
                                    memory_free_bytes=free))
        return tuple(gpus)
    except Exception:
        # A broken driver or a CUDA build without a GPU: planning for simulated devices still works.
        return ()


# --- The host, for the profiler ------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _host() -> HostInfo:
    import torch  # deferred: `autoplace devices` and spec parsing need no torch

    return HostInfo(cpu_model=_cpu_model(), logical_cpus=os.cpu_count() or 1,
                    torch_threads=torch.get_num_threads())


def inventory() -> Inventory:
    """The host CPU and the GPUs here, with their free memory (see ``detect_gpus``)."""
    gpus, source = _detect(free_memory=True)
    return Inventory(host=_host(), gpus=gpus, source=source)


def device_key(torch_device: str, inv: Inventory) -> str:
    """How the profile cache names the hardware behind ``torch_device``: the GPU's name, or the
    CPU's model with torch's thread count (a measurement on 2 threads says little about 32)."""
    if torch_device.startswith("cuda"):
        index = int(torch_device.split(":", 1)[1]) if ":" in torch_device else 0
        gpu = inv.gpu(index)
        return f"gpu:{gpu.name if gpu else 'unknown'}"
    if ":" in torch_device:  # cpu:N, a cpu-thread worker: one thread, timed in CPU time
        return f"cpu:{inv.host.cpu_model}:1t-cputime"
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
        elif kind == "cpu" and d.torch_device.split(":", 1)[0] == "cpu":
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
