"""Emit: which compute nodes form which device-contiguous segment, in which order.

Everything here is a decision about nodes of the ``Lowered`` graph; nothing builds code. Read in
the order ``emit_model`` calls them: ``run_order`` (the schedule: the plan's ``order`` where it
speaks, dependencies everywhere), ``assign_devices`` (a device for nodes the plan did not name),
``partition`` (a new segment wherever the device changes along the schedule, and around
values that cross devices), ``owners`` (the
segment that holds each parameter or buffer), ``later_uses`` (values that cross a segment
boundary, so the segment must return them).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.fx

from autoplace.emit.codegen.lower import COMPUTE_OPS, Lowered
from autoplace.errors import EmitError

__all__ = ["assign_devices", "later_uses", "owners", "partition", "run_order"]


def _is_compute(node: torch.fx.Node) -> bool:
    return node.op in COMPUTE_OPS


def run_order(lowered: Lowered, order: Sequence[str] | None) -> list[torch.fx.Node]:
    """Compute nodes in run order: ``order`` where it speaks, dependencies everywhere.

    A node missing from ``order`` runs as soon as its inputs are ready, or, if it has no compute
    inputs at all (``arange``), just before its first consumer, so it never opens a segment.
    """
    nodes = [n for n in lowered.graph.nodes if _is_compute(n)]
    position = {n: i for i, n in enumerate(nodes)}
    if order is None:
        return nodes
    rank = {name: i for i, name in reversed(list(enumerate(order)))}
    key = {n: rank[lowered.origin[n.name]] for n in nodes if lowered.origin[n.name] in rank}
    producers = {n: [p for p in n.all_input_nodes if _is_compute(p)] for n in nodes}
    _with_their_neighbour(nodes, key, producers)
    lazy = _lazy_nodes(nodes, key, producers)
    done = _ready_order(
        nodes, producers, lazy, priority=lambda n: (key.get(n, -1), position[n])
    )
    _check_topological(done, key, position, lowered)
    return done


def _with_their_neighbour(nodes: Sequence[torch.fx.Node], key: dict[torch.fx.Node, int],
                          producers: Mapping[torch.fx.Node, list[torch.fx.Node]]) -> None:
    """Give an op that reads no computed value and has no reader (a batch norm in ``train()``
    counting its batches: ``num_batches_tracked.add_(1)``) the place of the op after it in the
    traced graph, so that it runs beside its layer: the plan may start it at any time, and
    run first it would cut every layer's run in two."""
    for n, after in zip(nodes, nodes[1:]):
        if n in key and after in key and not producers[n] and not n.users:
            key[n] = key[after]


def _lazy_nodes(
    nodes: Sequence[torch.fx.Node],
    key: Mapping[torch.fx.Node, int],
    producers: Mapping[torch.fx.Node, list[torch.fx.Node]],
) -> set[torch.fx.Node]:
    """Nodes ``order`` leaves out whose compute inputs are all lazy too (none, for ``arange``):
    they wait for their first consumer instead of running as soon as they can."""
    lazy: set[torch.fx.Node] = set()
    for n in nodes:
        if n not in key and all(p in lazy for p in producers[n]):
            lazy.add(n)
    return lazy


