"""Train: sharded data parallelism, FSDP2's ``fully_shard`` (ZeRO-3), as a replica's step.

R replicas, one device each, run the whole step on 1/R of the batch as DDP's do
(``dataparallel.py``), each keeping 1/R of every parameter, gradient and optimizer state.
``fsdp_units`` finds FSDP2's units in the traced graph (a module path up to its first numeric
part, else a leaf module; a unit that shares a parameter with another is the root's), which the
emitter cuts into segments and ``OUT/train.py`` wraps (``emit.distributed.ddp``). ``with_fsdp``
prices and sizes one replica's step: two all-gathers per unit and a reduce-scatter per gradient
(``cost_models.ring_allgather_s``; or, between CPU processes here, FSDP2's overhead measured,
``profile.allreduce``), the update on 1/R; shards resident and, beside them, what FSDP2 holds
unsharded as torch's ``FSDPMemTracker`` showed it (``_held``). Rules, figures and sources:
docs/training.md, "Sharded replicas (FSDP2, ZeRO-3)".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from autoplace.ir import Cluster, OpGraph, OpNode, Problem
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
    (``codegen.model.emit_model``'s ``units``). A metadata check (``_assert_*``, free) folded
    into a unit's node is left to the root: it runs where torch.export put it, often among
    the next unit's ops, and in its node's unit it would call that unit again (FSDP2 gathers
    it again)."""
    unit_of = fsdp_units(graph)
    return {op: unit for n in graph.nodes if (unit := unit_of.get(n.name)) is not None
            for op in n.ops if not op.startswith("_assert")}


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
    for name in extra_s:
        base, phase, _ = phase_of(name)
        if phase == "step":
            grads, unit = graph.node(base).trainable_bytes, units.get(base)
            extra_s[name] += (gather(unsharded[unit]) * grads / unsharded[unit]
                              if measured_s is None else measured_s * grads / total)
    timed = _timed(problem, extra_s, replicas, measured=measured_s)
    device = groups[0][0]
    gloo = all(cluster.device(g[0]).torch_device.split(":")[0] == "cpu" for g in groups)
    held = _held(graph, units, unsharded, gloo=gloo,
                 runs={name: per.get(device, 0.0) > 0 for name, per in timed.items()})
    nodes = []
    for node in graph.nodes:
        base, phase, _ = phase_of(node.name)
        unit, trained = units.get(base), node.trainable_bytes
        if phase == "forward" and base in units:
            # the root's parameters stay unsharded from its forward to the end of the backward:
            # counted whole beside their shard for the whole step
            whole = trained if unit is None else 0
            node = replace(node, param_bytes=node.param_bytes - trained + whole
                           + _share(trained, replicas), trainable_bytes=_share(trained, replicas))
        elif phase == "step":
            grads = graph.node(base).trainable_bytes
            node = replace(node, param_bytes=_share(grads, replicas)
                           + _share(node.param_bytes - grads, replicas),
                           workspace_bytes=_share(node.workspace_bytes, replicas))
        if node.name in held:
            node = replace(node, workspace_bytes=held[node.name])
        nodes.append(node)
    return replace(problem, graph=replace(graph, nodes=tuple(nodes)),
                   costs=replace(problem.costs, compute_s=timed))


