"""Cost every node on every device: measured where a profile has it, calibrated where a fit of
the device type exists, analytic otherwise.

The analytic figure is the roofline of ``cost_models``: ``max(flops / peak, bytes / bandwidth) +
launches * overhead`` (``cost_models.roofline.op_time_s``), using the peak for the node's dtype:
a float32 matmul or convolution takes the TF32 tensor-core peak where torch's settings run it
so (``Tf32.from_torch``: cuDNN's convolutions by default, matmuls once the user allows it).
A calibrated figure is the same formula with the efficiency of the node's op family and the
launch overhead fitted to measurements (``cost_models.calibration``). A measured figure is the
median time ``autoplace.profile`` took on the device itself. Input placeholders cost nothing.
Transfer times are not stored here: they follow from edge bytes and the cluster's links.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autoplace.cluster.spec import THREAD_TYPE, WORKER_TYPES
from autoplace.ir import Cluster, Costs, HostCosts, OpGraph, OpNode
from cost_models import get_device_type
from cost_models.calibration import CalibrationFit, op_family
from cost_models.devices import (
    CPU_WORKER_CALL_S,
    CPU_WORKER_DISPATCH_S,
    CPU_WORKER_HANDOVER_S,
    CPU_WORKER_SWITCH_S,
    GPU_HANDOVER_S,
    GPU_SEGMENT_CALL_S,
)
from cost_models.roofline import op_time_s

__all__ = ["SOURCES", "Tf32", "analytic_cpu_note", "analytic_costs", "costs", "host_costs",
           "math_dtype", "node_family", "op_short_name", "tf32_note", "weakest_source"]

# From least to most measured. A group of nodes is as good as its weakest member.
SOURCES = ("analytic", "calibrated", "measured")


def weakest_source(sources: Iterable[str]) -> str:
    """The least measured of ``sources`` (``analytic`` when there are none)."""
    rank = [SOURCES.index(s) if s in SOURCES else 0 for s in sources]
    return SOURCES[min(rank, default=0)]


def op_short_name(target: str) -> str:
    """``aten.addmm.default`` -> ``addmm``; ``module:fc1`` -> ``fc1``; ``relu`` -> ``relu``."""
    if ":" in target:
        return target.split(":", 1)[1].rsplit(".", 1)[-1]
    parts = target.split(".")
    if len(parts) >= 3 and parts[0] in ("aten", "prims", "quantized"):
        return parts[1]
    return parts[-1]


def node_family(node: OpNode) -> str:
    """The op family (``cost_models.calibration.FAMILIES``) of a traced node."""
    return op_family(op_short_name(node.targets[0])) if node.targets else "elementwise"


@dataclass(frozen=True)
class Tf32:
    """Whether float32 matmuls and convolutions run on TF32 tensor cores (Ampere and later),
    as torch decides: ``torch.backends.cuda.matmul.allow_tf32`` or a float32 matmul precision
    of ``high`` or ``medium`` (off by default), and ``torch.backends.cudnn.allow_tf32`` for
    convolutions (on by default). https://pytorch.org/docs/stable/notes/cuda.html
    ("TensorFloat-32 (TF32) on Ampere (and later) devices")."""

    matmul: bool = False
    conv: bool = True

    @classmethod
    def from_torch(cls) -> Tf32:
        import torch

        return cls(matmul=bool(torch.backends.cuda.matmul.allow_tf32)
                   or torch.get_float32_matmul_precision() in ("high", "medium"),
                   conv=bool(torch.backends.cudnn.allow_tf32))


def math_dtype(node: OpNode, tf32: Tf32) -> str:
    """The dtype whose peak prices ``node``'s FLOPs: ``tfloat32`` for a float32 matmul or
    convolution that ``tf32`` runs on TF32 (a device without a TF32 peak falls back to its
    float32 one, ``DeviceType.peak_flops_for``), else the node's own."""
    if node.dtype != "float32":
        return node.dtype
    family = node_family(node)
    if (family == "matmul" and tf32.matmul) or (family == "conv" and tf32.conv):
        return "tfloat32"
    return node.dtype


