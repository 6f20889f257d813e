"""Calibration from the profile cache: fit the roofline's efficiencies to what was measured, and
pick a fit for every device of a plan.

``fit_from_records`` turns measured ops (``cache.OpRecord``) into ``cost_models.calibration``
samples and fits them; ``refit`` does that for one device from everything the cache holds for
it (every model profiled so far) and stores the fit. ``fits_for`` chooses, for each device type
in a cluster, its own stored fit or else the fit of a measured device of the same kind (a GPU
type never measured is predicted from the GPU that was, with its own datasheet peaks: that is
what the efficiencies are for). CPU fits never stand in for GPUs, nor GPU fits for CPUs.
``compare`` reports each calibrated prediction's error against the measurement.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autoplace.ir import Cluster, OpGraph
from autoplace.profile.cache import OpRecord, ProfileCache
from cost_models import get_device_type
from cost_models.calibration import CalibrationFit, Sample, fit, roofline_terms

__all__ = ["Comparison", "compare", "fit_from_records", "fits_for", "refit"]


def fit_from_records(device_type: str, records: Iterable[OpRecord]) -> CalibrationFit | None:
    """The fit of ``device_type`` to ``records`` (None when there are none usable)."""
    dtype_ = get_device_type(device_type)
    samples = []
    for r in records:
        if r.median_s > 0:
            compute_s, memory_s = roofline_terms(flops=r.flops, bytes_accessed=r.bytes_accessed,
                                                 dtype=r.dtype, device=dtype_)
            samples.append(Sample(family=r.family, compute_s=compute_s, memory_s=memory_s,
                                  launches=r.launches, measured_s=r.median_s))
    return fit(device_type, samples) if samples else None


def refit(cache: ProfileCache, *, device_type: str, device_key: str) -> CalibrationFit | None:
    """Fit ``device_type`` to every op the cache holds for the hardware ``device_key`` and
    store the fit (it then predicts this type, and types of its kind, when not measured)."""
    records = [r for r in cache.ops_for(device_type) if r.device_key == device_key]
    fitted = fit_from_records(device_type, records)
    if fitted is not None:
        cache.put_fit(fitted)
    return fitted


def fits_for(cluster: Cluster, stored: Mapping[str, CalibrationFit]
             ) -> tuple[dict[str, CalibrationFit], list[str]]:
    """A fit for each device type of ``cluster`` that has one, by type name, and notes saying
    which types borrow another type's efficiencies."""
    chosen: dict[str, CalibrationFit] = {}
    notes: list[str] = []
    for type_name in dict.fromkeys(d.type for d in cluster.devices):
        device_type = get_device_type(type_name)
        own = stored.get(device_type.name)
        if own is not None:
            chosen[device_type.name] = own
            continue
        same_kind = [f for name, f in stored.items()
                     if get_device_type(name).kind == device_type.kind]
        if same_kind:
            donor = max(same_kind, key=lambda f: f.samples)
            chosen[device_type.name] = _as_type(donor, device_type.name)
            notes.append(f"{device_type.name} was never measured: its costs are calibrated "
                         f"with the efficiencies measured on {donor.device_type} applied to "
                         f"{device_type.name}'s datasheet peaks")
    return chosen, notes


def _as_type(donor: CalibrationFit, device_type: str) -> CalibrationFit:
    return CalibrationFit(**{**donor.__dict__, "device_type": device_type})


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Calibrated predictions against measurements on one device: the sum over measured ops,
    the median absolute error per op, and each family's median error."""

    device: str
    device_type: str
    measured_s: float
    calibrated_s: float
    op_error: float
    family_error: Mapping[str, float]
    ops: int

    @property
    def error(self) -> float:
        """Relative error of the calibrated total against the measured total."""
        return (self.calibrated_s - self.measured_s) / self.measured_s if self.measured_s else 0.0

    def to_dict(self) -> dict:
        return {"device": self.device, "device_type": self.device_type,
                "measured_s": self.measured_s, "calibrated_s": self.calibrated_s,
                "error": self.error, "op_error": self.op_error,
                "family_error": dict(self.family_error), "ops": self.ops}


def compare(graph: OpGraph, measured: Mapping[str, float], fitted: CalibrationFit, *,
            device: str, device_type: str) -> Comparison | None:
    """Each measured node of ``graph`` (``measured[node]`` seconds) against the calibrated
    prediction for it."""
    from autoplace.profile.cost import node_family

    dtype_ = get_device_type(device_type)
    total_measured = total_predicted = 0.0
    errors: list[float] = []
    by_family: dict[str, list[float]] = {}
    for node in graph.nodes:
        if node.name not in measured or node.is_input:
            continue
        family = node_family(node)
        predicted = fitted.op_time_s(family=family, flops=node.flops,
                                     bytes_accessed=node.bytes_accessed, dtype=node.dtype,
                                     device=dtype_, launches=node.launches)
        actual = measured[node.name]
        total_measured += actual
        total_predicted += predicted
        if actual > 0:
            err = abs(predicted - actual) / actual
            errors.append(err)
            by_family.setdefault(family, []).append(err)
    if not errors:
        return None
    return Comparison(device=device, device_type=device_type, measured_s=total_measured,
                      calibrated_s=total_predicted, op_error=statistics.median(errors),
                      family_error={f: statistics.median(v) for f, v in sorted(by_family.items())},
                      ops=len(errors))
