"""Task graphs from JSON: placement for graphs that do not come from tracing a PyTorch model
(another framework, a profiler, a benchmark). ``autoplace solve graph.json`` reads one.

The format (devices, links or a default link, nodes with their times per device name or type,
edges by bytes or a fixed ``transfer_s``, colocation groups, outputs) is documented, with an
example and every check, in ``docs/graph-format.md``; the JSON Schema ``graph.schema.json``
beside this module states every field. ``compute_s`` is keyed by device name or device type (a
name wins), ``null`` marking a device the node cannot run on; nodes come in any order and are
sorted topologically (a cycle is an error naming its nodes); ``--devices`` / ``--cluster``, when
given, replace the file's devices.

Read ``problem_from_dict`` first: the schema check (each error names the JSON path of the bad
field and what was expected), then the checks a schema cannot state (unique names, edges and
groups naming nodes that exist, a time for every device, no cycle), then the ``Problem``;
``load_graph_file`` reads a file into it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autoplace.errors import AutoplaceError, DeviceSpecError, GraphError
from autoplace.formats.schema import json_path, schema_errors
from autoplace.ir import Cluster, Costs, Device, Edge, Link, OpGraph, OpNode, Problem
from autoplace.ir.graphs import topological_order

__all__ = ["graph_problems", "load_graph_file", "problem_from_dict"]

_HERE = Path(__file__).resolve().parent
_SHOWN = 3  # schema errors quoted in one message; the rest are counted


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


def graph_problems(data: Any) -> list[str]:
    """What the schema finds wrong with ``data``, each as ``path: what was expected``
    (``nodes[0].compute_s.G: -1 is less than the minimum of 0``); empty when it holds."""
    return [f"{json_path(e.absolute_path) or 'the top level'}: {e.message}"
            for e in schema_errors(data, "graph.schema.json")]



def problem_from_dict(data: Any, *, cluster: Cluster | None = None, where: str = "graph",
                      default_name: str = "graph") -> Problem:
    """Build and check a ``Problem`` from the JSON form (see the module docstring)."""
    problems = graph_problems(data)
    if problems:
        more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise GraphError(f"{where}: " + "; ".join(problems[:_SHOWN]) + more
                         + "; see docs/graph-format.md for the format")
    cluster = cluster or _cluster_from(data, where)
    names = [n["name"] for n in data["nodes"]]
    if len(set(names)) != len(names):
        dup = next(x for x in names if names.count(x) > 1)
        raise GraphError(f"{where}: node name {dup!r} appears twice")
    edges = _edges_from(data, set(names), where)
    compute = {n["name"]: _compute_times(n, cluster, where) for n in data["nodes"]}
    out_bytes: dict[str, int] = dict.fromkeys(names, 0)
    for e in edges:
        out_bytes[e.src] = max(out_bytes[e.src], e.bytes)
    nodes = {n["name"]: OpNode(name=n["name"], module=n.get("module", ""),
                               param_bytes=int(n.get("memory_bytes", 0)),
                               output_bytes=int(n.get("output_bytes", out_bytes[n["name"]])))
             for n in data["nodes"]}
    order = topological_order(names, [(e.src, e.dst) for e in edges])
    colocate = tuple(tuple(g) for g in data.get("colocate", ()))
    for group in colocate:
        for m in group:
            if m not in nodes:
                raise GraphError(f"{where}: colocation group {list(group)} names unknown node "
                                 f"{m!r}")
    graph = OpGraph(nodes=tuple(nodes[n] for n in order), edges=tuple(edges), colocate=colocate,
                    outputs=tuple(data.get("outputs", ())),
                    name=data.get("name", default_name))
    return Problem(graph=graph, cluster=cluster, costs=Costs(compute_s=compute))


def _cluster_from(data: Mapping[str, Any], where: str) -> Cluster:
    if "devices" not in data:
        raise GraphError(f"{where} lists no devices: add \"devices\" (with \"links\" or "
                         "\"default_link\") or pass --devices / --cluster")
    devices = tuple(Device(name=d["name"], type=d.get("type", d["name"]),
                           memory_bytes=int(d["memory_bytes"]),
                           torch_device=d.get("torch_device", "cpu"))
                    for d in data["devices"])
    names = [d.name for d in devices]
    links: dict[tuple[str, str], Link] = {}
    default = data.get("default_link")
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
    try:
        return Cluster(devices=devices, links=tuple(links.values()))
    except DeviceSpecError as exc:
        raise GraphError(f"{where}: {exc}; give \"links\" for every ordered pair of devices or "
                         "a \"default_link\"") from None


def _edges_from(data: Mapping[str, Any], known: set[str], where: str) -> list[Edge]:
    edges = []
    for e in data.get("edges", ()):
        src, dst = e["src"], e["dst"]
        for end in (src, dst):
            if end not in known:
                raise GraphError(f"{where}: edge {src!r} -> {dst!r} names unknown node {end!r}")
        transfer = e.get("transfer_s")
        edges.append(Edge(src=src, dst=dst, bytes=int(e.get("bytes", 0)),
                          transfer_s=None if transfer is None else float(transfer)))
    return edges


def _compute_times(node: Mapping[str, Any], cluster: Cluster, where: str) -> dict[str, float]:
    """The node's seconds on each device of ``cluster`` (``math.inf`` where it cannot run)."""
    name, times = node["name"], node["compute_s"]
    per_device: dict[str, float] = {}
    for d in cluster.devices:
        key = d.name if d.name in times else d.type
        if key not in times:
            raise GraphError(f"{where}: node {name!r} has no compute time for device "
                             f"{d.name!r} (type {d.type!r}): key compute_s by device name or "
                             "type, null where the node cannot run")
        t = times[key]
        per_device[d.name] = math.inf if t is None else float(t)
    pinned = node.get("pinned")
    if pinned is not None:
        if pinned not in per_device:
            raise GraphError(f"{where}: node {name!r} is pinned to unknown device "
                             f"{pinned!r}; devices: {list(per_device)}")
        per_device = {d: (t if d == pinned else math.inf) for d, t in per_device.items()}
    return per_device
