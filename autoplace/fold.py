"""Coarsen a traced graph to a size CP-SAT solves quickly, keeping what matters for placement.

Three steps, each only while the graph is larger than ``max_nodes`` (the first always, since it
loses nothing; ``fold`` applies it alone): 1. **fold** free nodes (views, metadata checks) that
have a single producer into it; 2. **group by module**: merge consecutive runs of a topological
order that belong to one module, deepest module level first; 3. **chunk**, as a last resort:
consecutive runs of equal length. None creates a cycle (a node whose only input is ``u``
contracted into ``u``; a run of a topological order); modules are what a person would place.

A group stays within ``max_group_bytes`` of parameters, so coarsening cannot make a model
unplaceable. Its ``ops`` list the traced ops it stands for (expanding a plan reads them), its
costs are its members' sums, an edge carries each producer's output once, and its
``workspace_bytes`` is its internal peak beyond what it passes on (``_internal_peak``), so the
simulator's memory stays an upper bound. The pipeline plans on the folded graph (lossless, so
its figures hold for the traced graph); ``coarsen``'s smaller graph only aids the solver.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from autoplace.config.defaults import DEFAULT_MAX_NODES
from autoplace.ir import Costs, Edge, OpGraph, OpNode
from autoplace.profile.cost import op_short_name, weakest_source
from autoplace.trace import VIEW_OPS

__all__ = ["DEFAULT_MAX_NODES", "Coarsened", "coarsen", "fold"]



@dataclass(frozen=True)
class Coarsened:
    """The coarse graph and costs; ``members[coarse node]`` lists the fine nodes it stands for."""

    graph: OpGraph
    costs: Costs
    steps: tuple[str, ...]
    traced_ops: int
    members: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _module_key(module: str, depth: int) -> str:
    return ".".join(module.split(".")[:depth]) if module else ""


def _common_module(modules: Sequence[str]) -> str:
    parts = [m.split(".") if m else [] for m in modules]
    common: list[str] = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def _fold_shape_only(graph: OpGraph, costs: Costs) -> list[list[str]]:
    """Groups after folding zero-cost single-producer nodes into their producer."""
    root: dict[str, str] = {}
    # Each node's finite times, found once: a group's root is read again by every node that
    # folds into it (roots are never inputs: nothing folds into an input).
    allowed: dict[str, dict[str, float]] = {}
    for node in graph.nodes:
        root[node.name] = node.name
        if node.is_input:
            continue
        times = allowed[node.name] = _allowed(costs, node.name)
        preds = {e.src for e in graph.in_edges(node.name)}
        free = node.param_bytes == 0 and all(t == 0 for t in times.values())
        only = next(iter(preds)) if len(preds) == 1 else None
        # A pinned node (``pins``) folds only into a group that may run where it may: folding
        # is lossless, so it must not narrow its producer's devices.
        if (free and only is not None and not graph.node(only).is_input
                and times.keys() >= allowed[root[only]].keys()):
            root[node.name] = root[only]
    groups: dict[str, list[str]] = {}
    for node in graph.nodes:
        groups.setdefault(root[node.name], []).append(node.name)
    # Groups sorted by their root's position form a topological order: edges from outside a
    # group only enter its root, which comes after every producer.
    return sorted(groups.values(), key=lambda g: graph.index[g[0]])


def _allowed(costs: Costs, name: str) -> dict[str, float]:
    """A node's finite times: the devices it may run on (infinite elsewhere, as a pin makes)."""
    return {d: t for d, t in costs.compute_s[name].items() if math.isfinite(t)}


