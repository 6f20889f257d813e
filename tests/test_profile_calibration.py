"""Calibration: known efficiencies are recovered from synthetic measurements, an unmeasured
device type borrows its kind's fit (never the other kind's), and costs say where they came from.
Link fitting recovers a known latency and bandwidth."""

from __future__ import annotations

import math
import random

import pytest

from autoplace.cluster import resolve_cluster
from autoplace.ir import Edge, OpGraph, OpNode
from autoplace.profile.cache import OpRecord
from autoplace.profile.calibrate import fit_from_records, fits_for
from autoplace.profile.cost import costs, node_family, op_short_name, weakest_source
from autoplace.profile.links import fit_alpha_beta
from cost_models import get_device_type
from cost_models.calibration import CalibrationFit, Sample, fit, op_family, roofline_terms

# (overhead_s, compute_factor, memory_factor) per family: t = overhead + max(compute_factor *
# flops / peak, memory_factor * bytes / bandwidth). Factor ratios are on the fit's grid (1, 10).
TRUE_LAWS = {"matmul": (5e-6, 2.0, 20.0), "elementwise": (2e-6, 1.0, 10.0),
             "normalization": (1e-6, 5.0, 5.0)}


def synthetic(noise: float = 0.0, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    samples = []
    for family, (overhead, compute_factor, memory_factor) in TRUE_LAWS.items():
        for _ in range(12):
            compute_s, memory_s = 10 ** rng.uniform(-7, -3), 10 ** rng.uniform(-7, -3)
            t = overhead + max(compute_factor * compute_s, memory_factor * memory_s)
            samples.append(Sample(family=family, compute_s=compute_s, memory_s=memory_s,
                                  measured_s=t * (1 + rng.uniform(-noise, noise))))
    return samples


def test_fit_recovers_known_overheads_and_efficiencies():
    fitted = fit("CPU", synthetic())
    for family, law in TRUE_LAWS.items():
        assert fitted.laws[family] == pytest.approx(law, rel=1e-6)
    assert fitted.efficiencies("matmul") == pytest.approx((0.5, 0.05))
    assert fitted.relative_error < 1e-9 and fitted.samples == 36
    # A family never measured uses the law fitted to all samples.
    assert fitted.law_of("conv") == fitted.pooled
    # Small ops are their overhead; large ones their slower side of the roofline.
    assert fitted.time_of("matmul", compute_s=0, memory_s=1e-9) == pytest.approx(5e-6 + 2e-8)
    assert fitted.time_of("matmul", compute_s=1e-3, memory_s=1e-5, launches=2) == \
        pytest.approx(2 * 5e-6 + 2e-3)


def test_fit_with_noise_stays_close():
    fitted = fit("CPU", synthetic(noise=0.1, seed=3))
    for family, law in TRUE_LAWS.items():
        assert fitted.laws[family][1:] == pytest.approx(law[1:], rel=0.3)
    assert 0.01 < fitted.relative_error < 0.1


def test_a_family_with_too_few_samples_uses_the_pooled_law_and_no_factor_beats_the_peak():
    few = [Sample(family="conv", compute_s=1e-4, memory_s=0, measured_s=1e-3)] * 3
    # Faster than the datasheet (measured at half the roofline): factors stay at 1.
    fast = [Sample(family="matmul", compute_s=c, memory_s=c / 10, measured_s=c / 2)
            for c in (1e-5, 1e-4, 1e-3, 1e-2)]
    fitted = fit("CPU", few + fast)
    assert "conv" not in fitted.laws and fitted.samples_by_family == {"conv": 3, "matmul": 4}
    assert min(fitted.laws["matmul"][1:]) >= 1 and fitted.laws["matmul"][0] >= 0


def test_fit_needs_samples_and_a_serialised_fit_reads_back_but_not_an_older_form():
    with pytest.raises(ValueError, match="no samples"):
        fit("CPU", [])
    fitted = fit("CPU", synthetic())
    assert CalibrationFit.from_dict(fitted.to_dict()) == fitted
    older = {**fitted.to_dict(), "laws": {"matmul": [0.5, 0.9]}, "pooled": [1.0, 1.0]}
    with pytest.raises(ValueError, match="must be"):
        CalibrationFit.from_dict(older)


def test_records_from_the_cache_fit_through_the_catalog_peaks():
    cpu = get_device_type("CPU")
    records = []
    sizes = [(1e9, 1e6), (4e9, 2e6), (2e8, 1e7), (8e9, 1e8), (0, 4e6), (0, 8e6), (0, 1e5),
             (0, 3e7)]
    for i, (flops, nbytes) in enumerate(sizes):
        compute_s, memory_s = roofline_terms(flops=flops, bytes_accessed=nbytes,
                                             dtype="float32", device=cpu)
        family = "matmul" if flops else "elementwise"
        overhead, compute_factor, memory_factor = TRUE_LAWS[family]
        records.append(OpRecord(
            signature=str(i), device_key="k", device_type="CPU", family=family,
            dtype="float32", flops=flops, bytes_accessed=nbytes, launches=1,
            median_s=overhead + max(compute_factor * compute_s, memory_factor * memory_s),
            spread=0.0, samples=5, param_bytes=0, output_bytes=0, workspace_bytes=None))
    fitted = fit_from_records("CPU", records)
    assert fitted.laws["matmul"] == pytest.approx(TRUE_LAWS["matmul"], rel=1e-6)
    assert fit_from_records("CPU", []) is None


def _law_fit(device_type: str, factor: float, samples: int) -> CalibrationFit:
    law = (0.0, factor, factor)
    return CalibrationFit(device_type=device_type, laws={"matmul": law}, pooled=law,
                          samples=samples, relative_error=0.1)


def test_an_unmeasured_gpu_borrows_a_measured_gpus_efficiencies_but_never_the_cpus():
    h200 = _law_fit("H200", 1.5, 50)
    cpu = _law_fit("CPU", 40.0, 80)
    cluster = resolve_cluster(spec="2xA100-40GB,cpu")[0]
    chosen, notes = fits_for(cluster, {"H200": h200, "CPU": cpu})
    assert chosen["CPU"] == cpu
    assert chosen["A100-40GB"].laws == h200.laws
    assert chosen["A100-40GB"].device_type == "A100-40GB"
    assert "measured on H200" in notes[0]
    chosen, _ = fits_for(cluster, {"CPU": cpu})
    assert "A100-40GB" not in chosen


def test_alike_devices_share_a_figure_but_not_one_measured_on_one_of_them():
    """Devices of one type (and fit) get one analytic figure, worked out once; a time measured
    on one of them is that device's alone."""
    graph = OpGraph(nodes=(
        OpNode(name="x", is_input=True, output_bytes=400),
        OpNode(name="mm", targets=("aten.addmm.default",), flops=2e9, bytes_accessed=4e6,
               launches=1, output_bytes=400),
    ), edges=(Edge("x", "mm", 400),))
    cluster = resolve_cluster(spec="3xA100-40GB")[0]
    analytic = costs(graph, cluster).of("mm", "cuda:0")
    result = costs(graph, cluster, measured={"mm": {"cuda:0": 0.25}})
    assert result.of("mm", "cuda:0") == 0.25 and result.source_of("mm", "cuda:0") == "measured"
    for device in ("cuda:1", "cuda:2"):
        assert result.of("mm", device) == analytic and result.source_of("mm", device) == (
            "analytic")
    result = costs(graph, cluster, measured={"mm": {"cuda:1": 0.25}})
    assert [result.of("mm", d) for d in ("cuda:0", "cuda:1", "cuda:2")] == [
        analytic, 0.25, analytic]


def test_costs_prefer_measured_then_calibrated_then_analytic():
    graph = OpGraph(nodes=(
        OpNode(name="x", is_input=True, output_bytes=400),
        OpNode(name="mm", targets=("aten.addmm.default",), flops=2e9, bytes_accessed=4e6,
               launches=1, output_bytes=400),
        OpNode(name="view", targets=("aten.view.default",), output_bytes=400),
    ), edges=(Edge("x", "mm", 400), Edge("mm", "view", 400)))
    cluster = resolve_cluster(spec="A100-40GB,cpu")[0]
    cpu_fit = _law_fit("CPU", 2.0, 3)  # half the roofline's peaks
    result = costs(graph, cluster, measured={"mm": {"cpu": 0.25}}, fits={"CPU": cpu_fit})
    assert result.of("mm", "cpu") == 0.25 and result.source_of("mm", "cpu") == "measured"
    assert result.source_of("mm", "cuda:0") == "analytic"
    assert result.source["mm"] == "analytic"
    result = costs(graph, cluster, fits={"CPU": cpu_fit})
    core = max(roofline_terms(flops=2e9, bytes_accessed=4e6, dtype="float32",
                              device=get_device_type("CPU")))
    assert result.of("mm", "cpu") == pytest.approx(core / 0.5)
    assert result.source_of("mm", "cpu") == "calibrated"
    # A view launches nothing: zero under every model, so coarsening still folds it.
    assert result.of("view", "cpu") == 0 and result.of("view", "cuda:0") == 0
    plain = costs(graph, cluster)
    assert plain.device_source == {} and set(plain.source.values()) == {"analytic"}


def test_op_names_and_families():
    assert op_short_name("aten.addmm.default") == "addmm"
    assert op_short_name("module:block.fc1") == "fc1"
    assert op_family("addmm") == "matmul" and op_family("conv2d") == "conv"
    assert op_family("layer_norm") == "normalization" and op_family("relu") == "elementwise"
    assert op_family("scaled_dot_product_attention") == "attention"
    assert node_family(OpNode(name="e", targets=("aten.embedding.default",))) == "memory"
    assert op_family("max_pool2d") == "pooling" and op_family("mean") == "reduction"
    assert weakest_source(["measured", "calibrated"]) == "calibrated"
    assert weakest_source([]) == "analytic"


def test_link_fit_recovers_latency_and_bandwidth():
    points = [(n, 2e-5 + n / 12e9) for n in (4096, 65536, 1 << 20, 16 << 20)]
    latency, bandwidth = fit_alpha_beta(points)
    assert latency == pytest.approx(2e-5, rel=1e-6)
    assert bandwidth == pytest.approx(12e9, rel=1e-6)
    latency, bandwidth = fit_alpha_beta([(1000, 1e-7), (2000, 2e-7)])
    assert latency == 0 and math.isclose(bandwidth, 1e10, rel_tol=1e-6)
    with pytest.raises(ValueError, match="two sizes"):
        fit_alpha_beta([(1000, 1e-6)])


def test_a_side_a_family_never_shows_takes_the_pooled_factor():
    # Elementwise ops count no FLOPs, so their compute factor is unknown: the pooled one (here
    # the matmuls') stands in, rather than whatever made the fit happiest (it is free).
    samples = [Sample(family="elementwise", compute_s=0.0, memory_s=1e-5 * i,
                      measured_s=3e-5 * i + 5e-6) for i in range(1, 10)]
    samples += [Sample(family="matmul", compute_s=1e-5 * i, memory_s=1e-6 * i,
                       measured_s=2e-5 * i + 5e-6) for i in range(1, 10)]
    fitted = fit("CPU", samples)
    overhead, compute_factor, memory_factor = fitted.laws["elementwise"]
    assert overhead == pytest.approx(5e-6) and memory_factor == pytest.approx(3.0)
    assert compute_factor == fitted.pooled[1]
    assert fitted.laws["matmul"] == pytest.approx((5e-6, 2.0, fitted.laws["matmul"][2]))


def test_a_memory_factor_of_one_is_not_rounded_below_one():
    # Laws whose factors' ratio is a grid ratio r with 1 / r * r < 1 in floating point (seen on
    # an H200's pools: memory factor 0.9999999999999999, which the law's own check refused):
    # a compute factor 1 / r and a memory factor of exactly 1. The measurements sit a little
    # below that law, so the fit presses the factors onto their bound.
    rng = random.Random(0)
    ratio = 0.05011872336272725
    samples = []
    for _ in range(24):
        compute_s, memory_s = rng.uniform(1e-6, 1e-3), rng.uniform(1e-6, 1e-3)
        measured = 2e-6 + 0.999 * max(compute_s / ratio, memory_s)
        samples.append(Sample(family="pooling", compute_s=compute_s, memory_s=memory_s,
                              launches=1, measured_s=measured))
    fitted = fit("H200", samples)
    overhead, compute_factor, memory_factor = fitted.laws["pooling"]
    assert memory_factor >= 1.0 and memory_factor == pytest.approx(1.0)
    assert compute_factor == pytest.approx(1 / ratio, rel=1e-3)


def test_float32_matmuls_and_convolutions_are_priced_at_tf32_where_torch_runs_them_so() -> None:
    """On an A100 a float32 convolution runs on TF32 tensor cores by torch's default (cuDNN's
    allow_tf32), a float32 matmul only once the user allows it; a CPU has no TF32 peak."""
    from autoplace.profile.cost import Tf32, math_dtype, tf32_note

    cluster, _ = resolve_cluster(spec="A100-40GB,cpu")
    flops = 2e12  # compute-bound: the peak decides
    conv = OpNode(name="conv", targets=("aten.convolution.default",), flops=flops,
                  bytes_accessed=1e6, dtype="float32", launches=1)
    mm = OpNode(name="mm", targets=("aten.addmm.default",), flops=flops, bytes_accessed=1e6,
                dtype="float32", launches=1)
    half = OpNode(name="half", targets=("aten.addmm.default",), flops=flops,
                  bytes_accessed=1e6, dtype="bfloat16", launches=1)
    graph = OpGraph(name="g", nodes=(conv, mm, half), edges=())
    a100 = get_device_type("A100-40GB")
    default, allowed = Tf32(), Tf32(matmul=True, conv=True)
    assert (math_dtype(conv, default), math_dtype(mm, default)) == ("tfloat32", "float32")
    assert math_dtype(mm, allowed) == "tfloat32" and math_dtype(half, allowed) == "bfloat16"
    priced = costs(graph, cluster, tf32=default)
    launch = a100.launch_overhead_s
    assert math.isclose(priced.of("conv", "cuda:0"), flops / 156e12 + launch, rel_tol=1e-6)
    assert math.isclose(priced.of("mm", "cuda:0"), flops / 19.5e12 + launch, rel_tol=1e-6)
    assert math.isclose(costs(graph, cluster, tf32=allowed).of("mm", "cuda:0"),
                        flops / 156e12 + launch, rel_tol=1e-6)
    # the CPU has no TF32: its float32 peak either way
    assert costs(graph, cluster, tf32=allowed).of("mm", "cpu") == priced.of("mm", "cpu")
    said = tf32_note(graph, cluster, priced, default)
    assert said is not None and said.startswith("float32 convolutions (torch.backends.cudnn")
    assert "A100-40GB" in said and "matmuls" not in said
    assert tf32_note(graph, cluster, priced, Tf32(matmul=False, conv=False)) is None
    asked = tf32_note(graph, cluster, priced, allowed, asked=True)
    assert asked.startswith("float32 convolutions and matmuls are priced at the TF32")
    assert "(--dtype tf32)" in asked and "the emitted model does not turn TF32 on" in asked


def test_dtype_tf32_plans_float32_with_its_matmuls_on_tf32_cores() -> None:
    """--dtype tf32 is float32 (the bytes) whose matmuls are priced at the TF32 peak whatever
    torch's settings say; float32 follows the settings (here: matmuls off, torch's default)."""
    import torch
    from torch import nn

    from autoplace.config import Config, Cost, DType, Emit, Solve
    from autoplace.pipeline import plan

    assert (Config(dtype="tf32").dtype, Config(dtype="tf32").cost.tf32) == (DType.FLOAT32, True)
    assert Config(dtype="tf32", cost=Cost(profile=False)).cost.profile is False
    assert Config(dtype="float32").cost.tf32 is None
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096)).eval()
    args = (torch.randn(512, 4096),)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default
    try:
        found = {dtype: plan(model, args, Config(
            devices="A100-40GB", dtype=dtype, emit=Emit(model=False, verify=False),
            solve=Solve(time_limit_s=1))).plan for dtype in ("float32", "tf32")}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert found["tf32"].makespan_s < found["float32"].makespan_s / 3  # 156 against 19.5 TF/s
    assert all(n.dtype == "float32" for n in found["tf32"].problem.graph.nodes if n.flops)
    assert any("(--dtype tf32)" in n for n in found["tf32"].notes)
