"""Device types: what one accelerator (or a host CPU) can do, from public datasheets, each cited.

Read ``DeviceType`` (its fields, ``peak_flops_for``'s fallbacks), then ``DEVICE_CATALOG``,
``get_device_type``, ``match_gpu_name`` (a driver's name to the catalog's) and ``catalog_table``.

Conventions, so entries compare like for like (reasons: ``docs/cli.md``): ``float32`` is the FP32
*non-tensor* (CUDA core) peak, PyTorch leaving TF32 matmuls off by default (``tfloat32``: for
callers turning it on); ``float16``, ``bfloat16``, ``int8`` and ``tfloat32`` are *dense*
tensor-core peaks (a 2:4-sparsity figure, where the datasheet prints only that, halved and said
so); ``float64`` is the FP64 tensor-core peak where the chip has one, else the CUDA-core peak;
``memory_bytes`` is the nominal size nvidia-smi shows (the H200 is noted at its entry);
``launch_overhead_s`` is an *estimate* of PyTorch eager's per-kernel cost; ``reserved_bytes`` is
what the runtime holds before any tensor: on a GPU the CUDA context (every module loaded) plus one
cuBLAS workspace (``GPU_RUNTIME_RESERVE_BYTES``, sources at the constant), on a CPU nothing,
charged as resident.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "DEVICE_CATALOG",
    "GPU_RUNTIME_RESERVE_BYTES",
    "DeviceType",
    "UnknownDeviceTypeError",
    "UnknownNameError",
    "canonical_dtype",
    "catalog_names",
    "catalog_table",
    "get_device_type",
    "match_gpu_name",
]

TERA = 1e12
GIB = 2**30

DEVICE_KINDS = ("gpu", "cpu")
PEAK_DTYPES = ("float32", "tfloat32", "float16", "bfloat16", "float64", "int8")

# Spellings a traced graph or a user may use for the same dtype ("torch.float32", "half", "bf16").
_DTYPE_ALIASES = {
    "float": "float32",
    "fp32": "float32",
    "f32": "float32",
    "tf32": "tfloat32",
    "half": "float16",
    "fp16": "float16",
    "f16": "float16",
    "bf16": "bfloat16",
    "double": "float64",
    "fp64": "float64",
    "f64": "float64",
}


class UnknownNameError(KeyError):
    """A registry lookup by a name that is not registered; the message lists the valid names.

    A ``KeyError`` because it is a failed lookup, but printed as a sentence: ``KeyError.__str__``
    would wrap the message in quotes.
    """

    def __init__(self, message: str, *, name: str, valid: tuple[str, ...]) -> None:
        super().__init__(message)
        self.name = name
        self.valid = valid

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownDeviceTypeError(UnknownNameError):
    """``get_device_type`` was given a name that is not in ``DEVICE_CATALOG``."""


def canonical_dtype(dtype: str) -> str:
    """``"torch.bfloat16"``, ``"bf16"``, ``"BFloat16"`` -> ``"bfloat16"``; others lower-cased."""
    name = dtype.strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)


@dataclass(frozen=True, kw_only=True)
class DeviceType:
    """One kind of device and its peak figures.

    ``peak_flops_per_s`` maps a dtype name (see ``PEAK_DTYPES``) to a peak rate and must hold
    ``float32``. ``nvlink_bandwidth_bytes_per_s`` is per direction per GPU (0 without NVLink) and
    ``nvlink_gen`` its generation (0 without); ``pcie_gen`` is the host interface's PCIe
    generation (x16 assumed).
    """

    name: str
    kind: str
    memory_bytes: int
    peak_flops_per_s: Mapping[str, float]
    memory_bandwidth_bytes_per_s: float
    launch_overhead_s: float
    nvlink_bandwidth_bytes_per_s: float = 0.0
    nvlink_gen: int = 0
    pcie_gen: int
    source: str
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problems = []
        if self.kind not in DEVICE_KINDS:
            problems.append(f"kind {self.kind!r} is not one of {DEVICE_KINDS}")
        if self.memory_bytes <= 0:
            problems.append(f"memory_bytes={self.memory_bytes} must be positive")
        if "float32" not in self.peak_flops_per_s:
            problems.append("peak_flops_per_s needs a 'float32' entry (the fallback peak)")
        for dtype, peak in self.peak_flops_per_s.items():
            if dtype not in PEAK_DTYPES:
                problems.append(f"peak_flops_per_s key {dtype!r} is not one of {PEAK_DTYPES}")
            if not peak > 0:
                problems.append(f"peak_flops_per_s[{dtype!r}]={peak} must be positive")
        if not self.memory_bandwidth_bytes_per_s > 0:
            problems.append("memory_bandwidth_bytes_per_s must be positive")
        if not self.launch_overhead_s >= 0:
            problems.append("launch_overhead_s must be >= 0")
        if self.nvlink_bandwidth_bytes_per_s < 0:
            problems.append("nvlink_bandwidth_bytes_per_s must be >= 0")
        if (self.nvlink_gen > 0) != (self.nvlink_bandwidth_bytes_per_s > 0):
            problems.append("nvlink_gen and nvlink_bandwidth_bytes_per_s must both be set or 0")
        if self.pcie_gen not in (3, 4, 5):
            problems.append(f"pcie_gen={self.pcie_gen} must be 3, 4 or 5")
        if not self.source.strip():
            problems.append("source must name the public datasheet the figures come from")
        if problems:
            raise ValueError(f"device type {self.name!r}: " + "; ".join(problems))
        # A read-only copy, so a catalog entry cannot be changed through the dict it was built from.
        object.__setattr__(self, "peak_flops_per_s", MappingProxyType(dict(self.peak_flops_per_s)))

    @property
    def launched(self) -> bool:
        """Whether a host thread launches this device's work asynchronously (a GPU), so that
        the launches of several devices share that thread (``ir.HostCosts``)."""
        return self.kind == "gpu"

    @property
    def reserved_bytes(self) -> int:
        """The runtime's memory before any tensor (see the module docstring): by kind."""
        return GPU_RUNTIME_RESERVE_BYTES if self.kind == "gpu" else 0

    def __hash__(self) -> int:
        # The generated hash would fail on the mapping field; names are unique in the catalog.
        return hash((self.name, self.memory_bytes))

    def peak_flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``: its own entry if the device has one, else the float32 peak.

        Falling back to float32 covers a half-precision type without tensor-core support (bf16 on
        V100/T4, whose PyTorch kernels compute in float32), integer and bool tensors (no tensor
        cores in eager elementwise or index ops), and dtypes this catalog does not know.
        """
        return self.peak_flops_per_s.get(canonical_dtype(dtype), self.peak_flops_per_s["float32"])

    @property
    def has_nvlink(self) -> bool:
        return self.nvlink_gen > 0


GPU_LAUNCH_OVERHEAD_S = 5e-6  # estimate: PyTorch eager dispatch + cudaLaunchKernel, a few us
# What the emitted runtime's launcher thread pays besides the kernels, on a GPU (issue 13's
# host model, ``ir.HostCosts``): one segment call (the generated closure and the GraphModule's
# Python around its ops) and one handover (stream waits, the copy's launch, an event). Estimates
# from the Python calls each makes (a segment call cost 4-8 us on this project's 2-core CPU
# machine); ``benchmarks/gpu_fidelity.py`` measures both on the GPU host it runs on.
GPU_SEGMENT_CALL_S = 10e-6
GPU_HANDOVER_S = 20e-6
CPU_LAUNCH_OVERHEAD_S = 1e-6  # estimate: PyTorch eager dispatch of a CPU kernel
# What a CPU worker's own thread pays besides its ops (``ir.HostCosts.own_thread``), holding the
# interpreter: a segment call, a handover (publishing the value and setting its event) and an
# op's dispatch (a one-element ``torch.ops.aten.add`` through the generated code's path); and
# taking the interpreter over from another worker's thread (two threads of such ops take
# 2 x (dispatch + switch) per op each). As ``autoplace.profile.launcher.measure_worker``
# measured them on this project's 2-core CPU machine (5.0, 7.9, 3.5 and 5.5 us, 2026-12-06); a
# profile measures them where it runs.
CPU_WORKER_CALL_S = 5e-6
CPU_WORKER_HANDOVER_S = 8e-6
CPU_WORKER_DISPATCH_S = 3.5e-6
CPU_WORKER_SWITCH_S = 5.5e-6

# What a GPU loses to PyTorch's runtime before the first tensor: the CUDA context with all modules
# loaded eagerly, 666,632,192 bytes as PyTorch's developers measured it (pytorch/pytorch PR
# #86509; lazy loading, the default since CUDA 12.2, starts at 287,047,680 and grows toward it as
# kernels load, so the eager figure bounds it), plus one cuBLAS workspace of 32 MiB (PyTorch's
# default on sm90, 4096 KiB x 8, the largest of its defaults: aten/src/ATen/cuda/
# CublasHandlePool.cpp). Not a datasheet figure: a cluster file's reserve_bytes replaces it.
GPU_RUNTIME_RESERVE_BYTES = 666_632_192 + 32 * 2**20


def _host_memory_bytes() -> int:
    """This machine's physical memory (``os.sysconf``), or 16 GiB where the OS does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 16 * GIB


