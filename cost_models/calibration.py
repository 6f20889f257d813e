"""Calibrated roofline: per device type, per op family efficiencies fitted to measurements.

Kernels reach a fraction of the peaks the analytic roofline assumes, so its numbers are fitted:

    t = launches * overhead[family]
        + max(compute_factor[family] * flops / peak, memory_factor[family] * bytes / bandwidth)

``1 / compute_factor`` and ``1 / memory_factor`` are efficiencies against each side of the
roofline, Paleo's "percent of peak" (H. Qi, E. Sparks, A. Talwalkar, "Paleo: A Performance Model
for Deep Neural Networks", ICLR 2017); ``overhead`` is one kernel's fixed cost; factors are at
least 1. The fit minimises each op's squared relative error weighted by the square root of its
time, exactly for each factor ratio of a grid (``_RATIOS``); a family short of
``MIN_FAMILY_SAMPLES`` ops, or missing a side, borrows from the law fitted to all (the details:
``docs/profiling.md``, "Calibration"). Read ``op_family``, ``Sample``, ``CalibrationFit``, then
``fit``, ``CalibrationFit.op_time_s``. Pure Python and numpy: no torch, nothing from autoplace.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from cost_models.devices import DeviceType
from cost_models.roofline import roofline_terms

__all__ = ["FAMILIES", "POOLING_OPS", "CalibrationFit", "Law", "Sample", "fit", "op_family",
           "roofline_terms"]

POOLING_OPS = frozenset({
    "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices",
    "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d",
    "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d"})

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
                            "linalg_vector_norm", "logsumexp", "any", "all", "diff", "topk",
                            "sort"}),
    # Windows: each output reads a kernel's worth of inputs (``autoplace.trace`` counts those
    # reads as the op's FLOPs, which the FLOP counter leaves at zero).
    "pooling": frozenset(POOLING_OPS),
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
                     ("attention", "attention"), ("pool", "pooling"),
                     ("embedding", "memory")):
        if key in name:
            return fam
    return "elementwise"


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One measured op: its family, the roofline's two sides on the device (``compute_s =
    flops / peak``, ``memory_s = bytes / bandwidth``), its kernel launches and the measured
    median time."""

    family: str
    compute_s: float
    memory_s: float
    measured_s: float
    launches: int = 1

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown op family {self.family!r}; families: {FAMILIES}")
        if not (self.compute_s >= 0 and self.memory_s >= 0 and self.measured_s > 0
                and self.launches >= 0):
            raise ValueError(f"sample needs compute_s >= 0, memory_s >= 0, measured_s > 0 and "
                             f"launches >= 0, got {self.compute_s}, {self.memory_s}, "
                             f"{self.measured_s}, {self.launches}")


Law = tuple[float, float, float]
"""``(overhead_s, compute_factor, memory_factor)``: see the module docstring."""


@dataclass(frozen=True, kw_only=True)
class CalibrationFit:
    """Fitted laws for one device type.

    ``laws[family]`` is ``(overhead_s, compute_factor, memory_factor)``; families without
    enough samples use ``pooled``. ``relative_error`` is the median absolute relative error of
    the fit on its own samples; ``samples`` counts them.
    """

    device_type: str
    laws: Mapping[str, Law]
    pooled: Law
    samples: int
    relative_error: float
    samples_by_family: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for fam, law in {**self.laws, "pooled": self.pooled}.items():
            if len(law) != 3 or not all(math.isfinite(x) for x in law) or law[0] < 0 \
                    or min(law[1:]) < 1:
                raise ValueError(f"law for {fam!r} must be (overhead_s >= 0, compute_factor >= "
                                 f"1, memory_factor >= 1), got {tuple(law)}")
        object.__setattr__(self, "laws", MappingProxyType(
            {f: _as_law(law) for f, law in self.laws.items()}))
        object.__setattr__(self, "pooled", _as_law(self.pooled))
        object.__setattr__(self, "samples_by_family",
                           MappingProxyType(dict(self.samples_by_family)))

    def law_of(self, family: str) -> Law:
        return self.laws.get(family, self.pooled)

    def time_of(self, family: str, *, compute_s: float, memory_s: float,
                launches: int = 1) -> float:
        """Seconds an op of ``family`` takes, given the roofline's two sides."""
        return _law_time(self.law_of(family), launches, compute_s, memory_s)

    def efficiencies(self, family: str) -> tuple[float, float]:
        """The fractions of the FLOP peak and of the bandwidth that ``family`` reaches."""
        _, compute_factor, memory_factor = self.law_of(family)
        return 1.0 / compute_factor, 1.0 / memory_factor

    def op_time_s(self, *, family: str, flops: float, bytes_accessed: float, dtype: str,
                  device: DeviceType, launches: int) -> float:
        """The calibrated time of one op on ``device``; 0 for an op that launches nothing."""
        if not launches:
            return 0.0
        compute_s, memory_s = roofline_terms(flops=flops, bytes_accessed=bytes_accessed,
                                             dtype=dtype, device=device)
        return self.time_of(family, compute_s=compute_s, memory_s=memory_s, launches=launches)

    def to_dict(self) -> dict:
        return {"device_type": self.device_type,
                "laws": {f: list(law) for f, law in self.laws.items()},
                "pooled": list(self.pooled), "samples": self.samples,
                "relative_error": self.relative_error,
                "samples_by_family": dict(self.samples_by_family)}

    @classmethod
    def from_dict(cls, data: Mapping) -> CalibrationFit:
        """The fit ``to_dict`` wrote. Raises ``ValueError`` (or ``KeyError``/``TypeError``) on
        anything else, e.g. a fit of an older form: the cache then fits again."""
        return cls(device_type=data["device_type"],
                   laws={f: tuple(law) for f, law in data["laws"].items()},
                   pooled=tuple(data["pooled"]), samples=data["samples"],
                   relative_error=data["relative_error"],
                   samples_by_family=data.get("samples_by_family", {}))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


