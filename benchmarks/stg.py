"""The Standard Task Graph Set (50 tasks) against its known optima.

    python benchmarks/stg.py                 # all 720 rows -> benchmarks/results/stg50.md
    python benchmarks/stg.py --procs 2 --graphs 20 --out /tmp/stg.md   # a quick subset

Each row (graph, processor count) is solved by ``autoplace.solve.solve`` with the latency
objective on identical processors without communication, the model the set was made for
(Tobita and Kasahara, J. Scheduling 5(5), 2002). Reported: how many proven rows reach the
optimum, whether any plan is below a proven optimum (that would be a bug), how the 51 open rows
compare with the table's best known value, and solve times. Reads ``../shared/benchdata/stg50``
(or ``$AUTOPLACE_BENCHDATA/stg50``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchdata  # noqa: E402
from common import RESULTS, machine_line, write_markdown  # noqa: E402

from autoplace.solve import solve  # noqa: E402


def run(rows: list[benchdata.OptimalRow], time_limit_s: float, workers: int) -> list[dict]:
    directory = benchdata.benchdata_dir() / "stg50"
    results = []
    for i, row in enumerate(rows):
        problem = benchdata.stg_problem(directory / row.graph, row.procs)
        began = time.perf_counter()
        result = solve(problem, time_limit_s=time_limit_s, workers=workers)
        wall = time.perf_counter() - began
        best_heuristic = min(s.makespan_s for s in result.baselines.values() if s is not None)
        results.append({"row": row, "makespan": round(result.schedule.makespan_s, 6),
                        "bound": result.lower_bound_s, "status": result.solver.status,
                        "heuristic": best_heuristic, "wall": wall})
        print(f"[{i + 1}/{len(rows)}] {row.graph} p={row.procs}: {results[-1]['makespan']:g} "
              f"(table {row.lower}..{row.upper}, {row.status}) {result.solver.status} "
              f"{wall:.1f} s", flush=True)
    return results


def table(results: list[dict], time_limit_s: float, command: str) -> str:
    proven = [r for r in results if r["row"].status == "optimal"]
    open_rows = [r for r in results if r["row"].status != "optimal"]
    reached = [r for r in proven if r["makespan"] <= r["row"].upper + 1e-6]
    below = [r for r in proven if r["makespan"] < r["row"].lower - 1e-6]
    informative = [r for r in proven if r["row"].lower != r["row"].trivial_lb]
    walls = [r["wall"] for r in results]
    lines = [
        "# Standard Task Graph Set, 50 tasks",
        "",
        f"{machine_line()}; "
        f"time limit {time_limit_s:g} s per row. Command: `{command}`.",
        "",
        "| processors | rows | proven rows | optimum reached | below a proven optimum (bug) "
        "| open rows | matched best known | beat best known | proven optimal by us "
        "| median s | max s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for procs in sorted({r["row"].procs for r in results}) + [None]:
        sel = [r for r in results if procs is None or r["row"].procs == procs]
        pr = [r for r in sel if r["row"].status == "optimal"]
        op = [r for r in sel if r["row"].status != "optimal"]
        lines.append(
            f"| {procs if procs is not None else '**all**'} | {len(sel)} | {len(pr)} | "
            f"{sum(r['makespan'] <= r['row'].upper + 1e-6 for r in pr)} | "
            f"{sum(r['makespan'] < r['row'].lower - 1e-6 for r in pr)} | {len(op)} | "
            f"{sum(abs(r['makespan'] - r['row'].upper) <= 1e-6 for r in op)} | "
            f"{sum(r['makespan'] < r['row'].upper - 1e-6 for r in op)} | "
            f"{sum(r['status'] == 'OPTIMAL' for r in op)} | "
            f"{statistics.median(r['wall'] for r in sel):.2f} | "
            f"{max(r['wall'] for r in sel):.1f} |")
    share = 100.0 * len(reached) / len(proven) if proven else 0.0
    lines += [
        "",
        f"- Proven rows: optimum reached on **{len(reached)} of {len(proven)} ({share:.1f}%)**; "
        f"{len(below)} below a proven optimum.",
        f"- The {len(informative)} proven rows whose optimum is above the trivial bound "
        f"max(critical path, ceil(work / procs)): reached on "
        f"{sum(r in reached for r in informative)}.",
        f"- Open rows: {len(open_rows)}; the plan matches the table's best known value on "
        f"{sum(abs(r['makespan'] - r['row'].upper) <= 1e-6 for r in open_rows)}, beats it on "
        f"{sum(r['makespan'] < r['row'].upper - 1e-6 for r in open_rows)}, and CP-SAT proves "
        f"its plan optimal on {sum(r['status'] == 'OPTIMAL' for r in open_rows)}.",
        f"- Solve time per row: median {statistics.median(walls):.2f} s, max {max(walls):.1f} s; "
        f"total {sum(walls) / 60:.1f} min.",
    ]
    missed = [r for r in proven if r not in reached]
    if missed:
        lines += ["", "Proven rows where the optimum was not reached:", "",
                  "| graph | processors | optimum | plan | best heuristic |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r['row'].graph} | {r['row'].procs} | {r['row'].upper:g} | "
                  f"{r['makespan']:g} | {r['heuristic']:g} |" for r in missed]
    beaten = [r for r in open_rows if r["makespan"] < r["row"].upper - 1e-6
              or r["status"] == "OPTIMAL"]
    if beaten:
        lines += ["", "Open rows improved or closed:", "",
                  "| graph | processors | table lower..upper | plan | proven optimal |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r['row'].graph} | {r['row'].procs} | {r['row'].lower:g}..{r['row'].upper:g}"
                  f" | {r['makespan']:g} | {'yes' if r['status'] == 'OPTIMAL' else 'no'} |"
                  for r in beaten]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, action="append",
                        help="only these processor counts (repeatable)")
    parser.add_argument("--graphs", type=int, help="only the first N graphs")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=str(RESULTS / "stg50.md"))
    args = parser.parse_args()
    rows = benchdata.load_optimal_csv()
    if args.procs:
        rows = [r for r in rows if r.procs in args.procs]
    if args.graphs:
        keep = sorted({r.graph for r in rows})[: args.graphs]
        rows = [r for r in rows if r.graph in keep]
    shown = [a for i, a in enumerate(sys.argv[1:])
             if not a.startswith("--out") and (i == 0 or sys.argv[i] != "--out")]
    command = " ".join(["python benchmarks/stg.py", *shown])
    return write_markdown(args.out, table(run(rows, args.time_limit, args.workers),
                                          args.time_limit, command))


if __name__ == "__main__":
    sys.exit(main())
