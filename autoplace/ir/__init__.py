"""The one graph IR every stage shares: plain, frozen data.

Read in this order: ``OpNode`` and ``Edge`` make an ``OpGraph`` (a DAG kept in topological order);
``Device`` and ``Link`` make a ``Cluster``, with the ``SharedLink``s (NICs, PCIe switches) whose
bandwidth concurrent transfers share; ``Costs`` says how long each node takes on each device;
a ``Problem`` bundles the three and is what solvers and the simulator take. A ``Placement`` maps
nodes to devices (with an optional per-device execution order); the simulator turns it into a
``Schedule``. After tracing, nothing here refers to torch: only names, shapes, dtypes and bytes.
``OpGraph.to_networkx`` hands the graph to networkx's algorithms (``graphs`` holds the helpers
several stages share); colocation groups are merged with networkx's union-find.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx
from networkx.utils import UnionFind

from autoplace.errors import DeviceSpecError, GraphError
from autoplace.ir.graphs import cycle_text, find_cycle
from autoplace.ir.host import HostCosts

__all__ = [
    "Cluster",
    "Costs",
    "Device",
    "Edge",
    "HostCosts",
    "Link",
    "OpGraph",
    "OpNode",
    "Placement",
    "Problem",
    "Schedule",
    "SharedLink",
    "Transfer",
]


@dataclass(frozen=True)
class OpNode:
    """One schedulable unit: a traced op, or a group of them after coarsening.

    ``param_bytes`` are the parameters and buffers resident on the node's device (each tensor is
    attributed to exactly one node; nodes that share a tensor are colocated instead);
    ``trainable_bytes`` of them are parameters a training step updates (``requires_grad``), not
    buffers or frozen parameters (``autoplace.train``).
    ``output_bytes`` is the size of everything the node produces; ``view_bytes`` of them are
    views of storage held anyway (of parameters and buffers, which are resident; an expanded
    view's size beyond its base, which ``output_bytes`` also counts), so the node's device holds
    ``output_bytes - view_bytes`` for its outputs, while a copy to another device moves all of
    ``output_bytes``. ``workspace_bytes`` is what
    it needs while it runs beyond its inputs and outputs: an op's scratch memory as profiled on
    a GPU (``torch.cuda.max_memory_allocated`` above inputs and outputs), or a coarse group's
    internal peak (its members' intermediates, see ``autoplace.fold``). ``flops`` and
    ``bytes_accessed`` feed the analytic cost model; ``launches`` counts kernels.
    """

    name: str
    ops: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    module: str = ""
    is_input: bool = False
    output_shapes: tuple[tuple[int, ...], ...] = ()
    output_dtypes: tuple[str, ...] = ()
    output_bytes: int = 0
    view_bytes: int = 0
    param_bytes: int = 0
    trainable_bytes: int = 0
    workspace_bytes: int = 0
    flops: float = 0.0
    bytes_accessed: int = 0
    launches: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not self.ops:
            object.__setattr__(self, "ops", (self.name,))
        if self.output_bytes < 0 or self.param_bytes < 0 or self.workspace_bytes < 0:
            raise GraphError(f"node {self.name!r} has negative bytes")
        if not 0 <= self.trainable_bytes <= self.param_bytes:
            raise GraphError(f"node {self.name!r} has trainable_bytes {self.trainable_bytes} "
                             f"outside 0..{self.param_bytes} (its param_bytes)")
        if not 0 <= self.view_bytes <= self.output_bytes:
            raise GraphError(f"node {self.name!r} has view_bytes {self.view_bytes} outside 0.."
                             f"{self.output_bytes} (its output_bytes)")


@dataclass(frozen=True)
class Edge:
    """Data flowing from ``src`` to ``dst``: ``bytes`` of ``src``'s output that ``dst`` reads.

    Moving it between two devices takes the link's ``latency + bytes / bandwidth``, unless
    ``transfer_s`` fixes the time (graphs from a profiler that measured it).
    """

    src: str
    dst: str
    bytes: int
    transfer_s: float | None = None

    def __post_init__(self) -> None:
        if self.transfer_s is not None and not self.transfer_s >= 0:
            raise GraphError(f"edge {self.src!r} -> {self.dst!r} has transfer time "
                             f"{self.transfer_s}: it must be a number >= 0")


@dataclass(frozen=True)
class OpGraph:
    """A DAG of ``OpNode`` in topological order, with colocation groups.

    ``colocate`` lists groups of node names that must share a device (tied parameters).
    ``outputs`` names the nodes whose results the model returns.
    """

    nodes: tuple[OpNode, ...]
    edges: tuple[Edge, ...]
    colocate: tuple[tuple[str, ...], ...] = ()
    outputs: tuple[str, ...] = ()
    name: str = "model"

    def __post_init__(self) -> None:
        index: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if node.name in index:
                raise GraphError(f"node name {node.name!r} appears twice in graph {self.name!r}")
            index[node.name] = i
        for edge in self.edges:
            for end in (edge.src, edge.dst):
                if end not in index:
                    raise GraphError(
                        f"edge {edge.src!r} -> {edge.dst!r} names unknown node {end!r}"
                    )
            if index[edge.src] >= index[edge.dst]:
                raise GraphError(f"edge {edge.src!r} -> {edge.dst!r} goes backwards: nodes must "
                                 f"be listed in topological order ({self._why_backwards()})")
            if edge.bytes < 0:
                raise GraphError(f"edge {edge.src!r} -> {edge.dst!r} has negative bytes")
            if edge.bytes > self.nodes[index[edge.src]].output_bytes:
                raise GraphError(
                    f"edge {edge.src!r} -> {edge.dst!r} carries {edge.bytes} bytes but "
                    f"{edge.src!r} outputs only {self.nodes[index[edge.src]].output_bytes}"
                )
        pairs = [(edge.src, edge.dst) for edge in self.edges]
        if len(set(pairs)) != len(pairs):
            dup = next(p for p in pairs if pairs.count(p) > 1)
            raise GraphError(f"edge {dup[0]!r} -> {dup[1]!r} appears twice: merge the two into "
                             "one edge carrying the bytes read")
        for group in self.colocate:
            for name in group:
                if name not in index:
                    raise GraphError(f"colocation group names unknown node {name!r}")
        for name in self.outputs:
            if name not in index:
                raise GraphError(f"output names unknown node {name!r}")

    def _why_backwards(self) -> str:
        """The cycle when the edges have one, else that the node list is unsorted."""
        cycle = find_cycle(self.to_networkx())
        if cycle is None:
            return "the edges form no cycle: sort the node list"
        return f"the edges form a cycle: {cycle_text(cycle)}"

    def to_networkx(self) -> nx.DiGraph:
        """The graph as a frozen ``nx.DiGraph``: nodes by name with the ``OpNode`` as ``node``,
        edges with ``bytes`` and the ``Edge`` as ``edge``; nodes and each node's successors in
        the order of ``nodes`` and ``edges``. Built once per graph."""
        return self._networkx

    @cached_property
    def _networkx(self) -> nx.DiGraph:
        graph = nx.DiGraph(name=self.name)
        graph.add_nodes_from((node.name, {"node": node}) for node in self.nodes)
        graph.add_edges_from((edge.src, edge.dst, {"bytes": edge.bytes, "edge": edge})
                             for edge in self.edges)
        return nx.freeze(graph)

    @cached_property
    def index(self) -> dict[str, int]:
        return {node.name: i for i, node in enumerate(self.nodes)}

    @cached_property
    def _by_name(self) -> dict[str, OpNode]:
        return {node.name: node for node in self.nodes}

    @cached_property
    def _preds(self) -> dict[str, list[Edge]]:
        preds: dict[str, list[Edge]] = {node.name: [] for node in self.nodes}
        for edge in self.edges:
            preds[edge.dst].append(edge)
        return preds

    @cached_property
    def _succs(self) -> dict[str, list[Edge]]:
        succs: dict[str, list[Edge]] = {node.name: [] for node in self.nodes}
        for edge in self.edges:
            succs[edge.src].append(edge)
        return succs

    @cached_property
    def counts_launches(self) -> bool:
        """Whether the nodes say how many kernels they launch (a traced model's do; a task
        graph given as JSON does not)."""
        return any(n.launches for n in self.nodes)

    def node(self, name: str) -> OpNode:
        return self._by_name[name]

    def in_edges(self, name: str) -> list[Edge]:
        return self._preds[name]

    def out_edges(self, name: str) -> list[Edge]:
        return self._succs[name]

    @cached_property
    def colocation_of(self) -> dict[str, tuple[str, ...]]:
        """Each node's colocation group (itself alone when it has none), groups merged if they
        overlap."""
        sets = UnionFind(node.name for node in self.nodes)
        for group in self.colocate:
            sets.union(*group)
        members: dict[str, list[str]] = {}
        for node in self.nodes:
            members.setdefault(sets[node.name], []).append(node.name)
        return {node.name: tuple(members[sets[node.name]]) for node in self.nodes}

    @property
    def total_param_bytes(self) -> int:
        return sum(node.param_bytes for node in self.nodes)


@dataclass(frozen=True)
class Device:
    """A device the plan can use. ``name`` is unique in the cluster (``cuda:0``, ``cpu``,
    ``host1/cuda:0``); ``type`` is a catalog name (``A100-40GB``); ``torch_device`` is what the
    emitted model passes to ``torch.device``."""

    name: str
    type: str
    memory_bytes: int
    host: str = "localhost"
    torch_device: str = ""
    # Whether copies to and from this device count in its pipelined load. A host CPU whose
    # copies are driven by the accelerators' DMA engines pays none (Tarnawski et al. count it so).
    charges_transfers: bool = True
    # Memory the runtime holds before any tensor (CUDA context, cuBLAS workspace): charged as
    # resident. Defaults per device type in ``cost_models.devices``; a cluster file overrides.
    reserved_bytes: int = 0

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0:
            raise DeviceSpecError(
                f"device {self.name!r} has memory_bytes={self.memory_bytes}: it must be positive"
            )
        if not 0 <= self.reserved_bytes < self.memory_bytes:
            raise DeviceSpecError(
                f"device {self.name!r} reserves {self.reserved_bytes} bytes of its "
                f"{self.memory_bytes}: the reserve must be >= 0 and below the memory"
            )
        if not self.torch_device:
            object.__setattr__(self, "torch_device", self.name.rsplit("/", 1)[-1])


@dataclass(frozen=True)
class Link:
    """A directed link: moving ``n`` bytes takes ``latency_s + n / bandwidth_bytes_per_s``."""

    src: str
    dst: str
    bandwidth_bytes_per_s: float
    latency_s: float
    kind: str = ""

    def __post_init__(self) -> None:
        if self.bandwidth_bytes_per_s <= 0 or self.latency_s < 0:
            raise DeviceSpecError(
                f"link {self.src} -> {self.dst} needs bandwidth > 0 and latency >= 0, got "
                f"{self.bandwidth_bytes_per_s} B/s and {self.latency_s} s"
            )

    def transfer_s(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class SharedLink:
    """A resource that the transfers of several device pairs cross: a host's NIC, a PCIe switch.
    ``pairs`` are the directed ``(src, dst)`` device pairs whose transfers cross it; transfers on
    it at the same time share its ``bandwidth_bytes_per_s`` (max-min fair,
    ``simulate.contention``), where a ``Link`` alone is never shared."""

    name: str
    bandwidth_bytes_per_s: float
    pairs: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0 or not math.isfinite(self.bandwidth_bytes_per_s):
            raise DeviceSpecError(f"shared link {self.name!r} needs a finite bandwidth > 0, got "
                                  f"{self.bandwidth_bytes_per_s} B/s")
        if not self.pairs:
            raise DeviceSpecError(f"shared link {self.name!r} is crossed by no device pair: "
                                  "name the pairs (or devices) whose transfers cross it")


@dataclass(frozen=True)
class Cluster:
    """Devices and a link for every ordered pair of distinct devices; ``shared``: the resources
    (NICs, switches) that links cross and share, none by default."""

    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    shared: tuple[SharedLink, ...] = ()

    def __post_init__(self) -> None:
        if not self.devices:
            raise DeviceSpecError("a cluster needs at least one device")
        names = [d.name for d in self.devices]
        if len(set(names)) != len(names):
            raise DeviceSpecError(f"device names must be unique, got {names}")
        have = {(link.src, link.dst) for link in self.links}
        for a in names:
            for b in names:
                if a != b and (a, b) not in have:
                    raise DeviceSpecError(f"no link from {a!r} to {b!r}")
        seen: set[str] = set()
        for res in self.shared:
            if res.name in seen:
                raise DeviceSpecError(f"shared link name {res.name!r} is used twice")
            seen.add(res.name)
            for a, b in res.pairs:
                if a == b or (a, b) not in have:
                    raise DeviceSpecError(
                        f"shared link {res.name!r} names the pair {a!r} -> {b!r}, which is no "
                        f"link of the cluster (devices: {', '.join(names)})")

    @cached_property
    def _crossed(self) -> dict[tuple[str, str], tuple[SharedLink, ...]]:
        crossed: dict[tuple[str, str], list[SharedLink]] = {}
        for res in self.shared:
            for pair in dict.fromkeys(res.pairs):
                crossed.setdefault(pair, []).append(res)
        return {pair: tuple(on) for pair, on in crossed.items()}

    def shared_on(self, src: str, dst: str) -> tuple[SharedLink, ...]:
        """The shared resources a transfer from ``src`` to ``dst`` crosses (none on one
        device, or where the cluster has none)."""
        return self._crossed.get((src, dst), ())

    def rate_cap(self, src: str, dst: str) -> float:
        """The fastest a lone transfer from ``src`` to ``dst`` moves, in bytes/s: its link's
        bandwidth, or a slower shared resource's it crosses (worked out once per pair)."""
        return self._rate_cap[(src, dst)]

    @cached_property
    def _rate_cap(self) -> dict[tuple[str, str], float]:
        return {pair: min([link.bandwidth_bytes_per_s, *(r.bandwidth_bytes_per_s
                                                         for r in self._crossed.get(pair, ()))])
                for pair, link in self._links.items()}

    @cached_property
    def _links(self) -> dict[tuple[str, str], Link]:
        return {(link.src, link.dst): link for link in self.links}

    @cached_property
    def _devices(self) -> dict[str, Device]:
        return {d.name: d for d in self.devices}

    def device(self, name: str) -> Device:
        return self._devices[name]

    def link(self, src: str, dst: str) -> Link:
        return self._links[(src, dst)]

    @cached_property
    def distinct_links(self) -> tuple[tuple[str, str], ...]:
        """One pair of distinct devices per distinct (latency, rate) a lone transfer gets
        between them (``transfer_s``: the link's bandwidth, or a slower shared resource's)."""
        seen: dict[tuple[float, float], tuple[str, str]] = {}
        for (src, dst), link in self._links.items():
            if src != dst and src in self._devices and dst in self._devices:
                seen.setdefault((link.latency_s, self.rate_cap(src, dst)), (src, dst))
        return tuple(seen.values())

    def transfer_s(self, src: str, dst: str, nbytes: int) -> float:
        """Time to move ``nbytes`` from ``src`` to ``dst`` with no other transfer on the way;
        zero on the same device."""
        if src == dst:
            return 0.0
        # Alone on any shared resource it crosses (``rate_cap``); contention adds more.
        return self._links[(src, dst)].latency_s + nbytes / self._rate_cap[(src, dst)]

    @cached_property  # asked in every event loop and heuristic; the devices never change
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)


@dataclass(frozen=True)
class Costs:
    """``compute_s[node][device]``: how long a node runs on a device; ``math.inf`` where it
    cannot run there (an unsupported op, or a node pinned elsewhere). ``source[node]`` says where
    the figure came from (``analytic``, ``measured`` or ``calibrated``); ``device_source``, when
    a node has an entry, says it per device (measured on the CPU that is here, analytic on a
    simulated GPU), and ``source[node]`` is then the least measured of them."""

    compute_s: Mapping[str, Mapping[str, float]]
    source: Mapping[str, str] = field(default_factory=dict)
    device_source: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    host: HostCosts | None = None  # None: no device's work is launched by a shared host thread

    def of(self, node: str, device: str) -> float:
        return self.compute_s[node][device]

    def source_of(self, node: str, device: str) -> str:
        """Where ``node``'s time on ``device`` came from."""
        per_device = self.device_source.get(node)
        if per_device is not None and device in per_device:
            return per_device[device]
        return self.source.get(node, "analytic")


@dataclass(frozen=True)
class Problem:
    """What a solver and the simulator take: a graph, the devices, and the costs.

    ``pipeline_schedule``: for a training step of several micro-batches (``train``), the order
    every device runs them in, ``gpipe`` or ``1f1b`` (``simulate.schedules``), whatever order
    a placement carries; ``None``: the placement's order, or each device list-schedules its
    ready nodes."""

    graph: OpGraph
    cluster: Cluster
    costs: Costs
    pipeline_schedule: str | None = None

    def __post_init__(self) -> None:
        for node in self.graph.nodes:
            per_device = self.costs.compute_s.get(node.name)
            if per_device is None:
                raise GraphError(f"node {node.name!r} has no compute cost")
            for device in self.cluster.names:
                t = per_device.get(device)
                if t is None or not t >= 0:
                    raise GraphError(
                        f"node {node.name!r} has a missing or negative duration on {device!r}"
                    )
            if not any(math.isfinite(per_device[d]) for d in self.cluster.names):
                raise GraphError(f"node {node.name!r} can run on none of the devices "
                                 f"{list(self.cluster.names)}")
        host = self.costs.host
        for node, launches in (host.launch_s.items() if host is not None else ()):
            for device, t in launches.items():
                if not 0 <= t <= self.costs.compute_s[node][device] * (1 + 1e-9):
                    raise GraphError(
                        f"node {node!r} takes {t} s to launch on {device!r}, more than its "
                        f"{self.costs.compute_s[node][device]} s there: launches are part of "
                        "a node's time")

    @cached_property
    def allowed(self) -> dict[str, tuple[str, ...]]:
        """The devices each node can run on (finite compute time), in cluster order."""
        return {n.name: tuple(d for d in self.cluster.names
                              if math.isfinite(self.costs.of(n.name, d)))
                for n in self.graph.nodes}

    @cached_property
    def launchers(self) -> dict[str, str]:
        """Device -> the host thread that launches its work (one per host; for a CPU worker,
        the interpreter its thread holds: ``HostCosts.own_thread``), for the devices
        ``costs.host`` gives a launcher; empty when it is ``None``."""
        host = self.costs.host
        if host is None:
            return {}
        return {d.name: host.own_thread.get(d.name, d.host)
                for d in self.cluster.devices if d.name in host.call_s}

    @cached_property
    def sole_launcher(self) -> str | None:
        """The host thread that launches the work of every device, where there is one (all
        devices GPUs of one host): then every node's launch is that thread's work, wherever
        the node is placed."""
        threads = set(self.launchers.values())
        if len(threads) == 1 and len(self.launchers) == len(self.cluster.names):
            return next(iter(threads))
        return None

    def delay_s(self, edge: Edge, src_device: str, dst_device: str) -> float:
        """How long ``edge``'s data takes from ``src_device`` to ``dst_device``."""
        if src_device == dst_device:
            return 0.0
        if edge.transfer_s is not None:
            return edge.transfer_s
        return self.cluster.transfer_s(src_device, dst_device, edge.bytes)


@dataclass(frozen=True)
class Placement:
    """A device for every node, and optionally the order each device runs its nodes in."""

    device_of: Mapping[str, str]
    order: Mapping[str, tuple[str, ...]] | None = None


@dataclass(frozen=True)
class Transfer:
    """``src`` node's output moved from ``src_device`` to ``dst_device`` once."""

    src: str
    src_device: str
    dst_device: str
    bytes: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Schedule:
    """The simulator's verdict on a placement."""

    placement: Placement
    makespan_s: float
    start_s: Mapping[str, float]
    end_s: Mapping[str, float]
    transfers: tuple[Transfer, ...]
    resident_bytes: Mapping[str, int]
    peak_bytes: Mapping[str, int]
    memory_timeline: Mapping[str, tuple[tuple[float, int], ...]]
    over_capacity: Mapping[str, int]
    load_s: Mapping[str, float] = field(default_factory=dict)
    # The order the emitted program launches the nodes in (the simulator's host model): empty
    # when no device has a launcher, and the order of start is the launch order.
    launch_order: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        """True when every device's peak memory is within its capacity."""
        return not self.over_capacity

    @property
    def max_load_s(self) -> float:
        """The pipelined objective: the busiest device's compute and communication per pass."""
        return max(self.load_s.values(), default=0.0)

    def objective_s(self, objective: str) -> float:
        """The schedule's value under ``objective`` (``latency`` or ``throughput``)."""
        return self.max_load_s if objective == "throughput" else self.makespan_s


def optimality_gap(value_s: float, lower_bound_s: float) -> float:
    """How far ``value_s`` (a plan's makespan or largest load) may be from the best possible:
    ``(value - bound) / value``, at least 0; 0 for a plan that takes no time. The one formula
    behind ``SolveResult.gap``, ``Plan.gap`` and the report."""
    if value_s <= 0:
        return 0.0
    return max(0.0, (value_s - lower_bound_s) / value_s)

