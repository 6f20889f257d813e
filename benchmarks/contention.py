"""What shared links (a host's NIC, a PCIe switch) do to plans made with and without them.

    PYTHONPATH=. python benchmarks/contention.py [--time-limit 20] [--only gpt2]
    # writes benchmarks/results/contention.md

For each example (traced, analytic costs, as ``autoplace plan`` costs it; and ``branches``, a
synthetic Inception-style block of 8 parallel 2 ms branches that each read and send 25 MB, where
spreading over both hosts pays only if the NICs are ignored) and each cluster:

* **2 hosts x 4 A100-40GB, 25 GB/s NICs**: the cross-host links are 25 GB/s each, and each
  host's NIC (25 GB/s each way, ``nic_bandwidth_bytes_per_s``) is shared by every transfer
  leaving or entering the host;
* **4 T4-16GB under 2 PCIe switches**: one host, PCIe links; cuda:0-1 and cuda:2-3 each sit
  behind a switch whose 16 GB/s uplink every transfer in or out of the pair crosses.

the plan solved **ignoring** contention (the same cluster without its shared links), its
makespan as that solve scored it and **re-simulated with contention** (same placement and
order); and the plan solved **with** contention: its simulated makespan, the solver's lower
bound (valid under contention: ``solve/contention.py``) and the gap. Both solves get the same
options (``--time-limit`` seconds, seed 0); the simulator scores every plan and baseline with
contention in the second.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoplace.cluster.file import load_cluster_file  # noqa: E402
from autoplace.ir import (  # noqa: E402
    Cluster,
    Costs,
    Edge,
    OpGraph,
    OpNode,
    Problem,
    optimality_gap,
)
from autoplace.pipeline.forward import Tracing, traced_problem  # noqa: E402
from autoplace.simulate import simulate, validate  # noqa: E402
from autoplace.solve import solve  # noqa: E402
from autoplace.trace.load import load_model_file  # noqa: E402
from benchmarks.common import RESULTS, machine_line, write_markdown  # noqa: E402

EXAMPLES = ("gpt2", "inception", "branches")
# The synthetic fork-join: an Inception-style block of 8 branches, each 2 ms on any device,
# reading 25 MB from a 0.1 ms stem and sending 25 MB to a 0.1 ms join (a task graph, no model).
BRANCHES, BRANCH_S, BRANCH_BYTES, STEM_S = 8, 2e-3, 25_000_000, 1e-4


def _two_hosts() -> str:
    hosts = "".join(f'[[hosts]]\nname = "h{h}"\ndevices = ["4xA100-40GB"]\n'
                    "nic_bandwidth_bytes_per_s = 25e9\n\n" for h in range(2))
    links = "".join(f'[[links]]\nsrc = "h0/cuda:{i}"\ndst = "h1/cuda:{j}"\n'
                    "bandwidth_bytes_per_s = 25e9\n\n" for i in range(4) for j in range(4))
    return hosts + links


PCIE_SWITCHES = textwrap.dedent("""
    [[hosts]]
    name = "box"
    devices = ["4xT4-16GB"]

    [[shared]]
    name = "switch0"
    bandwidth_bytes_per_s = 16e9
    devices = ["cuda:0", "cuda:1"]

    [[shared]]
    name = "switch1"
    bandwidth_bytes_per_s = 16e9
    devices = ["cuda:2", "cuda:3"]
