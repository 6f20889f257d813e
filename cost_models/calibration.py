"""Calibrated roofline: per device type, per op family efficiency factors fitted to measurements.

The analytic roofline (``roofline.op_time_s``) assumes every kernel reaches the datasheet peak.
Real kernels reach a fraction of it that depends mostly on what kind of op they are (a large
matmul gets close to the FLOP peak, an elementwise op to a share of memory bandwidth, a
reduction less) and on the device. Calibration fits that fraction from measured op times:

    t = max(flops / peak, bytes / bandwidth) / efficiency[family] + launches * launch_overhead_s

``efficiency`` per op family and one ``launch_overhead_s`` per device type are fitted by least
squares on relative error (a 10 us op off by 5 us counts as much as a 10 ms op off by 5 ms).
This is the roofline with its two free constants measured rather than assumed, the approach of
e.g. Paleo (H. Qi, E. Sparks, A. Talwalkar, "Paleo: A Performance Model for Deep Neural
Networks", ICLR 2017), which scales peak FLOP/s by a "platform percent of peak" per platform.

Read ``op_family`` (op name -> family), ``Sample`` and ``CalibrationFit``, then ``fit`` and
``CalibrationFit.op_time_s``. Pure Python and numpy: no torch, nothing from ``autoplace``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from cost_models.devices import DeviceType

__all__ = ["FAMILIES", "CalibrationFit", "Sample", "fit", "op_family", "roofline_core_s"]

# Families, and the op names (as ``autoplace.trace`` names them: ``addmm``, ``conv2d``, ...)
# that belong to each. Anything else is "elementwise" when it has few FLOPs per byte, which is
# what most unlisted aten ops are (activations, arithmetic, comparisons).
_FAMILY_OPS: Mapping[str, frozenset[str]] = MappingProxyType({
    "matmul": frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm",
                         "einsum", "_addmm_activation", "dot", "mv", "addmv"}),
    "conv": frozenset({"convolution", "conv1d", "conv2d", "conv3d", "_convolution",
                       "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                       "cudnn_convolution", "mkldnn_convolution"}),
    "attention": frozenset({"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                            "_scaled_dot_product_efficient_attention",
                            "_scaled_dot_product_flash_attention_for_cpu",
                            "_scaled_dot_product_cudnn_attention"}),
    "normalization": frozenset({"layer_norm", "native_layer_norm", "batch_norm",
                                "native_batch_norm", "_native_batch_norm_legit_no_training",
                                "group_norm", "native_group_norm", "rms_norm", "_fused_rms_norm",
                                "instance_norm", "softmax", "_softmax", "log_softmax",
                                "_log_softmax", "_safe_softmax"}),
    "reduction": frozenset({"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin",
                            "cumsum", "cumprod", "prod", "var", "std", "var_mean", "norm",
                            "linalg_vector_norm", "logsumexp", "any", "all", "diff",
                            "max_pool2d", "max_pool1d", "max_pool3d", "avg_pool2d",
                            "avg_pool1d", "avg_pool3d", "adaptive_avg_pool2d",
                            "_adaptive_avg_pool2d", "adaptive_max_pool2d",
                            "max_pool2d_with_indices", "topk", "sort"}),
    "memory": frozenset({"embedding", "index", "index_select", "gather", "scatter", "cat",
                         "stack", "copy", "_to_copy", "to", "clone", "index_put", "masked_fill",
                         "where", "pad", "constant_pad_nd", "repeat", "tril", "triu", "arange",
                         "full", "zeros", "ones", "new_ones", "new_zeros", "zeros_like",
                         "ones_like", "full_like", "empty", "fill", "roll", "flip",
                         "repeat_interleave"}),
})
FAMILIES: tuple[str, ...] = (*_FAMILY_OPS, "elementwise")
_OP_TO_FAMILY = {op: fam for fam, ops in _FAMILY_OPS.items() for op in ops}


def op_family(op_name: str) -> str:
    """The family of an op, by its short name (``addmm``, ``relu``, ``module:fc1`` ...).

    Module calls (from the torch.fx fallback) are classed by the module's type when the caller
    passes it (``Linear`` -> matmul); otherwise as elementwise.
    """
    name = op_name.strip().lower().removesuffix("_")
    if name in _OP_TO_FAMILY:
        return _OP_TO_FAMILY[name]
    for key, fam in (("linear", "matmul"), ("conv", "conv"), ("norm", "normalization"),
                     ("attention", "attention"), ("pool", "reduction"),
                     ("embedding", "memory")):
        if key in name:
            return fam
    return "elementwise"


def roofline_core_s(*, flops: float, bytes_accessed: float, dtype: str,
                    device: DeviceType) -> float:
    """``max(flops / peak, bytes / bandwidth)``: the roofline without its launch term."""
    compute_s = flops / device.peak_flops_for(dtype) if flops else 0.0
    memory_s = bytes_accessed / device.memory_bandwidth_bytes_per_s if bytes_accessed else 0.0
    return max(compute_s, memory_s)


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One measured op: its family, the roofline's core time on the device, launches, and the
    measured median time."""

    family: str
    core_s: float
    launches: int
    measured_s: float

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown op family {self.family!r}; families: {FAMILIES}")
        if not (self.core_s >= 0 and self.measured_s > 0 and self.launches >= 0):
            raise ValueError(f"sample needs core_s >= 0, measured_s > 0 and launches >= 0, got "
                             f"{self.core_s}, {self.measured_s}, {self.launches}")


