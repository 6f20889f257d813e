"""Train: a training step's optimizer updates priced at the update measured on the device
(``profile.update``), in place of the roofline ``train.graph`` prices them at.

``with_measured_updates`` sets each update node ``f@step``'s time on a device with a
measurement to the measured seconds per byte of trainable parameters times ``f``'s trainable
bytes; elsewhere (and where the node may not run) its time stays as it was. Applied before
``dataparallel.with_allreduce``, which adds the all-reduce to the same nodes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from autoplace.cost import weakest_source
from autoplace.ir import Problem
from autoplace.simulate.schedules import STEP, phase_of

__all__ = ["with_measured_updates"]


def with_measured_updates(problem: Problem, s_per_byte: Mapping[str, float]) -> Problem:
    """``problem`` (a training step's) with its updates on each device of ``s_per_byte``
    taking ``s_per_byte[device]`` times their parameters' trainable bytes."""
    if not s_per_byte:
        return problem
    graph, costs = problem.graph, problem.costs
    trained = {}
    for node in graph.nodes:
        base, phase, k = phase_of(node.name)
        if phase == "forward" and k in (None, 0):
            trained[base] = node.trainable_bytes
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
                                          device_source=device_source))
