"""Calibrated roofline: per device type, per op family efficiency fitted to measurements.

The analytic roofline (``roofline.op_time_s``) assumes every kernel reaches the datasheet peak.
Real kernels reach a fraction of it, and the fraction depends on what kind of op it is (a matmul
gets closer to the FLOP peak than a pooling layer gets to the bandwidth peak) and on its size
(small ops are dominated by fixed costs: dispatch, thread wake-up, launch). Calibration fits,
per device type and op family, the roofline's core time ``c = max(flops / peak, bytes /
bandwidth)`` to measured times with a power law:

    t = exp(log_scale[family]) * c ** exponent[family]

so the family's efficiency, ``c / t``, is a factor that grows with the op's size when
``exponent < 1`` and is constant (``exp(-log_scale)``) when ``exponent == 1``, the plain
"percent of peak" of e.g. Paleo (H. Qi, E. Sparks, A. Talwalkar, "Paleo: A Performance Model
for Deep Neural Networks", ICLR 2017). The fit is least squares in log space (relative error),
each op weighted by the square root of its time so that the ops that dominate a model's total
count more than the many tiny ones, without letting one op decide. Exponents are kept within
[0.5, 1.1]; a family with fewer than ``MIN_FAMILY_SAMPLES`` ops uses the fit over all families.

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
    """One measured op: its family, the roofline's core time on the device, and the measured
    median time."""

    family: str
    core_s: float
    measured_s: float
    launches: int = 1

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown op family {self.family!r}; families: {FAMILIES}")
        if not (self.core_s >= 0 and self.measured_s > 0 and self.launches >= 0):
            raise ValueError(f"sample needs core_s >= 0, measured_s > 0 and launches >= 0, got "
                             f"{self.core_s}, {self.measured_s}, {self.launches}")


@dataclass(frozen=True, kw_only=True)
class CalibrationFit:
    """Fitted factors for one device type.

    ``laws[family]`` is ``(log_scale, exponent)``; families without enough samples use
    ``pooled``. ``relative_error`` is the median absolute relative error of the fit on its own
    samples; ``samples`` counts them.
    """

    device_type: str
    laws: Mapping[str, tuple[float, float]]
    pooled: tuple[float, float]
    samples: int
    relative_error: float
    samples_by_family: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for fam, (scale, exponent) in {**self.laws, "pooled": self.pooled}.items():
            if not (math.isfinite(scale) and EXPONENT_RANGE[0] <= exponent <= EXPONENT_RANGE[1]):
                raise ValueError(f"law for {fam!r} must have a finite scale and an exponent in "
                                 f"{EXPONENT_RANGE}, got {(scale, exponent)}")
        object.__setattr__(self, "laws", MappingProxyType(
            {f: (float(a), float(b)) for f, (a, b) in self.laws.items()}))
        object.__setattr__(self, "pooled", (float(self.pooled[0]), float(self.pooled[1])))
        object.__setattr__(self, "samples_by_family",
                           MappingProxyType(dict(self.samples_by_family)))

    def law_of(self, family: str) -> tuple[float, float]:
        return self.laws.get(family, self.pooled)

    def time_of_core(self, family: str, core_s: float) -> float:
        """Seconds an op of ``family`` with roofline core time ``core_s`` takes."""
        scale, exponent = self.law_of(family)
        return math.exp(scale) * max(core_s, _TINY_S) ** exponent

    def efficiency_of(self, family: str, core_s: float) -> float:
        """The fraction of the roofline's peak an op of this family and size reaches."""
        return core_s / self.time_of_core(family, core_s)

    def op_time_s(self, *, family: str, flops: float, bytes_accessed: float, dtype: str,
                  device: DeviceType, launches: int) -> float:
        """The calibrated time of one op on ``device``; 0 for an op that launches nothing."""
        if not launches:
            return 0.0
        core = roofline_core_s(flops=flops, bytes_accessed=bytes_accessed, dtype=dtype,
                               device=device)
        return self.time_of_core(family, core)

    def to_dict(self) -> dict:
        return {"device_type": self.device_type,
                "laws": {f: list(law) for f, law in self.laws.items()},
                "pooled": list(self.pooled), "samples": self.samples,
                "relative_error": self.relative_error,
                "samples_by_family": dict(self.samples_by_family)}

    @classmethod
    def from_dict(cls, data: Mapping) -> CalibrationFit:
        return cls(device_type=data["device_type"],
                   laws={f: tuple(law) for f, law in data["laws"].items()},
                   pooled=tuple(data["pooled"]), samples=data["samples"],
                   relative_error=data["relative_error"],
                   samples_by_family=data.get("samples_by_family", {}))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


MIN_FAMILY_SAMPLES = 3
EXPONENT_RANGE = (0.5, 1.1)
_TINY_S = 1e-12  # an op whose roofline time is 0 (it moves nothing) still costs its floor


def _power_law(samples: Sequence[Sample]) -> tuple[float, float]:
    """``(log_scale, exponent)`` by weighted least squares on ``log t = a + b log c``; the
    exponent clamped to ``EXPONENT_RANGE`` (and the scale refitted with it)."""
    x = np.log([max(s.core_s, _TINY_S) for s in samples])
    y = np.log([s.measured_s for s in samples])
    t = np.array([s.measured_s for s in samples])
    w = np.sqrt(t / t.max())
    if len(samples) >= 2 and np.ptp(x) > 0:
        design = np.stack([np.ones_like(x), x], axis=1) * np.sqrt(w)[:, None]
        (a, b), *_ = np.linalg.lstsq(design, y * np.sqrt(w), rcond=None)
    else:
        a, b = 0.0, 1.0
    if not EXPONENT_RANGE[0] <= b <= EXPONENT_RANGE[1] or len(samples) < 2 or np.ptp(x) == 0:
        b = min(max(b, EXPONENT_RANGE[0]), EXPONENT_RANGE[1])
        a = float(np.sum(w * (y - b * x)) / np.sum(w))
    return float(a), float(b)


def fit(device_type: str, samples: Sequence[Sample] | Iterable[Sample]) -> CalibrationFit:
    """Fit a power law per op family (and one over all) to ``samples`` measured on one device
    type (see the module docstring). Raises ``ValueError`` without samples."""
    samples = [s for s in samples if s.measured_s > 0]
    if not samples:
        raise ValueError(f"no samples to calibrate {device_type!r} with")
    by_family: dict[str, list[Sample]] = {}
    for s in samples:
        by_family.setdefault(s.family, []).append(s)
    laws = {f: _power_law(group) for f, group in sorted(by_family.items())
            if len(group) >= MIN_FAMILY_SAMPLES}
    partial = CalibrationFit(device_type=device_type, laws=laws, pooled=_power_law(samples),
                             samples=len(samples), relative_error=0.0,
                             samples_by_family={f: len(g) for f, g in by_family.items()})
    errors = sorted(abs(partial.time_of_core(s.family, s.core_s) - s.measured_s) / s.measured_s
                    for s in samples)
    return CalibrationFit(**{**partial.__dict__, "relative_error": errors[len(errors) // 2]})
