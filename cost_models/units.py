"""How a byte count or a duration is written for people: bytes in binary units, seconds in the
largest unit that keeps three significant digits.

One formatter for every stage, kept in this lowest layer (it imports nothing of ours) so that a
detector's line, a solver's error, a note and the report (``autoplace.report.units``
re-exports these) write the same number the same way.
"""

from __future__ import annotations

import math

__all__ = ["BYTE_UNITS", "format_bytes", "format_seconds"]

BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float | None) -> str:
    """``1536`` -> ``"1.50 KiB"``. Binary units, because device capacities are quoted in GiB."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    if value < 1024:
        return f"{sign}{int(value)} B"
    for unit in BYTE_UNITS:
        value /= 1024
        if value < 1024 or unit == BYTE_UNITS[-1]:
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


def _sig3(x: float) -> str:
    # Three significant digits without scientific notation: 1.23, 12.3, 123, 1234.
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"
