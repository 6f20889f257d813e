"""Plan every example with the CLI and write a markdown table of the results.

    python benchmarks/examples.py            # writes benchmarks/results/examples.md

For each example and device set: the plan's makespan, the best baseline, the lower bound and gap,
the solver status, verification, and the wall time of the whole `autoplace plan` command (a fresh
process, so Python and torch start-up are included).
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("mlp", "lenet", "gpt2", "inception")
DEVICE_SETS = ("2xA100-40GB", "2xA100-40GB,2xT4-16GB")


def _us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f}"


def run(example: str, devices: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        began = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "autoplace.cli", "plan",
             str(ROOT / "examples" / f"{example}.py"), "--devices", devices, "--out", str(out)],
            capture_output=True, text=True, check=False)
        wall = time.perf_counter() - began
        if proc.returncode != 0:
            raise SystemExit(f"{example} on {devices} failed:\n{proc.stderr}")
        data = json.loads((out / "plan.json").read_text())
    feasible = {k: v["makespan_s"] for k, v in data["baselines"].items() if v["feasible"]}
    best_name = min(feasible, key=feasible.get)
    return {
        "example": example, "devices": devices, "nodes": data["coarsening"]["plan_nodes"],
        "traced_ops": data["coarsening"]["traced_ops"], "makespan_s": data["makespan_s"],
        "best_baseline": best_name, "best_baseline_s": feasible[best_name],
        "single_s": data["best_single_device"]["makespan_s"],
        "lower_bound_s": data["lower_bound_s"], "gap": data["solver"]["gap"],
        "status": data["solver"]["status"], "solve_s": data["solver"]["wall_s"],
        "verification": data["verification"]["status"], "wall_s": wall,
    }


def main() -> None:
    rows = [run(e, d) for d in DEVICE_SETS for e in EXAMPLES]
    lines = [
        f"Measured {datetime.date.today()} on {platform.machine()} with "
        f"{platform.python_implementation()} {platform.python_version()}, analytic costs, "
        "default time limit (10 s). Times in microseconds except the wall time.",
        "",
        "| example | devices | traced ops / plan nodes | makespan (µs) | best baseline (µs) "
        "| single device (µs) | lower bound (µs) | gap | CP-SAT | solve (s) | verified "
        "| wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['example']} | {r['devices']} | {r['traced_ops']} / {r['nodes']} "
            f"| {_us(r['makespan_s'])} | {r['best_baseline']} {_us(r['best_baseline_s'])} "
            f"| {_us(r['single_s'])} | {_us(r['lower_bound_s'])} | {r['gap'] * 100:.1f}% "
            f"| {r['status']} | {r['solve_s']:.2f} | {r['verification']} | {r['wall_s']:.1f} |")
    out = ROOT / "benchmarks" / "results" / "examples.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
