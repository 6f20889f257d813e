"""PipeDream's partitioner: a baseline for training plans, beside data parallelism and one device.

The dynamic program of Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN
Training", SOSP 2019, section 3.1: split a chain of layers into pipeline stages, each replicated
over some of N identical devices, minimising the time per sample (one minibatch of the profile's
batch) of the slowest stage or boundary; no memory check (PipeDream's is off by default). Read:

1. ``training_chain``: a profile as PipeDream's optimizer sees it (msr-fiddle/pipedream,
   ``optimizer/optimizer_graph_hierarchical.py``): ``Input`` sources (data loading) and unused
   ``__getitem__`` sinks dropped (``training_layers``); it splits between antichains (on a chain:
   layers), here a split is a prefix of the trace order, every activation crossing it charged;
2. ``TrainingCluster``: N identical devices behind one network (bandwidth, latency);
3. the paper's terms: ``stage_s`` (T, with W a ring all-reduce) and ``boundary_s`` (2 C);
4. ``evaluate`` (stages to a ``PipelinePlan``: the one place a time per sample is computed) for
   ``pipedream`` (the DP), ``data_parallel`` and ``one_device``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from autoplace.errors import DeviceSpecError, GraphError
from cost_models.links import NETWORK_LATENCY_S
from cost_models.roofline import ring_allreduce_s, transfer_time_s
from research.pipedream.profiles import Layer, Profile

__all__ = [
    "PIPEDREAM_BANDWIDTH_BYTES_PER_S",
    "Chain",
    "PipelinePlan",
    "Stage",
    "TrainingCluster",
    "boundary_s",
    "data_parallel",
    "evaluate",
    "one_device",
    "pipedream",
    "stage_s",
    "training_chain",
    "training_layers",
]

# PipeDream's Cluster-A: 4 V100s per server, servers joined by 10 Gbps Ethernet (Narayanan et
# al., SOSP 2019, section 5.1). The network between servers is what stages and replicas
# on different servers share, so a single-level cluster takes its bandwidth.
PIPEDREAM_BANDWIDTH_BYTES_PER_S = 10e9 / 8


@dataclass(frozen=True)
class Chain:
    """Layers in a topological order, each with its forward plus backward time and its weights,
    and the bytes crossing each cut between neighbours (``boundary_bytes[k]``: every activation
    made at or before layer ``k`` and read after it; its gradient crosses back as many bytes).
    ``input_s`` is the dropped ``Input`` nodes' forward time (data loading), not charged."""

    name: str
    layers: tuple[str, ...]
    compute_s: tuple[float, ...]
    parameter_bytes: tuple[int, ...]
    boundary_bytes: tuple[int, ...]
    input_s: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.layers)
        if n == 0:
            raise GraphError(f"{self.name}: the chain has no layers to partition")
        if len(self.compute_s) != n or len(self.parameter_bytes) != n:
            raise GraphError(f"{self.name}: {n} layers but {len(self.compute_s)} compute times "
                             f"and {len(self.parameter_bytes)} parameter sizes")
        if len(self.boundary_bytes) != n - 1:
            raise GraphError(f"{self.name}: {n} layers have {n - 1} boundaries, got "
                             f"{len(self.boundary_bytes)} boundary sizes")
        values = [*self.compute_s, *self.parameter_bytes, *self.boundary_bytes]
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise GraphError(f"{self.name}: times and sizes must be finite and >= 0")

    @cached_property
    def prefix_compute_s(self) -> np.ndarray:
        """``[k]``: the compute of the first ``k`` layers; a stage's is a difference of two."""
        return np.concatenate(([0.0], np.cumsum(self.compute_s, dtype=float)))

    @cached_property
    def prefix_parameter_bytes(self) -> np.ndarray:
        return np.concatenate(([0.0], np.cumsum(self.parameter_bytes, dtype=float)))


