"""Plan every example with the CLI and write a markdown table of the results.

    python benchmarks/examples.py                  # writes benchmarks/results/examples.md
    python benchmarks/examples.py --sweep 16,60,120,250,400   # and the --max-nodes table

Every figure is of the folded graph (the traced graph with only zero-cost ops folded), which is
what the plan is on: for each example and device set, the plan with the default settings and
with ``--max-nodes 400``, the best baseline, the single device, the lower bound and the gap, the
speed-up over one device, the solver status, verification, and the wall time of the whole
``autoplace plan`` command (a fresh process, so Python and torch start-up are included).
``--sweep`` plans the examples whose folded graph is larger than the smallest value at each
``--max-nodes`` value: the measurement the default is chosen from (benchmarks/results/README.md).
"""

from __future__ import annotations

import argparse
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
FINE_MAX_NODES = 400


def _us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f}"


def run(example: str, devices: str, max_nodes: int | None = None) -> dict:
    """``autoplace plan`` on one example (default settings, or ``--max-nodes``); the figures
    of its plan.json."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        command = [sys.executable, "-m", "autoplace.cli", "plan",
                   str(ROOT / "examples" / f"{example}.py"), "--devices", devices,
                   "--out", str(out)]
        if max_nodes is not None:
            command += ["--max-nodes", str(max_nodes)]
        began = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
        wall = time.perf_counter() - began
        if proc.returncode != 0:
            raise SystemExit(f"{example} on {devices} failed:\n{proc.stderr}")
        data = json.loads((out / "plan.json").read_text())
    feasible = {k: v["makespan_s"] for k, v in data["baselines"].items() if v["feasible"]}
    best_name = min(feasible, key=feasible.get)
    scope = data["solver"].get("scope") or {}
    single = data["best_single_device"]["makespan_s"]
    return {
        "example": example, "devices": devices, "traced_ops": data["coarsening"]["traced_ops"],
        "folded_nodes": data["coarsening"]["plan_nodes"],
        "cpsat_nodes": scope.get("nodes", data["coarsening"]["plan_nodes"]),
        "makespan_s": data["makespan_s"], "best_baseline": best_name,
        "best_baseline_s": feasible[best_name], "single_s": single,
        "speedup": single / data["makespan_s"] if single else None,
        "lower_bound_s": data["lower_bound_s"], "gap": data["solver"]["gap"],
        "status": data["solver"]["status"], "scope": scope.get("graph", "folded"),
        "solve_s": data["solver"]["wall_s"], "verification": data["verification"]["status"],
        "wall_s": wall,
    }


def _examples_table(rows: list[tuple[dict, dict]]) -> list[str]:
    lines = [
        "| example | devices | traced ops / folded nodes | default (µs) | --max-nodes "
        f"{FINE_MAX_NODES} (µs) | best baseline on F (µs) | single device (µs) | bound on F "
        "(µs) | gap | speed-up | status (CP-SAT's graph) | solve (s) | verified | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, fine in rows:
        lines.append(
            f"| {r['example']} | {r['devices']} | {r['traced_ops']} / {r['folded_nodes']} "
            f"| {_us(r['makespan_s'])} | {_us(fine['makespan_s'])} "
            f"| {r['best_baseline']} {_us(r['best_baseline_s'])} | {_us(r['single_s'])} "
            f"| {_us(r['lower_bound_s'])} | {r['gap'] * 100:.1f}% "
            f"| {r['speedup']:.3f}x | {r['status']} ({r['scope']}, {r['cpsat_nodes']} nodes) "
            f"| {r['solve_s']:.2f} | {r['verification']} | {r['wall_s']:.1f} |")
    return lines


def _sweep_table(values: list[int]) -> list[str]:
    lines = ["| example | devices | folded nodes | "
             + " | ".join(f"--max-nodes {v} (µs, gap)" for v in values) + " |",
             "|---|---|---|" + "---|" * len(values)]
    for devices in DEVICE_SETS:
        for example in EXAMPLES:
            runs = [run(example, devices, v) for v in values]
            if runs[0]["folded_nodes"] <= min(values):
                continue  # every value solves the folded graph whole: nothing to compare
            lines.append(f"| {example} | {devices} | {runs[0]['folded_nodes']} | " + " | ".join(
                f"{_us(r['makespan_s'])} ({r['gap'] * 100:.1f}%)" for r in runs) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", help="comma-separated --max-nodes values to compare")
    args = parser.parse_args(argv)
    rows = [(run(e, d), run(e, d, FINE_MAX_NODES)) for d in DEVICE_SETS for e in EXAMPLES]
    lines = [
        f"Measured {datetime.date.today()} on {platform.machine()} with "
        f"{platform.python_implementation()} {platform.python_version()}, analytic costs, "
        "default time limit (10 s), 2 shared cores. Times in microseconds except the wall time. "
        "Every figure is of the folded graph F (the traced graph, zero-cost ops folded), "
        "where the plan is made and checked. Command: `python benchmarks/examples.py"
        + (f" --sweep {args.sweep}`." if args.sweep else "`."),
        "",
        *_examples_table(rows),
    ]
    if args.sweep:
        values = [int(v) for v in args.sweep.split(",")]
        lines += ["", "Makespan and gap at each `--max-nodes` (examples whose folded graph is "
                  "larger than the smallest value):", "", *_sweep_table(values)]
    out = ROOT / "benchmarks" / "results" / "examples.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
