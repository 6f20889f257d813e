"""Readers for the external benchmark data in ``../shared/benchdata`` and the authors' scorers.

The data (see ``../shared/benchdata/README.md``) is read in place, never copied into the project;
``AUTOPLACE_BENCHDATA`` points elsewhere. Read in this order:

1. ``benchdata_dir``: where the data lives.
2. STG (Tobita & Kasahara, J. Scheduling 5(5), 2002): ``load_stg`` parses a ``.stg`` file,
   ``stg_problem`` turns it into an ``autoplace.ir.Problem`` on identical processors with no
   communication and no memory limit, ``load_optimal_csv`` reads the table of known optima.
3. Tarnawski et al. (NeurIPS 2020): ``load_tarnawski`` reads an input JSON into plain dataclasses,
   ``load_split`` reads the authors' split files (``reference-splits/``, ``human-experts/``) into
   an ``Assignment`` (node id -> ``(FPGA, i)`` or ``(CPU, j)``), ``fpga_overflow`` applies their
   memory rule.
4. The authors' two scoring rules, as the data README states them and as their released code
   (msr-fiddle/dnn-partitioning b207b6a: ``computeLoadForResultOrg`` in ``throughput-dp/dp.cpp``,
   ``computeLatency`` and ``reworkSplitIntoContiguous`` in ``latency-greedy/greedy.cpp``)
   computes them: ``max_load`` (``device_loads``), ``latency`` and ``contiguous_pieces``. They
   reproduce every value the README tables quote from the authors' split files. They are
   deliberately not the project's simulator: the benchmark reports both.
5. ``tarnawski_problem`` turns an input into a ``Problem`` for the project's solver and
   simulator; ``placement_of`` and ``assignment_of`` translate between the two worlds.

Errors on malformed data or an assignment the rules cannot score are ``BenchDataError``.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TypeVar

import networkx as nx

from autoplace.errors import AutoplaceError
from autoplace.ir import Cluster, Costs, Device, Edge, Link, OpGraph, OpNode, Placement, Problem
from autoplace.ir.graphs import cycle_text, find_cycle, longest_path_length

__all__ = [
    "BENCHDATA_ENV",
    "CPU",
    "FPGA",
    "UNLIMITED_BYTES",
    "Assignment",
    "BenchDataError",
    "OptimalRow",
    "Slot",
    "Split",
    "TarnawskiEdge",
    "TarnawskiInput",
    "TarnawskiNode",
    "assignment_of",
    "benchdata_dir",
    "contiguous_pieces",
    "device_loads",
    "fpga_overflow",
    "latency",
    "load_optimal_csv",
    "load_split",
    "load_stg",
    "load_tarnawski",
    "max_load",
    "placement_of",
    "stg_critical_path",
    "stg_problem",
    "tarnawski_problem",
]

BENCHDATA_ENV = "AUTOPLACE_BENCHDATA"
# "No memory limit" still needs a positive integer capacity; 1 PiB keeps every sum of
# capacities and bytes far inside int64, which CP-SAT models need.
UNLIMITED_BYTES = 1 << 50
# A link that moves the zero bytes of a communication-free edge in zero time (0 / bandwidth).
_FREE_LINK_BYTES_PER_S = 1e18


K = TypeVar("K", int, tuple[str, int])


class BenchDataError(AutoplaceError):
    """A benchmark file is malformed, or a split cannot be scored by the authors' rules."""


