"""Task graphs from JSON: placement for graphs that do not come from tracing a PyTorch model
(another framework, a profiler, a benchmark). ``autoplace solve graph.json`` reads one.

The format (``docs/graph-format.md`` has the full description and an example)::

    {"name": "g",
     "devices": [{"name": "gpu0", "type": "A100", "memory_bytes": 40e9}, ...],   # optional
     "links": [{"src": "gpu0", "dst": "gpu1", "bandwidth_bytes_per_s": 3e11,
                "latency_s": 1e-5}],                 # or "default_link": {bandwidth, latency}
     "nodes": [{"name": "a", "compute_s": {"A100": 0.002, "gpu1": null},
                "memory_bytes": 1000, "output_bytes": 4096, "pinned": "gpu0", "module": ""}],
     "edges": [{"src": "a", "dst": "b", "bytes": 4096}, {"src": "b", "dst": "c",
                "transfer_s": 0.001}],
     "colocate": [["a", "c"]],
     "outputs": ["c"]}

``compute_s`` is keyed by device name or device type (a name wins); ``null`` marks a device the
node cannot run on. Nodes may come in any order: they are sorted topologically, and a cycle is an
error naming the nodes on it. Devices come from the file or, when given, from ``--devices`` /
``--cluster`` (which replace the file's).
"""

from __future__ import annotations

import heapq
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autoplace.errors import AutoplaceError, DeviceSpecError, GraphError
from autoplace.ir import Cluster, Costs, Device, Edge, Link, OpGraph, OpNode, Problem

__all__ = ["load_graph_file", "problem_from_dict"]

_TOP = {"name", "devices", "links", "default_link", "nodes", "edges", "colocate", "outputs"}
_NODE = {"name", "compute_s", "memory_bytes", "output_bytes", "pinned", "module"}
_EDGE = {"src", "dst", "bytes", "transfer_s"}