def _v100(memory_gib: int) -> DeviceType:
    return DeviceType(
        name=f"V100-{memory_gib}GB",
        kind="gpu",
        memory_bytes=memory_gib * GIB,
        # No bf16 or int8 tensor cores on Volta: those fall back to the float32 peak.
        peak_flops_per_s={
            "float32": 15.7 * TERA,
            "float16": 125 * TERA,
            "float64": 7.8 * TERA,
        },
        memory_bandwidth_bytes_per_s=900e9,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        # 300 GB/s total = 6 links x 25 GB/s per direction x 2 directions.
        nvlink_bandwidth_bytes_per_s=150e9,
        nvlink_gen=2,
        pcie_gen=3,
        source=(
            "NVIDIA Tesla V100 GPU Accelerator datasheet (SXM2), "
            "https://images.nvidia.com/content/technologies/volta/pdf/"
            "tesla-volta-v100-datasheet-letter-fnl-web.pdf"
        ),
    )


def _a100(memory_gib: int, bandwidth_bytes_per_s: float) -> DeviceType:
    return DeviceType(
        name=f"A100-{memory_gib}GB",
        kind="gpu",
        memory_bytes=memory_gib * GIB,
        # Dense figures; the datasheet prints "dense | sparse".
        peak_flops_per_s={
            "float32": 19.5 * TERA,
            "tfloat32": 156 * TERA,
            "float16": 312 * TERA,
            "bfloat16": 312 * TERA,
            "float64": 19.5 * TERA,  # FP64 tensor core
            "int8": 624 * TERA,
        },
        memory_bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        nvlink_bandwidth_bytes_per_s=300e9,  # 600 GB/s total, both directions
        nvlink_gen=3,
        pcie_gen=4,
        source=(
            "NVIDIA A100 Tensor Core GPU datasheet (SXM4), "
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
        ),
    )


