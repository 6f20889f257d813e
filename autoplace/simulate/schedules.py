"""Simulate: the order each device runs a training step's micro-batches in (GPipe, 1F1B).

A step of M micro-batches (``train.step_problem``) names its nodes by phase and micro-batch:
``f#k`` is forward node ``f`` of micro-batch ``k``, ``f@backward#k`` its backward, ``f@step`` the
one update of ``f``'s parameters after every micro-batch's gradient is in (``phase_of`` reads a
name). A device runs whole blocks: ``F_k``, its forward nodes of micro-batch ``k``, and ``B_k``,
its backward nodes, each in the graph's order; its updates come last. The blocks' order is the
schedule (``docs/training.md``, "Micro-batches and schedules"):

* **GPipe** (Huang et al., NeurIPS 2019): ``F_0 .. F_{M-1}, B_0 .. B_{M-1}``, a subsequence of one
  topological order of the step on every device, so it never deadlocks;
* **1F1B** (PipeDream-Flush, Narayanan et al., ICML 2021; ``torch.distributed.pipelining``'s
  ``Schedule1F1B``): ``w = min(M, h)`` warm-up forwards (``h``: the devices after it on the longest
  chain its forward values flow through), then ``F_{w+i}, B_i`` by turns, then the last ``w``
  backwards. Where forward values flow both ways between two devices, GPipe's order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import networkx as nx

from autoplace.config.choices import PipelineSchedule
from autoplace.ir import OpGraph

__all__ = ["BACKWARD", "RECOMPUTE", "SCHEDULES", "STEP", "microbatch_name", "microbatch_order",
           "phase_of", "schedule_run"]

BACKWARD = "@backward"
RECOMPUTE = "@recompute"
STEP = "@step"
SCHEDULES = tuple(s for s in PipelineSchedule if s != PipelineSchedule.AUTO)  # gpipe, 1f1b
_MICROBATCH = "#"


def microbatch_name(name: str, k: int) -> str:
    """Node ``name`` (a forward or backward node of one micro-batch) of micro-batch ``k``."""
    return f"{name}{_MICROBATCH}{k}"


def phase_of(name: str) -> tuple[str, str, int | None]:
    """``(forward node, phase, micro-batch)`` of a training step's node: phase ``forward``,
    ``backward`` (a backward node, or a forward node run again before it,
    ``f@recompute#k``: ``train.recompute``) or ``step``; the micro-batch ``None`` for a step
    and for a graph of one micro-batch. Only the suffixes the step graph adds are read, so a
    traced name that holds ``@`` or ``#`` elsewhere parses as itself."""
    base, k = name, None
    head, sep, tail = name.rpartition(_MICROBATCH)
    if sep and tail.isdigit():
        base, k = head, int(tail)
    if base.endswith(STEP):
        return base.removesuffix(STEP), "step", k
    for suffix in (BACKWARD, RECOMPUTE):
        if base.endswith(suffix):
            return base.removesuffix(suffix), "backward", k
    return base, "forward", k


def microbatch_order(graph: OpGraph, device_of: Mapping[str, str],
                     schedule: str) -> dict[str, tuple[str, ...]] | None:
    """Each device's order of ``graph``'s nodes under ``schedule`` (``gpipe`` or ``1f1b``), or
    ``None`` where the graph is not a step of several micro-batches (some forward or backward
    node has no ``#k``: the simulator then list-schedules)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; one of {', '.join(SCHEDULES)}")
    blocks: dict[str, dict[tuple[str, int], list[str]]] = defaultdict(lambda: defaultdict(list))
    steps: dict[str, list[str]] = defaultdict(list)
    count = 0
    for node in graph.nodes:
        _, phase, k = phase_of(node.name)
        dev = device_of[node.name]
        if phase == "step":
            steps[dev].append(node.name)
        elif k is None:
            return None
        else:
            blocks[dev][(phase, k)].append(node.name)
            count = max(count, k + 1)
    if count < 2:
        return None
    warmup = _warmups(graph, device_of, count) if schedule == "1f1b" else {}
    order = {}
    for dev in {*blocks, *steps}:
        sequence = [blocks[dev].get(block, []) for block in _blocks(count, warmup.get(dev, count))]
        order[dev] = (*(name for block in sequence for name in block), *steps[dev])
    return order


def schedule_run(graph: OpGraph, device_of: Mapping[str, str], schedule: str) -> str:
    """The schedule ``microbatch_order`` runs for ``schedule``: ``gpipe`` where 1F1B was asked
    of devices that feed each other both ways (no stages), else ``schedule``."""
    if schedule != "1f1b":
        return schedule
    counts = {phase_of(n.name)[2] for n in graph.nodes} - {None}
    count = max(counts, default=0) + 1
    warmup = _warmups(graph, device_of, count)
    return "gpipe" if count > 1 and all(w >= count for w in warmup.values()) else schedule


def _blocks(count: int, warmup: int) -> list[tuple[str, int]]:
    """The blocks of one device in order: ``warmup`` forwards, then one backward and one
    forward by turns, then the backwards left (GPipe: ``warmup == count``)."""
    w = min(count, warmup)
    order = [("forward", k) for k in range(w)]
    for i in range(count - w):
        order += [("forward", w + i), ("backward", i)]
    return order + [("backward", k) for k in range(count - w, count)]


def _warmups(graph: OpGraph, device_of: Mapping[str, str], count: int) -> dict[str, int]:
    """1F1B's warm-up forwards per device: the devices after it on the longest chain of
    devices that forward values flow through; ``count`` (GPipe's order) on every device where
    that graph has a cycle."""
    flows = nx.DiGraph()
    flows.add_nodes_from(set(device_of.values()))
    # A node that reads nothing (an input, or a check of the inputs) waits for no device:
    # the values it sends make no stage.
    waits = {e.dst for e in graph.edges}
    for e in graph.edges:
        src, dst = device_of[e.src], device_of[e.dst]
        if (src != dst and e.src in waits
                and phase_of(e.src)[1] == phase_of(e.dst)[1] == "forward"):
            flows.add_edge(src, dst)
    if not nx.is_directed_acyclic_graph(flows):
        return dict.fromkeys(flows.nodes, count)
    after: dict[str, int] = {}
    for dev in reversed(list(nx.topological_sort(flows))):
        after[dev] = max((after[s] + 1 for s in flows.successors(dev)), default=0)
    return after