def training_layers(profile: Profile) -> tuple[tuple[Layer, ...], tuple[Layer, ...]]:
    """The layers PipeDream's optimizer partitions and those it drops, each in the profile's
    order: ``Input`` sources and unused ``__getitem__`` sinks are dropped
    (``optimizer_graph_hierarchical.py`` zeroes and removes both before partitioning)."""
    consumers: dict[str, list[str]] = {layer.name: [] for layer in profile.layers}
    producers: dict[str, list[str]] = {layer.name: [] for layer in profile.layers}
    for src, dst in profile.edges:
        consumers[src].append(dst)
        producers[dst].append(src)
    dropped = {layer.name for layer in profile.layers
               if (layer.description.startswith("Input") and not producers[layer.name])
               or (layer.description.startswith("__getitem__") and not consumers[layer.name])}
    return (tuple(layer for layer in profile.layers if layer.name not in dropped),
            tuple(layer for layer in profile.layers if layer.name in dropped))


def training_chain(profile: Profile) -> Chain:
    """``profile`` as PipeDream's optimizer partitions it: the ``training_layers`` in the
    profile's topological order."""
    kept, dropped = training_layers(profile)
    consumers: dict[str, list[str]] = {layer.name: [] for layer in profile.layers}
    for src, dst in profile.edges:
        consumers[src].append(dst)
    position = {layer.name: k for k, layer in enumerate(kept)}
    # An activation crosses every cut from its layer to its last reader: a difference array.
    crossing = np.zeros(len(kept) + 1)
    for k, layer in enumerate(kept):
        reach = max((position[v] for v in consumers[layer.name] if v in position), default=k)
        crossing[k] += layer.activation_bytes if reach > k else 0
        crossing[reach] -= layer.activation_bytes if reach > k else 0
    boundary = np.cumsum(crossing)[:max(len(kept) - 1, 0)]
    return Chain(name=profile.name, layers=tuple(layer.name for layer in kept),
                 compute_s=tuple(layer.forward_s + layer.backward_s for layer in kept),
                 parameter_bytes=tuple(layer.parameter_bytes for layer in kept),
                 boundary_bytes=tuple(int(round(b)) for b in boundary),
                 input_s=sum(layer.forward_s + layer.backward_s for layer in dropped
                             if layer.description.startswith("Input")))


