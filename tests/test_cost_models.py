"""Tests for cost_models: the device and link catalogs, their lookups, and the roofline formulas.

Expected times are worked out by hand in comments from the datasheet figures in the catalog, so a
wrong catalog number or a wrong formula both show up.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import cost_models
from cost_models import (
    DEVICE_CATALOG,
    LINK_CATALOG,
    DeviceType,
    UnknownDeviceTypeError,
    UnknownLinkKindError,
    catalog_names,
    default_link,
    get_device_type,
    get_link_kind,
    match_gpu_name,
    op_time_s,
    ring_allreduce_s,
    transfer_time_s,
)

GIB = 2**30

REQUIRED_TYPES = (
    "V100-16GB",
    "V100-32GB",
    "A100-40GB",
    "A100-80GB",
    "H100-80GB",
    "H200",
    "L4",
    "T4",
    "A10G",
    "RTX4090",
    "CPU",
)


def test_public_surface_is_pinned() -> None:
    assert sorted(cost_models.__all__) == sorted(
        [
            "DEVICE_CATALOG",
            "LINK_CATALOG",
            "DeviceType",
            "LinkSpec",
            "UnknownDeviceTypeError",
            "UnknownLinkKindError",
            "UnknownNameError",
            "arithmetic_intensity",
            "canonical_dtype",
            "catalog_names",
            "catalog_table",
            "default_link",
            "get_device_type",
            "get_link_kind",
            "link_kind_names",
            "match_gpu_name",
            "op_time_s",
            "ring_allgather_s",
            "ring_allreduce_s",
            "transfer_time_s",
        ]
    )
    for name in cost_models.__all__:
        assert hasattr(cost_models, name)


def test_cost_models_imports_neither_autoplace_nor_torch() -> None:
    # cost_models is the lower layer: importing it must not pull in the pipeline or torch.
    code = (
        "import sys, cost_models; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('autoplace', 'torch')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- Catalog -------------------------------------------------------------------------------------


def test_catalog_has_the_required_types() -> None:
    assert set(REQUIRED_TYPES) <= set(catalog_names())
    assert catalog_names() == tuple(DEVICE_CATALOG)


@pytest.mark.parametrize("name", sorted(DEVICE_CATALOG))
def test_every_entry_is_sourced_and_positive(name: str) -> None:
    t = DEVICE_CATALOG[name]
    assert t.name == name
    assert t.kind in ("gpu", "cpu")
    assert "http" in t.source and len(t.source) > 20
    assert t.memory_bytes > 0 and isinstance(t.memory_bytes, int)
    assert t.memory_bandwidth_bytes_per_s > 0
    assert all(peak > 0 for peak in t.peak_flops_per_s.values())
    assert t.peak_flops_per_s["float32"] > 0
    assert "float64" in t.peak_flops_per_s  # falling back to float32 would overstate FP64
    assert 0 < t.launch_overhead_s < 1e-4
    assert t.pcie_gen in (3, 4, 5)
    if t.has_nvlink:
        # The device's own figure and the link catalog must agree.
        link = LINK_CATALOG[f"nvlink{t.nvlink_gen}"]
        assert link.bandwidth_bytes_per_s == t.nvlink_bandwidth_bytes_per_s


def test_datasheet_figures() -> None:
    a100 = get_device_type("A100-40GB")
    assert a100.memory_bytes == 40 * GIB
    assert a100.peak_flops_for("bfloat16") == pytest.approx(312e12)
    assert a100.peak_flops_for("float32") == pytest.approx(19.5e12)  # not TF32's 156
    assert a100.memory_bandwidth_bytes_per_s == pytest.approx(1555e9)
    assert get_device_type("A100-80GB").memory_bandwidth_bytes_per_s == pytest.approx(2039e9)
    h100 = get_device_type("H100-80GB")
    assert h100.peak_flops_for("bfloat16") == pytest.approx(1979e12 / 2)  # dense, not sparse
    assert h100.memory_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    h200 = get_device_type("H200")
    assert h200.memory_bytes == 141 * 10**9
    assert h200.memory_bandwidth_bytes_per_s == pytest.approx(4.8e12)
    assert get_device_type("T4").memory_bytes == 16 * GIB
    assert get_device_type("V100-32GB").memory_bytes == 32 * GIB
    # Dual Xeon 8380: 2 x 40 cores x 2.3 GHz x 32 FLOP/cycle; 2 x 8 x DDR4-3200 x 8 B.
    cpu = get_device_type("cpu")
    assert cpu.kind == "cpu"
    assert cpu.peak_flops_for("float32") == pytest.approx(5.888e12)
    assert cpu.memory_bandwidth_bytes_per_s == pytest.approx(409.6e9)


def test_peak_flops_fallbacks() -> None:
    a100, v100, t4 = (get_device_type(n) for n in ("A100-40GB", "V100-16GB", "T4"))
    assert a100.peak_flops_for("torch.bfloat16") == a100.peak_flops_for("bf16") == 312e12
    assert a100.peak_flops_for("half") == 312e12
    assert a100.peak_flops_for("tf32") == 156e12
    assert a100.peak_flops_for("int8") == 624e12
    # int64/bool/unknown dtypes run on CUDA cores: the float32 peak.
    for dtype in ("int64", "torch.int32", "bool", "complex64", "float8_e4m3fn"):
        assert a100.peak_flops_for(dtype) == 19.5e12
    # No bf16 tensor cores on Volta or Turing.
    assert v100.peak_flops_for("bfloat16") == v100.peak_flops_for("float32") == 15.7e12
    assert t4.peak_flops_for("bfloat16") == 8.1e12
    assert v100.peak_flops_for("float16") == 125e12


def test_ordering_between_generations() -> None:
    bf16 = {n: get_device_type(n).peak_flops_for("bfloat16") for n in REQUIRED_TYPES}
    assert bf16["H100-80GB"] > bf16["A100-40GB"] > bf16["T4"]
    bandwidth = {n: get_device_type(n).memory_bandwidth_bytes_per_s for n in REQUIRED_TYPES}
    assert bandwidth["H200"] > bandwidth["H100-80GB"] > bandwidth["A100-80GB"]
    assert bandwidth["A100-80GB"] > bandwidth["A100-40GB"] > bandwidth["T4"]


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("a100-40gb", "A100-40GB"),
        ("A100_40GB", "A100-40GB"),
        ("A100 40GB", "A100-40GB"),
        ("T4", "T4"),
        ("T4-16GB", "T4"),
        ("t4_16gb", "T4"),
        ("H200", "H200"),
        ("H200-141GB", "H200"),
        ("h100", "H100-80GB"),
        ("rtx 4090", "RTX4090"),
        ("CPU", "CPU"),
        ("cpu", "CPU"),
    ],
)
def test_lookup_accepts_aliases(spelling: str, canonical: str) -> None:
    assert get_device_type(spelling).name == canonical


def test_unknown_type_lists_valid_names() -> None:
    with pytest.raises(UnknownDeviceTypeError) as info:
        get_device_type("B200")
    message = str(info.value)
    assert message.startswith("unknown device type 'B200'")  # not KeyError's quoted repr
    for name in REQUIRED_TYPES:
        assert name in message
    assert isinstance(info.value, KeyError)
    assert info.value.valid == catalog_names()


def test_device_type_is_immutable_and_hashable() -> None:
    a100 = get_device_type("A100-40GB")
    with pytest.raises(TypeError):
        a100.peak_flops_per_s["float32"] = 1.0  # type: ignore[index]
    assert len({a100, get_device_type("a100_40gb"), get_device_type("T4")}) == 2


def test_device_type_validation() -> None:
    good = dict(
        name="X",
        kind="gpu",
        memory_bytes=GIB,
        peak_flops_per_s={"float32": 1e12},
        memory_bandwidth_bytes_per_s=1e11,
        launch_overhead_s=5e-6,
        pcie_gen=4,
        source="made up for a test",
    )
    DeviceType(**good)
    for bad in (
        {"kind": "tpu"},
        {"peak_flops_per_s": {"float16": 1e12}},
        {"peak_flops_per_s": {"float32": 0.0}},
        {"memory_bytes": 0},
        {"source": " "},
        {"nvlink_bandwidth_bytes_per_s": 1e11},  # without nvlink_gen
        {"pcie_gen": 2},
    ):
        with pytest.raises(ValueError):
            DeviceType(**{**good, **bad})


@pytest.mark.parametrize(
    ("driver_name", "expected"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H200", "H200"),
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA L40S", None),
        ("NVIDIA GH200 480GB", None),
        ("AMD Instinct MI250X", None),
    ],
)
def test_match_gpu_name(driver_name: str, expected: str | None) -> None:
    assert match_gpu_name(driver_name) == expected


# --- Links ---------------------------------------------------------------------------------------


def test_link_catalog_figures() -> None:
    assert get_link_kind("nvlink2").bandwidth_bytes_per_s == 150e9
    assert get_link_kind("nvlink3").bandwidth_bytes_per_s == 300e9
    assert get_link_kind("NVLINK4").bandwidth_bytes_per_s == 450e9
    # x16, 128b/130b: 8, 16, 32 GT/s -> 15.75, 31.5, 63.0 GB/s per direction.
    assert get_link_kind("pcie3").bandwidth_bytes_per_s == pytest.approx(15.754e9, rel=1e-3)
    assert get_link_kind("pcie4").bandwidth_bytes_per_s == pytest.approx(31.508e9, rel=1e-3)
    assert get_link_kind("pcie5").bandwidth_bytes_per_s == pytest.approx(63.015e9, rel=1e-3)
    assert get_link_kind("network").bandwidth_bytes_per_s == 12.5e9
    assert 5e-6 <= get_link_kind("network").latency_s <= 2e-5
    for spec in LINK_CATALOG.values():
        assert spec.source.strip() and spec.latency_s >= 0 and spec.bandwidth_bytes_per_s > 0


def test_unknown_link_kind_lists_valid_kinds() -> None:
    with pytest.raises(UnknownLinkKindError, match="unknown link kind 'nvlink5'.*nvlink3.*pcie4"):
        get_link_kind("nvlink5")


@pytest.mark.parametrize(
    ("src", "dst", "same_host", "kind"),
    [
        ("A100-40GB", "A100-40GB", True, "nvlink3"),
        ("V100-16GB", "V100-16GB", True, "nvlink2"),
        ("H100-80GB", "H100-80GB", True, "nvlink4"),
        ("H200", "H200", True, "nvlink4"),
        ("A100-40GB", "T4", True, "pcie3"),  # the slower generation of the two
        ("T4", "A100-40GB", True, "pcie3"),
        ("A100-40GB", "A100-80GB", True, "pcie4"),  # different types: no shared NVLink board
        ("A100-40GB", "H100-80GB", True, "pcie4"),
        ("T4", "T4", True, "pcie3"),  # no NVLink on T4
        ("L4", "L4", True, "pcie4"),
        ("H100-80GB", "CPU", True, "pcie5"),  # a CPU endpoint takes the GPU's generation
        ("CPU", "T4", True, "pcie3"),
        ("CPU", "CPU", True, "memcpy"),
        ("A100-40GB", "A100-40GB", False, "network"),
        ("CPU", "CPU", False, "network"),
    ],
)
def test_default_link(src: str, dst: str, same_host: bool, kind: str) -> None:
    link = default_link(get_device_type(src), get_device_type(dst), same_host=same_host)
    assert link.kind == kind
    assert link == get_link_kind(kind)


# --- Roofline ------------------------------------------------------------------------------------


def test_matmul_on_a100_bf16_is_compute_bound() -> None:
    # 4096^3 matmul in bf16: 2*4096^3 = 137,438,953,472 FLOPs / 312e12 = 440.51 us of compute;
    # 3 matrices x 4096^2 x 2 B = 100.7 MB / 1555 GB/s = 64.7 us of memory. Plus one 5 us launch.
    n = 4096
    t = op_time_s(
        flops=2 * n**3,
        bytes_accessed=3 * n * n * 2,
        dtype="bfloat16",
        device=get_device_type("A100-40GB"),
    )
    assert t == pytest.approx(137_438_953_472 / 312e12 + 5e-6, rel=1e-12)
    assert t == pytest.approx(445.51e-6, rel=1e-4)


def test_elementwise_add_is_memory_bound() -> None:
    # float32 add of 2^26 elements: reads 2, writes 1 -> 3 x 4 x 2^26 = 805,306,368 B / 1555 GB/s
    # = 517.88 us; its 2^26 FLOPs take 3.4 us at 19.5 TFLOP/s.
    n = 2**26
    t = op_time_s(
        flops=n, bytes_accessed=12 * n, dtype="float32", device=get_device_type("A100-40GB")
    )
    assert t == pytest.approx(805_306_368 / 1555e9 + 5e-6, rel=1e-12)
    # Doubling the FLOPs of a memory-bound op changes nothing.
    t2 = op_time_s(
        flops=2 * n, bytes_accessed=12 * n, dtype="float32", device=get_device_type("A100-40GB")
    )
    assert t2 == t


def test_t4_is_slower_than_a100_and_h100_faster() -> None:
    work = dict(flops=2 * 2048**3, bytes_accessed=3 * 2048**2 * 2, dtype="float16")
    times = {n: op_time_s(**work, device=get_device_type(n)) for n in ("T4", "A100-40GB", "H100")}
    assert times["T4"] > times["A100-40GB"] > times["H100"]


def test_bf16_on_v100_costs_like_float32() -> None:
    v100 = get_device_type("V100-16GB")
    kwargs = dict(flops=1e12, bytes_accessed=0, device=v100, launches=0)
    assert op_time_s(**kwargs, dtype="bfloat16") == op_time_s(**kwargs, dtype="float32")
    assert op_time_s(**kwargs, dtype="bfloat16") == pytest.approx(1 / 15.7)


def test_zero_work_costs_nothing_and_launches_add_up() -> None:
    a100 = get_device_type("A100-40GB")
    assert op_time_s(flops=0, bytes_accessed=0, dtype="float32", device=a100, launches=0) == 0
    assert op_time_s(flops=0, bytes_accessed=0, dtype="float32", device=a100) == 5e-6
    three = op_time_s(flops=0, bytes_accessed=0, dtype="float32", device=a100, launches=3)
    assert three == pytest.approx(15e-6)


@pytest.mark.parametrize(
    "bad", [dict(flops=-1.0), dict(bytes_accessed=-1.0), dict(launches=-1), dict(flops=math.nan)]
)
def test_op_time_rejects_negative_or_nan(bad: dict[str, float]) -> None:
    kwargs = dict(flops=1.0, bytes_accessed=1.0, dtype="float32", launches=1)
    with pytest.raises(ValueError):
        op_time_s(**{**kwargs, **bad}, device=get_device_type("T4"))


def test_transfer_time() -> None:
    # 1 GB over PCIe 4 x16: 10 us + 1e9 / 31.508e9 = 31.75 ms.
    pcie4 = get_link_kind("pcie4")
    t = transfer_time_s(
        1e9, bandwidth_bytes_per_s=pcie4.bandwidth_bytes_per_s, latency_s=pcie4.latency_s
    )
    assert t == pytest.approx(1e-5 + 1e9 / (16e9 * 16 * 128 / 130 / 8))
    assert transfer_time_s(0, bandwidth_bytes_per_s=1e9, latency_s=2e-6) == 2e-6
    with pytest.raises(ValueError):
        transfer_time_s(1, bandwidth_bytes_per_s=0, latency_s=0)
    with pytest.raises(ValueError):
        transfer_time_s(-1, bandwidth_bytes_per_s=1, latency_s=0)


def test_ring_allreduce() -> None:
    # 100 MB on 4 replicas over 10 Gbps (1.25 GB/s) with 10 us per step: 2 * 3 steps, each
    # moving a quarter: 6/4 * 1e8 / 1.25e9 = 120 ms of bandwidth, 6 * 10 us = 60 us of latency.
    net = {"bandwidth_bytes_per_s": 1.25e9, "latency_s": 1e-5}
    assert ring_allreduce_s(1e8, 4, **net) == pytest.approx(0.12006)
    assert ring_allreduce_s(1e8, 1, **net) == 0.0  # one replica has nothing to reduce
    # Per device it approaches twice the bytes as the ring grows: 2 * 999/1000 * 80 ms.
    assert ring_allreduce_s(1e8, 1000, bandwidth_bytes_per_s=1.25e9, latency_s=0.0) \
        == pytest.approx(0.15984)
    # Element by element on numpy arrays (the PipeDream DP evaluates every stage at once).
    assert ring_allreduce_s(np.array([1e8, 2e8]), np.array([[1], [4]]), **net) \
        == pytest.approx(np.array([[0.0, 0.0], [0.12006, 0.24006]]))
    with pytest.raises(ValueError, match="replicas"):
        ring_allreduce_s(1e8, 0, **net)
    with pytest.raises(ValueError, match="bandwidth"):
        ring_allreduce_s(1e8, 2, bandwidth_bytes_per_s=0.0, latency_s=0.0)


def test_arithmetic_intensity_matches_the_ridge() -> None:
    a100 = get_device_type("A100-40GB")
    ridge = a100.peak_flops_for("bfloat16") / a100.memory_bandwidth_bytes_per_s  # ~200 FLOP/B
    assert cost_models.arithmetic_intensity(flops=2 * 4096**3, bytes_accessed=3 * 4096**2 * 2) > (
        ridge
    )
    assert cost_models.arithmetic_intensity(flops=1, bytes_accessed=12) < ridge
    assert cost_models.arithmetic_intensity(flops=0, bytes_accessed=0) == 0