# Hopper SXM: the H100 and H200 datasheets print only sparse tensor figures (marked "*"), so the
# dense peaks below are half of them: TF32 989/2, FP16/BF16 1979/2, INT8 3958/2.
_HOPPER_SXM_PEAKS = {
    "float32": 67 * TERA,
    "tfloat32": 494.5 * TERA,
    "float16": 989.5 * TERA,
    "bfloat16": 989.5 * TERA,
    "float64": 67 * TERA,  # FP64 tensor core
    "int8": 1979 * TERA,
}

_CATALOG_ENTRIES: tuple[DeviceType, ...] = (
    _v100(16),
    _v100(32),
    _a100(40, 1555e9),
    _a100(80, 2039e9),
    DeviceType(
        name="H100-80GB",
        aliases=("H100", "H100-SXM"),
        kind="gpu",
        memory_bytes=80 * GIB,
        peak_flops_per_s=_HOPPER_SXM_PEAKS,
        memory_bandwidth_bytes_per_s=3.35e12,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        nvlink_bandwidth_bytes_per_s=450e9,  # 900 GB/s total, both directions
        nvlink_gen=4,
        pcie_gen=5,
        source=(
            "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column), linked from "
            "https://www.nvidia.com/en-us/data-center/h100/"
        ),
    ),
    DeviceType(
        name="H200",
        aliases=("H200-141GB", "H200-SXM"),
        kind="gpu",
        # The datasheet's "141GB" in decimal bytes. nvidia-smi shows more (about 140 GiB), so
        # this is a conservative capacity; a cluster file can override it.
        memory_bytes=141 * 10**9,
        peak_flops_per_s=_HOPPER_SXM_PEAKS,
        memory_bandwidth_bytes_per_s=4.8e12,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        nvlink_bandwidth_bytes_per_s=450e9,
        nvlink_gen=4,
        pcie_gen=5,
        source=(
            "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column), linked from "
            "https://www.nvidia.com/en-us/data-center/h200/"
        ),
    ),
    DeviceType(
        name="L4",
        aliases=("L4-24GB",),
        kind="gpu",
        memory_bytes=24 * GIB,
        # Datasheet figures are sparse: TF32 120, FP16/BF16 242, INT8 485 -> halved. FP64 is not
        # listed; Ada runs FP64 at 1/64 of FP32 (NVIDIA Ada GPU architecture whitepaper).
        peak_flops_per_s={
            "float32": 30.3 * TERA,
            "tfloat32": 60 * TERA,
            "float16": 121 * TERA,
            "bfloat16": 121 * TERA,
            "float64": 30.3 * TERA / 64,
            "int8": 242.5 * TERA,
        },
        memory_bandwidth_bytes_per_s=300e9,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        pcie_gen=4,
        source=(
            "NVIDIA L4 Tensor Core GPU datasheet, linked from "
            "https://www.nvidia.com/en-us/data-center/l4/"
        ),
    ),
    DeviceType(
        name="T4",
        aliases=("T4-16GB", "Tesla-T4"),
        kind="gpu",
        memory_bytes=16 * GIB,
        # "Mixed-precision (FP16/FP32) 65 TFLOPS"; no bf16 on Turing. FP64 at 1/32 of FP32
        # (Turing TU104: 2 FP64 units per 64 FP32 cores per SM, NVIDIA Turing whitepaper).
        peak_flops_per_s={
            "float32": 8.1 * TERA,
            "float16": 65 * TERA,
            "float64": 8.1 * TERA / 32,
            "int8": 130 * TERA,
        },
        memory_bandwidth_bytes_per_s=320e9,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        pcie_gen=3,
        source=(
            "NVIDIA T4 Tensor Core GPU datasheet, "
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
            "t4-tensor-core-datasheet-951643.pdf"
        ),
    ),
    DeviceType(
        name="A10G",
        aliases=("A10G-24GB",),
        kind="gpu",
        memory_bytes=24 * GIB,
        # NVIDIA publishes no A10G datasheet (it is an AWS-only variant of the A10); these are the
        # dense figures AWS/NVIDIA gave Baseten. The A10 datasheet's tensor peaks (125 TFLOPS
        # FP16) are higher and do not apply. FP64 at 1/64 of FP32 (GA102, Ampere whitepaper).
        peak_flops_per_s={
            "float32": 35 * TERA,
            "tfloat32": 35 * TERA,
            "float16": 70 * TERA,
            "bfloat16": 70 * TERA,
            "float64": 35 * TERA / 64,
            "int8": 140 * TERA,
        },
        memory_bandwidth_bytes_per_s=600e9,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        pcie_gen=4,
        source=(
            "Baseten, 'NVIDIA A10 vs A10G for ML model inference' (spec table), "
            "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/; "
            "AWS EC2 G5 instances, https://aws.amazon.com/ec2/instance-types/g5/"
        ),
    ),
    DeviceType(
        name="RTX4090",
        aliases=("RTX-4090", "4090", "GeForce-RTX-4090"),
        kind="gpu",
        memory_bytes=24 * GIB,
        # GeForce runs FP16/BF16 tensor math with FP32 accumulate (what PyTorch uses) at half the
        # FP16-accumulate rate: 165.2 dense, not 330.3. FP64 at 1/64 of FP32.
        peak_flops_per_s={
            "float32": 82.6 * TERA,
            "tfloat32": 82.6 * TERA,
            "float16": 165.2 * TERA,
            "bfloat16": 165.2 * TERA,
            "float64": 82.6 * TERA / 64,
            "int8": 660.6 * TERA,
        },
        memory_bandwidth_bytes_per_s=1008e9,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        pcie_gen=4,
        source=(
            "NVIDIA Ada GPU Architecture whitepaper, Appendix A (GeForce RTX 4090), "
            "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/"
            "nvidia-ada-gpu-architecture.pdf"
        ),
    ),
    DeviceType(
        name="CPU",
        kind="cpu",
        # A generic 2-socket server: 2x Xeon Platinum 8380 with 16 x 32 GiB DIMMs (one per
        # channel); the size is a typical configuration, not a property of the chip.
        memory_bytes=512 * GIB,
        # Per socket: 40 cores x 2.3 GHz base x 32 FP32 FLOP/cycle (2 AVX-512 FMA units x 16
        # lanes x 2) = 2.944 TFLOP/s; FP64 half that; int8 via AVX-512 VNNI at 8x the FP32 rate
        # (VPDPBUSD: 64 int8 multiply-adds per 512-bit op). Ice Lake has no bf16/fp16 units, so
        # those fall back to float32. Real AVX-512 clocks run below base: these are upper bounds.
        peak_flops_per_s={
            "float32": 2 * 40 * 2.3e9 * 32,
            "float64": 2 * 40 * 2.3e9 * 16,
            "int8": 2 * 40 * 2.3e9 * 256,
        },
        # DDR4-3200 x 8 channels x 8 bytes = 204.8 GB/s per socket, two sockets.
        memory_bandwidth_bytes_per_s=2 * 8 * 3200e6 * 8,
        launch_overhead_s=CPU_LAUNCH_OVERHEAD_S,
        pcie_gen=4,
        source=(
            "Intel Xeon Platinum 8380 specifications (40 cores, 2.30 GHz, 8x DDR4-3200, "
            "PCIe 4.0), https://www.intel.com/content/www/us/en/products/sku/212287/"
            "intel-xeon-platinum-8380-processor-60m-cache-2-30-ghz/specifications.html"
        ),
    ),
    # One thread of the machine autoplace runs on, for plans whose workers are threads
    # (``--devices 2xcpu-thread``): the emitted model runs each such device's segments in its own
    # thread with ``torch.set_num_threads(1)``. Its op costs are profiled single-threaded
    # (``--profile``, the default); the figures here are only the analytic fallback.
    DeviceType(
        name="cpu-thread",
        aliases=("thread", "cpu-threads"),
        kind="cpu",
        # The threads share this machine's memory; each is given all of it, and the plan's
        # per-device peaks say how it is split. A cluster file can set a smaller figure.
        memory_bytes=_host_memory_bytes(),
        # One core of the catalog CPU: 2.3 GHz x 32 FP32 FLOP/cycle (2 AVX-512 FMA x 16 lanes
        # x 2); FP64 half. Memory: one core streams about a twentieth of a socket's 204.8 GB/s
        # (an estimate; single-core STREAM figures on Xeon servers are 10-15 GB/s).
        peak_flops_per_s={"float32": 2.3e9 * 32, "float64": 2.3e9 * 16},
        memory_bandwidth_bytes_per_s=204.8e9 / 20,
        launch_overhead_s=CPU_LAUNCH_OVERHEAD_S,
        pcie_gen=4,
        source=(
            "one core of the CPU entry: Intel Xeon Platinum 8380 specifications (2.30 GHz, "
            "AVX-512), https://www.intel.com/content/www/us/en/products/sku/212287/"
            "intel-xeon-platinum-8380-processor-60m-cache-2-30-ghz/specifications.html; memory "
            "size is this machine's physical memory (os.sysconf); costs are profiled here"
        ),
    ),
)