def benchdata_dir() -> Path:
    """``$AUTOPLACE_BENCHDATA`` if set, else ``../shared/benchdata`` next to the repo root."""
    override = os.environ.get(BENCHDATA_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[1].parent / "shared" / "benchdata"


def _topological(ids: Iterable[K], preds: Mapping[K, Iterable[K]]) -> list[K]:
    """The ids in topological order, the smallest id first among ready ones so the order is
    reproducible (networkx's lexicographical topological sort); a cycle is named."""
    graph = nx.DiGraph()
    graph.add_nodes_from(ids)
    graph.add_edges_from([(u, v) for v in graph for u in preds.get(v, ())])
    try:
        return list(nx.lexicographical_topological_sort(graph))
    except nx.NetworkXUnfeasible:
        cycle = find_cycle(graph)
        assert cycle is not None
        raise BenchDataError(f"the graph has a cycle: {cycle_text(cycle)}") from None


def _free_links(devices: list[Device]) -> Cluster:
    """The devices, with links that move zero bytes in zero time (0 latency, 0 / bandwidth)."""
    links = [Link(src=a.name, dst=b.name, bandwidth_bytes_per_s=_FREE_LINK_BYTES_PER_S,
                  latency_s=0.0, kind="benchmark")
             for a in devices for b in devices if a.name != b.name]
    return Cluster(devices=tuple(devices), links=tuple(links))


# --- STG -------------------------------------------------------------------------------------


def load_stg(path: str | Path) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Durations and predecessors of every task of a ``.stg`` file, both dummies included.

    The format is whitespace-separated integers: ``n``, then for each of the ``n + 2`` tasks
    ``id time k pred_1 .. pred_k``; lines starting with ``#`` after the graph are comments.
    """
    path = Path(path)
    body = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    tokens = [int(t) for line in body for t in line.split()]
    if not tokens:
        raise BenchDataError(f"{path} is empty")
    n, pos = tokens[0], 1
    durations: dict[int, int] = {}
    preds: dict[int, list[int]] = {}
    for expected in range(n + 2):
        if pos + 3 > len(tokens):
            raise BenchDataError(f"{path}: task {expected} of {n + 2} is missing")
        task, time, count = tokens[pos:pos + 3]
        if task != expected:
            raise BenchDataError(f"{path}: expected task {expected}, found {task}")
        durations[task] = time
        preds[task] = tokens[pos + 3:pos + 3 + count]
        pos += 3 + count
    if pos != len(tokens):
        raise BenchDataError(f"{path}: {len(tokens) - pos} numbers after the last task")
    for task, ps in preds.items():
        unknown = [p for p in ps if p not in durations]
        if unknown:
            raise BenchDataError(f"{path}: task {task} names unknown predecessors {unknown}")
    return durations, preds


def stg_critical_path(durations: Mapping[int, int], preds: Mapping[int, list[int]]) -> int:
    """Length of the longest path, summing task durations (no communication in STG)."""
    return longest_path_length(durations, [(p, t) for t in durations for p in preds[t]])


def stg_problem(path: str | Path, procs: int) -> Problem:
    """The STG instance on ``procs`` identical processors ``p0..``: durations in seconds (the
    integers as they are), zero-byte edges over zero-latency links (so every transfer takes
    0 s), and memory that never binds. Nodes are ``t0``..``t{n+1}``; the exit dummy is the
    output."""
    if procs < 1:
        raise BenchDataError(f"procs must be at least 1, got {procs}")
    durations, preds = load_stg(path)
    order = _topological(durations, preds)
    nodes = tuple(OpNode(name=f"t{t}") for t in order)
    edges = tuple(Edge(src=f"t{p}", dst=f"t{t}", bytes=0) for t in order for p in preds[t])
    graph = OpGraph(nodes=nodes, edges=edges, outputs=(f"t{order[-1]}",),
                    name=Path(path).stem)
    devices = [Device(name=f"p{i}", type="stg-processor", memory_bytes=UNLIMITED_BYTES,
                      torch_device="cpu") for i in range(procs)]
    compute = {f"t{t}": dict.fromkeys((d.name for d in devices), float(durations[t]))
               for t in order}
    costs = Costs(compute_s=compute, source=dict.fromkeys(compute, "stg"))
    return Problem(graph=graph, cluster=_free_links(devices), costs=costs)


@dataclass(frozen=True)
class OptimalRow:
    """One row of ``stg50/optimal.csv``; ``lower == upper`` when ``status == "optimal"``."""

    size: int
    graph: str
    procs: int
    lower: int
    upper: int
    status: str
    trivial_lb: int
    cp: int
    work: int


def load_optimal_csv(path: str | Path | None = None) -> list[OptimalRow]:
    """The rows of ``optimal.csv`` (default: ``benchdata_dir()/stg50/optimal.csv``)."""
    path = Path(path) if path is not None else benchdata_dir() / "stg50" / "optimal.csv"
    with path.open(newline="") as f:
        return [
            OptimalRow(size=int(r["size"]), graph=r["graph"], procs=int(r["procs"]),
                       lower=int(r["lower"]), upper=int(r["upper"]), status=r["status"],
                       trivial_lb=int(r["trivial_lb"]), cp=int(r["cp"]), work=int(r["work"]))
            for r in csv.DictReader(f)
        ]


# --- Tarnawski et al.: data ------------------------------------------------------------------

FPGA = "fpga"
CPU = "cpu"
Slot = tuple[str, int]
"""A device in the authors' terms: ``(FPGA, i)`` (any accelerator) or ``(CPU, j)``."""
Assignment = dict[int, Slot]
"""Node id -> the device it runs on."""


@dataclass(frozen=True)
class TarnawskiNode:
    """A node as the input JSON gives it (``colorClass`` is optional there: ``None``)."""

    id: int
    supported_on_fpga: bool
    cpu_latency: float
    fpga_latency: float
    is_backward: bool
    color_class: int | None
    size: float
    name: str = ""


@dataclass(frozen=True)
class TarnawskiEdge:
    """``cost`` is the time to move ``source_id``'s output to another device."""

    source_id: int
    dest_id: int
    cost: float


@dataclass(frozen=True)
class TarnawskiInput:
    """One input file: ``max_fpgas`` accelerators of ``max_size_per_fpga`` bytes, ``max_cpus``
    CPUs, the nodes and edges."""

    name: str
    max_size_per_fpga: float
    max_fpgas: int
    max_cpus: int
    nodes: tuple[TarnawskiNode, ...]
    edges: tuple[TarnawskiEdge, ...]

    @cached_property
    def node(self) -> dict[int, TarnawskiNode]:
        return {n.id: n for n in self.nodes}

    @cached_property
    def succs(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for e in self.edges:
            out[e.source_id].append(e.dest_id)
        return out

    @cached_property
    def preds(self) -> dict[int, list[int]]:
        into: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for e in self.edges:
            into[e.dest_id].append(e.source_id)
        return into

    @cached_property
    def out_cost(self) -> dict[int, float]:
        """Each node's communication cost: the ``cost`` of its outgoing edges (0 if none)."""
        cost = dict.fromkeys(self.node, 0.0)
        cost.update({e.source_id: e.cost for e in self.edges})
        return cost

    @cached_property
    def topological(self) -> list[int]:
        return _topological(self.node, self.preds)


def load_tarnawski(path: str | Path) -> TarnawskiInput:
    """Read an input JSON; checks what the authors' code checks (known ids, one outgoing cost
    per node to within 1e-6, a DAG)."""
    path = Path(path)
    raw = json.loads(path.read_text())
    nodes = tuple(
        TarnawskiNode(id=int(n["id"]), supported_on_fpga=bool(n["supportedOnFpga"]),
                      cpu_latency=float(n["cpuLatency"]), fpga_latency=float(n["fpgaLatency"]),
                      is_backward=bool(n.get("isBackwardNode", False)),
                      color_class=None if n.get("colorClass") is None else int(n["colorClass"]),
                      size=float(n.get("size", 0.0)), name=str(n.get("name", "")))
        for n in raw["nodes"])
    edges = tuple(TarnawskiEdge(source_id=int(e["sourceId"]), dest_id=int(e["destId"]),
                                cost=float(e["cost"])) for e in raw["edges"])
    ids = {n.id for n in nodes}
    if len(ids) != len(nodes):
        raise BenchDataError(f"{path}: node ids repeat")
    first_cost: dict[int, float] = {}
    for e in edges:
        for end in (e.source_id, e.dest_id):
            if end not in ids:
                raise BenchDataError(f"{path}: edge {e.source_id}->{e.dest_id} names node {end}")
        seen = first_cost.setdefault(e.source_id, e.cost)
        if abs(seen - e.cost) > 1e-6:
            raise BenchDataError(f"{path}: node {e.source_id} has outgoing costs {seen} and "
                                 f"{e.cost}; the authors' model needs one cost per node")
    name = f"{path.parent.name}/{path.stem}"
    data = TarnawskiInput(name=name, max_size_per_fpga=float(raw["maxSizePerFPGA"]),
                          max_fpgas=int(raw["maxFPGAs"]), max_cpus=int(raw["maxCPUs"]),
                          nodes=nodes, edges=edges)
    data.topological  # noqa: B018 - raises on a cycle now rather than in a scorer later
    return data


@dataclass(frozen=True)
class Split:
    """A split file: the assignment, and the values the file reports (``None`` where absent or
    given as -1, as the expert files do): ``total_latency``, ``max_load`` and per-device
    ``loads``."""

    assignment: Assignment
    total_latency: float | None
    max_load: float | None
    loads: Mapping[Slot, float]


def load_split(path: str | Path) -> Split:
    """Read the authors' output format ``{"cpus": [{"nodes": [...]}], "fpgas": [...]}``:
    ``fpgas[i]`` becomes ``(FPGA, i)`` and ``cpus[j]`` becomes ``(CPU, j)``."""
    path = Path(path)
    raw = json.loads(path.read_text())
    assignment: Assignment = {}
    loads: dict[Slot, float] = {}
    for kind in (FPGA, CPU):
        for i, machine in enumerate(raw.get(f"{kind}s", [])):
            slot = (kind, i)
            for node_id in machine["nodes"]:
                if node_id in assignment:
                    raise BenchDataError(f"{path}: node {node_id} is listed twice")
                assignment[int(node_id)] = slot
            if machine.get("load", -1) != -1:
                loads[slot] = float(machine["load"])

    def reported(key: str) -> float | None:
        value = raw.get(key)
        return None if value is None or value == -1 else float(value)

    return Split(assignment=assignment, total_latency=reported("totalLatency"),
                 max_load=reported("maxLoad"), loads=loads)


def _check_complete(data: TarnawskiInput, assignment: Mapping[int, Slot]) -> None:
    missing = [i for i in data.node if i not in assignment]
    unknown = [i for i in assignment if i not in data.node]
    if missing or unknown:
        raise BenchDataError(f"the split for {data.name} must place every node exactly: "
                             f"{len(missing)} unplaced (first {missing[:5]}), "
                             f"{len(unknown)} unknown (first {unknown[:5]})")
    bad = {slot for slot in assignment.values() if slot[0] not in (FPGA, CPU) or slot[1] < 0}
    if bad:
        raise BenchDataError(f"devices must be ({FPGA!r}, i) or ({CPU!r}, j), got {sorted(bad)}")


def fpga_overflow(data: TarnawskiInput, assignment: Mapping[int, Slot]) -> dict[Slot, float]:
    """Bytes by which each over-full accelerator exceeds ``max_size_per_fpga`` (the authors'
    only memory rule: the sizes of an accelerator's nodes add up; CPUs are unlimited)."""
    used: dict[Slot, float] = defaultdict(float)
    for node_id, slot in assignment.items():
        if slot[0] == FPGA:
            used[slot] += data.node[node_id].size
    return {slot: b - data.max_size_per_fpga for slot, b in sorted(used.items())
            if b > data.max_size_per_fpga}


# --- Tarnawski et al.: the authors' two rules ------------------------------------------------


def device_loads(data: TarnawskiInput, assignment: Mapping[int, Slot]) -> dict[Slot, float]:
    """Each used device's load under the max-load rule (see ``max_load``)."""
    _check_complete(data, assignment)
    compute: dict[Slot, float] = defaultdict(float)
    for node in data.nodes:
        slot = assignment[node.id]
        compute[slot] += node.fpga_latency if slot[0] == FPGA else node.cpu_latency
    comm: dict[Slot, float] = defaultdict(float)
    for node in data.nodes:
        own = assignment[node.id]
        receivers = {assignment[v] for v in data.succs[node.id]} - {own}
        if receivers:
            cost = data.out_cost[node.id]
            comm[own] += cost
            for slot in receivers:
                comm[slot] += cost
    return {slot: t + (comm[slot] if slot[0] == FPGA else 0.0)
            for slot, t in sorted(compute.items())}


def max_load(data: TarnawskiInput, assignment: Mapping[int, Slot]) -> float:
    """The throughput objective (the data README's max-load rule, ``computeLoadForResultOrg``):
    a device's load is its nodes' latencies (``fpga_latency`` on an accelerator, ``cpu_latency``
    on a CPU) plus, on accelerators only, communication: every node ``u`` with an edge to
    another device adds ``cost(u)`` once to its own device and once to each other device that
    reads it. The largest load.

    Each CPU is its own device here; the authors' code pools all CPUs into one group, which is
    the same thing on every throughput input (all have ``max_cpus == 1``).
    """
    return max(device_loads(data, assignment).values(), default=0.0)


def latency(data: TarnawskiInput, assignment: Mapping[int, Slot]) -> float:
    """The one-sample objective (the data README's latency rule, ``computeLatency``).

    Each accelerator's node set is contracted into one block, CPU nodes stay single; the
    contracted graph must be acyclic (``contiguous_pieces`` makes any split so, as the
    authors' tool does before scoring). In topological order of the contracted graph, a CPU
    node finishes at the latest finish of its predecessors plus its ``cpu_latency``; a block
    finishes at the latest finish of the outside nodes that feed it, plus the ``cost`` of each
    such feeding node, plus its nodes' ``fpga_latency``, plus the ``cost`` of each of its nodes
    with an edge leaving the block; all its nodes finish then. The latest finish.
    """
    _check_complete(data, assignment)
    members: dict[Slot, list[int]] = defaultdict(list)
    for node_id, slot in assignment.items():
        if slot[0] == FPGA:
            members[slot].append(node_id)
    # Contracted graph: a block is an accelerator's slot, or ("node", id) for a CPU node.
    block_of = {i: (s if s[0] == FPGA else ("node", i)) for i, s in assignment.items()}
    block_preds: dict[Slot, set[Slot]] = defaultdict(set)
    for e in data.edges:
        a, b = block_of[e.source_id], block_of[e.dest_id]
        if a != b:
            block_preds[b].add(a)
    try:
        order = _topological(set(block_of.values()), block_preds)
    except BenchDataError:
        raise BenchDataError(
            f"the split of {data.name} is not contiguous: contracting each accelerator's nodes "
            f"({', '.join(f'fpga{i}' for _, i in sorted(members))}) makes a cycle; use "
            "contiguous_pieces() first, as the authors' -computeLatency does") from None
    finish: dict[int, float] = {}
    for block in order:
        if block[0] != FPGA:
            v = block[1]
            finish[v] = data.node[v].cpu_latency + max(
                (finish[u] for u in data.preds[v]), default=0.0)
            continue
        inside = set(members[block])
        feeders = {u for v in inside for u in data.preds[v] if u not in inside}
        senders = [u for u in inside if any(v not in inside for v in data.succs[u])]
        done = (max((finish[u] for u in feeders), default=0.0)
                + sum(data.out_cost[u] for u in feeders)
                + sum(data.node[u].fpga_latency for u in inside)
                + sum(data.out_cost[u] for u in senders))
        finish.update(dict.fromkeys(inside, done))
    return max(finish.values(), default=0.0)


def contiguous_pieces(data: TarnawskiInput, assignment: Mapping[int, Slot]) -> Assignment:
    """Split every accelerator's node set into contiguous pieces, each on its own accelerator
    (the authors' ``reworkSplitIntoContiguous``, applied before scoring a given split): a node
    goes to piece ``1 + the largest number of times a path into it leaves the set``. A split that
    is already contiguous comes back unchanged; others may use more than ``max_fpgas``.
    CPU nodes keep their CPU."""
    _check_complete(data, assignment)
    result: Assignment = {i: s for i, s in assignment.items() if s[0] == CPU}
    next_fpga = 0
    for index in sorted({s[1] for s in assignment.values() if s[0] == FPGA}):
        inside = {i for i, s in assignment.items() if s == (FPGA, index)}
        depth: dict[int, int] = {}
        for v in data.topological:
            if v in inside:
                depth[v] = max((depth[u] + (u not in inside) for u in data.preds[v]), default=1)
                depth[v] = max(depth[v], 1)
            else:
                depth[v] = max((depth[u] for u in data.preds[v]), default=0)
        for v in inside:
            result[v] = (FPGA, next_fpga + depth[v] - 1)
        next_fpga += max(depth[v] for v in inside)
    return result


# --- Tarnawski et al.: as an autoplace Problem -----------------------------------------------


def tarnawski_problem(data: TarnawskiInput, *, unsupported_cost_s: float = math.inf) -> Problem:
    """The input as a ``Problem`` for the project's solver and simulator.

    * Devices ``fpga0..`` (``max_fpgas`` accelerators of ``max_size_per_fpga`` bytes) and
      ``cpu0..`` (``max_cpus`` CPUs, ``UNLIMITED_BYTES``); nodes ``n<id>``, topologically sorted.
    * Times are the input's numbers taken as seconds: ``fpga_latency`` on accelerators,
      ``cpu_latency`` on CPUs. A node that is not ``supported_on_fpga`` costs
      ``unsupported_cost_s`` on every accelerator: ``math.inf``, the IR's "cannot run there",
      by default (no node in the released inputs is unsupported).
    * ``param_bytes`` is the node's ``size``; colour classes become colocation groups.
    * Each edge's fixed ``transfer_s`` is its ``cost``, whatever the devices; it carries 0 bytes
      and nodes output 0 bytes, because the authors' model has no activation memory (their only
      memory rule is the sum of sizes). The links are free and only complete the cluster.
    """
    order = data.topological
    nodes = tuple(OpNode(name=f"n{i}", param_bytes=round(data.node[i].size)) for i in order)
    edges = tuple(Edge(src=f"n{e.source_id}", dst=f"n{e.dest_id}", bytes=0, transfer_s=e.cost)
                  for e in sorted(data.edges, key=lambda e: (e.source_id, e.dest_id)))
    classes: dict[int, list[str]] = defaultdict(list)
    for i in order:
        if data.node[i].color_class is not None:
            classes[data.node[i].color_class].append(f"n{i}")
    colocate = tuple(tuple(g) for g in classes.values() if len(g) > 1)
    sinks = tuple(f"n{i}" for i in order if not data.succs[i])
    graph = OpGraph(nodes=nodes, edges=edges, colocate=colocate, outputs=sinks,
                    name=data.name)
    fpgas = [Device(name=f"fpga{i}", type="tarnawski-accelerator",
                    memory_bytes=int(data.max_size_per_fpga), torch_device=f"cuda:{i}")
             for i in range(data.max_fpgas)]
    # The authors' CPU pays no communication in a load; the simulator can say the same.
    cpus = [Device(name=f"cpu{j}", type="tarnawski-cpu", memory_bytes=UNLIMITED_BYTES,
                   torch_device="cpu", charges_transfers=False) for j in range(data.max_cpus)]
    compute: dict[str, dict[str, float]] = {}
    for i in order:
        node = data.node[i]
        on_fpga = node.fpga_latency if node.supported_on_fpga else unsupported_cost_s
        compute[f"n{i}"] = {**{d.name: on_fpga for d in fpgas},
                            **{d.name: node.cpu_latency for d in cpus}}
    costs = Costs(compute_s=compute, source=dict.fromkeys(compute, "profiled"))
    return Problem(graph=graph, cluster=_free_links(fpgas + cpus), costs=costs)


def placement_of(assignment: Mapping[int, Slot]) -> Placement:
    """An ``Assignment`` as a ``Placement`` on ``tarnawski_problem``'s devices."""
    return Placement(device_of={f"n{i}": f"{kind}{index}"
                                for i, (kind, index) in assignment.items()})


def assignment_of(placement: Placement) -> Assignment:
    """A ``Placement`` on ``tarnawski_problem``'s devices as an ``Assignment``."""
    out: Assignment = {}
    for name, device in placement.device_of.items():
        kind = FPGA if device.startswith(FPGA) else CPU
        if not name.startswith("n") or not device.startswith(kind):
            raise BenchDataError(f"{name!r} on {device!r} is not a tarnawski_problem placement")
        out[int(name[1:])] = (kind, int(device[len(kind):]))
    return out