def _held(graph: OpGraph, units: dict[str, str | None], unsharded: dict[str | None, int], *,
          gloo: bool, runs: dict[str, bool]) -> dict[str, int]:
    """Each forward and backward node's workspace with what FSDP2 holds beside it (an upper
    bound; docs/training.md, "Sharded replicas", has each term and the measurement behind it):
    the buffer of the last all-gather, kept until the next one (the root's, then at most the
    largest unit's, ``last``); a unit's parameters and that buffer while it runs; in the
    backward its gradients, their reduce-scatter input (gloo's copy of it too) and the next
    unit prefetched; the root's gradients, and the parameters and gradients of units whose
    post-backward waits for the end of the backward, held to it; and at that end (the root's
    final callback: the root's reduce-scatter, then those units') its peak on the last
    backward node. Only nodes that take time (``runs``) hold it: the simulator stacks the
    workspaces of nodes that start and end at one instant."""
    root = unsharded.get(None, 0)
    last = max((b for u, b in unsharded.items() if u is not None), default=0)
    scatter = 2 if gloo else 1  # gloo's reduce_scatter_tensor reduces a copy of its input
    forward = [n for n in graph.nodes if n.name in units and not n.is_input]
    backward = [graph.node(n.name + BACKWARD) for n in reversed(forward)
                if n.name + BACKWARD in graph.index]
    held: dict[str, int] = {}
    buffer = root  # the root's all-gather buffer, until the first unit's all-gather
    for i, node in enumerate(forward):
        unit = units[node.name]
        starts = i == 0 or units[forward[i - 1].name] != unit
        if runs[node.name]:
            held[node.name] = node.workspace_bytes + (
                buffer if unit is None else 2 * unsharded[unit] + (buffer if starts else 0))
        if unit is not None:
            buffer = last
    deferred = _deferred(graph, units, forward)
    ahead = [units[phase_of(n.name)[0]] for n in backward]
    tied = _tied(graph, units)
    started: set[int] = set()
    grads = after = 0  # the root's gradients made so far; held for deferred units after theirs
    for i, node in enumerate(backward):
        base = phase_of(node.name)[0]
        unit = units[base]
        nxt = next((u for u in ahead[i + 1:] if u is not None and u != unit), None)
        prefetched = unsharded[nxt] if nxt is not None else 0
        if unit is None:
            own = last + prefetched
        else:
            # its parameters and gradients, or its reduce-scatter input and gloo's copy of it
            # once the parameters are freed (the gradients with them: measured)
            own = (max(2, scatter) * unsharded[unit] - graph.node(base).trainable_bytes
                   + prefetched)
        if runs[node.name]:
            held[node.name] = node.workspace_bytes + own + grads + after
        if unit is None:
            group = tied.get(base)
            if group is None:
                grads += graph.node(base).trainable_bytes
            elif id(group) not in started:
                started.add(id(group))
                grads += sum(graph.node(m).trainable_bytes for m in group)
        elif unit in deferred and unit not in ahead[i + 1:]:
            after += 2 * unsharded[unit]
    ending = [n.name for n in backward if runs[n.name]]
    if ending:
        # the final callback: the root reshards (its parameters, counted whole through the
        # step, are freed), then reduce-scatters its gradients (held meanwhile: measured)
        # while the deferred units still hold theirs; then each deferred unit does the same
        # in turn, its gradients freed once copied into the reduce-scatter's input
        rest = [2 * unsharded[u] for u in deferred]
        peak = max([last + (1 + scatter) * root + sum(rest)]
                   + [last + scatter * unsharded[u] + sum(rest[k + 1:])
                      for k, u in enumerate(deferred)]) - root
        held[ending[-1]] = max(held[ending[-1]], peak)
    return held


def _deferred(graph: OpGraph, units: dict[str, str | None], forward: list[OpNode]
              ) -> list[str]:
    """The units whose post-backward FSDP2 runs only in the root's final callback, in the
    forward's order: those whose first segment takes no input that needs a gradient (FSDP2
    hooks a unit's post-backward on its inputs' gradients; an embedding reads token ids)."""
    deferred, seen = [], set()
    for i, node in enumerate(forward):
        unit = units[node.name]
        if unit is None or unit in seen:
            continue
        seen.add(unit)
        run = set()
        for later in forward[i:]:
            if units[later.name] != unit:
                break
            run.add(later.name)
        if not any(e.src not in run and e.src + BACKWARD in graph.index
                   for name in run for e in graph.in_edges(name)):
            deferred.append(unit)
    return deferred


def _tied(graph: OpGraph, units: dict[str, str | None]) -> dict[str, tuple[str, ...]]:
    """The root's readers of a tied weight (a colocation group of forward nodes), each to its
    group: autograd holds the sum of their gradients from the first reader's backward."""
    return {m: group for group in graph.colocate for m in group
            if m in units and units[m] is None and sum(1 for r in group if r in units) > 1}


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
