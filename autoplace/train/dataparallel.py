"""Train: R data-parallel replicas of a training step's placement, over N devices.

For each R dividing N, ``replica_groups`` makes R alike groups of N/R devices (same types,
memories, links); one replica is placed on a group with 1/R of the batch, and R copies train under
``DistributedDataParallel`` (``ddp_replica``; ``emit.distributed.ddp``) or, with M > 1
micro-batches, run the plan's step and average the gradients themselves (``average_gradients``,
bucketed as DDP's). ``with_allreduce`` charges each tensor's all-reduce to its update ``f@step``: a
ring over the devices playing its device's part in the replicas (``cost_models.ring_allreduce_s``:
``2 (R - 1) / R * bytes / bandwidth + 2 (R - 1) * latency`` over the slowest link; CPU workers'
replicas: gloo over 127.0.0.1), its latency paid by the tensor's share of a DDP bucket
(``BUCKET_BYTES``); or, where every replica is a process of this host on profiled CPU devices, the
measured averaging (``profile.allreduce``) shared by bytes. DDP overlaps buckets with the backward,
so on a replica of one device this bounds the step from above (not on several: one process group,
bucket after bucket). Memory: DDP's buckets are views of the gradients; a micro-batched replica's
flattened bucket is not counted. Rules and figures: ``docs/training.md``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel

from autoplace.ir import Cluster, Problem
from autoplace.simulate.schedules import STEP
from autoplace.train.graph import trained_bytes
from cost_models import LINK_CATALOG, ring_allreduce_s

__all__ = ["BUCKET_BYTES", "allreduce_s", "average_gradients", "ddp_replica", "replica_groups",
           "ring_link", "with_allreduce"]

BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's default bucket_cap_mb


def replica_groups(cluster: Cluster, replicas: int) -> list[tuple[str, ...]] | None:
    """``cluster``'s devices as ``replicas`` groups that play the same parts: alike position by
    position in type, memory and the links between them (``_alike``). First in the cluster's
    order, ``replicas`` runs of consecutive devices (a host's devices stay together, so each
    replica's own transfers keep to its host's links and only the all-reduce crosses
    hosts); failing that, sorted by type (stably) and dealt out one by one, so that group
    ``g`` holds the ``g``-th device of every ``replicas`` of a type. ``None`` when
    ``replicas`` does not divide the devices or neither way gives alike groups."""
    devices = cluster.devices
    if replicas < 1 or len(devices) % replicas:
        return None
    size = len(devices) // replicas
    runs = [tuple(d.name for d in devices[g * size:(g + 1) * size]) for g in range(replicas)]
    first: dict[str, int] = {}
    for d in devices:
        first.setdefault(d.type, len(first))
    ordered = sorted(devices, key=lambda d: first[d.type])
    dealt = [tuple(d.name for d in ordered[g::replicas]) for g in range(replicas)]
    return next((groups for groups in (runs, dealt) if _alike(cluster, groups)), None)


def _alike(cluster: Cluster, groups: Sequence[Sequence[str]]) -> bool:
    """Whether every group has the first's device types and memories and, between its
    devices, the first's links, position by position."""
    def shape(group: Sequence[str]) -> tuple:
        devices = [(cluster.device(n).type, cluster.device(n).memory_bytes) for n in group]
        links = [(cluster.link(a, b).bandwidth_bytes_per_s, cluster.link(a, b).latency_s)
                 for a in group for b in group if a != b]
        return devices, links

    return all(shape(g) == shape(groups[0]) for g in groups)


def ring_link(cluster: Cluster, peers: Sequence[str]) -> tuple[float, float]:
    """The slowest bandwidth and latency around the ring ``peers`` (in order, closed). Between
    two CPU devices of one host the cluster's link is one process's (worker threads hand a
    tensor over by reference), not the replicas': they are processes, whose gloo all-reduce
    goes over 127.0.0.1 (``gloo-loopback``, measured)."""
    loopback = LINK_CATALOG["gloo-loopback"]

    def cpu(name: str) -> bool:
        return cluster.device(name).torch_device.split(":")[0] == "cpu"

    links = []
    for a, b in zip(peers, (*peers[1:], peers[0])):
        if a == b:
            continue
        if cpu(a) and cpu(b) and cluster.device(a).host == cluster.device(b).host:
            links.append((loopback.bandwidth_bytes_per_s, loopback.latency_s))
        else:
            link = cluster.link(a, b)
            links.append((link.bandwidth_bytes_per_s, link.latency_s))
    return min(b for b, _ in links), max(t for _, t in links)