@dataclass(frozen=True, kw_only=True)
class TrainingCluster:
    """``devices`` identical devices, every pair joined by the same link: ``latency_s +
    bytes / bandwidth_bytes_per_s`` per transfer. Defaults: PipeDream's Cluster-A network
    (``PIPEDREAM_BANDWIDTH_BYTES_PER_S``, 10 Gbps) and the catalog's network latency
    (``cost_models.links.NETWORK_LATENCY_S``, 10 us)."""

    devices: int
    bandwidth_bytes_per_s: float = PIPEDREAM_BANDWIDTH_BYTES_PER_S
    latency_s: float = NETWORK_LATENCY_S

    def __post_init__(self) -> None:
        if not (isinstance(self.devices, int) and self.devices >= 1):
            raise DeviceSpecError(f"a training cluster needs at least 1 device, got "
                                  f"{self.devices!r}")
        if not (math.isfinite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0):
            raise DeviceSpecError(f"bandwidth must be a positive number of bytes per second, "
                                  f"got {self.bandwidth_bytes_per_s!r}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise DeviceSpecError(f"latency must be >= 0 s, got {self.latency_s!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"devices": self.devices, "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                "latency_s": self.latency_s}


# --- the paper's cost terms (section 3.1); each works on numbers and on numpy arrays ----------


def stage_s(compute_s: Any, parameter_bytes: Any, replicas: Any,
            cluster: TrainingCluster) -> Any:
    """T: a stage's time per sample when ``replicas`` devices each run every ``replicas``-th
    sample: ``T(i -> j, m) = 1/m * max(sum of T_l, sum of W_l^m)``, forward plus backward
    compute against weight synchronisation, which overlaps it (Narayanan et al., SOSP 2019,
    section 3.1; the released optimizer adds the two instead of taking the larger). W is a
    ring all-reduce (``cost_models.ring_allreduce_s``); PipeDream's optimizer charges
    ``4 (m - 1) / m * bytes / bandwidth`` instead, a parameter server's push and pull each over
    the one link."""
    sync = ring_allreduce_s(parameter_bytes, np.asarray(replicas),
                            bandwidth_bytes_per_s=cluster.bandwidth_bytes_per_s,
                            latency_s=cluster.latency_s)
    return np.maximum(compute_s, sync) / replicas


def boundary_s(nbytes: float, cluster: TrainingCluster) -> float:
    """2 C: a stage boundary sends each sample's activations forward and their gradients back,
    each a transfer of ``nbytes`` (the recurrence's ``2 * C_i``, Narayanan et al., SOSP 2019,
    section 3.1; the transfer is ``cost_models.roofline.transfer_time_s``)."""
    return 2 * transfer_time_s(nbytes, bandwidth_bytes_per_s=cluster.bandwidth_bytes_per_s,
                               latency_s=cluster.latency_s)


# --- plans ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """Layers ``first`` to ``end - 1`` of the chain, replicated on ``devices`` (their indices in
    the cluster), and the stage's time per sample (T)."""

    first: int
    end: int
    devices: tuple[int, ...]
    time_s: float

    @property
    def replicas(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class PipelinePlan:
    """Stages in pipeline order on consecutive devices, the time of each boundary between two
    stages (2 C), and the time per sample: the slowest stage or boundary."""

    name: str
    stages: tuple[Stage, ...]
    boundaries_s: tuple[float, ...]
    time_per_sample_s: float

    @property
    def devices_used(self) -> int:
        return sum(stage.replicas for stage in self.stages)

    def compact(self) -> str:
        """``1-12 x3, 13-40 x1``: each stage's layers (1-based, in the chain's order) and its
        replicas."""
        return ", ".join(f"{s.first + 1}-{s.end} x{s.replicas}" for s in self.stages)


def evaluate(chain: Chain, spans: Sequence[tuple[int, int, int]], cluster: TrainingCluster, *,
             name: str = "pipeline") -> PipelinePlan:
    """The plan whose stages are ``spans`` (``(first, end, replicas)``, covering the chain in
    order), on devices 0, 1, ... in stage order. Its time per sample is the paper's objective:
    the largest of every stage's T and every boundary's 2 C."""
    ends = [0, *(end for _, end, _ in spans)]
    firsts = [first for first, _, _ in spans]
    if not spans or firsts != ends[:-1] or ends[-1] != len(chain.layers) \
            or any(first >= end or replicas < 1 for first, end, replicas in spans):
        raise ValueError(f"stages {list(spans)} do not cover the {len(chain.layers)} layers "
                         "of the chain in order, each with at least one layer and one replica")
    if sum(replicas for _, _, replicas in spans) > cluster.devices:
        raise ValueError(f"stages {list(spans)} need more than the {cluster.devices} devices")
    stages, offset = [], 0
    for first, end, replicas in spans:
        compute = chain.prefix_compute_s[end] - chain.prefix_compute_s[first]
        params = chain.prefix_parameter_bytes[end] - chain.prefix_parameter_bytes[first]
        stages.append(Stage(first=first, end=end,
                            devices=tuple(range(offset, offset + replicas)),
                            time_s=float(stage_s(compute, params, replicas, cluster))))
        offset += replicas
    boundaries = tuple(boundary_s(chain.boundary_bytes[end - 1], cluster)
                       for _, end, _ in spans[:-1])
    return PipelinePlan(name=name, stages=tuple(stages), boundaries_s=boundaries,
                        time_per_sample_s=max([*(s.time_s for s in stages), *boundaries]))


def one_device(chain: Chain, cluster: TrainingCluster) -> PipelinePlan:
    """Every layer on one device: its time per sample is the whole forward and backward."""
    return evaluate(chain, [(0, len(chain.layers), 1)], cluster, name="one device")


def data_parallel(chain: Chain, cluster: TrainingCluster) -> PipelinePlan:
    """Pure data parallelism: one stage replicated on every device (T of the whole chain)."""
    return evaluate(chain, [(0, len(chain.layers), cluster.devices)], cluster,
                    name="data parallel")


def pipedream(chain: Chain, cluster: TrainingCluster) -> PipelinePlan:
    """PipeDream's partition of ``chain`` over at most ``cluster.devices`` devices.

    The recurrence of Narayanan et al., SOSP 2019, section 3.1, with A(j, m) the best time per
    sample of layers 1..j on m devices::

        A(j, m) = min( T(1 -> j, m),
                       min over 1 <= i < j, 1 <= m' < m of
                           max(A(i, m - m'), 2 C_i, T(i+1 -> j, m')) )

    Here A(j, m) may leave devices idle (the minimum over at most m devices, the released
    optimizer's ``--use_fewer_machines``): with a latency term, one more replica can make a
    stage slower. On ties the plan with fewer devices, then fewer stages, then the earlier
    split wins. O(n^2 N^2) for n layers and N devices, vectorised over the split point.
    """
    n, devices = len(chain.layers), cluster.devices
    best = np.full((n + 1, devices + 1), np.inf)  # A(j, m), at most m devices
    exact = np.full((n + 1, devices + 1), np.inf)  # the same with exactly m devices
    last = np.zeros((n + 1, devices + 1, 2), dtype=int)  # (first layer, replicas) of the last stage
    replicas = np.arange(1, devices + 1)
    cuts = np.array([np.inf, *(boundary_s(b, cluster) for b in chain.boundary_bytes), np.inf])
    for j in range(1, n + 1):
        # T(i+1 -> j, r) for every first layer i and replica count r, at once.
        stage = stage_s((chain.prefix_compute_s[j] - chain.prefix_compute_s[:j])[:, None],
                        (chain.prefix_parameter_bytes[j]
                         - chain.prefix_parameter_bytes[:j])[:, None], replicas, cluster)
        for m in range(1, devices + 1):
            exact[j, m], last[j, m] = _last_stage(best, cuts, stage, j=j, m=m)
            best[j, m] = min(best[j, m - 1], exact[j, m])
    plan = evaluate(chain, _spans(best, exact, last, n=n, devices=devices), cluster,
                    name="PipeDream")
    assert math.isclose(plan.time_per_sample_s, best[n, devices], rel_tol=1e-9), \
        f"the plan scores {plan.time_per_sample_s}, the recurrence said {best[n, devices]}"
    return plan


def _last_stage(best: np.ndarray, cuts: np.ndarray, stage: np.ndarray, *, j: int,
                m: int) -> tuple[float, tuple[int, int]]:
    """The best time of layers 1..j on exactly m devices and its last stage (first layer,
    replicas): one stage of m replicas, or a split after layer i with m' replicas after it."""
    value, choice = float(stage[0, m - 1]), (0, m)
    if j > 1 and m > 1:
        # rows: the split i = 1..j-1; columns: m' = 1..m-1, beside A(i, m - m').
        candidates = np.maximum(np.maximum(best[1:j, m - 1:0:-1], cuts[1:j, None]),
                                stage[1:j, :m - 1])
        k = int(np.argmin(candidates))
        if candidates.flat[k] < value:
            row, column = divmod(k, m - 1)
            value, choice = float(candidates.flat[k]), (row + 1, column + 1)
    return value, choice


def _spans(best: np.ndarray, exact: np.ndarray, last: np.ndarray, *, n: int,
           devices: int) -> list[tuple[int, int, int]]:
    """The stages of A(n, devices), read back from the last stage of each sub-problem."""
    spans: list[tuple[int, int, int]] = []
    end, budget = n, devices
    while end > 0:
        used = next(m for m in range(1, budget + 1) if exact[end, m] == best[end, budget])
        first, replicas = (int(v) for v in last[end, used])
        spans.append((first, end, replicas))
        end, budget = first, used - replicas
    return spans[::-1]
