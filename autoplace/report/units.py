"""The human units every number in a report is shown in: bytes and seconds as every stage
writes them (``cost_models.units``, re-exported here), ratios, shares, and the axis units the
charts use."""

from __future__ import annotations

from cost_models.units import BYTE_UNITS, format_bytes, format_seconds

__all__ = [
    "bytes_unit",
    "format_bytes",
    "format_ratio",
    "format_seconds",
    "format_share",
    "time_unit",
]


def format_ratio(r: float | None) -> str:
    """``1.4512`` -> ``"1.45x"``; ``None`` -> ``"n/a"``."""
    return "n/a" if r is None else f"{r:.2f}x"


def format_share(fraction: float | None) -> str:
    """``0.4512`` -> ``"45%"``, ``0.0123`` -> ``"1.2%"``, ``0.00041`` -> ``"0.041%"``: enough
    digits that a small share of a large device does not read as zero."""
    if fraction is None:
        return "n/a"
    pct = fraction * 100
    if pct == 0 or pct >= 10:
        return f"{pct:.0f}%"
    if pct >= 1:
        return f"{pct:.1f}%"
    return f"{pct:.2g}%"


def time_unit(t_max_s: float) -> tuple[str, float]:
    """The axis unit for a span of ``t_max_s`` and the factor from seconds to it, so tick labels
    stay short (0-900 µs, 0-40 ms, 0-3 s)."""
    if t_max_s < 2e-3:
        return "µs", 1e6
    if t_max_s < 2:
        return "ms", 1e3
    return "s", 1.0


def bytes_unit(n_max: float) -> tuple[str, float]:
    """The axis unit for sizes up to ``n_max`` bytes and the factor from bytes to it."""
    unit, factor = "B", 1.0
    for name in BYTE_UNITS:
        if n_max < factor * 1024 * 2:
            break
        unit, factor = name, factor * 1024
    return unit, factor