""")

CLUSTERS = {
    "2 hosts x 4 A100-40GB, 25 GB/s NICs": _two_hosts(),
    "4 T4-16GB, 2 PCIe switches (16 GB/s uplinks)": PCIE_SWITCHES,
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def branches(cluster: Cluster) -> Problem:
    """The synthetic fork-join (``BRANCHES``) on ``cluster``."""
    nodes = (OpNode(name="stem", output_bytes=BRANCH_BYTES),
             *(OpNode(name=f"b{i}", output_bytes=BRANCH_BYTES) for i in range(BRANCHES)),
             OpNode(name="join"))
    edges = (*(Edge("stem", f"b{i}", BRANCH_BYTES) for i in range(BRANCHES)),
             *(Edge(f"b{i}", "join", BRANCH_BYTES) for i in range(BRANCHES)))
    costs = {n.name: dict.fromkeys(cluster.names, BRANCH_S if n.name[0] == "b" else STEM_S)
             for n in nodes}
    return Problem(graph=OpGraph(nodes=nodes, edges=edges, name="branches"), cluster=cluster,
                   costs=Costs(compute_s=costs))


def _problem(example: str, cluster: Cluster) -> Problem:
    if example == "branches":
        return branches(cluster)
    loaded = load_model_file(ROOT / "examples" / f"{example}.py")
    return traced_problem(loaded.model, loaded.args, loaded.kwargs, cluster,
                          Tracing(name=example, profile=False, cache=None, progress=False)
                          ).problem


def measure(example: str, label: str, toml: str, time_limit_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.toml"
        path.write_text(toml)
        cluster = load_cluster_file(path)
    shared = _problem(example, cluster)
    free = replace(shared, cluster=replace(shared.cluster, shared=()))
    began = time.perf_counter()
    ignoring = solve(free, time_limit_s=time_limit_s, seed=0)
    aware = solve(shared, time_limit_s=time_limit_s, seed=0)
    wall = time.perf_counter() - began
    placed = ignoring.schedule.placement
    replayed = simulate(shared, placed)
    problems = validate(shared, replayed) + validate(shared, aware.schedule)
    if problems:
        raise SystemExit(f"{example} on {label}: invalid schedule: {problems[:3]}")
    return {
        "example": example, "cluster": label, "nodes": len(shared.graph.nodes),
        "launched": bool(shared.launchers),
        "ignoring_s": ignoring.schedule.makespan_s, "replayed_s": replayed.makespan_s,
        "aware_s": aware.schedule.makespan_s, "bound_s": aware.lower_bound_s,
        "gap": optimality_gap(aware.schedule.makespan_s, aware.lower_bound_s),
        "status": aware.solver.status, "devices_ignoring": len(set(placed.device_of.values())),
        "devices_aware": len(set(aware.schedule.placement.device_of.values())),
        "wall_s": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--only", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--out", default=str(RESULTS / "contention.md"))
    args = parser.parse_args()
    rows = [measure(example, label, toml, args.time_limit)
            for example in args.only for label, toml in CLUSTERS.items()]
    lines = [
        "# Shared links: plans made ignoring contention against plans made with it",
        "",
        f"{machine_line()}; `PYTHONPATH=. python benchmarks/contention.py --time-limit "
        f"{args.time_limit:g}` (the machine was shared with other work: the wall times are "
        "loose, the makespans are the simulator's and do not depend on load, except through "
        "what each solve found within its time limit).",
        "",
        "Makespans in ms, of the folded traced graph with analytic costs (*branches*: the "
        "synthetic fork-join task graph of the script's docstring). *Ignoring*: solved "
        "on the cluster without its shared links, as scored by that solve, then *re-simulated* "
        "with contention (same placement and order). *Aware*: solved with the shared links; "
        "*bound*: that solve's lower bound (valid under contention); *gap* = (aware - bound) "
        "/ aware. *Devices*: how many devices each plan uses. *Wall*: both solves.",
        "",
        "| example | cluster | nodes | ignoring | re-simulated | aware | bound | gap | status "
        "| devices (ignoring / aware) | wall s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['example']} | {r['cluster']} | {r['nodes']} | {_ms(r['ignoring_s'])} | "
            f"{_ms(r['replayed_s'])} | {_ms(r['aware_s'])} | {_ms(r['bound_s'])} | "
            f"{r['gap']:.1%} | {r['status']} | {r['devices_ignoring']} / "
            f"{r['devices_aware']} | {r['wall_s']:.0f} |")
    lines += ["", "Every schedule in the table passed `validate` under contention."]
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    raise SystemExit(main())