# One process of the machine autoplace runs on, on one thread, for plans whose devices are ranks
# of this machine (``--devices 2xcpu-process``; ``autoplace run OUT --nproc N`` starts them):
# a cpu-thread worker's costs (each rank runs one intra-op thread, as torchrun starts them),
# but two of them talk through gloo over 127.0.0.1 (``cost_models.links``, gloo-loopback).
_CATALOG_ENTRIES += (
    dataclasses.replace(
        next(e for e in _CATALOG_ENTRIES if e.name == "cpu-thread"),
        name="cpu-process",
        aliases=("process", "cpu-processes"),
        source=("a cpu-thread worker in a process of its own: one core of the CPU entry, Intel "
                "Xeon Platinum 8380 specifications, https://www.intel.com/content/www/us/en/"
                "products/sku/212287/intel-xeon-platinum-8380-processor-60m-cache-2-30-ghz/"
                "specifications.html; costs are profiled here, links between two are gloo over "
                "127.0.0.1"),
    ),
)

DEVICE_CATALOG: Mapping[str, DeviceType] = MappingProxyType(
    {entry.name: entry for entry in _CATALOG_ENTRIES}
)


def _lookup_key(name: str) -> str:
    # Case and separators do not matter: "a100-40gb", "A100_40GB" and "A100 40GB" are one name.
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _build_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for entry in _CATALOG_ENTRIES:
        for spelling in (entry.name, *entry.aliases):
            key = _lookup_key(spelling)
            if index.get(key, entry.name) != entry.name:
                raise AssertionError(f"{spelling!r} names both {index[key]} and {entry.name}")
            index[key] = entry.name
    return index


