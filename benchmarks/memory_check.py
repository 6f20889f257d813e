"""Is the plan's memory an upper bound? Measured against predicted peak bytes per device.

    python benchmarks/memory_check.py                  # writes benchmarks/results/memory.md
    python benchmarks/memory_check.py --only mlp bert  # a few models, table printed, not written

For every example (`examples/*.py`) and every corpus model (`examples/corpus/`, see
`benchmarks/corpus.py`) that plans and verifies, `autoplace plan` runs in a fresh process with
`--no-check-memory` (a plan whose memory is exceeded is still written) and `--no-profile`
(analytic costs: the profile cache on this machine does not change the table). Verification measures
the emitted model's peak bytes per planned device (weights + live activations,
`autoplace/emit/check/memory.py`; on this CPU-only machine by tracking tensor storages per segment)
and records them beside the plan's predicted peak in `plan.json` (`verification.peak_bytes`);
this script reads that record. The target (issue 13, "Memory"): measured <= predicted on every
device, with predicted / measured at most 1.3.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, machine_line, write_markdown  # noqa: E402
from corpus import CORPUS, FAMILIES  # noqa: E402

EXAMPLES = ("mlp", "lenet", "inception", "gpt2")
# 2xcpu-thread too: its workers have no launcher, so splits that the GPUs' launcher makes not
# pay are still planned there, and the memory model is measured on split plans.
DEVICES = ("2xA100-40GB", "2xA100-40GB,2xT4-16GB", "2xcpu-thread")
CORPUS_DEVICES = ("2xA100-40GB,2xT4-16GB", "2xcpu-thread")
TIME_LIMIT_S = 2.0
TIMEOUT_S = 300.0
RATIO_TARGET = 1.3


@dataclass
class Row:
    model: str
    devices: str
    error: str = ""
    # device -> (measured bytes, predicted bytes), devices the plan uses or the model touched
    peaks: dict[str, tuple[int, int]] = field(default_factory=dict)
    wall_s: float = 0.0


def measure(model: str, path: Path, devices: str, *, time_limit_s: float) -> Row:
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "autoplace.cli", "plan", str(path), "--devices", devices,
                 "--out", str(out), "--time-limit", str(time_limit_s), "--no-check-memory",
                 "--no-profile"],
                cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Row(model, devices, error=f"timed out after {TIMEOUT_S:g} s")
        wall_s = time.perf_counter() - began
        if proc.returncode != 0:
            last = [line for line in proc.stderr.splitlines() if line.strip()][-1:]
            return Row(model, devices, error=f"exit {proc.returncode}: {' '.join(last)[:160]}",
                       wall_s=wall_s)
        verification = json.loads((out / "plan.json").read_text())["verification"]
    if verification["status"] != "passed":
        return Row(model, devices, error=f"not verified: {verification['detail']}",
                   wall_s=wall_s)
    peaks = {d: (e["measured_bytes"], e["predicted_bytes"])
             for d, e in verification.get("peak_bytes", {}).items()
             if e["measured_bytes"] or e["predicted_bytes"]}
    return Row(model, devices, peaks=peaks, wall_s=wall_s)


def _size(nbytes: int) -> str:
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.2f} MiB"
    return f"{nbytes / 2**10:.1f} KiB" if nbytes >= 2**10 else f"{nbytes} B"


def table(rows: list[Row], *, time_limit_s: float) -> str:
    measured = [(r, d, m, p) for r in rows for d, (m, p) in r.peaks.items()]
    within = sum(m <= p for _, _, m, p in measured)
    tight = sum(m <= p and (m == 0 or p / m <= RATIO_TARGET) for _, _, m, p in measured)
    over = sorted(((m / p if p else float("inf")), r.model, r.devices, d)
                  for r, d, m, p in measured if m > p)
    lines = [
        "# Memory: measured against predicted peak per device",
        "",
        f"{machine_line()}; `autoplace plan MODEL --devices DEVICES --time-limit "
        f"{time_limit_s:g} --no-check-memory --no-profile` (analytic costs) per model in a "
        "fresh process, then "
        "`verification.peak_bytes` of its plan.json. Reproduce with "
        "`python benchmarks/memory_check.py`.",
        "",
        "Measured: the emitted model's weights + live activations per planned device over one "
        "forward pass (`autoplace/emit/check/memory.py`, tensor storages tracked per segment, "
        "every "
        "planned device run on this CPU). Predicted: the plan's peak for that device "
        "(`autoplace/simulate/memory.py`: resident parameters + live activations). Target: "
        f"measured <= predicted, predicted / measured <= {RATIO_TARGET}.",
        "",
        f"**{within} of {len(measured)} devices measured at or below the plan; {tight} also "
        f"within {RATIO_TARGET}x.** "
        + (f"Worst: {over[-1][1]} on {over[-1][2]}, {over[-1][3]}, measured "
           f"{over[-1][0]:.2f}x the plan." if over else ""),
        "",
        "| model | devices | device | measured | predicted | predicted / measured "
        "| holds |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.error:
            lines.append(f"| {row.model} | {row.devices} | | | | | {row.error} |")
            continue
        for device, (m, p) in row.peaks.items():
            ratio = f"{p / m:.2f}" if m else "n/a"
            lines.append(f"| {row.model} | {row.devices} | {device} | {_size(m)} | {_size(p)} | "
                         f"{ratio} | {'yes' if m <= p else '**no**'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="MODEL",
                        choices=sorted(set(EXAMPLES) | set(FAMILIES)))
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT_S)
    args = parser.parse_args(argv)
    jobs = [(name, ROOT / "examples" / f"{name}.py", devices)
            for name in EXAMPLES for devices in DEVICES]
    jobs += [(name, CORPUS / f"{name}.py", devices)
             for name in FAMILIES for devices in CORPUS_DEVICES]
    if args.only:
        jobs = [job for job in jobs if job[0] in args.only]
    rows = []
    for name, path, devices in jobs:
        row = measure(f"corpus/{name}" if path.parent == CORPUS else name, path, devices,
                      time_limit_s=args.time_limit)
        print(f"{row.model} on {row.devices}: {row.error or row.peaks} ({row.wall_s:.1f} s)",
              file=sys.stderr)
        rows.append(row)
    text = table(rows, time_limit_s=args.time_limit)
    if args.only:
        print(text)
        return 0
    return write_markdown(RESULTS / "memory.md", text)


if __name__ == "__main__":
    sys.exit(main())