def _merge_runs(
    groups: list[list[str]],
    key: Callable[[list[str]], str | None],
    *,
    param_bytes: Callable[[list[str]], int],
    max_group_bytes: int,
    runs_on: Callable[[list[str]], frozenset[str]] | None = None,
) -> list[list[str]]:
    """Merge consecutive groups with the same non-None key, within the parameter budget, and,
    given ``runs_on`` (the devices every member may run on), only where some device is left."""
    merged: list[list[str]] = []
    last_key: str | None = None
    for group in groups:
        k = key(group)
        if (merged and k is not None and k == last_key
                and param_bytes(merged[-1]) + param_bytes(group) <= max_group_bytes
                and (runs_on is None or runs_on(merged[-1]) & runs_on(group))):
            merged[-1] = merged[-1] + group
        else:
            merged.append(list(group))
        last_key = k
    return merged


def _storages(graph: OpGraph, members: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The storages each member's output may hold, named by the member that allocates them. A
    member that launches a kernel allocates its own. One that launches none and reads one
    member holds that member's storages: only those if it is a view (``VIEW_OPS``, or a
    ``getitem`` taking one tensor of several), or else its own too, as it may copy (``reshape``
    of an expanded tensor). A graph that counts no launches (a task graph given as JSON) has
    no views."""
    position = {name: i for i, name in enumerate(members)}
    counted = graph.counts_launches
    held: dict[str, tuple[str, ...]] = {}
    for name in members:
        node = graph.node(name)
        preds = [e.src for e in graph.in_edges(name)]
        inside = [p for p in preds if p in position]
        free = counted and node.launches == 0 and not node.is_input
        op = op_short_name(node.targets[0]) if len(node.targets) == 1 else ""
        view = op in VIEW_OPS or (op == "getitem" and len(inside) == 1
                                  and len(graph.node(inside[0]).output_shapes) > 1)
        if free and len(preds) == 1 and inside:
            held[name] = held[inside[0]] + (() if view else (name,))
        else:
            held[name] = (name,)
    return held


def _held_bytes(node: OpNode) -> int:
    """The bytes of the storage a node allocates: its outputs less their views (a view of a
    parameter allocates nothing, ``trace``)."""
    return node.output_bytes - node.view_bytes


def _crossing_bytes(graph: OpGraph, members: Sequence[str],
                    crossing: Sequence[OpNode]) -> tuple[int, int]:
    """What a group's outputs read outside it keep alive on its device, and its
    ``output_bytes``. They keep each storage they may hold once (``_storages``), the whole of
    it for a view (``x[:, -1]`` keeps all of ``x``). ``output_bytes`` is never less than the
    outputs' own sizes, which an expanded view exceeds its base by, and which a copy of it to
    another device moves."""
    held = _storages(graph, members)
    storages = dict.fromkeys(s for p in crossing for s in held[p.name])
    kept = sum(_held_bytes(graph.node(s)) for s in storages)
    return kept, max(kept, sum(p.output_bytes for p in crossing))


def _internal_peak(graph: OpGraph, members: Sequence[str], crossing: set[str]) -> int:
    """The most bytes a group holds at once beyond what its ``crossing`` outputs keep (which the
    simulator charges for the whole group anyway, ``_crossing_bytes``), running ``members`` in
    order as the emitted segment does: member ``i`` holds its own workspace, and every other
    storage (``_storages``) made at or before ``i`` that a member at ``i`` or later still
    reads, or that a value holding it does (torch.fx frees a value after its last use); a
    member's own output too, even if nothing reads it."""
    position = {name: i for i, name in enumerate(members)}
    held = _storages(graph, members)
    kept = {s for name in crossing for s in held[name]}
    last: dict[str, int] = {}  # the last member reading a value that holds the storage
    for j, name in enumerate(members):
        readers = [position[e.dst] for e in graph.out_edges(name) if e.dst in position]
        for storage in held[name]:
            last[storage] = max([last.get(storage, j), j, *readers])
    # Difference array over positions: a storage is alive from its maker through its last reader.
    delta = [0] * (len(members) + 1)
    for storage, end in last.items():
        if storage not in kept:
            delta[position[storage]] += _held_bytes(graph.node(storage))
            delta[end + 1] -= _held_bytes(graph.node(storage))
    peak, alive = 0, 0
    for i, name in enumerate(members):
        alive += delta[i]
        peak = max(peak, alive + graph.node(name).workspace_bytes)
    return peak


