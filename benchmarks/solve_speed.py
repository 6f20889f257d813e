"""CPU time of the solver's graph work on the 10,000-node scaling graph: each baseline, the
lower bound, one simulation, and a whole solve under ``--deterministic`` (CP-SAT's budget in
deterministic seconds, so only the code around it changes the wall time).

    python benchmarks/solve_speed.py                    # -> benchmarks/results/solve-speed.md
    python benchmarks/solve_speed.py --label before --out /tmp/before.md

Written to check that a restructure (networkx in place of hand-written graph algorithms) costs
at most 10% of the solve time. Each figure is the median of ``--repeats`` runs, in CPU seconds of
this process (``time.process_time``, CP-SAT's threads included): on a shared machine wall time
varies with the load, CPU time much less. ``PYTHONPATH=DIR`` times another checkout's
``autoplace`` (e.g. one from before a change) with this same script.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, machine_line, write_markdown  # noqa: E402
from scaling import random_problem  # noqa: E402

from autoplace.ir import Placement  # noqa: E402
from autoplace.simulate import simulate  # noqa: E402
from autoplace.solve import HEURISTICS, solve  # noqa: E402
from autoplace.solve.bounds import lower_bound_s  # noqa: E402


def _median_s(fn, repeats: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        began = time.process_time()
        fn()
        times.append(time.process_time() - began)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=20.0,
                        help="the deterministic solve's limit (default: 20)")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", default=str(RESULTS / "solve-speed.md"))
    args = parser.parse_args()
    problem = random_problem(args.nodes)
    rows: list[tuple[str, float]] = []
    first = problem.cluster.names[0]
    placement = Placement(device_of={n.name: first for n in problem.graph.nodes})
    rows.append(("simulate (one device)", _median_s(lambda: simulate(problem, placement),
                                                     args.repeats)))
    rows.append(("lower bound", _median_s(lambda: lower_bound_s(problem, "latency"),
                                          args.repeats)))
    for name, heuristic in HEURISTICS.items():
        rows.append((f"baseline {name}", _median_s(lambda h=heuristic: h(problem, "latency"),
                                                   args.repeats)))
        print(rows[-1], flush=True)
    rows.append((f"solve --deterministic --time-limit {args.time_limit:g}", _median_s(
        lambda: solve(problem, time_limit_s=args.time_limit, deterministic=True), 1)))
    lines = [f"# Solver speed on the {args.nodes}-node scaling graph {args.label}".rstrip(), "",
             f"{machine_line()}. Command: `python benchmarks/solve_speed.py`. Median of "
             f"{args.repeats} runs (the whole solve: one run).", "", "| step | CPU s |",
             "| --- | --- |"] + [f"| {step} | {wall:.3f} |" for step, wall in rows]
    print("\n".join(lines))
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
