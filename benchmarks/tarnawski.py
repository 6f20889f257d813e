"""The Tarnawski et al. (NeurIPS 2020) DNN graphs, scored with the authors' two rules.

    python benchmarks/tarnawski.py            # -> benchmarks/results/tarnawski2020.md
    python benchmarks/tarnawski.py --only bert24 --time-limit 20 --out /tmp/t.md

Throughput inputs: autoplace's plan (objective ``throughput``), once with contiguous stages and
once without, scored by the authors' max-load rule next to their dynamic program's contiguous
optimum. Latency inputs: autoplace's plan (objective ``latency`` under the project's simulator,
with contiguous stages, which the authors' latency rule needs) and every contiguous baseline it
was compared with, scored by the authors' latency rule next to their greedy; the plan and the
greedy split are also simulated by the project's simulator. The
authors' reference values are first recomputed from their split files with the same scorers
(``benchdata.max_load`` / ``benchdata.latency``), which checks the scorers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchdata  # noqa: E402
from common import RESULTS, machine_line, write_markdown  # noqa: E402

from autoplace.simulate import simulate  # noqa: E402
from autoplace.solve import solve  # noqa: E402

TRAINING_NOTE = (
    "autoplace's `--contiguous` asks for a chain of stages over the whole graph, forward and "
    "backward: a training graph's layer-wise stages (a layer's forward and backward op on "
    "one device, as the authors' DP makes them) are no such chain, so contiguous plans of "
    "training graphs cannot split the way the DP does; for them the \"any split\" column is "
    "the comparison.")


def _inputs(kind: str, only: str | None) -> list[Path]:
    base = benchdata.benchdata_dir() / "tarnawski2020" / f"{kind}-inputs"
    paths = sorted(base.glob("*/*.json"))
    return [p for p in paths if only is None or only.lower() in str(p).lower()]


def _reference(prefix: str, path: Path) -> Path | None:
    directory = benchdata.benchdata_dir() / "tarnawski2020" / "reference-splits"
    want = f"{prefix}_{path.parent.name}_{path.stem}.json".lower()
    return next((p for p in directory.glob("*.json") if p.name.lower() == want), None)


def _solve(data: benchdata.TarnawskiInput, objective: str, contiguous: bool,
           time_limit_s: float, workers: int) -> tuple[benchdata.Assignment, object, float]:
    problem = benchdata.tarnawski_problem(data)
    began = time.perf_counter()
    result = solve(problem, objective=objective, contiguous=contiguous,
                   time_limit_s=time_limit_s, workers=workers)
    return benchdata.assignment_of(result.schedule.placement), result, time.perf_counter() - began


def throughput(paths: list[Path], time_limit_s: float, workers: int) -> list[str]:
    lines = ["## Throughput inputs (max-load, lower is better)", "", TRAINING_NOTE, "",
             "| input | nodes | DP (contiguous optimum), recomputed | autoplace contiguous "
             "| autoplace any split | lower bound of the contiguous problem "
             "| status (contiguous / any) "
             "| time s (contiguous / any) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path in paths:
        data = benchdata.load_tarnawski(path)
        ref = _reference("throughput-dp", path)
        dp = benchdata.max_load(data, benchdata.load_split(ref).assignment) if ref else None
        rows = []
        for contiguous in (True, False):
            assignment, result, wall = _solve(data, "throughput", contiguous, time_limit_s,
                                              workers)
            rows.append((benchdata.max_load(data, assignment), result, wall))
            print(f"{path.parent.name}/{path.stem} contiguous={contiguous}: "
                  f"{rows[-1][0]:.4f} (DP {dp}) {result.solver.status} {wall:.1f} s", flush=True)
        (c_load, c_res, c_wall), (a_load, a_res, a_wall) = rows
        verdict = "" if dp is None or c_load <= dp * (1 + 1e-9) else " (worse than DP)"
        lines.append(
            f"| {path.parent.name} {path.stem} | {len(data.nodes)} | "
            f"{'not finished by the authors' if dp is None else f'{dp:.3f}'} | "
            f"{c_load:.3f}{verdict} | {a_load:.3f} | "
            f"{max(c_res.lower_bound_s, 0):.3f} | {c_res.solver.status} / {a_res.solver.status} "
            f"| {c_wall:.1f} / {a_wall:.1f} |")
    return lines


def _authors_latency(data: benchdata.TarnawskiInput,
                     assignment: benchdata.Assignment) -> float | str:
    """The authors' latency of a split, after cutting each accelerator's block into contiguous
    pieces as their ``-computeLatency`` does; ``None`` if that needs more accelerators than the
    input has, or if the blocks still contract to a cycle: then why, as text."""
    pieces = benchdata.contiguous_pieces(data, assignment)
    if len({slot for slot in pieces.values() if slot[0] == benchdata.FPGA}) > data.max_fpgas:
        return "its contiguous pieces need more accelerators"
    try:
        return benchdata.latency(data, pieces)
    except benchdata.BenchDataError:
        return "its blocks contract to a cycle"  # each convex, d0 -> d1 and d1 -> d0


def latency(paths: list[Path], time_limit_s: float, workers: int) -> list[str]:
    lines = ["## Latency inputs (one sample, lower is better)", "",
             "autoplace minimises the makespan under its own simulator, where copies overlap "
             "compute; the authors' rule charges them to the blocks instead. So every "
             "placement autoplace produced for the input (its plan and each baseline) is scored "
             "by the authors' rule, and the best is reported beside the plan's own score. The "
             "rule needs accelerator blocks that contract to an acyclic graph: a block that is not "
             "contiguous is first cut into contiguous pieces, as the authors' code does, and a "
             "split counts only if the pieces fit the input's accelerators and contract to no "
             "cycle.", "",
             "| input | nodes | greedy, authors' rule (recomputed) | autoplace plan, authors' rule "
             "| best autoplace placement, authors' rule | greedy, project simulator "
             "| autoplace plan, project simulator | status | time s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path in paths:
        data = benchdata.load_tarnawski(path)
        problem = benchdata.tarnawski_problem(data)
        ref = _reference("latency-greedy", path)
        greedy = benchdata.load_split(ref).assignment if ref else None
        assignment, result, wall = _solve(data, "latency", True, time_limit_s, workers)
        ours = _authors_latency(data, assignment)
        scored = {"plan": ours} if isinstance(ours, float) else {}
        for name, schedule in result.baselines.items():
            if schedule is not None and schedule.feasible:
                value = _authors_latency(data, benchdata.assignment_of(schedule.placement))
                if isinstance(value, float):
                    scored[name] = value
        best_name = min(scored, key=scored.__getitem__)
        theirs = benchdata.latency(data, greedy) if greedy else None
        theirs_sim = (simulate(problem, benchdata.placement_of(greedy)).makespan_s
                      if greedy else None)
        print(f"{path.parent.name}/{path.stem}: plan {ours}, best {best_name} "
              f"{scored[best_name]:.4f} (greedy {theirs}) {result.solver.status} {wall:.1f} s",
              flush=True)
        verdict = ("" if theirs is None or scored[best_name] <= theirs * (1 + 1e-9)
                   else " (worse than greedy)")
        lines.append(
            f"| {path.parent.name} {path.stem} | {len(data.nodes)} | "
            f"{'—' if theirs is None else f'{theirs:.3f}'} | "
            f"{f'{ours:.3f}' if isinstance(ours, float) else f'— ({ours})'} | "
            f"{scored[best_name]:.3f} ({best_name}){verdict} | "
            f"{'—' if theirs_sim is None else f'{theirs_sim:.3f}'} | "
            f"{result.schedule.makespan_s:.3f} | {result.solver.status} | {wall:.1f} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="only inputs whose path contains this text")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=str(RESULTS / "tarnawski2020.md"))
    args = parser.parse_args()
    lines = ["# Tarnawski et al. (NeurIPS 2020) DNN graphs", "",
             f"{machine_line()}; time limit "
             f"{args.time_limit:g} s per solve. Command: `python benchmarks/tarnawski.py"
             f"{' --only ' + args.only if args.only else ''}"
             f"{f' --time-limit {args.time_limit:g}' if args.time_limit != 60 else ''}`. "
             "Times are in the inputs' units; both rules are the authors' "
             "(../shared/benchdata/README.md).", ""]
    lines += throughput(_inputs("throughput", args.only), args.time_limit, args.workers)
    lines += [""]
    lines += latency(_inputs("latency", args.only), args.time_limit, args.workers)
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