def _build(graph: OpGraph, costs: Costs, groups: list[list[str]]) -> tuple[OpGraph, Costs]:
    group_of = {name: gi for gi, members in enumerate(groups) for name in members}
    names = [members[0] for members in groups]
    used_outside: set[str] = set(graph.outputs)
    edge_bytes: dict[tuple[int, int], dict[str, int]] = {}
    fixed_s: dict[tuple[int, int], float] = {}
    for e in graph.edges:
        gs, gd = group_of[e.src], group_of[e.dst]
        if gs != gd:
            used_outside.add(e.src)
            # A producer's output crosses to a consumer group once, whatever reads it there.
            per_src = edge_bytes.setdefault((gs, gd), {})
            per_src[e.src] = max(per_src.get(e.src, 0), e.bytes)
            if e.transfer_s is not None:
                # Fixed copy times run side by side in the simulator: the longest one counts.
                fixed_s[(gs, gd)] = max(fixed_s.get((gs, gd), 0.0), e.transfer_s)

    nodes = []
    compute_s: dict[str, dict[str, float]] = {}
    source: dict[str, str] = {}
    device_source: dict[str, dict[str, str]] = {}
    for members, name in zip(groups, names):
        parts = [graph.node(m) for m in members]
        # Named for its members but metadata checks: the check the next block makes of a
        # block's output, folded into it, does not make the pair the blocks' parent's.
        working = [p for p in parts if not p.targets or not all(
            op_short_name(t).startswith("_assert") for t in p.targets)] or parts
        crossing = [p for p in parts if p.name in used_outside] or parts[-1:]
        kept_bytes, output_bytes = _crossing_bytes(graph, members, crossing)
        nodes.append(OpNode(
            name=name,
            ops=tuple(op for p in parts for op in p.ops),
            targets=tuple(dict.fromkeys(t for p in parts for t in p.targets)),
            module=_common_module([p.module for p in working]),
            is_input=all(p.is_input for p in parts),
            output_shapes=tuple(s for p in crossing for s in p.output_shapes),
            output_dtypes=tuple(d for p in crossing for d in p.output_dtypes),
            output_bytes=output_bytes,
            view_bytes=output_bytes - kept_bytes,
            param_bytes=sum(p.param_bytes for p in parts),
            trainable_bytes=sum(p.trainable_bytes for p in parts),
            workspace_bytes=_internal_peak(graph, members, {p.name for p in crossing}),
            flops=sum(p.flops for p in parts),
            bytes_accessed=sum(p.bytes_accessed for p in parts),
            launches=sum(p.launches for p in parts),
            dtype=parts[0].dtype,
        ))
        devices = costs.compute_s[members[0]].keys()
        compute_s[name] = {d: sum(costs.compute_s[m][d] for m in members) for d in devices}
        # A group's figure is as good as its least measured member that costs anything (a
        # view folded into a measured op does not make the group analytic).
        costly = [m for m in members if any(costs.compute_s[m].values())] or members
        source[name] = weakest_source(costs.source.get(m, "analytic") for m in costly)
        if any(m in costs.device_source for m in members):
            device_source[name] = {d: weakest_source(costs.source_of(m, d) for m in costly)
                                   for d in devices}
    edges = tuple(
        Edge(src=names[gs], dst=names[gd], bytes=sum(per_src.values()),
             transfer_s=fixed_s.get((gs, gd)))
        for (gs, gd), per_src in sorted(edge_bytes.items())
    )
    colocate = []
    for group in graph.colocate:
        coarse = tuple(dict.fromkeys(names[group_of[m]] for m in group))
        if len(coarse) > 1:
            colocate.append(coarse)
    outputs = tuple(dict.fromkeys(names[group_of[o]] for o in graph.outputs))
    coarse_graph = OpGraph(nodes=tuple(nodes), edges=edges, colocate=tuple(colocate),
                           outputs=outputs, name=graph.name)
    host = None if costs.host is None else costs.host.grouped(dict(zip(names, groups)))
    return coarse_graph, Costs(compute_s=compute_s, source=source, device_source=device_source,
                               host=host)


