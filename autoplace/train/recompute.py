"""Train: the step graph where devices recompute activations in the backward (``with_recompute``).

A recomputing device (GPipe's re-materialisation, Huang et al., NeurIPS 2019, section 2.3;
``torch.utils.checkpoint`` on a stage) keeps, of each micro-batch's forward, only its stage's
inputs, and runs the stage's forward again with autograd just before that micro-batch's backward:
one more forward per micro-batch for activations of M times the stage's inputs plus one
micro-batch's (``docs/training.md``, "Recomputation"). In the step graph of M micro-batches
(``train.graph``), for each forward node ``f#k`` on such a device whose output needs a gradient:
``f#k`` keeps its output only until its forward readers are done (the workspace added for the
backward comes off); ``f@recompute#k``, on the same device, runs ``f``'s forward time and makes
what the backward reads, reading the recomputed value of an input made on its own device
(``g@recompute#k``) and the kept copy of one received from another (``g#k``); the backward nodes
read ``f@recompute#k``, which ``simulate.schedules`` runs in its micro-batch's backward block. The
graph depends on the placement; ``recompute_all`` needs none (every device recomputing, every input
recomputed wherever made: memory close to the real one, time pessimistic).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace

from autoplace.ir import Costs, Edge, OpGraph, Placement, Problem, Schedule
from autoplace.simulate import simulate
from autoplace.simulate.schedules import BACKWARD, RECOMPUTE, microbatch_name, phase_of

__all__ = ["RECOMPUTE", "Recomputed", "recompute_all", "recompute_units", "recomputed_nodes",
           "with_recompute", "with_recompute_where_needed"]


def recomputed_nodes(problem: Problem) -> list[str]:
    """The forward nodes of ``problem`` (a step of several micro-batches) that a recomputing
    device would run again: those whose backward reads their output."""
    names = {n.name for n in problem.graph.nodes}
    found = []
    for node in problem.graph.nodes:
        base, phase, k = phase_of(node.name)
        if phase == "forward" and k is not None and microbatch_name(base + BACKWARD,
                                                                    k) in names:
            found.append(node.name)
    return found


def with_recompute(problem: Problem, placement: Placement,
                   devices: Collection[str]) -> tuple[Problem, Placement]:
    """``problem`` (a training step of several micro-batches) with the nodes ``placement``
    puts on ``devices`` recomputing (the module's docstring), and the placement extended to
    the new nodes (each on its forward's device). ``devices`` empty: both unchanged."""
    device_of = placement.device_of
    again = {n for n in recomputed_nodes(problem) if device_of[n] in devices}
    if not again:
        return problem, placement

    def source(src: str, dst: str) -> str:
        return _recompute_name(src) if device_of[src] == device_of[dst] else src

    return _rebuild(problem, again, source), Placement(device_of={
        **device_of, **{_recompute_name(n): device_of[n] for n in again}})


def recompute_units(problem: Problem) -> Problem:
    """``problem`` (a step of one micro-batch on one device: a tensor-parallel rank's) as
    activation checkpointing per unit runs it (``torch.utils.checkpoint`` around each FSDP
    unit's segments, ``train.sharded.fsdp_units``; torchtitan's per-block checkpointing): each
    forward node of a unit keeps its output only until its forward readers are done, and
    ``f@recompute`` runs it again once its unit's gradients from the readers downstream of it
    have come (their backward comes before its own), from its unit's recomputed values and the
    kept outputs of the nodes before the unit (its inputs, which the checkpoint keeps); the
    unit's backward reads those. Unchanged where no unit holds a parameter."""
    import networkx as nx

    from autoplace.ir.graphs import topological_order
    from autoplace.train.sharded import fsdp_units

    names = {n.name for n in problem.graph.nodes}
    unit_of = {n: u for n, u in fsdp_units(problem.graph).items() if u is not None}
    again = {n for n in unit_of if n + BACKWARD in names}
    if not again:
        return problem

    def source(src: str, dst: str) -> str:
        return _recompute_name(src) if unit_of.get(src) == unit_of.get(phase_of(dst)[0]) else src

    rebuilt = _rebuild(problem, again, source)
    waits: dict[str, set[str]] = {}  # a unit's gradients: its outside readers' backward nodes
    for e in problem.graph.edges:
        (base, phase, _), (src, src_phase, _) = phase_of(e.dst), phase_of(e.src)
        if (phase == src_phase == "backward" and base in again
                and unit_of.get(src) != unit_of[base]):
            waits.setdefault(unit_of[base], set()).add(src)
    # f's recomputation waits for those of its unit's gradients whose reader reads f, directly
    # or not (only forward nodes feed a forward node): never for one that needs f's backward
    step = problem.graph.to_networkx()
    edges = [*rebuilt.graph.edges, *(
        Edge(src=reader + BACKWARD, dst=_recompute_name(f), bytes=0)
        for reader in sorted(set().union(*waits.values()))
        for f in sorted(nx.ancestors(step, reader) & again)
        if reader in waits.get(unit_of[f], ()))]
    graph = rebuilt.graph
    by_name = {n.name: n for n in graph.nodes}
    order = topological_order([n.name for n in graph.nodes], [(e.src, e.dst) for e in edges])
    place = {name: i for i, name in enumerate(order)}
    edges.sort(key=lambda e: (place[e.src], place[e.dst]))
    return replace(rebuilt, graph=OpGraph(nodes=tuple(by_name[n] for n in order),
                                          edges=tuple(edges), colocate=graph.colocate,
                                          name=graph.name))


def recompute_all(problem: Problem) -> Problem:
    """``problem`` with every node of ``recomputed_nodes`` recomputing, and every recomputed
    node reading its inputs' recomputed values, wherever they are (the module's docstring):
    a graph the solver can place."""
    again = set(recomputed_nodes(problem))
    return _rebuild(problem, again, lambda src, _: _recompute_name(src))


def _recompute_name(name: str) -> str:
    base, _, k = phase_of(name)
    return base + RECOMPUTE if k is None else microbatch_name(base + RECOMPUTE, k)


def _rebuild(problem: Problem, again: set[str], source: Callable[[str, str], str]) -> Problem:
    """The step graph with the nodes ``again`` recomputing; ``source(src, dst)`` names the
    value node ``dst`` (a backward node, or the forward node whose recomputation it is) reads
    for the output of ``src``, one of ``again``: its recomputed value or the kept one."""
    graph, costs = problem.graph, problem.costs
    by_name = {n.name: n for n in graph.nodes}
    nodes, inserted = [], set()
    for node in graph.nodes:
        _, phase, k = phase_of(node.name)
        if phase == "backward" and k not in inserted:
            inserted.add(k)
            nodes += [replace(by_name[n], name=_recompute_name(n), param_bytes=0,
                              trainable_bytes=0)
                      for n in (m.name for m in graph.nodes) if n in again
                      and phase_of(n)[2] == k]
        if node.name in again:
            node = replace(node, output_bytes=node.output_bytes - node.workspace_bytes)
        nodes.append(node)
    edges = []
    for e in graph.edges:
        if phase_of(e.dst)[1] == "backward" and e.src in again:
            e = replace(e, src=source(e.src, e.dst))
        elif e.dst in again:
            edges.append(replace(e, src=source(e.src, e.dst) if e.src in again else e.src,
                                 dst=_recompute_name(e.dst)))
        edges.append(e)
    colocate = [(*group, *(_recompute_name(m) for m in group if m in again))
                for group in graph.colocate]

    def copied(table: Mapping[str, object]) -> dict[str, object]:
        return {**table, **{_recompute_name(n): table[n] for n in again if n in table}}

    host = costs.host
    order = {n.name: i for i, n in enumerate(nodes)}
    edges.sort(key=lambda e: (order[e.src], order[e.dst]))
    return replace(problem, graph=OpGraph(nodes=tuple(nodes), edges=tuple(edges),
                                          colocate=tuple(colocate), name=graph.name),
                   costs=Costs(compute_s=copied(costs.compute_s), source=copied(costs.source),
                               device_source=copied(costs.device_source),
                               host=None if host is None else replace(
                                   host, launch_s=copied(host.launch_s))))


@dataclass(frozen=True)
class Recomputed:
    """A placement of a step, with recomputation on ``devices`` (sorted; empty: none):
    ``problem`` its step graph (``with_recompute``), ``schedule`` its simulation."""

    problem: Problem
    schedule: Schedule
    devices: tuple[str, ...]


def with_recompute_where_needed(problem: Problem, placement: Placement, *,
                                every: bool = False) -> Recomputed:
    """``placement`` of ``problem`` (a step of several micro-batches) with recomputation on
    the devices its simulation overflows (``every``: on all its devices), or on all of them
    where that is not enough."""
    device_of = {n.name: placement.device_of[n.name] for n in problem.graph.nodes}
    placement = Placement(device_of=device_of)
    used = sorted(set(device_of.values()))
    plain = simulate(problem, placement)
    over = sorted(plain.over_capacity)
    tries = [used] if every or over == used else [over, used]
    if not every and not plain.over_capacity:
        return Recomputed(problem, plain, ())
    found = None
    for devices in tries:
        graph, extended = with_recompute(problem, placement, devices)
        found = Recomputed(graph, simulate(graph, extended), tuple(devices))
        if found.schedule.feasible:
            break
    assert found is not None
    return found