MIN_FAMILY_SAMPLES = 4
# memory_factor / compute_factor, searched from "compute bound unless the op moves 1000x more
# bytes than the peaks balance" to the reverse.
_RATIOS = np.geomspace(1e-3, 1e3, 61)


def _as_law(law: Sequence[float]) -> Law:
    overhead, compute_factor, memory_factor = (float(x) for x in law)
    return overhead, compute_factor, memory_factor


def _law_time(law: Law, launches: int, compute_s: float, memory_s: float) -> float:
    overhead, compute_factor, memory_factor = law
    return launches * overhead + max(compute_factor * compute_s, memory_factor * memory_s)


def _bounded_affine(x0: np.ndarray, x1: np.ndarray, w: np.ndarray, min_slope: float
                    ) -> tuple[float, float, float]:
    """``(a, b, residual)`` minimising ``sum w (a x0 + b x1 - 1)^2`` over ``a >= 0``,
    ``b >= min_slope``: a convex problem in two variables, so the optimum is the unconstrained
    one when feasible, else the best of the two bounds each optimised over the other variable."""
    def residual(a: float, b: float) -> float:
        return float(np.sum(w * (a * x0 + b * x1 - 1.0) ** 2))

    design = np.stack([x0, x1], axis=1) * np.sqrt(w)[:, None]
    (a, b), *_ = np.linalg.lstsq(design, np.sqrt(w), rcond=None)
    if a >= 0 and b >= min_slope:
        return float(a), float(b), residual(a, b)
    candidates = []
    s00, s11 = float(np.sum(w * x0 * x0)), float(np.sum(w * x1 * x1))
    # b at its bound, a free (but >= 0):
    a_b = max(0.0, float(np.sum(w * x0 * (1.0 - min_slope * x1))) / s00) if s00 > 0 else 0.0
    candidates.append((a_b, min_slope))
    # a at 0, b free (but >= min_slope):
    b_a = max(min_slope, float(np.sum(w * x1)) / s11) if s11 > 0 else min_slope
    candidates.append((0.0, b_a))
    return min(((a, b, residual(a, b)) for a, b in candidates), key=lambda c: c[2])


def _fit_law(samples: Sequence[Sample]) -> Law:
    """The law of ``samples`` (see the module docstring): for each ratio of the factors, the
    best overhead and compute factor; the ratio with the least weighted relative error."""
    measured = np.array([s.measured_s for s in samples])
    launches = np.array([float(s.launches) for s in samples]) / measured
    compute = np.array([s.compute_s for s in samples]) / measured
    memory = np.array([s.memory_s for s in samples]) / measured
    w = np.sqrt(measured / measured.max())
    best: tuple[float, Law] | None = None
    # Ratios nearest 1 first, so that among equally good ones (a side the samples say nothing
    # about) the factors stay alike.
    for ratio in sorted(_RATIOS, key=lambda r: abs(math.log(r))):
        core = np.maximum(compute, ratio * memory)
        # Both factors at least 1: compute_factor >= max(1, 1 / ratio).
        overhead, factor, res = _bounded_affine(launches, core, w, max(1.0, 1.0 / ratio))
        if best is None or res < best[0] * (1 - 1e-9) - 1e-15:
            # factor >= 1 / ratio, so factor * ratio >= 1 but for rounding (0.9999999999999999
            # was seen on an H200's pools, and the law's check refused it).
            best = (res, (overhead, factor, max(1.0, factor * ratio)))
    assert best is not None
    return best[1]


def _with_pooled_sides(law: Law, samples: Sequence[Sample], pooled: Law) -> Law:
    """``law`` with the pooled factor on a side none of ``samples`` has: a family the FLOP
    counter gives no FLOPs (elementwise ops, copies) says nothing of its FLOP efficiency, which
    an op of that family that does count FLOPs (a pool under the fx fallback) then needs."""
    overhead, compute_factor, memory_factor = law
    if not any(s.compute_s for s in samples):
        compute_factor = pooled[1]
    if not any(s.memory_s for s in samples):
        memory_factor = pooled[2]
    return overhead, compute_factor, memory_factor


def fit(device_type: str, samples: Sequence[Sample] | Iterable[Sample]) -> CalibrationFit:
    """Fit a law per op family (and one over all) to ``samples`` measured on one device type
    (see the module docstring). Raises ``ValueError`` without samples."""
    samples = [s for s in samples if s.measured_s > 0]
    if not samples:
        raise ValueError(f"no samples to calibrate {device_type!r} with")
    by_family: dict[str, list[Sample]] = {}
    for s in samples:
        by_family.setdefault(s.family, []).append(s)
    pooled = _fit_law(samples)
    laws = {f: _with_pooled_sides(_fit_law(group), group, pooled)
            for f, group in sorted(by_family.items()) if len(group) >= MIN_FAMILY_SAMPLES}
    partial = CalibrationFit(device_type=device_type, laws=laws, pooled=pooled,
                             samples=len(samples), relative_error=0.0,
                             samples_by_family={f: len(g) for f, g in by_family.items()})
    errors = sorted(abs(partial.time_of(s.family, compute_s=s.compute_s, memory_s=s.memory_s,
                                        launches=s.launches) - s.measured_s) / s.measured_s
                    for s in samples)
    return CalibrationFit(**{**partial.__dict__, "relative_error": errors[len(errors) // 2]})
