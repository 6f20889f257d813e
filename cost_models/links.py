"""Link kinds: how fast bytes move between two devices, and which link two devices get by default.

Read ``LinkSpec`` and the catalog ``LINK_CATALOG`` first, then ``default_link``, which picks a kind
for a pair of catalog device types. A transfer of ``n`` bytes over a link takes
``latency_s + n / bandwidth_bytes_per_s`` (see ``roofline.transfer_time_s``).

Bandwidths are nominal per-direction peaks. Latencies are estimates of the fixed cost of one copy
as PyTorch issues it (driver call, DMA setup, wire), not datasheet figures; a cluster file can
override any link with measured numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from cost_models.devices import DeviceType, UnknownNameError

__all__ = [
    "LINK_CATALOG",
    "LinkSpec",
    "UnknownLinkKindError",
    "default_link",
    "get_link_kind",
    "link_kind_names",
]


class UnknownLinkKindError(UnknownNameError):
    """``get_link_kind`` was given a name that is not in ``LINK_CATALOG``."""


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """A kind of link: per-direction bandwidth, fixed per-transfer latency, and their source."""

    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0 or not self.latency_s >= 0:
            raise ValueError(
                f"link kind {self.kind!r} needs bandwidth > 0 and latency >= 0, got "
                f"{self.bandwidth_bytes_per_s} B/s and {self.latency_s} s"
            )
        if not self.source.strip():
            raise ValueError(f"link kind {self.kind!r} must name its source")


def _pcie_x16_bytes_per_s(transfers_per_s: float) -> float:
    # PCIe 3.0 and later use 128b/130b encoding; 16 lanes, 8 bits a byte, per direction.
    return transfers_per_s * 16 * (128 / 130) / 8


# Estimates. NVLink: peer-to-peer copies measured by CUDA's p2pBandwidthLatencyTest sample take a
# couple of microseconds. PCIe: a cudaMemcpy across PCIe costs on the order of 10 us end to end.
# Network: adapters and switches add under 1 us each, but a framework-level send over 100 Gb/s
# InfiniBand/RoCE (NCCL, Gloo) is about 10 us for small messages.
NVLINK_LATENCY_S = 2e-6
PCIE_LATENCY_S = 1e-5
NETWORK_LATENCY_S = 1e-5
MEMCPY_LATENCY_S = 1e-6
# A value handed from one worker thread to another, as the emitted runtime makes it between
# segments: two threads taking turns at about 1 ms of matmuls each paid 60 to 220 us a turn
# more than one thread running them all, on this project's 2-core machine (a virtual machine's
# CPUs: the sleeping thread's wake-up, 13 us for a bare event after no sleep and 43 us after
# 1 ms, and its core's caches after the sleep), ``autoplace.profile.links.measure_handover``;
# ``autoplace profile`` measures it where it runs.
THREAD_HANDOVER_LATENCY_S = 1e-4

_PCIE_SOURCE = (
    "PCI-SIG PCI Express Base Specification (x16, 128b/130b encoding), "
    "https://pcisig.com/specifications"
)

_LINK_ENTRIES: tuple[LinkSpec, ...] = (
    LinkSpec(
        kind="nvlink2",
        # V100 SXM2: 6 links x 25 GB/s per direction. This is the NVSwitch (DGX-2/HGX-2) figure;
        # in a DGX-1 hybrid cube-mesh a pair of GPUs shares only 1-2 links (25-50 GB/s): override
        # such links in a cluster file.
        bandwidth_bytes_per_s=150e9,
        latency_s=NVLINK_LATENCY_S,
        source=(
            "NVIDIA Tesla V100 GPU Architecture whitepaper (NVLink 2.0, 300 GB/s total), "
            "https://images.nvidia.com/content/volta-architecture/pdf/"
            "volta-architecture-whitepaper.pdf"
        ),
    ),
    LinkSpec(
        kind="nvlink3",
        bandwidth_bytes_per_s=300e9,  # A100: 12 links x 25 GB/s per direction, 600 GB/s total
        latency_s=NVLINK_LATENCY_S,
        source=(
            "NVIDIA A100 Tensor Core GPU datasheet (NVLink 600 GB/s), "
            "https://www.nvidia.com/en-us/data-center/a100/"
        ),
    ),
    LinkSpec(
        kind="nvlink4",
        bandwidth_bytes_per_s=450e9,  # H100/H200: 18 links x 25 GB/s per direction, 900 GB/s total
        latency_s=NVLINK_LATENCY_S,
        source=(
            "NVIDIA H100 Tensor Core GPU datasheet (NVLink 900 GB/s), "
            "https://www.nvidia.com/en-us/data-center/h100/"
        ),
    ),
    LinkSpec(
        kind="pcie3",
        bandwidth_bytes_per_s=_pcie_x16_bytes_per_s(8e9),  # 8 GT/s -> 15.75 GB/s
        latency_s=PCIE_LATENCY_S,
        source=_PCIE_SOURCE,
    ),
    LinkSpec(
        kind="pcie4",
        bandwidth_bytes_per_s=_pcie_x16_bytes_per_s(16e9),  # 16 GT/s -> 31.5 GB/s
        latency_s=PCIE_LATENCY_S,
        source=_PCIE_SOURCE,
    ),
    LinkSpec(
        kind="pcie5",
        bandwidth_bytes_per_s=_pcie_x16_bytes_per_s(32e9),  # 32 GT/s -> 63.0 GB/s
        latency_s=PCIE_LATENCY_S,
        source=_PCIE_SOURCE,
    ),
    LinkSpec(
        kind="network",
        bandwidth_bytes_per_s=100e9 / 8,  # 100 Gb/s EDR InfiniBand or 100GbE, per direction
        latency_s=NETWORK_LATENCY_S,
        source=(
            "InfiniBand Trade Association, EDR 100 Gb/s 4x link, "
            "https://www.infinibandta.org/about-infiniband/; latency is an estimate of a "
            "framework-level small-message send (NCCL/Gloo), not the wire latency"
        ),
    ),
    LinkSpec(
        kind="memcpy",
        # Two CPU devices on one host share DRAM: a copy reads and writes, so about half of one
        # socket's 204.8 GB/s DDR4-3200 bandwidth (see the CPU entry in cost_models.devices).
        bandwidth_bytes_per_s=204.8e9 / 2,
        latency_s=MEMCPY_LATENCY_S,
        source="derived from the catalog CPU (Intel Xeon Platinum 8380, 8x DDR4-3200 per socket)",
    ),
)

_LINK_ENTRIES += (
    LinkSpec(
        kind="thread",
        # Two worker threads of one process share memory: the runtime hands a tensor over by
        # reference, so no byte moves. Charging a one-core memory copy (the cpu-thread entry's
        # 10.24 GB/s) keeps the figure an upper bound; profiling measures both terms here.
        bandwidth_bytes_per_s=204.8e9 / 20,
        latency_s=THREAD_HANDOVER_LATENCY_S,
        source=("estimate: thread wake-up latency and one core's memory bandwidth (see the "
                "cpu-thread device entry); measured by `autoplace profile`"),
    ),
)

_LINK_ENTRIES += (
    LinkSpec(
        kind="gloo-loopback",
        # Two processes of one host all-reducing through gloo over 127.0.0.1, as data-parallel
        # replicas on CPU workers do (each process one intra-op thread, as torchrun starts them):
        # 55 MB took 42.7 ms (1.35 GB/s by the ring formula), 1 MB 0.87 ms.
        bandwidth_bytes_per_s=1.35e9,
        latency_s=5e-5,
        source=("measured: `python benchmarks/gloo_allreduce.py` on a 2-core x86_64 host, "
                "torch 2.13 (benchmarks/results/training-cpu.md)"),
    ),
)

LINK_CATALOG: Mapping[str, LinkSpec] = MappingProxyType({e.kind: e for e in _LINK_ENTRIES})


def link_kind_names() -> tuple[str, ...]:
    """The link kinds, in catalog order."""
    return tuple(LINK_CATALOG)


def get_link_kind(name: str) -> LinkSpec:
    """The catalog entry for link kind ``name`` (case-insensitive)."""
    spec = LINK_CATALOG.get(name.strip().lower())
    if spec is None:
        valid = link_kind_names()
        raise UnknownLinkKindError(
            f"unknown link kind {name!r}; valid kinds: {', '.join(valid)}", name=name, valid=valid
        )
    return spec


def default_link(src: DeviceType, dst: DeviceType, *, same_host: bool) -> LinkSpec:
    """The link two devices of these types most likely have.

    Different hosts talk over the network. On one host, two GPUs of the same NVLink-capable type
    are assumed to sit on one NVLink/NVSwitch board (as in HGX/DGX systems); any other pair goes
    over PCIe at the slower of the two generations. A CPU endpoint takes the GPU's generation,
    since the catalog CPU stands in for whichever host the GPU is plugged into.
    """
    if not same_host:
        return LINK_CATALOG["network"]
    if src.name == dst.name == "cpu-thread":
        return LINK_CATALOG["thread"]
    if src.name == dst.name == "cpu-process":
        return LINK_CATALOG["gloo-loopback"]
    if src.kind == "cpu" and dst.kind == "cpu":
        return LINK_CATALOG["memcpy"]
    if src.kind == "gpu" and dst.kind == "gpu":
        if src.name == dst.name and src.has_nvlink:
            return LINK_CATALOG[f"nvlink{src.nvlink_gen}"]
        return LINK_CATALOG[f"pcie{min(src.pcie_gen, dst.pcie_gen)}"]
    gpu = src if src.kind == "gpu" else dst
    return LINK_CATALOG[f"pcie{gpu.pcie_gen}"]
