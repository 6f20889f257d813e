"""The analytic cost of one op and of one transfer.

An op takes as long as the slower of its arithmetic and its memory traffic, plus a fixed cost per
kernel launch: the roofline model (S. Williams, A. Waterman, D. Patterson, "Roofline: An
Insightful Visual Performance Model for Multicore Architectures", CACM 52(4), 2009,
https://doi.org/10.1145/1498765.1498785). A transfer takes a fixed latency plus bytes over
bandwidth (the alpha-beta, or Hockney, model: R. Hockney, "The communication challenge for MPP",
Parallel Computing 20(3), 1994).

A ring all-reduce of ``R`` replicas' gradients is ``2 (R - 1)`` such transfers of ``1/R`` of the
bytes each, one after another (Patarasuk and Yuan, JPDC 69(2), 2009).

All are peak-rate estimates: real kernels reach a fraction of peak, which a later calibration
stage can measure and fold in.
"""

from __future__ import annotations

import math
from typing import Any

from cost_models.devices import DeviceType

__all__ = ["arithmetic_intensity", "op_time_s", "ring_allreduce_s", "roofline_terms",
           "transfer_time_s"]


def _check_non_negative(**values: float) -> None:
    for name, value in values.items():
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def op_time_s(
    *,
    flops: float,
    bytes_accessed: float,
    dtype: str,
    device: DeviceType,
    launches: int = 1,
) -> float:
    """Seconds one op takes on ``device``.

    ``max(flops / peak_flops, bytes_accessed / memory_bandwidth) + launches * launch_overhead``,
    with the peak for ``dtype`` chosen by ``DeviceType.peak_flops_for``. An op with nothing to do
    and no launch (a view, a metadata op) costs 0.
    """
    _check_non_negative(flops=flops, bytes_accessed=bytes_accessed, launches=launches)
    return max(roofline_terms(flops=flops, bytes_accessed=bytes_accessed, dtype=dtype,
                              device=device)) + launches * device.launch_overhead_s


def roofline_terms(*, flops: float, bytes_accessed: float, dtype: str,
                   device: DeviceType) -> tuple[float, float]:
    """``(flops / peak, bytes / bandwidth)``: the roofline's two sides, without its launch term
    (``cost_models.calibration`` scales each by its own fitted factor)."""
    compute_s = flops / device.peak_flops_for(dtype) if flops else 0.0
    memory_s = bytes_accessed / device.memory_bandwidth_bytes_per_s if bytes_accessed else 0.0
    return compute_s, memory_s


def arithmetic_intensity(*, flops: float, bytes_accessed: float) -> float:
    """FLOPs per byte moved; an op is compute-bound on a device when this exceeds the device's
    peak FLOP/s over its memory bandwidth (the roofline's ridge point)."""
    _check_non_negative(flops=flops, bytes_accessed=bytes_accessed)
    if bytes_accessed == 0:
        return math.inf if flops else 0.0
    return flops / bytes_accessed


def transfer_time_s(nbytes: float, *, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    """Seconds to move ``nbytes`` over one link: ``latency_s + nbytes / bandwidth_bytes_per_s``.

    The same formula as ``autoplace.ir.Link.transfer_s``, so the two never disagree; whether a
    zero-byte edge needs a transfer at all is the caller's decision.
    """
    _check_non_negative(nbytes=nbytes, latency_s=latency_s)
    if not bandwidth_bytes_per_s > 0:
        raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s!r}")
    return latency_s + nbytes / bandwidth_bytes_per_s


def ring_allreduce_s(nbytes: Any, replicas: Any, *, bandwidth_bytes_per_s: float,
                     latency_s: float) -> Any:
    """Seconds for ``replicas`` devices to all-reduce ``nbytes`` (each holds all of them) by a
    ring: ``2 (R - 1) / R * nbytes / bandwidth + 2 (R - 1) * latency``, 0 for one replica.

    The ring's reduce-scatter and all-gather each take ``R - 1`` steps in which every device
    sends ``nbytes / R`` to its neighbour at once (P. Patarasuk, X. Yuan, "Bandwidth optimal
    all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009): bandwidth-optimal,
    and every step pays the link's latency. ``nbytes`` and ``replicas`` may be numpy arrays (the
    formula is applied element by element); the checks are of plain numbers only.
    """
    if isinstance(nbytes, int | float) and isinstance(replicas, int | float):
        _check_non_negative(nbytes=nbytes)
        if not replicas >= 1:
            raise ValueError(f"replicas must be >= 1, got {replicas!r}")
    _check_non_negative(latency_s=latency_s)
    if not bandwidth_bytes_per_s > 0:
        raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s!r}")
    steps = 2 * (replicas - 1)
    return steps / replicas * nbytes / bandwidth_bytes_per_s + steps * latency_s


def ring_allgather_s(nbytes: Any, ranks: Any, *, bandwidth_bytes_per_s: float,
                     latency_s: float) -> Any:
    """Seconds for ``ranks`` devices to all-gather a tensor of ``nbytes`` (each holding
    ``nbytes / ranks`` of it) by a ring: ``(R - 1) / R * nbytes / bandwidth + (R - 1) *
    latency``, 0 for one rank. A reduce-scatter of ``nbytes`` takes the same: each is one half
    of ``ring_allreduce_s`` (Patarasuk and Yuan, as there; Rajbhandari et al., "ZeRO", SC 2020,
    section 7.2: ZeRO-3 moves 1.5x data parallelism's volume, an all-gather in the forward,
    another in the backward and a reduce-scatter)."""
    return ring_allreduce_s(nbytes, ranks, bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                            latency_s=latency_s) / 2