def coarsen(
    graph: OpGraph,
    costs: Costs,
    *,
    max_nodes: int = DEFAULT_MAX_NODES,
    max_group_bytes: int | None = None,
) -> Coarsened:
    """Coarsen ``graph`` to at most about ``max_nodes`` nodes (see the module docstring)."""
    if max_group_bytes is None:
        max_group_bytes = max(graph.total_param_bytes, 1)
    steps: list[str] = []
    n0 = len(graph.nodes)

    def params(members: list[str]) -> int:
        return sum(graph.node(m).param_bytes for m in members)

    allowed = {n.name: frozenset(_allowed(costs, n.name)) for n in graph.nodes}

    def devices_left(members: list[str]) -> frozenset[str]:
        return frozenset.intersection(*(allowed[m] for m in members))

    # Only where nodes differ in where they may run (pins, unsupported ops) can a merge leave
    # a group no device.
    runs_on = devices_left if len(set(allowed.values())) > 1 else None

    groups = _fold_shape_only(graph, costs)
    if len(groups) < n0:
        steps.append(f"folded zero-cost ops into their producers: {n0} -> {len(groups)} nodes")

    depth = max((len(n.module.split(".")) for n in graph.nodes if n.module), default=0)
    for level in range(depth, 0, -1):
        if len(groups) <= max_nodes:
            break
        before = len(groups)

        def by_module(members: list[str], level: int = level) -> str | None:
            first = graph.node(members[0])
            return None if first.is_input else _module_key(first.module, level)

        groups = _merge_runs(groups, by_module, param_bytes=params,
                             max_group_bytes=max_group_bytes, runs_on=runs_on)
        if len(groups) < before:
            steps.append(f"grouped runs by module at depth {level}: {before} -> {len(groups)}")

    if len(groups) > max_nodes:
        before = len(groups)
        size = -(-len(groups) // max_nodes)
        position = {id(g): i for i, g in enumerate(groups)}
        groups = _merge_runs(groups, lambda g: str(position[id(g)] // size), param_bytes=params,
                             max_group_bytes=max_group_bytes, runs_on=runs_on)
        steps.append(f"merged consecutive runs of {size}: {before} -> {len(groups)}")

    return _coarsened(graph, costs, groups, steps)


def _coarsened(graph: OpGraph, costs: Costs, groups: list[list[str]],
               steps: list[str]) -> Coarsened:
    n0 = len(graph.nodes)
    if len(groups) == n0:
        return Coarsened(graph=graph, costs=costs, steps=tuple(steps), traced_ops=n0,
                         members={n.name: (n.name,) for n in graph.nodes})
    coarse_graph, coarse_costs = _build(graph, costs, groups)
    return Coarsened(graph=coarse_graph, costs=coarse_costs, steps=tuple(steps), traced_ops=n0,
                     members={g[0]: tuple(g) for g in groups})


def fold(graph: OpGraph, costs: Costs) -> Coarsened:
    """Only the lossless step: zero-cost single-producer ops folded into their producer. Every
    placement of the folded graph is one of the traced graph with the same simulated schedule,
    so bounds and plans on it hold for the traced graph."""
    groups = _fold_shape_only(graph, costs)
    n0 = len(graph.nodes)
    steps = ([f"folded zero-cost ops into their producers: {n0} -> {len(groups)} nodes"]
             if len(groups) < n0 else [])
    return _coarsened(graph, costs, groups, steps)
