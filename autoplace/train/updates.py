"""Train: a step priced at what was measured of it on the device: its optimizer updates
(``profile.update``), in place of ``train.graph``'s roofline, and its forward pass
(``profile.backward``), in place of the sum of its ops timed one by one.

``with_measured_forward`` scales the forward nodes' times on a device with a measurement so that
they add up to the whole forward pass measured there with autograd recording (one ratio per device:
the split among the nodes stays the one-by-one times'); the backward, a factor of the forward
(``train.graph``), follows. ``with_measured_updates`` sets each update node ``f@step``'s time
on such a device to the measured seconds per trainable byte times ``f``'s trainable bytes
(elsewhere, and where the node may not run, its time stays); each keeps a node's launches
within its time. Both come before ``dataparallel.with_allreduce`` (the all-reduce, added).
``after_backward`` orders the updates as the emitted step runs them on CPU workers: the whole
backward, then ``optimizer.step()``, a tensor at a time on the calling thread (``run.train_plan``,
``ddp``'s replicas), where the simulator would run one device's updates beside another's backward
and its updates (``docs/training.md``, "The updates after the whole backward").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from autoplace.ir import Edge, HostCosts, Problem
from autoplace.profile.cost import weakest_source
from autoplace.simulate.schedules import STEP, phase_of
from autoplace.train.graph import trained_bytes

__all__ = ["after_backward", "with_measured_forward", "with_measured_updates"]


def with_measured_forward(problem: Problem, forward_s: Mapping[str, float]) -> Problem:
    """``problem`` (a forward problem, the whole model's graph, as ``train.step_problem``
    takes it) with each device of ``forward_s``'s node times scaled by ``forward_s[device]``
    over their sum on it."""
    costs = problem.costs
    compute = dict(costs.compute_s)
    device_source = dict(costs.device_source)
    scaled = False
    for device, whole_s in forward_s.items():
        total = sum(per[device] for per in costs.compute_s.values()
                    if math.isfinite(per.get(device, math.inf)))
        if not total > 0 or not whole_s > 0:
            continue
        scaled = True
        for name, per in costs.compute_s.items():
            if device in per and math.isfinite(per[device]) and per[device] > 0:
                compute[name] = {**compute[name], device: per[device] * whole_s / total}
                device_source[name] = {**{d: costs.source_of(name, d) for d in per},
                                       **device_source.get(name, {}), device: "calibrated"}
    if not scaled:
        return problem
    source = {**costs.source, **{name: weakest_source(per.values())
                                 for name, per in device_source.items()}}
    return replace(problem, costs=replace(costs, compute_s=compute, source=source,
                                          device_source=device_source,
                                          host=_launched_within(costs.host, compute)))


def with_measured_updates(problem: Problem, s_per_byte: Mapping[str, float]) -> Problem:
    """``problem`` (a training step's) with its updates on each device of ``s_per_byte``
    taking ``s_per_byte[device]`` times their parameters' trainable bytes."""
    if not s_per_byte:
        return problem
    graph, costs = problem.graph, problem.costs
    trained = trained_bytes(graph)
    compute = dict(costs.compute_s)
    device_source = dict(costs.device_source)
    source = dict(costs.source)
    for node in graph.nodes:
        if not node.name.endswith(STEP):
            continue
        nbytes = trained.get(node.name.removesuffix(STEP), 0)
        compute[node.name] = {
            d: s_per_byte[d] * nbytes if d in s_per_byte and math.isfinite(t) else t
            for d, t in costs.compute_s[node.name].items()}
        device_source[node.name] = {
            d: "calibrated" if d in s_per_byte else costs.source_of(node.name, d)
            for d in costs.compute_s[node.name]}
        source[node.name] = weakest_source(device_source[node.name].values())
    return replace(problem, costs=replace(costs, compute_s=compute, source=source,
                                          device_source=device_source,
                                          host=_launched_within(costs.host, compute)))


def _launched_within(host: HostCosts | None, compute: Mapping[str, Mapping[str, float]]
                     ) -> HostCosts | None:
    """``host`` with each node's launches at most its time on that device (a launch is part of
    it): a time measured as a share (an update's by its bytes, a forward node's scaled to the
    whole pass) may fall under the launches the roofline priced (T5's small norms did)."""
    if host is None:
        return None
    return replace(host, launch_s={name: {d: min(t, compute[name][d]) for d, t in per.items()}
                                   for name, per in host.launch_s.items()})


def after_backward(problem: Problem) -> Problem:
    """``problem`` (a training step's) with its updates run one after another, in the graph's
    order (the order changes only how often the chain changes device), the first after every
    node of the backward: an edge of no bytes from each backward node that no other backward
    node reads to the first update, and from each update to the next. An edge between two
    devices costs the link's latency (a worker's handover, tens of microseconds), which the
    calling thread does not pay: a little high where consecutive updates change device."""
    graph = problem.graph
    updates = [n.name for n in graph.nodes if phase_of(n.name)[1] == "step"]
    if not updates:
        return problem
    backward = {n.name for n in graph.nodes if phase_of(n.name)[1] == "backward"}
    feeding = {e.src for e in graph.edges if e.src in backward and e.dst in backward}
    last = [n for n in backward if n not in feeding]
    have = {(e.src, e.dst) for e in graph.edges}
    edges = [Edge(src=b, dst=updates[0], bytes=0) for b in sorted(last)
             if (b, updates[0]) not in have]
    edges += [Edge(src=a, dst=b, bytes=0) for a, b in zip(updates, updates[1:])
              if (a, b) not in have]
    return replace(problem, graph=replace(graph, edges=(*graph.edges, *edges)))
