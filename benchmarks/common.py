"""What every benchmark script shares: where results go, and the line that says where and when
they were measured."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def machine_line() -> str:
    return (f"Measured {datetime.date.today().isoformat()} on {platform.machine()} "
            f"({os.cpu_count()} cores), Python {platform.python_version()}")


def write_markdown(out: str | os.PathLike[str], lines: list[str] | str) -> int:
    """Write the table (lines, or the whole text) to ``out``, print it, return the exit code."""
    text = lines if isinstance(lines, str) else "\n".join(lines) + "\n"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    print(text)
    return 0