@dataclass(frozen=True, kw_only=True)
class CalibrationFit:
    """Fitted factors for one device type.

    ``efficiency[family]`` is the fraction of the roofline's peak that family reaches (1.0 would
    be the datasheet); families without samples use ``default_efficiency`` (the fit over all
    samples). ``launch_overhead_s`` replaces the catalog's estimate. ``relative_error`` is the
    median absolute relative error of the fit on its own samples; ``samples`` counts them.
    """

    device_type: str
    efficiency: Mapping[str, float]
    default_efficiency: float
    launch_overhead_s: float
    samples: int
    relative_error: float
    samples_by_family: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for fam, eff in {**self.efficiency, "default": self.default_efficiency}.items():
            if not (eff > 0 and math.isfinite(eff)):
                raise ValueError(f"efficiency for {fam!r} must be positive, got {eff}")
        if not self.launch_overhead_s >= 0:
            raise ValueError(f"launch_overhead_s must be >= 0, got {self.launch_overhead_s}")
        object.__setattr__(self, "efficiency", MappingProxyType(dict(self.efficiency)))
        object.__setattr__(self, "samples_by_family",
                           MappingProxyType(dict(self.samples_by_family)))

    def efficiency_of(self, family: str) -> float:
        return self.efficiency.get(family, self.default_efficiency)

    def op_time_s(self, *, family: str, flops: float, bytes_accessed: float, dtype: str,
                  device: DeviceType, launches: int) -> float:
        """The calibrated time of one op (or a sum of ops of one family) on ``device``."""
        core = roofline_core_s(flops=flops, bytes_accessed=bytes_accessed, dtype=dtype,
                               device=device)
        return core / self.efficiency_of(family) + launches * self.launch_overhead_s

    def to_dict(self) -> dict:
        return {"device_type": self.device_type, "efficiency": dict(self.efficiency),
                "default_efficiency": self.default_efficiency,
                "launch_overhead_s": self.launch_overhead_s, "samples": self.samples,
                "relative_error": self.relative_error,
                "samples_by_family": dict(self.samples_by_family)}

    @classmethod
    def from_dict(cls, data: Mapping) -> CalibrationFit:
        return cls(device_type=data["device_type"], efficiency=data["efficiency"],
                   default_efficiency=data["default_efficiency"],
                   launch_overhead_s=data["launch_overhead_s"], samples=data["samples"],
                   relative_error=data["relative_error"],
                   samples_by_family=data.get("samples_by_family", {}))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _solve_nonnegative(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: solve, drop the negative ones, solve again
    (a small active-set loop; the systems here have at most a handful of columns)."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active = [c for c, v in zip(active, sol) if v > 0]
    return x


def fit(device_type: str, samples: Sequence[Sample] | Iterable[Sample]) -> CalibrationFit:
    """Fit efficiencies and a launch overhead to ``samples`` measured on one device type.

    Model: ``measured ~ sum_f [family == f] * core_s / eff_f + launches * overhead``, linear in
    ``1 / eff_f`` and ``overhead``; rows are divided by ``measured`` so the residual is relative.
    Raises ``ValueError`` without samples.
    """
    samples = [s for s in samples if s.measured_s > 0]
    if not samples:
        raise ValueError(f"no samples to calibrate {device_type!r} with")
    families = sorted({s.family for s in samples if s.core_s > 0})
    col = {f: i for i, f in enumerate(families)}
    n_cols = len(families) + 1
    a = np.zeros((len(samples), n_cols))
    b = np.ones(len(samples))
    for i, s in enumerate(samples):
        if s.family in col:
            a[i, col[s.family]] = s.core_s / s.measured_s
        a[i, -1] = s.launches / s.measured_s
    x = _solve_nonnegative(a, b)
    overhead = float(x[-1])
    efficiency = {f: 1.0 / float(x[col[f]]) for f in families if x[col[f]] > 0}
    # The pooled factor for families never measured: one column for all core time.
    pooled = np.stack([a[:, :-1].sum(axis=1), a[:, -1]], axis=1)
    px = _solve_nonnegative(pooled, b)
    default = 1.0 / float(px[0]) if px[0] > 0 else 1.0
    counts: dict[str, int] = {}
    for s in samples:
        counts[s.family] = counts.get(s.family, 0) + 1
    partial = CalibrationFit(device_type=device_type, efficiency=efficiency,
                             default_efficiency=default, launch_overhead_s=overhead,
                             samples=len(samples), relative_error=0.0,
                             samples_by_family=counts)
    errors = sorted(abs(_predict(partial, s) - s.measured_s) / s.measured_s for s in samples)
    return CalibrationFit(**{**partial.__dict__, "relative_error": errors[len(errors) // 2]})


def _predict(fitted: CalibrationFit, s: Sample) -> float:
    return s.core_s / fitted.efficiency_of(s.family) + s.launches * fitted.launch_overhead_s
