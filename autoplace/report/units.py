"""The human units every number in a report is shown in: bytes in binary units, seconds in the
largest unit that keeps three significant digits, and the axis units the charts use."""

from __future__ import annotations

import math

__all__ = [
    "bytes_unit",
    "format_bytes",
    "format_ratio",
    "format_seconds",
    "format_share",
    "time_unit",
]

_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float | None) -> str:
    """``1536`` -> ``"1.50 KiB"``. Binary units, because device capacities are quoted in GiB."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    if value < 1024:
        return f"{sign}{int(value)} B"
    for unit in _BYTE_UNITS:
        value /= 1024
        if value < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{sign}{_sig3(value)} {unit}"
    raise AssertionError("unreachable")


def format_seconds(s: float | None) -> str:
    """``0.0123`` -> ``"12.3 ms"``: three significant digits in ns, µs, ms, s, min or h."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "n/a"
    if s == 0:
        return "0 s"
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 1e-6:
        return f"{sign}{_sig3(s * 1e9)} ns"
    if s < 1e-3:
        return f"{sign}{_sig3(s * 1e6)} µs"
    if s < 1:
        return f"{sign}{_sig3(s * 1e3)} ms"
    if s < 60:
        return f"{sign}{_sig3(s)} s"
    if s < 3600:
        return f"{sign}{_sig3(s / 60)} min"
    return f"{sign}{_sig3(s / 3600)} h"


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
    for name in _BYTE_UNITS:
        if n_max < factor * 1024 * 2:
            break
        unit, factor = name, factor * 1024
    return unit, factor


def _sig3(x: float) -> str:
    # Three significant digits without scientific notation: 1.23, 12.3, 123, 1234.
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"