def load_graph_file(path: str | os.PathLike[str], cluster: Cluster | None = None) -> Problem:
    """Read a task-graph JSON file into a ``Problem``; ``cluster`` replaces the file's devices."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise AutoplaceError(f"graph file {where!r} does not exist: check the path") from None
    except OSError as exc:
        raise AutoplaceError(f"cannot read graph file {where!r}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphError(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno}, column "
                         f"{exc.colno}; see docs/graph-format.md for the format") from None
    return problem_from_dict(data, cluster=cluster, where=where,
                             default_name=Path(path).stem)


def _unknown_keys(table: Mapping[str, Any], allowed: set[str], what: str, where: str) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise GraphError(f"{where}: {what} has unknown keys {extra}; allowed: {sorted(allowed)}")


def _number(value: Any, what: str, where: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 \
            or not math.isfinite(value):
        raise GraphError(f"{where}: {what} must be a finite number >= 0, got {value!r}")
    return float(value)


def _cluster_from(data: Mapping[str, Any], where: str) -> Cluster:
    if "devices" not in data:
        raise GraphError(f"{where} lists no devices: add \"devices\" (with \"links\" or "
                         "\"default_link\") or pass --devices / --cluster")
    try:
        devices = tuple(Device(name=str(d["name"]), type=str(d.get("type", d["name"])),
                               memory_bytes=int(d["memory_bytes"]),
                               torch_device=str(d.get("torch_device", "cpu")))
                        for d in data["devices"])
    except (KeyError, TypeError, ValueError) as exc:
        raise GraphError(f"{where}: each device needs \"name\" and \"memory_bytes\" (and may "
                         f"have \"type\"); {exc!r} in {data['devices']!r:.200}") from None
    links: dict[tuple[str, str], Link] = {}
    default = data.get("default_link")
    names = [d.name for d in devices]
    try:
        if default is not None:
            for a in names:
                for b in names:
                    if a != b:
                        links[a, b] = Link(a, b, float(default["bandwidth_bytes_per_s"]),
                                           float(default.get("latency_s", 0.0)))
        for lk in data.get("links", ()):
            links[lk["src"], lk["dst"]] = Link(lk["src"], lk["dst"],
                                               float(lk["bandwidth_bytes_per_s"]),
                                               float(lk.get("latency_s", 0.0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise GraphError(f"{where}: a link needs \"bandwidth_bytes_per_s\" (and may have "
                         f"\"latency_s\"): {exc!r}") from None
    try:
        return Cluster(devices=devices, links=tuple(links.values()))
    except DeviceSpecError as exc:
        raise GraphError(f"{where}: {exc}; give \"links\" for every ordered pair of devices or "
                         "a \"default_link\"") from None


def _topological(names: list[str], edges: list[Edge]) -> list[str]:
    """Kahn's algorithm, stable in file order; a cycle is named."""
    indegree = dict.fromkeys(names, 0)
    succs: dict[str, list[str]] = {n: [] for n in names}
    for e in edges:
        indegree[e.dst] += 1
        succs[e.src].append(e.dst)
    position = {n: i for i, n in enumerate(names)}
    ready = [(position[n], n) for n in names if indegree[n] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for m in succs[n]:
            indegree[m] -= 1
            if indegree[m] == 0:
                heapq.heappush(ready, (position[m], m))
    if len(order) < len(names):
        stuck = {n for n in names if indegree[n] > 0}
        # Walk back along edges inside the stuck set until a node repeats: that is a cycle.
        preds = {n: [e.src for e in edges if e.dst == n and e.src in stuck] for n in stuck}
        node, seen = min(stuck, key=position.__getitem__), []
        while node not in seen:
            seen.append(node)
            node = preds[node][0]
        cycle = seen[seen.index(node):][::-1]
        raise GraphError(f"the graph has a cycle: {' -> '.join(cycle + [cycle[0]])}; a task "
                         "graph must be acyclic")
    return order


def problem_from_dict(data: Any, *, cluster: Cluster | None = None, where: str = "graph",
                      default_name: str = "graph") -> Problem:
    """Build and check a ``Problem`` from the JSON form (see the module docstring)."""
    if not isinstance(data, Mapping):
        raise GraphError(f"{where}: the top level must be a JSON object")
    _unknown_keys(data, _TOP, "the top level", where)
    cluster = cluster or _cluster_from(data, where)
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise GraphError(f"{where}: \"nodes\" must be a non-empty list")
    names: list[str] = []
    for i, n in enumerate(raw_nodes):
        if not isinstance(n, Mapping) or "name" not in n:
            raise GraphError(f"{where}: node #{i} needs a \"name\"")
        _unknown_keys(n, _NODE, f"node {n['name']!r}", where)
        names.append(str(n["name"]))
    if len(set(names)) != len(names):
        dup = next(x for x in names if names.count(x) > 1)
        raise GraphError(f"{where}: node name {dup!r} appears twice")
    known = set(names)

    edges: list[Edge] = []
    for e in data.get("edges", ()):
        _unknown_keys(e, _EDGE, "an edge", where)
        src, dst = str(e.get("src")), str(e.get("dst"))
        for end in (src, dst):
            if end not in known:
                raise GraphError(f"{where}: edge {src!r} -> {dst!r} names unknown node {end!r}")
        nbytes = _number(e.get("bytes", 0), f"edge {src!r} -> {dst!r} bytes", where)
        transfer = _number(e.get("transfer_s"), f"edge {src!r} -> {dst!r} transfer_s", where,
                           allow_none=True)
        edges.append(Edge(src=src, dst=dst, bytes=int(nbytes or 0), transfer_s=transfer))

    by_type: dict[str, list[str]] = {}
    for d in cluster.devices:
        by_type.setdefault(d.type, []).append(d.name)
    out_bytes: dict[str, int] = dict.fromkeys(names, 0)
    for e in edges:
        out_bytes[e.src] = max(out_bytes[e.src], e.bytes)
    nodes: dict[str, OpNode] = {}
    compute: dict[str, dict[str, float]] = {}
    for n in raw_nodes:
        name = str(n["name"])
        times = n.get("compute_s")
        if not isinstance(times, Mapping) or not times:
            raise GraphError(f"{where}: node {name!r} needs \"compute_s\": seconds per device "
                             "name or type")
        per_device: dict[str, float] = {}
        for d in cluster.devices:
            key = d.name if d.name in times else d.type
            if key not in times:
                raise GraphError(f"{where}: node {name!r} has no compute time for device "
                                 f"{d.name!r} (type {d.type!r}): key compute_s by device name or "
                                 "type, null where the node cannot run")
            t = _number(times[key], f"node {name!r} compute_s[{key!r}]", where, allow_none=True)
            per_device[d.name] = math.inf if t is None else t
        pinned = n.get("pinned")
        if pinned is not None:
            if pinned not in per_device:
                raise GraphError(f"{where}: node {name!r} is pinned to unknown device "
                                 f"{pinned!r}; devices: {list(per_device)}")
            per_device = {d: (t if d == pinned else math.inf) for d, t in per_device.items()}
        compute[name] = per_device
        memory = _number(n.get("memory_bytes", 0), f"node {name!r} memory_bytes", where)
        output = _number(n.get("output_bytes", out_bytes[name]), f"node {name!r} output_bytes",
                         where)
        nodes[name] = OpNode(name=name, module=str(n.get("module", "")),
                             param_bytes=int(memory or 0), output_bytes=int(output or 0))

    order = _topological(names, edges)
    colocate = tuple(tuple(str(m) for m in g) for g in data.get("colocate", ()))
    for group in colocate:
        for m in group:
            if m not in known:
                raise GraphError(f"{where}: colocation group {list(group)} names unknown node "
                                 f"{m!r}")
    graph = OpGraph(nodes=tuple(nodes[n] for n in order), edges=tuple(edges), colocate=colocate,
                    outputs=tuple(str(o) for o in data.get("outputs", ())),
                    name=str(data.get("name", default_name)))
    return Problem(graph=graph, cluster=cluster, costs=Costs(compute_s=compute))