def tf32_note(graph: OpGraph, cluster: Cluster, costs: Costs, tf32: Tf32, *,
              asked: bool = False) -> str | None:
    """Which float32 ops the plan prices at the GPUs' TF32 peak (where not measured), and why
    (``asked``: ``--dtype tf32``, else torch's settings); ``None`` where none is (no GPU with
    one, or no such op)."""
    gpus = {d.name: d.type for d in cluster.devices
            if "tfloat32" in get_device_type(d.type).peak_flops_per_s}
    priced = [n for n in graph.nodes if not n.is_input and math_dtype(n, tf32) == "tfloat32"
              and any(costs.source_of(n.name, d) != "measured" for d in gpus)]
    kinds = sorted({node_family(n) for n in priced})
    if not gpus or not kinds:
        return None
    why = {"matmul": "matmuls (torch.backends.cuda.matmul.allow_tf32 or "
           "torch.set_float32_matmul_precision('high'))",
           "conv": "convolutions (torch.backends.cudnn.allow_tf32, torch's default)"}
    if asked:
        plural = {"matmul": "matmuls", "conv": "convolutions"}
        return (f"float32 {' and '.join(plural[k] for k in kinds)} are priced at the TF32 "
                "tensor-core peak "
                f"of {', '.join(sorted(set(gpus.values())))} (--dtype tf32): the emitted model "
                "does not turn TF32 on, so set torch.backends.cuda.matmul.allow_tf32 = True "
                "(or torch.set_float32_matmul_precision('high')) and "
                "torch.backends.cudnn.allow_tf32 = True where it runs")
    return (f"float32 {' and '.join(why[k] for k in kinds)} are priced at the TF32 "
            f"tensor-core peak of {', '.join(sorted(set(gpus.values())))}, as torch runs them "
            "there; "
            "set those flags off before planning to plan for full float32")


def analytic_costs(graph: OpGraph, cluster: Cluster) -> Costs:
    """Roofline time of every node of ``graph`` on every device of ``cluster``."""
    return costs(graph, cluster)


def costs(
    graph: OpGraph,
    cluster: Cluster,
    *,
    measured: Mapping[str, Mapping[str, float]] | None = None,
    fits: Mapping[str, CalibrationFit] | None = None,
    launcher: tuple[float, float] | None = None,
    worker: tuple[float, float, float, float] | None = None,
    tf32: Tf32 | None = None,
) -> Costs:
    """Every node's time on every device, and where each figure came from.

    ``measured[node][device]`` (seconds, from a profile) wins; else ``fits[device type]`` gives
    the calibrated roofline; else the analytic roofline, each at ``math_dtype``'s peak
    (``tf32``: which float32 ops run on TF32, default torch's settings now). ``launcher``: the
    GPUs' launcher thread's segment call and handover, measured here (``host_costs``);
    ``worker``: a CPU worker's segment call, handover, op dispatch and interpreter switch,
    measured here.
    """
    measured = measured or {}
    fits = fits or {}
    tf32 = Tf32.from_torch() if tf32 is None else tf32
    device_types = {d.name: get_device_type(d.type) for d in cluster.devices}
    device_fit = {d.name: fits.get(device_types[d.name].name) for d in cluster.devices}
    compute_s: dict[str, dict[str, float]] = {}
    source: dict[str, str] = {}
    device_source: dict[str, dict[str, str]] = {}
    for node in graph.nodes:
        if node.is_input:
            compute_s[node.name] = {name: 0.0 for name in device_types}
            source[node.name] = "analytic"
            continue
        times: dict[str, float] = {}
        kinds: dict[str, str] = {}
        dtype = math_dtype(node, tf32)
        alike: dict[tuple[int, int], str] = {}  # devices of one type and fit: one figure
        for name, device_type in device_types.items():
            fitted = device_fit[name]
            same = alike.setdefault((id(device_type), id(fitted)), name)
            if name in measured.get(node.name, {}):
                times[name], kinds[name] = measured[node.name][name], "measured"
            elif same != name and kinds[same] != "measured":
                times[name], kinds[name] = times[same], kinds[same]
            elif fitted is not None and node.launches:
                times[name] = fitted.op_time_s(
                    family=node_family(node), flops=node.flops,
                    bytes_accessed=node.bytes_accessed, dtype=dtype, device=device_type,
                    launches=node.launches)
                kinds[name] = "calibrated"
            else:
                times[name] = op_time_s(flops=node.flops, bytes_accessed=node.bytes_accessed,
                                        dtype=dtype, device=device_type,
                                        launches=node.launches)
                kinds[name] = "analytic"
        compute_s[node.name] = times
        source[node.name] = weakest_source(kinds.values())
        if len(set(kinds.values())) > 1 or source[node.name] != "analytic":
            device_source[node.name] = kinds
    return Costs(compute_s=compute_s, source=source, device_source=device_source,
                 host=host_costs(graph, cluster, compute_s, fits, launcher=launcher,
                                 worker=worker))