def allreduce_s(nbytes: int, replicas: int, bandwidth: float, latency: float) -> float:
    """A tensor's share of the ring all-reduce of its bucket (see the module's docstring)."""
    moved = ring_allreduce_s(nbytes, replicas, bandwidth_bytes_per_s=bandwidth, latency_s=0.0)
    waits = ring_allreduce_s(0, replicas, bandwidth_bytes_per_s=bandwidth, latency_s=latency)
    return moved + waits * min(1.0, nbytes / BUCKET_BYTES)


def with_allreduce(problem: Problem, cluster: Cluster,
                   groups: Sequence[Sequence[str]], *,
                   measured_s: float | None = None) -> Problem:
    """``problem`` (one replica's step, on ``groups[0]``'s devices of ``cluster``) with each
    update's time grown by the all-reduce of its gradients across the replicas, on every
    device it may run on: by the ring formula, or by its bytes' share of ``measured_s``, the
    whole averaging measured per step (``profile.allreduce``)."""
    replicas = len(groups)
    if replicas == 1:
        return problem
    trained = trained_bytes(problem.graph)
    steps = {n.name: trained.get(n.name.removesuffix(STEP), 0) for n in problem.graph.nodes
             if n.name.endswith(STEP)}  # each update: the bytes it averages
    total = sum(steps.values())
    compute = dict(problem.costs.compute_s)
    if measured_s is not None and total:
        for name, nbytes in steps.items():
            share = measured_s * nbytes / total
            compute[name] = {d: t + share for d, t in compute[name].items()}
    else:
        rings = {d: ring_link(cluster, [g[i] for g in groups]) for i, d in enumerate(groups[0])}
        for name, nbytes in steps.items():
            compute[name] = {d: t + allreduce_s(nbytes, replicas, *rings[d])
                             for d, t in compute[name].items()}
    return replace(problem, costs=replace(problem.costs, compute_s=compute))


def ddp_replica(model: torch.nn.Module) -> DistributedDataParallel:
    """``model`` as the emitted replicas wrap it (``emit.distributed.ddp``; ``profile.allreduce``
    times the same)."""
    # Buckets as views of the gradients: no second copy of them (the plan holds one).
    return DistributedDataParallel(model, device_ids=None, gradient_as_bucket_view=True)


def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a DTensor (FSDP2's shards, tensor parallelism's), without importing
    DTensor where none was made: a rank of plain DDP then starts without its import (0.6 s of
    CPU on this project's machines)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


def average_gradients(params: Sequence[torch.Tensor], group: Any = None) -> None:
    """Replace the gradient of each of ``params`` with its mean over the replicas (every rank
    calls this, after its backward; ``group``: the process group of the replicas, by default
    every rank). The gradients that are set (the same on every rank: one model, one graph; a
    DTensor's, its local shard) go in buckets (``_buckets``), each flattened, all-reduced (a
    sum), divided by R and copied back, one bucket after another: a copy of one bucket is held
    at a time, beyond what the plan counts."""
    world = dist.get_world_size(group)
    grads = [p.grad.to_local() if is_dtensor(p.grad) else p.grad
             for p in params if p.grad is not None]
    for bucket in _buckets(grads):
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, group=group)
        flat /= world
        for grad, mean in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            grad.copy_(mean)


def _buckets(grads: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``grads`` grouped by device and dtype, last first (the backward's order, as DDP fills
    its buckets), cut into runs of at most ``BUCKET_BYTES`` (DDP's 25 MiB; a larger tensor is a
    run of its own): the buckets ``allreduce_s`` charges."""
    runs: dict[tuple[torch.device, torch.dtype], list[list[torch.Tensor]]] = {}
    for grad in reversed(grads):
        mine = runs.setdefault((grad.device, grad.dtype), [[]])
        held = sum(g.numel() * g.element_size() for g in mine[-1])
        if mine[-1] and held + grad.numel() * grad.element_size() > BUCKET_BYTES:
            mine.append([])
        mine[-1].append(grad)
    return [run for mine in runs.values() for run in mine]