_INDEX = _build_index()


def catalog_names() -> tuple[str, ...]:
    """The canonical device type names, in catalog order."""
    return tuple(DEVICE_CATALOG)


def get_device_type(name: str) -> DeviceType:
    """The catalog entry for ``name`` (case- and separator-insensitive; aliases accepted)."""
    canonical = _INDEX.get(_lookup_key(name))
    if canonical is None:
        valid = catalog_names()
        raise UnknownDeviceTypeError(
            f"unknown device type {name!r}; valid types: {', '.join(valid)}",
            name=name,
            valid=valid,
        )
    return DEVICE_CATALOG[canonical]


# Driver-reported names (nvidia-smi, torch.cuda.get_device_name) -> catalog names. Searched in
# order, so the more specific patterns come first (A100 80GB before A100).
_GPU_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bH200\b", "H200"),  # "NVIDIA H200"; not "NVIDIA GH200 480GB", a different module
    (r"\bH100\b", "H100-80GB"),  # "NVIDIA H100 80GB HBM3"
    (r"\bA100\b.*\b80\s?GB\b", "A100-80GB"),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"
    (r"\bA100\b", "A100-40GB"),  # "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"
    (r"\bV100S?\b.*\b32\s?GB\b", "V100-32GB"),  # "Tesla V100-SXM2-32GB"
    (r"\bV100S?\b", "V100-16GB"),
    (r"\bA10G?\b", "A10G"),  # the A10 is A10G's datacenter sibling: same memory and bandwidth
    (r"\bL4\b", "L4"),  # not "L40"/"L40S"
    (r"\bT4\b", "T4"),  # "Tesla T4"
    (r"\b4090\b", "RTX4090"),  # "NVIDIA GeForce RTX 4090"
)