def host_costs(
    graph: OpGraph,
    cluster: Cluster,
    compute_s: Mapping[str, Mapping[str, float]],
    fits: Mapping[str, CalibrationFit] | None = None,
    *,
    launcher: tuple[float, float] | None = None,
    worker: tuple[float, float, float, float] | None = None,
) -> HostCosts | None:
    """What the launcher thread pays for each node on each GPU (``ir.HostCosts``): its launches
    times the per-launch overhead (the calibrated law's for the node's family where a fit of the
    device type exists, else the catalog's ``launch_overhead_s``), at most the node's own time
    there; a segment call and a handover as ``launcher`` measured them here, else the catalog's
    estimates (``GPU_SEGMENT_CALL_S``, ``GPU_HANDOVER_S``). A CPU worker runs on its own thread
    (``own_thread``), holding its process's interpreter for its segment calls, its handovers
    and its ops' dispatch, and paying a switch to take it from another thread (``worker``: the
    four as measured here, else ``CPU_WORKER_CALL_S``, ``CPU_WORKER_HANDOVER_S``,
    ``CPU_WORKER_DISPATCH_S``, ``CPU_WORKER_SWITCH_S``): the ``cpu-thread`` workers of a host
    share one interpreter, each ``cpu-process`` worker has its own (no dispatch charged).
    ``None`` without a GPU or a CPU worker, or for a graph that counts no launches (a
    benchmark's)."""
    fits = fits or {}
    types = {d.name: get_device_type(d.type) for d in cluster.devices}
    launched = {name: device_type for name, device_type in types.items() if device_type.launched}
    own = {d.name: f"{d.host}/python" if types[d.name].name == THREAD_TYPE else d.name
           for d in cluster.devices if types[d.name].name in WORKER_TYPES}
    if not (launched or own) or not any(n.launches for n in graph.nodes):
        return None
    worker_call_s, worker_handover_s, dispatch_s, switch_s = worker or (
        CPU_WORKER_CALL_S, CPU_WORKER_HANDOVER_S, CPU_WORKER_DISPATCH_S, CPU_WORKER_SWITCH_S)
    shared = [name for name, lock in own.items() if lock != name]
    launch_s: dict[str, dict[str, float]] = {}
    for node in graph.nodes:
        if node.is_input or not node.launches:
            continue
        per_device = {name: min(compute_s[node.name][name], node.launches * dispatch_s)
                      for name in shared}
        for name, device_type in launched.items():
            fit = fits.get(device_type.name)
            overhead = (fit.law_of(node_family(node))[0] if fit is not None
                        else device_type.launch_overhead_s)
            per_device[name] = min(compute_s[node.name][name], node.launches * overhead)
        if per_device:
            launch_s[node.name] = per_device
    call_s, handover_s = launcher or (GPU_SEGMENT_CALL_S, GPU_HANDOVER_S)
    return HostCosts(launch_s=launch_s,
                     call_s={**dict.fromkeys(launched, call_s),
                             **dict.fromkeys(own, worker_call_s)},
                     handover_s={**dict.fromkeys(launched, handover_s),
                                 **dict.fromkeys(own, worker_handover_s)},
                     own_thread=own, switch_s=dict.fromkeys(shared, switch_s))


def analytic_cpu_note(graph: OpGraph, cluster: Cluster, costs: Costs) -> str | None:
    """A warning when a CPU's op times are the analytic roofline: its peak figures assume every
    core busy at full vector width, while PyTorch's small CPU ops are dominated by dispatch and
    threading, so the roofline can be orders of magnitude too fast (issue 13 met LeNet at
    50 us predicted against 5.4 ms measured). ``None`` when no CPU has most of its op times
    analytic."""
    cpus = [d.name for d in cluster.devices if get_device_type(d.type).kind == "cpu"]
    ops = [n.name for n in graph.nodes if not n.is_input]
    # Most ops, not any: a profiled CPU leaves a few ops unmeasured (views, ops that failed to
    # time alone), and those few do not make the plan unreliable.
    analytic = [d for d in cpus
                if 2 * sum(costs.source_of(n, d) == "analytic" for n in ops) > len(ops)]
    if not analytic:
        return None
    return (f"op times on {', '.join(analytic)} are analytic (the roofline, not calibrated for "
            "CPUs): they can be far too fast, so plans that use the CPU are unreliable; "
            "profile it (autoplace profile MODEL_FILE --devices cpu, or plan with --profile on "
            "this machine)")
