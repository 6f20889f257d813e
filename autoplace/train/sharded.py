"""Train: sharded data parallelism, FSDP2's ``fully_shard`` (ZeRO-3), as a replica's step.

R replicas, one device each, run the whole step on 1/R of the batch as DDP's do
(``dataparallel.py``), each keeping 1/R of every parameter, gradient and optimizer state.
``fsdp_units`` finds FSDP2's units in the traced graph (a module path up to its first numeric
part, else a leaf module; a unit that shares a parameter with another is the root's), which the
emitter cuts into segments and ``OUT/train.py`` wraps (``emit.distributed.ddp``). ``with_fsdp``
prices and sizes one replica's step: two all-gathers per unit and a reduce-scatter per gradient
(``cost_models.ring_allgather_s``; or, between CPU processes here, FSDP2's overhead measured,
``profile.allreduce``), the update on 1/R; shards resident, a unit's unsharded parameters and
gradients (and the reduce-scatter's copy of them) while it runs and one unit prefetched in the
backward. Rules, figures and sources:
docs/training.md, "Sharded replicas (FSDP2, ZeRO-3)".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from autoplace.ir import Cluster, OpGraph, Problem
from autoplace.simulate.schedules import BACKWARD, STEP, phase_of
from autoplace.train.dataparallel import ring_link
from cost_models import ring_allgather_s

__all__ = ["fsdp_op_units", "fsdp_units", "unit_of", "with_fsdp"]


def unit_of(module: str) -> str | None:
    """The FSDP unit of an op of ``module`` (a module path): the path up to its first numeric
    part, else the whole path; ``None`` (the root's) for an op outside any module."""
    parts = module.split(".") if module else []
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return module or None


def fsdp_units(graph: OpGraph) -> dict[str, str | None]:
    """The unit of each forward node of ``graph`` (a forward graph, or a step graph's forward
    nodes): ``unit_of`` its module; the root's (``None``) where that unit holds no trainable
    parameter, or shares one with another unit (nodes of several units colocated)."""
    units: dict[str, str | None] = {}
    for node in graph.nodes:
        base, phase, k = phase_of(node.name)
        if phase == "forward" and base == node.name and k is None:
            units[node.name] = unit_of(node.module)
    holding = {units[n.name] for n in graph.nodes if n.name in units and n.trainable_bytes}
    shared: set[str | None] = set()
    for group in graph.colocate:
        keys = {units[m] for m in group if m in units}
        if len(keys) > 1:
            shared |= keys
    return {name: unit if unit in holding and unit not in shared else None
            for name, unit in units.items()}


def fsdp_op_units(graph: OpGraph) -> dict[str, str]:
    """The FSDP2 unit of each traced op of ``graph``'s forward nodes that has one
    (``fsdp_units``): what the emitter cuts into segments of their own
    (``codegen.model.emit_model``'s ``units``)."""
    unit_of = fsdp_units(graph)
    return {op: unit for n in graph.nodes
            if (unit := unit_of.get(n.name)) is not None for op in n.ops}


def with_fsdp(problem: Problem, cluster: Cluster, groups: Sequence[Sequence[str]], *,
              measured_s: float | None = None) -> Problem:
    """``problem`` (one replica's step of one micro-batch, on ``groups[0]``'s one device of
    ``cluster``) priced and sized as FSDP2 runs it over the ``groups`` (see the module's
    docstring); or, with ``measured_s`` (what FSDP2 adds to a step where the replicas are
    processes of this host, measured by ``profile.allreduce``: collectives, hooks and the
    update on shards, less the update's saving), that figure instead of the formulas and the
    update's 1/R, charged to the updates by bytes as DDP's measured averaging is."""
    replicas = len(groups)
    if replicas == 1:
        return problem
    if any(len(g) != 1 for g in groups):
        raise ValueError("FSDP replicas are of one device each")
    graph = problem.graph
    units = fsdp_units(graph)
    forward = [n for n in graph.nodes if n.name in units]
    unsharded: dict[str | None, int] = {}
    for node in forward:
        unsharded[units[node.name]] = unsharded.get(units[node.name], 0) + node.trainable_bytes
    order = list(dict.fromkeys(units[n.name] for n in forward
                               if units[n.name] is not None and unsharded[units[n.name]]))
    prefetched = {u: unsharded[order[i - 1]] if i else 0 for i, u in enumerate(order)}
    bandwidth, latency = ring_link(cluster, [g[0] for g in groups])

    def gather(nbytes: int) -> float:
        return ring_allgather_s(nbytes, replicas, bandwidth_bytes_per_s=bandwidth,
                                latency_s=latency) if nbytes else 0.0

    extra_s = dict.fromkeys((n.name for n in graph.nodes), 0.0)
    firsts = {}
    for node in forward:
        firsts.setdefault(units[node.name], node.name)
    # each unit's first node in the backward: the backward of its last forward node that has one
    lasts = {units[n.name]: n.name for n in forward if n.name + BACKWARD in extra_s}
    for unit, name in firsts.items() if measured_s is None else ():
        extra_s[name] += gather(unsharded[unit])
    for unit, name in lasts.items() if measured_s is None else ():
        if unit is not None:
            extra_s[name + BACKWARD] += gather(unsharded[unit])  # gathered again for backward
    total = sum(unsharded.values())
    nodes = []
    for node in graph.nodes:
        base, phase, _ = phase_of(node.name)
        unit, trained = units.get(base), node.trainable_bytes
        if phase == "forward" and unit is not None:
            node = replace(node, param_bytes=node.param_bytes - trained + _share(trained,
                                                                                 replicas),
                           trainable_bytes=_share(trained, replicas),
                           workspace_bytes=node.workspace_bytes + unsharded[unit])
        elif phase == "backward" and unit is not None:
            # regathered parameters, unsharded gradients, the reduce-scatter's input (FSDP2's
            # foreach_reduce copies them into one) and the next unit prefetched
            held = graph.node(base).trainable_bytes
            node = replace(node, workspace_bytes=node.workspace_bytes + 3 * unsharded[unit]
                           - held + prefetched.get(unit, 0))
        elif phase == "step":
            grads = graph.node(base).trainable_bytes
            state = node.param_bytes - grads
            kept = _share(grads, replicas) if unit is not None else grads
            extra_s[node.name] += (gather(unsharded[unit]) * grads / unsharded[unit]
                                   if measured_s is None else measured_s * grads / total)
            node = replace(node, param_bytes=kept + _share(state, replicas),
                           workspace_bytes=_share(node.workspace_bytes, replicas))
        nodes.append(node)
    return replace(problem, graph=replace(graph, nodes=tuple(nodes)),
                   costs=replace(problem.costs, compute_s=_timed(problem, extra_s, replicas,
                                                                  measured=measured_s)))


def _timed(problem: Problem, extra_s: dict[str, float], replicas: int, *,
           measured: float | None) -> dict[str, dict[str, float]]:
    """``problem``'s times with ``extra_s`` added, each update on 1/R of its tensors (its
    launches as before) unless ``measured`` (the overhead measured with the update on shards);
    every node at least its launch (a measured saving is negative)."""
    host = problem.costs.host

    def launch_of(name: str, device: str) -> float:
        return host.launch_of(name, device) if host is not None else 0.0

    def own(name: str, device: str, t: float) -> float:
        if measured is not None or not name.endswith(STEP):
            return t
        return launch_of(name, device) + (t - launch_of(name, device)) / replicas

    return {name: {d: max(launch_of(name, d), own(name, d, t) + extra_s[name])
                   for d, t in per.items()}
            for name, per in problem.costs.compute_s.items()}


def _share(nbytes: int, replicas: int) -> int:
    """One rank's share of ``nbytes`` sharded over ``replicas`` (FSDP2 pads dimension 0 to a
    multiple of R; rounded up here)."""
    return math.ceil(nbytes / replicas)
