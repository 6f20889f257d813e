"""Solve time and plan quality on random task graphs of 100, 1,000 and 10,000 nodes.

    python benchmarks/scaling.py             # -> benchmarks/results/scaling.md
    python benchmarks/scaling.py --sizes 100 1000 --out /tmp/s.md

The graphs are seeded random DAGs: each node reads one to three of the 50 nodes before it
(a window that keeps the graph deep as well as wide), 0.1-1 ms of compute on a unit-speed
device, 10 KB-1 MB edges; four devices of speeds 1, 1.5, 1 and 0.7 linked at 10 GB/s with
10 us latency, memory large enough that any split fits. Up to 250 nodes the exact model
(CP-SAT) runs on the whole graph; above that autoplace coarsens, solves, expands and improves
with local moves. The time limit is the whole solve, baselines included.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, machine_line, write_markdown  # noqa: E402

from autoplace.ir import (  # noqa: E402
    Cluster,
    Costs,
    Device,
    Edge,
    Link,
    OpGraph,
    OpNode,
    Problem,
)
from autoplace.simulate import validate  # noqa: E402
from autoplace.solve import solve  # noqa: E402

LIMITS = {100: 10.0, 1000: 60.0, 10000: 120.0}
SPEEDS = (1.0, 1.5, 1.0, 0.7)


def random_problem(n: int, seed: int = 0) -> Problem:
    rng = random.Random(seed)
    out_bytes = [rng.randint(10**4, 10**6) for _ in range(n)]
    edges = []
    for dst in range(1, n):
        for src in rng.sample(range(max(0, dst - 50), dst), min(dst, rng.randint(1, 3))):
            edges.append(Edge(f"n{src}", f"n{dst}", out_bytes[src]))
    graph = OpGraph(nodes=tuple(OpNode(f"n{i}", output_bytes=out_bytes[i],
                                       param_bytes=rng.randint(0, 10**6)) for i in range(n)),
                    edges=tuple(edges), name=f"random{n}")
    devices = tuple(Device(f"d{i}", type=f"speed{s:g}", memory_bytes=10**12)
                    for i, s in enumerate(SPEEDS))
    links = tuple(Link(a.name, b.name, 1e10, 1e-5) for a in devices for b in devices
                  if a is not b)
    work = [rng.uniform(1e-4, 1e-3) for _ in range(n)]
    costs = Costs(compute_s={f"n{i}": {d.name: work[i] / s for d, s in zip(devices, SPEEDS)}
                             for i in range(n)})
    return Problem(graph=graph, cluster=Cluster(devices=devices, links=links), costs=costs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(LIMITS))
    parser.add_argument("--out", default=str(RESULTS / "scaling.md"))
    args = parser.parse_args()
    lines = ["# Scaling: random task graphs", "",
             f"{machine_line()}. Command: "
             f"`python benchmarks/scaling.py`. Makespans in ms; gap = (plan - lower bound) / plan.",
             "", "| nodes | time limit s | wall s | plan ms | best baseline ms | lower bound ms "
             "| gap | solver | steps (ms) |", "| --- | --- | --- | --- | --- | --- | --- | --- "
             "| --- |"]
    for n in args.sizes:
        problem = random_problem(n)
        limit = LIMITS.get(n, 60.0)
        began = time.perf_counter()
        result = solve(problem, time_limit_s=limit)
        wall = time.perf_counter() - began
        assert validate(problem, result.schedule) == []
        feasible = {k: s.makespan_s for k, s in result.baselines.items()
                    if s is not None and s.feasible}
        name = min(feasible, key=feasible.__getitem__)
        steps = "; ".join(f"{step}: {value * 1e3:.2f}" for step, value in result.solver.steps)
        lines.append(f"| {n} | {limit:g} | {wall:.1f} | {result.schedule.makespan_s * 1e3:.2f} "
                     f"| {feasible[name] * 1e3:.2f} ({name}) | {result.lower_bound_s * 1e3:.2f} "
                     f"| {result.gap:.1%} | {result.solver.name} ({result.solver.status}) "
                     f"| {steps or '-'} |")
        print(lines[-1], flush=True)
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
