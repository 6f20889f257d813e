"""PipeDream's partitioner and autoplace's training planner on PipeDream's own profiles.

    python benchmarks/pipedream.py            # -> benchmarks/results/pipedream.md
    python benchmarks/pipedream.py --only vgg --devices 4 --out /tmp/p.md --time-limit 5

For each profile in ``../shared/benchdata/pipedream`` (or ``$AUTOPLACE_BENCHDATA/pipedream``)
and each device count, the time per sample of PipeDream's dynamic program (Narayanan et al.,
SOSP 2019, section 3.1; ``research.pipedream.partitioner``), of autoplace's replicated plan
(``research.pipedream.replicas.plan_replicas`` on
``research.pipedream.step_graph.profile_step_problem``), of pure data parallelism and of one
device, all scored by one rule (``research.pipedream.replicas.time_per_sample``; PipeDream's
plans are re-scored by it and checked against the DP's own value). A sample is one minibatch of
the batch the profile was taken with; times are in the profiles' unit, milliseconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]  # benchdata and common; research

import benchdata  # noqa: E402
from common import RESULTS, machine_line, write_markdown  # noqa: E402

from autoplace.ir import Problem  # noqa: E402
from autoplace.solve import SolveOptions  # noqa: E402
from autoplace.train.graph import BACKWARD  # noqa: E402
from cost_models.links import NETWORK_LATENCY_S  # noqa: E402
from research.pipedream.partitioner import (  # noqa: E402
    PIPEDREAM_BANDWIDTH_BYTES_PER_S,
    Chain,
    PipelinePlan,
    TrainingCluster,
    data_parallel,
    one_device,
    pipedream,
    training_chain,
)
from research.pipedream.profiles import read_profile  # noqa: E402
from research.pipedream.replicas import (  # noqa: E402
    MAX_ROUNDS,
    MOVES_PER_UNIT,
    ReplicaPlanning,
    ReplicatedPlan,
    plan_replicas,
    time_per_sample,
)
from research.pipedream.step_graph import profile_step_problem  # noqa: E402

MS = 1e3  # seconds to the profiles' milliseconds

NOTES = [
    "- **One rule scores every column** (`research.pipedream.replicas.time_per_sample`). A "
    "plan puts each layer, its forward and its backward, in a group of R devices that each run "
    "every R-th sample. A group's time is `max(forward + backward compute, ring all-reduce of its "
    "weights) / R`, the all-reduce `2 (R-1)/R * bytes / bandwidth + 2 (R-1) * latency` "
    "(`cost_models.ring_allreduce_s`). Two groups between which activations cross exchange, for "
    "each direction that carries any, one message of `latency + bytes / bandwidth` forward and "
    "one of the gradients back (a value read by several layers of a group crosses once); on "
    "a chain of stages that is PipeDream's `2 * (latency + bytes / bandwidth)` per boundary. "
    "The time per sample is the slowest group or link. This is PipeDream's cost model (SOSP "
    "2019, section 3.1) for any grouping of the layers, not only ranges; on PipeDream's own "
    "stages it gives the DP's value (the harness checks it on every row). Data parallel is one "
    "group on every device; one device is the whole forward and backward. Memory is not "
    "modelled.",
    "- **Layers.** Numbered from 1 in the profile's trace order (a topological order) after the "
    "input is dropped; `a-b xR` is a stage (a group) of layers a to b on R devices, `;` "
    "separates groups. PipeDream's DP cuts the trace order into ranges; autoplace places the "
    "layer graph, so its groups need not be ranges (`1-6,8 x1`). Such a group may see a sample "
    "more than once: the rule counts steady-state throughput only, as PipeDream's model does, "
    "and PipeDream's runtime, a chain of stages, could not run such a plan as it is.",
    "- **autoplace's plan** (`research.pipedream.replicas.plan_replicas`). Data parallelism "
    "first: where it reaches the work bound (one device's time over the devices, which no plan "
    "beats under the rule), it is the plan and nothing is solved. Otherwise, for each R dividing "
    "N below N: the training graph (`research.pipedream.step_graph`: a forward and a backward "
    "node per layer, colocated; activations forward, gradients back) on N/R devices, each R "
    "times as fast, is solved by autoplace's solver (`autoplace.solve.solve`, CP-SAT, objective "
    "`throughput`: the busiest device's compute plus copies, a time limit per solve); that "
    "placement is then polished under the rule by local moves (a layer to another group; the "
    "best replicas for each group, which may differ between groups; two groups merged), and the "
    "polished shape is solved again with the polished plan as a hint while that improves. The "
    "polish also starts, without a solve, from every layer in one group of each uniform shape. "
    "The solver's load adds a copy to both devices' compute, where the rule overlaps it with "
    "compute on the link: hence the polish under the rule. PipeDream's plan is never given to "
    "the planner. *Found from*: the start of the plan (the solver's placement for R, and in "
    "which round, or one group). *Solver alone, uniform R*: the best of the solver's own first "
    "plans for N/R groups of R devices, scored by the rule before any polish (R = N is data "
    "parallelism).",
    "- **The input.** Each profile's `Input` node carries the time to load a minibatch "
    "(up to 636 ms, in the column *input ms*). PipeDream's optimizer zeroes and removes input "
    "sources before partitioning (the input always enters at the first stage), and so do both "
    "planners here: that time is charged to no plan. Unused `__getitem__` outputs (GNMT, NASNet) "
    "are dropped likewise.",
    "- **Devices used.** Both planners may leave devices idle where another replica would be "
    "slower (PipeDream's `--use_fewer_machines`), and on ties take the fewer devices; the "
    "column counts those used (PipeDream / autoplace).",
]
TOLERANCE = 1e-9  # relative: "no worse" allows float rounding between two summation orders


@dataclass(frozen=True)
class Row:
    """One profile on one device count: PipeDream's plan, autoplace's, the two baselines."""

    chain: Chain
    devices: int
    pipedream: PipelinePlan
    pipedream_wall_s: float
    data_parallel_s: float
    one_device_s: float
    planning: ReplicaPlanning

    @property
    def ratio(self) -> float:
        """autoplace's time per sample over PipeDream's: at most 1 meets the target."""
        return self.planning.plan.time_per_sample_s / self.pipedream.time_per_sample_s

    @property
    def no_worse(self) -> bool:
        return self.ratio <= 1 + TOLERANCE

    @property
    def name(self) -> str:
        return self.chain.name


def _groups(chain: Chain, plan: ReplicatedPlan) -> str:
    """``1-13 x3; 14-22 x1``: each group's layers (1-based in the chain's order) as ranges, and
    its replicas; groups in the order of their first layer."""
    position = {name: k + 1 for k, name in enumerate(chain.layers)}
    members: dict[str, list[int]] = {}
    for node, group in plan.device_of.items():
        if node in position:
            members.setdefault(group, []).append(position[node])
    parts = []
    for group, layers in sorted(members.items(), key=lambda item: min(item[1])):
        layers.sort()
        runs = [[layers[0], layers[0]]]
        for k in layers[1:]:
            if k == runs[-1][1] + 1:
                runs[-1][1] = k
            else:
                runs.append([k, k])
        spans = ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)
        parts.append(f"{spans} x{plan.replicas[group]}")
    return "; ".join(parts)


def _rescored(problem: Problem, chain: Chain, plan: PipelinePlan,
              cluster: TrainingCluster) -> ReplicatedPlan:
    """PipeDream's stages as groups, timed by the rule; the same value as the DP's own."""
    device_of = {}
    for k, stage in enumerate(plan.stages):
        for name in chain.layers[stage.first:stage.end]:
            device_of[name] = device_of[name + BACKWARD] = f"s{k}"
    scored = time_per_sample(problem, device_of,
                             {f"s{k}": stage.replicas for k, stage in enumerate(plan.stages)},
                             cluster)
    assert abs(scored.time_per_sample_s / plan.time_per_sample_s - 1) <= TOLERANCE, \
        f"{chain.name}: the rule scores PipeDream's plan {scored.time_per_sample_s}, its DP " \
        f"{plan.time_per_sample_s}"
    return scored


def _rows(path: Path, device_counts: list[int], bandwidth: float, latency: float,
          options: SolveOptions) -> list[Row]:
    profile = read_profile(path)
    chain = training_chain(profile)
    rows = []
    for devices in device_counts:
        cluster = TrainingCluster(devices=devices, bandwidth_bytes_per_s=bandwidth,
                                  latency_s=latency)
        problem = profile_step_problem(profile, cluster)
        began = time.perf_counter()
        plan = pipedream(chain, cluster)
        wall = time.perf_counter() - began
        baselines = [_rescored(problem, chain, baseline(chain, cluster), cluster)
                     for baseline in (pipedream, data_parallel, one_device)]
        planning = plan_replicas(problem, cluster, options=options)
        row = Row(chain=chain, devices=devices, pipedream=plan, pipedream_wall_s=wall,
                  data_parallel_s=baselines[1].time_per_sample_s,
                  one_device_s=baselines[2].time_per_sample_s, planning=planning)
        print(f"{chain.name} x{devices}: PipeDream {plan.time_per_sample_s * MS:.2f} ms "
              f"({plan.compact()}), autoplace {planning.plan.time_per_sample_s * MS:.2f} "
              f"({_groups(chain, planning.plan)}), x{row.ratio:.3f}, "
              f"from {_found_by(planning)}, {planning.wall_s:.1f} s", flush=True)
        rows.append(row)
    return rows


def _found_by(planning: ReplicaPlanning) -> str:
    """Which start the plan came from: ``solver R=2, round 2``, ``one group R=1``, or data
    parallelism."""
    if planning.found_by is None:
        return "data parallel"
    attempt = planning.attempts[planning.found_by]
    if attempt.seed == "solver":
        return f"solver R={attempt.start}, round {attempt.round + 1}"
    return f"one group R={attempt.start}"


def _ms(seconds: float, *, bold: bool) -> str:
    return f"**{seconds * MS:.2f}**" if bold else f"{seconds * MS:.2f}"


def _line(row: Row) -> str:
    plan, planning = row.pipedream, row.planning
    ours = planning.plan.time_per_sample_s
    uniform = planning.uniform_s()
    best_r = min(uniform, key=lambda r: (uniform[r], -r))
    solved = [a for a in planning.attempts if a.seed == "solver"]
    at_limit = sum(a.status != "OPTIMAL" for a in solved)
    solves = f"{len(solved)} ({at_limit} at the limit)" if solved else "0 (work bound)"
    theirs_best = ours >= plan.time_per_sample_s * (1 - TOLERANCE)
    return (f"| {row.name} | {len(row.chain.layers)} | {row.chain.input_s * MS:.1f} "
            f"| {row.devices} | {_ms(plan.time_per_sample_s, bold=theirs_best)} "
            f"| {plan.compact().replace(', ', '; ')} "
            f"| {_ms(ours, bold=row.no_worse)} | {row.ratio:.3f} "
            f"| {_groups(row.chain, planning.plan)} | {_found_by(planning)} "
            f"| {plan.devices_used} / {planning.plan.devices_used} "
            f"| {uniform[best_r] * MS:.2f} (R={best_r}) "
            f"| {row.data_parallel_s * MS:.2f} | {row.one_device_s * MS:.2f} | {solves} "
            f"| {row.pipedream_wall_s:.2f} | {planning.wall_s:.1f} |")


def _summary(rows: list[Row], time_limit_s: float) -> list[str]:
    met = [r for r in rows if r.no_worse]
    better = [r for r in rows if r.ratio < 1 - TOLERANCE]
    worse = [r for r in rows if not r.no_worse]
    bound = [r for r in rows if not r.planning.attempts]
    worst = max(rows, key=lambda r: r.ratio)
    alone = [r for r in rows if r.planning.attempts
             and min(r.planning.uniform_s().values()) > r.pipedream.time_per_sample_s
             * (1 + TOLERANCE)]
    attempts = [a for r in rows for a in r.planning.attempts if a.seed == "solver"]
    polishes = [a for r in rows for a in r.planning.attempts]
    found = [r.planning.attempts[r.planning.found_by] for r in rows
             if r.planning.found_by is not None]
    return [
        f"**autoplace's plan is no worse than PipeDream's on {len(met)} of {len(rows)} rows** "
        f"(ratio at most 1 + {TOLERANCE:g}); worst ratio {worst.ratio:.3f}"
        f"{' (ties only)' if worst.no_worse and worst not in better else ''}. Better on "
        f"{len(better)}: {_names(better)}. Tied on {len(met) - len(better)}. Worse on "
        f"{len(worse)}: {_names(worse)}.",
        "",
        f"On {len(bound)} rows data parallelism reaches the work bound, so it is the plan of both "
        "planners and nothing is solved: weight synchronisation hides behind compute there. The "
        f"other {len(rows) - len(bound)} rows are models with large weights, where the split "
        "matters.",
        "",
        "Of those, the solver alone with uniform replicas (its best R, before any polish) is "
        f"worse than PipeDream on {len(alone)}: "
        f"{', '.join(f'{r.name} x{r.devices}' for r in alone) or 'none'}. Two reasons. "
        "PipeDream replicates some stages and not others (AlexNet's and VGG-16's convolutions "
        "on many devices, their fully connected layers, whose weights an all-reduce would "
        "have to move, alone; GNMT-large's 77 ms LSTM on 3 devices), which no uniform R "
        "expresses: the polish's replicas per group and merges find those shapes. And the "
        "solver's load adds every copy to the compute of both devices, where the rule overlaps "
        "it on the link: its placements cut where little crosses rather than where the "
        "rule's slowest term is smallest, which the polish's single moves correct.",
        "",
        f"{len(attempts)} solves in all, {time_limit_s:g} s limit each "
        f"({sum(a.status != 'OPTIMAL' for a in attempts)} stopped at the limit, the rest "
        f"optimal for their shape); at most {max((a.round for a in attempts), default=-1) + 1} "
        f"rounds from one start (of {MAX_ROUNDS}), at most "
        f"{max((a.moves for a in polishes), default=0)} steps in one polish (the cap is "
        f"{MOVES_PER_UNIT} per layer). Of the {len(found)} plans found by a search, "
        f"{sum(a.seed == 'solver' for a in found)} came from a solver's placement and "
        f"{sum(a.seed == 'one group' for a in found)} from one group (*found from*). The "
        "planner took "
        f"{sum(r.planning.wall_s for r in rows):.0f} s over all rows, PipeDream's DP "
        f"{sum(r.pipedream_wall_s for r in rows):.1f} s.",
    ]


def _names(rows: list[Row]) -> str:
    return ", ".join(f"{r.name} x{r.devices} ({r.ratio:.3f})" for r in rows) or "none"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="only profiles whose file name contains this text")
    parser.add_argument("--devices", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--bandwidth-gbps", type=float,
                        default=PIPEDREAM_BANDWIDTH_BYTES_PER_S * 8 / 1e9)
    parser.add_argument("--latency-us", type=float, default=NETWORK_LATENCY_S * 1e6)
    parser.add_argument("--time-limit", type=float, default=5.0,
                        help="seconds for each of autoplace's solves")
    parser.add_argument("--nondeterministic", action="store_true",
                        help="CP-SAT on every core with wall-clock limits (default: one worker "
                        "and deterministic limits, so that the table is the same on every run)")
    parser.add_argument("--out", default=str(RESULTS / "pipedream.md"))
    args = parser.parse_args()
    bandwidth, latency = args.bandwidth_gbps * 1e9 / 8, args.latency_us * 1e-6
    options = SolveOptions(time_limit_s=args.time_limit, objective="throughput",
                           deterministic=not args.nondeterministic)
    paths = sorted(p for p in (benchdata.benchdata_dir() / "pipedream").glob("*.graph.txt")
                   if args.only is None or args.only in p.name)
    if not paths:
        print(f"no profiles at {benchdata.benchdata_dir() / 'pipedream'}", file=sys.stderr)
        return 2
    clock = ("of wall time" if args.nondeterministic else
             "in CP-SAT's deterministic seconds (one worker: the same table on every run)")
    began = time.perf_counter()
    rows = [row for path in paths
            for row in _rows(path, args.devices, bandwidth, latency, options)]
    lines = ["# PipeDream's partitioner and autoplace's training plan on PipeDream's profiles",
             "",
             f"{machine_line()}. Command: `python benchmarks/pipedream.py"
             f"{' --only ' + args.only if args.only else ''}"
             f"{' --time-limit ' + format(args.time_limit, 'g') if args.time_limit != 5 else ''}"
             f"{' --nondeterministic' if args.nondeterministic else ''}`"
             f" ({time.perf_counter() - began:.0f} s). "
             f"{len(paths)} profiles (../shared/benchdata/pipedream: the 12 image classification "
             "models and GNMT in two sizes that msr-fiddle/pipedream's profiler ships; the issue's "
             "\"13 graphs\" presumably counts the two GNMTs as one model), "
             f"{', '.join(map(str, args.devices))} identical devices, every pair joined by "
             f"{args.bandwidth_gbps:g} Gbps ({bandwidth / 1e9:g} GB/s, PipeDream's Cluster-A "
             f"network between servers, SOSP 2019 section 5.1) with {args.latency_us:g} us "
             "latency. Times are **milliseconds per sample**, a sample being one minibatch of "
             "the batch each profile was taken with (the profiles' unit). Lower is better; the "
             "training planner's target is to be no worse than the PipeDream column on every "
             f"row. autoplace's solves have {args.time_limit:g} s each, {clock}.", "", *NOTES,
             "",
             "| model | layers | input ms (dropped) | devices | PipeDream ms | PipeDream stages "
             "| autoplace ms | autoplace / PipeDream | autoplace groups | found from "
             "| devices used (PipeDream / autoplace) | solver alone, uniform R ms "
             "| data parallel ms | one device ms | solves | DP s | planner s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
             "| --- | --- | --- | --- |"]
    lines += [_line(row) for row in rows]
    lines += ["", *_summary(rows, args.time_limit)]
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