def _ready_order(
    nodes: Sequence[torch.fx.Node],
    producers: Mapping[torch.fx.Node, list[torch.fx.Node]],
    lazy: set[torch.fx.Node],
    *,
    priority: Callable[[torch.fx.Node], tuple[int, int]],
) -> list[torch.fx.Node]:
    """Kahn's algorithm over the nodes that are not lazy, lowest ``priority`` first; each lazy
    node is placed just before the first node that needs it."""
    waiting = {n: sum(p not in lazy for p in producers[n]) for n in nodes if n not in lazy}
    ready = [(priority(n), n) for n, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    done: list[torch.fx.Node] = []
    emitted: set[torch.fx.Node] = set()
    while ready:
        _, n = heapq.heappop(ready)
        _place_after_lazy(n, producers, lazy, emitted=emitted, done=done)
        for user in n.users:
            if user in waiting:
                waiting[user] -= 1
                if waiting[user] == 0:
                    heapq.heappush(ready, (priority(user), user))
    for n in nodes:  # lazy nodes nobody consumes, e.g. a standalone assert
        if n not in emitted:
            _place_after_lazy(n, producers, lazy, emitted=emitted, done=done)
    return done


def _place_after_lazy(
    n: torch.fx.Node,
    producers: Mapping[torch.fx.Node, list[torch.fx.Node]],
    lazy: set[torch.fx.Node],
    *,
    emitted: set[torch.fx.Node],
    done: list[torch.fx.Node],
) -> None:
    """Append ``n`` to ``done``, after the lazy producers it needs that are not placed yet."""
    for p in producers[n]:
        if p in lazy and p not in emitted:
            _place_after_lazy(p, producers, lazy, emitted=emitted, done=done)
    emitted.add(n)
    done.append(n)


def _check_topological(
    done: Sequence[torch.fx.Node],
    key: Mapping[torch.fx.Node, int],
    position: Mapping[torch.fx.Node, int],
    lowered: Lowered,
) -> None:
    """Fail if dependencies had to overrule ``order``: then it was not a topological order."""
    last = (-1, -1)
    for n in done:
        if n in key:
            if (key[n], position[n]) < last:
                raise EmitError(
                    f"order is not a topological order: {lowered.origin[n.name]!r} is listed at "
                    f"position {key[n]} but depends on a node listed at position {last[0]}"
                )
            last = (key[n], position[n])


def assign_devices(
    lowered: Lowered, schedule: list[torch.fx.Node], device_of: Mapping[str, str]
) -> dict[torch.fx.Node, str]:
    """A device for every compute node: its own, else its first producer's, else its first
    consumer's, else its neighbour's in the schedule."""
    devices: dict[torch.fx.Node, str] = {}
    for n in schedule:
        origin = lowered.origin[n.name]
        if origin in device_of:
            devices[n] = str(torch.device(device_of[origin]))
    for n in schedule:
        if n not in devices:
            found = [devices[p] for p in n.all_input_nodes if p in devices]
            if found:
                devices[n] = found[0]
    step = {n: i for i, n in enumerate(schedule)}
    for n in reversed(schedule):
        if n not in devices:
            users = sorted((u for u in n.users if u in devices), key=step.__getitem__)
            if users:
                devices[n] = devices[users[0]]
    known = [devices[n] for n in schedule if n in devices]
    if not known:
        raise EmitError("device_of assigns no compute node; give at least one a device")
    previous = known[0]
    for n in schedule:
        previous = devices.setdefault(n, previous)
    return devices


def partition(
    schedule: list[torch.fx.Node], devices: Mapping[torch.fx.Node, str],
    units: Mapping[torch.fx.Node, str] | None = None,
) -> list[list[torch.fx.Node]]:
    """Runs of the schedule on one device, cut where the device changes, before a node that
    reads a value computed on another device, and after a node whose value another device reads.
    With ``units`` (FSDP2's, ``train.sharded``: a node's unit, absent for a node that may join
    any run), also before a node of another unit than the run's: each segment then holds at
    most one unit's ops, which ``fully_shard`` wraps.

    The two extra cuts are what lets the threaded runtime (``threaded.py``) match the simulator:
    a segment waits for all its inputs before it starts and hands its outputs over when it ends,
    while the simulator starts each node when its own inputs arrive and sends each value when
    its node ends. With the cuts, only a segment's first node waits for another device and only
    its last node sends to one.
    """
    groups: list[list[torch.fx.Node]] = []
    units = units or {}
    unit: str | None = None  # the current run's, once one of its nodes has one
    for n in schedule:
        if not groups or devices[groups[-1][-1]] != devices[n] or _crosses(groups[-1][-1], devices):
            cut = True
        elif _reads_remote(n, devices) and not all(_is_source(m, devices) for m in groups[-1]):
            cut = True  # ops that read nothing (``arange``, ``ones``) may wait with their consumer
        else:
            cut = n in units and unit is not None and units[n] != unit
        if cut:
            groups.append([])
            unit = None
        groups[-1].append(n)
        unit = units.get(n) if unit is None else unit
    return groups


def _reads_remote(node: torch.fx.Node, devices: Mapping[torch.fx.Node, str]) -> bool:
    return any(p in devices and devices[p] != devices[node] for p in node.all_input_nodes)


def _is_source(node: torch.fx.Node, devices: Mapping[torch.fx.Node, str]) -> bool:
    """A compute node that reads no other compute node's value."""
    return not any(p in devices for p in node.all_input_nodes)


def _crosses(node: torch.fx.Node, devices: Mapping[torch.fx.Node, str]) -> bool:
    """Whether a compute node on another device reads ``node``'s value."""
    return any(u in devices and devices[u] != devices[node] for u in node.users)


def owners(
    lowered: Lowered, groups: list[list[torch.fx.Node]]
) -> dict[torch.fx.Node, int]:
    """The segment that holds each tensor attribute: that of its first consumer."""
    segment_of = {n: i for i, group in enumerate(groups) for n in group}
    owner: dict[torch.fx.Node, int] = {}
    for node in lowered.graph.nodes:
        if node.op != "get_attr" or not node.users:
            continue
        if not isinstance(lowered.attrs[node.target], torch.Tensor):
            continue
        users = [segment_of[u] for u in node.users if u in segment_of]
        owner[node] = min(users) if users else len(groups) - 1
    return owner


def later_uses(
    graph: torch.fx.Graph, segment_of: Mapping[torch.fx.Node, int], output: torch.fx.Node
) -> set[torch.fx.Node]:
    """Values that some other segment, or the model's output, reads."""
    crossing = set()
    for node, index in segment_of.items():
        for user in node.users:
            if user is output or segment_of.get(user, index) != index:
                crossing.add(node)
    return crossing