def match_gpu_name(gpu_name: str) -> str | None:
    """The catalog type for a driver-reported GPU name, or None ("NVIDIA A100-SXM4-40GB" ->
    "A100-40GB"). PCIe variants map to the SXM entry of the same chip and memory."""
    for pattern, type_name in _GPU_NAME_PATTERNS:
        if re.search(pattern, gpu_name, flags=re.IGNORECASE):
            return type_name
    return None


def catalog_table(*, indent: str = "") -> str:
    """The catalog as a plain-text table, one device type a line, then a legend."""
    columns = "type|kind|memory GiB|fp32 TFLOP/s|bf16 TFLOP/s|mem GB/s|launch us|NVLink GB/s|PCIe"
    rows = [(*columns.split("|"), "aliases")]
    for t in DEVICE_CATALOG.values():
        # Flag a bf16 figure that is really the float32 fallback, so it is not read as native.
        bf16_flag = "" if "bfloat16" in t.peak_flops_per_s else "*"
        rows.append(
            (
                t.name,
                t.kind,
                f"{t.memory_bytes / GIB:.1f}",
                f"{t.peak_flops_for('float32') / TERA:.1f}",
                f"{t.peak_flops_for('bfloat16') / TERA:.1f}{bf16_flag}",
                f"{t.memory_bandwidth_bytes_per_s / 1e9:.0f}",
                f"{t.launch_overhead_s * 1e6:.0f}",
                f"{t.nvlink_bandwidth_bytes_per_s / 1e9:.0f}" if t.has_nvlink else "-",
                f"gen{t.pcie_gen}",
                ", ".join(t.aliases),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines += [
        f"{indent}* no native bfloat16: the float32 peak is used.",
        f"{indent}Dense peaks from public datasheets (float32 without TF32); NVLink per direction;",
        f"{indent}launch overhead is an estimate of PyTorch eager's per-kernel cost.",
    ]
    return "\n".join(lines)
